"""``qwen2-audio``: Qwen2-Audio's mel frames through a stride-2 conv and a 2x pool (10 s -> 250)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from packer.errors import ConfigError
from packer.media import bounds
from packer.media.policies.base import POLICY_FIX, Count, register


@register("audio")
@dataclass(frozen=True)
class Qwen2Audio:
    """Qwen2-Audio: F mel frames (hop 160 at 16 kHz, so F = ceil(samples_16k / 160), what
    ``WhisperFeatureExtractor``'s attention mask sums to), a stride-2 conv and a 2x pool:
    n = ((F - 1) // 2 + 1 - 2) // 2 + 1 (``Qwen2AudioProcessor``'s formula). The feature
    extractor keeps 30 s; ``long=truncate`` does the same, ``long=split`` counts every
    30 s window (a last window of under 3 frames adds nothing, as the model would).

    Clips of 20 ms or less (F <= 2) give 0, exactly what the encoder produces: the
    counter quarantines them (``audio_too_short``) rather than invent a position."""

    name: ClassVar[str] = "qwen2-audio"
    sampling_rate: int = 16000
    hop_length: int = 160
    max_seconds: float = 30.0
    long: str = "truncate"

    def __post_init__(self):
        bounds.check(self, self.name, fix=POLICY_FIX)
        if self.long not in ("truncate", "split"):
            raise ConfigError(f"qwen2-audio: long must be truncate or split, got {self.long!r}")

    @staticmethod
    def tokens_for_frames(frames: int) -> int:
        return ((frames - 1) // 2 + 1 - 2) // 2 + 1

    def count(self, frames: int, sample_rate: int) -> Count:
        samples = -(-frames * self.sampling_rate // sample_rate)  # length after resampling (ceil)
        frames = -(-samples // self.hop_length)
        window = int(self.max_seconds * self.sampling_rate) // self.hop_length
        if self.long == "truncate" or frames <= window:
            return Count(max(0, self.tokens_for_frames(min(frames, window))))
        full, rest = divmod(frames, window)
        n = full * self.tokens_for_frames(window) + (self.tokens_for_frames(rest) if rest >= 3 else 0)
        return Count(n, (full + (rest >= 3),))
