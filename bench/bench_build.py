"""Throughput of `packer build` on generated text records (chat + documents).

    python bench/bench_build.py [--records N] [--workers 1 2]

Prints records/s and tokens/s for each worker count, and checks that every worker
count produced the same packed bytes.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from packer.build import build  # noqa: E402
from packer.config import BuildConfig  # noqa: E402

WORDS = (ROOT / "sample_data" / "docs.jsonl").read_text().split()


def generate(path: Path, n: int, seed: int = 0) -> None:
    rng = random.Random(seed)
    with path.open("w") as f:
        for i in range(n):
            if i % 2:
                text = " ".join(rng.choices(WORDS, k=rng.randint(20, 400)))
                f.write(json.dumps({"id": f"d{i}", "text": text}) + "\n")
            else:
                q = " ".join(rng.choices(WORDS, k=rng.randint(5, 40)))
                a = " ".join(rng.choices(WORDS, k=rng.randint(10, 200)))
                messages = [{"role": "user", "content": q}, {"role": "assistant", "content": a}]
                f.write(json.dumps({"id": f"c{i}", "messages": messages}) + "\n")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--records", type=int, default=20_000)
    ap.add_argument("--workers", type=int, nargs="+", default=[1, 2])
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        data = Path(tmp) / "in.jsonl"
        generate(data, args.records)
        digests = {}
        print(f"build: {args.records:,} generated records ({data.stat().st_size / 2**20:.1f} MiB), max_length 4096")
        for workers in args.workers:
            out = Path(tmp) / f"out{workers}"
            config = BuildConfig(input=(str(data),), output=str(out), tokenizer=str(ROOT / "sample_data" / "tokenizer"),
                                 workers=workers, chunk_records=2000)
            t0 = time.perf_counter()
            m = build(config, progress=False)
            dt = time.perf_counter() - t0
            digests[workers] = [e["sha256"] for e in m["files"]["packed"]]
            s = m["stats"]
            print(f"  workers={workers}: {dt:6.2f} s  {args.records / dt:8,.0f} records/s  {s['tokens'] / dt:10,.0f} tokens/s  "
                  f"rows {s['rows']:,} (L1 {s['lower_bound']:,}), fill {100 * s['fill']:.2f}%")
        same = len({tuple(d) for d in digests.values()}) == 1
        print(f"  packed shards identical across worker counts: {same}")
        if not same:
            sys.exit(1)


if __name__ == "__main__":
    main()
