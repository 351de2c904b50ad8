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
from packer.families import MODEL_INPUT_KEYS, Family
from packer.loader.options import FamilyOptions, MediaOptions, TextOptions
from packer.loader.text_batch import FLATTENED, concatenate
from packer.loader.text_batch import bounds as segment_bounds


class PackedCollator:
    """Packed rows -> a batch (module docstring). Its arguments form three pieces, each validating its own
    (:mod:`packer.loader.options`): the text batch's (:class:`TextOptions`), the family's (:class:`FamilyOptions`)
    and the media step's (:class:`MediaOptions`), plus ``dummy_media``. ``PackedCollator(...)`` takes them flat;
    :meth:`of` composes built pieces; :meth:`for_build` derives them from a build and a model."""

    def __init__(self, *, attention: str = "sdpa", pad_to: int | None = None, pad_to_multiple_of: int | None = None,
                 pad_token_id: int = 0, rope: str | None = None, loss: str = "token", mask_dtype: torch.dtype = torch.float32,
                 device: str | torch.device = "cpu", image_processor=None, feature_extractor=None, processor=None,
                 patch_size: int | None = None, image_embeddings=None, audio_features=None, video_processor=None,
                 video_policy=None, tokens_per_second: float | None = None, family: dict[str, Any] | None = None,
                 model_config: Any = None, dummy_media=None, row_lengths: list[int] | None = None):
        text = TextOptions(attention=attention, pad_to=pad_to, pad_to_multiple_of=pad_to_multiple_of,
                           pad_token_id=pad_token_id, loss=loss, mask_dtype=mask_dtype, device=device,
                           row_lengths=row_lengths)
        fam = FamilyOptions.of(family, rope=rope, tokens_per_second=tokens_per_second, model_config=model_config,
                               processor=processor)
        _warn_position_ids(text)
        media = MediaOptions(processor=processor, image_processor=image_processor, feature_extractor=feature_extractor,
                             video_processor=video_processor, patch_size=patch_size, image_embeddings=image_embeddings,
                             audio_features=audio_features, video_policy=video_policy)
        self._compose(text, fam, media, dummy_media)

    @classmethod
    def of(cls, text: TextOptions | None = None, family: FamilyOptions | None = None, media: MediaOptions | None = None,
           dummy_media=None) -> PackedCollator:
        """The collator composed of its pieces (each already validated by its own constructor); a piece left out
        takes its defaults. ``dummy_media`` as in the constructor."""
        text = text if text is not None else TextOptions()
        _warn_position_ids(text)
        self = cls.__new__(cls)
        self._compose(text, family if family is not None else FamilyOptions(), media if media is not None else MediaOptions(),
                      dummy_media)
        return self

    def _compose(self, text: TextOptions, family: FamilyOptions, media: MediaOptions, dummy_media) -> None:
        self.text, self.family_options, self.media_options = text, family, media
        self.media_step = media.step(family)
        # every tower runs on every data-parallel rank
        self.dummy_media = _dummies(dummy_media, family.family, family.run_ids, family.model_config)

    # the pieces' values, under the constructor's names (family and rope settable: a test's stand-in family)
    attention = property(lambda self: self.text.attention)
    pad_to = property(lambda self: self.text.pad_to)
    pad_to_multiple_of = property(lambda self: self.text.pad_to_multiple_of)
    pad_token_id = property(lambda self: self.text.pad_token_id)
    loss = property(lambda self: self.text.loss)
    mask_dtype = property(lambda self: self.text.mask_dtype)
    device = property(lambda self: self.text.device)
    row_lengths = property(lambda self: self.text.row_lengths)
    tokens_per_second = property(lambda self: self.family_options.tokens_per_second)
    model_config = property(lambda self: self.family_options.model_config)

    @property
    def family(self) -> Family | None:
        """The build's family (ds.family's record, rebuilt once); None where none was given."""
        return self.family_options.family

    @family.setter
    def family(self, value: Family | None) -> None:
        self.family_options = self.family_options.replace(family=value)

    @property
    def rope(self) -> str:
        return self.family_options.rope

    @rope.setter
    def rope(self, value: str) -> None:
        self.family_options = self.family_options.replace(rope=value)

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
            self.text.length(sum(sizes) if flat else max(sizes), rows=len(rows) if flat else 1)  # the real rows must fit
            rows, dummy_inputs = self.dummy_media.add(rows)
        n_rows = len(rows)
        if self.attention in FLATTENED:
            rows = [concatenate(rows)]
        length = self.text.length(max(int(r["n_tokens"]) for r in rows), grow=bool(dummy_inputs),
                              rows=n_rows if self.attention in FLATTENED else 1)
        text = self.text.batch(rows, length, tree)
        cu, batch, input_ids, segment, position = text.cu, len(rows), text.input_ids, text.segment, text.position
        out: dict[str, Any] = {"input_ids": input_ids, "labels": text.labels, "seq_idx": segment.to(torch.int32)}
        if family is not None and not family.is_generic:  # what it was collated for: model_inputs refuses another's model
            out["family"] = family.name
        if indices is not None:
            out["rows"] = indices  # the dataset rows of this batch (PackedDataset's index)
        out["loss_weights"] = text.loss_weights
        if family is not None:  # per-token model inputs (mm_token_type_ids, Gemma 3's token_type_ids)
            out.update(family.row_inputs(input_ids, self.family_options.run_ids))
        out["media"] = [{**m, "batch": b} for b, r in enumerate(rows) for m in r["media"]]
        real = [m for m in out["media"] if not m.get("dummy")]
        if any(r.get("segment_role") is not None for r in rows):
            out["responses"] = trees.responses(rows)
        if tree is not None:
            out["segment_parent"] = [p.tolist() for p in tree]
        if self.family_options.untimed and any(m["kind"] == "video" and not m.get("dummy") for m in out["media"]):
            raise ValueError("the batch holds a video and the processor is a Qwen2.5-VL one (time-scaled mRoPE), but the "
                             "collator has no tokens_per_second: pass PackedCollator(rope='mrope', "
                             "tokens_per_second=model.config.vision_config.tokens_per_second, ...)")
        if self.media_step is not None:
            out.update(self.media_step(real))
        out.update(dummy_inputs)
        if self.rope == "mrope":
            out["position_ids"] = torch.stack([
                self.family_options.positions(length, list(zip(c[:-1].tolist(), c[1:].tolist(), strict=True)), r["media"],
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
                                                    run_ids=self.family_options.run_ids))
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


def _warn_position_ids(text: TextOptions) -> None:
    """Warn (at the caller of the collator's constructor or :meth:`PackedCollator.of`) of a mask form that
    isolates segments under flash-attention kernels only."""
    if text.attention == "position_ids":
        warnings.warn(
            "attention='position_ids' isolates packed segments only under flash-attention kernels "
            "(flash_attention_2/3); under sdpa or eager the segments attend to each other. "
            "Use attention='sdpa', 'eager' or 'flex' there.", stacklevel=3)


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
