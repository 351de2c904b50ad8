"""First-fit decreasing: longest first, each into the first (oldest) bin with room."""

from __future__ import annotations

import numpy as np

from packer.pack._first_fit import first_fit
from packer.pack._small import decreasing_order
from packer.pack.registry import NO_CONSTRAINTS, Constraints


def first_fit_decreasing(lengths: np.ndarray, capacity: int, *, seed: int = 0,
                         constraints: Constraints = NO_CONSTRAINTS) -> tuple[np.ndarray, np.ndarray]:
    return first_fit(decreasing_order(lengths, capacity), lengths, capacity, constraints.max_segments)
