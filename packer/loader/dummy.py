"""Zero-contribution dummy media, so every data-parallel rank runs every tower.

Under DDP and FSDP a rank whose batch holds no image never calls the vision tower: DDP then
fails ("parameters that were not used in producing loss"), FSDP2 all-gathers other units than
its peers and dies in a collective mismatch (a hang under NCCL). The fix ms-swift and
LLaMA-Factory use is to run each tower on a dummy input; packer does it in the batch itself,
so the tower runs inside the model's own forward, at the place and in the order it runs on
every other rank (Qwen2.5-Omni runs its audio tower before its vision tower: a dummy run
beside the forward would reverse that order on some ranks):

- for each media kind the model encodes (an entry of :data:`FAMILIES`) and the build declares,
  a batch without an item of that kind gets one minimal dummy item: the model's own input
  tensors for it (zeros; Qwen2-VL: one 2 x 2 patch grid, one token; Qwen2-Audio: a clip of
  8 mel frames, two tokens; LLaVA: one image of the tower's size) and its placeholder tokens,
  appended to one row as a segment of its own (labels -100, weight 0, attended by nothing
  else: the block-diagonal mask isolates it);
- so the loss, the logits of every real token and every gradient are those of the batch
  without it (the tower's gradient from the dummy is exactly zero); tested against a run
  without it, and over 2 processes under DDP and FSDP2.

Worked example, Qwen2-VL, one text-only row of 5 tokens (``I`` the image placeholder)::

    input_ids    t t t t t | I          cu_seqlens [0, 5, 6]     labels on I: -100
    pixel_values  zeros [4, 3 * 2 * 14 * 14]   image_grid_thw [[1, 2, 2]]   (one merged token)

The registry is keyed by the HF config's ``model_type``; each entry names the tower attribute
(checked on the model) and builds the dummy inputs from the config. A family is added with
:func:`register`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from packer.shards.schema import IGNORE


@dataclass(frozen=True)
class Dummy:
    """One dummy media item: the batch keys the model takes for it and its placeholder count."""

    kind: str
    length: int  # placeholder positions its features fill
    inputs: dict[str, torch.Tensor]
    grid: tuple[int, ...] = ()  # merged (t, h, w) for mRoPE; () where the family has none
    span: dict[str, Any] = field(default_factory=dict)  # extra span fields (a video's second_per_grid_t)


@dataclass(frozen=True)
class Tower:
    """A tower of a model family: where it sits on the HF model, the media kinds (forward call
    sites) it encodes, and ``build(config, kind) -> Dummy``."""

    attribute: str
    kinds: tuple[str, ...]
    build: Callable[[Any, str], Dummy]


FAMILIES: dict[str, tuple[Tower, ...]] = {}


def register(model_type: str, *towers: Tower) -> None:
    """Register a model family (``config.model_type``) by its towers."""
    if model_type in FAMILIES:
        raise ValueError(f"model type {model_type!r} registered twice")
    FAMILIES[model_type] = towers


def _attr(obj: Any, path: str) -> Any:
    for name in path.split("."):
        obj = getattr(obj, name, None)
        if obj is None:
            return None
    return obj


# ------------------------------------------------------------------ builders


def _qwen_vision(config, kind: str) -> Dummy:
    """Qwen2-VL / Qwen2.5-VL / Qwen2.5-Omni vision: the smallest grid, (1, merge, merge) patches -> 1 token."""
    v = config.vision_config
    merge, patch, tps = int(v.spatial_merge_size), int(v.patch_size), int(v.temporal_patch_size)
    channels = int(getattr(v, "in_channels", None) or getattr(v, "in_chans", None) or 3)
    pixels = torch.zeros(merge * merge, channels * tps * patch * patch)
    grid = torch.tensor([[1, merge, merge]])
    if kind == "video":
        return Dummy("video", 1, {"pixel_values_videos": pixels, "video_grid_thw": grid}, (1, 1, 1),
                     {"second_per_grid_t": 1.0})
    return Dummy("image", 1, {"pixel_values": pixels, "image_grid_thw": grid}, (1, 1, 1))


def _llava(config, kind: str) -> Dummy:
    """LLaVA-1.5: one image of the tower's size; (size / patch)^2 tokens (the CLS token dropped)."""
    v = config.vision_config
    _default_strategy(config)
    side, patch = int(v.image_size), int(v.patch_size)
    pixels = torch.zeros(1, int(getattr(v, "num_channels", 3)), side, side)
    return Dummy("image", (side // patch) ** 2, {"pixel_values": pixels})


def _llava_next(config, kind: str) -> Dummy:
    """LLaVA-NeXT: one image of the tower's size through anyres (its tiles, base and newlines)."""
    from transformers.models.llava_next.modeling_llava_next import image_size_to_num_patches

    from packer.media.policies import AnyRes

    v = config.vision_config
    _default_strategy(config)
    side, patch = int(v.image_size), int(v.patch_size)
    pinpoints = [list(p) for p in config.image_grid_pinpoints]
    tiles = image_size_to_num_patches((side, side), pinpoints, side)
    policy = AnyRes(image_size=side, patch_size=patch, pinpoints="/".join(f"{h}x{w}" for h, w in pinpoints))
    pixels = torch.zeros(1, tiles, int(getattr(v, "num_channels", 3)), side, side)
    return Dummy("image", policy.count(side, side).length, {"pixel_values": pixels, "image_sizes": torch.tensor([[side, side]])})


def _default_strategy(config) -> None:
    strategy = getattr(config, "vision_feature_select_strategy", "default")
    if strategy != "default":
        raise ValueError(f"vision_feature_select_strategy {strategy!r}: packer counts LLaVA images with 'default'")


# Valid mel frames of a dummy clip: 8 give the encoder two positions, the fewest Qwen2-Audio's forward
# accepts (a lone audio token sends it down its legacy expansion path, which refuses packed masks).
AUDIO_FRAMES = 8


def _audio(frames: int | None) -> Callable[[Any, str], Dummy]:
    """A clip of :data:`AUDIO_FRAMES` valid mel frames, zeros, in ``frames`` columns (Qwen2-Audio's
    encoder takes exactly one 30 s window of 3000; None: just the valid ones, Qwen2.5-Omni)."""

    def build(config, kind: str) -> Dummy:
        from packer.loader.media import audio_output_length

        a = config.audio_config
        width = frames or AUDIO_FRAMES
        mask = torch.zeros(1, width, dtype=torch.int32)
        mask[0, :AUDIO_FRAMES] = 1
        features = torch.zeros(1, int(a.num_mel_bins), width)
        return Dummy("audio", audio_output_length(AUDIO_FRAMES), {"input_features": features, "feature_attention_mask": mask})

    return build


QWEN_VISION = Tower("model.visual", ("image", "video"), _qwen_vision)
register("qwen2_vl", QWEN_VISION)
register("qwen2_5_vl", QWEN_VISION)
register("llava", Tower("model.vision_tower", ("image",), _llava))
register("llava_next", Tower("model.vision_tower", ("image",), _llava_next))
register("qwen2_audio", Tower("model.audio_tower", ("audio",), _audio(3000)))
register("qwen2_5_omni_thinker", Tower("model.audio_tower", ("audio",), _audio(None)), QWEN_VISION)
register("qwen3_vl", QWEN_VISION)  # Qwen3-VL / 3.5: the same patch grid (16 px, merge 2), one token a dummy
register("qwen3_5", QWEN_VISION)


# ------------------------------------------------------------------ the collator's part


class MediaDummies:
    """What :class:`~packer.loader.PackedCollator` (``dummy_media=``) adds to a batch: for each
    guarded kind the batch lacks, one :class:`Dummy` segment. Picklable (DataLoader workers)."""

    def __init__(self, dummies: dict[str, Dummy], placeholders: dict[str, int]):
        missing = sorted(set(dummies) - set(placeholders))
        if missing:
            raise ValueError(f"no placeholder token id for {', '.join(missing)}: give placeholders={{kind: id}}")
        self.dummies, self.placeholders = dummies, placeholders

    @property
    def kinds(self) -> tuple[str, ...]:
        return tuple(self.dummies)

    def add(self, rows: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], dict[str, torch.Tensor]]:
        """``rows`` with one dummy segment appended to the shortest row (a new list; the rows are
        not modified) and the dummies' model inputs; the rows themselves when nothing is missing."""
        present = {m["kind"] for r in rows for m in r["media"]}
        needed = [self.dummies[k] for k in self.kinds if k not in present]
        if not needed:
            return rows, {}
        b = min(range(len(rows)), key=lambda i: int(rows[i]["n_tokens"]))
        row, n = rows[b], int(rows[b]["n_tokens"])
        total = sum(d.length for d in needed)
        ids, spans, at = [], [], n
        segment = len(row["cu_seqlens"]) - 1
        for d in needed:
            ids += [self.placeholders[d.kind]] * d.length
            spans.append({"segment": segment, "kind": d.kind, "start": at, "length": d.length, "tokens": d.length,
                          "ref": f"<dummy {d.kind}>", "llm_grid": list(d.grid), "dummy": True, **d.span})
            at += d.length
        grown = {**row,
                 "input_ids": np.concatenate([np.asarray(row["input_ids"], np.int64)[:n], ids]),
                 "labels": np.concatenate([np.asarray(row["labels"], np.int64)[:n], [IGNORE] * total]),
                 "cu_seqlens": np.append(np.asarray(row["cu_seqlens"], np.int64), n + total),
                 "n_tokens": n + total, "media": [*row["media"], *spans]}
        if "segment_trained" in row:
            grown["segment_trained"] = [*row["segment_trained"], 0]
        inputs = {key: value for d in needed for key, value in d.inputs.items()}
        return [*rows[:b], grown, *rows[b + 1 :]], inputs


def towers(model) -> tuple[Tower, ...]:
    """The registered towers of ``model`` (an HF model or its config); () for a family packer does
    not know (a text model, or one to :func:`register`)."""
    config = getattr(model, "config", model)
    found = FAMILIES.get(getattr(config, "model_type", ""), ())
    if hasattr(model, "config"):
        for t in found:
            if _attr(model, t.attribute) is None:
                raise ValueError(f"{type(model).__name__} ({config.model_type}) has no {t.attribute}: the dummy-media "
                                 f"registry (packer.loader.dummy.FAMILIES) does not match this transformers version")
    return found


def media_dummies(model, dataset=None, *, kinds=None, placeholders: dict[str, int] | None = None) -> MediaDummies | None:
    """The :class:`MediaDummies` for ``model`` (an HF model or config): one dummy per media kind its
    towers encode that ``dataset``'s build declares (its ``modalities``; or ``kinds=``), with the
    build's placeholder ids (or ``placeholders=``). None when there is nothing to guard."""
    config = getattr(model, "config", model)
    wanted = set(kinds) if kinds is not None else None
    if wanted is None and dataset is not None:
        wanted = set(dataset.manifest.config.get("modalities") or ())
    built = {k: t.build(config, k) for t in towers(model) for k in t.kinds if wanted is None or k in wanted}
    if not built:
        return None
    if placeholders is None:
        if dataset is None:
            raise ValueError("give the dataset (its build's placeholder ids) or placeholders={kind: token id}")
        placeholders = build_placeholders(dataset)
    return MediaDummies(built, placeholders)


def build_placeholders(dataset) -> dict[str, int]:
    """``{kind: token id}`` of the placeholder each media kind expands to in ``dataset``'s build (its family's run token)."""
    ids = {kind: dataset.manifest.placeholder_id(kind) for kind in ("image", "audio", "video")}
    return {kind: i for kind, i in ids.items() if i is not None}
