"""``whisper``: the Whisper encoder's 1500 positions per 30 s window."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

from packer.errors import ConfigError
from packer.media import bounds
from packer.media.policies.base import POLICY_FIX, Count, register


@register("audio")
@dataclass(frozen=True)
class Whisper:
    """Whisper encoder: 1500 positions per 30 s window (3000 mel frames, stride 2).
    ``windows=ceil`` uses ceil(duration / 30) windows; ``windows=one`` always one padded
    window (clips over 30 s are cut at 30 s, as Whisper's feature extractor does)."""

    name: ClassVar[str] = "whisper"
    window_seconds: float = 30.0
    positions: int = 1500
    windows: str = "ceil"

    def __post_init__(self):
        bounds.check(self, self.name, fix=POLICY_FIX)
        if self.windows not in ("ceil", "one"):
            raise ConfigError(f"whisper: windows must be ceil or one, got {self.windows!r}")

    def count(self, frames: int, sample_rate: int) -> Count:
        seconds = frames / sample_rate
        n = 1 if self.windows == "one" else max(1, math.ceil(seconds / self.window_seconds - 1e-9))
        return Count(n * self.positions, (n,))
