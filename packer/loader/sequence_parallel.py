"""Slices of a packed batch for sequence (context) parallelism.

Labels are shifted *before* slicing (``shift_labels[t]`` is the target of position t),
so the target of a slice's last token -- which lives on the next rank -- is not lost.

``ulysses``: contiguous equal slices of the sequence (padded to a multiple of ``size``);
attention runs over the whole sequence after the all-to-all, so the batch's global mask
is kept as it is.

``ring`` (zigzag): every segment is padded to a multiple of ``2 * size`` and cut into
``2 * size`` chunks; rank r takes chunks r and 2*size-1-r of every segment. Under causal
attention chunk j does work proportional to j, so r + (2*size-1-r) gives every rank the
same work. Needs a flattened batch (``PackedCollator(attention="varlen")``). Example,
one segment of 8 tokens, size 2 (chunks of 2)::

    tokens  a b | c d | e f | g h
    rank 0  a b               g h      chunks 0 and 3
    rank 1        c d   e f            chunks 1 and 2

Both return local ``input_ids``, ``labels``, ``shift_labels``, ``shift_loss_weights``,
``position_ids``, ``seq_idx``, and the ``cu_seqlens`` kernels need: ``cu_seqlens`` (the
global, unpadded boundaries), ``cu_seqlens_padded`` (global, after SP padding),
``cu_seqlens_local`` (this rank's pieces), with their ``max_seqlen_*``, plus
``global_index`` (each local position's place in the padded global sequence).
"""

from __future__ import annotations

from typing import Any

import torch

from packer.schema import IGNORE


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


def shard_for_sequence_parallel(batch: dict[str, Any], rank: int, size: int, *, mode: str = "ulysses",
                                pad_token_id: int = 0) -> dict[str, Any]:
    if not 0 <= rank < size:
        raise ValueError(f"rank {rank} is not in [0, {size})")
    if mode == "ulysses":
        return _ulysses(batch, rank, size, pad_token_id)
    if mode == "ring":
        return _ring(batch, rank, size, pad_token_id)
    raise ValueError(f"mode must be ulysses or ring, got {mode!r}")


def _pad_last(t: torch.Tensor, n: int, value) -> torch.Tensor:
    return torch.nn.functional.pad(t, (0, n), value=value) if n else t


def _ulysses(batch: dict[str, Any], rank: int, size: int, pad_token_id: int) -> dict[str, Any]:
    length = batch["input_ids"].shape[-1]
    extra = -(-length // size) * size - length
    mask = batch.get("attention_mask")
    if extra and mask is not None and not isinstance(mask, torch.Tensor):
        raise ValueError(f"length {length} is not a multiple of the SP size {size}; build the BlockMask padded: "
                         f"PackedCollator(pad_to_multiple_of={size})")
    shift, shift_w = _shifted(batch)
    positions = batch["position_ids"]
    pad_positions = torch.arange(extra).expand(*positions.shape[:-1], extra)
    full = {
        "input_ids": _pad_last(batch["input_ids"], extra, pad_token_id),
        "labels": _pad_last(batch["labels"], extra, IGNORE),
        "shift_labels": _pad_last(shift, extra, IGNORE),
        "shift_loss_weights": _pad_last(shift_w, extra, 0.0),
        "position_ids": torch.cat([positions, pad_positions.to(positions.dtype)], dim=-1) if extra else positions,
        "seq_idx": _pad_last(batch["seq_idx"], extra, int(batch["seq_idx"].max()) + 1),
    }
    chunk = (length + extra) // size
    lo, hi = rank * chunk, (rank + 1) * chunk
    out = {k: v[..., lo:hi] for k, v in full.items()}
    cu = _boundaries(batch)
    padded = torch.cat([cu, torch.tensor([length + extra])]) if extra else cu
    local = torch.unique(torch.clamp(padded, lo, hi)) - lo
    if mask is not None:
        if isinstance(mask, torch.Tensor) and extra:
            mask = _extend_mask(mask, extra)
        out["attention_mask"] = mask  # global: Ulysses attends over the whole sequence
    out.update(_cu_fields(cu, padded, local), global_index=torch.arange(lo, hi))
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
    cu = batch["cu_seqlens"].to(torch.int64)
    parts: dict[str, list[torch.Tensor]] = {k: [] for k in
                                            ("input_ids", "labels", "shift_labels", "shift_loss_weights",
                                             "position_ids", "seq_idx", "global_index")}
    padded_sizes, local_sizes, start_padded = [], [], 0
    for k, (a, b) in enumerate(zip(cu[:-1].tolist(), cu[1:].tolist(), strict=True)):
        n = b - a
        n_pad = -(-n // (2 * size)) * 2 * size
        chunk = n_pad // (2 * size)
        extra = n_pad - n
        seg = {
            "input_ids": _pad_last(batch["input_ids"][0, a:b], extra, pad_token_id),
            "labels": _pad_last(batch["labels"][0, a:b], extra, IGNORE),
            "shift_labels": _pad_last(shift[0, a:b], extra, IGNORE),
            "shift_loss_weights": _pad_last(shift_w[0, a:b], extra, 0.0),
            "position_ids": torch.arange(n_pad),  # padding continues the segment: after every real token
            "seq_idx": torch.full((n_pad,), k, dtype=torch.int32),
            "global_index": torch.arange(start_padded, start_padded + n_pad),
        }
        for j in (rank, 2 * size - 1 - rank):
            for key, value in seg.items():
                parts[key].append(value[j * chunk : (j + 1) * chunk])
        padded_sizes.append(n_pad)
        local_sizes.append(2 * chunk)
        start_padded += n_pad
    out = {k: torch.cat(v)[None] for k, v in parts.items()}
    out["global_index"] = out["global_index"][0]
    padded = torch.cat([torch.tensor([0]), torch.tensor(padded_sizes).cumsum(0)])
    local = torch.cat([torch.tensor([0]), torch.tensor(local_sizes).cumsum(0)])
    out.update(_cu_fields(cu, padded, local))
    return out


def _cu_fields(cu: torch.Tensor, padded: torch.Tensor, local: torch.Tensor) -> dict[str, Any]:
    def longest(c):
        return int(c.diff().max()) if c.numel() > 1 else 0

    return {
        "cu_seqlens": cu.to(torch.int32), "max_seqlen": longest(cu),
        "cu_seqlens_padded": padded.to(torch.int32), "max_seqlen_padded": longest(padded),
        "cu_seqlens_local": local.to(torch.int32), "max_seqlen_local": longest(local),
    }
