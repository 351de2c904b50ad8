"""Video benchmark: headers probed per second per core, against decoding.

    python bench/bench_video.py [--clips 24] [--repeat 5]

Writes H.264 MP4 clips (320x240, 640x360 and 1280x720; 2-5 s at 24-30 fps; libx264
``veryfast``) and a few VP9 WebM clips (no frame count in their header: their packets are
counted) to a temporary folder, then measures on one core (one decoder thread), by CPU time:

- ``probe_video`` (the default ``verify``: headers, index against file size, first frame decoded),
- the headers alone (open + stream fields, no decode) for comparison,
- a full decode: milliseconds per frame, and per clip,
- ``load_video`` of the frames ``qwen2vl`` (2 fps) samples: the loader's cost per clip.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from packer.media.policies import parse_policy  # noqa: E402
from packer.media.video import load_video, probe_video  # noqa: E402

SIZES = [(320, 240), (640, 360), (1280, 720)]


def make_clips(folder: Path, n: int) -> list[Path]:
    import av

    rng = np.random.default_rng(0)
    paths = []
    for i in range(n):
        w, h = SIZES[i % len(SIZES)]
        webm = i % 8 == 7
        fps = int(rng.choice([24, 25, 30]))
        frames = int(rng.uniform(2, 5) * fps)
        path = folder / f"clip{i:03d}.{'webm' if webm else 'mp4'}"
        y, x = np.mgrid[0:h, 0:w]
        with av.open(str(path), "w") as c:
            s = c.add_stream("libvpx-vp9" if webm else "libx264", rate=fps)
            s.width, s.height, s.pix_fmt = w, h, "yuv420p"
            s.options = {"deadline": "realtime", "cpu-used": "8"} if webm else {"preset": "veryfast"}
            for k in range(frames):
                img = np.stack([(x + 3 * k) % 256, (y + k) % 256, (x + y) % 256], axis=-1).astype(np.uint8)
                for p in s.encode(av.VideoFrame.from_ndarray(img, format="rgb24")):
                    c.mux(p)
            for p in s.encode():
                c.mux(p)
        paths.append(path)
    return paths


def headers_only(path: str) -> tuple:
    import av

    with av.open(path, metadata_errors="ignore") as c:
        s = c.streams.video[0]
        return s.frames, s.average_rate, s.duration, s.codec_context.width, s.codec_context.height


def full_decode(path: str) -> int:
    import av

    with av.open(path) as c:
        s = c.streams.video[0]
        s.codec_context.thread_count = 1
        return sum(1 for _ in c.decode(s))


def rate(fn, items, repeat: int) -> tuple[float, float]:
    """(calls per CPU second, calls per wall second), median over ``repeat`` passes."""
    cpu, wall = [], []
    for _ in range(repeat):
        c0, w0 = time.process_time(), time.perf_counter()
        for item in items:
            fn(item)
        cpu.append(len(items) / (time.process_time() - c0))
        wall.append(len(items) / (time.perf_counter() - w0))
    return statistics.median(cpu), statistics.median(wall)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--clips", type=int, default=24)
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args()
    policy = parse_policy("qwen2vl", "video")
    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.perf_counter()
        paths = [str(p) for p in make_clips(Path(tmp), args.clips)]
        print(f"wrote {len(paths)} clips in {time.perf_counter() - t0:.1f} s")
        infos = {p: probe_video(p) for p in paths}
        total_frames = sum(i.frames for i in infos.values())
        for (w, h) in SIZES:
            group = [p for p in paths if (infos[p].width, infos[p].height) == (w, h)]
            mp4 = [p for p in group if p.endswith(".mp4")]
            webm = [p for p in group if p.endswith(".webm")]
            frames = sum(infos[p].frames for p in group) / len(group)
            probe = rate(probe_video, mp4, args.repeat)
            head = rate(headers_only, mp4, args.repeat)
            line = (f"{w}x{h}: {len(mp4)} mp4 + {len(webm)} webm, {frames:.0f} frames/clip | probe_video (mp4) "
                    f"{probe[0]:,.0f}/s per core ({probe[1]:,.0f}/s wall) | headers only {head[0]:,.0f}/s")
            if webm:
                line += f" | probe_video (webm, packets counted) {rate(probe_video, webm, args.repeat)[0]:,.0f}/s"
            dec = rate(full_decode, group, max(1, args.repeat // 2))[0]
            per_frame = 1000 / (dec * frames)
            load = rate(lambda p: load_video(p, policy.frame_indices(infos[p].frames, infos[p].fps), threads=1), group, 1)[0]
            print(line + f" | full decode {per_frame:.2f} ms/frame = {1000 / dec:.0f} ms/clip | load_video (2 fps) "
                         f"{1000 / load:.0f} ms/clip")
        print(f"{total_frames} frames in all; one core, one decoder thread, CPU time (medians of {args.repeat} passes)")


if __name__ == "__main__":
    main()
