"""Llama 4 (Scout / Maverick): images, token for token with ``Llama4Processor``; the packed-row
attention masks its text model needs.

Images (``Llama4ImageProcessor``): the canvas is ``get_best_fit`` among the resolutions of up to
``max_patches`` square tiles (``find_supported_resolutions``): the smallest upscale of the image
that fits without distortion, else the least downscale; of equal scales the smallest area.
That canvas is rh x rw tiles of ``size`` px; an image of more than one tile also gets a global
tile (the whole image resized to one tile). Each tile is (size / patch_size)² /
downsample_ratio features (``patch_size`` 14 and ``pixel_shuffle_ratio`` 0.5 of the processor:
144 for 336-px tiles). The processor writes, in place of the template's ``<|image|>``::

    <|image_start|>
      for each tile row:   (<|patch|> x 144 <|tile_x_separator|>) ... <|patch|> x 144 <|tile_y_separator|>
    <|image|> <|patch|> x 144 <|image_end|>          (the global tile; a one-tile image has only this)

Each tile's ``<|patch|>`` run is its own run inside the image's media span; the separators and
``<|image|>`` between them are text inside the span (counted, never trained). These strings are
written by ``Llama4Processor._prompt_split_image`` as literals; only the token the template
writes (``image_token``) is a processor setting.

Attention (train time, :meth:`Llama4.attention_masks`): the text model mixes
``chunked_attention`` layers (RoPE, attending within ``attention_chunk_size`` positions counted
from the sequence start) and ``full_attention`` NoPE layers, and takes a precomputed mask per
layer type (``attention_mask={"full_attention": ..., "chunked_attention": ...}``). Packed, a
segment's chunks restart at the segment: the chunked mask is causal within (segment, position
// chunk) -- exactly the mask the record alone gets. NoPE layers scale their queries by
``log1p(floor((p + 1) / floor_scale)) * attn_scale + 1`` with p the *row* position
(``attn_temperature_tuning``), which no input can reset per segment: a row is exact while every
segment after the first ends before row position ``floor_scale - 1`` (where the scale is 1 both
ways), and refused otherwise.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import asdict, dataclass
from typing import Any, ClassVar

import numpy as np

from packer.families.base import Expansion, Family, RecordMedia, Run
from packer.families.checkpoint import Checkpoint
from packer.families.towers import one_tile
from packer.media import bounds as setting_bounds
from packer.modeling.towers import Dummy, Tower, side
from packer.specs import parse_params

# Written by Llama4Processor._prompt_split_image as literals (not processor settings).
IMAGE_START, IMAGE_END, PATCH = "<|image_start|>", "<|image_end|>", "<|patch|>"
TILE_X, TILE_Y, IMAGE = "<|tile_x_separator|>", "<|tile_y_separator|>", "<|image|>"


@dataclass(frozen=True)
class Llama4Settings:
    """The processor's settings (``--processor`` folder values over these defaults: ``Llama4Processor``'s and
    ``Llama4ImageProcessor``'s own)."""

    tile_size: int = 336  # Llama4ImageProcessor.size (square)
    max_patches: int = 16
    resize_to_max_canvas: bool = False
    patch_size: int = 14  # Llama4Processor's
    pixel_shuffle_ratio: float = 0.5
    image_token: str = IMAGE  # what the template writes and the processor replaces

    def __post_init__(self):
        setting_bounds.check(self, "llama4")

    @classmethod
    def resolve(cls, checkpoint: Checkpoint, options: str = "") -> Llama4Settings:
        from packer.errors import ConfigError

        found: dict[str, Any] = {}
        proc, image = checkpoint.processor, checkpoint.image_processor
        size = image.get("size") or {}
        if "height" in size or "width" in size:
            if size.get("height") != size.get("width"):
                raise ConfigError(f"processor {checkpoint.name!r}: Llama4ImageProcessor's size must be square, got {size}")
            found["tile_size"] = int(size["height"])
        if image.get("max_patches") is not None:
            found["max_patches"] = int(image["max_patches"])
        if image.get("resize_to_max_canvas") is not None:
            found["resize_to_max_canvas"] = bool(image["resize_to_max_canvas"])
        if proc.get("patch_size") is not None:
            found["patch_size"] = int(proc["patch_size"])
        if proc.get("pixel_shuffle_ratio") is not None:
            found["pixel_shuffle_ratio"] = float(proc["pixel_shuffle_ratio"])
        if proc.get("image_token") is not None:
            found["image_token"] = str(proc["image_token"])
        found.update(parse_params("llama4", options, cls, what="processor option"))
        return cls(**found)

    @property
    def tokens_per_tile(self) -> int:
        """``Llama4Processor.replace_image_token``'s num_patches_per_chunk."""
        downsample = int(round(1.0 / (self.pixel_shuffle_ratio**2)))
        return (self.tile_size // self.patch_size) * (self.tile_size // self.patch_size) // downsample


def factors(n: int) -> set[int]:
    """``get_factors``."""
    return {d for i in range(1, int(n**0.5) + 1) if n % i == 0 for d in (i, n // i)}


def supported_resolutions(max_chunks: int, tile: int) -> list[tuple[int, int]]:
    """``find_supported_resolutions``: (height, width) canvases of up to ``max_chunks`` tiles, in its order
    (grouped by aspect ratio, the ratios in the order first met from ``max_chunks`` tiles down)."""
    by_ratio: dict[float, list[tuple[int, int]]] = defaultdict(list)
    for chunks in range(max_chunks, 0, -1):
        for f in sorted(factors(chunks)):
            by_ratio[f / (chunks // f)].append((f, chunks // f))
    return [(h * tile, w * tile) for grids in by_ratio.values() for h, w in grids]


def best_fit(height: int, width: int, resolutions: list[tuple[int, int]], resize_to_max_canvas: bool) -> tuple[int, int]:
    """``get_best_fit`` in its float32 arithmetic: the canvas (height, width) the image is fitted to."""
    sizes = np.asarray(resolutions, dtype=np.float32)
    scale_h = sizes[:, 0] / np.float32(height)
    scale_w = sizes[:, 1] / np.float32(width)
    scales = np.where(scale_h > scale_w, scale_w, scale_h)
    up = scales[scales >= 1]
    if len(up):
        selected = up.max() if resize_to_max_canvas else up.min()
    else:
        selected = scales[scales < 1].max()
    chosen = [resolutions[k] for k in np.flatnonzero(scales == selected)]
    if len(chosen) > 1:
        areas = [h * w for h, w in chosen]
        return chosen[int(np.argmin(areas))]
    return chosen[0]


def tile_grid(height: int, width: int, s: Llama4Settings) -> tuple[int, int]:
    """(rows, columns) of tiles the image processor cuts an image into (its ``aspect_ratios``)."""
    h, w = best_fit(height, width, supported_resolutions(s.max_patches, s.tile_size), s.resize_to_max_canvas)
    return h // s.tile_size, w // s.tile_size


def image_pieces(rows: int, columns: int, per_tile: int) -> tuple[str | Run, ...]:
    """``Llama4Processor._prompt_split_image``, its runs of ``<|patch|>`` as :class:`Run` s."""
    pieces: list[str | Run] = [IMAGE_START]
    if rows * columns > 1:
        for _ in range(rows):
            for x in range(columns):
                pieces.append(Run(PATCH, per_tile))
                if x < columns - 1:
                    pieces.append(TILE_X)
            pieces.append(TILE_Y)
    pieces += [IMAGE, Run(PATCH, per_tile), IMAGE_END]
    return tuple(pieces)


def tiles_of(rows: int, columns: int) -> int:
    """Tiles the vision tower encodes for a (rows, columns) image: the grid, plus the global tile when over one."""
    return rows * columns + (1 if rows * columns > 1 else 0)


def llama4_dummy(config, kind: str) -> Dummy:
    """One tile of zeros (an image of one tile: the processor's global tile alone), (side / patch)² x
    pixel_shuffle_ratio² ``<|patch|>`` tokens (144 at 336 / 14, ratio 0.5)."""
    v = config.vision_config
    return one_tile(config, "image", (side(v.image_size) // side(v.patch_size)) ** 2
                    // int(round(1.0 / float(v.pixel_shuffle_ratio) ** 2)))


class Llama4(Family):
    name = "llama4"
    supports = ("image",)
    processor_class = "Llama4Processor"
    model_types = ("llama4",)
    towers = {"llama4": (Tower("vision_model", ("image",), llama4_dummy),)}
    model_inputs = ("pixel_values",)
    own_loading = ("image",)
    layer_masks = True
    settings_class: ClassVar[type] = Llama4Settings

    def __init__(self, kinds: tuple[str, ...], settings: Llama4Settings):
        super().__init__(kinds)
        self.s = settings

    def media_token(self, kind: str) -> str:
        return self.s.image_token

    def run_tokens(self) -> dict[str, str]:
        return {"image": PATCH}

    def special_tokens(self) -> list[str]:
        return list(dict.fromkeys([self.s.image_token, IMAGE_START, IMAGE_END, PATCH, TILE_X, TILE_Y, IMAGE]))

    def expand(self, kind: str, info: Any, part: Any, record: RecordMedia) -> Expansion:
        rows, columns = tile_grid(info.height, info.width, self.s)
        return Expansion(image_pieces(rows, columns, self.s.tokens_per_tile))

    def settings(self) -> dict[str, Any]:
        return asdict(self.s)

    # ---------------------------------------------------------------- loader hooks (train time)

    def image_inputs(self, image_processor: Any, pictures: list[Any], spans: list[dict[str, Any]], check: Any) -> dict[str, Any]:
        """``pixel_values`` ``[tiles, 3, size, size]`` of a batch's images (each image's tiles, then its global tile), in
        scatter order; every image's features checked against its span."""
        enc = image_processor(images=pictures, return_tensors="pt")
        pixels = enc["pixel_values"]
        per_tile = (pixels.shape[-2] // self.s.patch_size) * (pixels.shape[-1] // self.s.patch_size) \
            // int(round(1.0 / (self.s.pixel_shuffle_ratio**2)))
        by = f"{type(image_processor).__name__} (patch {self.s.patch_size}, pixel shuffle {self.s.pixel_shuffle_ratio:g})"
        for m, (rows, columns) in zip(spans, enc["aspect_ratios"].tolist(), strict=True):
            check(m, tiles_of(rows, columns) * per_tile, by)
        return {"pixel_values": pixels}

    def attention_masks(self, cu: list[Any], segment: Any, position: Any, attention: str, *, base: Any, mask_dtype: Any,
                        device: Any, model_config: Any, **_: Any) -> dict[str, Any]:
        """The batch's ``attention_mask`` for ``Llama4TextModel``: one mask per layer type (see the module docstring),
        in the form ``attention`` names (``cu``: each row's segment boundaries, padding excluded; ``segment`` /
        ``position``: ``[B, L]``, padding included; ``base``: the collator's own mask, causal within segments: the
        full-attention layers'). ``ValueError`` where packed rows cannot equal each record alone."""
        from packer.modeling import masks

        if model_config is None:
            raise ValueError("Llama 4's chunked-attention layers need the model's attention_chunk_size and its NoPE "
                             "layers' temperature tuning: pass PackedCollator(model_config=model.config, ...)")
        config = getattr(model_config, "text_config", model_config)
        check_temperature_tuning(cu, config)
        chunk = getattr(config, "attention_chunk_size", None)
        types = set(getattr(config, "layer_types", None) or ["full_attention"])
        length = segment.shape[-1]
        if attention in ("varlen", "position_ids"):
            if "chunked_attention" in types and length > chunk:
                raise ValueError(
                    f"attention={attention!r} cannot isolate Llama 4's chunked-attention layers: the flattened batch is "
                    f"{length} tokens, over attention_chunk_size {chunk}, and one set of sequence boundaries reaches every "
                    f"layer, so the chunked layers cannot get their own (transformers' flash path refuses it too). Use "
                    f"attention='sdpa', 'eager' or 'flex', which take a mask per layer type")
            return {}
        out = {}
        for kind in sorted(types):
            if kind == "full_attention" and base is not None:
                out[kind] = base
                continue
            seg = segment if kind == "full_attention" else chunk_segments(segment, position, chunk)
            if attention == "flex":
                out[kind] = masks.block_mask(seg, device)
            else:
                allowed = masks.allowed(seg)
                out[kind] = allowed if attention == "sdpa" else masks.additive(allowed, mask_dtype)
        return {"attention_mask": out}


def chunk_segments(segment: Any, position: Any, chunk: int) -> Any:
    """Per token, a number shared by the tokens of one (segment, position // chunk): causal attention within these
    is chunked attention within each segment, chunks counted from the segment's first token."""
    import torch

    key = segment * (int(position.max()) // chunk + 1) + torch.div(position, chunk, rounding_mode="floor")
    change = torch.ones_like(key, dtype=torch.long)
    change[:, 1:] = (key[:, 1:] != key[:, :-1]).long()
    return change.cumsum(-1) - 1


def check_temperature_tuning(cu: list[Any], config: Any) -> None:
    """Refuse a batch whose NoPE layers' query scales (``attn_temperature_tuning``, computed from row positions) would
    differ from each record's alone: a row of two or more segments whose last token sits at row position
    ``floor_scale - 1`` or later (a segment starting at s > 0 gets scale floor((r + 1) / F) at row position r, alone
    floor((r - s + 1) / F): equal for all its tokens exactly while r + 1 < F)."""
    no_rope = [i for i, use in enumerate(getattr(config, "no_rope_layers", None) or []) if not use]
    if not (getattr(config, "attn_temperature_tuning", False) and no_rope):
        return
    floor = int(config.floor_scale)
    for row, bounds in enumerate(cu):
        bounds = [int(b) for b in bounds]
        if len(bounds) > 2 and bounds[-1] >= floor:
            raise ValueError(
                f"Llama 4's NoPE layers ({len(no_rope)} of them) scale queries by row position (attn_temperature_tuning, "
                f"floor_scale {floor}), which no input resets per packed segment: row {row} packs {len(bounds) - 1} "
                f"segments into {bounds[-1]} tokens, so a segment after the first reaches row position "
                f"{floor - 1} or later, where its scale differs from the record's alone. Pack rows of at most "
                f"{floor - 1} tokens (--max-length), or train with attn_temperature_tuning=False (records shorter than "
                f"{floor - 1} tokens get scale 1 alone either way)")
