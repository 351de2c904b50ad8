"""Next fit in dataset order: the naive baseline (what concatenate-and-cut packers do,
without cutting). One open bin; a sample that does not fit closes it."""

from __future__ import annotations

import numpy as np
from numba import njit

from packer.pack._bits import csr_from_assignment
from packer.pack.registry import NO_CONSTRAINTS, Constraints


@njit(cache=True)
def _next_fit(lengths, capacity, max_segments, need, caps):
    n = lengths.shape[0]
    n_kinds = caps.shape[0]
    assign = np.empty(n, np.int32)
    rem = caps.copy()
    b, free, nseg = -1, 0, 0
    for i in range(n):
        fits = b >= 0 and lengths[i] <= free and (max_segments == 0 or nseg < max_segments)
        for k in range(n_kinds):
            if need[i, k] > rem[k]:
                fits = False
        if not fits:
            b += 1
            free, nseg = capacity, 0
            rem[:] = caps
        free -= lengths[i]
        nseg += 1
        for k in range(n_kinds):
            rem[k] -= need[i, k]
        assign[i] = b
    return assign, b + 1


def next_fit(lengths: np.ndarray, capacity: int, *, seed: int = 0,
             constraints: Constraints = NO_CONSTRAINTS) -> tuple[np.ndarray, np.ndarray]:
    need = constraints.need_for(len(lengths)).astype(np.int64)
    assign, n_bins = _next_fit(lengths, capacity, constraints.max_segments, need, np.asarray(constraints.caps, np.int64))
    return csr_from_assignment(np.arange(len(lengths), dtype=np.int64), assign, n_bins)
