"""Masks and positions for rows that hold trees (``--preference tree``), and the responses of a batch.

A tree's prompt is a segment of its own; each response is a segment whose parent is the prompt
(``segment_parent``): its tokens attend to the prompt's and causally to their own, never to a
sibling's, and its positions continue from the prompt's end (mRoPE included, from where the
prompt's positions leave off), so each response sees exactly what it sees run alone after the
prompt. Worked example: a prompt of 3 tokens (``P``) with two branches of 2 (``a``, ``b``)::

    segment       0 0 0 1 1 2 2        parent [-1, 0, 0]
    position_ids  0 1 2 3 4 3 4        (each branch continues at 3)
    allowed         k: P P P a a b b
        q P            1 . . . . . .
        q P            1 1 . . . . .
        q P            1 1 1 . . . .
        q a            1 1 1 1 . . .
        q a            1 1 1 1 1 . .
        q b            1 1 1 . . 1 .   <- b sees the prompt and itself, not a
        q b            1 1 1 . . 1 1

Every form that takes an arbitrary mask expresses it (SDPA's bool and eager's additive 4-D
masks, FlexAttention's ``BlockMask``); flash-attention varlen kernels attend within each
``cu_seqlens`` range only, so a branch could not see its prompt: refused
(:data:`VARLEN_REFUSAL`), as are ``position_ids``-only batches and linear-attention layers.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch

VARLEN_REFUSAL = ("rows holding preference trees (a response attends to its prompt, another segment) cannot be "
                  "expressed as varlen / position_ids batches: flash-attention varlen kernels attend within each "
                  "segment only. Use attention='sdpa', 'eager' or 'flex', or build with --preference pairs")
RESPONSE_FREE = ("", "prompt")  # roles of segments that are no response


def parents(rows: list[dict[str, Any]]) -> list[np.ndarray] | None:
    """Each row's ``segment_parent`` when any segment of the batch has a parent, else None (no tree)."""
    found = [np.asarray(r.get("segment_parent", ()), dtype=np.int64) for r in rows]
    return found if any(len(p) and p.max() >= 0 for p in found) else None


def ancestors(parent: np.ndarray, n: int) -> np.ndarray:
    """``[n, n]`` bool: ``a[s, t]`` when segment ``t`` is an ancestor of ``s`` (segments past ``len(parent)``:
    padding, none)."""
    out = np.zeros((n, n), dtype=bool)
    for s, p in enumerate(parent.tolist()):
        seen = 0
        while p >= 0:
            if p >= s or seen > len(parent):
                raise ValueError(f"segment {s}'s parent chain reaches segment {p}: a parent must come before its child")
            out[s, p] = True
            p, seen = int(parent[p]), seen + 1
    return out


def ancestor_table(parent_rows: list[np.ndarray], segment: torch.Tensor) -> torch.Tensor:
    """``[B, S, S]`` bool ancestor tables, ``S`` the batch's most segments (padding included)."""
    n = int(segment.max()) + 1 if segment.numel() else 1
    return torch.as_tensor(np.stack([ancestors(p, n) for p in parent_rows]))


def allowed(segment: torch.Tensor, parent_rows: list[np.ndarray]) -> torch.Tensor:
    """``[B, 1, L, L]`` bool: causal within a segment, plus every token of the segment's ancestors."""
    table = ancestor_table(parent_rows, segment).to(segment.device)
    length = segment.shape[-1]
    causal = torch.ones(length, length, dtype=torch.bool, device=segment.device).tril()
    same = (segment[:, :, None] == segment[:, None, :]).logical_and_(causal)
    rows = torch.arange(segment.shape[0], device=segment.device)[:, None, None]
    return same.logical_or_(table[rows, segment[:, :, None], segment[:, None, :]])[:, None]


def positions(position: torch.Tensor, segment: torch.Tensor, cu_rows: list[np.ndarray],
              parent_rows: list[np.ndarray]) -> torch.Tensor:
    """1-D positions: a branch's continue from its parent's end (``position`` reset per segment in, not changed)."""
    out = position.clone()
    for b, (cu, parent) in enumerate(zip(cu_rows, parent_rows, strict=True)):
        start = np.zeros(len(parent), np.int64)
        for k, p in enumerate(parent.tolist()):
            if p >= 0:
                start[k] = start[p] + cu[p + 1] - cu[p]
        shift = torch.zeros(int(segment[b].max()) + 1, dtype=out.dtype)
        shift[: len(start)] = torch.as_tensor(start)
        out[b] += shift[segment[b]]
    return out


def block_mask(segment: torch.Tensor, parent_rows: list[np.ndarray], device: str | torch.device, block_size: int = 128):
    """A FlexAttention ``BlockMask`` of :func:`allowed`: the block structure from the mask itself, one query
    block at a time (exactly the blocks ``create_block_mask`` finds; the tests compare the two)."""
    from torch.nn.attention.flex_attention import BlockMask

    batch, length = segment.shape
    n_blocks = -(-length // block_size)
    padded = torch.nn.functional.pad(segment, (0, n_blocks * block_size - length), value=int(segment.max()) + 1)
    table = ancestor_table(parent_rows, padded)
    rows = torch.arange(batch)[:, None, None]
    full = torch.zeros(batch, n_blocks, n_blocks, dtype=torch.bool)
    partial = torch.zeros(batch, n_blocks, n_blocks, dtype=torch.bool)
    kv = torch.arange(n_blocks * block_size)
    for q in range(n_blocks):
        lo, hi = q * block_size, (q + 1) * block_size
        seg_q = padded[:, lo:hi]
        ok = (seg_q[:, :, None] == padded[:, None, :]) & (torch.arange(lo, hi)[:, None] >= kv[None, :])
        ok |= table[rows, seg_q[:, :, None], padded[:, None, :]]
        ok = ok.view(batch, block_size, n_blocks, block_size)
        some, every = ok.any(dim=3).any(dim=1), ok.all(dim=3).all(dim=1)
        full[:, q] = every
        partial[:, q] = some & ~every

    def layout(m: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        counts = m.sum(-1).to(torch.int32)[:, None]
        indices = torch.argsort((~m).to(torch.int8), dim=-1, stable=True).to(torch.int32)[:, None]
        return counts.to(device), indices.to(device)

    # mask_mod reads two per-token tables (a 3-index gather of the ancestor table breaks inductor's CPU code):
    # each token's segment and its segment's parent, which is every ancestor there is in a one-level tree.
    if (table.sum(-1) > 1).any():
        raise ValueError("attention='flex' takes one-level trees (a prompt and its branches); a segment here has a "
                         "grandparent: use attention='sdpa' or 'eager'")
    parent_of = torch.where(table.any(-1), table.to(torch.int8).argmax(-1), -1)  # [B, S]
    seg = padded.to(device)
    par = parent_of.gather(1, padded).to(device)

    def mask_mod(b, h, q, kv):
        return ((seg[b, q] == seg[b, kv]) & (q >= kv)) | (par[b, q] == seg[b, kv])

    kv_num, kv_idx = layout(partial)
    full_num, full_idx = layout(full)
    return BlockMask.from_kv_blocks(kv_num, kv_idx, full_num, full_idx, BLOCK_SIZE=block_size, mask_mod=mask_mod,
                                    seq_lengths=(length, length))


def responses(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The batch's responses, in row order: ``batch`` (row), ``segment``, ``start`` / ``end`` (tokens of the row),
    ``role``, ``group`` (the segment its record's segments start at: pairs chosen / rejected by it), ``id`` (the
    record's display id), ``weight`` (NaN: none given). Rows without roles (SFT builds) give none."""
    out = []
    for b, r in enumerate(rows):
        roles = r.get("segment_role")
        if roles is None:
            continue
        cu = np.asarray(r["cu_seqlens"], dtype=np.int64)
        groups = r.get("segment_group")
        groups = range(len(roles)) if groups is None else groups
        weights = r.get("segment_weight")
        weights = [math.nan] * len(roles) if weights is None else weights
        for k, role in enumerate(roles):
            if role in RESPONSE_FREE:
                continue
            weight = weights[k]
            out.append({"batch": b, "segment": k, "start": int(cu[k]), "end": int(cu[k + 1]), "role": role,
                        "group": int(groups[k]), "id": r["segment_ids"][k],
                        "weight": math.nan if weight is None else float(weight)})
    return out
