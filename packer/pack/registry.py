"""Name -> packing algorithm. An algorithm is a pure function

    fn(lengths: int64[n], capacity: int, *, seed: int) -> (offsets: int64[b+1], indices: int64[n])

placing every sample (all lengths are already in 1..capacity) into CSR-laid-out bins.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

Algorithm = Callable[..., tuple[np.ndarray, np.ndarray]]
ALGORITHMS: dict[str, Algorithm] = {}


def register(name: str) -> Callable[[Algorithm], Algorithm]:
    def deco(fn: Algorithm) -> Algorithm:
        if name in ALGORITHMS:
            raise ValueError(f"packing algorithm {name!r} registered twice")
        ALGORITHMS[name] = fn
        return fn

    return deco
