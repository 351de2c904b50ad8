"""Best-fit decreasing over the whole dataset, in O(n log C) with small constants.

Lengths are integers no larger than the capacity C, so bins with the same free space
are interchangeable. Open bins sit in one stack per free-space value, and a two-level
bitset over the values 0..C answers "smallest free space >= l" in two word scans: no
per-bin search, no heap, no Python in the loop (numba). Ties go to the bin most
recently moved to that free space, so the result is deterministic.

Media caps split the bins into classes by what they have left (e.g. 0..4 images left
gives 5 classes); an item looks in every class that can still take its media and
takes the tightest fit among them. Without caps there is one class.

Below ``_small.SMALL`` segments x classes the same steps run in plain Python
(``_small.bfd``: the same bins, no numba start-up); above it the numba kernel
(``_bfd_numba.bfd``) runs.
"""

from __future__ import annotations

import numpy as np

from packer.pack import _small
from packer.pack.registry import NO_CONSTRAINTS, Constraints

MAX_CLASS_CELLS = 64_000_000  # classes x (capacity + 1) stack heads


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
    order = _small.decreasing_order(lengths, capacity)
    need = constraints.need_for(len(lengths))[order].astype(np.int64)  # contiguous in placement order
    placed = _small.sorted_decreasing(lengths, capacity)  # = lengths[order], without a random gather
    args = (placed, capacity, constraints.max_segments, need, caps, class_rem.astype(np.int64), stride)
    if len(lengths) * n_classes < _small.SMALL:  # the Python loop visits every class for every item
        return _small.csr_from_assignment_with(order, *_small.bfd(*args), placed)
    from packer.pack._bfd_numba import bfd
    from packer.pack._bits import csr_from_assignment_with

    return csr_from_assignment_with(order, *bfd(*args), placed)
