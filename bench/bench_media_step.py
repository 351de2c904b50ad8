"""Loader media-step benchmark: images/s and clips/s through the collator's media step, in
one process (= one DataLoader worker), next to the bare HF processor on the same files.

    python bench/bench_media_step.py [--images 64] [--clips 32] [--repeats 5] [--max-pixels 1003520]

Writes JPEG photos (320-1280 px a side, noise over smooth shapes) and audio clips (2-30 s,
16 / 44.1 kHz, mono / stereo, WAV / FLAC) to a temporary folder, builds them with
``packer build`` (Qwen2-VL image settings, Qwen2-Audio audio settings, the sample
tokenizer), then times, on the same batches of packed rows, the files in the same order:

  bare       transformers.image_utils.load_image + Qwen2VLImageProcessor(images=...), or
             transformers.audio_utils.load_audio(backend="soundfile") + WhisperFeatureExtractor
  step       packer's MediaStep on the batch's media list (load, process, check every count)
  collator   PackedCollator(processor=...)(rows): the media step + ids, labels, positions
             (mRoPE for Qwen2-VL) and the attention form (varlen, and sdpa's [B, 1, L, L] mask)

torch runs one thread, as in a DataLoader worker. Each figure is the median of --repeats
runs (within a run the paths take turns batch by batch), by wall clock and by the process's CPU
time (less disturbed by other load on the machine); overhead = bare rate / packer rate - 1. Then the
same with a DataLoader of 2 workers (persistent, epochs after a warm-up one).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import numpy as np  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from packer.build import build  # noqa: E402
from packer.config import resolve  # noqa: E402

TOKENIZER = str(ROOT / "sample_data" / "tokenizer")
QWEN2VL = dict(image_token="<|image_pad|>", image_begin="<|vision_start|>", image_end="<|vision_end|>")
QWEN2AUDIO = dict(audio_token="<|AUDIO|>", audio_begin="<|audio_bos|>", audio_end="<|audio_eos|>", audio_tokens="qwen2-audio")


def make_images(folder: Path, n: int) -> list[Path]:
    """Photo-like JPEGs: a few soft colour blobs over a gradient, plus per-pixel noise."""
    from PIL import Image

    rng = np.random.default_rng(0)
    paths = []
    for i in range(n):
        w, h = (int(x) for x in rng.integers(320, 1281, 2))
        y, x = np.mgrid[0:h, 0:w].astype(np.float32)
        img = np.stack([x / w * 200, y / h * 200, (x + y) / (w + h) * 120 + 60], axis=-1)
        for _ in range(4):
            cy, cx, r = rng.uniform(0, h), rng.uniform(0, w), rng.uniform(40, 300)
            img += np.exp(-((y - cy) ** 2 + (x - cx) ** 2) / (2 * r * r))[..., None] * rng.uniform(-120, 120, 3)
        img += rng.normal(0, 12, img.shape)
        path = folder / f"photo{i:03d}.jpg"
        Image.fromarray(np.clip(img, 0, 255).astype(np.uint8)).save(path, quality=90)
        paths.append(path)
    return paths


def make_audio(folder: Path, n: int) -> list[Path]:
    import soundfile as sf

    rng = np.random.default_rng(1)
    paths = []
    for i in range(n):
        rate, channels = (16000, 44100)[i % 2], 1 + (i // 2) % 2
        seconds = float(rng.uniform(2, 30))
        t = np.arange(int(rate * seconds)) / rate
        tone = 0.1 * np.sin(2 * np.pi * rng.uniform(100, 1000) * t) * (1 + np.sin(2 * np.pi * 0.5 * t)) / 2
        wave = tone[:, None] + 0.03 * rng.standard_normal((len(t), channels))
        path = folder / f"clip{i:03d}.{'wav' if (i // 4) % 2 else 'flac'}"
        sf.write(path, wave.astype(np.float32), rate)
        paths.append(path)
    return paths


def chat(kind: str, refs: list[str], k: int) -> dict:
    parts = [{"type": kind, kind: r} for r in refs]
    return {"id": f"{kind}{k}", "messages": [
        {"role": "user", "content": [*parts, {"type": "text", "text": f"Describe the {kind} number {k} in detail."}]},
        {"role": "assistant", "content": f"It is {kind} {k}: a generated benchmark file. " * 4}]}


def make_build(folder: Path, name: str, kind: str, files: list[Path], settings: dict, max_length: int) -> Path:
    records, i, k = [], 0, 0
    while i < len(files):  # one or two media items a record
        take = 1 + k % 2
        records.append(chat(kind, [p.name for p in files[i : i + take]], k))
        i, k = i + take, k + 1
    src = folder / f"{name}.jsonl"
    src.write_text("".join(json.dumps(r) + "\n" for r in records))
    out = folder / f"out-{name}"
    build(resolve(None, input=[str(src)], output=str(out), tokenizer=TOKENIZER, max_length=max_length, workers=1,
                  **settings), progress=False)
    return out


def batches_of(ds, rows_per_batch: int) -> list[list[dict]]:
    rows = [ds[i] for i in range(len(ds))]
    return [rows[s : s + rows_per_batch] for s in range(0, len(rows), rows_per_batch)]


def media_of(rows: list[dict]) -> list[dict]:
    """The batch's media list as the collator makes it (``batch`` = row number)."""
    return [{**m, "batch": b} for b, r in enumerate(rows) for m in r["media"]]


def scatter_paths(rows: list[dict]) -> list[str]:
    return [m["path"] for m in sorted(media_of(rows), key=lambda m: (m["batch"], m["start"]))]


class BareImages:
    """The bare HF path: load_image + the image processor on the batch's images, in the same order."""

    def __init__(self, image_processor):
        self.ip = image_processor

    def __call__(self, rows):
        from transformers.image_utils import load_image

        return self.ip(images=[load_image(p) for p in scatter_paths(rows)], return_tensors="pt")


class BareAudio:
    def __init__(self, feature_extractor):
        self.fe = feature_extractor

    def __call__(self, rows):
        from transformers.audio_utils import load_audio

        rate = int(self.fe.sampling_rate)
        waves = [load_audio(p, rate, backend="soundfile") for p in scatter_paths(rows)]
        return self.fe(waves, sampling_rate=rate, padding="max_length", return_attention_mask=True, return_tensors="pt")


class StepOnly:
    def __init__(self, step):
        self.step = step

    def __call__(self, rows):
        return self.step(media_of(rows))


def measure(paths: dict, batches, n_items: int, repeats: int) -> dict[str, dict[str, list[float]]]:
    """Items/s of every path, ``repeats`` times, by wall clock and by this process's CPU time. Within a run the paths
    take turns batch by batch (the order rotated), so a load from elsewhere on the machine hits them alike."""
    names = list(paths)
    for fn in paths.values():  # warm up: imports, first-call caches, the page cache of the files
        fn(batches[0])
    rates: dict[str, dict[str, list[float]]] = {"wall": {k: [] for k in names}, "cpu": {k: [] for k in names}}
    for r in range(repeats):
        wall, cpu = dict.fromkeys(names, 0.0), dict.fromkeys(names, 0.0)
        for i, rows in enumerate(batches):
            k = (r + i) % len(names)
            for name in names[k:] + names[:k]:
                w0, c0 = time.perf_counter(), time.process_time()
                paths[name](rows)
                wall[name] += time.perf_counter() - w0
                cpu[name] += time.process_time() - c0
        for name in names:
            rates["wall"][name].append(n_items / wall[name])
            rates["cpu"][name].append(n_items / cpu[name])
    return rates


def loader_rates(ds, batches_idx, collate_fns: dict, n_items: int, repeats: int, workers: int) -> dict[str, list[float]]:
    """Items/s of whole epochs through a DataLoader per collate function; the loaders (persistent workers, started by
    a warm-up epoch) take turns epoch by epoch."""
    import torch

    loaders = {name: torch.utils.data.DataLoader(ds, batch_sampler=batches_idx, collate_fn=fn, num_workers=workers,
                                                 persistent_workers=True, prefetch_factor=2)
               for name, fn in collate_fns.items()}
    for loader in loaders.values():
        for _ in loader:
            pass
    out: dict[str, list[float]] = {name: [] for name in loaders}
    for r in range(repeats):
        names = list(loaders)[r % len(loaders):] + list(loaders)[: r % len(loaders)]
        for name in names:
            t0 = time.perf_counter()
            for _ in loaders[name]:
                pass
            out[name].append(n_items / (time.perf_counter() - t0))
    loaders.clear()
    return out


def report(title: str, unit: str, rates: dict[str, list[float]], base: str = "bare") -> None:
    print(title)
    bare = statistics.median(rates[base])
    for name, rs in rates.items():
        med = statistics.median(rs)
        over = "" if name == base else f"   overhead {100 * (bare / med - 1):+6.1f}%"
        print(f"  {name:<26} {med:8.1f} {unit}/s  (runs {min(rs):.1f}-{max(rs):.1f}){over}")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--images", type=int, default=64)
    ap.add_argument("--clips", type=int, default=32)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--rows-per-batch", type=int, default=2)
    ap.add_argument("--max-length", type=int, default=4096)
    ap.add_argument("--min-pixels", type=int, default=3136)
    ap.add_argument("--max-pixels", type=int, default=1003520)  # the Qwen2-VL defaults
    ap.add_argument("--loader-workers", type=int, default=2, help="0: skip the DataLoader figures")
    args = ap.parse_args()

    import torch
    from transformers import Qwen2AudioProcessor, Qwen2VLImageProcessor, Qwen2VLProcessor, Qwen2VLVideoProcessor
    from transformers import WhisperFeatureExtractor as Whisper

    from packer.loader import PackedCollator, PackedDataset
    from packer.loader.media import MediaStep

    torch.set_num_threads(1)
    print(f"machine: {os.cpu_count()} cores ({len(os.sched_getaffinity(0))} usable), torch {torch.__version__} "
          f"on 1 thread (as in a DataLoader worker), median of {args.repeats} runs")
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        t0 = time.perf_counter()
        images, clips = make_images(folder, args.images), make_audio(folder, args.clips)
        policy = f"dynamic:min_pixels={args.min_pixels},max_pixels={args.max_pixels}"
        img_out = make_build(folder, "images", "image", images, {**QWEN2VL, "image_tokens": policy}, args.max_length)
        aud_out = make_build(folder, "audio", "audio", clips, QWEN2AUDIO, args.max_length)
        mib = sum(p.stat().st_size for p in images) / 2**20
        amib = sum(p.stat().st_size for p in clips) / 2**20
        print(f"data: {len(images)} JPEGs ({mib:.1f} MiB, 320-1280 px a side), {len(clips)} clips ({amib:.1f} MiB, 2-30 s, "
              f"16 / 44.1 kHz, mono / stereo, WAV / FLAC); generated and built in {time.perf_counter() - t0:.1f} s")

        for kind, out in (("image", img_out), ("audio", aud_out)):
            ds = PackedDataset(out)
            tok = ds.tokenizer()
            batches = batches_of(ds, args.rows_per_batch)
            n = sum(1 for rows in batches for m in media_of(rows) if m["kind"] == kind)
            tokens = sum(m["length"] for rows in batches for m in media_of(rows))
            if kind == "image":
                ip = Qwen2VLImageProcessor(size={"shortest_edge": args.min_pixels, "longest_edge": args.max_pixels})
                processor = Qwen2VLProcessor(image_processor=ip, tokenizer=tok, video_processor=Qwen2VLVideoProcessor())
                bare, unit, rope = BareImages(ip), "images", "mrope"
            else:
                processor = Qwen2AudioProcessor(feature_extractor=Whisper(feature_size=128), tokenizer=tok)
                bare, unit, rope = BareAudio(processor.feature_extractor), "clips", "default"
            step = MediaStep(processor=processor)
            varlen = PackedCollator(processor=processor, rope=rope, attention="varlen")
            sdpa = PackedCollator(processor=processor, rope=rope, attention="sdpa")
            # The same tensors both ways (a check of the comparison, not of packer: the tests do that).
            a, b = bare(batches[0]), step(media_of(batches[0]))
            key = "pixel_values" if kind == "image" else "input_features"
            same = torch.equal(a[key], b[key])
            print(f"\n{kind}: {n} items in {len(ds)} packed rows of {args.max_length} ({tokens:,} placeholder tokens), "
                  f"{len(batches)} batches of {args.rows_per_batch} rows; step output identical to bare: {same}")
            rates = measure({"bare": bare, "step": StepOnly(step), "collator varlen": varlen, "collator sdpa": sdpa},
                            batches, n, args.repeats)
            report(f"  one process (= one DataLoader worker), wall clock, {unit}/s:", unit, rates["wall"])
            report(f"  one process, CPU time of the process (less sensitive to other load), {unit}/s:", unit, rates["cpu"])
            if args.loader_workers:
                idx, s = [], 0
                for rows in batches:
                    idx.append(list(range(s, s + len(rows))))
                    s += len(rows)
                lr = loader_rates(ds, idx, {"bare": bare, "collator varlen": varlen}, n, args.repeats, args.loader_workers)
                report(f"  DataLoader, {args.loader_workers} workers, whole batches, {unit}/s:", unit, lr)


if __name__ == "__main__":
    main()
