"""Stage 1 from a Hugging Face parquet with embedded images vs the same records as JSONL + image files.

    python bench/bench_inputs.py [--records 3000] [--repeats 3] [--check 1.1]

The records are LLaVA-style single-image chats, each with its own generated PNG (sizes vary from 64 to 640 px a side,
seeded), written twice: JSONL whose ``image`` names a file beside it, and a parquet file whose ``image`` column is a
``datasets`` ``Image()`` feature holding the PNG bytes (as the hub's parquet holds them, row groups of 100 rows).
Each is built for Qwen3-VL (``pipelines/qwen3vl.toml``'s sample processor) with ``--workers 1`` as a fresh process
(bench_build's launcher: CPU time from the kernel's accounting); the figure is stage 1's records per second per
core, from its progress line, and the ratio of the two (the goal: the parquet build within 1.1x of the JSONL one).
The least time over ``--repeats`` is kept. The parquet build also writes every image into its media shards, which
the JSONL build does not; the sizes printed are the input media's bytes and each build folder's, with its media shards
(``media/``, what training reads) and its leftover shard (``samples/media-unpacked.arrow``: the blobs no packed row
uses, which ``packer repack`` reads with ``media/``) apart. A finished build holds each image once (stage 1's media
shards, ``samples/media-part-*``, are gone), so the media total is about 1x the input's PNG bytes.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_build import run_measured, stage1_seconds  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


def write_inputs(folder: Path, n: int, seed: int = 0) -> tuple[Path, Path, int]:
    """(JSONL, parquet, media bytes): ``n`` image records, each image its own PNG."""
    import io

    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq
    from datasets import Features, Image, List, Value
    from PIL import Image as PILImage

    rng = random.Random(seed)
    (folder / "images").mkdir(parents=True, exist_ok=True)
    rows, total = [], 0
    for i in range(n):
        w, h = rng.randint(64, 640), rng.randint(64, 640)
        pixels = np.random.default_rng(i).integers(0, 255, (h // 8 + 1, w // 8 + 1, 3), dtype=np.uint8)
        buf = io.BytesIO()
        PILImage.fromarray(pixels).resize((w, h), PILImage.NEAREST).save(buf, "PNG")
        data = buf.getvalue()
        total += len(data)
        (folder / "images" / f"{i:06d}.png").write_bytes(data)
        rows.append({"id": f"r{i:06d}", "conversations": [
            {"from": "human", "value": f"<image>\nWhat is in picture {i}?"},
            {"from": "gpt", "value": " ".join(rng.choice(["shapes", "colours", "noise", "blocks", "pixels"])
                                               for _ in range(rng.randint(5, 40)))}], "png": data})
    jsonl = folder / "data.jsonl"
    with jsonl.open("w") as f:
        for r in rows:
            f.write(json.dumps({"id": r["id"], "image": f"images/{r['id'][1:]}.png", "conversations": r["conversations"]}) + "\n")
    features = Features({"id": Value("string"), "conversations": List({"from": Value("string"), "value": Value("string")}),
                         "image": Image()})
    table = pa.table({"id": [r["id"] for r in rows], "conversations": [r["conversations"] for r in rows],
                      "image": [{"bytes": r["png"], "path": f"{r['id']}.png"} for r in rows]}, schema=features.arrow_schema)
    parquet = folder / "data.parquet"
    pq.write_table(table, parquet, row_group_size=100)
    return jsonl, parquet, total


def folder_bytes(folder: Path, pattern: str = "*") -> int:
    return sum(p.stat().st_size for p in folder.rglob(pattern) if p.is_file())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--records", type=int, default=3000)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--check", type=float, default=0.0, help="exit 1 when parquet / JSONL stage-1 time is over this")
    args = ap.parse_args()
    env = {**os.environ, "TOKENIZERS_PARALLELISM": "false", "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        jsonl, parquet, media = write_inputs(tmp / "in", args.records)
        print(f"{args.records:,} image records, {media / 2**20:,.1f} MiB of PNG")
        seconds = {}
        for name, path in (("jsonl + files", jsonl), ("parquet, embedded", parquet)):
            best = None
            for k in range(args.repeats):
                out = tmp / f"out-{name.split()[0].strip(',')}-{k}"  # a fresh folder: never a resumed build
                cmd = [sys.executable, "-m", "packer", "build", str(ROOT / "pipelines" / "qwen3vl.toml"), "-i", str(path),
                       "-o", str(out), "--workers", "1", "--overwrite", "--modalities", "image"]
                cpu, wall, rss, _, err = run_measured(cmd, env)
                stage1 = stage1_seconds(err)
                if best is None or stage1 < best[0]:
                    best = (stage1, cpu, rss, folder_bytes(out), folder_bytes(out / "media"),
                            folder_bytes(out / "samples", "media-*"))
            seconds[name] = best[0]
            print(f"  {name:18s} stage 1 {best[0]:6.2f} s = {args.records / best[0]:8,.0f} records/s/core; build CPU "
                  f"{best[1]:6.2f} s, peak RSS {best[2]:5.0f} MiB, build folder {best[3] / 2**20:7.1f} MiB (media shards "
                  f"{best[4] / 2**20:.1f} MiB, leftover media shard {best[5] / 2**20:.1f} MiB: "
                  f"{(best[4] + best[5]) / media:.2f}x the input's PNG bytes)")
        ratio = seconds["parquet, embedded"] / seconds["jsonl + files"]
        print(f"  parquet / JSONL stage-1 time: {ratio:.2f}x")
        if args.check and ratio > args.check:
            sys.exit(f"parquet stage 1 is {ratio:.2f}x the JSONL one, over --check {args.check}")


if __name__ == "__main__":
    main()
