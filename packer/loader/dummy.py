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
  8 mel frames, two tokens; LLaVA: one image of the tower's size; every family's: docs/training.md)
  and its placeholder tokens, appended to one row as a segment of its own (labels -100, weight 0,
  attended by nothing else: the block-diagonal mask isolates it; ``dummy_segments`` marks it, so a
  family's checks of real segments skip it);
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

import dataclasses
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
    covers: tuple[str, ...] = ()  # kinds whose items make it unneeded besides its own (InternVL: image and video)


@dataclass(frozen=True)
class Tower:
    """A tower of a model family: where it sits on the HF model, the media kinds (forward call
    sites) it encodes, and ``build(config, kind) -> Dummy``.

    ``joint``: the kinds reach the tower in ONE call (InternVL scatters image tiles and video frames
    from one ``pixel_values``): one dummy, of the first kind the build declares, stands for them all,
    and a batch holding an item of any of them needs none. ``config``: the sub-config without which
    the model has no such tower (Gemma 4's smaller models have no audio tower: no dummy, no check)."""

    attribute: str
    kinds: tuple[str, ...]
    build: Callable[[Any, str], Dummy]
    joint: bool = False
    config: str = ""

    def present(self, config) -> bool:
        return not self.config or getattr(config, self.config, None) is not None


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


def _side(x) -> int:
    """A square size given as an int or (height, width)."""
    if isinstance(x, (list, tuple)):
        if len(set(x)) != 1:
            raise ValueError(f"the dummy-media registry builds square tiles; the tower's size is {tuple(x)}")
        return int(x[0])
    return int(x)


def _internvl(config, kind: str) -> Dummy:
    """InternVL: one tile of zeros (an image of one tile, or a video of one frame): (side / patch)² x
    downsample_ratio² ``<IMG_CONTEXT>`` tokens after the pixel shuffle (256 at 448 / 14, ratio 0.5).
    Images and videos share one ``pixel_values`` (the tower is called once): a joint tower."""
    v = config.vision_config
    side, patch = _side(v.image_size), _side(v.patch_size)
    if getattr(config, "vision_feature_select_strategy", "default") != "default":
        raise ValueError(f"InternVL with vision_feature_select_strategy {config.vision_feature_select_strategy!r}: its "
                         f"features keep the class token and do not fold into the pixel shuffle's square; no dummy")
    ratio = float(config.downsample_ratio)
    length = int((side // patch) ** 2 * ratio * ratio)
    return Dummy(kind, length, {"pixel_values": torch.zeros(1, int(getattr(v, "num_channels", 3)), side, side)})


def _llama4(config, kind: str) -> Dummy:
    """Llama 4: one tile of zeros (an image of one tile: the processor's global tile alone), (side / patch)² x
    pixel_shuffle_ratio² ``<|patch|>`` tokens (144 at 336 / 14, ratio 0.5)."""
    v = config.vision_config
    side, patch = _side(v.image_size), _side(v.patch_size)
    length = (side // patch) ** 2 // int(round(1.0 / float(v.pixel_shuffle_ratio) ** 2))
    return Dummy("image", length, {"pixel_values": torch.zeros(1, int(getattr(v, "num_channels", 3)), side, side)})


def _llava_onevision(config, kind: str) -> Dummy:
    """LLaVA-OneVision. An image: one image of one tile's size alone in its record, so anyres tiles it (its
    base tile and the pinpoint grid that fits it: 2 tiles where a pinpoint is one tile) and the model keeps
    p² base features + the p x p grid with a newline a row (p = side / patch: 2p² + p tokens, 1,485 for
    SigLIP 384 / 14). A video: one frame, pooled 2 x 2, and the video's newline: ceil(p / 2)² + 1 tokens."""
    from transformers.models.llava_onevision.modeling_llava_onevision import image_size_to_num_patches

    from packer.families.llava_onevision import LlavaOnevisionSettings, anyres_tokens

    v = config.vision_config
    side, patch = _side(v.image_size), _side(v.patch_size)
    p = side // patch
    class_token = str(getattr(v, "model_type", "")).startswith("clip")  # CLIP adds one; SigLIP none
    strategy = getattr(config, "vision_feature_select_strategy", "full")
    if p * p + class_token - (strategy == "default") != p * p:
        raise ValueError(f"LLaVA-OneVision with a {v.model_type} tower and vision_feature_select_strategy {strategy!r}: "
                         f"a tile's features are not p x p = {p * p} (the model itself refuses anyres images and pools "
                         f"no video frames then); no dummy")
    channels = int(getattr(v, "num_channels", 3))
    if kind == "video":
        pooled = -(-p // 2)
        return Dummy("video", pooled * pooled + 1, {"pixel_values_videos": torch.zeros(1, 1, channels, side, side)})
    pinpoints = [list(x) for x in config.image_grid_pinpoints]
    tiles = image_size_to_num_patches((side, side), pinpoints, side)
    settings = LlavaOnevisionSettings(image_size=side, pinpoints="/".join(f"{h}x{w}" for h, w in pinpoints),
                                      num_image_tokens=p * p, vision_aspect_ratio=config.vision_aspect_ratio)
    length, _ = anyres_tokens(side, side, settings)
    return Dummy("image", length, {"pixel_values": torch.zeros(1, tiles, channels, side, side),
                                   "image_sizes": torch.tensor([[side, side]]),
                                   "batch_num_images": torch.tensor([1])})


def _qwen3_omni_audio(config, kind: str) -> Dummy:
    """Qwen3-Omni's audio encoder (not Whisper's: 100-frame blocks, three stride-2 convolutions): a clip of
    one mel frame, zeros, one token."""
    from packer.families.qwen3omni import audio_output_length

    a = config.audio_config
    features = torch.zeros(1, int(a.num_mel_bins), 1)
    return Dummy("audio", audio_output_length(1, int(a.n_window)),
                 {"input_features": features, "feature_attention_mask": torch.ones(1, 1, dtype=torch.int32)})


def _gemma3(config, kind: str) -> Dummy:
    """Gemma 3: one image of the tower's size (SigLIP's fixed square), pooled to ``mm_tokens_per_image`` (256)."""
    v = config.vision_config
    side = _side(v.image_size)
    return Dummy("image", int(config.mm_tokens_per_image),
                 {"pixel_values": torch.zeros(1, int(getattr(v, "num_channels", 3)), side, side)})


def _gemma4_vision(config, kind: str) -> Dummy:
    """Gemma 4's vision tower: k x k patches (k = pooling_kernel_size), pooled to ONE soft token; an image, or a
    video of one such frame. The patches are unpadded, at positions (x, y) in the k x k grid (the processor's
    order: row by row)."""
    v = config.vision_config
    k, patch = int(v.pooling_kernel_size), int(v.patch_size)
    pixels = torch.zeros(1, k * k, 3 * patch * patch)
    positions = torch.tensor([[x, y] for y in range(k) for x in range(k)])[None]
    if kind == "video":
        return Dummy("video", 1, {"pixel_values_videos": pixels, "video_position_ids": positions,
                                  "num_frames_per_video": torch.tensor([1])})
    return Dummy("image", 1, {"pixel_values": pixels, "image_position_ids": positions})


def _gemma4_audio(config, kind: str) -> Dummy:
    """Gemma 4's audio encoder: one mel frame (halved twice by its stride-2 convolutions: still one token). Its
    mel width is what the subsampling's projection takes: 4 x (subsampling_conv_channels[0] // 4) (128)."""
    channels = int(config.audio_config.subsampling_conv_channels[0])
    return Dummy("audio", 1, {"input_features": torch.zeros(1, 1, 4 * (channels // 4)),
                              "input_features_mask": torch.ones(1, 1, dtype=torch.bool)})


QWEN_VISION = Tower("model.visual", ("image", "video"), _qwen_vision)
register("qwen2_vl", QWEN_VISION)
register("qwen2_5_vl", QWEN_VISION)
register("llava", Tower("model.vision_tower", ("image",), _llava))
register("llava_next", Tower("model.vision_tower", ("image",), _llava_next))
register("qwen2_audio", Tower("model.audio_tower", ("audio",), _audio(3000)))
register("qwen2_5_omni_thinker", Tower("model.audio_tower", ("audio",), _audio(None)), QWEN_VISION)
register("qwen3_vl", QWEN_VISION)  # Qwen3-VL / 3.5: the same patch grid (16 px, merge 2), one token a dummy
register("qwen3_5", QWEN_VISION)
register("internvl", Tower("model.vision_tower", ("image", "video"), _internvl, joint=True))
register("llama4", Tower("vision_model", ("image",), _llama4))
register("llava_onevision", Tower("model.vision_tower", ("image", "video"), _llava_onevision))
register("qwen3_omni_moe_thinker", Tower("model.audio_tower", ("audio",), _qwen3_omni_audio), QWEN_VISION)
register("gemma3", Tower("model.vision_tower", ("image",), _gemma3))
register("gemma4", Tower("model.vision_tower", ("image", "video"), _gemma4_vision, config="vision_config"),
         Tower("model.audio_tower", ("audio",), _gemma4_audio, config="audio_config"))


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
        needed = [d for d in self.dummies.values() if not {d.kind, *d.covers} & present]
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
                 "n_tokens": n + total, "media": [*row["media"], *spans],
                 "dummy_segments": 1}  # the row's last segment: a family's checks of real segments skip it
        if "segment_trained" in row:
            grown["segment_trained"] = [*row["segment_trained"], 0]
        inputs = {key: value for d in needed for key, value in d.inputs.items()}
        return [*rows[:b], grown, *rows[b + 1 :]], inputs


def towers(model) -> tuple[Tower, ...]:
    """The registered towers of ``model`` (an HF model or its config); () for a family packer does
    not know (a text model, or one to :func:`register`)."""
    config = getattr(model, "config", model)
    found = tuple(t for t in FAMILIES.get(getattr(config, "model_type", ""), ()) if t.present(config))
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
    built: dict[str, Dummy] = {}
    for t in towers(model):
        guarded = [k for k in t.kinds if wanted is None or k in wanted]
        if t.joint and guarded:  # one call site: one dummy, unneeded when any of the kinds is in the batch
            built[guarded[0]] = dataclasses.replace(t.build(config, guarded[0]), covers=tuple(guarded))
        else:
            built.update((k, t.build(config, k)) for k in guarded)
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
