"""A model's media towers and the zero-contribution dummy item each runs on (see :mod:`packer.loader.dummy`).

A family declares its towers per HF ``model_type`` (:attr:`packer.families.Family.towers`); each
:class:`Tower` names where it sits on the HF model, the kinds it encodes and ``build(config, kind)``, which
makes the :class:`Dummy` -- the model's own input tensors for one minimal item and its placeholder count --
from the model's config.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Dummy:
    """One dummy media item: the batch keys the model takes for it and its placeholder count."""

    kind: str
    length: int  # placeholder positions its features fill
    inputs: dict[str, Any]  # name -> torch.Tensor
    grid: tuple[int, ...] = ()  # merged (t, h, w) for mRoPE; () where the family has none
    span: dict[str, Any] = field(default_factory=dict)  # extra span fields (a video's second_per_grid_t)
    covers: tuple[str, ...] = ()  # kinds whose items make it unneeded besides its own (InternVL: image and video)


@dataclass(frozen=True)
class Tower:
    """A tower of a model family: where it sits on the HF model, the media kinds (forward call
    sites) it encodes, and ``build(config, kind) -> Dummy``.

    ``joint``: the kinds reach the tower in ONE call (InternVL scatters image tiles and video frames
    from one ``pixel_values``): one dummy, of the first kind the build declares, stands for them all,
    and a batch holding an item of any of them needs none. ``config``: the sub-config without which
    the model has no such tower (Gemma 4's smaller models have no audio tower: no dummy, no check)."""

    attribute: str
    kinds: tuple[str, ...]
    build: Callable[[Any, str], Dummy]
    joint: bool = False
    config: str = ""

    def present(self, config) -> bool:
        return not self.config or getattr(config, self.config, None) is not None


def side(x) -> int:
    """A square size given as an int or (height, width)."""
    if isinstance(x, (list, tuple)):
        if len(set(x)) != 1:
            raise ValueError(f"the dummy media are square tiles; the tower's size is {tuple(x)}")
        return int(x[0])
    return int(x)


def channels(vision_config) -> int:
    return int(getattr(vision_config, "num_channels", None) or getattr(vision_config, "in_channels", None)
               or getattr(vision_config, "in_chans", None) or 3)
