"""Dummy-media builders the families share (Qwen's vision tower, Whisper-style audio towers, LLaVA's CLIP).

Each builder is ``build(config, kind) -> Dummy`` for a :class:`~packer.modeling.towers.Tower`; a family names
its towers per model type (:attr:`packer.families.Family.towers`), and :mod:`packer.loader.dummy` reads them
from the registry. The dummies and why they are exact: docs/training.md.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from packer.modeling.towers import Dummy, Tower, channels, side


def qwen_vision(config, kind: str) -> Dummy:
    """Qwen2-VL / Qwen2.5-VL / Qwen3-VL / Omni vision: the smallest grid, (1, merge, merge) patches -> 1 token."""
    import torch

    v = config.vision_config
    merge, patch, tps = int(v.spatial_merge_size), int(v.patch_size), int(v.temporal_patch_size)
    pixels = torch.zeros(merge * merge, channels(v) * tps * patch * patch)
    grid = torch.tensor([[1, merge, merge]])
    if kind == "video":
        return Dummy("video", 1, {"pixel_values_videos": pixels, "video_grid_thw": grid}, (1, 1, 1),
                     {"second_per_grid_t": 1.0})
    return Dummy("image", 1, {"pixel_values": pixels, "image_grid_thw": grid}, (1, 1, 1))


QWEN_VISION = Tower("model.visual", ("image", "video"), qwen_vision)


def llava(config, kind: str) -> Dummy:
    """LLaVA-1.5: one image of the tower's size; (size / patch)^2 tokens (the CLS token dropped)."""
    import torch

    v = config.vision_config
    default_strategy(config)
    s, patch = int(v.image_size), int(v.patch_size)
    return Dummy("image", (s // patch) ** 2, {"pixel_values": torch.zeros(1, channels(v), s, s)})


def llava_next(config, kind: str) -> Dummy:
    """LLaVA-NeXT: one image of the tower's size through anyres (its tiles, base and newlines)."""
    import torch
    from transformers.models.llava_next.modeling_llava_next import image_size_to_num_patches

    from packer.media.policies import AnyRes

    v = config.vision_config
    default_strategy(config)
    s, patch = int(v.image_size), int(v.patch_size)
    pinpoints = [list(p) for p in config.image_grid_pinpoints]
    tiles = image_size_to_num_patches((s, s), pinpoints, s)
    policy = AnyRes(image_size=s, patch_size=patch, pinpoints="/".join(f"{h}x{w}" for h, w in pinpoints))
    pixels = torch.zeros(1, tiles, channels(v), s, s)
    return Dummy("image", policy.count(s, s).length, {"pixel_values": pixels, "image_sizes": torch.tensor([[s, s]])})


def default_strategy(config) -> None:
    strategy = getattr(config, "vision_feature_select_strategy", "default")
    if strategy != "default":
        raise ValueError(f"vision_feature_select_strategy {strategy!r}: packer counts LLaVA images with 'default'")


# Valid mel frames of a dummy clip: 8 give the encoder two positions, the fewest Qwen2-Audio's forward
# accepts (a lone audio token sends it down its legacy expansion path, which refuses packed masks).
AUDIO_FRAMES = 8


def whisper_audio(frames: int | None) -> Callable[[Any, str], Dummy]:
    """A clip of :data:`AUDIO_FRAMES` valid mel frames, zeros, in ``frames`` columns (Qwen2-Audio's
    encoder takes exactly one 30 s window of 3000; None: just the valid ones, Qwen2.5-Omni)."""

    def build(config, kind: str) -> Dummy:
        import torch

        from packer.media.policies import Qwen2Audio

        a = config.audio_config
        width = frames or AUDIO_FRAMES
        mask = torch.zeros(1, width, dtype=torch.int32)
        mask[0, :AUDIO_FRAMES] = 1
        features = torch.zeros(1, int(a.num_mel_bins), width)
        return Dummy("audio", Qwen2Audio.tokens_for_frames(AUDIO_FRAMES),
                     {"input_features": features, "feature_attention_mask": mask})

    return build


def one_tile(config, kind: str, tokens: int) -> Dummy:
    """One tile of zeros of the vision tower's square size, ``tokens`` placeholders."""
    import torch

    v = config.vision_config
    s = side(v.image_size)
    return Dummy(kind, tokens, {"pixel_values": torch.zeros(1, channels(v), s, s)})
