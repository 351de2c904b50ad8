"""Per-token segment numbers, positions and the attention masks derived from them.

A packed row stores only its boundaries (``cu_seqlens``); everything here is derived.
Worked example: a row of two segments (3 and 2 tokens) padded to L = 6::

    cu_seqlens     [0, 3, 5]          (+ 1 padding token, its own segment)
    segment        [0, 0, 0, 1, 1, 2]
    position_ids   [0, 1, 2, 0, 1, 0]
    allowed (query row attends to key column; causal and same segment)

              k: 0 1 2 3 4 5
        q 0      1 . . . . .
        q 1      1 1 . . . .
        q 2      1 1 1 . . .
        q 3      . . . 1 . .
        q 4      . . . 1 1 .
        q 5      . . . . . 1     <- padding attends only to itself: no empty row, no NaN

SDPA takes ``allowed`` as a bool mask; the eager implementation *adds* its mask to the
scores, so it needs ``0`` / ``dtype.min`` instead -- a bool mask there silently leaks.
"""

from __future__ import annotations

from typing import Any

import torch


def segments_and_positions(cu_seqlens: list[list[int]] | list, length: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``segment`` and ``position_ids``, both ``[B, length]`` int64, for rows given by their
    ``cu_seqlens``; tokens past a row's end form one more segment (the padding)."""
    batch = len(cu_seqlens)
    segment = torch.empty(batch, length, dtype=torch.long)
    position = torch.empty(batch, length, dtype=torch.long)
    for b, cu in enumerate(cu_seqlens):
        cu = torch.as_tensor(cu, dtype=torch.long)
        if cu[-1] > length:
            raise ValueError(f"row {b} has {int(cu[-1])} tokens, more than the padded length {length}")
        bounds = torch.cat([cu, torch.tensor([length])]) if cu[-1] < length else cu
        sizes = bounds.diff()
        segment[b] = torch.repeat_interleave(torch.arange(len(sizes)), sizes)
        position[b] = torch.arange(length) - torch.repeat_interleave(bounds[:-1], sizes)
    return segment, position


def allowed(segment: torch.Tensor, blocks: torch.Tensor | None = None, window: int | None = None) -> torch.Tensor:
    """``[B, 1, L, L]`` bool: query i may attend key j (same segment, j <= i).

    ``blocks`` (:func:`media_blocks`): tokens of one block also attend to its later tokens (Gemma's image
    tokens, bidirectional within their image); ``window``: only keys less than ``window`` positions back
    (a sliding-window layer; what transformers' ``sliding_window_overlay`` keeps)."""
    length = segment.shape[-1]
    same = segment[:, :, None] == segment[:, None, :]
    causal = torch.ones(length, length, dtype=torch.bool, device=segment.device).tril()
    ok = same & causal
    if blocks is not None:
        ok |= same & (blocks[:, :, None] == blocks[:, None, :]) & (blocks[:, :, None] >= 0)
    if window is not None:
        q = torch.arange(length, device=segment.device)
        ok &= (q[:, None] - q[None, :]) < window
    return ok[:, None]


def layer_masks(segment: torch.Tensor, layout: dict[str, dict[str, Any]], attention: str, *,
                blocks: torch.Tensor | None = None, mask_dtype: torch.dtype = torch.float32,
                device: str | torch.device = "cpu") -> dict[str, Any]:
    """One mask per layer type in ``attention``'s form (sdpa bool, eager additive, flex ``BlockMask``):
    ``layout[layer_type]`` says its ``window`` (None: none) and whether ``blocks`` apply to it."""
    out: dict[str, Any] = {}
    for layer_type, spec in layout.items():
        own = blocks if spec["blocks"] else None
        if attention == "flex":
            out[layer_type] = block_mask(segment, device, blocks=own, window=spec["window"])
        else:
            ok = allowed(segment, own, spec["window"])
            out[layer_type] = ok if attention == "sdpa" else additive(ok, mask_dtype)
    return out


def media_blocks(input_ids: torch.Tensor, ids: list[int]) -> torch.Tensor:
    """``[B, L]``: each run of consecutive ``ids`` numbered 0, 1, ... along the row, -1 elsewhere (what
    transformers' Gemma ``get_block_sequence_ids_for_mask`` makes of ``token_type_ids``). Worked example,
    ``I`` an image placeholder::

        tokens   t  I  I  t  I  I  I  t
        blocks  -1  0  0 -1  1  1  1 -1
    """
    hit = torch.zeros_like(input_ids, dtype=torch.bool)
    for i in ids:
        hit |= input_ids == i
    start = hit & ~torch.nn.functional.pad(hit, (1, 0))[:, :-1]
    return torch.where(hit, torch.cumsum(start.long(), dim=1) - 1, torch.full_like(input_ids, -1))


def additive(mask: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """0 where allowed, the dtype's most negative value elsewhere (what eager attention adds)."""
    return torch.zeros(mask.shape, dtype=dtype, device=mask.device).masked_fill_(~mask, torch.finfo(dtype).min)


def block_mask(segment: torch.Tensor, device: str | torch.device, block_size: int = 128,
               blocks: torch.Tensor | None = None, window: int | None = None):
    """A FlexAttention ``BlockMask`` of :func:`allowed` (causal within segments; ``blocks`` and ``window``
    as there), built on ``device``.

    The block structure comes straight from the segment numbers instead of evaluating the
    mask at every (q, kv) pair as ``create_block_mask`` does (which takes seconds per
    batch at 8 x 8192 on a CPU): a kv block is *full* for a q block when both lie in one
    segment and the kv block is strictly earlier (and, with a window, wholly inside it),
    *partial* when their segment ranges overlap and it is not later (and not wholly outside
    the window) or when one media block spans both, else skipped. Exactly the blocks
    ``create_block_mask`` finds (the tests compare the two), or with media blocks a superset
    of its partial blocks: a partial block is evaluated element by element, so that is exact too.
    """
    from torch.nn.attention.flex_attention import BlockMask

    batch, length = segment.shape
    n_blocks = -(-length // block_size)
    padded = torch.nn.functional.pad(segment, (0, n_blocks * block_size - length), value=int(segment.max()) + 1)
    seg = padded.to(device)
    first, last = padded[:, ::block_size], padded[:, block_size - 1 :: block_size]  # [B, nb]
    q_first, q_last = first[:, :, None], last[:, :, None]
    k_first, k_last = first[:, None, :], last[:, None, :]
    blocks_q = torch.arange(n_blocks)[:, None]
    blocks_k = torch.arange(n_blocks)[None, :]
    any_allowed = (blocks_k <= blocks_q) & (k_first <= q_last) & (k_last >= q_first)
    full = (blocks_k < blocks_q) & (q_first == q_last) & (k_first == k_last) & (q_first == k_first)
    if window is not None:  # q - kv < window: some pair of the two blocks / every pair
        any_allowed = any_allowed & ((blocks_q - blocks_k - 1) * block_size + 1 < window)
        full = full & ((blocks_q - blocks_k + 1) * block_size - 1 < window)
    blk = None
    if blocks is not None:
        blk = torch.nn.functional.pad(blocks, (0, n_blocks * block_size - length), value=-1)
        for b in range(batch):
            ids = blk[b]
            for g in torch.unique(ids[ids >= 0]).tolist():
                where = torch.nonzero(ids == g).flatten()
                lo, hi = int(where[0]) // block_size, int(where[-1]) // block_size
                any_allowed[b, lo : hi + 1, lo : hi + 1] = True
        blk = blk.to(device)
    partial = any_allowed & ~full

    def layout(m: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        counts = m.sum(-1).to(torch.int32)[:, None]
        indices = torch.argsort((~m).to(torch.int8), dim=-1, stable=True).to(torch.int32)[:, None]
        return counts.to(device), indices.to(device)

    def mask_mod(b, h, q, kv):
        same = seg[b, q] == seg[b, kv]
        ok = same & (q >= kv)
        if blk is not None:
            ok = ok | (same & (blk[b, q] == blk[b, kv]) & (blk[b, q] >= 0))
        if window is not None:
            ok = ok & (q - kv < window)
        return ok

    kv_num, kv_idx = layout(partial)
    full_num, full_idx = layout(full)
    return BlockMask.from_kv_blocks(kv_num, kv_idx, full_num, full_idx, BLOCK_SIZE=block_size, mask_mod=mask_mod,
                                    seq_lengths=(length, length))
