"""Token-count policies: the number of placeholder positions a vision or audio encoder
produces for one item, and the grid ``(t, h, w)`` after merging where it is known.

Each policy is a frozen dataclass built from a spec string ``name[:key=value,...]``
(``"dynamic:max_pixels=1003520"``, ``"fixed:model=ViT-L-14-336"``); unknown names and
keys are refused. Sizes follow the HF convention: ``count(height, width)``.

Worked numbers (tests check them, and HF's own processors, over many sizes):

    fixed   ViT-L-14-336 (336 / 14)^2                     -> 576
    dynamic 448x448 -> 256, 1080x1920 -> 1222              (Qwen2-VL defaults)
    anyres  672x672 -> 2928, 480x640 -> 2340, 336x336 -> 1176  (LLaVA-NeXT)
    qwen2-audio 10 s -> 250, 30 s -> 750;  whisper 1500 per 30 s window
    qwen2vl video 4 s at 30 fps, 200x120 -> 8 frames (2 fps), each 420x252 -> grid (4, 9, 15) -> 540
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, ClassVar

from packer.errors import ConfigError
from packer.media import bounds
from packer.specs import parse_spec

IMAGE_POLICIES: dict[str, type] = {}
AUDIO_POLICIES: dict[str, type] = {}
VIDEO_POLICIES: dict[str, type] = {}

POLICY_FIX = "the policy spec, --image-tokens / --audio-tokens / --video-tokens POLICY:NAME=VALUE"


@dataclass(frozen=True)
class Count:
    length: int
    grid: tuple[int, ...] = ()


def _register(table: dict[str, type]):
    def deco(cls):
        table[cls.name] = cls
        return cls

    return deco


# ---------------------------------------------------------------- image policies


@_register(IMAGE_POLICIES)
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


@_register(IMAGE_POLICIES)
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


@_register(IMAGE_POLICIES)
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
        cur_h, cur_w = side * (best_h // self.image_size), side * (best_w // self.image_size)
        if width / height > cur_w / cur_h:
            new_h = int(round(height * (cur_w / width), 7))
            cur_h -= 2 * ((cur_h - new_h) // 2)
        else:
            new_w = int(round(width * (cur_h / height), 7))
            cur_w -= 2 * ((cur_w - new_w) // 2)
        return Count(cur_h * cur_w + cur_h + side * side)


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


# ---------------------------------------------------------------- audio policies


@_register(AUDIO_POLICIES)
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


@_register(AUDIO_POLICIES)
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


@_register(AUDIO_POLICIES)
@dataclass(frozen=True)
class Rate:
    """A fixed number of tokens per second of audio (ceil); any clip of at least one
    sample gets at least one (the ceiling of a positive duration)."""

    name: ClassVar[str] = "rate"
    per_second: float = 25.0

    def __post_init__(self):
        bounds.check(self, self.name, fix=POLICY_FIX)

    def count(self, frames: int, sample_rate: int) -> Count:
        return Count(max(1, math.ceil(frames * self.per_second / sample_rate - 1e-9)))


# ---------------------------------------------------------------- video policies


@dataclass(frozen=True)
class VideoCount(Count):
    """A video's count: ``length`` and the merged ``grid`` (t, h, w) as for images, plus the
    number of frames the model's processor takes from the video (before the temporal padding
    of an odd count) and Qwen2.5-VL's ``second_per_grid_t`` (seconds one temporal grid step
    spans: temporal_patch_size / the rate of the sampled frames), which time-scaled mRoPE needs."""

    frames: int = 0
    second_per_grid_t: float = 0.0


@_register(VIDEO_POLICIES)
@dataclass(frozen=True)
class Qwen2VLVideo:
    """Qwen2-VL / Qwen2.5-VL videos, as transformers' ``Qwen2VLVideoProcessor`` (the video
    processor of both families) samples, resizes and patches them.

    Sampling (``sample=true``, the processor's ``do_sample_frames``) keeps
    n = floor(min(max(frames / video_fps * fps, min_frames), max_frames', frames) / 2) * 2
    frames (max_frames' = max_frames floored to a multiple of temporal_patch_size and to the
    clip's frame count), or ``num_frames`` rounded to a multiple of 2 when set, at the indices
    ``torch.arange(0, frames, frames / n).int()`` -- which holds n + 1 indices for some
    (frames, n) (17 frames, n = 14 -> 15), an odd count the processor pads by repeating the
    last frame; counted as it does. That extra index can round up to one past the last frame (17
    frames, n = 14: 15 indices ending at 17): transformers' PyAV reader then returns n frames, and
    so does packer's loader; ``second_per_grid_t`` still counts n + 1 (the processor's metadata
    does). ``sample=false`` takes every frame given.
    Each frame is smart-resized (``dynamic``'s rule, factor patch_size x merge_size = 28) into
    [min_pixels, max_pixels] (the processor's ``size`` shortest_edge / longest_edge: 128 and
    768 merged patches by default); ``cap_pixels_per_frame=true`` also bounds a frame by an even
    share of ``max_video_tokens`` x 28^2 x 0.9 pixels, floored at 1.05 x min_pixels, as the
    processor does with that option. Then t = ceil(frames / 2), tokens = t x (h / 28) x (w / 28).

    ``fps`` is the video's frame rate. A list of frame images is a video of those frames at the
    rate the record states: sampled exactly as a file (the processor samples a list of frames handed
    with ``video_metadata={"total_num_frames": n, "fps": fps}`` as it samples a decoded file: 6
    frames at 3 fps keep 4, t = 2). A list that states no rate (``fps`` 0) is taken whole, every frame
    (an odd count padded by the processor), timed as sampled at the policy's ``fps``: what
    qwen-vl-utils and ms-swift hand the processor for such a list (``do_sample_frames=False``, the
    list's frames, ``fps`` the pipeline's), since there is no rate to sample it by; ``num_frames``
    still samples it by count. Pure arithmetic: no transformers import.
    ``ValueError`` where the processor cannot take the video (a 1-frame clip samples 0 frames;
    an aspect ratio over 200): the counter quarantines it as ``unsupported_video``."""

    name: ClassVar[str] = "qwen2vl"
    fps: float = 2.0
    min_frames: int = 4
    max_frames: int = 768
    num_frames: int = 0
    sample: bool = True
    temporal_patch_size: int = 2
    patch_size: int = 14
    merge_size: int = 2
    min_pixels: int = 128 * 28 * 28
    max_pixels: int = 768 * 28 * 28
    cap_pixels_per_frame: bool = False
    max_video_tokens: int = 128000

    def __post_init__(self):
        bounds.check(self, self.name, fix=POLICY_FIX)
        for key in ("fps", "temporal_patch_size", "patch_size", "merge_size", "min_pixels", "max_pixels", "max_video_tokens"):
            if getattr(self, key) <= 0:
                raise ConfigError(f"qwen2vl: {key} must be positive, got {getattr(self, key)!r}")
        if self.min_frames < 0 or self.max_frames < self.temporal_patch_size or self.num_frames < 0:
            raise ConfigError(f"qwen2vl: need 0 <= min_frames, max_frames >= temporal_patch_size ({self.temporal_patch_size}) "
                              f"and num_frames >= 0; got min_frames={self.min_frames}, max_frames={self.max_frames}, "
                              f"num_frames={self.num_frames}")
        if self.min_pixels > self.max_pixels:
            raise ConfigError(f"qwen2vl: min_pixels {self.min_pixels} is over max_pixels {self.max_pixels}")

    def sampled(self, frames: int, fps: float) -> int:
        """How many frames the processor's ``sample_frames`` asks for (``n`` above)."""
        tps = self.temporal_patch_size
        if self.num_frames:
            n = round(self.num_frames / tps) * tps
        else:
            if not fps:
                raise ValueError(f"the {frames} frames state no frame rate to sample {self.fps:g} frames a second by")
            top = math.floor(min(self.max_frames, frames) / tps) * tps
            n = min(max(frames / fps * self.fps, self.min_frames), top, frames)
            n = math.floor(n / tps) * tps
        if n > frames:
            raise ValueError(f"{frames} frames cannot give the {n} the policy asks for (num_frames={self.num_frames})")
        if n < 1:
            raise ValueError(f"{frames} frame(s) sample to 0 frames (the processor keeps a multiple of "
                             f"temporal_patch_size={tps}); use a longer clip, or sample=false")
        return n

    def sample_indices(self, frames: int, fps: float) -> list[int]:
        """The processor's ``sample_frames``: ``torch.arange(0, frames, frames / n).int()`` (a float32
        arange: values in double, rounded to float32, truncated), every frame with ``sample=false``.
        Where that arange holds n + 1 values its last one can round up to ``frames``, one past the
        last frame (17 frames, n = 14: ..., 15, 17). A frame list that states no rate (``fps`` 0): every frame,
        unless ``num_frames`` samples it by count (see the class docstring)."""
        if not self.sample or not (fps or self.num_frames):
            return list(range(frames))
        import numpy as np

        n = self.sampled(frames, fps)
        return np.arange(0, frames, frames / n, dtype=np.float64).astype(np.float32).astype(np.int64).tolist()

    def frame_indices(self, frames: int, fps: float) -> list[int]:
        """The frames (decode order) a loader returns: :meth:`sample_indices` without an index past the
        last frame, which transformers' PyAV reader skips (its metadata keeps it: ``second_per_grid_t``
        counts it, as Qwen2.5-VL's processor does)."""
        return [i for i in self.sample_indices(frames, fps) if i < frames]

    def resize(self, frames: int, height: int, width: int) -> tuple[int, int]:
        """The (height, width) every frame is resized to when ``frames`` frames reach the processor."""
        factor = self.patch_size * self.merge_size
        max_pixels = self.max_pixels
        if self.cap_pixels_per_frame:
            total_pixels = int(self.max_video_tokens * factor * factor * 0.9)
            max_pixels = max(min(max_pixels, total_pixels * self.temporal_patch_size // frames), int(self.min_pixels * 1.05))
        return Dynamic(self.patch_size, self.merge_size, self.min_pixels, max_pixels).resize(height, width)

    def count(self, frames: int, fps: float, height: int, width: int) -> VideoCount:
        """Tokens and merged grid of a video of ``frames`` frames at ``fps`` (0: unknown), each
        ``height`` x ``width`` as displayed (rotation applied)."""
        if frames < 1:
            raise ValueError("the video holds no frames")
        sampled = self.sample_indices(frames, fps)
        fps = fps or self.fps  # frames that state no rate: timed as sampled at the policy's rate
        n = sum(1 for i in sampled if i < frames)
        h, w = self.resize(n, height, width)
        factor = self.patch_size * self.merge_size
        t = -(-n // self.temporal_patch_size)
        grid = (t, h // factor, w // factor)
        return VideoCount(t * grid[1] * grid[2], grid, n, self.temporal_patch_size / (len(sampled) / frames * fps))


# ---------------------------------------------------------------- specs


POLICY_TABLES = {"image": IMAGE_POLICIES, "audio": AUDIO_POLICIES, "video": VIDEO_POLICIES}


def parse_policy(spec: str, kind: str) -> Any:
    """Build a policy from ``name[:key=value,...]``; ``kind`` is ``image``, ``audio`` or ``video``."""
    if kind not in POLICY_TABLES:
        raise ConfigError(f"unknown media kind {kind!r} for a token policy; known: {', '.join(POLICY_TABLES)}")
    table = POLICY_TABLES[kind]
    name, kwargs = parse_spec(spec, table, what=f"{kind} token policy")
    return table[name](**kwargs)
