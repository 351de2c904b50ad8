"""Media benchmark: token counting from headers, and the optional embedding pass.

    python bench/bench_media.py [--images 400]

Writes a few hundred real image files (PNG drawings and JPEG photos-like noise, many
sizes and aspect ratios) and audio clips to a temporary folder, then measures, on one
core: images per second counted from the header alone, with PIL's verify() (the
default), and with a full decode; audio clips per second; and the cost per image of
the open_clip embedding pass (random weights: the cost does not depend on them).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from packer.media.counter import MediaCounter  # noqa: E402
from packer.records import Part  # noqa: E402


def make_images(folder: Path, n: int) -> list[Path]:
    from PIL import Image, ImageDraw

    rng = np.random.default_rng(0)
    paths = []
    for i in range(n):
        w, h = int(rng.integers(200, 2000)), int(rng.integers(200, 2000))
        if i % 2:
            small = rng.integers(0, 255, (h // 8 + 1, w // 8 + 1, 3), dtype=np.uint8)
            img = Image.fromarray(small).resize((w, h))
            path = folder / f"img{i:04d}.jpg"
            img.save(path, quality=85)
        else:
            img = Image.new("RGB", (w, h), (240, 240, 240))
            d = ImageDraw.Draw(img)
            for _ in range(5):
                x, y = int(rng.integers(0, w - 50)), int(rng.integers(0, h - 50))
                d.ellipse((x, y, x + 50, y + 50), fill=tuple(int(c) for c in rng.integers(0, 255, 3)))
            path = folder / f"img{i:04d}.png"
            img.save(path)
        paths.append(path)
    return paths


def make_audio(folder: Path, n: int) -> list[Path]:
    import soundfile as sf

    rng = np.random.default_rng(0)
    paths = []
    for i in range(n):
        rate = [16000, 22050, 44100][i % 3]
        wave = (0.1 * rng.standard_normal(int(rate * rng.uniform(1, 20)))).astype(np.float32)
        path = folder / f"clip{i:03d}.{'wav' if i % 2 else 'flac'}"
        sf.write(path, wave, rate)
        paths.append(path)
    return paths


def rate(counter: MediaCounter, parts: list[Part], repeat: int = 3) -> float:
    best = 0.0
    for _ in range(repeat):
        counter.cache.clear()
        t0 = time.perf_counter()
        for p in parts:
            counter.count(p)
        best = max(best, len(parts) / (time.perf_counter() - t0))
    return best


def embedding_cost(paths: list[Path], model: str, batch: int) -> float:
    import torch

    from packer.media.embed import EmbedSpec, ImageEmbedder

    torch.set_num_threads(1)
    e = ImageEmbedder(EmbedSpec(model, None, "pooled", "cpu", batch))
    e.embed([str(p) for p in paths[:2]])  # warm up
    t0 = time.perf_counter()
    for s in range(0, len(paths), batch):
        e.embed([str(p) for p in paths[s : s + batch]])
    return (time.perf_counter() - t0) / len(paths)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--images", type=int, default=400)
    args = ap.parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        images = make_images(folder, args.images)
        clips = make_audio(folder, 60)
        mb = sum(p.stat().st_size for p in images) / 2**20
        print(f"images: {len(images)} files ({mb:.0f} MiB, PNG and JPEG, 200-2000 px a side), one core")
        parts = [Part("image", ref=p.name, path=str(p)) for p in images]
        for check in ("header", "verify", "decode"):
            for policy in ("fixed:image_size=336,patch_size=14", "dynamic", "anyres"):
                r = rate(MediaCounter(policy, "qwen2-audio", check), parts, repeat=1 if check == "decode" else 3)
                print(f"  check={check:<7} {policy.split(':')[0]:<8} {r:9,.0f} images/s")
        audio = [Part("audio", ref=p.name, path=str(p)) for p in clips]
        clips_per_s = rate(MediaCounter('fixed', 'qwen2-audio'), audio)
        print(f"audio: {len(clips)} clips (WAV and FLAC, 1-20 s): {clips_per_s:,.0f} clips/s")
        for model, n in (("ViT-B-32", 64), ("ViT-L-14-336", 8)):
            cost = embedding_cost(images[:n], model, 8)
            print(f"embedding pass, {model} (random weights), CPU, one thread: {1000 * cost:,.0f} ms per image")


if __name__ == "__main__":
    main()
