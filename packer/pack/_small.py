"""The default plan (``bfd``, any row order) without numba, for inputs where numba's start costs more than the work.

Importing numba and loading the cached kernels costs ~0.45 s of CPU in every process that
plans, and the first build after an install compiles each kernel (~5 s). A plan of 20,000
samples takes ~25 ms in plain Python (~1 µs a segment). So below ``SMALL`` segments x bin
classes the planner runs these twins instead: :func:`bfd` is :func:`packer.pack._bfd_numba.bfd`
step for step (same stacks, same ties, so the same bins), and the CSR helpers are numpy.
``tests/test_plan.py`` compares every twin with its kernel on random inputs, media caps and
segment limits included.
"""

from __future__ import annotations

import bisect

import numpy as np

from packer._ranges import concat_ranges

SMALL = 50_000  # segments x bin classes: below this a plan runs here (~1 µs a segment), above it in numba


def decreasing_order(lengths: np.ndarray, capacity: int) -> np.ndarray:
    """Indices by decreasing length, ties by index; a radix sort when lengths fit 16 bits."""
    key = (capacity - lengths).astype(np.uint16 if capacity < 2**16 else np.int64)
    return np.argsort(key, kind="stable")


def csr_from_assignment(order: np.ndarray, assign: np.ndarray, n_bins: int) -> tuple[np.ndarray, np.ndarray]:
    """Items grouped by bin in CSR layout: item ``order[t]`` went to bin ``assign[t]``; within a bin items keep
    their placement order (a stable sort by bin)."""
    assign = np.asarray(assign, np.int64)
    counts = np.zeros(n_bins + 1, np.int64)
    np.cumsum(np.bincount(assign, minlength=n_bins), out=counts[1:])
    return counts, np.asarray(order, np.int64)[np.argsort(assign, kind="stable")]


def csr_from_assignment_with(order: np.ndarray, assign: np.ndarray, n_bins: int,
                             values: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """:func:`csr_from_assignment`, with ``values`` (``values[t]`` belongs to item ``order[t]``) in the same order."""
    assign = np.asarray(assign, np.int64)
    counts = np.zeros(n_bins + 1, np.int64)
    np.cumsum(np.bincount(assign, minlength=n_bins), out=counts[1:])
    by_bin = np.argsort(assign, kind="stable")
    return counts, np.asarray(order, np.int64)[by_bin], np.asarray(values, np.int64)[by_bin]


def sorted_decreasing(lengths: np.ndarray, capacity: int) -> np.ndarray:
    """``lengths[decreasing_order(lengths, capacity)]`` without the gather: lengths are 1..capacity,
    so the sorted array is each value repeated as often as it occurs (one counting pass, written in order)."""
    counts = np.bincount(lengths, minlength=capacity + 1)[::-1]
    return np.repeat(np.arange(capacity, -1, -1, dtype=np.int64), counts)


def reorder_values(offsets: np.ndarray, new_offsets: np.ndarray, perm: np.ndarray, values: np.ndarray) -> np.ndarray:
    """CSR ``values`` with bin ``perm[k]`` moved to position ``k``."""
    return values[concat_ranges(offsets[:-1][perm], np.diff(new_offsets))]


def bfd(lengths: np.ndarray, capacity: int, max_segments: int, need: np.ndarray, caps: np.ndarray,
        class_rem: np.ndarray, stride: np.ndarray) -> tuple[np.ndarray, int]:
    """Best fit in the given order, each bin class a set of stacks by free space: the numba kernel's steps.

    An item takes, among the classes whose media left admit it, the smallest free space
    that fits (the first such class on a tie), and there the bin most recently moved to
    that free space; a bin that cannot take another segment is not pushed back."""
    n_kinds = len(caps)
    rems = [tuple(int(v) for v in row) for row in class_rem]
    stacks: list[dict[int, list[int]]] = [{} for _ in rems]  # per class: free space -> bins, last moved on top
    frees: list[list[int]] = [[] for _ in rems]  # per class: the free spaces with a bin, sorted
    free: list[int] = []
    nseg: list[int] = []
    rem: list[list[int]] = []
    caps_list = [int(c) for c in caps]
    stride_list = [int(s) for s in stride]
    needs = need.tolist() if n_kinds else None
    assign = np.empty(len(lengths), np.int32)
    for i, length in enumerate(lengths.tolist()):
        best_f = best_c = -1
        item_need = needs[i] if n_kinds else ()
        for c, class_left in enumerate(rems):
            if n_kinds and any(left < wanted for left, wanted in zip(class_left, item_need, strict=True)):
                continue
            values = frees[c]
            at = bisect.bisect_left(values, length)
            if at < len(values) and (best_f < 0 or values[at] < best_f):
                best_f, best_c = values[at], c
        if best_c < 0:
            b = len(free)
            free.append(capacity)
            nseg.append(0)
            rem.append(list(caps_list))
        else:
            stack = stacks[best_c][best_f]
            b = stack.pop()
            if not stack:
                del stacks[best_c][best_f]
                values = frees[best_c]
                del values[bisect.bisect_left(values, best_f)]
        free[b] -= length
        nseg[b] += 1
        c = 0
        for k in range(n_kinds):
            rem[b][k] -= item_need[k]
            c += rem[b][k] * stride_list[k]
        assign[i] = b
        f = free[b]
        if f > 0 and (max_segments == 0 or nseg[b] < max_segments):
            stack = stacks[c].get(f)
            if stack is None:
                stack = stacks[c][f] = []
                bisect.insort(frees[c], f)
            stack.append(b)
    return assign, len(free)
