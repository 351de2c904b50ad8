"""The registry of token-count policies and what a policy's count is.

A policy is a frozen dataclass with a ``name`` and a ``count(...)`` (images: ``count(height, width)``; audio:
``count(frames, sample_rate)``; video: ``count(frames, fps, height, width)``) returning a :class:`Count`.
``@register(kind)`` files it under its name in the kind's table (:data:`POLICY_TABLES`), which spec parsing
(:func:`packer.media.policies.parse_policy`) and the config's checks read; one module per policy.
"""

from __future__ import annotations

from dataclasses import dataclass

POLICY_FIX = "the policy spec, --image-tokens / --audio-tokens / --video-tokens POLICY:NAME=VALUE"

IMAGE_POLICIES: dict[str, type] = {}
AUDIO_POLICIES: dict[str, type] = {}
VIDEO_POLICIES: dict[str, type] = {}
POLICY_TABLES = {"image": IMAGE_POLICIES, "audio": AUDIO_POLICIES, "video": VIDEO_POLICIES}


def register(kind: str):
    """Class decorator: file the policy under its ``name`` in ``kind``'s table; a name registered twice is refused."""
    table = POLICY_TABLES[kind]

    def deco(cls):
        if cls.name in table:
            raise ValueError(f"{kind} token policy {cls.name!r} registered twice")
        table[cls.name] = cls
        return cls

    return deco


@dataclass(frozen=True)
class Count:
    """A policy's count of one item: ``length`` placeholder positions and, where known, the merged ``grid``."""

    length: int
    grid: tuple[int, ...] = ()


@dataclass(frozen=True)
class VideoCount(Count):
    """A video's count: ``length`` and the merged ``grid`` (t, h, w) as for images, plus the
    number of frames the model's processor takes from the video (before the temporal padding
    of an odd count) and Qwen2.5-VL's ``second_per_grid_t`` (seconds one temporal grid step
    spans: temporal_patch_size / the rate of the sampled frames), which time-scaled mRoPE needs."""

    frames: int = 0
    second_per_grid_t: float = 0.0
