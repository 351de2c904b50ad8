"""Loader benchmark: collate cost per mask form, mask memory, and training throughput of
packed vs padded batches of the same samples (CPU, a small random Llama).

    python bench/bench_loader.py
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from packer.loader import PackedCollator  # noqa: E402
from packer.pack import plan  # noqa: E402


def rows_of(lengths: np.ndarray, capacity: int, rng) -> list[dict]:
    p = plan(lengths, capacity, seed=0)
    rows = []
    for b in range(p.n_bins):
        seg = p.lengths[p.offsets[b] : p.offsets[b + 1]]
        n = int(seg.sum())
        ids = rng.integers(1, 1000, n)
        cu = np.concatenate([[0], np.cumsum(seg)])
        labels = ids.copy()
        labels[cu[:-1]] = -100
        rows.append({"input_ids": ids, "labels": labels, "cu_seqlens": cu, "n_tokens": n, "media": []})
    return rows


def mask_bytes(batch: dict) -> int:
    m = batch.get("attention_mask")
    if m is None:
        return sum(v.numel() * v.element_size() for k, v in batch.items() if k.startswith("cu_seq") and hasattr(v, "numel"))
    if isinstance(m, torch.Tensor):
        return m.numel() * m.element_size()
    return sum(t.numel() * t.element_size() for t in (m.kv_num_blocks, m.kv_indices, m.full_kv_num_blocks, m.full_kv_indices)
               if t is not None)


def collate_costs() -> None:
    rng = np.random.default_rng(0)
    lengths = np.clip(rng.lognormal(6.4, 1.0, 4000), 16, 8192).astype(np.int64)
    rows = rows_of(lengths, 8192, rng)[:8]
    print(f"collate: B=8 rows of L=8192 ({np.mean([len(r['cu_seqlens']) - 1 for r in rows]):.1f} segments per row)")
    for attention, kwargs in (("sdpa", {}), ("eager", {"mask_dtype": torch.bfloat16}), ("flex", {}), ("varlen", {}),
                              ("position_ids", {})):
        import warnings

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            pad_to = None if attention in ("varlen", "position_ids") else 8192
            collate = PackedCollator(attention=attention, pad_to=pad_to, **kwargs)
        collate(rows)  # warm up
        t0 = time.perf_counter()
        for _ in range(3):
            batch = collate(rows)
        dt = (time.perf_counter() - t0) / 3
        print(f"  {attention:<13} {1000 * dt:8.1f} ms per batch   mask {mask_bytes(batch) / 2**20:10.3f} MiB")


def throughput() -> None:
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.set_num_threads(2)
    rng = np.random.default_rng(1)
    capacity, batch_rows = 1024, 4
    lengths = np.clip(rng.lognormal(5.0, 0.9, 600), 16, capacity).astype(np.int64)
    rows = rows_of(lengths, capacity, rng)
    cfg = LlamaConfig(vocab_size=1000, hidden_size=256, intermediate_size=512, num_hidden_layers=4, num_attention_heads=4,
                      num_key_value_heads=4, max_position_embeddings=capacity)
    cfg._attn_implementation = "sdpa"
    torch.manual_seed(0)
    model = LlamaForCausalLM(cfg)
    opt = torch.optim.SGD(model.parameters(), lr=1e-4)
    budget = 40  # seconds per scheme

    def run(batches, kind):
        tokens = computed = 0
        t0 = time.perf_counter()
        for b in batches:
            if kind == "packed":
                out = model(input_ids=b["input_ids"], attention_mask=b["attention_mask"], position_ids=b["position_ids"],
                            labels=b["labels"])
            else:
                out = model(input_ids=b["input_ids"], attention_mask=b["attention_mask"], labels=b["labels"])
            out.loss.backward()
            opt.step()
            opt.zero_grad()
            tokens += int(b["real"])
            computed += b["input_ids"].numel()
            if time.perf_counter() - t0 > budget:
                break
        dt = time.perf_counter() - t0
        return tokens / dt, tokens / computed, tokens

    collate = PackedCollator(attention="sdpa")
    packed = []
    for s in range(0, len(rows), batch_rows):
        b = collate(rows[s : s + batch_rows])
        b["real"] = sum(r["n_tokens"] for r in rows[s : s + batch_rows])
        packed.append(b)
    # Padded: the same samples, shuffled, batches of 8 padded to their longest (attention_mask [B, L]).
    order = rng.permutation(len(lengths))
    padded = []
    for s in range(0, len(order), 8):
        ls = lengths[order[s : s + 8]]
        L = int(ls.max())
        ids = torch.zeros(len(ls), L, dtype=torch.long)
        mask = torch.zeros(len(ls), L, dtype=torch.long)
        for i, n in enumerate(ls):
            ids[i, :n] = torch.as_tensor(rng.integers(1, 1000, n))
            mask[i, :n] = 1
        labels = ids.masked_fill(mask == 0, -100)
        padded.append({"input_ids": ids, "attention_mask": mask, "labels": labels, "real": int(ls.sum())})
    run(packed[:1], "packed")
    run(padded[:1], "padded")
    p_rate, p_share, _ = run(packed, "packed")
    d_rate, d_share, _ = run(padded, "padded")
    print(f"training throughput, Llama 4 x 256 on CPU (2 threads), {len(lengths)} samples (mean {lengths.mean():.0f} tokens):")
    print(f"  packed rows of {capacity} (B={batch_rows}): {p_rate:8.0f} real tokens/s, valid-token share {100 * p_share:.2f}%")
    print(f"  padded batches of 8 samples:  {d_rate:8.0f} real tokens/s, valid-token share {100 * d_share:.2f}%")
    print(f"  speed-up packed / padded: {p_rate / d_rate:.2f}x")


if __name__ == "__main__":
    collate_costs()
    throughput()
