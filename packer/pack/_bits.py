"""Numba helpers shared by the packing kernels: a two-level bitset and a max-tree.

Imported only by the algorithm modules (which the registry loads on first use), so
``import packer.pack`` does not import numba. Compiled code is cached on disk.

- The bitset marks which free-space values ``0..capacity`` have at least one open bin;
  ``bits_find_ge(l)`` returns the smallest marked value ``>= l`` in two word scans.
- The max-tree over bin numbers holds each bin's free space (unopened bins count as
  empty ones), so "leftmost bin with free >= l" -- first fit -- is one descent.
"""

from __future__ import annotations

import numpy as np
from numba import njit, uint64

_DEBRUIJN = 0x03F79D71B4CB0A89
CTZ_TABLE = np.zeros(64, dtype=np.int64)
for _i in range(64):
    CTZ_TABLE[(((1 << _i) * _DEBRUIJN) & 0xFFFFFFFFFFFFFFFF) >> 58] = _i
DEBRUIJN = np.uint64(_DEBRUIJN)


@njit(cache=True, inline="always")
def ctz(x):
    """Index of the lowest set bit of a non-zero uint64 (de Bruijn multiplication)."""
    low = x & (~x + uint64(1))
    return CTZ_TABLE[(low * DEBRUIJN) >> uint64(58)]


@njit(cache=True)
def bits_set(low, high, f):
    w = f >> 6
    low[w] |= uint64(1) << uint64(f & 63)
    high[w >> 6] |= uint64(1) << uint64(w & 63)


@njit(cache=True)
def bits_clear(low, high, f):
    w = f >> 6
    low[w] &= ~(uint64(1) << uint64(f & 63))
    if low[w] == 0:
        high[w >> 6] &= ~(uint64(1) << uint64(w & 63))


@njit(cache=True)
def bits_find_ge(low, high, f):
    """Smallest set value >= f, or -1."""
    w = f >> 6
    if w >= low.shape[0]:
        return -1
    x = low[w] & ~((uint64(1) << uint64(f & 63)) - uint64(1))
    if x != 0:
        return (w << 6) + ctz(x)
    w += 1  # the next non-empty word, found in the summary level
    hw = w >> 6
    if hw >= high.shape[0]:
        return -1
    y = high[hw] & ~((uint64(1) << uint64(w & 63)) - uint64(1))
    while y == 0:
        hw += 1
        if hw >= high.shape[0]:
            return -1
        y = high[hw]
    w = (hw << 6) + ctz(y)
    return (w << 6) + ctz(low[w])


@njit(cache=True)
def tree_leftmost_ge(tree, size, value):
    """Leftmost leaf holding >= value (the root must hold >= value)."""
    node = 1
    while node < size:
        node = 2 * node if tree[2 * node] >= value else 2 * node + 1
    return node - size


@njit(cache=True)
def tree_set(tree, size, leaf, value):
    node = size + leaf
    tree[node] = value
    node >>= 1
    while node >= 1:
        left, right = tree[2 * node], tree[2 * node + 1]
        tree[node] = left if left >= right else right
        node >>= 1


@njit(cache=True)
def csr_from_assignment(order, assign, n_bins):
    """Items grouped by bin in CSR layout, without a sort: item ``order[t]`` went to bin
    ``assign[t]``; within a bin items keep their placement order."""
    counts = np.zeros(n_bins + 1, np.int64)
    for t in range(order.shape[0]):
        counts[assign[t] + 1] += 1
    for b in range(n_bins):
        counts[b + 1] += counts[b]
    fill = counts[:-1].copy()
    indices = np.empty(order.shape[0], np.int64)
    for t in range(order.shape[0]):
        b = assign[t]
        indices[fill[b]] = order[t]
        fill[b] += 1
    return counts, indices


@njit(cache=True)
def csr_from_assignment_with(order, assign, n_bins, values):
    """:func:`csr_from_assignment`, also placing ``values`` (``values[t]`` belongs to item
    ``order[t]``) in the same CSR order in the same pass: no gather over the items after."""
    counts = np.zeros(n_bins + 1, np.int64)
    for t in range(order.shape[0]):
        counts[assign[t] + 1] += 1
    for b in range(n_bins):
        counts[b + 1] += counts[b]
    fill = counts[:-1].copy()
    indices = np.empty(order.shape[0], np.int64)
    placed = np.empty(order.shape[0], np.int64)
    for t in range(order.shape[0]):
        b = assign[t]
        indices[fill[b]] = order[t]
        placed[fill[b]] = values[t]
        fill[b] += 1
    return counts, indices, placed


@njit(cache=True)
def reorder_pair(offsets, new_offsets, perm, a, b):
    """:func:`reorder_values` of two arrays in one pass over the bins."""
    out_a = np.empty_like(a)
    out_b = np.empty_like(b)
    for k in range(perm.shape[0]):
        src, dst = offsets[perm[k]], new_offsets[k]
        for j in range(new_offsets[k + 1] - dst):
            out_a[dst + j] = a[src + j]
            out_b[dst + j] = b[src + j]
    return out_a, out_b


@njit(cache=True)
def reorder_values(offsets, new_offsets, perm, values):
    """CSR ``values`` with bin ``perm[k]`` moved to position ``k``, copied block by block."""
    out = np.empty_like(values)
    for k in range(perm.shape[0]):
        src, dst = offsets[perm[k]], new_offsets[k]
        for j in range(new_offsets[k + 1] - dst):
            out[dst + j] = values[src + j]
    return out
