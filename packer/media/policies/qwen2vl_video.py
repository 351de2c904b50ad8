"""``qwen2vl``: Qwen2-VL / Qwen2.5-VL videos as ``Qwen2VLVideoProcessor`` samples, resizes and patches them."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

from packer.errors import ConfigError
from packer.media import bounds
from packer.media.policies.base import POLICY_FIX, VideoCount, register
from packer.media.policies.dynamic import Dynamic


@register("video")
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
