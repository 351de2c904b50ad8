"""Step balance: per-step max / mean rank cost of packed rows, random order against
``TokenBalancedSampler`` (window sizes), on a generated multimodal build at 4,096 tokens.

    python bench/bench_balance.py [--records N] [--seeds 5]

The build: chat turns with lognormal lengths, long documents (split into full rows) and
LLaVA-style image turns over sample_data's images with Qwen2-VL's dynamic token counts.
Costs: attention work alone (Σ seg²), the default ``CostModel()``, and
``CostModel.for_model`` of a Qwen2-VL-7B-shaped config (LLM h = 3584, 28 layers, ViT 32 x 1280).
Figures: mean over steps of max / mean (the issue's measure), averaged over ``--seeds``
epochs, and Σ max / Σ mean (the epoch's time against perfect balance) in brackets. The
last column is :func:`~packer.schedule.balance.imbalance_floor` of the rows each epoch uses: the best
Σ max / Σ mean any assignment reaches at one row per rank, a lower bound (``≥``) above it.
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import sys
import tempfile
from functools import reduce
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from packer.build import build  # noqa: E402
from packer.config import BuildConfig  # noqa: E402
from packer.cost import CostModel  # noqa: E402
from packer.schedule.balance import group_steps, imbalance, imbalance_floor  # noqa: E402
from packer.shards.stats import ROW_FIELDS, ShardStats, shard_stats  # noqa: E402

WORDS = (ROOT / "sample_data" / "docs.jsonl").read_text().split()
IMAGES = sorted((ROOT / "sample_data" / "images").iterdir())
QWEN2_VL_7B = {
    "text_config": {"hidden_size": 3584, "intermediate_size": 18944, "num_hidden_layers": 28, "num_attention_heads": 28,
                    "num_key_value_heads": 4, "vocab_size": 152064, "hidden_act": "silu"},
    "vision_config": {"depth": 32, "embed_dim": 1280, "mlp_ratio": 4, "num_heads": 16, "hidden_size": 3584, "in_channels": 3,
                      "patch_size": 14, "spatial_merge_size": 2, "temporal_patch_size": 2},
}


def generate(path: Path, n: int, seed: int = 0) -> None:
    rng = random.Random(seed)
    words = lambda k: " ".join(rng.choices(WORDS, k=max(1, k)))  # noqa: E731
    with path.open("w") as f:
        for i in range(n):
            u = rng.random()
            if u < 0.08:  # long document: split into full rows of one segment
                f.write(json.dumps({"id": f"d{i}", "text": words(int(rng.uniform(1500, 9000)))}) + "\n")
            elif u < 0.45:  # image turn
                turns = [{"from": "human", "value": "<image>\n" + words(rng.randint(5, 40))},
                         {"from": "gpt", "value": words(int(rng.lognormvariate(4.5, 0.8)))}]
                f.write(json.dumps({"id": f"i{i}", "image": f"images/{rng.choice(IMAGES).name}", "conversations": turns}) + "\n")
            else:  # chat: lognormal lengths, a long tail
                messages = [{"role": "user", "content": words(rng.randint(5, 80))},
                            {"role": "assistant", "content": words(int(rng.lognormvariate(5.0, 1.0)))}]
                f.write(json.dumps({"id": f"c{i}", "messages": messages}) + "\n")


def row_stats(out: Path) -> dict[str, np.ndarray]:
    manifest = json.loads((out / "manifest.json").read_text())
    s = reduce(ShardStats.merge, [shard_stats(out / e["file"]) for e in manifest["files"]["packed"]], ShardStats())
    return {n: s.array(f"row_{n}") for n in ROW_FIELDS}


def figures(costs: np.ndarray, ranks: int, per_rank: int, window: int, seeds: int) -> tuple[float, float]:
    per_step = ranks * per_rank
    steps = len(costs) // per_step
    plain, weighted = [], []
    for seed in range(seeds):
        rng = np.random.default_rng(seed)
        order = rng.permutation(len(costs))[: steps * per_step]
        plan = group_steps(order, costs, ranks, per_rank, window, rng)
        plain.append(imbalance(costs, plan))
        weighted.append(imbalance(costs, plan, weighted=True))
    return float(np.mean(plain)), float(np.mean(weighted))


def random_order(costs: np.ndarray, ranks: int, per_rank: int, seeds: int) -> tuple[float, float]:
    per_step = ranks * per_rank
    steps = len(costs) // per_step
    plain, weighted = [], []
    for seed in range(seeds):
        plan = np.random.default_rng(seed).permutation(len(costs))[: steps * per_step].reshape(steps, ranks, per_rank)
        plain.append(imbalance(costs, plan))
        weighted.append(imbalance(costs, plan, weighted=True))
    return float(np.mean(plain)), float(np.mean(weighted))


def best_possible(costs: np.ndarray, ranks: int, per_rank: int, seeds: int) -> float:
    """The floor of Σ max / Σ mean over the rows each seed's epoch uses (the same rows as above)."""
    used = (len(costs) // (ranks * per_rank)) * ranks * per_rank
    return float(np.mean([imbalance_floor(costs[np.random.default_rng(seed).permutation(len(costs))[:used]], ranks, per_rank)
                          for seed in range(seeds)]))


def table(stats: dict[str, np.ndarray], seeds: int, windows: list[int]) -> None:
    models = {"attention Σseg²": stats["attention"], "CostModel()": CostModel()(stats),
              "Qwen2-VL-7B for_model": CostModel.for_model(QWEN2_VL_7B)(stats)}
    steps_of = lambda r, b: len(stats["tokens"]) // (r * b)  # noqa: E731
    head = "| cost | ranks x batch | steps | random | " + " | ".join(f"window {w}" for w in windows)
    print(head + " | best possible (Σmax/Σmean) |")
    print("|" + "---|" * (5 + len(windows)))
    for name, costs in models.items():
        for ranks, per_rank in ((8, 1), (64, 1), (8, 4), (64, 4)):
            if steps_of(ranks, per_rank) == 0:
                continue
            r = random_order(costs, ranks, per_rank, seeds)
            cells = [figures(costs, ranks, per_rank, w, seeds) for w in windows]
            best = f"{'' if per_rank == 1 else '≥ '}{best_possible(costs, ranks, per_rank, seeds):.3f}"
            print(f"| {name} | {ranks} x {per_rank} | {steps_of(ranks, per_rank)} | {r[0]:.3f} ({r[1]:.3f}) | "
                  + " | ".join(f"{a:.3f} ({b:.3f})" for a, b in cells) + f" | {best} |")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--records", type=int, nargs="+", default=[1200, 12000])
    ap.add_argument("--seeds", type=int, default=5)
    ap.add_argument("--windows", type=int, nargs="+", default=[1, 4, 16, 64, 10**6])
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        for n in args.records:
            data, out = Path(tmp) / f"in{n}.jsonl", Path(tmp) / f"out{n}"
            generate(data, n)
            if not (Path(tmp) / "images").exists():
                shutil.copytree(ROOT / "sample_data" / "images", Path(tmp) / "images")
            build(BuildConfig(input=(str(data),), output=str(out), tokenizer=str(ROOT / "sample_data" / "tokenizer"),
                              image_tokens="dynamic", oversize="split", workers=1), progress=False)
            stats = row_stats(out)
            seg = stats["attention"] / np.maximum(stats["tokens"], 1)
            print(f"\nbuild: {n:,} generated records -> {len(stats['tokens'])} rows at 4096, {int(stats['image_items'].sum())} "
                  f"images, Σseg²/tokens per row {seg.min():.0f}..{seg.max():.0f} (median {np.median(seg):.0f}); "
                  f"windows in steps ({10**6} = whole epoch), {args.seeds} epochs\n")
            table(stats, args.seeds, args.windows)


if __name__ == "__main__":
    main()
