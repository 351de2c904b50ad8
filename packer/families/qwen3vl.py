"""Qwen3-VL (and Qwen3.5, whose processor is Qwen3-VL's): images and videos, token for token with
``Qwen3VLProcessor``.

Images: ``Qwen2VLImageProcessor`` with the checkpoint's patch 16 x merge 2: the image is
smart-resized to multiples of 32 px inside [shortest_edge, longest_edge] pixels, one
``<|image_pad|>`` per 32 x 32 px (the template writes ``<|vision_start|>`` / ``<|vision_end|>``).

Videos (``Qwen3VLVideoProcessor``):

- sampling: n = int(frames / video_fps * fps), clamped to [min_frames, max_frames] and to the
  clip's frames; indices ``linspace(0, frames - 1, n).round()`` (``num_frames`` instead of
  fps when the checkpoint sets it);
- size: one t·h·w budget for the whole clip: ``smart_resize(n, h, w)`` keeps
  round(n / 2) x h x w under ``longest_edge`` (and over ``shortest_edge``) pixels; with
  ``cap_pixels_per_frame`` each frame's share is min(max_video_tokens x 32², longest_edge / n),
  floored at 1.05 x shortest_edge (transformers #48062 / #48071); sides under 32 px are
  scaled up first;
- the frames are padded (last one repeated) to a multiple of the temporal patch (2), so
  t = ceil(n / 2) groups of (h / 32) x (w / 32) tokens;
- before each group, the text ``<{seconds:.1f} seconds>`` (the mean time of its two frames,
  at the video's own rate) and ``<|vision_start|>``, after it ``<|vision_end|>``: that text is
  counted in the row and never trained.

A video given as a list of frame images is a video of those frames at the record's ``fps`` or,
when it states none, at 24 fps (what the processor assumes, with a warning, for frames without
metadata): sampled like a file when the checkpoint samples (``do_sample_frames``, the class
default: 5 frames at 24 fps keep 4), every frame otherwise.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any, ClassVar

import numpy as np

from packer.families.base import Expansion, Family, RecordMedia, Run
from packer.families.checkpoint import Checkpoint
from packer.families.towers import QWEN_VISION
from packer.media import bounds as setting_bounds
from packer.media.policies import Dynamic
from packer.specs import parse_params

FRAMES_WITHOUT_FPS = 24.0  # transformers' assumption for frames given without metadata (a warning there)


@dataclass(frozen=True)
class Qwen3VLSettings:
    """The processor's budgets (``--processor`` folder values over these defaults: the classes' own
    for the video processor, the published Qwen3-VL checkpoints' for the shared image processor)."""

    image_patch_size: int = 16
    image_merge_size: int = 2
    image_min_pixels: int = 65536
    image_max_pixels: int = 16777216
    video_patch_size: int = 16
    video_merge_size: int = 2
    video_temporal_patch_size: int = 2
    video_min_pixels: int = 128 * 32 * 32
    video_max_pixels: int = 768 * 32 * 32
    video_fps: float = 2.0
    video_min_frames: int = 4
    video_max_frames: int = 768
    video_num_frames: int = 0  # 0: sample by fps
    video_sample: bool = True  # the video processor's do_sample_frames
    cap_pixels_per_frame: bool = False
    max_video_tokens: int = 768
    image_token: str = "<|image_pad|>"
    video_token: str = "<|video_pad|>"
    vision_start: str = "<|vision_start|>"
    vision_end: str = "<|vision_end|>"

    def __post_init__(self):
        setting_bounds.check(self, "qwen3vl")

    @classmethod
    def resolve(cls, checkpoint: Checkpoint, options: str = "") -> Qwen3VLSettings:
        found: dict[str, Any] = {}
        image, video = checkpoint.image_processor, checkpoint.video_processor
        for key, src in (("patch_size", "patch_size"), ("merge_size", "merge_size")):
            if src in image:
                found[f"image_{key}"] = int(image[src])
        size = image.get("size") or {}
        found.update(_pixels("image", size, image))
        for key in ("patch_size", "merge_size", "temporal_patch_size", "min_frames", "max_frames"):
            if video.get(key) is not None:
                found[f"video_{key}"] = int(video[key])
        found.update(_pixels("video", video.get("size") or {}, video))
        if video.get("fps") is not None:
            found["video_fps"] = float(video["fps"])
        if video.get("num_frames") is not None:
            found["video_num_frames"] = int(video["num_frames"])
        if video.get("do_sample_frames") is not None:
            found["video_sample"] = bool(video["do_sample_frames"])
        if video.get("cap_pixels_per_frame") is not None:
            found["cap_pixels_per_frame"] = bool(video["cap_pixels_per_frame"])
        if video.get("max_video_tokens") is not None:
            found["max_video_tokens"] = int(video["max_video_tokens"])
        found.update(parse_params("qwen3vl", options, cls, what="processor option"))
        return cls(**found)


def _pixels(prefix: str, size: dict[str, Any], section: dict[str, Any]) -> dict[str, int]:
    out = {}
    low = size.get("shortest_edge", section.get("min_pixels"))
    high = size.get("longest_edge", section.get("max_pixels"))
    if low is not None:
        out[f"{prefix}_min_pixels"] = int(low)
    if high is not None:
        out[f"{prefix}_max_pixels"] = int(high)
    return out


def video_smart_resize(num_frames: int, height: int, width: int, temporal_factor: int, factor: int, min_pixels: int,
                       max_pixels: int) -> tuple[int, int]:
    """``transformers.models.qwen3_vl.video_processing_qwen3_vl.smart_resize``, operation for operation."""
    if num_frames < temporal_factor:
        raise ValueError(f"{num_frames} sampled frame(s): the processor needs at least temporal_patch_size "
                         f"({temporal_factor})")
    if height < factor or width < factor:
        scale = max(factor / height, factor / width)
        height = int(height * scale)
        width = int(width * scale)
    if max(height, width) / min(height, width) > 200:
        raise ValueError(f"aspect ratio {max(height, width) / min(height, width):.0f} is over 200")
    h_bar = round(height / factor) * factor
    w_bar = round(width / factor) * factor
    t_bar = round(num_frames / temporal_factor) * temporal_factor
    if t_bar * h_bar * w_bar > max_pixels:
        beta = math.sqrt((num_frames * height * width) / max_pixels)
        h_bar = max(factor, math.floor(height / beta / factor) * factor)
        w_bar = max(factor, math.floor(width / beta / factor) * factor)
    elif t_bar * h_bar * w_bar < min_pixels:
        beta = math.sqrt(min_pixels / (num_frames * height * width))
        h_bar = math.ceil(height * beta / factor) * factor
        w_bar = math.ceil(width * beta / factor) * factor
    return h_bar, w_bar


def sample_indices(frames: int, video_fps: float, s: Qwen3VLSettings) -> np.ndarray:
    """``Qwen3VLVideoProcessor.sample_frames``: the decode indices of the frames the processor keeps."""
    if s.video_num_frames:
        n = s.video_num_frames
    else:
        n = int(frames / video_fps * s.video_fps)
        n = min(max(n, s.video_min_frames), s.video_max_frames, frames)
    return np.linspace(0, frames - 1, n).round().astype(int)


def timestamps(indices: list[int], fps: float, temporal: int) -> list[float]:
    """``Qwen3VLProcessor._calculate_timestamps``: the mean time of each temporal group's first and last frame."""
    indices = list(indices)
    if len(indices) % temporal:
        indices.extend(indices[-1] for _ in range(temporal - len(indices) % temporal))
    seconds = [i / fps for i in indices]
    return [(seconds[i] + seconds[i + temporal - 1]) / 2 for i in range(0, len(seconds), temporal)]


class Qwen3VL(Family):
    name = "qwen3vl"
    supports = ("image", "video")
    processor_class = "Qwen3VLProcessor"
    model_types = ("qwen3_vl", "qwen3_vl_moe")
    towers = {"qwen3_vl": (QWEN_VISION,), "qwen3_vl_moe": (QWEN_VISION,)}  # 16 px patches, merge 2: one token a dummy
    rope = "mrope"
    model_inputs = ("mm_token_type_ids", "pixel_values", "image_grid_thw", "pixel_values_videos", "video_grid_thw")
    per_token_inputs = ("mm_token_type_ids",)
    own_loading = ("video",)
    settings_class: ClassVar[type] = Qwen3VLSettings

    def __init__(self, kinds: tuple[str, ...], settings: Qwen3VLSettings):
        super().__init__(kinds)
        self.s = settings

    def run_tokens(self) -> dict[str, str]:
        return {"image": self.s.image_token, "video": self.s.video_token}

    def special_tokens(self) -> list[str]:
        return [self.s.image_token, self.s.video_token, self.s.vision_start, self.s.vision_end]

    def expand(self, kind: str, info: Any, part: Any, record: RecordMedia) -> Expansion:
        s = self.s
        if kind == "image":
            policy = Dynamic(s.image_patch_size, s.image_merge_size, s.image_min_pixels, s.image_max_pixels)
            h, w = policy.resize(info.height, info.width)
            factor = s.image_patch_size * s.image_merge_size
            grid = (1, h // factor, w // factor)
            return Expansion((Run(s.image_token, grid[1] * grid[2]),), grid)
        return self._video(info, part)

    def video_plan(self, info: Any) -> tuple[list[int], float, tuple[int, int]]:
        """(decode indices kept, the rate timestamps use, resized (h, w)) of a video."""
        s = self.s
        rate = info.fps or FRAMES_WITHOUT_FPS  # a file always states one; a frame list may not
        indices = sample_indices(info.frames, rate, s).tolist() if s.video_sample else list(range(info.frames))
        n = len(indices)
        factor = s.video_patch_size * s.video_merge_size
        max_pixels = s.video_max_pixels
        if s.cap_pixels_per_frame:
            frame_cap = s.max_video_tokens * factor * factor
            per_frame = max(min(frame_cap, s.video_max_pixels // n), int(s.video_min_pixels * 1.05))
            max_pixels = per_frame * n
        size = video_smart_resize(n, info.height, info.width, s.video_temporal_patch_size, factor, s.video_min_pixels,
                                  max_pixels)
        return indices, rate, size

    def _video(self, info: Any, part: Any) -> Expansion:
        s = self.s
        indices, rate, (h, w) = self.video_plan(info)
        factor = s.video_patch_size * s.video_merge_size
        t = -(-len(indices) // s.video_temporal_patch_size)
        per_group = (h // factor) * (w // factor)
        pieces: list[str | Run] = []
        for seconds in timestamps(indices, rate, s.video_temporal_patch_size):
            pieces += [f"<{seconds:.1f} seconds>", s.vision_start, Run(s.video_token, per_group), s.vision_end]
        return Expansion(tuple(pieces), (t, h // factor, w // factor))

    def settings(self) -> dict[str, Any]:
        return asdict(self.s)

    # ---------------------------------------------------------------- loader hooks (train time)

    def video_inputs(self, video_processor: Any, spans: list[dict[str, Any]], check: Any) -> dict[str, Any]:
        """``pixel_values_videos`` / ``video_grid_thw`` of a batch's videos: the frames :meth:`video_plan` keeps,
        decoded upright, handed to the video processor with that sampling's metadata and ``do_sample_frames=False``."""
        from packer.modeling.spans import load_planned_frames, probe_span

        frames, metadata = [], []
        for m in spans:
            info = probe_span(m)
            indices, rate, _ = self.video_plan(info)
            frames.append(load_planned_frames(m, indices))  # a load error names its file (MediaLoadError)
            metadata.append({"total_num_frames": info.frames, "fps": rate, "width": info.width, "height": info.height,
                             "duration": info.frames / rate, "video_backend": "pyav", "frames_indices": list(indices)})
        enc = video_processor(videos=frames, video_metadata=metadata, do_sample_frames=False, return_tensors="pt")
        merge = int(video_processor.merge_size)
        by = f"{type(video_processor).__name__} (frames planned by family {self.name})"
        for m, (t, h, w) in zip(spans, enc["video_grid_thw"].tolist(), strict=True):
            check(m, t * h * w // (merge * merge), by, stored_grid=(t, h // merge, w // merge))
        return {"pixel_values_videos": enc["pixel_values_videos"], "video_grid_thw": enc["video_grid_thw"]}
