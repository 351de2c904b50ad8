"""Recompiles of a compiled model over 50 training steps, rows padded to their batch's longest
length against rows padded to the build's fixed row lengths (--row-lengths auto:4).

sample_data is built at --max-length 1024 with --row-lengths auto:4; a tiny random Llama (sdpa,
packer's block-diagonal masks) is wrapped in torch.compile and trained 50 steps of one row each,
in TokenBalancedSampler's order. Counted: graphs compiled (dynamo frames), distinct batch
shapes, wall time. dynamic=False is what shape-specialised kernels and CUDA graphs need (each new
length compiles again, up to the recompile limit, raised here so every one counts); the default
(automatic dynamic shapes) recompiles once into a dynamic graph.

    python bench/bench_compile.py [--backend aot_eager|inductor|eager] [--steps 50]

aot_eager traces forward and backward as inductor does, without generating code (seconds per
graph instead of tens). Figures: docs/BENCHMARKS.md ("Compiled training and row lengths").
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]


def run(ds, collate, steps: int, backend: str, dynamic) -> dict:
    from torch._dynamo.testing import CompileCounterWithBackend
    from transformers import LlamaConfig, LlamaForCausalLM

    from packer.loader import TokenBalancedSampler, model_inputs, packed_loss

    cfg = LlamaConfig(vocab_size=ds.manifest.tokenizer["vocab_size"], hidden_size=64, intermediate_size=128,
                      num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=ds.max_length)
    cfg._attn_implementation = "sdpa"
    torch._dynamo.reset()
    torch.manual_seed(0)
    counter = CompileCounterWithBackend(backend)
    model = torch.compile(LlamaForCausalLM(cfg), backend=counter, dynamic=dynamic)
    sampler = TokenBalancedSampler(ds, num_replicas=1, rank=0, batch_size=1, seed=0)
    shapes, step, epoch, start = set(), 0, 0, time.perf_counter()
    while step < steps:
        sampler.set_epoch(epoch)
        for i in sampler:
            batch = collate([ds[i]])
            shapes.add(tuple(batch["input_ids"].shape))
            packed_loss(model(**model_inputs(batch)).logits, batch).backward()
            step += 1
            if step == steps:
                break
        epoch += 1
    return {"graphs": counter.frame_count, "shapes": len(shapes), "seconds": time.perf_counter() - start}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--backend", default="aot_eager")
    ap.add_argument("--steps", type=int, default=50)
    args = ap.parse_args()
    from packer.build import build
    from packer.config import resolve
    from packer.loader import PackedCollator, PackedDataset

    torch._dynamo.config.recompile_limit = 1000  # count every recompile instead of falling back to eager after 8
    with tempfile.TemporaryDirectory() as tmp:
        build(resolve(ROOT / "pipelines" / "sample.toml", output=tmp, max_length=1024, row_lengths="auto:4",
                      max_bad_fraction=1.0), progress=False)
        ds = PackedDataset(tmp)
        stats = ds.manifest.stats
        tokens = [int(ds[i]["n_tokens"]) for i in range(len(ds))]
        print(f"{len(ds)} rows of 1024, {len(set(tokens))} distinct lengths; --row-lengths auto:4 -> {ds.row_lengths} "
              f"(rows {stats['rows_by_length']}, {stats['row_length_padding']:,} padding tokens)")
        print(f"backend {args.backend}, {args.steps} steps of one row, torch {torch.__version__}")
        print(f"{'dynamic':<9} {'rows padded to':<22} {'graphs':>7} {'shapes':>7} {'seconds':>8}")
        for dynamic in (False, None):
            for name, collate in (("the batch's longest", PackedCollator(attention="sdpa")),
                                  ("the row lengths", PackedCollator(attention="sdpa", row_lengths=ds.row_lengths))):
                r = run(ds, collate, args.steps, args.backend, dynamic)
                print(f"{str(dynamic):<9} {name:<22} {r['graphs']:>7} {r['shapes']:>7} {r['seconds']:>8.1f}", flush=True)


if __name__ == "__main__":
    main()
