"""Batches for every attention implementation, from packed rows.

``PackedCollator(attention=...)`` turns a list of rows (from :class:`PackedDataset`)
into tensors. Always: ``input_ids``, ``labels`` (-100 on padding and on every
segment's first token; unshifted, the HF convention), ``position_ids`` (reset to 0 at
every segment; ``[3, B, L]`` with ``rope="mrope"``), ``seq_idx`` (segment number per
token, int32, for Mamba-style layers), ``loss_weights`` and ``media``. Then the mask:

=============== ===================================================================
``sdpa``        ``attention_mask`` bool ``[B, 1, L, L]``: causal within segments
``eager``       ``attention_mask`` additive ``[B, 1, L, L]``: 0 / dtype.min
``flex``        ``attention_mask`` a FlexAttention ``BlockMask`` on ``device``
``varlen``      rows flattened to ``[1, T]``; ``cu_seqlens`` (int32), ``max_seqlen``
                and transformers' ``cu_seq_lens_q/k``, ``max_length_q/k``
``position_ids`` flattened ``[1, T]`` with positions only (like HF's
                ``DataCollatorWithFlattening``): isolates segments under
                flash-attention kernels only, never under SDPA or eager
=============== ===================================================================

With ``image_processor`` / ``feature_extractor`` / ``video_processor`` (or a ``processor``
holding them), or stored ``image_embeddings`` / ``audio_features``, the batch also holds
what the HF model classes take (``pixel_values``, ``image_grid_thw``, ``image_sizes``,
``pixel_values_videos``, ``video_grid_thw``, ``input_features``, ``feature_attention_mask``,
...), in scatter order, every count checked against its span: see :mod:`packer.loader.media`.
:func:`model_inputs` picks the keyword arguments for ``model(**...)``. A batch whose rows hold media spans
never reaches the model without their inputs: without a media step the collator gives the spans alone (for
masks and positions) and :func:`model_inputs` refuses that batch, naming the fix.
``PackedCollator.for_build(ds, model=model)`` derives every argument from the build and the model
(:mod:`packer.loader.derive`): the short path.

Videos and mRoPE: Qwen2-VL takes ``rope="mrope"``; Qwen2.5-VL also takes
``tokens_per_second=model.config.vision_config.tokens_per_second``, which time-scales the
videos' temporal positions (:mod:`packer.modeling.mrope`) and adds ``second_per_grid_ts`` to
the batch (Qwen2.5-VL's forward takes it, Qwen2-VL's does not). A Qwen2.5-VL ``processor``
with a video in the batch and no ``tokens_per_second`` is refused rather than positioned
the Qwen2-VL way. ``video_policy`` (a policy or a spec such as ``"qwen2vl:fps=1"``) names the
build's frame sampling when it is not the one the video processor implies. A family with positions of
its own (``family.positions``: Qwen3-Omni's TMRoPE) positions the rows itself; ``tokens_per_second`` is
then the model config's ``position_id_per_seconds`` where it differs from the family's.

A family whose text model takes a mask per layer type (Llama 4: chunked-attention and full-attention
layers; Gemma 3 / 4: sliding-window layers, image tokens attending within their image both ways)
builds ``attention_mask`` as ``{layer_type: mask}`` from the model's config:
``PackedCollator(family=ds.family, model_config=model.config)``; see :mod:`packer.families.llama4`
and :mod:`packer.families.gemma3`.

Padding (``pad_to``, ``pad_to_multiple_of``) forms one more segment per row that
nothing attends to or from and that attends only to itself, so no softmax row is
empty and no NaN appears. See :mod:`packer.modeling.masks` for a worked example.

Preference builds: rows of ``--preference tree`` hold trees (a response attends to its prompt,
positions continue from the prompt's end: :mod:`packer.loader.trees`; ``varlen`` /
``position_ids`` refused); rows of either layout add ``responses`` (each response's row, token
range, role, group, id and weight) for :func:`~packer.loader.packed_logps`.
"""

from __future__ import annotations

import warnings
from typing import Any

import numpy as np
import torch

import packer.loader.trees as trees
from packer.families import MODEL_INPUT_KEYS, Family, families_of_processor
from packer.loader.media import MediaStep
from packer.loader.text_batch import ATTENTION, FLATTENED, concatenate, text_batch
from packer.loader.text_batch import bounds as segment_bounds
from packer.modeling.mrope import mrope_positions


class PackedCollator:
    def __init__(self, *, attention: str = "sdpa", pad_to: int | None = None, pad_to_multiple_of: int | None = None,
                 pad_token_id: int = 0, rope: str | None = None, loss: str = "token", mask_dtype: torch.dtype = torch.float32,
                 device: str | torch.device = "cpu", image_processor=None, feature_extractor=None, processor=None,
                 patch_size: int | None = None, image_embeddings=None, audio_features=None, video_processor=None,
                 video_policy=None, tokens_per_second: float | None = None, family: dict[str, Any] | None = None,
                 model_config: Any = None, dummy_media=None, row_lengths: list[int] | None = None):
        if attention not in ATTENTION:
            raise ValueError(f"attention must be one of {', '.join(ATTENTION)}, got {attention!r}")
        # the build's family (ds.family: its manifest record and placeholder ids), rebuilt once; a generic build's
        # leaves rope, processor and model inputs to the caller and the model (``named`` None)
        self.family: Family | None = Family.from_record(family) if family else None
        named = self.family if self.family is not None and not self.family.is_generic else None
        if named is not None:
            if rope is not None and rope != named.rope:
                raise ValueError(f"rope={rope!r} contradicts family {named.name}, whose model takes {named.rope!r} "
                                 f"positions: leave rope out (the family decides it)")
            rope = named.rope
        rope = rope or "default"
        _check_processor(processor, named)
        self.model_config = model_config  # the model's config, for a family whose masks depend on it (Llama 4)
        self._run_ids = {k: v for k, v in (family or {}).get("run_ids", {}).items() if v is not None}
        if rope not in ("default", "mrope"):
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
        if loss not in ("token", "sample", "sqrt"):
            raise ValueError(f"loss must be token, sample or sqrt, got {loss!r}")
        for name, value in (("pad_to", pad_to), ("pad_to_multiple_of", pad_to_multiple_of)):
            if value is not None and value < 1:
                raise ValueError(f"{name} must be positive, got {value}")
        if row_lengths is not None and (pad_to is not None or pad_to_multiple_of is not None):
            raise ValueError("row_lengths fixes the padded lengths: give it without pad_to / pad_to_multiple_of")
        # A build's fixed row lengths (--row-lengths): each batch padded to the smallest that holds it, so a
        # compiled model sees a few shapes; flattened batches to one of them times the rows.
        self.row_lengths = sorted(int(x) for x in row_lengths) if row_lengths else None
        if attention == "position_ids":
            warnings.warn(
                "attention='position_ids' isolates packed segments only under flash-attention kernels "
                "(flash_attention_2/3); under sdpa or eager the segments attend to each other. "
                "Use attention='sdpa', 'eager' or 'flex' there.", stacklevel=2)
        self.attention, self.pad_to, self.multiple = attention, pad_to, pad_to_multiple_of
        self.pad_token_id, self.rope, self.loss = pad_token_id, rope, loss
        self.mask_dtype, self.device = mask_dtype, device
        self.tokens_per_second = tokens_per_second
        # 3-D positions: the family's (Qwen3-Omni's TMRoPE), Qwen2-VL's mRoPE by default
        self._positions = named.positions if named is not None else mrope_positions
        self._untimed = timed_processor and tokens_per_second is None and rope == "mrope"
        step = MediaStep(image_processor=image_processor, feature_extractor=feature_extractor, processor=processor,
                         patch_size=patch_size, image_embeddings=image_embeddings, audio_features=audio_features,
                         video_processor=video_processor, video_policy=video_policy, timed=tokens_per_second is not None,
                         family=named)
        self.media_step = step if step.enabled else None
        # every tower runs on every data-parallel rank
        self.dummy_media = _dummies(dummy_media, self.family, self._run_ids, model_config)

    @classmethod
    def for_build(cls, ds, model=None, *, processor=None, **overrides: Any) -> PackedCollator:
        """The collator ``ds``'s build and ``model`` imply: attention form, rope, family, the build's processor,
        the model's config, dummy media under ``torch.distributed``, row lengths (:mod:`packer.loader.derive`);
        ``overrides`` (any argument of the constructor) win where they do not contradict the build or the model."""
        from packer.loader.derive import collator_for_build

        return collator_for_build(cls, ds, model, processor=processor, **overrides)

    def check_build(self, ds, model=None) -> None:
        """Raise where this collator contradicts ``ds``'s build or ``model`` (:func:`packer.loader.derive.check_collator`)."""
        from packer.loader.derive import check_collator

        check_collator(self, ds, model)

    def _length(self, n: int, grow: bool = False, rows: int = 1) -> int:
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
        if self.multiple:
            n = -(-n // self.multiple) * self.multiple
        return n

    def __call__(self, rows: list[dict[str, Any]]) -> dict[str, Any]:
        tree = trees.parents(rows)
        family = self.family
        if tree is not None and (self.attention in FLATTENED or (family is not None and family.linear_attention)):
            raise ValueError(trees.VARLEN_REFUSAL if self.attention in FLATTENED else
                             f"family {family.name}: its linear-attention layers carry one state along a segment, "
                             f"so a branch cannot restart from its prompt; build with --preference pairs")
        if tree is not None and self.rope == "mrope" and family is not None and family.own_positions:
            raise ValueError(f"family {family.name}: its own positions (a family hook) do not position a "
                             f"preference tree's branches after their prompt; build with --preference pairs")
        if tree is not None and family is not None and family.layer_masks:
            raise ValueError(f"family {family.name}: its masks per layer type (sliding windows, image blocks) are "
                             f"built from the segments alone and would not let a tree's branch see its prompt; build "
                             f"with --preference pairs")
        dummy_inputs: dict[str, Any] = {}
        indices = [int(r["index"]) for r in rows] if all("index" in r for r in rows) else None
        if self.dummy_media is not None:  # may grow one row past pad_to by its few positions
            sizes = [int(r["n_tokens"]) for r in rows]
            flat = self.attention in FLATTENED
            self._length(sum(sizes) if flat else max(sizes), rows=len(rows) if flat else 1)  # the real rows must fit
            rows, dummy_inputs = self.dummy_media.add(rows)
        n_rows = len(rows)
        if self.attention in FLATTENED:
            rows = [concatenate(rows)]
        length = self._length(max(int(r["n_tokens"]) for r in rows), grow=bool(dummy_inputs),
                              rows=n_rows if self.attention in FLATTENED else 1)
        text = text_batch(rows, length, pad_token_id=self.pad_token_id, attention=self.attention, loss=self.loss,
                          tree=tree, mask_dtype=self.mask_dtype, device=self.device, row_lengths=self.row_lengths)
        cu, batch, input_ids, segment, position = text.cu, len(rows), text.input_ids, text.segment, text.position
        out: dict[str, Any] = {"input_ids": input_ids, "labels": text.labels, "seq_idx": segment.to(torch.int32)}
        if family is not None and not family.is_generic:  # what it was collated for: model_inputs refuses another's model
            out["family"] = family.name
        if indices is not None:
            out["rows"] = indices  # the dataset rows of this batch (PackedDataset's index)
        out["loss_weights"] = text.loss_weights
        if family is not None:  # per-token model inputs (mm_token_type_ids, Gemma 3's token_type_ids)
            out.update(family.row_inputs(input_ids, self._run_ids))
        out["media"] = [{**m, "batch": b} for b, r in enumerate(rows) for m in r["media"]]
        real = [m for m in out["media"] if not m.get("dummy")]
        if any(r.get("segment_role") is not None for r in rows):
            out["responses"] = trees.responses(rows)
        if tree is not None:
            out["segment_parent"] = [p.tolist() for p in tree]
        if self._untimed and any(m["kind"] == "video" and not m.get("dummy") for m in out["media"]):
            raise ValueError("the batch holds a video and the processor is a Qwen2.5-VL one (time-scaled mRoPE), but the "
                             "collator has no tokens_per_second: pass PackedCollator(rope='mrope', "
                             "tokens_per_second=model.config.vision_config.tokens_per_second, ...)")
        if self.media_step is not None:
            out.update(self.media_step(real))
        out.update(dummy_inputs)
        if self.rope == "mrope":
            out["position_ids"] = torch.stack([
                self._positions(length, list(zip(c[:-1].tolist(), c[1:].tolist(), strict=True)), r["media"],
                                self.tokens_per_second, **({} if tree is None else {"parents": tree[b].tolist()}))
                for b, (c, r) in enumerate(zip(cu, rows, strict=True))], dim=1)
            pad = segment == torch.as_tensor([len(c) - 1 for c in cu])[:, None]
            out["position_ids"][:, pad] = position[pad].to(out["position_ids"].dtype)
        else:
            out["position_ids"] = position
        if family is not None and family.linear_attention:
            self._linear_attention(out, cu, length, batch)
        out.update(text.attention)  # the attention form's mask or boundaries
        if family is not None and family.linear_attention and isinstance(out.get("attention_mask"), torch.Tensor):
            # a hybrid model takes one mask per layer type: ours for attention, none for the recurrent layers
            out["attention_mask"] = {"full_attention": out["attention_mask"], "linear_attention": None}
        if family is not None and family.layer_masks:  # a mask per layer type (Llama 4, Gemma)
            # cu without a trailing dummy segment (packer.loader.dummy): its results are unused
            bounds = [c[: len(c) - int(r.get("dummy_segments", 0))] for c, r in zip(cu, rows, strict=True)]
            out.update(family.attention_masks(bounds, segment, position, self.attention, base=out.get("attention_mask"),
                                                    mask_dtype=self.mask_dtype, device=self.device,
                                                    model_config=self.model_config, input_ids=input_ids,
                                                    run_ids=self._run_ids))
        return out

    def _linear_attention(self, out: dict[str, Any], cu: list[np.ndarray], length: int, batch: int) -> None:
        """Boundaries for the linear-attention layers of a hybrid model (Qwen3.5): the kernels take them
        flattened, so one row per batch (or a flattened form)."""
        if batch > 1:
            raise ValueError(f"family {self.family.name}: its linear-attention layers take segment boundaries over one "
                             f"flattened row, but the batch holds {batch} rows; use batch_size=1 (one packed row per "
                             f"step: rows are already full) or attention='varlen'")
        edges = segment_bounds(cu[0], length)
        cu_t = torch.as_tensor(edges, dtype=torch.int32)
        max_len = int(np.diff(edges).max()) if len(edges) > 1 else 0
        out.update(cu_seq_lens_q=cu_t, cu_seq_lens_k=cu_t, max_length_q=max_len, max_length_k=max_len)


def _check_processor(processor: Any, family: Family | None) -> None:
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


def _dummies(dummy_media: Any, family: Family | None, run_ids: dict[str, int], model_config: Any) -> Any:
    """The collator's dummy media: as given; ``False``: none; ``None`` (the default): on where
    ``torch.distributed`` runs more than one rank and the build declares media (a rank whose batch lacks an image
    never runs the vision tower: DDP fails, FSDP hangs), built from ``model_config``; ``True``: on."""
    if dummy_media is False:
        return None
    if dummy_media is not None and dummy_media is not True:
        return dummy_media  # a packer.loader.dummy.MediaDummies
    kinds = [k for k in (family.kinds if family is not None else ()) if k in run_ids]
    distributed = torch.distributed.is_available() and torch.distributed.is_initialized() \
        and torch.distributed.get_world_size() > 1
    if dummy_media is None and not (distributed and kinds):
        return None
    if dummy_media is None and model_config is None and (family is None or family.is_generic):
        return None  # a generic build declares every kind, text-only ones too: PackedCollator.for_build decides
    if model_config is None or not kinds:
        why = (f"torch.distributed runs {torch.distributed.get_world_size()} ranks and the build declares "
               f"{', '.join(kinds)}: a rank whose batch lacks one never runs its tower (DDP fails, FSDP hangs)"
               if dummy_media is None else "dummy_media=True")
        raise ValueError(f"{why}; the collator's dummy media are built from the model's config and the build's family: "
                         f"use PackedCollator.for_build(ds, model=model), or pass family=ds.family and "
                         f"model_config=model.config (dummy_media=False: none, at your own risk)")
    from packer.loader.dummy import media_dummies

    return media_dummies(model_config, kinds=kinds, placeholders={k: run_ids[k] for k in kinds})


def _no_media_step(spans: list[dict[str, Any]]) -> str:
    kinds = sorted({m["kind"] for m in spans})
    return (f"the batch holds {len(spans)} media span(s) ({', '.join(kinds)}) but the collator loads no media: the model "
            f"would train on placeholder tokens without ever seeing a pixel or a sample. Use "
            f"PackedCollator.for_build(ds, model=model) (the build's processor), or pass processor=... (or stored "
            f"image_embeddings / audio_features)")


# the text keys, then every registered family's declared model inputs (packer.families.MODEL_INPUT_KEYS)
MODEL_KEYS = tuple(dict.fromkeys(("input_ids", "attention_mask", "position_ids", "cu_seq_lens_q", "cu_seq_lens_k",
                                  "max_length_q", "max_length_k", *MODEL_INPUT_KEYS)))
# a media kind's spans reach the model only with one of these (InternVL scatters videos from pixel_values)
MEDIA_KEYS = {"image": ("pixel_values", "image_embeds"), "video": ("pixel_values_videos", "pixel_values"),
              "audio": ("input_features",)}


def model_inputs(batch: dict[str, Any], model=None) -> dict[str, Any]:
    """The keyword arguments for ``model(**...)`` of the HF causal-LM / VLM / audio-LM classes.
    Given the ``model``, first refuses a mask form its attention implementation would ignore
    (:func:`packer.loader.checks.check_attention`: a flattened ``varlen`` batch under SDPA).

    Leaves out what only packer uses (``labels`` -- use :func:`~packer.loader.packed_loss` -- ``media``,
    ``seq_idx``, ``loss_weights``) and ``cu_seqlens`` / ``max_seqlen``, names the
    Qwen2-VL vision tower takes as its own: the language model's varlen boundaries travel
    as ``cu_seq_lens_q/k`` and ``max_length_q/k``. ``use_cache=False``: training builds
    no KV cache. A batch whose media spans have no inputs (a collator without a processor) is refused; given the
    ``model``, so is a batch it does not fit (:func:`packer.loader.model_fit.check_batch_model`: a text model and
    media spans, a family's batch and another family's model, another placeholder id, a smaller vocabulary).
    """
    if model is not None:
        from packer.loader.checks import attention_form, check_attention
        from packer.loader.model_fit import check_batch_model

        check_attention(model, attention_form(batch))
        check_batch_model(batch, model)
    real = [m for m in batch.get("media", ()) if not m.get("dummy")]
    unfed = sorted({m["kind"] for m in real if not any(k in batch for k in MEDIA_KEYS.get(m["kind"], ()))})
    if unfed:
        raise ValueError(_no_media_step([m for m in real if m["kind"] in unfed]))
    out = {k: batch[k] for k in MODEL_KEYS if k in batch}
    out["use_cache"] = False
    return out
