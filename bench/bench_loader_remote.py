"""The loader over object storage with a round-trip delay: an embedded build (its media in media shards) vs a `ref`
build (each image its own object).

    python bench/bench_loader_remote.py [--records 300] [--delay 30] [--batch 8]

The records and PNGs of bench_latency (LLaVA-style, ~1.33 distinct images a record) go to a local S3 server (moto);
both builds are made from them for Qwen3-VL (the sample processor, rows of 1,024 tokens) and written to the same
server: ``--media ref`` (the spans name ``s3://data/images/...``) and ``--media embed`` (``media/part-K.arrow`` beside
each packed shard). Each is then read by a fresh process through a TCP proxy on 127.0.0.1 that adds ``--delay`` ms to
every request round trip: ``PackedDataset(s3://...)`` and ``PackedCollator(family=ds.family, processor=...)`` over
every row in batches of ``--batch`` (pixels decoded, as training would; the processor's loading is not timed), with an
empty local shard cache so the embedded build's shards are fetched in the timing too. Printed: rows/s of each and the
ratio (the goal: embedded >= 5x).
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
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "bench"))

READ = r"""
import json, sys, time
from transformers import AutoProcessor
from packer.loader import PackedCollator, PackedDataset
url, processor, batch = sys.argv[1], sys.argv[2], int(sys.argv[3])
processor = AutoProcessor.from_pretrained(processor)  # local, not timed
start = time.perf_counter()
ds = PackedDataset(url)
collate = PackedCollator(family=ds.family, processor=processor)
pixels = 0
for i in range(0, len(ds), batch):
    out = collate([ds[j] for j in range(i, min(i + batch, len(ds)))])
    pixels += int(out["pixel_values"].shape[0])
print(json.dumps({"rows": len(ds), "seconds": time.perf_counter() - start, "pixels": pixels}))
"""


def main() -> None:
    from bench_latency import DelayProxy, images, records
    from s3_server import S3Server

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--records", type=int, default=300)
    ap.add_argument("--delay", type=float, default=30.0, help="ms added per request round trip")
    ap.add_argument("--batch", type=int, default=8)
    args = ap.parse_args()
    rows, n_images = records(args.records)
    processor = ROOT / "sample_data" / "processors" / "qwen3vl"
    with S3Server() as s3, tempfile.TemporaryDirectory() as tmp:
        fs = s3.filesystem()
        fs.mkdir("data")
        fs.mkdir("builds")
        fs.pipe("data/records.jsonl", "".join(json.dumps(r) + "\n" for r in rows).encode())
        fs.pipe({f"data/images/{k:06d}.png": data for k, data in enumerate(images(n_images))})
        env = {**os.environ, **s3.env, "PYTHONPATH": str(ROOT), "TOKENIZERS_PARALLELISM": "false"}
        for media in ("ref", "embed"):
            done = subprocess.run([sys.executable, "-m", "packer", "build", str(ROOT / "pipelines" / "qwen3vl.toml"),
                                   "-i", "s3://data/records.jsonl", "-o", f"s3://builds/{media}", "--media", media,
                                   "--modalities", "image", "--max-length", "1024"],
                                  env={**env, "PACKER_CACHE": str(Path(tmp) / "build-cache")}, capture_output=True, text=True)
            if done.returncode:
                sys.exit(f"the {media} build failed ({done.returncode}):\n{done.stderr[-3000:]}")
        print(f"{args.records:,} records, {n_images:,} PNGs in s3://data (moto), +{args.delay:g} ms per request round "
              f"trip, batches of {args.batch}")
        rates = {}
        for media in ("ref", "embed"):
            proxy = DelayProxy(s3.port, args.delay / 1000)
            endpoint = f"http://127.0.0.1:{proxy.port}"
            done = subprocess.run([sys.executable, "-c", READ, f"s3://builds/{media}", str(processor), str(args.batch)],
                                  env={**env, "AWS_ENDPOINT_URL": endpoint, "AWS_ENDPOINT_URL_S3": endpoint,
                                       "PACKER_CACHE": str(Path(tmp) / f"cache-{media}")},
                                  capture_output=True, text=True)
            proxy.close()
            if done.returncode:
                sys.exit(f"reading the {media} build failed ({done.returncode}):\n{done.stderr[-3000:]}")
            m = json.loads(done.stdout.strip().splitlines()[-1])
            rates[media] = m["rows"] / m["seconds"]
            print(f"  --media {media:5s}: {m['rows']:4d} rows ({m['pixels']:,} patches) in {m['seconds']:6.1f} s = "
                  f"{rates[media]:6.2f} rows/s")
        print(f"  embedded / ref: {rates['embed'] / rates['ref']:.1f}x")


if __name__ == "__main__":
    main()
