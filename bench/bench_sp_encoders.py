"""Encoder work per SP rank, shared (each item on one rank) against replicated (every rank encodes every item).

    python bench/bench_sp_encoders.py [--batches 200] [--length 32768] [--seed 0]

Draws video-heavy packed rows (``--length`` tokens each: clips of 4-60 s at 2 frames a second, one merged frame
pair every second, 64 / 144 / 256 tokens a frame pair; a few images of 64-1024 tokens; text fills what is left),
and charges each item the encoder cost of the calibrated Qwen3-VL 2B on one H200
(``bench/calibrated_qwen3vl2b_h200.json``: seconds, item + token + token² terms). For SP 2, 4 and 8 it prints,
averaged over the batches: the encoder seconds per rank replicated (each rank: the whole batch) and split
(:func:`packer.loader.sp_media.loads`: largest unit first, onto the least loaded rank), the balance of the split
(max / mean over ranks), and the speed-up of the slowest rank; twice: each video one unit, then each frame pair
one unit (``frames=True``: Qwen3-VL's tower attends within a frame group; a clip's runs are its frame pairs, a
timestamp between). Simulated ranks in one process; no model runs.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from packer.cost import CostModel  # noqa: E402
from packer.loader.sp_media import loads  # noqa: E402

COST = ROOT / "bench" / "calibrated_qwen3vl2b_h200.json"
TIMESTAMP = 6  # Qwen3-VL's "<t seconds>" text before each frame pair after the first


def video_batch(rng: np.random.Generator, length: int) -> list[dict]:
    """One packed row's media spans: videos until about 85 % of ``length``, then a few images."""
    spans, at = [], 0
    while True:
        seconds = int(rng.integers(4, 61))
        pair = int(rng.choice([64, 144, 256]))
        tokens = seconds * pair
        if at + tokens > 0.85 * length:
            break
        runs = [(k * (pair + TIMESTAMP), pair) for k in range(seconds)]  # one frame pair a run, a timestamp between
        spans.append({"kind": "video", "start": at, "length": runs[-1][0] + pair, "tokens": tokens, "runs": runs})
        at += runs[-1][0] + pair + 32  # the clip's text
    for _ in range(int(rng.integers(0, 4))):
        tokens = int(rng.choice([64, 256, 1024]))
        if at + tokens > length:
            break
        spans.append({"kind": "image", "start": at, "length": tokens, "tokens": tokens})
        at += tokens + 16
    return spans


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batches", type=int, default=200)
    ap.add_argument("--length", type=int, default=32768)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    cost = CostModel.load(COST)
    rng = np.random.default_rng(args.seed)
    batches = [video_batch(rng, args.length) for _ in range(args.batches)]
    items = [len(b) for b in batches]
    print(f"{args.batches} rows of {args.length} tokens: {statistics.mean(items):.1f} media items a row "
          f"({min(items)}-{max(items)}), cost model {COST.name}")
    for frames in (False, True):
        unit = "frame group (each charged as an item of its tokens)" if frames else "whole video"
        print(f"units: images, audio and each {unit}")
        print(f"{'SP':>3} {'replicated s/rank':>18} {'split max s/rank':>17} {'split mean':>11} {'max/mean':>9} "
              f"{'worst max/mean':>15} {'speed-up':>9}")
        for size in (2, 4, 8):
            rep, top, mean, balance = [], [], [], []
            for spans in batches:
                split = loads(spans, size, cost, frames=frames)
                rep.append(loads(spans, size, cost, split=False, frames=frames)[0])
                top.append(max(split))
                mean.append(statistics.mean(split))
                balance.append(max(split) / statistics.mean(split))
            print(f"{size:>3} {statistics.mean(rep):>18.3f} {statistics.mean(top):>17.3f} {statistics.mean(mean):>11.3f} "
                  f"{statistics.mean(balance):>9.3f} {max(balance):>15.3f} "
                  f"{statistics.mean(rep) / statistics.mean(top):>8.2f}x")


if __name__ == "__main__":
    main()
