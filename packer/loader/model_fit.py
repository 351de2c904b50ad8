"""Whether a batch fits the model it is about to reach, checked by ``model_inputs(batch, model)`` before the call.

Each mismatch below used to train on the wrong thing silently, or to fail deep inside the model naming no cause:

==========================================  =====================================================================
a text model, a batch with media spans      trained on the placeholder ids as text, no pixel anywhere
a family's batch, a model of another        "too many values to unpack" (3-D positions), "shape '[-1, 3, 2, 14,
                                            14]' is invalid" (another patch size)
another ``image_token_id``                  "Image features and image tokens do not match: tokens: 0, features: N"
a smaller vocabulary                        ``IndexError`` in the embedding
==========================================  =====================================================================

Each is refused with the value, the expected value and the fix.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from packer.families import family_of_model
from packer.loader.checks import model_rope


def check_batch_model(batch: dict[str, Any], model) -> None:
    """Raise ``ValueError`` where ``batch`` (a :class:`~packer.loader.PackedCollator` batch) contradicts ``model``."""
    _vocabulary(batch, model)
    _family(batch, model)
    _media(batch, model)
    _positions(batch, model)


def _name(model) -> str:
    return f"{type(model).__name__} ({getattr(model.config, 'model_type', '?')})"


def _vocabulary(batch: dict[str, Any], model) -> None:
    embeddings = model.get_input_embeddings() if hasattr(model, "get_input_embeddings") else None
    rows = getattr(embeddings, "num_embeddings", None)
    ids = batch.get("input_ids")
    if rows is None or ids is None or not ids.numel():
        return
    top = int(ids.max())
    if top >= rows:
        raise ValueError(f"the batch holds token id {top:,} but {_name(model)}'s input embeddings have {rows:,} rows "
                         f"(ids 0 to {rows - 1:,}): resize them to the build's tokenizer, "
                         f"model.resize_token_embeddings(len(ds.tokenizer())), or load the model the build was made for")


def _family(batch: dict[str, Any], model) -> None:
    family = batch.get("family")
    if not family:
        return
    of_model = family_of_model(model)
    if of_model is None or (of_model.name != family and family != "hf"):
        what = f"family {of_model.name}'s model" if of_model is not None else "a model of no media family (a text model)"
        from packer.families import FAMILIES

        raise ValueError(f"the batch was collated for family {family} but {_name(model)} is {what}: load a {family} "
                         f"model ({', '.join(FAMILIES[family].model_types) if family in FAMILIES else family}), or "
                         f"collate for this model's build (PackedCollator.for_build(ds, model))")


def _media(batch: dict[str, Any], model) -> None:
    real = [m for m in batch.get("media", ()) if not m.get("dummy")]
    if not real:
        return
    from packer.loader.dummy import towers

    kinds = Counter(m["kind"] for m in real)
    if not towers(model):
        held = ", ".join(f"{n:,} {k} span(s)" for k, n in sorted(kinds.items()))
        tokens = sum(int(m["length"]) for m in real)
        raise ValueError(f"the batch holds {held} ({tokens:,} placeholder tokens) but {_name(model)} has no media tower: "
                         f"it would train on the placeholder ids as text, with no pixel or feature. Load the model class "
                         f"the build was made for (PackedCollator.for_build(ds, model)), or rebuild text only "
                         f"(modalities = [] or --modalities '', media records quarantined)")
    declared = _token_ids(model)
    if not declared or "input_ids" not in batch:
        return
    ids = batch["input_ids"]
    for kind in sorted(kinds):
        want = declared.get(kind)
        if want is None:
            continue
        spans = [ids[int(m.get("batch", 0)), int(m["start"]):int(m["start"]) + int(m["length"])] for m in real
                 if m["kind"] == kind]
        held = Counter(int(x) for span in spans for x in span.tolist())
        if not any(held.get(v) for v in declared.values()):  # InternVL scatters a video's frames as image tokens
            found = held.most_common(1)[0][0] if held else None
            raise ValueError(f"the batch's {kind} placeholders are token id {found} but {_name(model)} looks for its "
                             f"{kind} features at config.{kind}_token_id {want}: it would find no {kind} position. Load "
                             f"the model the build was made for, or build with its tokenizer and processor (their "
                             f"{kind} token is {want})")


def _token_ids(model) -> dict[str, int]:
    """The placeholder id per media kind the model's config declares (``image_token_id`` / ``image_token_index``)."""
    out = {}
    for kind in ("image", "video", "audio"):
        for key in (f"{kind}_token_id", f"{kind}_token_index"):
            value = getattr(model.config, key, None)
            if isinstance(value, int):
                out[kind] = value
                break
    return out


def _positions(batch: dict[str, Any], model) -> None:
    positions = batch.get("position_ids")
    if positions is None or positions.dim() != 3:
        return
    of_model = family_of_model(model)
    if model_rope(model) != "mrope" and (of_model is None or of_model.rope != "mrope"):
        raise ValueError(f"the batch's position_ids are 3-D mRoPE positions {tuple(positions.shape)} but {_name(model)} "
                         f"takes one position per token ([batch, length]): collate with rope='default' (or leave rope "
                         f"out: PackedCollator.for_build(ds, model) derives it), or load the model the build was made for")
