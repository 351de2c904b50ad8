"""Local vs Ray engine on this machine: the same build, wall time including Ray's start.

    python bench/bench_engines.py [--records 20000] [--workers 2]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from bench_build import generate  # noqa: E402

from packer.build import build  # noqa: E402
from packer.config import BuildConfig  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--records", type=int, default=20_000)
    ap.add_argument("--workers", type=int, default=2)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        data = Path(tmp) / "in.jsonl"
        generate(data, args.records)
        print(f"engines: {args.records:,} generated records, {args.workers} workers")
        digests = {}
        for engine in ("local", "ray"):
            t0 = time.perf_counter()
            config = BuildConfig(input=(str(data),), output=str(Path(tmp) / engine), workers=args.workers, engine=engine,
                                 tokenizer=str(ROOT / "sample_data" / "tokenizer"), chunk_records=2000)
            m = build(config, progress=False)
            dt = time.perf_counter() - t0
            digests[engine] = [e["sha256"] for e in m["files"]["packed"]]
            print(f"  {engine:<6} {dt:6.1f} s  {args.records / dt:7,.0f} records/s (start-up included)")
        print(f"  identical packed shards: {digests['local'] == digests['ray']}")


if __name__ == "__main__":
    main()
