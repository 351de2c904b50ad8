"""Zigzag ring attention over a flattened varlen batch, causal per segment, with its own backward.

Each rank holds, of every segment (padded to a multiple of ``2 * size`` by
:func:`~packer.loader.shard_for_sequence_parallel` with ``mode="ring"``), chunks ``r`` and
``2 * size - 1 - r``. :func:`ring_layout` gives every local token's place in the padded global
sequence and its segment, for any rank, from ``cu_seqlens_padded`` alone, so no index travels.
Key / value blocks go round the ring (``isend`` / ``irecv``: gloo and NCCL have them); at step
``s`` rank ``r`` holds rank ``r - s``'s block and attends to the keys of the same segment at a
global place not after the query's. Partial results merge by log-sum-exp. The backward sends the
blocks round again with their ``dK`` / ``dV`` accumulators, which come home after ``size`` hops.
Example, one segment of 8 tokens, size 2 (chunks of 2)::

    global     0  1 | 2  3 | 4  5 | 6  7
    rank 0     a  a             b  b        local 0 1 2 3 = global 0 1 6 7
    rank 1           a  a | b  b            local 0 1 2 3 = global 2 3 4 5
    step 1 on rank 0 (keys of rank 1): queries 6, 7 see keys 2..5; queries 0, 1 see none

The block kernel is plain math (a dense mask per block, float32 scores): exact on CPU, any device.
Grouped-query attention runs on the key / value heads as given (no copies travel).
"""

from __future__ import annotations

import torch
import torch.distributed as dist


def ring_layout(cu_padded: torch.Tensor, rank: int, size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``(global_index, segment)`` of each of ``rank``'s local tokens, both ``[L_local]`` long."""
    index, segment = [], []
    edges = cu_padded.tolist()
    for k, (a, b) in enumerate(zip(edges[:-1], edges[1:], strict=True)):
        if (b - a) % (2 * size):
            raise ValueError(f"segment {k} of the batch has {b - a} padded tokens, not a multiple of 2 * {size}: "
                             f"the batch was not sliced for ring attention over {size} ranks; slice it with "
                             f"SequenceParallel.slice")
        chunk = (b - a) // (2 * size)
        for j in (rank, 2 * size - 1 - rank):
            index.append(torch.arange(a + j * chunk, a + (j + 1) * chunk))
            segment.append(torch.full((chunk,), k))
    if not index:
        return torch.zeros(0, dtype=torch.long), torch.zeros(0, dtype=torch.long)
    return torch.cat(index), torch.cat(segment)


class _Ring:
    """A ring of ``size`` ranks: each sends to the next and receives from the previous."""

    def __init__(self, group, rank: int, size: int):
        self.group, self.rank, self.size = group, rank, size

        def peer(r: int) -> int:
            return r if group is None else dist.get_global_rank(group, r)

        self.next, self.prev = peer((rank + 1) % size), peer((rank - 1) % size)

    def pass_on(self, tensor: torch.Tensor) -> tuple[torch.Tensor, list]:
        """Start sending ``tensor`` to the next rank and receiving the previous one's; wait on the list."""
        tensor = tensor.contiguous()  # empty_like keeps a view's strides; the transfer writes memory in order
        received = torch.empty_like(tensor)
        ops = [dist.P2POp(dist.isend, tensor, self.next, self.group),
               dist.P2POp(dist.irecv, received, self.prev, self.group)]
        return received, dist.batch_isend_irecv(ops)


def _mask(layouts: list, rank: int, src: int, device) -> torch.Tensor:
    """``[Lq, Lk]``: the query of ``rank`` may see the key of ``src`` (same segment, not after it)."""
    (qi, qs), (ki, ks) = layouts[rank], layouts[src]
    return ((qs[:, None] == ks[None, :]) & (ki[None, :] <= qi[:, None])).to(device)


def _scores(q, k, mask, scale):
    s = torch.matmul(q, k.transpose(-1, -2)) * scale  # [B, Hkv, g, Lq, Lk]
    return s.masked_fill(~mask, float("-inf"))


def _block_forward(q, k, v, mask, scale):
    s = _scores(q, k, mask, scale)
    lse = torch.logsumexp(s, dim=-1)  # -inf on a row that sees nothing in this block
    p = torch.exp(s - torch.where(torch.isinf(lse), 0.0, lse)[..., None])
    return torch.matmul(p, v), lse


class RingAttention(torch.autograd.Function):
    """``q [B, Hkv, g, L, D]`` (float32), ``k`` / ``v [B, Hkv, 1, L, D]`` -> ``out`` like ``q``."""

    @staticmethod
    def forward(ctx, q, k, v, layouts, ring: _Ring, scale: float):
        out, lse = None, None
        kv = torch.stack([k, v])
        for step in range(ring.size):
            src = (ring.rank - step) % ring.size
            if step + 1 < ring.size:
                incoming, work = ring.pass_on(kv)
            o, l_ = _block_forward(q, kv[0], kv[1], _mask(layouts, ring.rank, src, q.device), scale)
            if out is None:
                out, lse = o, l_
            else:  # merge by log-sum-exp; step 0 (the diagonal) leaves every row a finite lse
                new = torch.logaddexp(lse, l_)
                out = out * torch.exp(lse - new)[..., None] + o * torch.exp(l_ - new)[..., None]
                lse = new
            if step + 1 < ring.size:
                for w in work:
                    w.wait()
                kv = incoming
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.layouts, ctx.ring, ctx.scale = layouts, ring, scale
        return out

    @staticmethod
    def backward(ctx, dout):
        q, k, v, out, lse = ctx.saved_tensors
        ring, scale = ctx.ring, ctx.scale
        delta = (dout * out).sum(-1, keepdim=True)  # [B, Hkv, g, L, 1]
        dq = torch.zeros_like(q)
        kv = torch.stack([k, v])
        dkv = torch.zeros_like(kv)  # travels with its block; home after size hops
        for step in range(ring.size):
            src = (ring.rank - step) % ring.size
            s = _scores(q, kv[0], _mask(ctx.layouts, ring.rank, src, q.device), scale)
            p = torch.exp(s - lse[..., None])
            ds = p * (torch.matmul(dout, kv[1].transpose(-1, -2)) - delta)
            dq += torch.matmul(ds, kv[0]) * scale
            dk = (torch.matmul(ds.transpose(-1, -2), q) * scale).sum(2, keepdim=True)
            dv = torch.matmul(p.transpose(-1, -2), dout).sum(2, keepdim=True)
            dkv = dkv + torch.stack([dk, dv])
            if ring.size > 1:
                if step + 1 < ring.size:
                    kv, work_kv = ring.pass_on(kv)
                    for w in work_kv:
                        w.wait()
                dkv, work = ring.pass_on(dkv)
                for w in work:
                    w.wait()
        return dq, dkv[0], dkv[1], None, None, None


def ring_attention(query, key, value, cu_padded: torch.Tensor, group, rank: int, size: int,
                   scale: float) -> torch.Tensor:
    """Causal attention of this rank's zigzag slice over the whole ring: ``query [B, H, L, D]``, ``key`` /
    ``value [B, Hkv, L, D]`` (``H`` a multiple of ``Hkv``) -> ``[B, H, L, D]`` in ``query``'s dtype."""
    b, heads, length, dim = query.shape
    kv_heads = key.shape[1]
    layouts = [ring_layout(cu_padded, r, size) for r in range(size)]
    if layouts[rank][0].numel() != length:
        raise ValueError(f"this rank holds {length} tokens, but ring attention over {size} ranks of a batch with padded "
                         f"boundaries {cu_padded.tolist()} expects {layouts[rank][0].numel()}: slice the batch with "
                         f"SequenceParallel.slice (mode 'ring' or 'hybrid')")
    q = query.float().reshape(b, kv_heads, heads // kv_heads, length, dim)
    out = RingAttention.apply(q, key.float()[:, :, None], value.float()[:, :, None], layouts,
                              _Ring(group, rank, size), scale)
    return out.reshape(b, heads, length, dim).to(query.dtype)
