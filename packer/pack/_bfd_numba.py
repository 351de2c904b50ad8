"""The best-fit-decreasing kernel in numba (see :mod:`packer.pack.bfd`); imported only for plans of
``packer.pack._small.SMALL`` segments or more, so a small plan never loads numba."""

from __future__ import annotations

import numpy as np
from numba import njit

from packer.pack._bits import bits_clear, bits_find_ge, bits_set


@njit(cache=True)
def bfd(lengths, capacity, max_segments, need, caps, class_rem, stride):
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
