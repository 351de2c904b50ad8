"""TokenBalancedSampler: packed rows to data-parallel ranks, cost balanced at every step,
at any per-rank batch size including one row.

A step lasts as long as its slowest rank. Balancing within a random step can do nothing
when each rank gets one row (the usual packed set-up), so the sampler also chooses which
rows share a step (:func:`packer.schedule.balance.token_balanced`, the plan ``packer steps``
compares against too). Each epoch: shuffle the rows (seed + epoch); cut them into windows of ``window`` global steps of
``num_replicas * batch_size`` rows; sort each window's rows by cost
(:class:`~packer.cost.CostModel`: tokens, attention work Σ seg², media towers) and cut it
into consecutive steps, so a step's rows cost about the same; split each step over the
ranks greedily (longest processing time first, ``batch_size`` rows each); shuffle the
steps within the window. ``window`` trades randomness for balance: 1 is random steps
(balanced within the step only), the whole epoch is the most even. Measured on generated
4,096-token builds, one row per rank (``bench/bench_balance.py``, ``docs/BENCHMARKS.md``):
per-step max / mean of attention work 1.88 in random order, 1.055 with the default window
at 8 ranks and 270 rows, 1.031 at 2,656 rows (64 ranks: 1.046); under ``CostModel()``
1.036 -> 1.001..1.005. Weighted by step time (Σ slowest / Σ mean, what the ranks wait) the
attention figures are 1.022, 1.014 and 1.020. At one row per rank a window of the whole
epoch is optimal (:func:`packer.schedule.balance.imbalance_floor`): 1.022 and 1.020 are the rows'
floor, not the sampler's; 1.014 against 1.002 is what the window of 64 steps costs.

Every rank runs the same number of steps: with ``drop_last=False`` the last step is
completed with rows from the start of the shuffled order (as ``DistributedSampler`` pads),
with ``drop_last=True`` it is dropped. Pass the DataLoader's ``batch_size`` here too, so
steps line up with batches. The plan is a pure function of (seed, epoch), so
``state_dict`` / ``load_state_dict`` resume exactly.
"""

from __future__ import annotations

import numpy as np
import torch

from packer.cost import CostModel
from packer.loader.samplers._dist import ResumableMixin, world
from packer.schedule.balance import WINDOW, token_balanced


class TokenBalancedSampler(ResumableMixin, torch.utils.data.Sampler):
    def __init__(self, dataset, *, num_replicas: int | None = None, rank: int | None = None, batch_size: int = 1,
                 seed: int = 0, shuffle: bool = True, drop_last: bool = False, cost: CostModel | None = None,
                 window: int = WINDOW):
        self.num_replicas, self.rank = world(num_replicas, rank)
        if batch_size < 1:
            raise ValueError(f"batch_size must be positive, got {batch_size}")
        if window < 1:
            raise ValueError(f"window must be at least one step, got {window} (1: random steps, balanced within each)")
        self.batch_size, self.seed, self.shuffle, self.drop_last, self.window = batch_size, seed, shuffle, drop_last, window
        if hasattr(dataset, "family"):  # a family whose model takes a batch's items in one call
            from packer.loader.derive import check_batches

            check_batches(dataset, batch_size)
        self.cost = cost or CostModel()
        self.costs = self.cost(dataset.row_stats())
        n, per_step = len(self.costs), self.num_replicas * batch_size
        self.steps = n // per_step if drop_last else -(-n // per_step)
        if self.steps == 0:
            raise ValueError(f"{n} rows cannot fill one step of {self.num_replicas} x {batch_size} with drop_last=True")

    def assignment(self, epoch: int | None = None) -> np.ndarray:
        """``[steps, num_replicas, batch_size]`` row numbers for an epoch (every rank's view)."""
        epoch = self.epoch if epoch is None else epoch
        return token_balanced(self.costs, self.num_replicas, self.batch_size, seed=self.seed, epoch=epoch,
                              window=self.window, steps=self.steps, shuffle=self.shuffle)
