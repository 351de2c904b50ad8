"""Compile the planner's numba kernels into numba's on-disk cache ahead of the first plan.

The kernels are ``@njit(cache=True)``: the first process that calls one compiles it (~9 s of CPU for all of them)
and writes it beside its module (``packer/pack/__pycache__``); every later process loads it.
This module, run as a script (``make setup`` runs it), plans synthetic lengths with every built-in algorithm and
row order, once splitting an oversize sample, and with media caps where the algorithm takes them, all above
``_small.SMALL`` segments so the numba paths run: each kernel compiled for the argument types
:func:`packer.pack.plan` gives it. Nothing else is written.
"""

from __future__ import annotations

import time

import numpy as np

from packer.pack import _small
from packer.pack.plan import ORDERS, plan
from packer.pack.registry import ALGORITHMS


def warm() -> int:
    """Plan once per (algorithm, row order), with media caps where the algorithm takes them; returns the plans made."""
    rng = np.random.default_rng(0)
    n = _small.SMALL + 1
    lengths = rng.integers(1, 512, n)
    images = rng.integers(0, 3, n)
    made = 0
    for name, spec in ALGORITHMS.items():
        for order in ORDERS:
            plan(lengths, 1024, algorithm=name, order=order, seed=0)
            made += 1
        plan(np.append(lengths, 3000), 1024, algorithm=name, oversize="split")  # pieces that start inside a sample
        made += 1
        if "max_media" in spec.supports:
            plan(lengths, 1024, algorithm=name, max_segments=8, media={"image": images}, max_media={"image": 4})
            made += 1
    return made


def main() -> None:
    began = time.perf_counter()
    made = warm()
    print(f"packer: the planner's numba kernels compiled and cached ({made} plans, {time.perf_counter() - began:.1f} s)")


if __name__ == "__main__":
    main()
