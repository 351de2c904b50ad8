"""The collator's media step: every span's file -> exactly what the HF model classes take.

The model scatters encoder outputs into its placeholder positions in row-major order
(``masked_scatter`` over ``input_ids == image_token_id``), so the step loads the media
of a batch sorted by (row, start) and hands the processor outputs over in that order:

================================  ==================================================
image processor                   batch keys
================================  ==================================================
Qwen2-VL / Qwen2.5-VL             ``pixel_values`` (patches), ``image_grid_thw``
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
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from packer.media.load import load_audio, load_image


class MediaMismatchError(ValueError):
    """A media item would give the model another number of features than its span holds."""


def audio_output_length(frames: int) -> int:
    """Positions a Qwen2-Audio / Qwen2.5-Omni audio encoder produces from ``frames`` valid
    mel frames: a stride-2 conv, then a 2x pool (``_get_feat_extract_output_lengths``)."""
    conv = (frames - 1) // 2 + 1
    return (conv - 2) // 2 + 1


def image_family(image_processor) -> str:
    if hasattr(image_processor, "merge_size") and hasattr(image_processor, "temporal_patch_size"):
        return "qwen2vl"
    if getattr(image_processor, "image_grid_pinpoints", None):
        return "llava_next"
    return "clip"


class MediaStep:
    """Loads and encodes a batch's media; see the module docstring. Picklable."""

    def __init__(self, *, image_processor=None, feature_extractor=None, processor=None, patch_size: int | None = None,
                 image_embeddings=None, audio_features=None):
        if processor is not None:
            image_processor = image_processor or getattr(processor, "image_processor", None)
            feature_extractor = feature_extractor or getattr(processor, "feature_extractor", None)
            patch_size = patch_size or getattr(processor, "patch_size", None)
            strategy = getattr(processor, "vision_feature_select_strategy", "default")
            if strategy not in (None, "default"):
                raise ValueError(f"vision_feature_select_strategy {strategy!r}: packer counts LLaVA images with "
                                 f"'default' (the CLS token dropped)")
        self.image_processor, self.feature_extractor = image_processor, feature_extractor
        self.image_embeddings, self.audio_features = image_embeddings, audio_features
        self.patch_size = patch_size or 14
        self.family = image_family(image_processor) if image_processor is not None else None

    @property
    def enabled(self) -> bool:
        return any(x is not None for x in (self.image_processor, self.feature_extractor, self.image_embeddings,
                                           self.audio_features))

    def __call__(self, media: list[dict[str, Any]]) -> dict[str, Any]:
        ordered = sorted(media, key=lambda m: (m.get("batch", 0), m["start"]))
        out: dict[str, Any] = {}
        images = [m for m in ordered if m["kind"] == "image"]
        audio = [m for m in ordered if m["kind"] == "audio"]
        if images:
            out.update(self._images(images))
        if audio:
            out.update(self._audio(audio))
        return out

    # ------------------------------------------------------------------ images

    def _images(self, spans: list[dict[str, Any]]) -> dict[str, Any]:
        if self.image_embeddings is not None:
            return {"image_embeds": torch.stack([torch.tensor(np.asarray(self.image_embeddings[m["ref"]]), dtype=torch.float32)
                                                 for m in spans])}
        if self.image_processor is None:
            raise ValueError(f"the batch holds {len(spans)} image(s) but the collator has no image processor: "
                             f"pass PackedCollator(image_processor=...) or processor=...")
        pictures = [_open(load_image, m) for m in spans]
        enc = self.image_processor(images=pictures, return_tensors="pt")
        if self.family == "qwen2vl":
            merge = int(self.image_processor.merge_size)
            for m, grid in zip(spans, enc["image_grid_thw"].tolist(), strict=True):
                t, h, w = grid
                _check(m, t * h * w // (merge * merge), type(self.image_processor).__name__,
                       stored_grid=(t, h // merge, w // merge))
            return {"pixel_values": enc["pixel_values"], "image_grid_thw": enc["image_grid_thw"]}
        if self.family == "llava_next":
            from packer.media.policies import AnyRes

            crop = self.image_processor.crop_size
            side = int(crop["height"] if isinstance(crop, dict) else crop.height)
            pinpoints = "/".join(f"{h}x{w}" for h, w in self.image_processor.image_grid_pinpoints)
            policy = AnyRes(image_size=side, patch_size=self.patch_size, pinpoints=pinpoints)
            for m, (h, w) in zip(spans, enc["image_sizes"].tolist(), strict=True):
                _check(m, policy.count(h, w).length, type(self.image_processor).__name__)
            return {"pixel_values": enc["pixel_values"], "image_sizes": enc["image_sizes"]}
        pixels = enc["pixel_values"]
        n = (pixels.shape[-2] // self.patch_size) * (pixels.shape[-1] // self.patch_size)
        for m in spans:
            _check(m, n, f"{type(self.image_processor).__name__} (patch {self.patch_size})")
        return {"pixel_values": pixels}

    # ------------------------------------------------------------------ audio

    def _audio(self, spans: list[dict[str, Any]]) -> dict[str, Any]:
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
            waves = [_open(load_audio, m, rate) for m in spans]
            enc = self.feature_extractor(waves, sampling_rate=rate, padding="max_length", return_attention_mask=True,
                                         return_tensors="pt")
            input_features, mask = enc["input_features"], enc["attention_mask"]
            source = type(self.feature_extractor).__name__
        for m, frames in zip(spans, mask.sum(-1).tolist(), strict=True):
            _check(m, audio_output_length(int(frames)), f"{source} + the Qwen2-Audio encoder")
        return {"input_features": input_features, "feature_attention_mask": mask}


def _open(load, span: dict[str, Any], *args):
    path = span.get("path") or span["ref"]
    try:
        return load(path, *args)
    except FileNotFoundError:
        raise FileNotFoundError(f"{span['kind']} file {path} (ref {span['ref']!r}) not found; if the media moved, "
                                f"open the build with PackedDataset(out, media_root=NEW_ROOT)") from None


def _check(span: dict[str, Any], produced: int, by: str, stored_grid: tuple[int, ...] | None = None) -> None:
    path = span.get("path") or span["ref"]
    if produced != span["length"]:
        raise MediaMismatchError(
            f"{path}: the build gave this {span['kind']} {span['length']} placeholder positions but {by} produces "
            f"{produced} features from it. The build's token policy and this processor disagree: rebuild with "
            f"settings that match the processor (--image-tokens / --audio-tokens), or give the collator the "
            f"processor the build was made for.")
    grid = tuple(int(g) for g in span.get("grid") or ())
    if stored_grid is not None and grid and grid != tuple(stored_grid):
        raise MediaMismatchError(f"{path}: the build stored grid {grid} but {by} makes {tuple(stored_grid)}; "
                                 f"mRoPE positions would be wrong: rebuild with matching --image-tokens")
