"""Peak memory, time and samples of one preference record against its line: the per-record bound of ``--preference``.

    python bench/bench_preference_memory.py [--cases responses:10000,prompt:100K:1000,fits:25K:400] [--strings standard]
                                            [--layout tree|pairs] [--tokenizer PATH]

Each case is one record built alone (``packer build --preference tree``, or ``--layout pairs``; one worker, in a
child process, after a warm-up build of a one-line file has loaded everything): ``responses:N`` is a short prompt
and N short responses (a 10^4-response record is a ~214 KB line); ``prompt:B:N`` a prompt of B bytes and N responses
at the default ``--max-length`` 4096 (it cannot fit and is dropped in stage 1 before its other responses are
rendered); ``fits:B:N`` the same at ``--max-length`` 1,000,000 (2^24 with ``--layout pairs``), where it fits and is
built whole. ``--strings standard`` reads the string records as TRL's standard format (the default of a build).
Printed: the line, the growth of the child's peak resident memory (``ru_maxrss``) over the warm-up, its ratio to the
line, the build's wall time and CPU time (one worker: the build runs in the child) and the bytes of ``samples/``.
docs/reliability.md states the bound this gives; ``tests/test_bounds.py`` runs this child on a 10^4-response record.
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
from pathlib import Path
sys.path.insert(0, {root!r})
from packer.build import build
from packer.config import resolve
tmp = Path({tmp!r})
def run(src, out, **kw):
    return build(resolve(None, input=[str(src)], output=str(out), tokenizer={tok!r}, preference={layout!r}, workers=1,
                         max_bad_fraction=1.0, preference_strings={strings!r}, **kw), progress=False)
(tmp / "warm.jsonl").write_text(json.dumps({{"prompt": "Say hi to me.", "chosen": " Hi.", "rejected": " No."}}) + "\\n")
run(tmp / "warm.jsonl", tmp / "warm")
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
start, cpu = time.perf_counter(), time.process_time()
run({path!r}, tmp / "out", max_length={max_length})
seconds, cpu = time.perf_counter() - start, time.process_time() - cpu
acc = json.loads((tmp / "out" / "manifest.json").read_text())["accounting"]
print(json.dumps({{"seconds": seconds, "cpu": cpu, "mb": (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) / 1024,
                  "samples": sum(f.stat().st_size for f in (tmp / "out" / "samples").iterdir()),
                  "bad": sorted({{**acc["quarantined_by_reason"], **acc["dropped_by_reason"]}})}}))
"""


def record(case: str, layout: str = "tree") -> tuple[dict, int]:
    """The record of ``case`` and the --max-length it is built at (``layout``: a pairs record repeats its prompt)."""
    kind, *args = case.split(":")
    if kind == "responses":
        return {"prompt": "Say something.", "responses": [f"answer number {i}" for i in range(int(args[0]))]}, 10**6
    words = ("lorem ipsum dolor sit amet consectetur adipiscing elit " * (size(args[0]) // 56 + 1))[: size(args[0])]
    answers = [f"answer number {i}" for i in range(int(args[1]))]
    return {"prompt": words, "responses": answers}, (4096 if kind == "prompt" else 10**6 if layout == "tree" else 1 << 24)


def size(text: str) -> int:
    units = {"K": 2**10, "M": 2**20}
    return int(float(text[:-1]) * units[text[-1]]) if text[-1] in units else int(text)


def measure(case: str, tokenizer: str, strings: str = "chat", layout: str = "tree") -> dict:
    """One case in a child process: the line's bytes and what the child printed. ``strings``: the string records
    rendered with the chat template (``chat``) or tokenized as TRL's standard format (``standard``)."""
    rec, max_length = record(case, layout)
    line = json.dumps(rec) + "\n"
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "line.jsonl"
        path.write_text(line + json.dumps({"text": "a document, so the build packs something"}) + "\n")
        code = CHILD.format(root=str(ROOT), tok=tokenizer, tmp=tmp, path=str(path), max_length=max_length,
                            strings=strings, layout=layout)
        r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600)
        if r.returncode:
            raise RuntimeError(r.stderr[-2000:])
        return {"line": len(line), **json.loads(r.stdout.strip().splitlines()[-1])}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cases", default="responses:1000,responses:10000,prompt:100K:1000,fits:25K:400")
    ap.add_argument("--tokenizer", default=str(ROOT / "sample_data" / "tokenizer"))
    ap.add_argument("--strings", choices=["chat", "standard"], default="chat",
                    help="how the string records are read (preference_strings)")
    ap.add_argument("--layout", choices=["tree", "pairs"], default="tree", help="the build's --preference layout")
    args = ap.parse_args()
    print(f"{'case':20} {'line':>9} {'peak growth':>12} {'x line':>7} {'wall':>7} {'cpu':>7} {'samples':>10}  outcome")
    for case in args.cases.split(","):
        r = measure(case, args.tokenizer, args.strings, args.layout)
        print(f"{case:20} {r['line'] / 1024:8.0f}K {r['mb']:9.0f} MB {r['mb'] * 2**20 / r['line']:6.0f}x "
              f"{r['seconds']:6.2f}s {r['cpu']:6.2f}s {r['samples'] / 1024:9.0f}K  {', '.join(r['bad']) or 'packed'}")


if __name__ == "__main__":
    main()
