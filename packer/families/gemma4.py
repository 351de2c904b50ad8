"""Gemma 4: images, videos and audio, token for token with ``Gemma4Processor``.

Images (``Gemma4ImageProcessor``): resized keeping the aspect ratio to the largest size whose
sides are multiples of ``pooling_kernel_size x patch_size`` (48 px) and whose patches fit
``max_soft_tokens x pooling_kernel_size²`` (``get_aspect_ratio_preserving_size``; budgets 70,
140, 280, 560 or 1120 soft tokens), then one soft token per 3 x 3 patches::

    <|image|>  ->  <|image> + <|image|> x n + <image|>

Videos (``Gemma4VideoProcessor``): ``num_frames`` frames (32) at indices
``arange(n) * frames // n`` (``fps`` instead when the checkpoint sets it; a clip with fewer
frames than asked is refused, as the processor refuses it), every frame resized as an image
under the video budget (70), and per frame its time as ``mm:ss`` (index / the clip's rate; 24
frames a second for frames given without one), the frames joined by spaces::

    <|video|>  ->  00:00 <|image><|video|> x n<image|> 00:02 <|image><|video|> x n<image|> ...

Audio (``Gemma4AudioFeatureExtractor``): resampled to 16 kHz and cut at 480,000 samples (30 s,
the extractor's ``max_length``), mel frames of 20 ms every 10 ms whose whole window is audio,
halved twice by the encoder's two stride-2 convolutions: ceil(ceil(frames / 2) / 2) tokens,
40 ms each, so at most 750 (the processor's ``audio_seq_length`` does not cap the ids: its
``replace_audio_token`` counts the feature mask)::

    <|audio|>  ->  <|audio> + <|audio|> x n + <audio|>

What the model takes: ``pixel_values`` / ``image_position_ids`` (patches padded to the budget),
``pixel_values_videos`` / ``video_position_ids`` / ``num_frames_per_video``, ``input_features`` /
``input_features_mask``, ``mm_token_type_ids`` (1 image, 2 video, 3 audio). With
``use_bidirectional_attention="vision"`` an image's (or a frame's) tokens attend to each other
both ways in the sliding-window layers only (transformers #46711): :meth:`Gemma4.mask_layout`.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any, ClassVar

from packer.errors import ConfigError
from packer.families.base import Expansion, Family, RecordMedia, Run
from packer.families.checkpoint import Checkpoint
from packer.media import bounds as setting_bounds
from packer.modeling.towers import Dummy, Tower
from packer.specs import parse_params

SOFT_TOKEN_BUDGETS = (70, 140, 280, 560, 1120)  # Gemma4ImageProcessor's _SUPPORTED_SOFT_TOKENS
FRAMES_WITHOUT_FPS = 24.0  # Gemma4Processor's rate for frames given without metadata (a warning there)


@dataclass(frozen=True)
class Gemma4Settings:
    """The processor classes' defaults; a checkpoint's ``image_processor`` / ``video_processor`` /
    ``feature_extractor`` sections override them, ``--processor-options`` last."""

    image_patch_size: int = 16
    image_max_soft_tokens: int = 280
    image_pooling_kernel_size: int = 3
    video_patch_size: int = 16
    video_max_soft_tokens: int = 70
    video_pooling_kernel_size: int = 3
    video_num_frames: int = 32  # 0: sample by video_fps (every frame when that is 0 too)
    video_fps: float = 0.0  # 0: unset (the class default); frames per second to sample when num_frames is 0
    video_sample: bool = True  # do_sample_frames
    audio_sampling_rate: int = 16000
    audio_frame_length: int = 320  # samples: sampling_rate x frame_length_ms (20)
    audio_hop_length: int = 160  # samples: sampling_rate x hop_length_ms (10)
    audio_max_length: int = 480_000  # samples: the feature extractor's max_length (truncation)
    image_token: str = "<|image|>"
    boi_token: str = "<|image>"
    eoi_token: str = "<image|>"
    video_token: str = "<|video|>"
    audio_token: str = "<|audio|>"
    boa_token: str = "<|audio>"
    eoa_token: str = "<audio|>"

    def __post_init__(self):
        setting_bounds.check(self, "gemma4")

    @classmethod
    def resolve(cls, checkpoint: Checkpoint, options: str = "") -> Gemma4Settings:
        found: dict[str, Any] = {}
        for prefix, section in (("image", checkpoint.image_processor), ("video", checkpoint.video_processor)):
            for key in ("patch_size", "max_soft_tokens", "pooling_kernel_size"):
                if section.get(key) is not None:
                    found[f"{prefix}_{key}"] = int(section[key])
        video = checkpoint.video_processor
        if "num_frames" in video:  # null in a checkpoint: sample by fps
            found["video_num_frames"] = int(video["num_frames"] or 0)
        if video.get("fps") is not None:
            found["video_fps"] = float(video["fps"])
        if video.get("do_sample_frames") is not None:
            found["video_sample"] = bool(video["do_sample_frames"])
        audio = checkpoint.feature_extractor
        rate = int(audio.get("sampling_rate") or cls.audio_sampling_rate)
        found["audio_sampling_rate"] = rate
        found["audio_frame_length"] = int(round(rate * float(audio.get("frame_length_ms", 20.0)) / 1000.0))
        found["audio_hop_length"] = int(round(rate * float(audio.get("hop_length_ms", 10.0)) / 1000.0))
        found.update(parse_params("gemma4", options, cls, what="processor option"))
        settings = cls(**found)
        settings.validate()
        return settings

    def validate(self) -> None:
        for kind in ("image", "video"):
            budget = getattr(self, f"{kind}_max_soft_tokens")
            if budget not in SOFT_TOKEN_BUDGETS:
                raise ConfigError(f"gemma4: {kind}_max_soft_tokens must be one of {SOFT_TOKEN_BUDGETS} (the processor "
                                  f"refuses other budgets), got {budget}")
        if self.video_sample and self.video_num_frames and self.video_fps:
            raise ConfigError("gemma4: the video processor samples either num_frames or fps, and the settings give both "
                              f"(video_num_frames={self.video_num_frames}, video_fps={self.video_fps:g}); set one to 0")


def aspect_ratio_preserving_size(height: int, width: int, patch_size: int, max_patches: int,
                                 pooling_kernel_size: int) -> tuple[int, int]:
    """``transformers.models.gemma4.image_processing_gemma4.get_aspect_ratio_preserving_size``, step for step."""
    target_px = max_patches * patch_size**2
    factor = math.sqrt(target_px / (height * width))
    side = pooling_kernel_size * patch_size
    target_h = int(math.floor(factor * height / side)) * side
    target_w = int(math.floor(factor * width / side)) * side
    if target_h == 0 and target_w == 0:
        raise ValueError(f"{width}x{height} resizes to 0 x 0 under the Gemma 4 budget")
    longest = (max_patches // pooling_kernel_size**2) * side
    if target_h == 0:
        target_h, target_w = side, min(int(math.floor(width / height)) * side, longest)
    elif target_w == 0:
        target_h, target_w = min(int(math.floor(height / width)) * side, longest), side
    if target_h * target_w > target_px:
        raise ValueError(f"{width}x{height} resizes to {target_w}x{target_h}, over {max_patches} patches of "
                         f"{patch_size} px")
    return target_h, target_w


def soft_tokens(height: int, width: int, patch_size: int, budget: int, kernel: int) -> int:
    """Soft tokens of one image (or video frame) of this size: its patches after the resize over kernel²."""
    h, w = aspect_ratio_preserving_size(height, width, patch_size, budget * kernel**2, kernel)
    return (h // patch_size) * (w // patch_size) // kernel**2


def audio_tokens(samples: int, s: Gemma4Settings) -> int:
    """Soft tokens of a clip of ``samples`` samples at the extractor's rate (``replace_audio_token``'s count)."""
    samples = min(samples, s.audio_max_length)
    frames = (samples + s.audio_frame_length // 2 - (s.audio_frame_length + 1)) // s.audio_hop_length + 1
    for _ in range(2):  # two stride-2 convolutions (kernel 3, padding 1)
        frames = (frames + 1) // 2 if frames > 0 else 0
    return max(0, frames)


def timestamp(seconds: float) -> str:
    return f"{int(seconds // 60):02d}:{int(seconds % 60):02d}"


def gemma4_vision_dummy(config, kind: str) -> Dummy:
    """Gemma 4's vision tower: k x k patches (k = pooling_kernel_size), pooled to ONE soft token; an image, or a
    video of one such frame. The patches are unpadded, at positions (x, y) in the k x k grid (the processor's
    order: row by row)."""
    import torch

    v = config.vision_config
    k, patch = int(v.pooling_kernel_size), int(v.patch_size)
    pixels = torch.zeros(1, k * k, 3 * patch * patch)
    positions = torch.tensor([[x, y] for y in range(k) for x in range(k)])[None]
    if kind == "video":
        return Dummy("video", 1, {"pixel_values_videos": pixels, "video_position_ids": positions,
                                  "num_frames_per_video": torch.tensor([1])})
    return Dummy("image", 1, {"pixel_values": pixels, "image_position_ids": positions})


def gemma4_audio_dummy(config, kind: str) -> Dummy:
    """Gemma 4's audio encoder: one mel frame (halved twice by its stride-2 convolutions: still one token). Its
    mel width is what the subsampling's projection takes: 4 x (subsampling_conv_channels[0] // 4) (128)."""
    import torch

    conv = int(config.audio_config.subsampling_conv_channels[0])
    return Dummy("audio", 1, {"input_features": torch.zeros(1, 1, 4 * (conv // 4)),
                              "input_features_mask": torch.ones(1, 1, dtype=torch.bool)})


class Gemma4(Family):
    name = "gemma4"
    supports = ("image", "video", "audio")
    processor_class = "Gemma4Processor"
    model_types = ("gemma4",)
    towers = {"gemma4": (Tower("model.vision_tower", ("image", "video"), gemma4_vision_dummy, config="vision_config"),
                         Tower("model.audio_tower", ("audio",), gemma4_audio_dummy, config="audio_config"))}
    model_inputs = ("mm_token_type_ids", "pixel_values", "image_position_ids", "pixel_values_videos",
                    "video_position_ids", "num_frames_per_video", "input_features", "input_features_mask")
    per_token_inputs = ("mm_token_type_ids",)
    own_loading = ("image", "video", "audio")
    layer_masks = True
    settings_class: ClassVar[type] = Gemma4Settings
    block_kinds: ClassVar[tuple[str, ...]] = ("image", "video")  # runs attended bidirectionally (see mask_layout)

    def __init__(self, kinds: tuple[str, ...], settings: Gemma4Settings):
        super().__init__(kinds)
        settings.validate()
        self.s = settings

    def run_tokens(self) -> dict[str, str]:
        return {"image": self.s.image_token, "video": self.s.video_token, "audio": self.s.audio_token}

    def special_tokens(self) -> list[str]:
        s = self.s
        return [s.image_token, s.boi_token, s.eoi_token, s.video_token, s.audio_token, s.boa_token, s.eoa_token]

    def expand(self, kind: str, info: Any, part: Any, record: RecordMedia) -> Expansion:
        s = self.s
        if kind == "image":
            n = soft_tokens(info.height, info.width, s.image_patch_size, s.image_max_soft_tokens,
                            s.image_pooling_kernel_size)
            return Expansion((s.boi_token, Run(s.image_token, n), s.eoi_token))
        if kind == "audio":
            samples = -(-info.frames * s.audio_sampling_rate // info.sample_rate)  # after resampling (ceil)
            return Expansion((s.boa_token, Run(s.audio_token, audio_tokens(samples, s)), s.eoa_token))
        indices, rate = self.video_plan(info)
        n = soft_tokens(info.height, info.width, s.video_patch_size, s.video_max_soft_tokens, s.video_pooling_kernel_size)
        pieces: list[str | Run] = []
        for k, index in enumerate(indices):
            pieces += [(" " if k else "") + timestamp(index / rate) + " ", s.boi_token, Run(s.video_token, n), s.eoi_token]
        return Expansion(tuple(pieces))

    def video_plan(self, info: Any) -> tuple[list[int], float]:
        """(decode indices the processor keeps, the rate its timestamps use) of a video."""
        s = self.s
        rate = info.fps or FRAMES_WITHOUT_FPS  # a file always states one; a frame list may not
        n = s.video_num_frames
        if not s.video_sample or not (n or s.video_fps):  # neither set: transformers' sampler keeps every frame
            return list(range(info.frames)), rate
        if not n:
            if not info.fps:
                raise ValueError(f"the video processor samples {s.video_fps:g} frames a second, and these frames "
                                 f"state no rate (give the record's fps)")
            n = max(1, int(info.frames / info.fps * s.video_fps))
        if n > info.frames:
            raise ValueError(f"the video processor samples {n} frames and the clip has {info.frames}")
        return [k * info.frames // n for k in range(n)], rate

    def settings(self) -> dict[str, Any]:
        return asdict(self.s)

    # ---------------------------------------------------------------- attention

    def mask_layout(self, model_config: Any) -> dict[str, dict[str, Any]]:
        """Per layer type, its mask (see :meth:`packer.families.gemma3.Gemma3.mask_layout`). Gemma 4's
        ``create_masks_for_vision_model``: full layers causal, sliding layers OR(causal, same image or
        frame) AND the window -- with ``use_bidirectional_attention="vision"``; without it (the smaller
        Gemma 4 models) every layer is causal."""
        from packer.families.gemma3 import _window

        text = model_config.get_text_config() if hasattr(model_config, "get_text_config") else model_config
        mode = getattr(text, "use_bidirectional_attention", None)
        if mode not in (None, "vision"):
            raise ValueError(f"the Gemma 4 text config has use_bidirectional_attention={mode!r} (every token attends "
                             f"both ways): packed causal training does not apply to it")
        return {t: {"window": _window(text, t), "blocks": mode == "vision" and t == "sliding_attention"}
                for t in dict.fromkeys(text.layer_types)}

    def attention_masks(self, cu: list[Any], segment: Any, position: Any, attention: str, *, base: Any, mask_dtype: Any,
                        device: Any, model_config: Any, input_ids: Any = None, run_ids: Any = None, **_: Any) -> dict:
        """The collator's hook: ``attention_mask`` as one mask per layer type (:meth:`mask_layout`)."""
        from packer.families.gemma3 import gemma_attention_masks

        return gemma_attention_masks(self, segment, attention, mask_dtype=mask_dtype, device=device,
                                     model_config=model_config, input_ids=input_ids, run_ids=run_ids or {})

    # ---------------------------------------------------------------- loader hooks (train time)

    def image_inputs(self, image_processor: Any, pictures: list[Any], spans: list[dict[str, Any]], check: Any) -> dict:
        enc = image_processor(images=pictures, return_tensors="pt")
        by = type(image_processor).__name__
        for m, n in zip(spans, list(enc["num_soft_tokens_per_image"]), strict=True):
            check(m, int(n), by)
        return {"pixel_values": enc["pixel_values"], "image_position_ids": enc["image_position_ids"]}

    def video_inputs(self, video_processor: Any, spans: list[dict[str, Any]], check: Any) -> dict[str, Any]:
        """The frames :meth:`video_plan` keeps, decoded upright, through the video processor with that sampling's
        metadata and ``do_sample_frames=False``."""
        import torch

        from packer.modeling.spans import load_planned_frames, probe_span

        frames, metadata = [], []
        for m in spans:
            info = probe_span(m)
            indices, rate = self.video_plan(info)
            frames.append(load_planned_frames(m, indices))
            metadata.append({"total_num_frames": info.frames, "fps": rate, "width": info.width, "height": info.height,
                             "duration": info.frames / rate, "frames_indices": list(indices)})
        enc = video_processor(videos=frames, video_metadata=metadata, do_sample_frames=False, return_tensors="pt")
        by = f"{type(video_processor).__name__} (frames planned by family {self.name})"
        per_frame = list(enc["num_soft_tokens_per_video"])
        counts = [int(c) for c in enc["num_frames_per_video"]]
        for m, n, t in zip(spans, per_frame, counts, strict=True):
            check(m, int(n) * t, by)
        return {"pixel_values_videos": enc["pixel_values_videos"], "video_position_ids": enc["video_position_ids"],
                "num_frames_per_video": torch.as_tensor(counts, dtype=torch.long)}

    def audio_inputs(self, feature_extractor: Any, waves: list[Any], spans: list[dict[str, Any]], check: Any) -> dict:
        """``input_features`` / ``input_features_mask``; each clip's count is the processor's: the mask after two
        halvings (``Gemma4Processor.replace_audio_token``)."""
        enc = feature_extractor(waves, return_tensors="pt")
        mask = enc["input_features_mask"]
        by = f"{type(feature_extractor).__name__} (two stride-2 convolutions over the mel mask)"
        for m, row in zip(spans, mask, strict=True):
            check(m, int(row[::2][::2].sum()), by)
        return {"input_features": enc["input_features"], "input_features_mask": mask}
