"""LLaVA-OneVision: images (anyres_max) and videos, token for token with ``LlavaOnevisionProcessor``.

Images (``LlavaOnevisionImageProcessor`` + ``LlavaOnevisionProcessor._get_number_of_features``):

- a record holding ONE image: the image is fitted to the best of the grid pinpoints
  (``select_best_resolution``), tiled into ``image_size`` tiles, and the model keeps the
  unpadded feature map of the tiles, p = sqrt(num_image_tokens) features a tile side:
  (p x scale_h) x (p x scale_w), less the rows (or columns) the aspect-preserving resize padded;
  ``anyres_max_N`` caps it: where the map holds over 1.1^2 x N tiles' worth
  (ratio = sqrt(h x w / (N p^2)) > 1.1), the model interpolates it to
  int(h // ratio) x int(w // ratio); one image-newline feature ends each row; then the
  base image's ``num_image_tokens`` features (placed first by the model);
- a record holding SEVERAL images (the images ``processor.apply_chat_template`` hands the
  processor for one conversation, ``batch_num_images`` > 1): each image is padded to a square
  and takes only its base features and one newline: num_image_tokens + 1;
- ``vision_feature_select_strategy="default"`` (a CLS token dropped) takes one off either count.

Videos (``LlavaOnevisionVideoProcessor``, ``replace_video_token``): every frame is resized to the
processor's square size; the model pools each frame's p x p features 2 x 2 (bilinear, to
ceil(p / 2)^2) and appends ONE newline per video: frames x ceil(p / 2)^2 + 1 ``<video>`` tokens.
The frames are all of them (``do_sample_frames=False``, the class default) or, when the
checkpoint samples, ``num_frames`` (indices ``arange(n) * total // n``) or ``fps`` frames a
second (n = max(1, int(total / video_fps x fps))); more than the clip holds is refused, as
the processor refuses it.

The processor writes nothing but the placeholder runs: no text is inserted. The chat template
writes ``<image>`` / ``<video>`` (the checkpoint's image_token / video_token).

Loading (train time): the model takes ``pixel_values`` [images, tiles, 3, S, S] (padded over
tiles), ``image_sizes`` and ``batch_num_images`` (the images of each record: it decides which
images were tiled), and ``pixel_values_videos`` [videos, frames, 3, S, S] -- one tensor, so the
videos of one batch must have the same number of frames (sample a fixed ``num_frames`` for
that). So the videos of one row and of one batch must keep the same number of frames: the family's
:meth:`LlavaOnevision.row_key` is a video's frame count (read from its stored span: ``tokens`` = frames x
ceil(p / 2)^2 + 1), the planner puts only videos of one frame count in a row, a record whose own videos differ
is quarantined (``incompatible_media``: the processor itself cannot stack them), and rows of different frame
counts are not batched together (batch one row per device: a packed row is already full).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any, ClassVar

from packer.errors import ConfigError
from packer.families.base import Expansion, Family, RecordMedia, Run
from packer.families.checkpoint import Checkpoint
from packer.families.towers import channels
from packer.media import bounds as setting_bounds
from packer.media.policies import best_resolution
from packer.media.policies.anyres import unpadded
from packer.modeling.towers import Dummy, Tower, side
from packer.specs import parse_params

# LlavaOnevisionImageProcessor.image_grid_pinpoints: 384 x {1..6} squared
DEFAULT_PINPOINTS = "/".join(f"{384 * a}x{384 * b}" for a in range(1, 7) for b in range(1, 7))


@dataclass(frozen=True)
class LlavaOnevisionSettings:
    """The processor's settings (``--processor`` folder values over the classes' defaults).

    ``num_image_tokens`` has no usable class default (None: the processor itself cannot count
    without it); 0 here means unset, and a build refuses to start without it."""

    image_size: int = 384  # the tile / base side: crop_size, else size height / shortest_edge
    pinpoints: str = DEFAULT_PINPOINTS  # image_grid_pinpoints as HxW/HxW/...
    num_image_tokens: int = 0  # features of one tile (729 for SigLIP 384 / 14)
    vision_feature_select_strategy: str = ""  # "default" takes one token off each image
    vision_aspect_ratio: str = "anyres_max_9"
    video_sample: bool = False  # the video processor's do_sample_frames
    video_num_frames: int = 0  # 0: unset
    video_fps: float = 0.0  # 0: unset
    image_token: str = "<image>"
    video_token: str = "<video>"

    def __post_init__(self):
        setting_bounds.check(self, "llava_onevision")  # every number within its bound before the checks below use them
        if self.vision_feature_select_strategy not in ("", "default", "full"):
            raise ConfigError(f"llava_onevision: vision_feature_select_strategy {self.vision_feature_select_strategy!r} "
                              f"is not default or full")
        if not self.vision_aspect_ratio.startswith("anyres_max_") or not self.vision_aspect_ratio[11:].isdigit():
            raise ConfigError(f"llava_onevision: vision_aspect_ratio {self.vision_aspect_ratio!r} is not anyres_max_N")
        if self.video_num_frames and self.video_fps:
            raise ConfigError("llava_onevision: video_num_frames and video_fps both set; the video processor refuses "
                              "both (`num_frames` and `fps` are mutually exclusive)")
        grid_pinpoints(self.pinpoints)

    @property
    def max_tiles(self) -> int:
        return int(self.vision_aspect_ratio[11:])

    @classmethod
    def resolve(cls, checkpoint: Checkpoint, options: str = "") -> LlavaOnevisionSettings:
        found: dict[str, Any] = {}
        image = checkpoint.image_processor
        video = checkpoint.video_processor or image  # transformers falls back to the image processor's config
        side = _side(image.get("crop_size")) or _side(image.get("size"))
        if side:
            found["image_size"] = side
        if image.get("image_grid_pinpoints"):
            found["pinpoints"] = "/".join(f"{int(h)}x{int(w)}" for h, w in image["image_grid_pinpoints"])
        proc = checkpoint.processor
        if proc.get("num_image_tokens") is not None:
            found["num_image_tokens"] = int(proc["num_image_tokens"])
        if proc.get("vision_feature_select_strategy") is not None:
            found["vision_feature_select_strategy"] = str(proc["vision_feature_select_strategy"])
        if proc.get("vision_aspect_ratio") is not None:
            found["vision_aspect_ratio"] = str(proc["vision_aspect_ratio"])
        for key in ("image_token", "video_token"):
            if proc.get(key):
                found[key] = str(proc[key])
        if video.get("do_sample_frames") is not None:
            found["video_sample"] = bool(video["do_sample_frames"])
        if video.get("num_frames") is not None:
            found["video_num_frames"] = int(video["num_frames"])
        if video.get("fps") is not None:
            found["video_fps"] = float(video["fps"])
        found.update(parse_params("llava_onevision", options, cls, what="processor option"))
        return cls(**found)


def _side(size: Any) -> int:
    """The square side a size dict names (height == width, or shortest_edge); 0 when absent."""
    if not isinstance(size, dict) or not size:
        return 0
    if size.get("height") is not None and size.get("width") is not None:
        if int(size["height"]) != int(size["width"]):
            raise ConfigError(f"llava_onevision: size {size} is not square; packer counts square tiles only")
        return int(size["height"])
    if size.get("shortest_edge") is not None:
        return int(size["shortest_edge"])
    return 0


def grid_pinpoints(spec: str) -> list[tuple[int, int]]:
    try:
        return [(int(h), int(w)) for h, w in (p.split("x") for p in spec.split("/"))]
    except ValueError:
        raise ConfigError(f"llava_onevision: pinpoints {spec!r} must look like 384x384/384x768") from None


def anyres_tokens(height: int, width: int, s: LlavaOnevisionSettings) -> tuple[int, tuple[int, int]]:
    """``LlavaOnevisionProcessor._get_number_of_features`` of one image alone (the strategy not applied):
    (features, (rows, columns) of the unpadded map after the anyres_max cap)."""
    best_h, best_w = best_resolution(height, width, grid_pinpoints(s.pinpoints))
    scale_h, scale_w = best_h // s.image_size, best_w // s.image_size
    p = int(math.sqrt(s.num_image_tokens))
    cur_h, cur_w = unpadded(height, width, p * scale_h, p * scale_w)
    rows, cols = cur_h, cur_w
    ratio = math.sqrt(cur_h * cur_w / (s.max_tiles * p**2))
    if ratio > 1.1:
        rows, cols = int(cur_h // ratio), int(cur_w // ratio)
    return rows * cols + rows + s.num_image_tokens, (rows, cols)


def image_tokens(height: int, width: int, images_in_record: int, s: LlavaOnevisionSettings) -> int:
    """The ``<image>`` tokens the processor writes for one image of a record holding ``images_in_record``."""
    n = s.num_image_tokens + 1 if images_in_record > 1 else anyres_tokens(height, width, s)[0]
    return n - (s.vision_feature_select_strategy == "default")


def video_frames(frames: int, fps: float, s: LlavaOnevisionSettings) -> list[int]:
    """The decode indices the video processor keeps (``default_sample_indices_fn``)."""
    if not s.video_sample or not (s.video_num_frames or s.video_fps):
        return list(range(frames))
    n = s.video_num_frames
    if not n:
        if not fps:
            raise ValueError(f"the checkpoint samples {s.video_fps:g} frames a second but the video states no frame "
                             f"rate (a frame list without fps): the processor refuses it")
        n = max(1, int(frames / fps * s.video_fps))
    if n > frames:
        raise ValueError(f"{frames} frame(s) cannot give the {n} the processor samples (it refuses the clip)")
    return [k * frames // n for k in range(n)]


def llava_onevision_dummy(config, kind: str) -> Dummy:
    """An image: one image of one tile's size alone in its record, so anyres tiles it (its base tile and the
    pinpoint grid that fits it: 2 tiles where a pinpoint is one tile) and the model keeps p² base features + the
    p x p grid with a newline a row (p = side / patch: 2p² + p tokens, 1,485 for SigLIP 384 / 14). A video: one
    frame, pooled 2 x 2, and the video's newline: ceil(p / 2)² + 1 tokens."""
    import torch
    from transformers.models.llava_onevision.modeling_llava_onevision import image_size_to_num_patches

    v = config.vision_config
    s, patch = side(v.image_size), side(v.patch_size)
    p = s // patch
    class_token = str(getattr(v, "model_type", "")).startswith("clip")  # CLIP adds one; SigLIP none
    strategy = getattr(config, "vision_feature_select_strategy", "full")
    if p * p + class_token - (strategy == "default") != p * p:
        raise ValueError(f"LLaVA-OneVision with a {v.model_type} tower and vision_feature_select_strategy {strategy!r}: "
                         f"a tile's features are not p x p = {p * p} (the model itself refuses anyres images and pools "
                         f"no video frames then); no dummy")
    if kind == "video":
        pooled = -(-p // 2)
        return Dummy("video", pooled * pooled + 1, {"pixel_values_videos": torch.zeros(1, 1, channels(v), s, s)})
    pinpoints = [list(x) for x in config.image_grid_pinpoints]
    tiles = image_size_to_num_patches((s, s), pinpoints, s)
    settings = LlavaOnevisionSettings(image_size=s, pinpoints="/".join(f"{h}x{w}" for h, w in pinpoints),
                                      num_image_tokens=p * p, vision_aspect_ratio=config.vision_aspect_ratio)
    length, _ = anyres_tokens(s, s, settings)
    return Dummy("image", length, {"pixel_values": torch.zeros(1, tiles, channels(v), s, s),
                                   "image_sizes": torch.tensor([[s, s]]), "batch_num_images": torch.tensor([1])})


class LlavaOnevision(Family):
    name = "llava_onevision"
    supports = ("image", "video")
    processor_class = "LlavaOnevisionProcessor"
    model_types = ("llava_onevision",)
    towers = {"llava_onevision": (Tower("model.vision_tower", ("image", "video"), llava_onevision_dummy),)}
    model_inputs = ("pixel_values", "image_sizes", "batch_num_images", "pixel_values_videos")
    own_loading = ("image", "video")
    settings_class: ClassVar[type] = LlavaOnevisionSettings

    def __init__(self, kinds: tuple[str, ...], settings: LlavaOnevisionSettings):
        super().__init__(kinds)
        if settings.num_image_tokens < 1:
            raise ConfigError("llava_onevision: the processor checkpoint has no num_image_tokens (the processor cannot "
                              "count without it); give it: --processor-options num_image_tokens=729 (SigLIP 384 / 14)")
        self.s = settings

    def run_tokens(self) -> dict[str, str]:
        return {"image": self.s.image_token, "video": self.s.video_token}

    def expand(self, kind: str, info: Any, part: Any, record: RecordMedia) -> Expansion:
        s = self.s
        if kind == "image":
            return Expansion((Run(s.image_token, image_tokens(info.height, info.width, record.counts.get("image", 0), s)),))
        frames = len(video_frames(info.frames, info.fps, s))
        return Expansion((Run(s.video_token, frames * self.pooled_tokens + 1),), extra={"frames": frames})

    def joined_kinds(self) -> tuple[str, ...]:
        return ("image",)  # one image is tiled (anyres), two or more are not: a cut must not leave one of several

    def row_key(self, span: dict[str, Any]) -> int | None:
        """A video's frame count: ``LlavaOnevisionForConditionalGeneration.get_video_features`` takes the batch's
        videos as ONE ``[videos, frames, 3, H, W]`` tensor, so they must agree (images mix with anything)."""
        if span["kind"] != "video":
            return None
        return (int(span["tokens"]) - 1) // self.pooled_tokens

    def row_key_reason(self, keys: list[Any]) -> str:
        return (f"videos of {' and '.join(str(k) for k in sorted(keys))} frames: LlavaOnevisionForConditionalGeneration "
                f"stacks a batch's videos into one [videos, frames, 3, H, W] tensor, so they must keep the same number "
                f"of frames (the processor itself cannot stack them)")

    @property
    def pooled_tokens(self) -> int:
        """Features of one video frame after the model's 2 x 2 pooling: ceil(p / 2)^2."""
        return math.ceil(int(math.sqrt(self.s.num_image_tokens)) / 2) ** 2

    def settings(self) -> dict[str, Any]:
        return asdict(self.s)

    # ---------------------------------------------------------------- loader hooks (train time)

    def image_inputs(self, image_processor: Any, pictures: list[Any], spans: list[dict[str, Any]], check: Any) -> dict[str, Any]:
        """``pixel_values`` / ``image_sizes`` / ``batch_num_images`` of a batch's images: each record's images
        handed to the image processor as one list (as ``apply_chat_template`` does), so a record of several
        images is not tiled; every image's count checked against its span."""
        from packer.modeling.spans import by_record

        groups = [[pictures[i] for i in group] for group in by_record(spans)]
        enc = image_processor(groups, return_tensors="pt")
        per_image = [len(g) for g in groups for _ in g]
        by = f"{type(image_processor).__name__} (family {self.name})"
        for m, (h, w), n in zip(spans, enc["image_sizes"].tolist(), per_image, strict=True):
            check(m, image_tokens(int(h), int(w), n, self.s), by)
        return {"pixel_values": enc["pixel_values"], "image_sizes": enc["image_sizes"],
                "batch_num_images": enc["batch_num_images"]}

    def video_inputs(self, video_processor: Any, spans: list[dict[str, Any]], check: Any) -> dict[str, Any]:
        """``pixel_values_videos`` [videos, frames, 3, S, S]: the frames :func:`video_frames` keeps, decoded
        upright; one tensor, so every video of the batch must keep the same number of frames."""
        from packer.modeling.spans import MediaMismatchError, load_planned_frames, probe_span, span_path

        frames, counts = [], []
        for m in spans:
            info = probe_span(m)
            try:
                indices = video_frames(info.frames, info.fps, self.s)
            except ValueError as e:
                raise MediaMismatchError(f"{span_path(m)}: {e}; the build cannot have counted it with these settings") \
                    from None
            frames.append(load_planned_frames(m, indices))
            counts.append(len(indices))
        if len(set(counts)) > 1:
            rows = {m.get("batch", 0) for m in spans}
            fix = ("Batch one row at a time (per-device batch size 1: each packed row is already full)" if len(rows) > 1
                   else "The row itself mixes them: the build was planned without this family's row constraint (made "
                        "before it, or its settings edited since): rebuild it")
            raise ValueError(f"the batch's rows hold {self.row_key_reason(sorted(set(counts)))}. {fix}")
        enc = video_processor(videos=frames, do_sample_frames=False, return_tensors="pt")
        pixels = enc["pixel_values_videos"]
        by = f"{type(video_processor).__name__} (frames planned by family {self.name})"
        for m, video in zip(spans, pixels, strict=True):
            check(m, int(video.shape[0]) * self.pooled_tokens + 1, by)
        return {"pixel_values_videos": pixels}
