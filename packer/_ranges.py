"""Vectorised index arithmetic shared by the planner and the materializer."""

from __future__ import annotations

import numpy as np


def concat_ranges(starts: np.ndarray, sizes: np.ndarray) -> np.ndarray:
    """``concatenate([arange(s, s + n) for s, n in zip(starts, sizes)])`` without a loop.

    >>> concat_ranges(np.array([10, 3]), np.array([2, 3])).tolist()
    [10, 11, 3, 4, 5]
    """
    starts = np.asarray(starts, dtype=np.int64)
    sizes = np.asarray(sizes, dtype=np.int64)
    total = int(sizes.sum())
    if total == 0:
        return np.zeros(0, dtype=np.int64)
    firsts = np.zeros(len(sizes), dtype=np.int64)
    np.cumsum(sizes[:-1], out=firsts[1:])
    return np.repeat(starts - firsts, sizes) + np.arange(total, dtype=np.int64)


def csr_offsets(sizes: np.ndarray) -> np.ndarray:
    """``[0, s0, s0+s1, ...]`` as int64."""
    offsets = np.zeros(len(sizes) + 1, dtype=np.int64)
    np.cumsum(sizes, out=offsets[1:])
    return offsets
