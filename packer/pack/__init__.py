"""Stage 2: the planner. ``plan(lengths, capacity, algorithm=...)`` -> :class:`Plan`."""

from packer.pack import bfd  # noqa: F401  (registers "bfd")
from packer.pack.plan import Plan, plan
from packer.pack.registry import ALGORITHMS, register

__all__ = ["ALGORITHMS", "Plan", "plan", "register"]
