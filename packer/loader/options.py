"""The collator's arguments, grouped by the piece of the batch they drive; each piece validates its own.

:class:`~packer.loader.PackedCollator` takes a long flat list of keyword arguments (the documented call). They
belong to three pieces, which it builds and composes (``PackedCollator.of``; ``PackedCollator.for_build`` derives
each from the build and the model):

==========================  ===============================================================================
:class:`TextOptions`        the pure text batch (:func:`packer.loader.text_batch.text_batch`): ``attention``,
                            ``pad_to``, ``pad_to_multiple_of``, ``pad_token_id``, ``loss``, ``mask_dtype``,
                            ``device``, ``row_lengths``
:class:`FamilyOptions`      what the build's family decides: ``family``, ``rope``, ``tokens_per_second``,
                            ``model_config`` (masks per layer type, dummy media), checked against ``processor``
:class:`MediaOptions`       the media step (:class:`packer.loader.media.MediaStep`): ``processor``,
                            ``image_processor``, ``feature_extractor``, ``video_processor``, ``patch_size``,
                            ``image_embeddings``, ``audio_features``, ``video_policy``
==========================  ===============================================================================

``dummy_media`` (every tower runs on every data-parallel rank) is resolved from the family piece by the collator.
Kept apart so a piece can be read and tested on its own, and the text batch never sees a family or a processor.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from packer.families import Family, families_of_processor
from packer.loader.media import MediaStep
from packer.loader.text_batch import ATTENTION, text_batch
from packer.modeling.mrope import mrope_positions

LOSSES = ("token", "sample", "sqrt")
ROPES = ("default", "mrope")


@dataclass(frozen=True)
class TextOptions:
    """The text batch's arguments: attention form, padding, loss weights, mask dtype and device."""

    attention: str = "sdpa"
    pad_to: int | None = None
    pad_to_multiple_of: int | None = None
    pad_token_id: int = 0
    loss: str = "token"
    mask_dtype: torch.dtype = torch.float32
    device: str | torch.device = "cpu"
    # A build's fixed row lengths (--row-lengths): each batch padded to the smallest that holds it, so a
    # compiled model sees a few shapes; flattened batches to one of them times the rows. Kept sorted.
    row_lengths: list[int] | None = None

    def __post_init__(self) -> None:
        if self.attention not in ATTENTION:
            raise ValueError(f"attention must be one of {', '.join(ATTENTION)}, got {self.attention!r}")
        if self.loss not in LOSSES:
            raise ValueError(f"loss must be token, sample or sqrt, got {self.loss!r}")
        for name, value in (("pad_to", self.pad_to), ("pad_to_multiple_of", self.pad_to_multiple_of)):
            if value is not None and value < 1:
                raise ValueError(f"{name} must be positive, got {value}")
        if self.row_lengths is not None and (self.pad_to is not None or self.pad_to_multiple_of is not None):
            raise ValueError("row_lengths fixes the padded lengths: give it without pad_to / pad_to_multiple_of")
        object.__setattr__(self, "row_lengths", sorted(int(x) for x in self.row_lengths) if self.row_lengths else None)

    def length(self, n: int, grow: bool = False, rows: int = 1) -> int:
        """The padded length of a batch whose longest row (or, flattened, all ``rows`` together) needs ``n``
        positions; ``grow``: may exceed ``pad_to`` / the longest row length (dummy media's few positions)."""
        if self.row_lengths is not None:
            fits = [x * rows for x in self.row_lengths if x * rows >= n]
            if fits:
                return fits[0]
            if not grow:
                raise ValueError(f"a batch needs {n} positions, more than the longest row length {self.row_lengths[-1]} "
                                 f"x {rows} row(s): these rows are not from the build whose row_lengths these are")
            return n
        if self.pad_to is not None:
            if n > self.pad_to and not grow:
                raise ValueError(f"a batch needs {n} positions but pad_to is {self.pad_to}; raise pad_to")
            n = max(n, self.pad_to)
        if self.pad_to_multiple_of:
            n = -(-n // self.pad_to_multiple_of) * self.pad_to_multiple_of
        return n

    def batch(self, rows: list[dict[str, Any]], length: int, tree=None):
        """:func:`~packer.loader.text_batch.text_batch` of ``rows`` at ``length`` under these options."""
        return text_batch(rows, length, pad_token_id=self.pad_token_id, attention=self.attention, loss=self.loss,
                          tree=tree, mask_dtype=self.mask_dtype, device=self.device, row_lengths=self.row_lengths)


@dataclass(frozen=True)
class FamilyOptions:
    """What the build's family decides: its rebuilt :class:`~packer.families.Family` (None: no family given), the
    rope, mRoPE's ``tokens_per_second``, the model's config and the placeholder ids. Build it with :meth:`of`,
    which checks the arguments against the family and the processor."""

    family: Family | None = None
    rope: str = "default"
    tokens_per_second: float | None = None
    model_config: Any = None  # the model's config, for a family whose masks depend on it (Llama 4)
    run_ids: dict[str, int] = field(default_factory=dict)  # the build's placeholder ids, by kind
    # 3-D positions: the family's (Qwen3-Omni's TMRoPE), Qwen2-VL's mRoPE by default
    positions: Callable[..., Any] = mrope_positions
    untimed: bool = False  # a time-scaled (Qwen2.5-VL) processor under mRoPE without tokens_per_second

    @property
    def named(self) -> Family | None:
        """The family where it is a named one; a generic build's leaves rope, processor and model inputs to the caller
        and the model (None)."""
        return self.family if self.family is not None and not self.family.is_generic else None

    @classmethod
    def of(cls, family: dict[str, Any] | None = None, *, rope: str | None = None, tokens_per_second: float | None = None,
           model_config: Any = None, processor: Any = None) -> FamilyOptions:
        """From the build's family record (``ds.family``: its manifest record and placeholder ids), rebuilt once;
        refuses a rope the family contradicts, a processor of another family, or ``tokens_per_second`` where the
        positions are not time-scaled mRoPE."""
        rebuilt = Family.from_record(family) if family else None
        named = rebuilt if rebuilt is not None and not rebuilt.is_generic else None
        if named is not None:
            if rope is not None and rope != named.rope:
                raise ValueError(f"rope={rope!r} contradicts family {named.name}, whose model takes {named.rope!r} "
                                 f"positions: leave rope out (the family decides it)")
            rope = named.rope
        rope = rope or "default"
        check_processor(processor, named)
        if rope not in ROPES:
            raise ValueError(f"rope must be default or mrope, got {rope!r}")
        timed_processor = "second_per_grid_ts" in (getattr(processor, "model_input_names", None) or ())
        if tokens_per_second is not None:
            if rope != "mrope":
                raise ValueError(f"tokens_per_second={tokens_per_second} time-scales mRoPE video positions: "
                                 f"use it with rope='mrope' (Qwen2.5-VL)")
            if tokens_per_second <= 0:
                raise ValueError(f"tokens_per_second must be positive, got {tokens_per_second}")
            if processor is not None and not timed_processor and not (named and named.own_positions):
                raise ValueError(f"tokens_per_second is Qwen2.5-VL's time-scaled mRoPE, but {type(processor).__name__} "
                                 f"takes no second_per_grid_ts: leave tokens_per_second out for Qwen2-VL")
        run_ids = {k: v for k, v in (family or {}).get("run_ids", {}).items() if v is not None}
        return cls(family=rebuilt, rope=rope, tokens_per_second=tokens_per_second, model_config=model_config,
                   run_ids=run_ids, positions=named.positions if named is not None else mrope_positions,
                   untimed=timed_processor and tokens_per_second is None and rope == "mrope")

    def replace(self, **changes: Any) -> FamilyOptions:
        """A copy with ``changes`` (unchecked: the collator's ``family`` / ``rope`` setters)."""
        return dataclasses.replace(self, **changes)


@dataclass(frozen=True)
class MediaOptions:
    """The media step's arguments: a ``processor`` (or its parts), stored ``image_embeddings`` /
    ``audio_features``, the patch size and the build's ``video_policy``."""

    processor: Any = None
    image_processor: Any = None
    feature_extractor: Any = None
    video_processor: Any = None
    patch_size: int | None = None
    image_embeddings: Any = None
    audio_features: Any = None
    video_policy: Any = None

    def step(self, family: FamilyOptions) -> MediaStep | None:
        """The :class:`~packer.loader.media.MediaStep` these give under ``family`` (time-scaled where it has
        ``tokens_per_second``); None where they load nothing."""
        step = MediaStep(image_processor=self.image_processor, feature_extractor=self.feature_extractor,
                         processor=self.processor, patch_size=self.patch_size, image_embeddings=self.image_embeddings,
                         audio_features=self.audio_features, video_processor=self.video_processor,
                         video_policy=self.video_policy, timed=family.tokens_per_second is not None, family=family.named)
        return step if step.enabled else None


def check_processor(processor: Any, family: Family | None) -> None:
    """Refuse a processor of a named family without that family (the README's old snippet: a Qwen3-VL processor
    and no ``family=`` gives no ``mm_token_type_ids`` and Qwen2-VL's video positions) or with another family."""
    if processor is None:
        return
    owners = families_of_processor(processor)
    if family is None and owners:
        raise ValueError(f"processor {type(processor).__name__} is family {' / '.join(owners)}'s, but the collator has no "
                         f"family: its model inputs and positions would be Qwen2-VL's generic ones. Use "
                         f"PackedCollator.for_build(ds, model=model) (the build's family), or pass family=ds.family")
    if family is not None and owners and family.name not in owners and family.name != "hf":
        raise ValueError(f"processor {type(processor).__name__} is family {' / '.join(owners)}'s, but family is "
                         f"{family.name!r} (the build's): give the processor of the checkpoint the build was made from "
                         f"({family.processor_class}), or rebuild with --family {owners[0]}")


TEXT_ARGS = tuple(f.name for f in dataclasses.fields(TextOptions))
FAMILY_ARGS = ("family", "rope", "tokens_per_second", "model_config")
MEDIA_ARGS = tuple(f.name for f in dataclasses.fields(MediaOptions))
