"""Bounds on every resolved processor setting: checked when a family's settings or a media policy is built.

A setting comes from a checkpoint's processor config, ``--processor-options`` or a policy spec, and decides how much
one media item costs (``image_min_pixels=10^12`` upsamples a 64 x 64 image to 14 GB; a patch size of 0 divides by
zero in every record). So each numeric setting is held to a range, by what its name ends with (:data:`RULES`), and a
value out of it -- or not a finite number -- is a :class:`~packer.errors.ConfigError` (exit 2) before stage 1, naming
the value, the limit and the fix. docs/reliability.md holds the table (:func:`table`).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

from packer.errors import ConfigError

MAX_PIXELS = 89_478_485  # PIL's MAX_IMAGE_PIXELS: packer.media.limits' bound on a decoded frame
COLLATE_BYTES = 4 * 2**30  # the most one record's media may need when its row is collated (refused at build time)
AUDIO_COLLATE_BYTES_PER_SECOND = 640_000  # a second of audio through a feature extractor at collate time: the waveform
#   at 16 kHz in float32, its STFT and log-mel (Qwen3-Omni: a 5 h 50 min clip needed over 12 GB, ~570 KB/s)


@dataclass(frozen=True)
class Bound:
    low: float
    high: float
    why: str
    unset: bool = False  # 0 means "unset" (the processor's default) and is allowed


RULES: tuple[tuple[str, Bound], ...] = (  # the first whose suffix a setting's name ends with
    ("pixels", Bound(1, MAX_PIXELS, "pixels of one image or frame after resizing: PIL's MAX_IMAGE_PIXELS, the bound on "
                                    "any frame packer decodes (10^12 passes 14 GB on a 64 x 64 image)")),
    ("patch_size", Bound(1, 1024, "pixels of a patch side (0 divides by zero)")),
    ("merge_size", Bound(1, 64, "patches merged per side")),
    ("kernel_size", Bound(1, 64, "patches pooled per side")),
    ("fps", Bound(0.01, 1000, "frames per second, as packer.media.limits bounds a video's rate", unset=True)),
    ("position_id_per_seconds", Bound(0.01, 1000, "positions per second of audio / video time")),
    ("frames", Bound(1, 8192, "frames sampled from one video (each costs its pixels at collate time)", unset=True)),
    ("patches", Bound(1, 256, "tiles of one image (each a full encoder pass)", unset=True)),
    ("num_crops", Bound(1, 256, "crops of one image (each a full encoder pass)", unset=True)),
    ("crop_size", Bound(1, 8192, "pixels of a crop side")),
    ("tile_size", Bound(1, 8192, "pixels of a tile side")),
    ("tile_height", Bound(1, 8192, "pixels of a tile side")),
    ("tile_width", Bound(1, 8192, "pixels of a tile side")),
    ("image_size", Bound(1, 8192, "pixels of the encoder's input side")),
    ("tokens", Bound(1, 262_144, "positions of one media item (a row is at most --max-length)", unset=True)),
    ("seq_length", Bound(1, 262_144, "positions of one media item (a row is at most --max-length)", unset=True)),
    ("sampling_rate", Bound(1000, 768_000, "audio samples per second, as packer.media.limits bounds a file's",
                            unset=True)),
    ("hop_length", Bound(1, 65_536, "audio samples per feature frame")),
    ("frame_length", Bound(1, 65_536, "audio samples per analysis window")),
    ("max_length", Bound(1, 768_000 * 21_600, "audio samples kept of a clip: 6 h at 768 kHz, packer.media.limits' "
                                              "longest clip")),
    ("n_window", Bound(1, 65_536, "feature frames per encoder window")),
    ("ratio", Bound(0.01, 1, "fraction of the patches kept per side")),
    ("ratio_to_activate", Bound(1, 1000, "aspect ratio above which an image is cropped")),
    ("seconds", Bound(0.01, 21_600, "seconds of audio: packer.media.limits' 6 hours")),
    ("positions", Bound(1, 262_144, "positions of one audio window")),
    ("per_second", Bound(0.01, 10_000, "positions per second of audio")),
    ("length", Bound(1, 262_144, "positions of one media item")),
)


def rule(name: str) -> Bound | None:
    for suffix, bound in sorted(RULES, key=lambda r: -len(r[0])):  # the longest suffix: ratio_to_activate over ratio
        if name.endswith(suffix):
            return bound
    return None


def check(settings: Any, what: str, *, fix: str = "--processor-options NAME=VALUE (or the checkpoint's processor "
                                                  "config)") -> None:
    """Refuse a numeric field of dataclass ``settings`` outside its :data:`RULES` bound, or not a finite number."""
    for f in dataclasses.fields(settings):
        value = getattr(settings, f.name)
        numeric = isinstance(f.default, (int, float)) and not isinstance(f.default, bool)
        if not numeric:
            continue
        bound = rule(f.name)
        where = f"{what}.{f.name}"
        hint = fix.replace("NAME", f.name)
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(f"{where} = {value!r} is not a number; set a number: {hint}")
        if not math.isfinite(value):
            raise ConfigError(f"{where} = {value!r} is not a finite number; set a number within bounds: {hint}")
        if bound is None or (bound.unset and value == 0):
            continue
        if not bound.low <= value <= bound.high:
            raise ConfigError(f"{where} = {_n(value)} is out of bounds ({_n(bound.low)} to {_n(bound.high)}: {bound.why}); "
                              f"set it within: {hint}")
    for prefix in ("", "image_", "video_"):
        low, high = getattr(settings, f"{prefix}min_pixels", None), getattr(settings, f"{prefix}max_pixels", None)
        if low is not None and high is not None and low > high:
            raise ConfigError(f"{what}.{prefix}min_pixels = {low:,} is over {prefix}max_pixels = {high:,}; set "
                              f"min_pixels <= max_pixels: {fix.replace('NAME', prefix + 'min_pixels')}")
    _check_frames(settings, what, fix)


def _check_frames(settings: Any, what: str, fix: str) -> None:
    """Frame counts that sample no video: the Qwen video processors keep a multiple of temporal_patch_size frames
    (at least one group), at most max_frames, at least min_frames; ``max_frames = 0`` (0 is "unset" for num_frames
    and min_frames alone) or ``min_frames > max_frames`` would leave every video of the build with no frame."""
    for prefix in ("", "video_"):
        group = getattr(settings, f"{prefix}temporal_patch_size", None)
        low, high = getattr(settings, f"{prefix}min_frames", None), getattr(settings, f"{prefix}max_frames", None)
        fixed = getattr(settings, f"{prefix}num_frames", None)
        if group is None or high is None:
            continue
        if high < group:
            raise ConfigError(f"{what}.{prefix}max_frames = {high:,} is under {prefix}temporal_patch_size = {group} (the "
                              f"processor keeps whole groups of {group} frames: every video would sample none); set "
                              f"max_frames >= {group}: {fix.replace('NAME', prefix + 'max_frames')}")
        if low is not None and low > high:
            raise ConfigError(f"{what}.{prefix}min_frames = {low:,} is over {prefix}max_frames = {high:,}; set "
                              f"min_frames <= max_frames: {fix.replace('NAME', prefix + 'min_frames')}")
        if fixed and fixed < group:
            raise ConfigError(f"{what}.{prefix}num_frames = {fixed:,} is under {prefix}temporal_patch_size = {group} (the "
                              f"processor keeps whole groups of {group} frames); set num_frames >= {group}, or 0 to "
                              f"sample by fps: {fix.replace('NAME', prefix + 'num_frames')}")


def table() -> str:
    """The bounds as a markdown table (docs/reliability.md)."""
    rows = ["| setting (name ends with) | limit | why |", "|---|---|---|"]
    for suffix, b in RULES:
        rows.append(f"| `{suffix}` | {_n(b.low)} to {_n(b.high)}{' (0: unset)' if b.unset else ''} | {b.why} |")
    return "\n".join(rows)


def _n(x: float) -> str:
    return f"{int(x):,}" if float(x).is_integer() else f"{x:g}"


def audio_collate_bytes(seconds: float) -> int:
    """What ``seconds`` of audio the encoder keeps need when a row holding them is collated (estimated)."""
    return int(math.ceil(seconds * AUDIO_COLLATE_BYTES_PER_SECOND))
