"""Gemma 3: images, token for token with ``Gemma3Processor`` (``Gemma3ImageProcessor``).

The template writes ``<start_of_image>`` for an image; the processor replaces it with
``\\n\\n<start_of_image>`` + ``<image_soft_token>`` x ``image_seq_length`` + ``<end_of_image>\\n\\n``
whatever the image's size (the vision tower sees it resized to a square and pools it to
``image_seq_length`` tokens). The ``\\n\\n`` merge with the text around them when tokenized: the
encoder replaces strings before tokenizing, as the processor does.

Pan and scan (``do_pan_and_scan``): an image whose long side is at least
``pan_and_scan_min_ratio_to_activate`` times its short side is also cut into 2 to
``pan_and_scan_max_num_crops`` crops along the long side (about one per aspect-ratio unit,
each at least ``pan_and_scan_min_crop_size`` px), and the replacement becomes::

    Here is the original image {seq} and here are some crops to help you see better {seq} {seq} ...

with one ``{seq}`` (the sequence above) per crop. The settings are ``Gemma3Processor``'s
``images_kwargs`` (pan and scan off), which the processor passes to its image processor at
every call: the values a checkpoint's ``image_processor`` section holds never reach it, so
they are not read here either; turn pan and scan on with ``--processor-options
do_pan_and_scan=true`` exactly when training calls the processor with ``do_pan_and_scan=True``.

What the model takes: ``pixel_values`` (each image, then its crops), ``token_type_ids`` (1 on
``<image_soft_token>``). Image tokens attend to every token of their own image, in both
directions, in every layer (transformers #38080): :meth:`Gemma3.mask_layout`.
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


@dataclass(frozen=True)
class Gemma3Settings:
    """``Gemma3Processor``'s defaults: ``image_seq_length`` (the checkpoint's ``processor_config.json``
    holds it) and its ``images_kwargs``; the tokens its tokenizer declares (``boi_token`` ...)."""

    image_seq_length: int = 256
    do_pan_and_scan: bool = False
    pan_and_scan_min_crop_size: int = 256
    pan_and_scan_max_num_crops: int = 4
    pan_and_scan_min_ratio_to_activate: float = 1.2
    boi_token: str = "<start_of_image>"
    image_token: str = "<image_soft_token>"
    eoi_token: str = "<end_of_image>"

    def __post_init__(self):
        setting_bounds.check(self, "gemma3")

    @classmethod
    def resolve(cls, checkpoint: Checkpoint, options: str = "") -> Gemma3Settings:
        found: dict[str, Any] = {}
        if checkpoint.processor.get("image_seq_length") is not None:
            found["image_seq_length"] = int(checkpoint.processor["image_seq_length"])
        found.update(parse_params("gemma3", options, cls, what="processor option"))
        settings = cls(**found)
        if settings.image_seq_length < 1:
            raise ConfigError(f"gemma3: image_seq_length must be positive, got {settings.image_seq_length}")
        return settings


def pan_and_scan_crops(height: int, width: int, s: Gemma3Settings) -> int:
    """The number of crops ``Gemma3ImageProcessor.pan_and_scan_batched`` cuts an image of this size into."""
    if not s.do_pan_and_scan:
        return 0
    if width >= height:
        if width / height < s.pan_and_scan_min_ratio_to_activate:
            return 0
        across = int(math.floor(width / height + 0.5))
        across = min(int(math.floor(width / s.pan_and_scan_min_crop_size)), across)
        across = min(s.pan_and_scan_max_num_crops, max(2, across))
        down = 1
    else:
        if height / width < s.pan_and_scan_min_ratio_to_activate:
            return 0
        down = int(math.floor(height / width + 0.5))
        down = min(int(math.floor(height / s.pan_and_scan_min_crop_size)), down)
        down = min(s.pan_and_scan_max_num_crops, max(2, down))
        across = 1
    if min(int(math.ceil(width / across)), int(math.ceil(height / down))) < s.pan_and_scan_min_crop_size:
        return 0
    return across * down


def gemma3_dummy(config, kind: str) -> Dummy:
    """One image of the tower's size (SigLIP's fixed square), pooled to ``mm_tokens_per_image`` (256)."""
    from packer.families.towers import one_tile

    return one_tile(config, "image", int(config.mm_tokens_per_image))


class Gemma3(Family):
    name = "gemma3"
    supports = ("image",)
    processor_class = "Gemma3Processor"
    model_types = ("gemma3",)
    towers = {"gemma3": (Tower("model.vision_tower", ("image",), gemma3_dummy),)}
    model_inputs = ("token_type_ids", "pixel_values")
    per_token_inputs = ("token_type_ids",)
    own_loading = ("image",)
    layer_masks = True
    settings_class: ClassVar[type] = Gemma3Settings
    block_kinds: ClassVar[tuple[str, ...]] = ("image",)  # runs attended bidirectionally (see mask_layout)

    def __init__(self, kinds: tuple[str, ...], settings: Gemma3Settings):
        super().__init__(kinds)
        self.s = settings

    def media_token(self, kind: str) -> str:
        return self.s.boi_token

    def run_tokens(self) -> dict[str, str]:
        return {"image": self.s.image_token}

    def special_tokens(self) -> list[str]:
        return [self.s.boi_token, self.s.image_token, self.s.eoi_token]

    def expand(self, kind: str, info: Any, part: Any, record: RecordMedia) -> Expansion:
        s = self.s
        crops = pan_and_scan_crops(info.height, info.width, s)
        sequence = ["\n\n", s.boi_token, Run(s.image_token, s.image_seq_length), s.eoi_token, "\n\n"]
        if not crops:
            return Expansion(tuple(sequence))
        pieces: list[str | Run] = ["Here is the original image ", *sequence,
                                   " and here are some crops to help you see better "]
        for k in range(crops):
            pieces += [" "] * (k > 0) + sequence
        return Expansion(tuple(pieces), extra={"crops": crops})

    def settings(self) -> dict[str, Any]:
        return asdict(self.s)

    # ---------------------------------------------------------------- attention

    def mask_layout(self, model_config: Any) -> dict[str, dict[str, Any]]:
        """Per layer type of the model, its mask: ``window`` (a sliding window, or None) and ``blocks``
        (whether image tokens attend within their image both ways). Gemma 3's
        ``create_masks_for_vision_model``: every layer, OR(causal, same image), sliding layers
        AND the window."""
        text = model_config.get_text_config() if hasattr(model_config, "get_text_config") else model_config
        if getattr(text, "use_bidirectional_attention", False):
            raise ValueError("the Gemma 3 text config has use_bidirectional_attention=True (an embedding model, every "
                             "token attends both ways): packed causal training does not apply to it")
        return {t: {"window": _window(text, t), "blocks": True} for t in dict.fromkeys(text.layer_types)}

    def attention_masks(self, cu: list[Any], segment: Any, position: Any, attention: str, *, base: Any, mask_dtype: Any,
                        device: Any, model_config: Any, input_ids: Any = None, run_ids: Any = None, **_: Any) -> dict:
        """The collator's hook: ``attention_mask`` as one mask per layer type (:meth:`mask_layout`)."""
        return gemma_attention_masks(self, segment, attention, mask_dtype=mask_dtype, device=device,
                                     model_config=model_config, input_ids=input_ids, run_ids=run_ids or {})

    # ---------------------------------------------------------------- loader hooks (train time)

    def row_inputs(self, input_ids: Any, run_ids: dict[str, int]) -> dict[str, Any]:
        """``token_type_ids``: 1 on image placeholders, what ``Gemma3Processor`` returns."""
        import torch

        types = torch.zeros_like(input_ids)
        if "image" in run_ids:
            types[input_ids == run_ids["image"]] = 1
        return {"token_type_ids": types}

    def image_inputs(self, image_processor: Any, pictures: list[Any], spans: list[dict[str, Any]], check: Any) -> dict:
        """``pixel_values`` of a batch's images, each followed by its pan-and-scan crops, made with the
        build's pan-and-scan settings (what ``Gemma3Processor`` passes its image processor)."""
        s = self.s
        enc = image_processor(images=pictures, do_pan_and_scan=s.do_pan_and_scan,
                              pan_and_scan_min_crop_size=s.pan_and_scan_min_crop_size,
                              pan_and_scan_max_num_crops=s.pan_and_scan_max_num_crops,
                              pan_and_scan_min_ratio_to_activate=s.pan_and_scan_min_ratio_to_activate,
                              return_tensors="pt")
        by = f"{type(image_processor).__name__} (pan and scan {'on' if s.do_pan_and_scan else 'off'}, " \
             f"{s.image_seq_length} tokens an image, family {self.name})"
        for m, crops in zip(spans, list(enc["num_crops"]), strict=True):
            check(m, (1 + int(crops)) * s.image_seq_length, by)
        return {"pixel_values": enc["pixel_values"]}


def gemma_attention_masks(family: Any, segment: Any, attention: str, *, mask_dtype: Any, device: Any, model_config: Any,
                          input_ids: Any, run_ids: dict[str, int]) -> dict[str, Any]:
    """``{"attention_mask": {layer_type: mask}}`` for a Gemma model: its ``mask_layout``, the family's ``block_kinds``
    runs as the bidirectional blocks. ``ValueError`` for the flattened forms and without the model's config."""
    from packer.modeling import masks

    if attention in ("varlen", "position_ids"):
        raise ValueError(f"attention={attention!r} cannot express family {family.name}'s masks: its image tokens attend "
                         f"to later tokens of their own image, which flash-attention kernels cannot do (its model class "
                         f"refuses flash attention), and its sliding-window layers differ from its full ones; use "
                         f"attention='sdpa', 'eager' or 'flex'")
    if model_config is None:
        raise ValueError(f"family {family.name} builds one attention mask per layer type (sliding windows, image tokens "
                         f"attending within their image): pass PackedCollator(model_config=model.config, ...)")
    layout = family.mask_layout(model_config)
    ids = [run_ids[k] for k in family.block_kinds if run_ids.get(k) is not None]
    blocks = masks.media_blocks(input_ids, ids) if ids and any(spec["blocks"] for spec in layout.values()) else None
    return {"attention_mask": masks.layer_masks(segment, layout, attention, blocks=blocks, mask_dtype=mask_dtype,
                                                device=device)}


def _window(text_config: Any, layer_type: str) -> int | None:
    if layer_type != "sliding_attention":
        return None
    window = getattr(text_config, "sliding_window", None)
    return int(window) if window else None
