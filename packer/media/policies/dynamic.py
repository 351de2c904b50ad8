"""``dynamic``: Qwen2-VL / Qwen2.5-VL smart resize, one token per merged patch (448x448 -> 256)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

from packer.errors import ConfigError
from packer.media import bounds
from packer.media.policies.base import POLICY_FIX, Count, register


@register("image")
@dataclass(frozen=True)
class Dynamic:
    """Qwen2-VL / Qwen2.5-VL smart resize: each side rounded to a multiple of
    factor = patch_size x merge_size, scaled down when the area exceeds ``max_pixels`` and
    up when below ``min_pixels``; one token per merged patch.

    ``rounding=transformers`` (default) is ``transformers.models.qwen2_vl.
    image_processing_qwen2_vl.smart_resize`` operation for operation, so the count equals
    what ``Qwen2VLImageProcessor`` produces for every size, tiny sides included: a side
    under factor / 2 rounds to 0, the area falls under ``min_pixels`` and both sides are
    scaled up (10x2000 -> 28x812 -> 29 tokens; 1x1 -> 56x56 -> 4).
    ``rounding=qwen-vl-utils`` clamps the first rounding at ``factor`` as qwen-vl-utils'
    ``smart_resize`` does (10x2000 -> 28x1988 -> 71 tokens): use it only when the
    training code resizes with qwen-vl-utils itself before the HF processor.
    An aspect ratio over 200 raises ``ValueError``, as transformers does (the counter
    quarantines the record as ``unsupported_image``)."""

    name: ClassVar[str] = "dynamic"
    patch_size: int = 14
    merge_size: int = 2
    min_pixels: int = 56 * 56
    max_pixels: int = 28 * 28 * 1280
    rounding: str = "transformers"

    def __post_init__(self):
        bounds.check(self, self.name, fix=POLICY_FIX)
        if self.rounding not in ("transformers", "qwen-vl-utils"):
            raise ConfigError(f"dynamic: rounding must be transformers or qwen-vl-utils, got {self.rounding!r}")

    def resize(self, height: int, width: int) -> tuple[int, int]:
        """The (height, width) the image is resized to; ``ValueError`` where the model refuses it."""
        factor = self.patch_size * self.merge_size
        if max(height, width) / min(height, width) > 200:
            raise ValueError(f"aspect ratio {max(height, width) / min(height, width):.0f} is over 200")
        floor = factor if self.rounding == "qwen-vl-utils" else 0
        h = max(floor, round(height / factor) * factor)
        w = max(floor, round(width / factor) * factor)
        if h * w > self.max_pixels:
            beta = math.sqrt((height * width) / self.max_pixels)
            h = max(factor, math.floor(height / beta / factor) * factor)
            w = max(factor, math.floor(width / beta / factor) * factor)
        elif h * w < self.min_pixels:
            beta = math.sqrt(self.min_pixels / (height * width))
            h = math.ceil(height * beta / factor) * factor
            w = math.ceil(width * beta / factor) * factor
        return h, w

    def count(self, height: int, width: int) -> Count:
        h, w = self.resize(height, width)
        factor = self.patch_size * self.merge_size
        return Count((h // factor) * (w // factor), (1, h // factor, w // factor))
