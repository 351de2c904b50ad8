"""Peak memory and time of one record against its size: what bounds ``--max-line-bytes``.

    python bench/bench_line_memory.py [--sizes 64K,256K,1M,4M] [--tokenizer sample_data/tokenizer]

For each size and shape (a ``text`` document; a chat whose assistant turn holds the text),
a child process loads the encoder, encodes one warm-up record, then encodes the one line
through stage 1's path (``encode_records``) and prints how much its peak resident memory
(``ru_maxrss``) grew and how long the record took. The growth is the record's own cost,
nearly all of it inside the Rust tokenizer's encode (per byte of text it keeps offsets,
alignments and token strings), so it is linear in the line's size; docs/reliability.md
states the bound this gives and the default line limit it allows.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CHILD = """
import json, resource, sys, time
sys.path.insert(0, {root!r})
from packer.encode import Encoder, EncoderSpec
from packer.records import RawLine
from packer.stages.encode import encode_records
enc = Encoder(EncoderSpec.of(tokenizer={tok!r}))
encode_records(enc, [RawLine(1, json.dumps({{"text": "warm up " * 200}}).encode())], "f", ".")
line = open({path!r}, "rb").read().rstrip(b"\\n")
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
start, cpu = time.perf_counter(), time.process_time()
result = encode_records(enc, [RawLine(1, line)], "f", ".")[0]
print(json.dumps({{"seconds": time.perf_counter() - start, "cpu": time.process_time() - cpu,
                  "mb": (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) / 1024,
                  "bad": getattr(result, "reason", None)}}))
"""


def line(n_bytes: int, kind: str) -> bytes:
    words = ("lorem ipsum dolor sit amet consectetur adipiscing elit " * (n_bytes // 56 + 1))[:n_bytes]
    if kind == "text":
        return json.dumps({"text": words}).encode()
    return json.dumps({"conversations": [{"from": "human", "value": "Summarise."}, {"from": "gpt", "value": words}]}).encode()


def size(text: str) -> int:
    units = {"K": 2**10, "M": 2**20}
    return int(float(text[:-1]) * units[text[-1]]) if text[-1] in units else int(text)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="64K,256K,1M,4M")
    ap.add_argument("--tokenizer", default=str(ROOT / "sample_data" / "tokenizer"))
    args = ap.parse_args()
    print(f"{'shape':6} {'line':>8} {'peak growth':>12} {'per byte':>9} {'wall':>7} {'cpu':>7}")
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "line.jsonl"
        for kind in ("text", "chat"):
            for n in map(size, args.sizes.split(",")):
                path.write_bytes(line(n, kind) + b"\n")
                code = CHILD.format(root=str(ROOT), tok=args.tokenizer, path=str(path))
                r = json.loads(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                                              check=True).stdout.strip().splitlines()[-1])
                mb = n / 2**20
                print(f"{kind:6} {mb:7.3f}M {r['mb']:10.0f} MB {r['mb'] / mb:8.0f}x {r['seconds']:6.2f}s {r['cpu']:6.2f}s")


if __name__ == "__main__":
    main()
