"""Rows under an encoder budget (``max_row_encoder``, :func:`packer.pack.plan` ``resources`` / ``budgets``): rows
against the bound, how alike the rows' encoder costs come out, and what the step plan then reaches, on the
generated corpora of ``bench_steps.py``.

    python bench/bench_row_budget.py [--samples N] [--capacity 8192]

Encoder cost per sample: ``bench/calibrated_qwen3vl2b_h200.json`` (a Qwen3-VL-2B shape timed on an H200) and
``CostModel.for_model`` of the same shape (FLOPs). Budget: off, or (1 + S) x Σ encoder / the token lower bound
(``auto:S``; ``auto`` is S = 0.5). Columns: rows, rows / max(token bound, encoder bound), samples over the budget
alone, the rows' encoder cost max / mean and coefficient of variation, and the step plan's Σ slowest / Σ mean of
the encoder cost at 8 and 64 ranks x 1 row.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from bench_steps import MIXES, QWEN3_VL_2B, generate  # noqa: E402

from packer.cost import CostModel  # noqa: E402
from packer.pack import plan  # noqa: E402
from packer.schedule.steps import measure, plan_steps  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--samples", type=int, default=20000)
    ap.add_argument("--capacity", type=int, default=8192)
    args = ap.parse_args()
    models = {"H200-calibrated": CostModel.load(ROOT / "bench" / "calibrated_qwen3vl2b_h200.json"),
              "for_model (FLOPs)": CostModel.for_model(QWEN3_VL_2B)}
    print("| mix | encoder cost | budget | rows | rows / bound | over budget | row encoder max / mean | cv | "
          "plan 8 x 1 encoder | plan 64 x 1 encoder | planning s |")
    print("|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for mix_name, mix in MIXES.items():
        samples = generate(args.samples, mix, args.capacity, seed=0)
        lengths = samples["tokens"].astype(np.int64)
        bound = -(-int(lengths.sum()) // args.capacity)
        for model_name, model in models.items():
            enc = model.vector(samples)[:, 1]
            for slack in (None, 0.5, 0.2):
                kw = {} if slack is None else {"resources": {"encoder": enc},
                                               "budgets": {"encoder": (1 + slack) * enc.sum() / bound}}
                t0 = time.perf_counter()
                p = plan(lengths, args.capacity, seed=0, **kw)
                took = time.perf_counter() - t0
                row = np.repeat(np.arange(p.n_bins), np.diff(p.offsets))
                rows = {k: np.bincount(row, weights=v[p.indices], minlength=p.n_bins) for k, v in samples.items()}
                vec = model.vector(rows)
                e = vec[:, 1]
                at = {r: measure(vec, plan_steps(vec, r, 1))["encoder"] for r in (8, 64)}
                over = sum(len(v) for v in p.over_budget.values())
                print(f"| {mix_name} | {model_name} | {'off' if slack is None else f'auto:{slack}'} | {p.n_bins} | "
                      f"{p.n_bins / p.bound:.4f} | {over} | {e.max() / e.mean():.2f} | {e.std() / e.mean():.2f} | "
                      f"{at[8]:.3f} | {at[64]:.3f} | {took:.2f} |")


if __name__ == "__main__":
    main()
