"""Small builds at one and two workers: does a second worker help from ~1,000 records, and never hurt?

    python bench/bench_workers.py [--records 1000 2000 5000] [--repeats 3]

Records are LLaVA-style image chats, each with its own generated JPEG (336-800 px, noise, seeded), built
with ``--family qwen3vl`` and the sample Qwen3-VL processor (``sample_data/processors/qwen3vl``), so stage 1
probes every image and tokenizes every chat. Each build is a fresh ``python -m packer build`` process,
one-worker and two-worker runs interleaved; per run: wall time, CPU time (user + system of the build and its
workers, ``os.wait4``), CPU / wall (1.0: one core busy on average) and stage 1's own wall time (its progress
line). The least wall time of ``--repeats`` is printed for each, with every run's stage-1 time. The packed
shards are compared across worker counts (they must be the same bytes).

A worker process starts by importing packer and loading the processor; until it has, the build's own
process runs every task (``packer.engine.local``), so a second worker should never make a build slower
than one worker by more than its start-up's share of the cores, and should take tasks as soon as it is up.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
from bench_build import run_measured, stage1_seconds  # noqa: E402  (the launcher that reads CPU with os.wait4)

PROCESSOR = ROOT / "sample_data" / "processors" / "qwen3vl"
SIDES = [(336, 336), (640, 480), (480, 640), (224, 224), (800, 600)]


def generate(folder: Path, n: int) -> Path:
    """``n`` image chats, each naming its own JPEG under ``folder/img``."""
    import numpy as np
    from PIL import Image

    rng = random.Random(0)
    (folder / "img").mkdir(parents=True, exist_ok=True)
    path = folder / f"records{n}.jsonl"
    with path.open("w") as f:
        for k in range(n):
            w, h = rng.choice(SIDES)
            image = folder / "img" / f"{k}.jpg"
            if not image.exists():
                noise = np.random.default_rng(k).integers(0, 255, (h // 8, w // 8, 3)).astype("uint8")
                Image.fromarray(noise).resize((w, h)).save(image, quality=85)
            answer = "It shows " + " ".join(rng.choices(["noise", "colour", "a grid", "blocks", "light"], k=rng.randint(5, 120)))
            f.write(json.dumps({"id": f"r{k}", "image": f"img/{k}.jpg", "conversations": [
                {"from": "human", "value": "<image>\nDescribe this image."}, {"from": "gpt", "value": answer}]}) + "\n")
    return path


def build(data: Path, out: Path, workers: int, env: dict) -> dict:
    shutil.rmtree(out, ignore_errors=True)
    cpu, wall, _, _, err = run_measured([sys.executable, "-m", "packer", "build", "-i", str(data), "-o", str(out),
                                         "--family", "qwen3vl", "--processor", str(PROCESSOR), "--max-length", "8192",
                                         "--workers", str(workers)], env, cwd=data.parent)  # not the checkout's packer.toml
    return {"cpu": cpu, "wall": wall, "stage1": stage1_seconds(err),
            "packed": [e["sha256"] for e in json.loads((out / "manifest.json").read_text())["files"]["packed"]]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--records", type=int, nargs="+", default=[1000, 2000, 5000])
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    env = {**os.environ, "TOKENIZERS_PARALLELISM": "false", "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(ROOT)}
    with tempfile.TemporaryDirectory() as tmp:
        for n in args.records:
            data = generate(Path(tmp), n)
            runs: dict[int, list[dict]] = {1: [], 2: []}
            for _ in range(args.repeats):
                for workers in (1, 2):
                    runs[workers].append(build(data, Path(tmp) / f"out{workers}", workers, env))
            same = runs[1][0]["packed"] == runs[2][0]["packed"]
            print(f"{n:,} image chats (one JPEG each), qwen3vl, least wall of {args.repeats}:")
            best = {}
            for workers, ms in runs.items():
                m = best[workers] = min(ms, key=lambda r: r["wall"])
                stage1 = ", ".join(f"{r['stage1']:.2f}" for r in ms)
                print(f"  workers={workers}: wall {m['wall']:5.2f} s  CPU {m['cpu']:5.2f} s  CPU/wall {m['cpu'] / m['wall']:.2f}"
                      f"  stage 1 {m['stage1']:.2f} s (runs: {stage1})")
            print(f"  2 workers vs 1: wall {best[1]['wall'] / best[2]['wall']:.2f}x, stage 1 "
                  f"{best[1]['stage1'] / best[2]['stage1']:.2f}x; packed shards identical: {same}")


if __name__ == "__main__":
    main()
