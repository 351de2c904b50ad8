"""``fixed``: every image resized to the tower's input (CLIP ViTs, LLaVA-1.5: 336 / 14 -> 576)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from packer.errors import ConfigError
from packer.media import bounds
from packer.media.policies.base import POLICY_FIX, Count, register


@register("image")
@dataclass(frozen=True)
class Fixed:
    """Every image is resized to the tower's input: (image_size / patch_size)^2 patches,
    plus one if the class token is kept. ``model`` reads the geometry from open_clip's
    config (``open_clip.get_model_config``); or give ``image_size`` and ``patch_size``."""

    name: ClassVar[str] = "fixed"
    model: str = ""
    image_size: int = 336
    patch_size: int = 14
    cls_token: bool = False

    def __post_init__(self):
        if self.model:
            size, patch = open_clip_geometry(self.model)
            object.__setattr__(self, "image_size", size)
            object.__setattr__(self, "patch_size", patch)
        bounds.check(self, self.name, fix=POLICY_FIX)
        if self.image_size % self.patch_size:
            raise ConfigError(f"fixed: image_size {self.image_size} is not a multiple of patch_size {self.patch_size}")

    def count(self, height: int, width: int) -> Count:
        side = self.image_size // self.patch_size
        return Count(side * side + int(self.cls_token), (1, side, side))


def open_clip_geometry(model: str) -> tuple[int, int]:
    try:
        import open_clip
    except ImportError:
        raise ConfigError("fixed:model=... reads open_clip's model configs: pip install open_clip_torch") from None
    cfg = open_clip.get_model_config(model)
    if cfg is None:
        raise ConfigError(f"fixed: open_clip has no model config {model!r}")
    vision = cfg["vision_cfg"]
    size = vision["image_size"]
    size = size[0] if isinstance(size, (list, tuple)) else size
    if "patch_size" not in vision:
        raise ConfigError(f"fixed: open_clip model {model!r} is not a ViT (no patch_size); give image_size and patch_size")
    return int(size), int(vision["patch_size"])
