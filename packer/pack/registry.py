"""Name -> packing algorithm. Built-ins are named by import path and loaded on first
use, so ``import packer.pack`` stays free of numba.

An algorithm is a pure function

    fn(lengths: int64[n], capacity: int, *, seed: int, constraints: Constraints)
        -> (offsets: int64[b + 1], indices: int64[n]) or (offsets, indices, lengths[indices])

placing every item (all lengths already in 1..capacity, every item's media within the
caps) into bins in CSR layout. ``supports`` names the constraints it honours; the
planner refuses to call it with any other.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

Algorithm = Callable[..., tuple[np.ndarray, np.ndarray]]
CONSTRAINTS = ("max_segments", "max_media")


@dataclass(frozen=True)
class Constraints:
    """Per-row limits besides the token capacity.

    ``need[i, k]`` is how much of resource ``k`` item ``i`` uses (e.g. its number of
    images) and ``caps[k]`` the most a row may hold; ``max_segments`` 0 means no limit.
    """

    max_segments: int = 0
    need: np.ndarray = field(default_factory=lambda: np.zeros((0, 0), np.int64))
    caps: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    names: tuple[str, ...] = ()

    def used(self) -> set[str]:
        return ({"max_segments"} if self.max_segments else set()) | ({"max_media"} if len(self.caps) else set())

    def need_for(self, n: int) -> np.ndarray:
        return self.need if len(self.caps) else np.zeros((n, 0), np.int64)

    def subset(self, idx: np.ndarray) -> Constraints:
        return Constraints(self.max_segments, self.need[idx] if len(self.caps) else self.need, self.caps, self.names)


NO_CONSTRAINTS = Constraints()


@dataclass(frozen=True)
class AlgorithmSpec:
    name: str
    target: str | Algorithm  # "module:function" or the function itself
    supports: frozenset[str]
    description: str

    def load(self) -> Algorithm:
        if callable(self.target):
            return self.target
        module, _, fn = self.target.partition(":")
        return getattr(importlib.import_module(module), fn)


ALGORITHMS: dict[str, AlgorithmSpec] = {}


def _add(spec: AlgorithmSpec) -> None:
    if spec.name in ALGORITHMS:
        raise ValueError(f"packing algorithm {spec.name!r} registered twice")
    unknown = set(spec.supports) - set(CONSTRAINTS)
    if unknown:
        raise ValueError(f"unknown constraint(s) {sorted(unknown)}; known: {', '.join(CONSTRAINTS)}")
    ALGORITHMS[spec.name] = spec


def check_supported(algorithm: str, used: set[str]) -> None:
    """Refuse constraints ``algorithm`` does not honour, naming the algorithms that do."""
    missing = set(used) - ALGORITHMS[algorithm].supports
    if missing:
        able = sorted(n for n, s in ALGORITHMS.items() if missing <= s.supports)
        raise ValueError(f"algorithm {algorithm!r} does not support {', '.join(sorted(missing))}; use {' or '.join(able)}")


def register(name: str, *, supports: tuple[str, ...] = (), description: str = "") -> Callable[[Algorithm], Algorithm]:
    """Register a packing algorithm under ``name`` (decorator)."""

    def deco(fn: Algorithm) -> Algorithm:
        _add(AlgorithmSpec(name, fn, frozenset(supports), description or (fn.__doc__ or "").strip().split("\n")[0]))
        return fn

    return deco


for _spec in (
    AlgorithmSpec("bfd", "packer.pack.bfd:best_fit_decreasing", frozenset(CONSTRAINTS),
                  "best-fit decreasing over the whole dataset (default)"),
    AlgorithmSpec("ffd", "packer.pack.ffd:first_fit_decreasing", frozenset({"max_segments"}),
                  "first-fit decreasing"),
    AlgorithmSpec("shuffle", "packer.pack.shuffle:first_fit_shuffled", frozenset({"max_segments"}),
                  "first fit in a seeded random order (NeMo's default; short samples do not cluster)"),
    AlgorithmSpec("next-fit", "packer.pack.next_fit:next_fit", frozenset(CONSTRAINTS),
                  "next fit in dataset order (the naive baseline)"),
):
    _add(_spec)
