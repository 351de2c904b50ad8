"""Best-fit decreasing over the whole dataset.

Lengths are integers no larger than the capacity, so bins with the same free space are
interchangeable: bins are kept in one stack per free-space value, and a sorted list of
the free-space values that have bins answers "smallest free space >= l" by bisection.
Each item costs O(log C) plus a short list insertion, independent of the bin count.
Ties go to the most recently opened bin, so the result is deterministic.
"""

from __future__ import annotations

import bisect

import numpy as np

from packer._ranges import csr_offsets
from packer.pack.registry import register


@register("bfd")
def best_fit_decreasing(lengths: np.ndarray, capacity: int, *, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    order = np.argsort(-lengths, kind="stable")  # longest first; equal lengths by index
    stacks: dict[int, list[int]] = {}  # free space -> bins with exactly that free space
    free_values: list[int] = []  # sorted free-space values with a non-empty stack
    members: list[list[int]] = []
    for i, length in zip(order.tolist(), lengths[order].tolist(), strict=True):
        k = bisect.bisect_left(free_values, length)
        if k == len(free_values):
            b, free = len(members), capacity
            members.append([])
        else:
            free = free_values[k]
            stack = stacks[free]
            b = stack.pop()
            if not stack:
                del stacks[free]
                free_values.pop(k)
        members[b].append(i)
        left = free - length
        if left > 0:
            if left not in stacks:
                stacks[left] = []
                bisect.insort(free_values, left)
            stacks[left].append(b)
    offsets = csr_offsets(np.fromiter((len(m) for m in members), dtype=np.int64, count=len(members)))
    indices = np.fromiter((i for m in members for i in m), dtype=np.int64, count=int(offsets[-1]))
    return offsets, indices
