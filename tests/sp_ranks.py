"""Run by tests/test_sp_attention.py: ``world`` spawned processes (gloo, CPU, float32) train one step of a tiny
Llama on one packed row under packer's SP attention, for each case of CASES.json, and rank 0 writes per case the
per-segment loss sums and every parameter's gradient, summed over the SP group.

    python tests/sp_ranks.py WORLD CASES.json OUT

CASES.json: ``[{"name": ..., "mode": "ulysses" | "ring" | "hybrid" | "misuse", "kv_heads": 2 | 1, "size": SP size
(default: the world), "collator": attention form (default: sdpa for Ulysses, else varlen), "backward": false (forward only)}, ...]``; a case writes
``NAME-dpK.pt`` per data-parallel replica K (``misuse``: ``NAME.json``, the refusals' messages). The model, the
row and the one-process reference (:func:`reference`) come from this module, so the test and the ranks agree.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from ranks import run_cases  # noqa: E402

from packer.loader import PackedCollator, packed_loss  # noqa: E402
from packer.loader.sequence_parallel import shard_for_sequence_parallel  # noqa: E402

LENGTHS = (13, 7, 22, 5, 17, 9)  # one packed row of 73 tokens, 6 segments (no length a multiple of 4 or 8)
VOCAB = 96


def model(impl: str, kv_heads: int = 2):
    """A tiny Llama: hidden 32, 2 layers, 4 heads of 8, ``kv_heads`` key / value heads; the same weights for any
    attention implementation."""
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=kv_heads, head_dim=8, max_position_embeddings=128,
                         attention_dropout=0.0)
    torch.manual_seed(0)
    m = LlamaForCausalLM(config).float()
    m.set_attn_implementation(impl)
    return m


def row() -> dict:
    gen = torch.Generator().manual_seed(1)
    n = sum(LENGTHS)
    ids = torch.randint(1, VOCAB, (n,), generator=gen).numpy()
    cu = [0]
    for length in LENGTHS:
        cu.append(cu[-1] + length)
    return {"input_ids": ids, "labels": ids.copy(), "cu_seqlens": cu, "n_tokens": n, "media": [],
            "segment_ids": [f"s{k}" for k in range(len(LENGTHS))], "segment_modality": ["text"] * len(LENGTHS)}


def segment_losses(logits: torch.Tensor, batch: dict) -> torch.Tensor:
    """Weighted loss sum of each of the row's segments (the sliced batch's shifted targets)."""
    per_token = torch.nn.functional.cross_entropy(logits.float().reshape(-1, logits.shape[-1]),
                                                  batch["shift_labels"].reshape(-1), ignore_index=-100, reduction="none")
    weighted = per_token * batch["shift_loss_weights"].reshape(-1)
    seq = batch["seq_idx"].reshape(-1).long()
    keep = seq < len(LENGTHS)  # SP padding segments hold no weight
    return torch.zeros(len(LENGTHS), dtype=weighted.dtype).index_add(0, seq[keep], weighted[keep])


def reference(kv_heads: int = 2):
    """One process, SDPA with the packed mask: (per-segment loss sums, the loss, every parameter's gradient)."""
    m = model("sdpa", kv_heads)
    batch = PackedCollator(attention="sdpa")([row()])
    full = shard_for_sequence_parallel(batch, 0, 1)  # the shifted targets, unsliced
    logits = m(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
               position_ids=batch["position_ids"], use_cache=False).logits
    total, norm = packed_loss(logits, full, reduce=False)
    (total / norm).backward()
    return segment_losses(logits, full).detach(), (total / norm).item(), \
        {n: p.grad.clone() for n, p in m.named_parameters()}


def run_case(case: dict, out: Path) -> None:
    from packer.loader.sp_attention import SequenceParallel

    if case["mode"] == "misuse":
        return misuse(out / f"{case['name']}.json")
    mode, size = case["mode"], case.get("size", dist.get_world_size())
    sp = SequenceParallel.create(size, mode, kv_heads=case["kv_heads"])
    m = model(sp.attn_implementation, case["kv_heads"])
    sp.check_model(m)
    collator = case.get("collator", "sdpa" if mode == "ulysses" else "varlen")
    batch = PackedCollator(attention=collator, pad_to_multiple_of=size if collator == "flex" else None)([row()])
    local = sp.slice(batch)
    backward = case.get("backward", True)  # FlexAttention has no backward on CPU
    with torch.set_grad_enabled(backward):
        logits = m(**sp.model_inputs(local, m)).logits
    total, norm = packed_loss(logits, local, reduce=False)
    dist.all_reduce(norm, group=sp.group)  # the step's sum of weights over the SP group
    if backward:
        (total / norm).backward()
    segments = segment_losses(logits, local).detach()
    dist.all_reduce(segments, group=sp.group)
    grads = {n: p.grad.clone() for n, p in m.named_parameters() if p.grad is not None}
    for g in grads.values():
        dist.all_reduce(g, group=sp.group)
    if sp.rank == 0:  # one file per data-parallel replica (each ran the same row)
        torch.save({"segments": segments, "loss": float(segments.sum() / norm), "grads": grads,
                    "tokens": local["input_ids"].shape[-1]}, out / f"{case['name']}-dp{dist.get_rank() // size}.pt")


def qwen35_text(impl: str):
    """A tiny Qwen3.5 text model: a gated-delta-net layer, then an attention layer."""
    from transformers import Qwen3_5ForCausalLM, Qwen3_5TextConfig

    config = Qwen3_5TextConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                               num_attention_heads=4, num_key_value_heads=2, head_dim=8, linear_conv_kernel_dim=4,
                               linear_key_head_dim=8, linear_value_head_dim=8, linear_num_key_heads=2,
                               linear_num_value_heads=4, layer_types=["linear_attention", "full_attention"])
    m = Qwen3_5ForCausalLM(config)
    m.set_attn_implementation(impl)
    return m


def misuse(path: Path) -> None:
    """The refusals that need a process group: each message, by what was misused."""
    from packer.loader.sp_attention import SequenceParallel

    found = {}

    def attempt(key, fn):
        try:
            fn()
        except ValueError as e:
            found[key] = str(e)

    ring = SequenceParallel.create(dist.get_world_size(), "ring")
    ulysses = SequenceParallel.create(dist.get_world_size(), "ulysses")
    varlen = PackedCollator(attention="varlen")([row()])
    sdpa = PackedCollator(attention="sdpa")([row()])
    attempt("model", lambda: ring.check_model(model("sdpa")))
    attempt("collator", lambda: ring.slice(sdpa))
    attempt("slice", lambda: ring.model_inputs(ulysses.slice(sdpa)))
    attempt("rank", lambda: ring.model_inputs(shard_for_sequence_parallel(varlen, 1 - ring.rank, ring.size, mode="ring")))
    attempt("linear", lambda: ring.check_model(qwen35_text(ring.attn_implementation)))
    attempt("mode", lambda: model(ulysses.attn_implementation)(**ring.model_inputs(ring.slice(varlen))))
    if dist.get_rank() == 0:
        path.write_text(json.dumps(found))


def worker(rank: int, world: int, cases: list[dict], out: str, store: str) -> None:
    run_cases(rank, world, store, cases, out, lambda case: run_case(case, Path(out)))


if __name__ == "__main__":
    world, cases, out = int(sys.argv[1]), json.loads(Path(sys.argv[2]).read_text()), sys.argv[3]
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    torch.multiprocessing.spawn(worker, args=(world, cases, out, str(Path(out) / "store")), nprocs=world)
