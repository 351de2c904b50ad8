"""InternVL3 / InternVL3.5: images and videos, token for token with ``InternVLProcessor``.

Images (``GotOcr2ImageProcessor``, tiled: ``InternVLProcessor`` passes ``crop_to_patches=True``
whatever the image processor's own default): the tile grid (columns x rows) is the one of
``get_optimal_tiled_canvas`` -- among the grids of ``min_patches`` to ``max_patches`` tiles, the
one whose aspect ratio is closest to the image's; on a tie the later (larger) grid while the
image's area is over half of the grid's -- and an image cut into more than one tile gets a
thumbnail tile too, so ``get_number_of_image_patches`` tiles in all. Each tile is
``image_seq_length`` features (256 for 448-px tiles of 14-px patches after the 0.5 pixel
shuffle), and the processor writes ``<img>`` + ``<IMG_CONTEXT>`` x (image_seq_length x tiles)
+ ``</img>`` in place of the template's ``<IMG_CONTEXT>``.

Tiles per record: the installed processor gives every image the same ``max_patches``, however
many images the record holds. InternVL's own fine-tuning code (``max(1, max_dynamic_patch //
num_image)``) and the evaluation kits (VLMEvalKit; lmms-eval #1069: ``max(1, min(max_num,
total_max_num // num_images))``) cap it by the number of images in the sample: packer does
that when ``total_max_patches`` is set (``--processor-options total_max_patches=12`` is
InternVL's fine-tuning rule for 12-tile checkpoints, ``=64`` the evaluation kits'), which is
what ``processor(..., max_patches=cap)`` on that record returns.

Videos (``InternVLVideoProcessor``): every frame is resized to one tile (no tiling, no
thumbnail), and the processor writes ``Frame{i}: <img>`` + ``<IMG_CONTEXT>`` x
image_seq_length + ``</img>`` per frame, the frames joined by ``\\n``. The frames kept are
every decoded frame (``do_sample_frames=False``, the class default) or, when the checkpoint
samples, ``torch.arange(shift, frames, frames / n).int()`` with n = ``num_frames`` or
``int(frames / video_fps * fps)`` and shift = frames / n / 2 (``initial_shift=True``, the
default). A video given as frame images is a video of those frames (at the record's ``fps``,
when it states one: sampling by ``fps`` needs it).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any, ClassVar

import numpy as np

from packer.families.base import Expansion, Family, RecordMedia, Run
from packer.families.checkpoint import Checkpoint
from packer.families.towers import one_tile
from packer.media import bounds as setting_bounds
from packer.modeling.towers import Dummy, Tower, side
from packer.specs import parse_params


@dataclass(frozen=True)
class InternVLSettings:
    """The processor's settings (``--processor`` folder values over these defaults: the classes' own --
    ``InternVLProcessor``, ``GotOcr2ImageProcessor``, ``InternVLVideoProcessor``)."""

    image_seq_length: int = 256
    tile_height: int = 384  # GotOcr2ImageProcessor.size (the published InternVL3 checkpoints: 448)
    tile_width: int = 384
    crop_to_patches: bool = True  # InternVLProcessor's images_kwargs default, over the image processor's False
    min_patches: int = 1
    max_patches: int = 12
    total_max_patches: int = 0  # packer's: 0 = the processor's rule (no cap); N = max(1, min(max_patches, N // images))
    video_sample: bool = False  # the video processor's do_sample_frames
    video_num_frames: int = 0  # 0: unset (None)
    video_fps: float = 0.0  # 0: unset (None)
    video_initial_shift: str = "true"  # "true" (centre the samples), "false" (0) or a number of frames
    image_token: str = "<IMG_CONTEXT>"  # the tokenizer's context_image_token
    start_image_token: str = "<img>"
    end_image_token: str = "</img>"
    video_token: str = "<video>"

    def __post_init__(self):
        setting_bounds.check(self, "internvl")

    @classmethod
    def resolve(cls, checkpoint: Checkpoint, options: str = "") -> InternVLSettings:
        found: dict[str, Any] = {}
        proc, image, video = checkpoint.processor, checkpoint.image_processor, checkpoint.video_processor
        if proc.get("image_seq_length") is not None:
            found["image_seq_length"] = int(proc["image_seq_length"])
        size = image.get("size") or {}
        if "height" in size and "width" in size:
            found["tile_height"], found["tile_width"] = int(size["height"]), int(size["width"])
        for key in ("min_patches", "max_patches"):
            if image.get(key) is not None:
                found[key] = int(image[key])
        if video.get("do_sample_frames") is not None:
            found["video_sample"] = bool(video["do_sample_frames"])
        if video.get("num_frames") is not None:
            found["video_num_frames"] = int(video["num_frames"])
        if video.get("fps") is not None:
            found["video_fps"] = float(video["fps"])
        if video.get("initial_shift") is not None:
            shift = video["initial_shift"]
            found["video_initial_shift"] = str(shift).lower() if isinstance(shift, bool) else repr(float(shift))
        found.update(parse_params("internvl", options, cls, what="processor option"))
        settings = cls(**found)
        settings.initial_shift()  # a bad value is a ConfigError now, not a failure per video
        return settings

    def initial_shift(self) -> bool | float:
        """``video_initial_shift`` as the video processor takes it: True (centre), or a shift in frames."""
        from packer.errors import ConfigError

        value = self.video_initial_shift.strip().lower()
        if value in ("true", "false"):
            return value == "true"
        try:
            return float(value)
        except ValueError:
            raise ConfigError(f"processor option internvl.video_initial_shift = {self.video_initial_shift!r}: use true, "
                              f"false or a number of frames") from None


def aspect_ratios(min_tiles: int, max_tiles: int) -> list[tuple[int, int]]:
    """``get_all_supported_aspect_ratios``: the (columns, rows) grids of min..max tiles, by tile count
    (a stable sort: columns, then rows, within a count)."""
    grids = [(w, h) for w in range(1, max_tiles + 1) for h in range(1, max_tiles + 1) if min_tiles <= w * h <= max_tiles]
    return sorted(grids, key=lambda g: g[0] * g[1])


def tiled_canvas(height: int, width: int, tile_height: int, tile_width: int, min_tiles: int,
                 max_tiles: int) -> tuple[int, int]:
    """``get_optimal_tiled_canvas``, operation for operation: (columns, rows) of the tile grid."""
    aspect, area = width / height, width * height
    best_diff, best = float("inf"), (1, 1)
    for grid in aspect_ratios(min_tiles, max_tiles):
        diff = abs(aspect - grid[0] / grid[1])
        if diff < best_diff:
            best_diff, best = diff, grid
        elif diff == best_diff and area > 0.5 * tile_height * tile_width * grid[0] * grid[1]:
            best = grid
    return best


def number_of_tiles(height: int, width: int, s: InternVLSettings, max_patches: int) -> int:
    """``GotOcr2ImageProcessor.get_number_of_image_patches``: the tiles of one image, the thumbnail included."""
    if not (s.crop_to_patches and max_patches > 1):
        return 1
    columns, rows = tiled_canvas(height, width, s.tile_height, s.tile_width, s.min_patches, max_patches)
    return 1 + columns * rows if columns * rows > 1 else 1


def record_max_patches(s: InternVLSettings, images: int) -> int:
    """The ``max_patches`` an image of a record holding ``images`` images is tiled with."""
    if not s.total_max_patches:
        return s.max_patches
    return max(1, min(s.max_patches, s.total_max_patches // max(images, 1)))


def video_indices(frames: int, rate: float, s: InternVLSettings) -> list[int]:
    """``InternVLVideoProcessor.sample_frames``: the decode indices of the frames the processor keeps
    (``torch.arange(shift, frames, frames / n).int()`` reproduced in float64 then float32, as torch computes it).
    ``ValueError`` where the processor raises."""
    if not s.video_sample:
        return list(range(frames))
    n: int | None = s.video_num_frames or None
    if n is None and s.video_fps:
        if not rate:
            raise ValueError("sampling by fps needs the video's rate, and this frame list states none (give the "
                             "record's video an fps, or set the processor's num_frames)")
        n = int(frames / rate * s.video_fps)
    if n is None:
        raise ValueError("the video processor samples frames (do_sample_frames) but sets neither num_frames nor fps")
    if n < 1:
        raise ValueError(f"{frames} frame(s) at {rate:g} fps give 0 frames at {s.video_fps:g} fps: the processor "
                         f"divides by zero")
    shift = s.initial_shift()
    start = frames / n / 2 if shift is True else float(shift)
    if n > frames:
        raise ValueError(f"num_frames={n} exceeds the video's {frames} frames")
    step = frames / n
    if start > frames:
        raise ValueError(f"initial_shift {start:g} is past the video's {frames} frames")
    count = math.ceil((frames - start) / step)
    kept = (start + np.arange(count, dtype=np.float64) * step).astype(np.float32).astype(np.int64).tolist()
    if not kept:
        raise ValueError(f"no frame is sampled from {frames} frame(s)")
    return kept


def internvl_dummy(config, kind: str) -> Dummy:
    """One tile of zeros (an image of one tile, or a video of one frame): (side / patch)² x downsample_ratio²
    ``<IMG_CONTEXT>`` tokens after the pixel shuffle (256 at 448 / 14, ratio 0.5). Images and videos share one
    ``pixel_values`` (the tower is called once): a joint tower."""
    v = config.vision_config
    if getattr(config, "vision_feature_select_strategy", "default") != "default":
        raise ValueError(f"InternVL with vision_feature_select_strategy {config.vision_feature_select_strategy!r}: its "
                         f"features keep the class token and do not fold into the pixel shuffle's square; no dummy")
    ratio = float(config.downsample_ratio)
    return one_tile(config, kind, int((side(v.image_size) // side(v.patch_size)) ** 2 * ratio * ratio))


class InternVL(Family):
    name = "internvl"
    supports = ("image", "video")
    processor_class = "InternVLProcessor"
    model_types = ("internvl",)
    towers = {"internvl": (Tower("model.vision_tower", ("image", "video"), internvl_dummy, joint=True),)}
    model_inputs = ("pixel_values",)
    own_loading = ("image", "video")
    settings_class: ClassVar[type] = InternVLSettings

    def __init__(self, kinds: tuple[str, ...], settings: InternVLSettings):
        super().__init__(kinds)
        self.s = settings

    def media_token(self, kind: str) -> str:
        return {"image": self.s.image_token, "video": self.s.video_token}[kind]

    def run_tokens(self) -> dict[str, str]:
        return {"image": self.s.image_token, "video": self.s.image_token}  # a video's frames are image tiles

    def special_tokens(self) -> list[str]:
        s = self.s
        return [s.image_token, s.start_image_token, s.end_image_token, s.video_token]

    def expand(self, kind: str, info: Any, part: Any, record: RecordMedia) -> Expansion:
        s = self.s
        if kind == "image":
            tiles = number_of_tiles(info.height, info.width, s, record_max_patches(s, record.counts.get("image", 1)))
            return Expansion((s.start_image_token, Run(s.image_token, s.image_seq_length * tiles), s.end_image_token))
        pieces: list[str | Run] = []
        for i in range(len(video_indices(info.frames, info.fps, s))):
            pieces += [("\n" if i else "") + f"Frame{i + 1}: ", s.start_image_token, Run(s.image_token, s.image_seq_length),
                       s.end_image_token]
        return Expansion(tuple(pieces))

    def joined_kinds(self) -> tuple[str, ...]:
        return ("image",) if self.s.total_max_patches else ()  # the tile cap divides by the record's images

    def settings(self) -> dict[str, Any]:
        return asdict(self.s)

    # ---------------------------------------------------------------- loader hooks (train time)

    def image_inputs(self, image_processor: Any, pictures: list[Any], spans: list[dict[str, Any]], check: Any) -> dict[str, Any]:
        """The tiles of a batch's images, each image tiled with its record's ``max_patches`` (one processor call per
        distinct cap), in scatter order; every image's tile count checked against its span."""
        import torch

        s = self.s
        images_in = {}
        for m in spans:
            key = (m.get("batch", 0), m["segment"])
            images_in[key] = images_in.get(key, 0) + 1
        caps = [record_max_patches(s, images_in[(m.get("batch", 0), m["segment"])]) for m in spans]
        tiles: list[Any] = [None] * len(spans)
        counts = [0] * len(spans)
        for cap in sorted(set(caps)):
            chosen = [k for k, c in enumerate(caps) if c == cap]
            enc = image_processor(images=[pictures[k] for k in chosen], crop_to_patches=s.crop_to_patches,
                                  min_patches=s.min_patches, max_patches=cap, return_tensors="pt")
            bounds = np.cumsum([0, *[int(n) for n in enc["num_patches"]]])
            for j, k in enumerate(chosen):
                tiles[k] = enc["pixel_values"][bounds[j] : bounds[j + 1]]
                counts[k] = int(bounds[j + 1] - bounds[j])
        by = f"{type(image_processor).__name__} (tiled by family {self.name})"
        for m, n in zip(spans, counts, strict=True):
            check(m, n * s.image_seq_length, by)
        return {"pixel_values": torch.cat(tiles), "num_patches": torch.tensor(counts)}

    def video_inputs(self, video_processor: Any, spans: list[dict[str, Any]], check: Any) -> dict[str, Any]:
        """The frames of a batch's videos (the ones :func:`video_indices` keeps, decoded upright), each resized to one
        tile by the video processor (``do_sample_frames=False``), one call per video (videos of different frame counts
        do not stack); every video's frame count checked against its span."""
        import torch

        from packer.modeling.spans import load_planned_frames, probe_span

        out, counts = [], []
        by = f"{type(video_processor).__name__} (frames planned by family {self.name})"
        for m in spans:
            info = probe_span(m)
            indices = video_indices(info.frames, info.fps, self.s)
            frames = load_planned_frames(m, indices)
            enc = video_processor(videos=[frames], do_sample_frames=False, return_tensors="pt")
            pixels = enc["pixel_values_videos"].flatten(0, 1)
            check(m, pixels.shape[0] * self.s.image_seq_length, by)
            out.append(pixels)
            counts.append(pixels.shape[0])
        return {"pixel_values_videos": torch.cat(out), "video_frames": torch.tensor(counts)}

    def merge_inputs(self, out: dict[str, Any], ordered: list[dict[str, Any]]) -> dict[str, Any]:
        """One ``pixel_values`` of image tiles and video frames in placeholder order (the model scatters both into
        ``<IMG_CONTEXT>``), as ``InternVLProcessor`` merges them."""
        import torch

        images = list(torch.split(out.pop("pixel_values"), out.pop("num_patches").tolist())) if "num_patches" in out else []
        videos = list(torch.split(out.pop("pixel_values_videos"), out.pop("video_frames").tolist())) \
            if "video_frames" in out else []
        merged = [images.pop(0) if m["kind"] == "image" else videos.pop(0) for m in ordered if m["kind"] in ("image", "video")]
        if merged:
            out["pixel_values"] = torch.cat(merged)
        return out
