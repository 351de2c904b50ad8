"""Memory stays flat in dataset size; what crash safety costs.

    python bench/bench_memory.py [--sizes 100000 1000000]

Builds N generated short text records in a child process (one worker, in-process) and
reports its peak RSS (VmHWM), then the same build with and without fsync
(``--no-durable``) to show the cost of the crash-safety machinery.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

CHILD = """
import json, sys, time
sys.path.insert(0, {root!r})
from packer.build import build
from packer.config import BuildConfig
t0 = time.perf_counter()
m = build(BuildConfig(input=({data!r},), output={out!r}, tokenizer={tok!r}, workers=1, durable={durable}), progress=False)
dt = time.perf_counter() - t0
status = {{l.split(':')[0]: int(l.split()[1]) for l in open('/proc/self/status') if l.startswith(('VmHWM', 'RssAnon'))}}
print(json.dumps({{"seconds": dt, "peak_kib": status["VmHWM"], "anon_kib": status["RssAnon"], "rows": m["stats"]["rows"],
                  "records": m["accounting"]["records_read"]}}))
"""


def generate(path: Path, n: int) -> None:
    words = "the a packing row token segment mask position shard sample image audio model data".split()
    with path.open("w") as f:
        for i in range(n):
            f.write(json.dumps({"text": " ".join(words[(i * 7 + k) % len(words)] for k in range(8 + i % 24))}) + "\n")


def run(data: Path, out: Path, durable: bool) -> dict:
    code = CHILD.format(root=str(ROOT), data=str(data), out=str(out), tok=str(ROOT / "sample_data" / "tokenizer"),
                        durable=durable)
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env={**os.environ, "TOKENIZERS_PARALLELISM": "false"})
    return json.loads(res.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", type=int, nargs="+", default=[100_000, 1_000_000])
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        for n in args.sizes:
            data = Path(tmp) / f"in{n}.jsonl"
            generate(data, n)
            r = run(data, Path(tmp) / f"out{n}", durable=True)
            print(f"{n:>9,} records ({data.stat().st_size / 2**20:,.0f} MiB): peak RSS {r['peak_kib'] / 1024:,.0f} MiB "
                  f"(anonymous at the end {r['anon_kib'] / 1024:,.0f} MiB; the rest is page cache of mapped shards), "
                  f"{r['seconds']:,.1f} s ({n / r['seconds']:,.0f} records/s), {r['rows']:,} rows")
        n = args.sizes[0]
        data = Path(tmp) / f"in{n}.jsonl"
        fast = run(data, Path(tmp) / "nodurable", durable=False)
        slow = run(data, Path(tmp) / "durable", durable=True)
        print(f"crash safety at {n:,} records: {slow['seconds']:.1f} s with fsync, {fast['seconds']:.1f} s without "
              f"({100 * (slow['seconds'] / fast['seconds'] - 1):+.1f}%)")


if __name__ == "__main__":
    t0 = time.time()
    main()
