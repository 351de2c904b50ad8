"""Step plans balanced on three costs (:mod:`packer.schedule.steps`) against random steps and token-only balance
(:class:`~packer.loader.TokenBalancedSampler`), on generated mixed corpora packed by packer's planner.

    python bench/bench_steps.py [--samples N] [--capacity 8192] [--seeds 3]

The corpora: text chats (lognormal lengths), multi-image turns (1-6 images, Qwen3-VL's 32-pixel merged
tokens at 224-1280 px sides), videos (8-96 frames at 2 fps, 64-300 merged tokens a temporal step of two
frames, a timestamp between steps) and audio clips (2-30 s, 25 tokens a second; Whisper's encoder pads each clip
to 30 s); answers are the trained tokens. Two mixes by samples: ``mixed`` (50% text, 25% image, 15% video,
10% audio) and ``video-heavy`` (25%, 15%, 50%, 10%). Each is packed by :func:`packer.pack.plan` (BFD) into rows
of ``--capacity`` tokens; a row's statistics are its samples' (:func:`packer.shards.stats.sample_stats` names).

Cost models: ``CostModel.for_model`` of a Qwen3-VL-2B-shaped config (a 2B LLM, a 24-layer ViT of width 1024,
DeepStack) and of a Qwen2.5-Omni-7B-shaped thinker (a 7B LLM, a 32-layer windowed ViT, a 32-layer Whisper
encoder) -- FLOPs of forward + backward, every tower trained -- and the Qwen3-VL-2B shape's coefficients in
seconds as ``packer calibrate --device cuda --dtype bfloat16 --max-tokens 16384 --max-image-tokens 8192`` fitted
them on an H200 (``bench/calibrated_qwen3vl2b_h200.json``: random weights, sdpa). Figures per cost (llm,
encoder, supervised): Σ over steps of the slowest rank / Σ of the mean rank (1.000 = no rank waits); ``time``:
the simulated epoch, Σ over steps of the slowest rank's llm + encoder cost, as a ratio token-only / plan (> 1:
the plan is faster), and in brackets token-only / a perfectly balanced epoch (Σ over steps of the mean rank):
the most any plan could gain.

    python bench/bench_steps.py --held-out [--samples 12000] [--capacity 32768] [--corpora 3]

A held-out-like set: the video-heavy mix, 12,000 samples packed at 32,768 tokens, about 1,200 rows (a few hundred
steps at 8 ranks x 1, where one row a rank leaves the planner only the choice of which rows share a step), one
corpus per seed, packed without and with a row encoder budget (``--max-row-encoder auto:0.2``, as
``bench_row_budget.py`` packs). Per corpus, cost model and budget: token-only balance and the plan (seed 0) per
cost, the slowest cost of the plan, and each cost's floor alone (:func:`packer.schedule.balance.imbalance_floor`: the best
any plan balancing that cost only reaches at one row per rank; no floor of the three at once is known).
"""

from __future__ import annotations

import argparse
import functools
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from packer.config.fields import BuildConfig  # noqa: E402
from packer.cost import CostModel  # noqa: E402
from packer.pack import plan  # noqa: E402
from packer.schedule.balance import imbalance_floor  # noqa: E402
from packer.schedule.steps import measure, plan_steps, token_only  # noqa: E402
from packer.stages.planning import with_budget  # noqa: E402

QWEN3_VL_2B = {
    "text_config": {"hidden_size": 2048, "intermediate_size": 6144, "num_hidden_layers": 28, "num_attention_heads": 16,
                    "num_key_value_heads": 8, "head_dim": 128, "vocab_size": 151936, "hidden_act": "silu"},
    "vision_config": {"model_type": "qwen3_vl", "depth": 24, "hidden_size": 1024, "intermediate_size": 4096,
                      "num_heads": 16, "out_hidden_size": 2048, "patch_size": 16, "spatial_merge_size": 2,
                      "temporal_patch_size": 2, "in_channels": 3, "deepstack_visual_indexes": [5, 11, 17]},
}
QWEN25_OMNI_7B = {
    "text_config": {"hidden_size": 3584, "intermediate_size": 18944, "num_hidden_layers": 28, "num_attention_heads": 28,
                    "num_key_value_heads": 4, "vocab_size": 152064, "hidden_act": "silu"},
    "vision_config": {"depth": 32, "hidden_size": 1280, "intermediate_size": 3420, "num_heads": 16,
                      "out_hidden_size": 3584, "patch_size": 14, "spatial_merge_size": 2, "temporal_patch_size": 2,
                      "in_channels": 3, "window_size": 112, "fullatt_block_indexes": [7, 15, 23, 31]},
    "audio_config": {"d_model": 1280, "encoder_layers": 32, "encoder_ffn_dim": 5120, "max_source_positions": 1500,
                     "num_mel_bins": 128},
}
MIXES = {"mixed": (0.50, 0.25, 0.15, 0.10), "video-heavy": (0.25, 0.15, 0.50, 0.10)}
FIELDS = ("tokens", "attention", "trained", "image_items", "image_tokens", "image_square", "video_items",
          "video_tokens", "video_square", "audio_items", "audio_tokens", "audio_square")


def generate(n: int, mix: tuple[float, ...], capacity: int, seed: int) -> dict[str, np.ndarray]:
    """Per sample, the statistics of :func:`packer.shards.stats.sample_stats`."""
    rng = np.random.default_rng(seed)
    out = {k: np.zeros(n) for k in FIELDS}
    kinds = rng.choice(4, size=n, p=mix)
    for i, kind in enumerate(kinds.tolist()):
        prompt = int(rng.integers(10, 300))
        answer = int(min(rng.lognormal(5.0, 1.0), 3000))
        media = 0
        if kind == 0:
            prompt, answer = int(min(rng.lognormal(5.5, 1.0), 4000)), int(min(rng.lognormal(5.8, 0.9), 4000))
        elif kind == 1:
            sides = rng.integers(7, 41, size=(int(rng.integers(1, 7)), 2))  # 224..1280 px in 32 px tokens
            tokens = sides.prod(1).astype(np.float64)
            out["image_items"][i], out["image_tokens"][i] = len(tokens), tokens.sum()
            out["image_square"][i] = (tokens**2).sum()
            media = int(tokens.sum())
        elif kind == 2:
            steps = int(rng.integers(4, 49))  # 8..96 frames, two a step
            per_step = int(rng.integers(64, 301))
            tokens = steps * per_step
            out["video_items"][i], out["video_tokens"][i] = 1, tokens
            out["video_square"][i] = tokens**2 / steps
            media = tokens + 6 * steps  # a timestamp's text between steps
        else:
            seconds = rng.uniform(2, 30)
            out["audio_items"][i], out["audio_tokens"][i] = 1, int(25 * seconds)
            out["audio_square"][i] = int(25 * seconds) ** 2
            media = int(25 * seconds)
        length = min(prompt + media + answer, capacity)
        out["tokens"][i] = length
        out["trained"][i] = max(0, min(answer, length - prompt - media) - 1)
    out["attention"] = out["tokens"] ** 2
    out["media_items"] = sum(out[f"{k}_items"] for k in ("image", "video", "audio"))
    out["media_tokens"] = sum(out[f"{k}_tokens"] for k in ("image", "video", "audio"))
    return out


def rows_of(samples: dict[str, np.ndarray], capacity: int, seed: int) -> tuple[dict[str, np.ndarray], float]:
    p = plan(samples["tokens"].astype(np.int64), capacity, seed=seed)
    row = np.repeat(np.arange(p.n_bins), np.diff(p.offsets))
    rows = {k: np.bincount(row, weights=v[p.indices], minlength=p.n_bins) for k, v in samples.items()}
    return rows, p.n_bins / p.lower_bound


def figures(rows, model: CostModel, ranks: int, per_rank: int, seeds: int) -> dict[str, dict[str, float]]:
    vec = model.vector(rows)
    scalar = CostModel()(rows)  # what TokenBalancedSampler balances by default: tokens and attention pairs
    n = len(vec) // (ranks * per_rank) * ranks * per_rank
    out: dict[str, list[dict[str, float]]] = {"random": [], "token-only": [], "plan": []}
    for seed in range(seeds):
        rng = np.random.default_rng(seed)
        random = rng.permutation(len(vec))[:n].reshape(-1, ranks, per_rank)
        out["random"].append(measure(vec, random))
        out["token-only"].append(measure(vec, token_only(vec, scalar, ranks, per_rank, seed=seed, epoch=0)))
        out["plan"].append(measure(vec, plan_steps(vec, ranks, per_rank, seed=seed)))
    out["perfect"] = [{"time": float(vec[:n, :2].sum() / ranks)}]  # every step's ranks equal: Σ mean
    return {k: {c: float(np.mean([m[c] for m in v])) for c in v[0]} for k, v in out.items()}


def models() -> dict[str, CostModel]:
    return {"Qwen3-VL-2B": CostModel.for_model(QWEN3_VL_2B),
            "Qwen3-VL-2B, H200-calibrated": CostModel.load(ROOT / "bench" / "calibrated_qwen3vl2b_h200.json"),
            "Qwen2.5-Omni-7B": CostModel.for_model(QWEN25_OMNI_7B)}


def held_out(samples: int, capacity: int, corpora: int, ranks: int = 8, per_rank: int = 1) -> None:
    """The table of ``--held-out`` (module doc): one line per generated corpus, cost model and row encoder budget."""
    print("| corpus seed | cost model | row encoder budget | rows, rows / bound | token-only llm / encoder / supervised | "
          "plan llm | plan encoder | plan supervised | plan's slowest cost | floor of each cost alone |")
    print("|---|---|---|---|---|---:|---:|---:|---:|---|")
    costs = ("llm", "encoder", "supervised")
    for seed in range(corpora):
        corpus = generate(samples, MIXES["video-heavy"], capacity, seed=seed)
        lengths = corpus["tokens"].astype(np.int64)
        bound = -(-int(lengths.sum()) // capacity)
        for name, model in models().items():
            encoder = model.vector(corpus)[:, 1]
            for setting in ("off", "auto", "auto:0.2"):  # --max-row-encoder (bench_row_budget.py)
                budgets = BuildConfig(max_row_encoder=setting).encoder_budgets(float(encoder.sum()), bound)
                p = with_budget(functools.partial(plan, lengths, capacity, seed=seed), encoder, budgets)
                row = np.repeat(np.arange(p.n_bins), np.diff(p.offsets))
                rows = {k: np.bincount(row, weights=v[p.indices], minlength=p.n_bins) for k, v in corpus.items()}
                vec = model.vector(rows)
                planned = measure(vec, plan_steps(vec, ranks, per_rank, seed=0))
                tokens = measure(vec, token_only(vec, CostModel()(rows), ranks, per_rank, seed=0))
                used = len(vec) // (ranks * per_rank) * ranks * per_rank
                floors = [imbalance_floor(vec[:used, k], ranks, per_rank) for k in range(3)]
                print(f"| {seed} | {name} | {setting} | {p.n_bins:,}, "
                      f"{p.n_bins / p.bound:.4f} | " + " / ".join(f"{tokens[c]:.3f}" for c in costs) + " | "
                      + " | ".join(f"{planned[c]:.3f}" for c in costs) + f" | {max(planned[c] for c in costs):.3f} | "
                      + " / ".join(f"{f:.3f}" for f in floors) + " |")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--samples", type=int, default=None, help="default 20,000 (12,000 with --held-out)")
    ap.add_argument("--capacity", type=int, default=None, help="default 8,192 (32,768 with --held-out)")
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--held-out", action="store_true", help="the held-out-like set at 8 ranks x 1 (module doc)")
    ap.add_argument("--corpora", type=int, default=3, help="--held-out: generated corpora (seeds 0..N-1)")
    args = ap.parse_args()
    if args.held_out:
        held_out(args.samples or 12000, args.capacity or 32768, args.corpora)
        return
    args.samples, args.capacity = args.samples or 20000, args.capacity or 8192
    print("| mix | cost model | ranks x batch | rows, rows / bound | order | llm | encoder | supervised | "
          "time token-only / plan (most possible) |")
    print("|---|---|---|---|---|---|---|---|---|")
    for mix_name, mix in MIXES.items():
        rows, ratio = rows_of(generate(args.samples, mix, args.capacity, seed=0), args.capacity, seed=0)
        for model_name, model in models().items():
            for ranks, per_rank in ((8, 1), (8, 4), (64, 1), (64, 4)):
                t0 = time.perf_counter()
                f = figures(rows, model, ranks, per_rank, args.seeds)
                took = (time.perf_counter() - t0) / args.seeds
                speedup = f["token-only"]["time"] / f["plan"]["time"]
                ceiling = f["token-only"]["time"] / f["perfect"]["time"]
                for order in ("random", "token-only", "plan"):
                    m = f[order]
                    last = f"{speedup:.3f}x ({ceiling:.3f}x; {took:.2f} s a plan)" if order == "plan" else ""
                    print(f"| {mix_name} | {model_name} | {ranks} x {per_rank} | {len(rows['tokens'])} rows, "
                          f"{ratio:.4f} | {order} | {m['llm']:.3f} | {m['encoder']:.3f} | {m['supervised']:.3f} | {last} |")


if __name__ == "__main__":
    main()
