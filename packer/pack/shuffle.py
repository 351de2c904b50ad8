"""First fit in a seeded random order (NeMo's default packing).

Rows come out with a mix of long and short samples instead of the short ones
clustering in the last rows, which some users prefer for convergence; it costs a few
tenths of a percent more rows than best-fit decreasing.
"""

from __future__ import annotations

import numpy as np

from packer.pack._first_fit import first_fit
from packer.pack.registry import NO_CONSTRAINTS, Constraints


def first_fit_shuffled(lengths: np.ndarray, capacity: int, *, seed: int = 0,
                       constraints: Constraints = NO_CONSTRAINTS) -> tuple[np.ndarray, np.ndarray]:
    order = np.random.default_rng(seed).permutation(len(lengths))
    return first_fit(order, lengths, capacity, constraints.max_segments)
