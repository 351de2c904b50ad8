"""Shared bits of the samplers: world defaults and resumable state."""

from __future__ import annotations

import numpy as np

from packer.loader.samplers._accelerate import accelerate_shard, check_lined_up


def world(num_replicas: int | None, rank: int | None) -> tuple[int, int]:
    if num_replicas is None or rank is None:
        import torch.distributed as dist

        ready = dist.is_available() and dist.is_initialized()
        num_replicas = num_replicas if num_replicas is not None else (dist.get_world_size() if ready else 1)
        rank = rank if rank is not None else (dist.get_rank() if ready else 0)
    if not 0 <= rank < num_replicas:
        raise ValueError(f"rank {rank} is not in [0, {num_replicas})")
    return num_replicas, rank


class ResumableMixin:
    """``set_epoch``, ``state_dict``, ``load_state_dict``: resume mid-epoch exactly.

    ``state_dict()['consumed']`` counts the indices this sampler has handed out in the
    current epoch. A DataLoader with workers prefetches, so save the count of samples the
    trainer actually consumed instead when they differ (``state_dict(consumed=n)``).
    """

    epoch: int = 0
    _consumed: int = 0
    _skip: int = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch
        self._skip = self._consumed = 0

    def state_dict(self, consumed: int | None = None) -> dict:
        return {"epoch": self.epoch, "consumed": self._consumed if consumed is None else consumed, "seed": self.seed}

    def load_state_dict(self, state: dict) -> None:
        if state.get("seed", self.seed) != self.seed:
            raise ValueError(f"state was saved with seed {state['seed']}, this sampler has seed {self.seed}")
        self.epoch, self._skip, self._consumed = int(state["epoch"]), int(state["consumed"]), int(state["consumed"])

    def __iter__(self):
        shard = accelerate_shard(self)
        plan = self.assignment()
        if shard is None:
            return self._yield(plan[:, self.rank, :].reshape(-1))
        check_lined_up(shard, self)  # under accelerator.prepare: every rank's steps, the wrapper keeps ours
        steps, leftover = divmod(self._skip, self.batch_size)
        if leftover:
            raise ValueError(f"resuming {leftover} rows into a batch under accelerator.prepare: save the state at a "
                             f"batch boundary (state_dict(consumed=batches * batch_size))")
        return self._yield_all(plan[steps:])

    def __len__(self) -> int:
        own = self.steps * self.batch_size - self._skip
        return own * self.num_replicas if accelerate_shard(self) is not None else own

    def _yield(self, indices: np.ndarray):
        for i in indices[self._skip :].tolist():
            self._consumed += 1
            yield i
        self._skip = self._consumed = 0  # a finished epoch leaves nothing to skip

    def _yield_all(self, plan: np.ndarray):
        """Every rank's rows, step by step in rank order; only this rank's count as consumed."""
        mine = np.zeros(plan.shape, dtype=bool)
        mine[:, self.rank, :] = True
        for i, own in zip(plan.reshape(-1).tolist(), mine.reshape(-1).tolist(), strict=True):
            self._consumed += own
            yield i
        self._skip = self._consumed = 0
