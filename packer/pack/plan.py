"""The planner's entry point: lengths in, a CSR plan of bins out. Pure: no I/O, no torch.

    >>> p = plan([5, 3, 4, 4], capacity=8)
    >>> [p.bin(b).tolist() for b in range(p.n_bins)]
    [[0, 1], [2, 3]]
    >>> p.lower_bound, round(p.efficiency, 3)
    (2, 1.0)
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from packer._ranges import concat_ranges, csr_offsets
from packer.pack.registry import ALGORITHMS


@dataclass(frozen=True)
class Plan:
    """Bins in CSR layout: bin ``b`` holds samples ``indices[offsets[b]:offsets[b+1]]``."""

    offsets: np.ndarray  # int64 [n_bins + 1]
    indices: np.ndarray  # int64 [n_placed]
    lengths: np.ndarray  # int64 [n], the lengths that were planned
    capacity: int

    @property
    def n_bins(self) -> int:
        return len(self.offsets) - 1

    @property
    def lower_bound(self) -> int:
        """L1 = ceil(sum of lengths / capacity): no packing can use fewer bins."""
        return -(-int(self.lengths[self.indices].sum()) // self.capacity)

    @property
    def efficiency(self) -> float:
        """Placed tokens / (bins x capacity)."""
        return float(self.lengths[self.indices].sum()) / max(1, self.n_bins * self.capacity)

    def bin(self, b: int) -> np.ndarray:
        return self.indices[self.offsets[b] : self.offsets[b + 1]]

    def bin_tokens(self) -> np.ndarray:
        """Tokens in each bin, int64 [n_bins]."""
        placed = np.concatenate([[0], np.cumsum(self.lengths[self.indices])])
        return placed[self.offsets[1:]] - placed[self.offsets[:-1]]

    def reorder(self, order: np.ndarray) -> Plan:
        """The same bins in another order (``order`` is a permutation of bin numbers)."""
        sizes = np.diff(self.offsets)[order]
        indices = self.indices[concat_ranges(self.offsets[:-1][order], sizes)]
        return Plan(csr_offsets(sizes), indices, self.lengths, self.capacity)


def plan(lengths, capacity: int, *, algorithm: str = "bfd", seed: int = 0) -> Plan:
    """Pack samples of the given ``lengths`` into bins of ``capacity`` tokens."""
    lengths = np.asarray(lengths)
    if lengths.ndim != 1 or (lengths.size and not np.issubdtype(lengths.dtype, np.integer)):
        raise ValueError(f"lengths must be a 1-D integer array, got shape {lengths.shape} dtype {lengths.dtype}")
    lengths = lengths.astype(np.int64, copy=False)
    if capacity < 1:
        raise ValueError(f"capacity must be at least 1, got {capacity}")
    if algorithm not in ALGORITHMS:
        raise ValueError(f"unknown packing algorithm {algorithm!r}; known: {', '.join(sorted(ALGORITHMS))}")
    if lengths.size:
        too_long = int(np.argmax(lengths))
        if lengths[too_long] > capacity:
            raise ValueError(
                f"sample {too_long} is too long ({lengths[too_long]} > {capacity}); "
                f"apply an oversize policy (truncate, split, drop) before planning or raise the capacity"
            )
        if lengths.min() < 1:
            raise ValueError(f"sample {int(np.argmin(lengths))} has length {lengths.min()}; lengths must be >= 1")
    offsets, indices = ALGORITHMS[algorithm](lengths, capacity, seed=seed)
    return Plan(np.asarray(offsets, np.int64), np.asarray(indices, np.int64), lengths, capacity)
