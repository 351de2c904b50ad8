"""The text part of a packed batch: stored rows in, tensors out, nothing of a family or a processor.

Like torchtune's ``padded_collate_packed``, :func:`text_batch` takes rows as the shards store them
(``input_ids``, ``labels``, ``cu_seqlens``, ``n_tokens``; ``segment_trained`` where stored) and a padded length,
and gives ``input_ids`` (padded with ``pad_token_id``), ``labels`` (``IGNORE`` on padding and on every
segment's first token), the segment of each token (``seq_idx``), positions reset at every segment (a preference
tree's branches continue from their prompt: :mod:`packer.loader.trees`), each token's loss weight and the
attention form's inputs (:data:`ATTENTION`: a 4-D mask, a ``BlockMask`` or ``cu_seqlens``). Padding is one
more segment that attends only to itself.

:class:`~packer.loader.PackedCollator` calls it and adds what depends on a model: the family's positions and
masks per layer type, media inputs, dummy media, the responses of preference rows. Kept apart so the text
batch can be read, tested and reused without that wiring.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

import packer.loader.trees as trees
from packer.loader.loss import loss_weights
from packer.modeling import masks
from packer.shards.schema import IGNORE

ATTENTION = ("sdpa", "eager", "flex", "varlen", "position_ids")
FLATTENED = ("varlen", "position_ids")


@dataclass
class TextBatch:
    """``[B, L]`` tensors of a packed batch, and its boundaries (``cu``: each row's ``cu_seqlens``, as stored)."""

    input_ids: torch.Tensor
    labels: torch.Tensor
    segment: torch.Tensor  # segment number per token (long); padding is the last segment of its row
    position: torch.Tensor  # position per token, 0 at each segment's start (a tree branch: after its prompt)
    loss_weights: torch.Tensor
    cu: list[np.ndarray]
    attention: dict[str, Any]  # attention_mask, or the flattened forms' cu_seqlens / max_seqlen / cu_seq_lens_q/k ...

    def tensors(self) -> dict[str, Any]:
        """The batch keys a :class:`~packer.loader.PackedCollator` batch gives for these."""
        return {"input_ids": self.input_ids, "labels": self.labels, "seq_idx": self.segment.to(torch.int32),
                "loss_weights": self.loss_weights, "position_ids": self.position, **self.attention}


def text_batch(rows: list[dict[str, Any]], length: int, *, pad_token_id: int = 0, attention: str = "sdpa",
               loss: str = "token", tree: list[np.ndarray] | None = None, mask_dtype: torch.dtype = torch.float32,
               device: str | torch.device = "cpu", row_lengths: list[int] | None = None) -> TextBatch:
    """``rows`` padded to ``length`` positions each (a flattened form: one row, :func:`concatenate`).

    ``tree``: each row's ``segment_parent`` (:func:`packer.loader.trees.parents`), for rows holding preference trees;
    ``loss``: ``token``, ``sample`` or ``sqrt`` weights (:func:`packer.loader.loss.loss_weights`); ``row_lengths``:
    a build's fixed row lengths, whose pieces the ``varlen`` padding takes."""
    cu = [np.asarray(r["cu_seqlens"], dtype=np.int64) for r in rows]
    batch = len(rows)
    input_ids = torch.full((batch, length), pad_token_id, dtype=torch.long)
    labels = torch.full((batch, length), IGNORE, dtype=torch.long)
    for b, r in enumerate(rows):
        n = int(r["n_tokens"])
        input_ids[b, :n] = torch.as_tensor(np.asarray(r["input_ids"], dtype=np.int64))
        labels[b, :n] = torch.as_tensor(np.asarray(r["labels"], dtype=np.int64))
        labels[b, torch.as_tensor(cu[b][:-1])] = IGNORE  # no segment's first token is a target
    segment, position = masks.segments_and_positions(cu, length)
    if tree is not None:
        position = trees.positions(position, segment, cu, tree)
    weights = loss_weights(labels, segment, loss, stored_counts(rows, int(segment.max()) + 1))
    return TextBatch(input_ids, labels, segment, position, weights, cu,
                     attention_inputs(segment, cu, length, attention, tree=tree, mask_dtype=mask_dtype, device=device,
                                      row_lengths=row_lengths))


def attention_inputs(segment: torch.Tensor, cu: list[np.ndarray], length: int, attention: str, *,
                     tree: list[np.ndarray] | None = None, mask_dtype: torch.dtype = torch.float32,
                     device: str | torch.device = "cpu", row_lengths: list[int] | None = None) -> dict[str, Any]:
    """The inputs that keep the segments apart under ``attention`` (the table in :mod:`packer.loader.collate`)."""
    if attention in ("sdpa", "eager"):
        allowed = masks.allowed(segment) if tree is None else trees.allowed(segment, tree)
        return {"attention_mask": allowed if attention == "sdpa" else masks.additive(allowed, mask_dtype)}
    if attention == "flex":
        return {"attention_mask": masks.block_mask(segment, device) if tree is None else
                trees.block_mask(segment, tree, device)}
    if attention == "varlen":
        edges = bounds(cu[0], length)
        if row_lengths is not None:  # padding in pieces of at most a row length: max_seqlen is one of them
            top = row_lengths[-1]
            edges = np.concatenate([cu[0], np.arange(int(cu[0][-1]) + top, length, top), [length]]) \
                if length > cu[0][-1] else cu[0]
        cu_t = torch.as_tensor(edges, dtype=torch.int32)
        max_len = int(np.diff(edges).max()) if len(edges) > 1 else 0
        if row_lengths is not None:
            max_len = next((x for x in row_lengths if x >= max_len), max_len)  # a Python int of a few values
        return {"cu_seqlens": cu_t, "max_seqlen": max_len, "cu_seq_lens_q": cu_t, "cu_seq_lens_k": cu_t,
                "max_length_q": max_len, "max_length_k": max_len}
    return {}  # position_ids: the positions alone


def bounds(cu: np.ndarray, length: int) -> np.ndarray:
    """A row's boundaries with its padding (if any) as one more segment."""
    return cu if length == cu[-1] else np.append(cu, length)


def stored_counts(rows: list[dict[str, Any]], n_segments: int) -> torch.Tensor | None:
    """``[B, n_segments]`` supervised tokens per segment as the shards store them (0 for the
    padding segment), or None when a row lacks them (the weights then count the labels)."""
    if not all("segment_trained" in r for r in rows):
        return None
    counts = torch.zeros(len(rows), n_segments, dtype=torch.long)
    for b, r in enumerate(rows):
        stored = torch.as_tensor(np.asarray(r["segment_trained"], dtype=np.int64))
        if len(stored) != len(r["cu_seqlens"]) - 1:
            raise ValueError(f"row {b}: segment_trained has {len(stored)} entries for {len(r['cu_seqlens']) - 1} "
                             "segments; a row cut by hand must cut segment_trained (and n_trained) with it")
        counts[b, : len(stored)] = stored
    return counts


def concatenate(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """All rows of a batch as one long row (the flattened forms)."""
    offsets = np.cumsum([0] + [int(r["n_tokens"]) for r in rows])
    segments = np.cumsum([0] + [len(r["cu_seqlens"]) - 1 for r in rows])
    stored = {"segment_trained": np.concatenate([np.asarray(r["segment_trained"], dtype=np.int64) for r in rows])} \
        if all("segment_trained" in r for r in rows) else {}
    if rows[-1].get("dummy_segments"):  # a dummy segment stays the last one only where its row is the last
        stored["dummy_segments"] = rows[-1]["dummy_segments"]
    roles = {}
    if all(r.get("segment_role") is not None for r in rows):  # pairs rows: their responses, groups renumbered
        def column(r: dict[str, Any], key: str, fill) -> list:
            """The row's ``key`` per segment; segments past it (a dummy media segment) get ``fill(k)``."""
            given = [] if r.get(key) is None else list(r[key])
            return given + [fill(k) for k in range(len(given), len(r["cu_seqlens"]) - 1)]

        roles = {"segment_role": [x for r in rows for x in column(r, "segment_role", lambda k: "")],
                 "segment_ids": [x for r in rows for x in column(r, "segment_ids", lambda k: "")],
                 "segment_weight": [x for r in rows for x in column(r, "segment_weight", lambda k: None)],
                 "segment_group": [int(g) + int(s) for r, s in zip(rows, segments, strict=False)
                                   for g in column(r, "segment_group", lambda k: k)]}
    return {**stored, **roles,
        "input_ids": np.concatenate([np.asarray(r["input_ids"]) for r in rows]),
        "labels": np.concatenate([np.asarray(r["labels"]) for r in rows]),
        "cu_seqlens": np.concatenate([[0]] + [np.asarray(r["cu_seqlens"][1:]) + o for r, o in zip(rows, offsets, strict=False)]),
        "n_tokens": int(offsets[-1]),
        "media": [{**m, "start": int(m["start"] + o), "segment": int(m["segment"] + s), "row": k}
                  for k, (r, o, s) in enumerate(zip(rows, offsets, segments, strict=False)) for m in r["media"]],
    }
