"""Stage 2: the planner. ``plan(lengths, capacity, algorithm=...)`` -> :class:`Plan`.

Pure functions over integer arrays (no I/O, no torch). Algorithms live one per file
(``bfd``, ``ffd``, ``shuffle``, ``next_fit``) behind the name registry; numba is
imported when an algorithm first runs, not when this package is imported.
"""

from packer.pack.oversize import POLICIES as OVERSIZE_POLICIES
from packer.pack.plan import ORDERS, Plan, cap_bound, plan
from packer.pack.registry import ALGORITHMS, Constraints, register

__all__ = ["ALGORITHMS", "ORDERS", "OVERSIZE_POLICIES", "Constraints", "Plan", "cap_bound", "plan", "register"]
