"""The collator's media step: every span's file -> exactly what the HF model classes take.

The model scatters encoder outputs into its placeholder positions in row-major order
(``masked_scatter`` over ``input_ids == image_token_id``), so the step loads the media
of a batch sorted by (row, start) and hands the processor outputs over in that order:

================================  ==================================================
image processor                   batch keys
================================  ==================================================
Qwen2-VL / Qwen2.5-VL             ``pixel_values`` (patches), ``image_grid_thw``
Qwen2-VL video processor          ``pixel_values_videos`` (patches), ``video_grid_thw``;
                                  ``second_per_grid_ts`` with time-scaled mRoPE (Qwen2.5-VL)
LLaVA-NeXT (``image_grid_pinpoints``)  ``pixel_values`` ``[n, tiles, 3, H, W]``, ``image_sizes``
CLIP-style (LLaVA-1.5)            ``pixel_values`` ``[n, 3, H, W]``
Whisper feature extractor         ``input_features`` ``[n, mels, 3000]``, ``feature_attention_mask``
stored image embeddings           ``image_embeds`` ``[n, ...]`` (frozen-tower training)
stored audio features             ``input_features``, ``feature_attention_mask``
================================  ==================================================

Every count the model will produce is recomputed from the processor's output and
compared with the span the build wrote; a difference raises :class:`MediaMismatchError`
naming the file, both counts and the fix -- before the model's own "image features and
image tokens do not match", which names nothing. Images and audio are loaded by
:mod:`packer.media.load`, the convention the build counted with (EXIF orientation
applied, HF's RGB conversion, librosa-equal resampling).

Videos are loaded by :mod:`packer.media.video` the way the build counted them: the
container probed, the frames the video policy samples (``frame_indices``) decoded and
turned upright, then the video processor runs on them with ``do_sample_frames=False`` and
the metadata of the sampling (:func:`~packer.media.video.video_metadata`). The policy is the
one the processor implies (:func:`video_policy_for`: its fps, frame bounds, pixel bounds and
patch sizes, frames sampled) unless ``video_policy=`` names the build's. Every video's grid
must equal the stored one and its seconds per temporal grid step (``temporal_patch_size``
over the rate of the sampled frames, what Qwen2.5-VL's processor puts in
``second_per_grid_ts``) the stored ``second_per_grid_t``; ``second_per_grid_ts`` is handed
over (float32, one per video) only when asked for (``timed=True``: Qwen2.5-VL's forward
takes it, Qwen2-VL's does not).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import torch

from packer.io import blobs, fs
from packer.media.load import load_audio, load_image
from packer.media.policies import Qwen2Audio
from packer.modeling.spans import MediaMismatchError, check, open_media, probe_span, span_path

__all__ = ["MediaMismatchError", "MediaStep", "audio_output_length", "check", "open_media", "probe_span",
           "video_policy_for"]


def prefetch_remote(spans: list[dict[str, Any]]) -> list[str]:
    """Read a batch's remote media (``s3://``, ``http(s)://`` refs of a ``ref`` build; a video's frame images too)
    many at once (:func:`packer.io.fs.prefetch`), so that loading them one by one waits on no round trip; the
    loads then read them from memory, in the spans' order, as they would read the files. Returns the URLs read
    (released when the batch is loaded). Local files and embedded media are not touched."""
    paths = [p for m in spans for p in (m.get("frames") or (span_path(m),)) if fs.is_remote_media(p)]
    return fs.prefetch(paths) if paths else []


def audio_output_length(frames: int) -> int:
    """Positions a Qwen2-Audio / Qwen2.5-Omni audio encoder produces from ``frames`` valid
    mel frames: the build's own formula (:meth:`packer.media.policies.Qwen2Audio.tokens_for_frames`)."""
    return Qwen2Audio.tokens_for_frames(frames)


def video_policy_for(video_processor, **overrides):
    """The ``qwen2vl`` video policy a Qwen2-VL / Qwen2.5-VL video processor implies: its fps
    (2 when unset), num_frames, frame bounds, pixel bounds (``size`` shortest / longest edge),
    patch sizes and ``cap_pixels_per_frame`` / ``max_video_tokens``; frames sampled
    (``sample=true``, the policy's default, what qwen-vl-utils does) unless overridden."""
    from packer.media.policies import Qwen2VLVideo

    vp = video_processor
    size = vp.size
    get = (lambda k: size.get(k)) if isinstance(size, dict) else (lambda k: getattr(size, k, None))  # noqa: E731
    settings = dict(fps=float(vp.fps or 2.0), num_frames=int(vp.num_frames or 0), min_frames=int(vp.min_frames),
                    max_frames=int(vp.max_frames), temporal_patch_size=int(vp.temporal_patch_size),
                    patch_size=int(vp.patch_size), merge_size=int(vp.merge_size),
                    min_pixels=int(get("shortest_edge") or vp.min_pixels), max_pixels=int(get("longest_edge") or vp.max_pixels),
                    cap_pixels_per_frame=bool(vp.cap_pixels_per_frame), max_video_tokens=int(vp.max_video_tokens))
    return Qwen2VLVideo(**{**settings, **overrides})


def policy_spec(policy) -> str:
    """``name:key=value,...`` of a policy, the settings that differ from its defaults (a spec
    :func:`~packer.media.policies.parse_policy` reads back)."""
    changed = [f"{f.name}={str(v).lower() if isinstance(v, bool) else format(v, 'g') if isinstance(v, float) else v}"
               for f in dataclasses.fields(policy) if (v := getattr(policy, f.name)) != f.default]
    return policy.name + (":" + ",".join(changed) if changed else "")


def image_family(image_processor) -> str:
    if hasattr(image_processor, "merge_size") and hasattr(image_processor, "temporal_patch_size"):
        return "qwen2vl"
    if getattr(image_processor, "image_grid_pinpoints", None):
        return "llava_next"
    return "clip"


class MediaStep:
    """Loads and encodes a batch's media; see the module docstring. Picklable."""

    def __init__(self, *, image_processor=None, feature_extractor=None, processor=None, patch_size: int | None = None,
                 image_embeddings=None, audio_features=None, video_processor=None, video_policy=None, timed: bool = False,
                 family=None):
        if processor is not None:
            image_processor = image_processor or getattr(processor, "image_processor", None)
            feature_extractor = feature_extractor or getattr(processor, "feature_extractor", None)
            video_processor = video_processor or getattr(processor, "video_processor", None)
            patch_size = patch_size or getattr(processor, "patch_size", None)
            strategy = getattr(processor, "vision_feature_select_strategy", "default")
            if strategy not in (None, "default") and family is None:  # a family counts its own strategy
                raise ValueError(f"vision_feature_select_strategy {strategy!r}: packer counts LLaVA images with "
                                 f"'default' (the CLS token dropped)")
        self.image_processor, self.feature_extractor = image_processor, feature_extractor
        self.image_embeddings, self.audio_features = image_embeddings, audio_features
        self.patch_size = patch_size or 14
        self.family = image_family(image_processor) if image_processor is not None else None
        self.video_processor, self.timed = video_processor, timed
        self.model_family = family  # a packer.families.Family whose loading differs from the generic policies (Qwen3-VL)
        if isinstance(video_policy, str):
            from packer.media.policies import parse_policy

            video_policy = parse_policy(video_policy, "video")
        if video_policy is None and video_processor is not None and image_family(video_processor) == "qwen2vl":
            video_policy = video_policy_for(video_processor)
        self.video_policy = video_policy

    @property
    def enabled(self) -> bool:
        return any(x is not None for x in (self.image_processor, self.feature_extractor, self.image_embeddings,
                                           self.audio_features, self.video_processor))

    def __call__(self, media: list[dict[str, Any]]) -> dict[str, Any]:
        ordered = sorted(media, key=lambda m: (m.get("batch", 0), m["start"]))
        held = prefetch_remote(ordered)
        try:
            return self._load(ordered)
        finally:
            blobs.STORE.release_urls(held)

    def _load(self, ordered: list[dict[str, Any]]) -> dict[str, Any]:
        out: dict[str, Any] = {}
        images = [m for m in ordered if m["kind"] == "image"]
        audio = [m for m in ordered if m["kind"] == "audio"]
        videos = [m for m in ordered if m["kind"] == "video"]
        if images:
            out.update(self._images(images))
        if audio:
            out.update(self._audio(audio))
        if videos:
            out.update(self._videos(videos))
        # a family whose kinds share one input (InternVL) joins them
        return self.model_family.merge_inputs(out, ordered) if self.model_family is not None else out

    def _own(self, kind: str) -> bool:
        """The family loads ``kind`` itself (its declared ``own_loading``)."""
        return self.model_family is not None and kind in self.model_family.own_loading

    # ------------------------------------------------------------------ images

    def _images(self, spans: list[dict[str, Any]]) -> dict[str, Any]:
        if self._own("image") and self.image_embeddings is None:
            if self.image_processor is None:
                raise ValueError(f"the batch holds {len(spans)} image(s) but the collator has no image processor: "
                                 f"pass PackedCollator(processor=...)")
            return self.model_family.image_inputs(self.image_processor, [open_media(load_image, m) for m in spans], spans,
                                                  check)
        if self.image_embeddings is not None:
            return {"image_embeds": torch.stack([torch.tensor(np.asarray(self.image_embeddings[m["ref"]]), dtype=torch.float32)
                                                 for m in spans])}
        if self.image_processor is None:
            raise ValueError(f"the batch holds {len(spans)} image(s) but the collator has no image processor: "
                             f"pass PackedCollator(image_processor=...) or processor=...")
        pictures = [open_media(load_image, m) for m in spans]
        enc = self.image_processor(images=pictures, return_tensors="pt")
        if self.family == "qwen2vl":
            merge = int(self.image_processor.merge_size)
            for m, grid in zip(spans, enc["image_grid_thw"].tolist(), strict=True):
                t, h, w = grid
                check(m, t * h * w // (merge * merge), type(self.image_processor).__name__,
                       stored_grid=(t, h // merge, w // merge))
            return {"pixel_values": enc["pixel_values"], "image_grid_thw": enc["image_grid_thw"]}
        if self.family == "llava_next":
            from packer.media.policies import AnyRes

            crop = self.image_processor.crop_size
            side = int(crop["height"] if isinstance(crop, dict) else crop.height)
            pinpoints = "/".join(f"{h}x{w}" for h, w in self.image_processor.image_grid_pinpoints)
            policy = AnyRes(image_size=side, patch_size=self.patch_size, pinpoints=pinpoints)
            for m, (h, w) in zip(spans, enc["image_sizes"].tolist(), strict=True):
                check(m, policy.count(h, w).length, type(self.image_processor).__name__)
            return {"pixel_values": enc["pixel_values"], "image_sizes": enc["image_sizes"]}
        pixels = enc["pixel_values"]
        n = (pixels.shape[-2] // self.patch_size) * (pixels.shape[-1] // self.patch_size)
        for m in spans:
            check(m, n, f"{type(self.image_processor).__name__} (patch {self.patch_size})")
        return {"pixel_values": pixels}

    # ------------------------------------------------------------------ audio

    def _audio(self, spans: list[dict[str, Any]]) -> dict[str, Any]:
        if self._own("audio") and self.audio_features is None:
            if self.feature_extractor is None:
                raise ValueError(f"the batch holds {len(spans)} audio clip(s) but the collator has no feature extractor: "
                                 f"pass PackedCollator(processor=...)")
            rate = int(self.feature_extractor.sampling_rate)
            return self.model_family.audio_inputs(self.feature_extractor, [open_media(load_audio, m, rate) for m in spans],
                                                  spans, check)
        if self.audio_features is not None:
            features = [self.audio_features[m["ref"]] for m in spans]
            valid = [int(self.audio_features.valid_frames(m["ref"])) for m in spans]
            input_features = torch.stack([torch.tensor(np.asarray(f), dtype=torch.float32) for f in features])
            mask = (torch.arange(input_features.shape[-1])[None] < torch.as_tensor(valid)[:, None]).to(torch.int32)
            source = "stored audio features"
        else:
            if self.feature_extractor is None:
                raise ValueError(f"the batch holds {len(spans)} audio clip(s) but the collator has no feature extractor: "
                                 f"pass PackedCollator(feature_extractor=...) or processor=...")
            rate = int(self.feature_extractor.sampling_rate)
            keep = getattr(self.feature_extractor, "n_samples", None)  # bounded: decode no more than the extractor keeps
            waves = [open_media(load_audio, m, rate, keep / rate if keep else None) for m in spans]
            enc = self.feature_extractor(waves, sampling_rate=rate, padding="max_length", return_attention_mask=True,
                                         return_tensors="pt")
            input_features, mask = enc["input_features"], enc["attention_mask"]
            source = type(self.feature_extractor).__name__
        for m, frames in zip(spans, mask.sum(-1).tolist(), strict=True):
            check(m, audio_output_length(int(frames)), f"{source} + the Qwen2-Audio encoder")
        return {"input_features": input_features, "feature_attention_mask": mask}

    # ------------------------------------------------------------------ videos

    def _videos(self, spans: list[dict[str, Any]]) -> dict[str, Any]:
        if self.video_processor is None:
            raise ValueError(f"the batch holds {len(spans)} video(s) but the collator has no video processor: "
                             f"pass PackedCollator(video_processor=...) or processor=... (a Qwen2-VL / Qwen2.5-VL one)")
        if self._own("video"):
            return self.model_family.video_inputs(self.video_processor, spans, check)
        if self.video_policy is None:
            raise ValueError(f"{type(self.video_processor).__name__} is not a Qwen2-VL / Qwen2.5-VL video processor: packer "
                             f"loads videos for the qwen2vl video policy only; pass video_policy=... and a Qwen2-VL one")
        from transformers.video_utils import VideoMetadata

        from packer.media.video import video_metadata
        from packer.modeling.spans import load_planned_frames

        policy, frames, metadata = self.video_policy, [], []
        for m in spans:
            info = probe_span(m)
            indices = policy.frame_indices(info.frames, info.fps)  # a frame list: sampled as a file at its fps
            frames.append(load_planned_frames(m, indices))  # a load error names its file
            metadata.append(video_metadata(info, policy))
        enc = self.video_processor(videos=frames, video_metadata=metadata, do_sample_frames=False, return_tensors="pt")
        merge, tps = int(self.video_processor.merge_size), int(self.video_processor.temporal_patch_size)
        by = f"{type(self.video_processor).__name__} (frames sampled by video policy {policy_spec(policy)})"
        seconds = []
        for m, grid, meta in zip(spans, enc["video_grid_thw"].tolist(), metadata, strict=True):
            t, h, w = grid
            check(m, t * h * w // (merge * merge), by, stored_grid=(t, h // merge, w // merge))
            implied = float(np.float32(tps / VideoMetadata(**meta).sampled_fps))  # Qwen2_5_VLProcessor._process_videos
            stored = float(np.float32(m.get("second_per_grid_t") or 0.0))
            if (stored or self.timed) and stored != implied:
                raise MediaMismatchError(
                    f"{span_path(m)}: the build stored second_per_grid_t {stored:g} s but the frames video policy "
                    f"{policy_spec(policy)} samples give {implied:g} s per temporal grid step (temporal_patch_size over "
                    f"their rate); Qwen2.5-VL's time-scaled mRoPE positions would be wrong: rebuild with the video policy "
                    f"of this processor, or give the collator the build's (video_policy=...)")
            seconds.append(implied)
        out = {"pixel_values_videos": enc["pixel_values_videos"], "video_grid_thw": enc["video_grid_thw"]}
        if self.timed:
            out["second_per_grid_ts"] = torch.tensor(seconds, dtype=torch.float32)
        return out
