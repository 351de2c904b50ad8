"""Qwen3-Omni (the thinker): images, videos and audio, token for token with ``Qwen3OmniMoeProcessor`` and
position for position with ``Qwen3OmniMoeThinkerForConditionalGeneration.get_rope_index`` (TMRoPE).

Images: ``Qwen2VLImageProcessor`` with the checkpoint's patch and merge sizes (Qwen3-Omni's tower: patch 16 x
merge 2 = 32 px a token; the class defaults are 14 x 2), smart-resized into [min_pixels, max_pixels]: one
``<|image_pad|>`` per merged patch. No timestamps (unlike Qwen3-VL): the processor writes the run only; the
template writes ``<|vision_start|>`` / ``<|vision_end|>`` around it.

Videos: ``Qwen2VLVideoProcessor`` (the ``qwen2vl`` video policy: sampling, smart resize, temporal padding), but
its size is the PROCESSOR's: ``Qwen3OmniMoeProcessor.videos_kwargs`` passes size = [128, 768] x 32^2 pixels a
frame on every call, over whatever the video processor's own config says. One ``<|video_pad|>`` run of
t x h x w, no timestamps. The processor gives the model ``video_second_per_grid`` = temporal_patch_size / fps,
where fps is the one the processor is CALLED with (``processor(..., fps=2)``), 1.0 when none -- not the clip's
rate nor the video processor's sampling rate (``call_fps`` here, 0 = none).

Audio (``WhisperFeatureExtractor`` called with ``padding=True, truncation=False``): a clip of L samples at
16 kHz has F mel frames (hop 160): L // 160 alone; a record's clips are padded to its longest (L_max) and then
F = min(ceil(L / 160), L_max // 160) -- so a clip's count can depend on the record's other clips. The audio
encoder reads 100-frame blocks (n_window = 50): 13 positions per full block, and for the r = F mod 100 rest
((((r - 1) // 2 + 1) - 1) // 2 + 1 - 1) // 2 + 1: about 13 tokens a second, counted on mel frames, never on
samples. No 30 s cut (``truncation=False``). A clip of under 10 ms gives 0 positions: quarantined
(``audio_too_short``).

TMRoPE (:meth:`Qwen3Omni.positions`): per record, text and audio advance all three axes by one a token; an
image of h x w merged patches takes (s, s + i, s + j) and text resumes at s + max(h, w); a video's temporal
step k sits at s + k x second_per_grid x position_id_per_seconds (13 a second, the model config's; float
positions where that is fractional) and text resumes one past the largest of its three axes. Computed in
float32 in the order the model computes them, so packed rows get exactly the model's positions.

Audio inside a video (``use_audio_in_video`` / ``load_audio_from_video``: the clip's sound track interleaved
with its frames in 2 s chunks) is refused: packer does not read a video's sound track.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any, ClassVar

from packer.errors import ConfigError
from packer.families.base import Expansion, Family, RecordMedia, Run
from packer.families.checkpoint import Checkpoint
from packer.families.towers import QWEN_VISION
from packer.media import bounds as setting_bounds
from packer.media.policies import Dynamic, Qwen2VLVideo
from packer.modeling.towers import Dummy, Tower
from packer.specs import parse_params


@dataclass(frozen=True)
class Qwen3OmniSettings:
    """The processor's settings (``--processor`` folder values over the classes' defaults: ``Qwen2VLImageProcessor``,
    ``Qwen2VLVideoProcessor`` under ``Qwen3OmniMoeProcessor.videos_kwargs``, ``WhisperFeatureExtractor``,
    ``Qwen3OmniMoeProcessor``)."""

    image_patch_size: int = 14
    image_merge_size: int = 2
    image_min_pixels: int = 56 * 56
    image_max_pixels: int = 28 * 28 * 1280
    video_patch_size: int = 14
    video_merge_size: int = 2
    video_temporal_patch_size: int = 2
    video_min_pixels: int = 128 * 32 * 32  # Qwen3OmniMoeProcessor.videos_kwargs["size"]
    video_max_pixels: int = 768 * 32 * 32
    video_sample: bool = False  # the video processor's do_sample_frames
    video_fps: float = 0.0  # its sampling fps (0: none)
    video_num_frames: int = 0
    video_min_frames: int = 4
    video_max_frames: int = 768
    cap_pixels_per_frame: bool = False
    max_video_tokens: int = 128000
    call_fps: float = 0.0  # processor(..., fps=X): samples at X and times grids by it; 0: no fps in the call
    sampling_rate: int = 16000
    hop_length: int = 160
    n_window: int = 50
    position_id_per_seconds: float = 13.0  # the model config's position_id_per_seconds (the processor's default)
    use_audio_in_video: bool = False  # refused
    image_token: str = "<|image_pad|>"
    video_token: str = "<|video_pad|>"
    audio_token: str = "<|audio_pad|>"
    vision_start: str = "<|vision_start|>"
    vision_end: str = "<|vision_end|>"
    audio_start: str = "<|audio_start|>"
    audio_end: str = "<|audio_end|>"

    def __post_init__(self):
        setting_bounds.check(self, "qwen3omni")  # every number within its bound before the checks below use them
        if self.use_audio_in_video:
            raise ConfigError("qwen3omni: use_audio_in_video (the processor's load_audio_from_video: a video's sound "
                              "track interleaved with its frames) is not reproduced: packer does not read a video's "
                              "sound track; give the sound as its own audio part, or leave use_audio_in_video off")
        if self.sampling_rate != 16000:
            raise ConfigError(f"qwen3omni: the processor resamples audio to 16000 Hz (its audio_kwargs); "
                              f"sampling_rate {self.sampling_rate} is not that")
        self.video_policy()  # its own checks

    @classmethod
    def resolve(cls, checkpoint: Checkpoint, options: str = "") -> Qwen3OmniSettings:
        found: dict[str, Any] = {}
        image = checkpoint.image_processor
        video = checkpoint.video_processor or image  # transformers falls back to the image processor's config
        audio = checkpoint.feature_extractor or image  # a merged preprocessor_config.json holds both
        for key in ("patch_size", "merge_size"):
            if image.get(key) is not None:
                found[f"image_{key}"] = int(image[key])
        size = image.get("size") or {}
        low, high = size.get("shortest_edge", image.get("min_pixels")), size.get("longest_edge", image.get("max_pixels"))
        if low is not None:
            found["image_min_pixels"] = int(low)
        if high is not None:
            found["image_max_pixels"] = int(high)
        for key in ("patch_size", "merge_size", "temporal_patch_size", "min_frames", "max_frames", "num_frames"):
            if video.get(key) is not None:
                found[f"video_{key}"] = int(video[key])
        if video.get("fps") is not None:
            found["video_fps"] = float(video["fps"])
        if video.get("do_sample_frames") is not None:
            found["video_sample"] = bool(video["do_sample_frames"])
        for key in ("cap_pixels_per_frame", "max_video_tokens"):
            if video.get(key) is not None:
                found[key] = type(getattr(cls, key))(video[key])
        if audio.get("hop_length") is not None:
            found["hop_length"] = int(audio["hop_length"])
        for key in ("n_window", "position_id_per_seconds"):
            if checkpoint.processor.get(key) is not None:
                found[key] = type(getattr(cls, key))(checkpoint.processor[key])
        found.update(parse_params("qwen3omni", options, cls, what="processor option"))
        return cls(**found)

    def video_policy(self) -> Qwen2VLVideo | None:
        """The ``qwen2vl`` video policy of these settings (the processor's size), or None when the clip's every
        frame is taken (no sampling, or sampling with neither fps nor num_frames)."""
        fps = self.call_fps or self.video_fps
        sample = self.video_sample and bool(fps or self.video_num_frames)
        if sample and fps and self.video_num_frames:
            raise ConfigError("qwen3omni: the video processor samples by fps and by num_frames; it refuses both "
                              "(`num_frames` and `fps` are mutually exclusive)")
        return Qwen2VLVideo(fps=fps or 2.0, min_frames=self.video_min_frames, max_frames=self.video_max_frames,
                            num_frames=self.video_num_frames, sample=sample,
                            temporal_patch_size=self.video_temporal_patch_size, patch_size=self.video_patch_size,
                            merge_size=self.video_merge_size, min_pixels=self.video_min_pixels,
                            max_pixels=self.video_max_pixels, cap_pixels_per_frame=self.cap_pixels_per_frame,
                            max_video_tokens=self.max_video_tokens)

    @property
    def second_per_grid(self) -> float:
        """``video_second_per_grid``: temporal_patch_size over the fps the processor is called with (1.0 when none)."""
        return self.video_temporal_patch_size / (self.call_fps or 1.0)


def audio_output_length(frames: int, n_window: int = 50) -> int:
    """``_get_feat_extract_output_lengths`` of Qwen3-Omni's processor and audio encoder: positions from F mel frames."""
    chunk = n_window * 2
    rest = frames % chunk
    feat = (rest - 1) // 2 + 1
    return ((feat - 1) // 2 + 1 - 1) // 2 + 1 + (frames // chunk) * 13


def resampled(info: Any, rate: int) -> int:
    """Samples of a clip at ``rate``: ``transformers.audio_utils.load_audio``'s length (ceil, as librosa)."""
    return info.frames if info.sample_rate == rate else math.ceil(info.frames * rate / info.sample_rate)


def mel_frames(samples: int, longest: int, hop: int) -> int:
    """The mel frames ``WhisperFeatureExtractor(padding=True, truncation=False, return_attention_mask=True)`` gives a
    clip of ``samples`` padded with the others of its call to ``longest``: its attention mask, taken every hop
    samples, with the last column dropped when ``longest`` is not a multiple of hop."""
    return min(-(-samples // hop), longest // hop)


def audio_dummy(config, kind: str) -> Dummy:
    """Qwen3-Omni's audio encoder (not Whisper's: 100-frame blocks, three stride-2 convolutions): a clip of
    one mel frame, zeros, one token."""
    import torch

    a = config.audio_config
    features = torch.zeros(1, int(a.num_mel_bins), 1)
    return Dummy("audio", audio_output_length(1, int(a.n_window)),
                 {"input_features": features, "feature_attention_mask": torch.ones(1, 1, dtype=torch.int32)})


class Qwen3Omni(Family):
    name = "qwen3omni"
    supports = ("image", "audio", "video")
    processor_class = "Qwen3OmniMoeProcessor"
    model_types = ("qwen3_omni_moe_thinker",)
    towers = {"qwen3_omni_moe_thinker": (Tower("model.audio_tower", ("audio",), audio_dummy), QWEN_VISION)}
    model_inputs = ("pixel_values", "image_grid_thw", "pixel_values_videos", "video_grid_thw", "input_features",
                    "feature_attention_mask")
    own_loading = ("audio", "video")
    own_positions = True
    rope = "mrope"
    settings_class: ClassVar[type] = Qwen3OmniSettings

    def __init__(self, kinds: tuple[str, ...], settings: Qwen3OmniSettings):
        super().__init__(kinds)
        self.s = settings

    def run_tokens(self) -> dict[str, str]:
        return {"image": self.s.image_token, "audio": self.s.audio_token, "video": self.s.video_token}

    def special_tokens(self) -> list[str]:
        s = self.s
        return [s.image_token, s.video_token, s.audio_token, s.vision_start, s.vision_end, s.audio_start, s.audio_end]

    def expand(self, kind: str, info: Any, part: Any, record: RecordMedia) -> Expansion:
        s = self.s
        if kind == "image":
            h, w = Dynamic(s.image_patch_size, s.image_merge_size, s.image_min_pixels, s.image_max_pixels).resize(
                info.height, info.width)
            factor = s.image_patch_size * s.image_merge_size
            grid = (1, h // factor, w // factor)
            return Expansion((Run(s.image_token, grid[1] * grid[2]),), grid)
        if kind == "video":
            count = self.video_count(info)
            return Expansion((Run(s.video_token, count.length),), tuple(count.grid), s.second_per_grid)
        own = resampled(info, s.sampling_rate)
        longest = max(resampled(i, s.sampling_rate) for i in record.infos("audio")) if record.counts.get("audio", 0) > 1 \
            else own
        return Expansion((Run(s.audio_token, audio_output_length(mel_frames(own, longest, s.hop_length), s.n_window)),))

    def video_plan(self, info: Any) -> list[int]:
        """The decode indices the video processor keeps of a clip (``ValueError`` where it refuses the clip)."""
        policy = self.s.video_policy()
        if policy.sample and not policy.num_frames and not info.fps:
            raise ValueError(f"the checkpoint samples {policy.fps:g} frames a second but the video states no frame rate "
                             f"(a frame list without fps): the processor refuses it")
        return policy.frame_indices(info.frames, info.fps)

    def video_count(self, info: Any):
        self.video_plan(info)
        return self.s.video_policy().count(info.frames, info.fps, info.height, info.width)

    def joined_kinds(self) -> tuple[str, ...]:
        return ("audio",)  # a record's clips are padded to its longest: a cut must keep all of them or none

    def settings(self) -> dict[str, Any]:
        return asdict(self.s)

    # ---------------------------------------------------------------- positions (TMRoPE)

    def positions(self, length: int, segments: list[tuple[int, int]], spans: list[dict[str, Any]],
                  tokens_per_second: float | None = None):
        """``[3, length]`` float32 positions of one row: each segment as the thinker's ``get_rope_index`` positions
        its record alone. ``tokens_per_second``: the model config's ``position_id_per_seconds`` when it differs from
        the family's setting."""
        import torch

        pips = self.s.position_id_per_seconds if tokens_per_second is None else tokens_per_second
        spg = torch.tensor(self.s.second_per_grid, dtype=torch.float32)
        pos = torch.zeros(3, length, dtype=torch.float32)
        by_segment: dict[int, list[dict]] = {}
        for m in spans:
            if not m.get("dummy"):  # a dummy item (packer.loader.dummy) has no start / end token: positioned as text
                by_segment.setdefault(m["segment"], []).append(m)
        for k, (a, b) in enumerate(segments):
            pieces: list[torch.Tensor] = []
            cursor = a
            for m in sorted(by_segment.get(k, []), key=lambda m: m["start"]):
                start, n = int(m["start"]), int(m.get("tokens", m["length"]))
                st = pieces[-1].max() + 1 if pieces else 0
                if start - 1 > cursor:  # text before the item's start token
                    pieces.append(torch.arange(start - 1 - cursor).expand(3, -1) + st)
                    st = st + (start - 1 - cursor)
                pieces.append(torch.arange(1).expand(3, -1) + st)  # <|vision_start|> / <|audio_start|>
                st = st + 1
                if m["kind"] == "audio":
                    pieces.append(torch.arange(n).expand(3, -1) + st)
                else:
                    t, h, w = (int(g) for g in m["llm_grid"])
                    if t * h * w != n or int(m["length"]) != n:
                        raise ValueError(f"{m['kind']} span of {n} placeholders has llm_grid {(t, h, w)} (length "
                                         f"{m['length']}): not one run of t x h x w")
                    steps = torch.arange(t) * 1 * pips if m["kind"] == "image" else torch.arange(t) * spg * pips
                    tt = steps.float().view(-1, 1).expand(-1, h * w).flatten()
                    hh = torch.arange(h).view(1, -1, 1).expand(t, -1, w).flatten().float()
                    ww = torch.arange(w).view(1, 1, -1).expand(t, h, -1).flatten().float()
                    pieces.append(torch.stack([tt, hh, ww]) + st)
                pieces.append(torch.arange(1).expand(3, -1) + (pieces[-1].max() + 1))  # the end token
                cursor = start + n + 1
            if cursor < b:
                st = pieces[-1].max() + 1 if pieces else 0
                pieces.append(torch.arange(b - cursor).expand(3, -1) + st)
            if pieces:
                pos[:, a:b] = torch.cat([p.float() for p in pieces], dim=1)
        return pos

    # ---------------------------------------------------------------- loader hooks (train time)

    def audio_inputs(self, feature_extractor: Any, waves: list[Any], spans: list[dict[str, Any]], check: Any) -> dict[str, Any]:
        """``input_features`` / ``feature_attention_mask``: each record's clips through the feature extractor together,
        with the processor's ``padding=True, truncation=False`` (a record's clips padded to its longest, as the
        processor pads them), then every record's features zero-padded to the batch's longest (the encoder reads
        the masked frames only)."""
        import torch
        import torch.nn.functional as F

        from packer.modeling.spans import by_record

        groups = by_record(spans)
        features, masks = [], []
        for group in groups:
            enc = feature_extractor([waves[i] for i in group], sampling_rate=self.s.sampling_rate, padding=True,
                                    truncation=False, return_attention_mask=True, return_tensors="pt")
            features.append(enc["input_features"])
            masks.append(enc["attention_mask"])
        width = max(f.shape[-1] for f in features)
        input_features = torch.cat([F.pad(f, (0, width - f.shape[-1])) for f in features])
        mask = torch.cat([F.pad(m, (0, width - m.shape[-1])) for m in masks])
        by = f"{type(feature_extractor).__name__} + the Qwen3-Omni audio encoder (n_window {self.s.n_window})"
        for m, frames in zip(spans, mask.sum(-1).tolist(), strict=True):
            check(m, audio_output_length(int(frames), self.s.n_window), by)
        return {"input_features": input_features, "feature_attention_mask": mask}

    def video_inputs(self, video_processor: Any, spans: list[dict[str, Any]], check: Any) -> dict[str, Any]:
        """``pixel_values_videos`` / ``video_grid_thw``: the frames :meth:`video_plan` keeps, decoded upright, through
        the video processor at the processor's size (``Qwen3OmniMoeProcessor.videos_kwargs``), every grid checked."""
        from packer.modeling.spans import MediaMismatchError, load_planned_frames, probe_span, span_path

        frames = []
        for m in spans:
            info = probe_span(m)
            try:
                indices = self.video_plan(info)
            except ValueError as e:
                raise MediaMismatchError(f"{span_path(m)}: {e}; the build cannot have counted it with these settings") \
                    from None
            frames.append(load_planned_frames(m, indices))
        size = {"shortest_edge": self.s.video_min_pixels, "longest_edge": self.s.video_max_pixels}
        enc = video_processor(videos=frames, do_sample_frames=False, size=size, return_tensors="pt")
        merge = int(video_processor.merge_size)
        by = f"{type(video_processor).__name__} at the processor's size (frames planned by family {self.name})"
        for m, (t, h, w) in zip(spans, enc["video_grid_thw"].tolist(), strict=True):
            check(m, t * h * w // (merge * merge), by, stored_grid=(t, h // merge, w // merge))
        return {"pixel_values_videos": enc["pixel_values_videos"], "video_grid_thw": enc["video_grid_thw"]}
