"""Accelerate's ``prepare(loader)`` and packer's samplers.

``accelerator.prepare(loader)`` on more than one process wraps the loader's batch sampler in
Accelerate's ``BatchSamplerShard``, which keeps every ``num_processes``-th batch: a sampler
that already gave this rank its own rows is sharded a second time (2 ranks: each sees half of
its rows, half the data is never seen, and no error says so). Accelerate offers no hook to opt
a sampler out, so the sampler looks for that wrapper among its callers (an identity check on
the wrapped sampler, so nothing else can match) and, when it finds one that lines up with it
(same ranks, same batch size, ``split_batches=False``), yields the steps of every rank in
rank order: the wrapper's ``batch % num_processes == process_index`` then picks exactly this
rank's batches, and each row is seen once per epoch as without Accelerate. A wrapper that does
not line up is refused with the fix.
"""

from __future__ import annotations

import sys

CALLERS = 6  # frames searched above the sampler: BatchSampler -> BatchSamplerShard (-> SkipBatchSampler, DataLoader)


def accelerate_shard(sampler):
    """The ``accelerate.data_loader.BatchSamplerShard`` iterating or measuring ``sampler``, or None."""
    module = sys.modules.get("accelerate.data_loader")
    if module is None:
        return None
    frame = sys._getframe(2)
    for _ in range(CALLERS):
        if frame is None:
            return None
        owner = frame.f_locals.get("self")
        if isinstance(owner, module.BatchSamplerShard) and getattr(owner.batch_sampler, "sampler", None) is sampler:
            return owner
        frame = frame.f_back
    return None


def check_lined_up(shard, sampler) -> None:
    """Refuse a wrapper whose sharding would not give this rank exactly its own batches."""
    name = type(sampler).__name__
    problems = []
    if shard.num_processes != sampler.num_replicas or shard.process_index != sampler.rank:
        problems.append(f"Accelerate shards over {shard.num_processes} processes (this one {shard.process_index}) but "
                        f"the sampler was built for {sampler.num_replicas} (rank {sampler.rank})")
    if shard.split_batches:
        problems.append("Accelerate's split_batches=True cuts each batch across processes")
    if shard.batch_size != sampler.batch_size:
        problems.append(f"the DataLoader's batch_size is {shard.batch_size}, the sampler's {sampler.batch_size}")
    if problems:
        raise ValueError(f"accelerator.prepare(loader) would shard the {name}'s rows a second time: {'; '.join(problems)}. "
                         f"Build it with num_replicas=accelerator.num_processes, rank=accelerator.process_index and the "
                         f"DataLoader's batch_size, and keep split_batches=False (each row is then seen once per epoch); "
                         f"or leave the loader out of accelerator.prepare")
