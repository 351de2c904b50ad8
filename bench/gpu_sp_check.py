"""GPU check: zigzag ring attention over ``torch.nn.attention.varlen.varlen_attn`` in bf16, simulated ranks on one GPU.

    python bench/gpu_sp_check.py [--tokens 65536] [--segments 24] [--heads 16] [--kv-heads 4] [--dim 128] [--sizes 2 4 8]
    python bench/gpu_sp_check.py --cpu      # the same composition over a float32 math kernel, small: no GPU needed

The packed sequence (``--segments`` documents of random lengths) is cut as packer's ``mode="ring"`` cuts it (each
segment padded to a multiple of 2 x size, rank r holding chunks r and 2 x size - 1 - r), and every rank's output is
computed block by block as the ring computes it: at step s rank r holds rank (r - s)'s keys and values; the own
block is causal, an earlier rank's first chunk is seen whole by both query chunks, a later rank's two chunks are seen
whole by the second query chunk only; the partial results merge by log-sum-exp. The ranks' outputs, put back in
place, are compared with one unsliced causal ``varlen_attn`` over the whole batch: the max absolute error (bf16), and
the time of the unsliced call against the slowest simulated rank (its ``size`` block calls, no communication).

Then Ulysses over a flattened (``varlen``) batch: after the all-to-all a rank holds every token of ``heads / size``
query heads (and their key / value heads), and :func:`packer.loader.sp_attention.varlen_local` runs the varlen
kernel over the padded global boundaries (flash-attn's ``flash_attn_varlen_func`` where installed, else
``varlen_attn`` with the key / value heads repeated). Checked against the float32 per-segment math, forward and the
gradients of q, k, v (bf16: max absolute error), with grouped heads (``--kv-heads``), and timed against one ``size``
share of the heads. Exits 0 with a message where CUDA (or ``varlen_attn``) is absent; the CPU tests never run it.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def math_attn(q, k, v, cu_q, cu_k, causal: bool, scale: float):
    """Per segment softmax attention in float32: ``(out [T, H, D], lse [T, H])``."""
    out = torch.zeros(q.shape, dtype=torch.float32, device=q.device)
    lse = torch.full(q.shape[:2], float("-inf"), device=q.device)
    for a, b, c, d in zip(cu_q[:-1].tolist(), cu_q[1:].tolist(), cu_k[:-1].tolist(), cu_k[1:].tolist(), strict=True):
        if b == a or d == c:
            continue
        s = torch.einsum("qhd,khd->hqk", q[a:b].float(), k[c:d].float()) * scale
        if causal:
            s = s.masked_fill(torch.ones(b - a, d - c, dtype=torch.bool, device=q.device).triu(1), float("-inf"))
        lse[a:b] = torch.logsumexp(s, -1).transpose(0, 1)
        out[a:b] = torch.einsum("hqk,khd->qhd", torch.softmax(s, -1), v[c:d].float())
    return out.to(q.dtype), lse


def flash_attn(q, k, v, cu_q, cu_k, causal: bool, scale: float):
    from torch.nn.attention.varlen import AuxRequest, varlen_attn

    lengths_q, lengths_k = cu_q.diff(), cu_k.diff()
    keep = (lengths_q > 0) & (lengths_k > 0)  # a query chunk with no key block: no call for it
    out = torch.zeros_like(q)
    lse = torch.full(q.shape[:2], float("-inf"), device=q.device)
    if not bool(keep.any()):
        return out, lse
    rows = torch.cat([torch.arange(a, b, device=q.device) for a, b, kept in
                      zip(cu_q[:-1].tolist(), cu_q[1:].tolist(), keep.tolist(), strict=True) if kept])
    cols = torch.cat([torch.arange(a, b, device=q.device) for a, b, kept in
                      zip(cu_k[:-1].tolist(), cu_k[1:].tolist(), keep.tolist(), strict=True) if kept])
    cq = torch.cat([cu_q.new_zeros(1), lengths_q[keep].cumsum(0)]).to(torch.int32)
    ck = torch.cat([cu_k.new_zeros(1), lengths_k[keep].cumsum(0)]).to(torch.int32)
    o, s = varlen_attn(q[rows], k[cols], v[cols], cq, ck, int(lengths_q[keep].max()), int(lengths_k[keep].max()),
                       return_aux=AuxRequest(lse=True), scale=scale, window_size=(-1, 0) if causal else (-1, -1))
    s = s if s.shape[0] == rows.numel() else s.transpose(0, 1)  # (T, H) whichever way the kernel lays it out
    out[rows], lse[rows] = o, s.float()
    return out, lse


def layout(lengths: list[int], size: int):
    """Per rank: the local tokens' global indices and, per segment, its two chunks' sizes (equal)."""
    ranks = [[] for _ in range(size)]
    chunks, start = [], 0
    for n in lengths:
        chunk = -(-n // (2 * size))
        chunks.append(chunk)
        for r in range(size):
            for j in (r, 2 * size - 1 - r):
                ranks[r].append(torch.arange(start + j * chunk, start + (j + 1) * chunk))
        start += 2 * size * chunk
    return [torch.cat(r) for r in ranks], chunks, start


def ring_rank(qkv_of, rank: int, size: int, chunks: list[int], attn, scale: float):
    """Rank ``rank``'s output, its ``size`` ring steps merged by log-sum-exp."""
    q, _, _ = qkv_of(rank)
    def cu(sizes):
        return torch.tensor([0, *torch.tensor(sizes).cumsum(0).tolist()], device=q.device)

    acc_out, acc_lse = None, None
    for step in range(size):
        src = (rank - step) % size
        _, k, v = qkv_of(src)
        both = [2 * c for c in chunks]
        if src == rank:
            out, lse = attn(q, k, v, cu(both), cu(both), True, scale)
        elif src < rank:  # both query chunks see the source's first chunk whole
            first = torch.cat([torch.arange(a, a + c) for a, c in zip(cu(both)[:-1].tolist(), chunks, strict=True)])
            out, lse = attn(q, k[first], v[first], cu(both), cu(chunks), False, scale)
        else:  # the second query chunk sees both source chunks whole
            second = torch.cat([torch.arange(a + c, a + 2 * c) for a, c in zip(cu(both)[:-1].tolist(), chunks, strict=True)])
            o, s = attn(q[second], k, v, cu(chunks), cu(both), False, scale)
            out, lse = torch.zeros_like(q), torch.full(q.shape[:2], float("-inf"), device=q.device)
            out[second], lse[second] = o, s
        if acc_out is None:
            acc_out, acc_lse = out.float(), lse
            continue
        new = torch.logaddexp(acc_lse, lse)
        safe = torch.where(torch.isinf(new), torch.zeros_like(new), new)
        acc_out = acc_out * torch.exp(acc_lse - safe)[..., None] + out.float() * torch.exp(lse - safe)[..., None]
        acc_lse = new
    return acc_out.to(q.dtype)


def run(tokens: int, segments: int, heads: int, dim: int, sizes: list[int], device: str, dtype, attn) -> None:
    gen = torch.Generator().manual_seed(0)
    cuts = sorted(torch.randperm(tokens - 1, generator=gen)[: segments - 1].add(1).tolist())
    lengths = [b - a for a, b in zip([0, *cuts], [*cuts, tokens], strict=True)]
    scale = dim**-0.5
    q, k, v = (torch.randn(tokens, heads, dim, generator=gen).to(device, dtype) for _ in range(3))
    cu = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], device=device)
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    reference, _ = attn(q, k, v, cu, cu, True, scale)
    sync()
    t0 = time.perf_counter()
    reference, _ = attn(q, k, v, cu, cu, True, scale)
    sync()
    whole = time.perf_counter() - t0
    print(f"{tokens} tokens, {segments} segments ({min(lengths)}-{max(lengths)}), {heads} heads of {dim}, {dtype}: "
          f"unsliced causal varlen {whole * 1e3:.2f} ms")
    for size in sizes:
        index, chunks, padded = layout(lengths, size)
        place = torch.full((padded,), -1, dtype=torch.long)  # padded place -> real token (or -1: padding)
        start_padded, start = 0, 0
        for n, c in zip(lengths, chunks, strict=True):
            place[start_padded : start_padded + n] = torch.arange(start, start + n)
            start_padded += 2 * size * c
            start += n

        def local(t, rank, index=index, place=place):
            got = place[index[rank]]
            out = torch.zeros(got.numel(), *t.shape[1:], dtype=t.dtype, device=t.device)
            out[got >= 0] = t[got[got >= 0].to(t.device)]
            return out

        def qkv_of(rank, local=local):
            return local(q, rank), local(k, rank), local(v, rank)

        error, slowest = 0.0, 0.0
        for rank in range(size):
            sync()
            t0 = time.perf_counter()
            out = ring_rank(qkv_of, rank, size, chunks, attn, scale)
            sync()
            slowest = max(slowest, time.perf_counter() - t0)
            got = place[index[rank]]
            real = got >= 0
            error = max(error, (out[real].float() - reference[got[real].to(device)].float()).abs().max().item())
        print(f"  ring over {size} simulated ranks: max |error| {error:.3e}, slowest rank {slowest * 1e3:.2f} ms "
              f"({size} block calls, no communication)")


def ulysses(tokens: int, segments: int, heads: int, kv_heads: int, dim: int, sizes: list[int], device: str, dtype) -> None:
    """:func:`varlen_local` on one Ulysses rank's heads (``heads / size`` query heads, their key / value heads) against
    the float32 per-segment math: forward and the gradients of q, k, v."""
    from packer.loader.sp_attention import varlen_local

    gen = torch.Generator().manual_seed(1)
    cuts = sorted(torch.randperm(tokens - 1, generator=gen)[: segments - 1].add(1).tolist())
    cu = torch.tensor([0, *cuts, tokens])
    scale = dim**-0.5
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    kernel = "math (SDPA, block-diagonal causal mask)"
    if device == "cuda":
        try:
            import flash_attn  # noqa: F401

            kernel = "flash_attn_varlen_func"
        except ImportError:
            kernel = "torch varlen_attn"
    print(f"Ulysses local kernel ({kernel}), {tokens} tokens, {segments} segments, {heads} heads "
          f"({kv_heads} key / value) of {dim}, {dtype}")
    for size in sizes:
        h, hk = heads // size, max(kv_heads // size, 1)  # this rank's share (key / value heads replicated when fewer)
        q, k, v = (torch.randn(1, n, tokens, dim, generator=gen).to(device) for n in (h, hk, hk))
        dout = torch.randn(1, h, tokens, dim, generator=gen).to(device)
        low = [x.to(dtype).requires_grad_() for x in (q, k, v)]
        out = varlen_local(*low, cu, scale)
        out.backward(dout.to(dtype))
        sync()
        for x in low:
            x.grad = None  # the warm-up's
        t0 = time.perf_counter()
        out = varlen_local(*low, cu, scale)
        out.backward(dout.to(dtype))
        sync()
        took = time.perf_counter() - t0
        ref = [x.float().detach().requires_grad_() for x in low]
        group = h // hk
        o_ref = math_attn(ref[0][0].transpose(0, 1), ref[1][0].repeat_interleave(group, 0).transpose(0, 1),
                          ref[2][0].repeat_interleave(group, 0).transpose(0, 1), cu.to(device), cu.to(device), True,
                          scale)[0].transpose(0, 1)[None]
        o_ref.backward(dout.float())
        errors = [(out.float() - o_ref).abs().max().item()] + [
            (a.grad.float() - b.grad).abs().max().item() for a, b in zip(low, ref, strict=True)]
        print(f"  SP {size}: {h} query heads, {hk} key / value heads per rank: max |error| out {errors[0]:.3e}, "
              f"dq {errors[1]:.3e}, dk {errors[2]:.3e}, dv {errors[3]:.3e}; forward + backward {took * 1e3:.2f} ms")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tokens", type=int, default=65536)
    ap.add_argument("--segments", type=int, default=24)
    ap.add_argument("--heads", type=int, default=16)
    ap.add_argument("--kv-heads", type=int, default=4)
    ap.add_argument("--dim", type=int, default=128)
    ap.add_argument("--sizes", type=int, nargs="+", default=[2, 4, 8])
    ap.add_argument("--cpu", action="store_true", help="float32 math kernel on CPU, 512 tokens: the composition alone")
    args = ap.parse_args()
    if args.cpu:
        run(512, 6, 2, 16, args.sizes, "cpu", torch.float32, math_attn)
        ulysses(512, 6, 8, 2, 16, args.sizes, "cpu", torch.float32)
        return 0
    if not torch.cuda.is_available():
        print("gpu_sp_check: no CUDA device here; nothing measured (run it on a GPU machine; --cpu checks the "
              "composition on a float32 math kernel)")
        return 0
    try:
        from torch.nn.attention.varlen import varlen_attn  # noqa: F401
    except ImportError:
        print(f"gpu_sp_check: torch {torch.__version__} has no torch.nn.attention.varlen.varlen_attn; nothing measured")
        return 0
    print(f"device: {torch.cuda.get_device_name()}, torch {torch.__version__}")
    run(args.tokens, args.segments, args.heads, args.dim, args.sizes, "cuda", torch.bfloat16, flash_attn)
    ulysses(args.tokens, args.segments, args.heads, args.kv_heads, args.dim, args.sizes, "cuda", torch.bfloat16)
    return 0


if __name__ == "__main__":
    sys.exit(main())
