"""SplitModalitySampler: unpacked training with batches of one modality, length-grouped
and balanced across ranks (the Prismatic / OpenVLA scheme, working for any number of
modalities, including one).

Each epoch: split the samples by modality; shuffle each (seed + epoch); cut each into
global batches of ``num_replicas * batch_size`` (the last one completed with other
samples of the same modality, or dropped with ``drop_last``); sort each global batch
by length and deal it greedily to the rank with the fewest tokens that still has room
(equal counts); shuffle the global batches, then move the one holding the longest
sample to the front, so an out-of-memory error shows at step one.
"""

from __future__ import annotations

import numpy as np
import torch

from packer.loader.samplers._dist import ResumableMixin, world
from packer.schedule.balance import balance


class SplitModalitySampler(ResumableMixin, torch.utils.data.Sampler):
    def __init__(self, dataset=None, *, lengths=None, modalities=None, num_replicas: int | None = None,
                 rank: int | None = None, batch_size: int = 1, seed: int = 0, drop_last: bool = False):
        if dataset is not None:
            lengths, modalities = dataset.lengths, dataset.modalities
        if lengths is None or modalities is None:
            raise ValueError("give a SampleDataset, or lengths= and modalities=")
        self.lengths = np.asarray(lengths, dtype=np.int64)
        self.modalities = np.asarray(modalities)
        if self.lengths.shape != self.modalities.shape:
            raise ValueError("lengths and modalities must have one entry per sample")
        self.num_replicas, self.rank = world(num_replicas, rank)
        self.batch_size, self.seed, self.drop_last = batch_size, seed, drop_last
        self.global_batch = self.num_replicas * batch_size
        self.groups = {m: np.flatnonzero(self.modalities == m) for m in sorted(set(self.modalities.tolist()))}
        count = lambda n: n // self.global_batch if drop_last else -(-n // self.global_batch)  # noqa: E731
        self.steps = sum(count(len(g)) for g in self.groups.values())
        if self.steps == 0:
            raise ValueError("no modality has enough samples for one global batch with drop_last=True")

    def assignment(self, epoch: int | None = None) -> np.ndarray:
        """``[steps, num_replicas, batch_size]`` sample numbers for an epoch."""
        rng = np.random.default_rng(self.seed + (self.epoch if epoch is None else epoch))
        batches = []
        for group in self.groups.values():
            idx = rng.permutation(group)
            n = len(idx) // self.global_batch if self.drop_last else -(-len(idx) // self.global_batch)
            if n == 0:
                continue
            idx = np.resize(idx, n * self.global_batch)  # completes the last batch within the modality
            for b in idx.reshape(n, self.global_batch):
                b = b[np.argsort(-self.lengths[b], kind="stable")]
                batches.append(balance(b, self.lengths[b].astype(np.float64), self.num_replicas, self.batch_size))
        order = rng.permutation(len(batches))
        longest = int(np.argmax([self.lengths[b].max() for b in batches]))
        order = np.concatenate([[longest], order[order != longest]])
        return np.stack([batches[k] for k in order])
