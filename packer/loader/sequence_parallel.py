"""Slices of a packed batch for sequence (context) parallelism, positions and media spans included.

Labels are shifted *before* slicing (``shift_labels[t]`` is the target of position t),
so the target of a slice's last token -- which lives on the next rank -- is not lost.
Positions are the batch's own, ``[B, L]`` or mRoPE ``[3, B, L]``, sliced like the tokens.

``ulysses``: contiguous equal slices of the sequence (padded to a multiple of ``size``);
attention runs over the whole sequence after the all-to-all, so the batch's global mask
is kept as it is -- a preference tree's too (a response attending to its prompt). The SP
padding is one more segment, positioned from 0.

``ring`` (zigzag): every segment is padded to a multiple of ``2 * size`` and cut into
``2 * size`` chunks; rank r takes chunks r and 2*size-1-r of every segment. Under causal
attention chunk j does work proportional to j, so r + (2*size-1-r) gives every rank the
same work. Needs a flattened batch (``PackedCollator(attention="varlen")``), so no preference
trees (refused: a branch would have to attend to its prompt's chunks on other ranks). A segment's
padding continues its positions after the segment's largest one, on every mRoPE axis.
Example, one segment of 8 tokens holding an image span (``I``, start 1, length 6, grid
(1, 2, 3)) and its mRoPE positions, size 2 (chunks of 2)::

    tokens    t  I | I  I | I  I | I  t
    t-axis    0  1 | 1  1 | 1  1 | 1  4
    h-axis    0  1 | 1  1 | 2  2 | 2  4
    w-axis    0  1 | 2  3 | 1  2 | 3  4
    rank 0    t  I                 I  t    chunks 0, 3; positions t 0 1 1 4, h 0 1 2 4, w 0 1 3 4
    rank 1           I  I   I  I           chunks 1, 2

Media spans become *pieces*, one per run of a span's placeholders on this rank, with
``start`` and ``length`` local and ``offset`` the piece's first placeholder within the
span (so the encoder's rows ``offset : offset + length`` of that span fill it)::

    rank 0    {start 1, length 1, offset 0}, {start 2, length 1, offset 5}    two pieces, one span
    rank 1    {start 0, length 4, offset 1}                                   chunks 1 and 2 adjoin

:func:`local_media_rows` turns the pieces into the encoder rows a rank scatters.

Both return local ``input_ids``, ``labels``, ``shift_labels``, ``shift_loss_weights``,
``position_ids``, ``seq_idx``, ``media`` (the pieces), and the ``cu_seqlens`` kernels
need: ``cu_seqlens`` (the global, unpadded boundaries), ``cu_seqlens_padded`` (global,
after SP padding), ``cu_seqlens_local`` (this rank's pieces), with their ``max_seqlen_*``,
plus ``global_index`` (each local position's place in the padded global sequence).
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from typing import Any

import torch

from packer.families import PER_TOKEN_KEYS
from packer.modeling.spans import span_runs
from packer.shards.schema import IGNORE

# Per-token model inputs a family adds ([B, L], 0 on padding), sliced like the tokens; ``visual_pos_masks`` (the
# positions DeepStack adds its features to) follows a local ``mm_token_type_ids``.
PER_TOKEN = PER_TOKEN_KEYS  # the families' declared per-token inputs


def shard_for_sequence_parallel(batch: dict[str, Any], rank: int, size: int, *, mode: str = "ulysses",
                                pad_token_id: int = 0) -> dict[str, Any]:
    """This rank's slice of a :class:`~packer.loader.PackedCollator` batch.

    Args:
        batch: a collated batch; ``position_ids`` ``[B, L]`` or ``[3, B, L]`` (``rope="mrope"``).
        rank: this rank's place in the sequence-parallel group, in ``[0, size)``.
        size: the sequence-parallel group's size.
        mode: ``"ulysses"`` (contiguous) or ``"ring"`` (per-segment zigzag, flattened batches).
        pad_token_id: the token of SP padding.

    Returns:
        The local tensors (see the module docstring) and ``media``: one piece per run of a
        span's placeholders on this rank, sorted by (``batch``, ``start``), with the span's
        keys plus ``start`` / ``length`` (local), ``offset`` (the piece's first feature within the
        span), ``span_start``, ``span_length`` and ``span_tokens`` (the span in the unsliced batch).
        Spans outside the slice are absent; text a family writes between a span's runs (Qwen3-VL's
        timestamps) is in no piece.
    """
    if not 0 <= rank < size:
        raise ValueError(f"rank {rank} is not in [0, {size})")
    positions = batch["position_ids"]
    if positions.dim() not in (2, 3) or positions.shape[-2:] != batch["input_ids"].shape:
        raise ValueError(f"position_ids of shape {tuple(positions.shape)} do not match input_ids "
                         f"{tuple(batch['input_ids'].shape)}: expected [B, L] or mRoPE [3, B, L]")
    mask = batch.get("attention_mask")
    if isinstance(mask, dict) and "linear_attention" in mask:
        raise ValueError("sequence parallelism of a hybrid model's linear-attention layers (Qwen3.5's gated delta nets) "
                         "is not supported: their recurrence runs along the whole sequence, which no slice holds; "
                         "train it without sequence parallelism")
    if mode == "ulysses":
        return _ulysses(batch, rank, size, pad_token_id)
    if mode == "ring" and any(p >= 0 for row in batch.get("segment_parent", ()) for p in row):
        raise ValueError("ring attention zigzags each segment over the ranks and attends within it, but the batch holds "
                         "preference trees (a response attends to its prompt, another segment): use mode='ulysses' (it "
                         "keeps the batch's mask, trees included), or build with --preference pairs")
    if mode == "ring":
        return _ring(batch, rank, size, pad_token_id)
    raise ValueError(f"mode must be ulysses or ring, got {mode!r}")


def local_media_rows(pieces: Sequence[dict[str, Any]], encoded: Sequence[dict[str, Any]] | None = None, *,
                     kind: str | None = None) -> torch.Tensor:
    """Indices into the encoder's output of the rows this rank's placeholders take, in local token order.

    The encoder's output is taken as every span of ``encoded`` in (``batch``, ``start``)
    order -- the order of the collator's ``pixel_values`` / ``input_features`` and of the
    model's scatter -- each giving ``tokens`` rows (its placeholders). ``encoded`` defaults to the spans the
    pieces come from (a rank that encodes only what it holds); pass the unsliced
    ``batch["media"]`` when the encoder ran on the whole batch. ``kind`` keeps only the
    pieces and spans of one kind (the encoder's). Example, a rank holding pieces
    ``{offset 0, length 1}``, ``{offset 5, length 1}`` of a 6-row span that follows a
    4-row span::

        rows = local_media_rows(local["media"], batch["media"], kind="image")   # tensor([4, 9])
        inputs_embeds[local["input_ids"] == image_token_id] = embeds[rows]
    """
    pieces = [p for p in pieces if kind is None or p["kind"] == kind]
    if encoded is None:
        held = {(p.get("batch", 0), p["span_start"]): p.get("span_tokens", p["span_length"]) for p in pieces}
        encoded = [{"batch": b, "start": s, "length": n, "tokens": n} for (b, s), n in held.items()]
    first, row = {}, 0
    for span in sorted((m for m in encoded if kind is None or m.get("kind", kind) == kind),
                       key=lambda m: (m.get("batch", 0), int(m["start"]))):
        first[(span.get("batch", 0), int(span["start"]))] = row
        row += int(span.get("tokens", span["length"]))  # the span's features: its placeholders
    rows = []
    for p in sorted(pieces, key=lambda p: (p.get("batch", 0), p["start"])):
        key = (p.get("batch", 0), p["span_start"])
        if key not in first:
            raise ValueError(f"a piece of the {p['kind']} span at batch {key[0]}, start {key[1]} is not among the {len(first)} "
                             f"encoded spans; pass every span the encoder ran on (the unsliced batch['media']) and its kind")
        rows.append(torch.arange(first[key] + p["offset"], first[key] + p["offset"] + p["length"]))
    return torch.cat(rows) if rows else torch.zeros(0, dtype=torch.long)


def _shifted(batch: dict[str, Any]) -> tuple[torch.Tensor, torch.Tensor]:
    labels = batch["labels"]
    shift = torch.nn.functional.pad(labels[..., 1:], (0, 1), value=IGNORE)
    weights = batch.get("loss_weights", (labels != IGNORE).float())
    return shift, torch.nn.functional.pad(weights[..., 1:], (0, 1), value=0.0)


def _boundaries(batch: dict[str, Any]) -> torch.Tensor:
    if "cu_seqlens" in batch:
        return batch["cu_seqlens"].to(torch.int64)
    seq = batch["seq_idx"][0].to(torch.int64)  # row 0 of a padded batch
    change = torch.nonzero(seq[1:] != seq[:-1]).flatten() + 1
    return torch.cat([torch.tensor([0]), change, torch.tensor([seq.numel()])])


def _pad_last(t: torch.Tensor, n: int, value) -> torch.Tensor:
    return torch.nn.functional.pad(t, (0, n), value=value) if n else t


def _pieces(span: dict[str, Any], windows: list[tuple[int, int, int]]) -> list[dict[str, Any]]:
    """The runs of ``span``'s placeholders inside ``windows`` -- (row_lo, row_hi, local_lo), in local order --
    merged where two runs adjoin both locally and in the span's features. ``offset`` counts features (the
    encoder's rows of the span), which is the position in the span when the span is one run."""
    s, n = int(span["start"]), int(span["length"])
    tokens = int(span.get("tokens", n))
    out: list[dict[str, Any]] = []
    for lo, hi, local in windows:
        feature = 0
        for run_offset, run_length in span_runs(span):
            rs = s + run_offset
            a, b = max(rs, lo), min(rs + run_length, hi)
            if a < b:
                start, offset = local + a - lo, feature + a - rs
                if out and out[-1]["start"] + out[-1]["length"] == start and out[-1]["offset"] + out[-1]["length"] == offset:
                    out[-1]["length"] += b - a
                else:
                    out.append({**span, "start": start, "length": b - a, "offset": offset, "span_start": s,
                                "span_length": n, "span_tokens": tokens})
            feature += run_length
    return out


def _ulysses(batch: dict[str, Any], rank: int, size: int, pad_token_id: int) -> dict[str, Any]:
    length = batch["input_ids"].shape[-1]
    extra = -(-length // size) * size - length
    mask = batch.get("attention_mask")
    layer_masks = mask if isinstance(mask, dict) else {None: mask}  # a mask per layer type (Llama 4), or one
    if extra and any(m is not None and not isinstance(m, torch.Tensor) for m in layer_masks.values()):
        raise ValueError(f"length {length} is not a multiple of the SP size {size}; build the BlockMask padded: "
                         f"PackedCollator(pad_to_multiple_of={size})")
    shift, shift_w = _shifted(batch)
    positions = batch["position_ids"]
    pad_positions = torch.arange(extra).expand(*positions.shape[:-1], extra)  # [B, extra] or [3, B, extra]
    full = {
        "input_ids": _pad_last(batch["input_ids"], extra, pad_token_id),
        "labels": _pad_last(batch["labels"], extra, IGNORE),
        "shift_labels": _pad_last(shift, extra, IGNORE),
        "shift_loss_weights": _pad_last(shift_w, extra, 0.0),
        "position_ids": torch.cat([positions, pad_positions.to(positions.dtype)], dim=-1) if extra else positions,
        "seq_idx": _pad_last(batch["seq_idx"], extra, int(batch["seq_idx"].max()) + 1),
        **{k: _pad_last(batch[k], extra, 0) for k in PER_TOKEN if k in batch},
    }
    chunk = (length + extra) // size
    lo, hi = rank * chunk, (rank + 1) * chunk
    out = {k: v[..., lo:hi] for k, v in full.items()}
    cu = _boundaries(batch)
    padded = torch.cat([cu, torch.tensor([length + extra])]) if extra else cu
    local = torch.unique(torch.clamp(padded, lo, hi)) - lo
    if mask is not None:
        if extra:
            grown = {k: _extend_mask(m, extra) if m is not None else None for k, m in layer_masks.items()}
            mask = grown if isinstance(mask, dict) else grown[None]
        out["attention_mask"] = mask  # global: Ulysses attends over the whole sequence
    pieces = [p for span in batch.get("media", []) for p in _pieces(span, [(lo, hi, 0)])]
    out["media"] = sorted(pieces, key=lambda p: (p.get("batch", 0), p["start"]))
    out.update(_cu_fields(cu, padded, local), global_index=torch.arange(lo, hi))
    if "responses" in batch:  # a preference batch: each response's targets on this rank (packer.loader.logps)
        out["responses"] = [{**r, "start": min(max(r["start"], lo), hi) - lo,
                             "end": min(max(r["end"] - 1, lo), hi) - lo + 1} for r in batch["responses"]]
    return _visual(out)


def _visual(out: dict[str, Any]) -> dict[str, Any]:
    if "mm_token_type_ids" in out:
        out["visual_pos_masks"] = (out["mm_token_type_ids"] == 1) | (out["mm_token_type_ids"] == 2)
    return out


def _extend_mask(mask: torch.Tensor, extra: int) -> torch.Tensor:
    """Grow a [B, 1, L, L] mask by ``extra`` padding positions that see only themselves."""
    b, h, length, _ = mask.shape
    n = length + extra
    if mask.dtype == torch.bool:
        grown = torch.zeros(b, h, n, n, dtype=torch.bool)
        grown[..., length:, length:] = torch.ones(extra, extra, dtype=torch.bool).tril()
    else:
        grown = torch.full((b, h, n, n), torch.finfo(mask.dtype).min, dtype=mask.dtype)
        grown[..., length:, length:] = torch.zeros(extra, extra, dtype=mask.dtype).masked_fill(
            ~torch.ones(extra, extra, dtype=torch.bool).tril(), torch.finfo(mask.dtype).min)
    grown[..., :length, :length] = mask
    return grown


def _ring(batch: dict[str, Any], rank: int, size: int, pad_token_id: int) -> dict[str, Any]:
    if batch["input_ids"].shape[0] != 1 or "cu_seqlens" not in batch:
        raise ValueError("ring attention slices a flattened batch: use PackedCollator(attention='varlen')")
    shift, shift_w = _shifted(batch)
    positions = batch["position_ids"][..., 0, :]  # [T] or [3, T]
    cu = batch["cu_seqlens"].to(torch.int64)
    per_token = [k for k in PER_TOKEN if k in batch]
    parts: dict[str, list[torch.Tensor]] = {k: [] for k in
                                            ("input_ids", "labels", "shift_labels", "shift_loss_weights",
                                             "position_ids", "seq_idx", "global_index", *per_token)}
    windows: list[list[tuple[int, int, int]]] = []  # per segment: this rank's (row_lo, row_hi, local_lo)
    padded_sizes, local_sizes, start_padded, start_local = [], [], 0, 0
    for k, (a, b) in enumerate(zip(cu[:-1].tolist(), cu[1:].tolist(), strict=True)):
        n = b - a
        n_pad = -(-n // (2 * size)) * 2 * size
        chunk = n_pad // (2 * size)
        extra = n_pad - n
        real = positions[..., a:b]
        top = int(real.max()) + 1 if n else 0  # padding continues after the segment's largest position
        seg = {
            "input_ids": _pad_last(batch["input_ids"][0, a:b], extra, pad_token_id),
            "labels": _pad_last(batch["labels"][0, a:b], extra, IGNORE),
            "shift_labels": _pad_last(shift[0, a:b], extra, IGNORE),
            "shift_loss_weights": _pad_last(shift_w[0, a:b], extra, 0.0),
            "position_ids": torch.cat([real, torch.arange(top, top + extra, dtype=real.dtype).expand(*real.shape[:-1], extra)],
                                      dim=-1),
            "seq_idx": torch.full((n_pad,), k, dtype=torch.int32),
            "global_index": torch.arange(start_padded, start_padded + n_pad),
            **{key: _pad_last(batch[key][0, a:b], extra, 0) for key in per_token},
        }
        windows.append([])
        for i, j in enumerate((rank, 2 * size - 1 - rank)):
            for key, value in seg.items():
                parts[key].append(value[..., j * chunk : (j + 1) * chunk])
            windows[-1].append((a + j * chunk, min(a + (j + 1) * chunk, b), start_local + i * chunk))
        padded_sizes.append(n_pad)
        local_sizes.append(2 * chunk)
        start_padded += n_pad
        start_local += 2 * chunk
    out = {k: torch.cat(v, dim=-1).unsqueeze(-2) for k, v in parts.items()}
    out["global_index"] = out["global_index"][0]
    bounds = cu.tolist()
    out["media"] = [p for span in batch.get("media", [])
                    for p in _pieces(span, windows[bisect.bisect_right(bounds, int(span["start"])) - 1])]
    out["media"].sort(key=lambda p: p["start"])
    padded = torch.cat([torch.tensor([0]), torch.tensor(padded_sizes).cumsum(0)])
    local = torch.cat([torch.tensor([0]), torch.tensor(local_sizes).cumsum(0)])
    out.update(_cu_fields(cu, padded, local))
    return _visual(out)


def _cu_fields(cu: torch.Tensor, padded: torch.Tensor, local: torch.Tensor) -> dict[str, Any]:
    def longest(c):
        return int(c.diff().max()) if c.numel() > 1 else 0

    return {
        "cu_seqlens": cu.to(torch.int32), "max_seqlen": longest(cu),
        "cu_seqlens_padded": padded.to(torch.int32), "max_seqlen_padded": longest(padded),
        "cu_seqlens_local": local.to(torch.int32), "max_seqlen_local": longest(local),
    }
