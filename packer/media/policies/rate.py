"""``rate``: a fixed number of audio tokens per second."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

from packer.media import bounds
from packer.media.policies.base import POLICY_FIX, Count, register


@register("audio")
@dataclass(frozen=True)
class Rate:
    """A fixed number of tokens per second of audio (ceil); any clip of at least one
    sample gets at least one (the ceiling of a positive duration)."""

    name: ClassVar[str] = "rate"
    per_second: float = 25.0

    def __post_init__(self):
        bounds.check(self, self.name, fix=POLICY_FIX)

    def count(self, frames: int, sample_rate: int) -> Count:
        return Count(max(1, math.ceil(frames * self.per_second / sample_rate - 1e-9)))
