"""Token-count policies: the number of placeholder positions a vision or audio encoder
produces for one item, and the grid ``(t, h, w)`` after merging where it is known. One module
per policy, filed by name in a registry (:mod:`packer.media.policies.base`).

Each policy is a frozen dataclass built from a spec string ``name[:key=value,...]``
(``"dynamic:max_pixels=1003520"``, ``"fixed:model=ViT-L-14-336"``); unknown names and
keys are refused. Sizes follow the HF convention: ``count(height, width)``.
:func:`policy_count` applies one to a probed item, naming what it refuses as a record's reason.

Worked numbers (tests check them, and HF's own processors, over many sizes):

    fixed   ViT-L-14-336 (336 / 14)^2                     -> 576
    dynamic 448x448 -> 256, 1080x1920 -> 1222              (Qwen2-VL defaults)
    anyres  672x672 -> 2928, 480x640 -> 2340, 336x336 -> 1176  (LLaVA-NeXT)
    qwen2-audio 10 s -> 250, 30 s -> 750;  whisper 1500 per 30 s window
    qwen2vl video 4 s at 30 fps, 200x120 -> 8 frames (2 fps), each 420x252 -> grid (4, 9, 15) -> 540
"""

from __future__ import annotations

from typing import Any

from packer.errors import BadRecord, ConfigError
from packer.media.policies.anyres import AnyRes, best_resolution
from packer.media.policies.base import (
    AUDIO_POLICIES,
    IMAGE_POLICIES,
    POLICY_FIX,
    POLICY_TABLES,
    VIDEO_POLICIES,
    Count,
    VideoCount,
    register,
)
from packer.media.policies.dynamic import Dynamic
from packer.media.policies.fixed import Fixed, open_clip_geometry
from packer.media.policies.qwen2_audio import Qwen2Audio
from packer.media.policies.qwen2vl_video import Qwen2VLVideo
from packer.media.policies.rate import Rate
from packer.media.policies.whisper import Whisper
from packer.specs import parse_spec


def parse_policy(spec: str, kind: str) -> Any:
    """Build a policy from ``name[:key=value,...]``; ``kind`` is ``image``, ``audio`` or ``video``."""
    if kind not in POLICY_TABLES:
        raise ConfigError(f"unknown media kind {kind!r} for a token policy; known: {', '.join(POLICY_TABLES)}")
    table = POLICY_TABLES[kind]
    name, kwargs = parse_spec(spec, table, what=f"{kind} token policy")
    return table[name](**kwargs)


def policy_count(policy: Any, kind: str, info: Any, part: Any) -> Count:
    """``policy``'s count of a probed item; what the policy refuses is ``unsupported_<kind>``, a clip that
    gives no position ``audio_too_short``. A video given as frame images is counted as a file of those frames
    at the record's ``fps`` (the HF video processors sample a list of frames handed with its rate as they sample
    a file); one that states no rate is taken whole, timed at the policy's fps (qwen-vl-utils' convention)."""
    try:
        if kind == "image":
            return policy.count(info.height, info.width)
        if kind == "audio":
            count = policy.count(info.frames, info.sample_rate)
            if count.length < 1:
                raise BadRecord("audio_too_short", f"{part.ref!r} is {1000 * info.seconds:.1f} ms: the encoder produces "
                                                   f"0 positions under audio policy {policy.name!r}; drop the clip or pad it")
            return count
        return policy.count(info.frames, info.fps, info.height, info.width)
    except ValueError as e:
        size = f"{info.width}x{info.height}" if kind == "image" else f"{info.frames} frames"
        raise BadRecord(f"unsupported_{kind}", f"{part.ref!r} ({size}): {e} ({kind} policy {policy.name!r})") from None


__all__ = ["AUDIO_POLICIES", "IMAGE_POLICIES", "POLICY_FIX", "POLICY_TABLES", "VIDEO_POLICIES", "AnyRes", "Count", "Dynamic",
           "Fixed", "Qwen2Audio", "Qwen2VLVideo", "Rate", "VideoCount", "Whisper", "best_resolution", "open_clip_geometry",
           "parse_policy", "policy_count", "register"]
