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


def block_mask(segment: torch.Tensor, device: str | torch.device):
    """A FlexAttention ``BlockMask`` for causal attention within segments, built on ``device``."""
    from torch.nn.attention.flex_attention import create_block_mask

    seg = segment.to(device)

    def mask_mod(b, h, q, kv):
        return (seg[b, q] == seg[b, kv]) & (q >= kv)

    batch, length = seg.shape
    return create_block_mask(mask_mod, batch, None, length, length, device=str(device))
