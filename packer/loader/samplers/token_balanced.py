"""TokenBalancedSampler: packed rows to data-parallel ranks, cost balanced at every step.

Each epoch the rows are shuffled (seed + epoch) and cut into global steps of
``num_replicas * batch_size`` rows; within a step, rows go to ranks greedily by cost
(:class:`~packer.cost.CostModel`: tokens, attention work Σ seg², media),
every rank getting exactly ``batch_size``. Every rank runs the same number of steps:
with ``drop_last=False`` the last step is completed with rows from the start of the
shuffled order (as ``DistributedSampler`` pads), with ``drop_last=True`` it is dropped.
Pass the DataLoader's ``batch_size`` here too, so steps line up with batches.
"""

from __future__ import annotations

import numpy as np
import torch

from packer.balance import balance
from packer.cost import CostModel
from packer.loader.samplers._dist import ResumableMixin, world


class TokenBalancedSampler(ResumableMixin, torch.utils.data.Sampler):
    def __init__(self, dataset, *, num_replicas: int | None = None, rank: int | None = None, batch_size: int = 1,
                 seed: int = 0, shuffle: bool = True, drop_last: bool = False, cost: CostModel | None = None):
        self.num_replicas, self.rank = world(num_replicas, rank)
        if batch_size < 1:
            raise ValueError(f"batch_size must be positive, got {batch_size}")
        self.batch_size, self.seed, self.shuffle, self.drop_last = batch_size, seed, shuffle, drop_last
        self.cost = cost or CostModel()
        self.costs = self.cost(dataset.row_stats())
        n, per_step = len(self.costs), self.num_replicas * batch_size
        self.steps = n // per_step if drop_last else -(-n // per_step)
        if self.steps == 0:
            raise ValueError(f"{n} rows cannot fill one step of {self.num_replicas} x {batch_size} with drop_last=True")

    def assignment(self, epoch: int | None = None) -> np.ndarray:
        """``[steps, num_replicas, batch_size]`` row numbers for an epoch (every rank's view)."""
        epoch = self.epoch if epoch is None else epoch
        n = len(self.costs)
        order = np.random.default_rng(self.seed + epoch).permutation(n) if self.shuffle else np.arange(n)
        total = self.steps * self.num_replicas * self.batch_size
        order = np.resize(order, total)  # repeats from the start when padding is needed
        steps = order.reshape(self.steps, -1)
        return np.stack([balance(s, self.costs[s], self.num_replicas, self.batch_size) for s in steps])

    def __iter__(self):
        return self._yield(self.assignment()[:, self.rank, :].reshape(-1))

    def __len__(self) -> int:
        return self.steps * self.batch_size - self._skip
