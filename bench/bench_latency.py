"""Stage 1 over object storage with a round-trip delay: does reading a task's media many at once hide it?

    python bench/bench_latency.py [--records 1000] [--delays 0 30] [--workers 2] [--source DIR]

A local S3 server (moto, tests/s3_server.py) holds generated LLaVA records (a third with two images: ~1.33 PNGs a
record, each image its own object) and the JSONL; the build reads them through a TCP proxy on 127.0.0.1 that holds
every client->server piece of a connection ``delay`` ms before passing it on, so each request's round trip costs
that much more (this machine's kernel has no netem). ``packer build pipelines/sample.toml -i s3://data/records.jsonl
--workers N`` runs as a fresh process per delay; the wall time of the whole build is printed, and the ratio of each
delay to the first. ``--source`` runs another checkout's packer (its folder first on PYTHONPATH): the same command
before and after a change.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))


class DelayProxy:
    """127.0.0.1:port -> target; every piece a client sends waits ``delay`` s before it goes on (one per request)."""

    def __init__(self, target_port: int, delay: float):
        self.target, self.delay = target_port, delay
        self.sock = socket.socket()
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(256)
        self.port = self.sock.getsockname()[1]
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.sock.accept()
            except OSError:
                return
            upstream = socket.create_connection(("127.0.0.1", self.target))
            threading.Thread(target=self._pump, args=(client, upstream, self.delay), daemon=True).start()
            threading.Thread(target=self._pump, args=(upstream, client, 0.0), daemon=True).start()

    @staticmethod
    def _pump(src: socket.socket, dst: socket.socket, delay: float) -> None:
        try:
            while data := src.recv(1 << 16):
                if delay:
                    time.sleep(delay)
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def close(self) -> None:
        self.sock.close()


def images(n: int, seed: int = 0) -> list[bytes]:
    """``n`` distinct small PNGs (noise, 64-400 px a side): every one is its own object and its own probe."""
    import io

    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        h, w = (int(x) for x in rng.integers(64, 400, 2))
        buf = io.BytesIO()
        Image.fromarray(rng.integers(0, 255, (h // 8, w // 8, 3), dtype=np.uint8)).resize((w, h)).save(buf, "PNG")
        out.append(buf.getvalue())
    return out


def records(n: int, seed: int = 0) -> tuple[list[dict], int]:
    rng = random.Random(seed)
    rows, k = [], 0
    for i in range(n):
        names = [f"images/{k + j:06d}.png" for j in range(2 if i % 3 == 0 else 1)]
        k += len(names)
        rows.append({"id": f"r{i:06d}", "image": names, "conversations": [
            {"from": "human", "value": "<image>\n" * len(names) + f"What is shown? ({rng.random():.4f})"},
            {"from": "gpt", "value": "Coloured noise, " + " ".join(rng.choice(["red", "green", "blue"]) for _ in range(12))}]})
    return rows, k


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--records", type=int, default=1000)
    ap.add_argument("--delays", type=float, nargs="+", default=[0.0, 30.0], help="ms added per request round trip")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--source", default=str(ROOT), help="the packer checkout to run (first on PYTHONPATH)")
    args = ap.parse_args()
    from s3_server import S3Server

    rows, n_images = records(args.records)
    with S3Server() as s3, tempfile.TemporaryDirectory() as tmp:
        fs = s3.filesystem()
        fs.mkdir("data")
        fs.pipe("data/records.jsonl", "".join(json.dumps(r) + "\n" for r in rows).encode())
        fs.pipe({f"data/images/{k:06d}.png": data for k, data in enumerate(images(n_images))})
        print(f"{args.records:,} records, {n_images:,} PNGs in s3://data (moto), --workers {args.workers}, "
              f"packer from {args.source}")
        base = None
        for delay in args.delays:
            proxy = DelayProxy(s3.port, delay / 1000)
            endpoint = f"http://127.0.0.1:{proxy.port}"
            env = {**os.environ, **s3.env, "AWS_ENDPOINT_URL": endpoint, "AWS_ENDPOINT_URL_S3": endpoint,
                   "PYTHONPATH": args.source, "TOKENIZERS_PARALLELISM": "false",
                   "PACKER_CACHE": str(Path(tmp) / "cache")}
            out = Path(tmp) / f"out-{delay:g}"
            start = time.perf_counter()
            done = subprocess.run([sys.executable, "-m", "packer", "build", str(ROOT / "pipelines" / "sample.toml"), "-i",
                                   "s3://data/records.jsonl", "-o", str(out), "--workers", str(args.workers)],
                                  env=env, cwd=args.source, capture_output=True, text=True)
            took = time.perf_counter() - start
            proxy.close()
            if done.returncode:
                sys.exit(f"build failed ({done.returncode}):\n{done.stderr[-3000:]}")
            base = base or took
            print(f"  +{delay:4g} ms per round trip: {took:6.1f} s  ({took / base:.2f}x)", flush=True)


if __name__ == "__main__":
    main()
