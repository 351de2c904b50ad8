"""The collator a build and a model imply, and the refusal of one that contradicts them.

A build knows its family (``manifest.json``: name, processor class, settings, kinds, placeholder ids), the
processor checkpoint it was counted with (``--processor``) and its row lengths; a model knows its attention
implementation, its rope and its family (``config.model_type``). :func:`collator_for_build` derives every
collator argument from them -- ``PackedCollator.for_build(ds, model=model)`` -- and :func:`check_collator`
refuses a collator (a user's own) or a model that contradicts them, naming the value, the expected value and
the fix. ``PackedTrainer`` runs both, so no piece can be forgotten:

================  ==================================================================================
attention         the model's implementation (``sdpa``, ``eager``, ``flex``, ``varlen`` for flash kernels)
rope              the family's (``mrope`` for Qwen families); for a generic build, ``mrope`` where the
                  model's rope config has an ``mrope_section`` (Qwen2-VL / 2.5-VL / Omni)
family            the build's
processor         the build's ``--processor`` checkpoint, loaded with ``AutoProcessor`` (no remote code)
tokens_per_second the model's ``vision_config.tokens_per_second`` (Qwen2.5-VL's time-scaled mRoPE)
model_config      the model's config (masks per layer type, dummy media)
dummy_media       on under ``torch.distributed`` with more than one rank (see :mod:`packer.loader.dummy`)
row_lengths       the build's ``--row-lengths``
================  ==================================================================================
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from packer.families import Family, family_of_model
from packer.loader.checks import check_attention, default_attention, model_rope


def build_family(ds) -> Family | None:
    """The build's named family, rebuilt from its manifest record (:meth:`Family.from_record`); None for a generic
    build (the model, not the family, then decides rope and model inputs) or one that records none."""
    manifest = getattr(ds, "manifest", None)
    family = manifest.family if manifest is not None else Family.from_record(ds.family) if ds.family else None
    return None if family is None or family.is_generic else family


def media_kinds(ds) -> list[str]:
    """The media kinds the build's packed samples hold (its ``samples_by_modality``), of those it declares."""
    family = ds.family or {}
    declared = family.get("modalities") or ds.manifest.config.get("modalities") or ()
    held = ds.manifest.stats.get("samples_by_modality")
    if held is not None:
        held = {k for modality in held for k in modality.split("+")}
        declared = [k for k in declared if k in held]
    return [k for k in declared if ds.manifest.placeholder_id(k) is not None]


def load_build_processor(ds) -> Any:
    """The processor the build was counted with (its ``--processor``), loaded without running checkpoint code."""
    name = ds.manifest.config.get("processor") or ""
    family = build_family(ds)
    if not name:
        raise ValueError(f"{ds.out}: the build records no --processor to load (its {', '.join(media_kinds(ds))} were "
                         f"counted by {'family ' + family.name if family else 'the generic policies'}): pass "
                         f"PackedCollator.for_build(ds, model=model, processor=AutoProcessor.from_pretrained(CHECKPOINT))")
    from transformers import AutoProcessor

    try:
        return AutoProcessor.from_pretrained(name, trust_remote_code=False)
    except Exception as e:  # noqa: BLE001 -- a folder that moved, a hub id without a network
        where = "a folder that is not here" if not Path(name).exists() and not name.count("/") == 1 else name
        raise ValueError(f"cannot load the build's processor {name!r} ({where}): {type(e).__name__}: {e}. Pass the "
                         f"processor of that checkpoint: PackedCollator.for_build(ds, model=model, processor=...)") from None


def collator_for_build(cls, ds, model=None, *, processor=None, **overrides: Any):
    """``cls.of(...)`` with every argument the build and the model imply (module docstring); ``overrides`` win and are
    checked like a user's collator (:func:`check_collator`)."""
    named = build_family(ds)
    check_model(ds, model, named)
    kinds = media_kinds(ds)
    if processor is None and kinds:
        processor = load_build_processor(ds)
    args: dict[str, Any] = {"family": ds.family, "processor": processor, "row_lengths": getattr(ds, "row_lengths", None)}
    if model is not None:
        args["attention"] = default_attention(model)
        args["model_config"] = model.config
        if named is None:
            args["rope"] = model_rope(model)
            vision = getattr(model.config, "vision_config", None)
            if args["rope"] == "mrope" and "video" in kinds and getattr(vision, "tokens_per_second", None):
                args["tokens_per_second"] = vision.tokens_per_second  # Qwen2.5-VL's time-scaled video positions
    if overrides.get("pad_to") is not None or overrides.get("pad_to_multiple_of") is not None:
        args.pop("row_lengths")
    args.update(overrides)
    collator = compose(cls, args)
    check_collator(collator, ds, model, model_checked=True)
    return collator


def compose(cls, args: dict[str, Any]):
    """``cls.of(...)``: the collator's pieces (:mod:`packer.loader.options`) built from ``args``, the constructor's
    keyword arguments, each piece validating its own (in the constructor's order: text, family, media)."""
    from packer.loader.options import FAMILY_ARGS, MEDIA_ARGS, TEXT_ARGS, FamilyOptions, MediaOptions, TextOptions

    unknown = sorted(set(args) - {*TEXT_ARGS, *FAMILY_ARGS, *MEDIA_ARGS, "dummy_media"})
    if unknown:
        raise TypeError(f"{cls.__name__}.for_build() got an unexpected keyword argument {unknown[0]!r}")
    text = TextOptions(**{k: args[k] for k in TEXT_ARGS if k in args})
    family = FamilyOptions.of(**{k: args[k] for k in FAMILY_ARGS if k in args}, processor=args.get("processor"))
    media = MediaOptions(**{k: args[k] for k in MEDIA_ARGS if k in args})
    return cls.of(text, family, media, dummy_media=args.get("dummy_media"))


def row_keys(ds, family: Family | None) -> list:
    """Each packed row's key under ``family``'s row constraint (:meth:`packer.families.Family.row_key`; None for a
    row that mixes with anything), from the stored spans (no pixel loaded); [] where the family has none."""
    if family is None or not family.keys_rows:
        return []
    out = []
    for spans in ds.column("media").to_pylist():
        keys = family.row_keys(spans)
        out.append(keys[0] if len(keys) == 1 else None if not keys else tuple(keys))
    return out


def check_batches(ds, batch_size: int, fix: str = "use batch_size=1 (per_device_train_batch_size=1; each packed row is "
                                                   "already full)") -> None:
    """Refuse ``batch_size`` > 1 rows a batch where the build's rows carry different row keys (the model class
    takes a batch's items in one call: LLaVA-OneVision's videos of one frame count); ``fix`` ends the message."""
    if batch_size < 2:
        return
    family = build_family(ds)
    keys = {k for k in row_keys(ds, family) if k is not None}
    if len(keys) > 1:
        reason = family.row_key_reason(sorted(keys, key=str))
        raise ValueError(f"batch_size={batch_size}: the build's rows hold {reason}, so rows of two keys cannot share a "
                         f"batch: {fix}")


def text_only(model) -> bool:
    """``model`` is given and no family declares towers for it (a text model: no pixel could reach it)."""
    if model is None:
        return False
    from packer.loader.dummy import towers

    return not towers(model)


def check_model(ds, model, named: Family | None = None) -> None:
    """Refuse a model of another family than the build's (``named``: :func:`build_family`, where the caller has
    it), or without the towers its media need."""
    if model is None:
        return
    named = named or build_family(ds)
    of_model = family_of_model(model)
    model_type = getattr(model.config, "model_type", "?")
    if named is not None and of_model is not None and of_model.name != named.name and named.name != "hf":
        raise ValueError(f"{type(model).__name__} ({model_type}) is family {of_model.name}'s model, but the build was made "
                         f"for family {named.name} ({named.processor_class}): load a {named.name} model, or "
                         f"rebuild with --family {of_model.name} and its processor")
    if named is None and of_model is not None and not of_model.is_generic and media_kinds(ds):
        raise ValueError(f"{type(model).__name__} ({model_type}) is family {of_model.name}'s model, but the build counted "
                         f"its media with the generic policies: rebuild with --family {of_model.name} --processor "
                         f"CHECKPOINT so its counts are the processor's")
    if media_kinds(ds) and of_model is None and named is not None and named.name != "hf":
        raise ValueError(f"{type(model).__name__} ({model_type}) has no media towers packer knows, but the build holds "
                         f"{', '.join(media_kinds(ds))} for family {named.name}: load the family's model class "
                         f"({', '.join(named.model_types)})")


def check_collator(collator, ds, model=None, *, model_checked: bool = False) -> None:
    """Refuse a collator that contradicts the build (another family, no media step for a media build, another
    rope) or the model (a mask form its attention ignores, another family, another rope). ``model_checked``: the
    caller has run :func:`check_model` on this build and model already (:func:`collator_for_build`, before it
    loads a processor), so it is not run again."""
    named = build_family(ds)
    kinds = media_kinds(ds)
    if kinds and text_only(model):  # the cause whatever the collator: no tower could take these media
        raise ValueError(f"the build holds {', '.join(kinds)} but {type(model).__name__} "
                         f"({getattr(model.config, 'model_type', '?')}) has no media tower: it would train on their "
                         f"placeholder ids as text, with no pixel or feature. Load the model class the build was made "
                         f"for, or rebuild text only (modalities = [] or --modalities '', media records quarantined)")
    have = collator.family.name if collator.family is not None else None
    if named is not None and have != named.name:
        raise ValueError(f"the collator's family is {have!r} but the build's is {named.name!r}: use "
                         f"PackedCollator.for_build(ds, model=model), or pass family=ds.family")
    if kinds and collator.media_step is None:
        raise ValueError(f"the build holds {', '.join(kinds)} but the collator loads no media (no processor): the model "
                         f"would train on placeholders without pixels. Use PackedCollator.for_build(ds, model=model), or "
                         f"pass processor=... (the checkpoint the build was made from)")
    expected = named.rope if named is not None else (model_rope(model) if model is not None else None)
    if expected is not None and collator.rope != expected:
        raise ValueError(f"the collator's rope is {collator.rope!r} but {'the build family' if named else 'the model'} "
                         f"takes {expected!r} positions: leave rope out (PackedCollator.for_build(ds, model=model) "
                         f"derives it)")
    if model is not None:
        if not model_checked:
            check_model(ds, model, named)
        check_attention(model, collator.attention)
