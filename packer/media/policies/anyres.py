"""``anyres``: LLaVA-NeXT's best-fit grid of tiles plus the base image (672x672 -> 2928)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

from packer.errors import ConfigError
from packer.media import bounds
from packer.media.policies.base import POLICY_FIX, Count, register


@register("image")
@dataclass(frozen=True)
class AnyRes:
    """LLaVA-NeXT: the best-fit grid pinpoint is tiled into image_size tiles; the
    unpadded feature map plus one newline token per row, plus the base image's
    (image_size / patch_size)^2 tokens. ``pinpoints`` as ``336x672/672x336/...`` (h x w)."""

    name: ClassVar[str] = "anyres"
    image_size: int = 336
    patch_size: int = 14
    pinpoints: str = "336x672/672x336/672x672/1008x336/336x1008"

    def __post_init__(self):
        bounds.check(self, self.name, fix=POLICY_FIX)

    def grid_pinpoints(self) -> list[tuple[int, int]]:
        try:
            return [tuple(int(v) for v in p.split("x")) for p in self.pinpoints.split("/")]
        except ValueError:
            raise ConfigError(f"anyres: pinpoints {self.pinpoints!r} must look like 336x672/672x336") from None

    def count(self, height: int, width: int) -> Count:
        best_h, best_w = best_resolution(height, width, self.grid_pinpoints())
        side = self.image_size // self.patch_size
        cur_h, cur_w = unpadded(height, width, side * (best_h // self.image_size), side * (best_w // self.image_size))
        return Count(cur_h * cur_w + cur_h + side * side)


def unpadded(height: int, width: int, cur_h: int, cur_w: int) -> tuple[int, int]:
    """The feature map ``cur_h x cur_w`` of the best-fit grid with the padding around a ``height x width`` image
    cut off (HF's ``unpad_image`` arithmetic, rounded as its processors count it): LLaVA-NeXT and OneVision."""
    if width / height > cur_w / cur_h:
        new_h = int(round(height * (cur_w / width), 7))
        cur_h -= 2 * ((cur_h - new_h) // 2)
    else:
        new_w = int(round(width * (cur_h / height), 7))
        cur_w -= 2 * ((cur_w - new_w) // 2)
    return cur_h, cur_w


def best_resolution(height: int, width: int, candidates: list[tuple[int, int]]) -> tuple[int, int]:
    """The candidate (h, w) that keeps the most of the image, then wastes the least."""
    best, best_effective, best_waste = candidates[0], -1, math.inf
    for h, w in candidates:
        scale = min(w / width, h / height)
        effective = min(int(width * scale) * int(height * scale), width * height)
        waste = w * h - effective
        if effective > best_effective or (effective == best_effective and waste < best_waste):
            best, best_effective, best_waste = (h, w), effective, waste
    return best
