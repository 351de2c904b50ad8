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


def allowed(segment: torch.Tensor) -> torch.Tensor:
    """``[B, 1, L, L]`` bool: query i may attend key j (same segment, j <= i)."""
    length = segment.shape[-1]
    causal = torch.ones(length, length, dtype=torch.bool, device=segment.device).tril()
    return (segment[:, :, None] == segment[:, None, :]).logical_and_(causal)[:, None]


def additive(mask: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """0 where allowed, the dtype's most negative value elsewhere (what eager attention adds)."""
    return torch.zeros(mask.shape, dtype=dtype, device=mask.device).masked_fill_(~mask, torch.finfo(dtype).min)


def block_mask(segment: torch.Tensor, device: str | torch.device, block_size: int = 128):
    """A FlexAttention ``BlockMask`` for causal attention within segments, built on ``device``.

    The block structure comes straight from the segment numbers instead of evaluating the
    mask at every (q, kv) pair as ``create_block_mask`` does (which takes seconds per
    batch at 8 x 8192 on a CPU): a kv block is *full* for a q block when both lie in one
    segment and the kv block is strictly earlier, *partial* when their segment ranges
    overlap and it is not later (the diagonal included), else skipped. Exactly the blocks
    ``create_block_mask`` finds; the tests compare the two.
    """
    from torch.nn.attention.flex_attention import BlockMask

    batch, length = segment.shape
    n_blocks = -(-length // block_size)
    padded = torch.nn.functional.pad(segment, (0, n_blocks * block_size - length), value=int(segment.max()) + 1)
    seg = padded.to(device)
    first, last = padded[:, ::block_size], padded[:, block_size - 1 :: block_size]  # [B, nb]
    q_first, q_last = first[:, :, None], last[:, :, None]
    k_first, k_last = first[:, None, :], last[:, None, :]
    blocks = torch.arange(n_blocks)
    earlier_or_same = blocks[None, :] <= blocks[:, None]
    any_allowed = earlier_or_same & (k_first <= q_last) & (k_last >= q_first)
    full = (blocks[None, :] < blocks[:, None]) & (q_first == q_last) & (k_first == k_last) & (q_first == k_first)
    partial = any_allowed & ~full

    def layout(m: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        counts = m.sum(-1).to(torch.int32)[:, None]
        indices = torch.argsort((~m).to(torch.int8), dim=-1, stable=True).to(torch.int32)[:, None]
        return counts.to(device), indices.to(device)

    def mask_mod(b, h, q, kv):
        return (seg[b, q] == seg[b, kv]) & (q >= kv)

    kv_num, kv_idx = layout(partial)
    full_num, full_idx = layout(full)
    return BlockMask.from_kv_blocks(kv_num, kv_idx, full_num, full_idx, BLOCK_SIZE=block_size, mask_mod=mask_mod,
                                    seq_lengths=(length, length))
