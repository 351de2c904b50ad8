"""Zero-contribution dummy media, so every data-parallel rank runs every tower.

Under DDP and FSDP a rank whose batch holds no image never calls the vision tower: DDP then
fails ("parameters that were not used in producing loss"), FSDP2 all-gathers other units than
its peers and dies in a collective mismatch (a hang under NCCL). The fix ms-swift and
LLaMA-Factory use is to run each tower on a dummy input; packer does it in the batch itself,
so the tower runs inside the model's own forward, at the place and in the order it runs on
every other rank (Qwen2.5-Omni runs its audio tower before its vision tower: a dummy run
beside the forward would reverse that order on some ranks):

- for each media kind the model encodes (its family's towers) and the build declares,
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

The towers come from the family registry: each family declares them per HF config ``model_type``
(:attr:`packer.families.Family.towers`: the tower's attribute, checked on the model, and a builder of the
dummy inputs from the config); nothing here lists families.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import torch

from packer.families import MODEL_TYPES
from packer.modeling.towers import Dummy, Tower
from packer.shards.schema import IGNORE

__all__ = ["Dummy", "MediaDummies", "Tower", "build_placeholders", "media_dummies", "towers"]


def _attr(obj: Any, path: str) -> Any:
    for name in path.split("."):
        obj = getattr(obj, name, None)
        if obj is None:
            return None
    return obj


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
    """The towers of ``model`` (an HF model or its config) its family declares; () for a model no family
    declares (a text model)."""
    config = getattr(model, "config", model)
    model_type = getattr(config, "model_type", "") or ""
    family = MODEL_TYPES.get(model_type)
    found = tuple(t for t in (family.towers.get(model_type, ()) if family else ()) if t.present(config))
    if hasattr(model, "config"):
        for t in found:
            if _attr(model, t.attribute) is None:
                raise ValueError(f"{type(model).__name__} ({config.model_type}) has no {t.attribute}: the dummy-media "
                                 f"towers family {family.name} declares do not match this transformers version")
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
