"""First fit in a given order, over a max-tree of bins (shared by ``ffd`` and ``shuffle``).

Every leaf starts at the full capacity, so the leftmost leaf with room is either the
first open bin that fits or the next unopened one: one O(log n) descent per item.
A bin that reaches ``max_segments`` is closed by setting its leaf to -1.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from packer.pack._bits import csr_from_assignment, tree_leftmost_ge, tree_set


@njit(cache=True)
def _first_fit(lengths, capacity, max_segments):
    """``lengths`` in placement order; returns the bin of each, in that order."""
    n = lengths.shape[0]
    size = 1
    while size < n:
        size <<= 1
    tree = np.full(2 * size, capacity, np.int32)
    nseg = np.zeros(size if max_segments > 0 else 1, np.int32)
    assign = np.empty(n, np.int32)
    n_bins = 0
    for i in range(n):
        b = tree_leftmost_ge(tree, size, lengths[i])
        if b >= n_bins:
            n_bins = b + 1
        left = tree[size + b] - lengths[i]
        if max_segments > 0:
            nseg[b] += 1
            if nseg[b] >= max_segments:
                left = -1
        tree_set(tree, size, b, left)
        assign[i] = b
    return assign, n_bins


def first_fit(order: np.ndarray, lengths: np.ndarray, capacity: int, max_segments: int) -> tuple[np.ndarray, np.ndarray]:
    if len(order) == 0:
        return np.zeros(1, np.int64), np.zeros(0, np.int64)
    assign, n_bins = _first_fit(lengths[order], capacity, max_segments)
    return csr_from_assignment(order, assign, n_bins)
