"""Best-fit decreasing over the whole dataset, in O(n log C) with small constants.

Lengths are integers no larger than the capacity C, so bins with the same free space
are interchangeable. Open bins sit in one stack per free-space value, and a two-level
bitset over the values 0..C answers "smallest free space >= l" in two word scans: no
per-bin search, no heap, no Python in the loop (numba). Ties go to the bin most
recently moved to that free space, so the result is deterministic.

Media caps split the bins into classes by what they have left (e.g. 0..4 images left
gives 5 classes); an item looks in every class that can still take its media and
takes the tightest fit among them. Without caps there is one class.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from packer.pack._bits import bits_clear, bits_find_ge, bits_set, csr_from_assignment, decreasing_order
from packer.pack.registry import NO_CONSTRAINTS, Constraints

MAX_CLASS_CELLS = 64_000_000  # classes x (capacity + 1) stack heads


@njit(cache=True)
def _bfd(lengths, capacity, max_segments, need, caps, class_rem, stride):
    """``lengths`` / ``need`` in placement order; returns the bin of each, in that order."""
    n = lengths.shape[0]
    n_kinds = caps.shape[0]
    n_classes = class_rem.shape[0]
    words = (capacity >> 6) + 1
    low = np.zeros((n_classes, words), np.uint64)
    high = np.zeros((n_classes, (words >> 6) + 1), np.uint64)
    head = np.full((n_classes, capacity + 1), -1, np.int32)
    nxt = np.empty(n, np.int32)  # per bin; int32 keeps the working set small (n < 2**31)
    free = np.empty(n, np.int32)
    nseg = np.zeros(n, np.int32)
    rem = np.empty((n, n_kinds), np.int32)
    assign = np.empty(n, np.int32)
    n_bins = 0
    for i in range(n):
        length = lengths[i]
        best_f = -1
        best_c = -1
        for c in range(n_classes):
            admits = True
            for k in range(n_kinds):
                if class_rem[c, k] < need[i, k]:
                    admits = False
                    break
            if admits:
                f = bits_find_ge(low[c], high[c], length)
                if f >= 0 and (best_f < 0 or f < best_f):
                    best_f = f
                    best_c = c
        if best_c < 0:
            b = n_bins
            n_bins += 1
            free[b] = capacity
            for k in range(n_kinds):
                rem[b, k] = caps[k]
        else:
            b = head[best_c, best_f]
            head[best_c, best_f] = nxt[b]
            if nxt[b] < 0:
                bits_clear(low[best_c], high[best_c], best_f)
        free[b] -= length
        nseg[b] += 1
        c = 0
        for k in range(n_kinds):
            rem[b, k] -= need[i, k]
            c += rem[b, k] * stride[k]
        assign[i] = b
        f = free[b]
        if f > 0 and (max_segments == 0 or nseg[b] < max_segments):
            nxt[b] = head[c, f]
            if nxt[b] < 0:
                bits_set(low[c], high[c], f)
            head[c, f] = b
    return assign, n_bins


def best_fit_decreasing(lengths: np.ndarray, capacity: int, *, seed: int = 0,
                        constraints: Constraints = NO_CONSTRAINTS) -> tuple[np.ndarray, np.ndarray]:
    caps = np.asarray(constraints.caps, np.int64)
    sizes = caps + 1
    n_classes = int(np.prod(sizes)) if len(caps) else 1
    if n_classes * (capacity + 1) > MAX_CLASS_CELLS:
        raise ValueError(f"media caps {dict(zip(constraints.names, caps.tolist(), strict=True))} make {n_classes} "
                         f"bin classes, too many for capacity {capacity}; lower the caps")
    stride = np.ones(len(caps), np.int64)
    for k in range(len(caps) - 2, -1, -1):
        stride[k] = stride[k + 1] * sizes[k + 1]
    class_rem = (np.arange(n_classes)[:, None] // stride[None, :]) % sizes[None, :] if len(caps) else np.zeros((1, 0), np.int64)
    order = decreasing_order(lengths, capacity)
    need = constraints.need_for(len(lengths))[order].astype(np.int64)  # contiguous in placement order
    assign, n_bins = _bfd(lengths[order], capacity, constraints.max_segments, need, caps, class_rem.astype(np.int64), stride)
    return csr_from_assignment(order, assign, n_bins)
