"""Planner benchmark: packer's algorithms vs TRL's pack_dataset vs naive baselines.

    python bench/bench_planner.py            # make bench runs it (installs trl for it)

Same lengths for everyone, three distributions:
  sft      lognormal SFT-like lengths at capacity 8192 (2e5 samples)
  llava    LLaVA-like mixture at 4096: image samples >= 576 tokens + text-only (2e5)
  10M      lognormal at 8192, 1e7 samples: packer only (time, peak memory)
Reported per packer: rows, rows / L1 (L1 = ceil(sum / capacity)), fill, seconds.
TRL (pack_dataset strategy="bfd") runs with its default windows (map batches of 1000
rows) and with one global window; "pad B=8" pads random batches of 8 to their longest.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from packer.pack import plan  # noqa: E402


def sft_lengths(n: int, capacity: int, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return np.clip(rng.lognormal(6.4, 1.0, n), 16, capacity).astype(np.int64)


def llava_lengths(n: int, capacity: int, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    image = rng.random(n) < 0.7
    text = np.clip(rng.lognormal(4.6, 0.9, n), 8, capacity - 576).astype(np.int64)
    text_only = np.clip(rng.lognormal(5.6, 1.1, n), 8, capacity).astype(np.int64)
    return np.where(image, 576 + text, text_only)


def padded_tokens(lengths: np.ndarray, batch: int, seed: int = 0) -> int:
    perm = np.random.default_rng(seed).permutation(len(lengths))
    total = 0
    for s in range(0, len(perm), batch):
        b = lengths[perm[s : s + batch]]
        total += len(b) * int(b.max())
    return total


def trl_rows(lengths: np.ndarray, capacity: int, global_window: bool) -> tuple[int, float]:
    import pyarrow as pa
    from datasets import Dataset
    from trl import pack_dataset

    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    ids = pa.LargeListArray.from_arrays(pa.array(offsets), pa.array(np.zeros(int(offsets[-1]), np.int32)))
    ds = Dataset(pa.table({"input_ids": ids}))
    kwargs = {"batch_size": len(lengths)} if global_window else {}
    t0 = time.perf_counter()
    packed = pack_dataset(ds, capacity, strategy="bfd", map_kwargs=kwargs)
    return packed.num_rows, time.perf_counter() - t0


def row(name: str, rows: int, l1: int, tokens: int, capacity: int, seconds: float | None, ref: float | None = None) -> None:
    t = f"{seconds:8.3f} s" if seconds is not None else "        -"
    speed = f"  {ref / seconds:7.0f}x faster than TRL global" if ref and seconds else ""
    print(f"  {name:<22} rows {rows:>9,}  rows/L1 {rows / l1:.5f}  fill {100 * tokens / (rows * capacity):6.2f}%  {t}{speed}")


def compare(title: str, lengths: np.ndarray, capacity: int, with_trl: bool) -> None:
    l1 = -(-int(lengths.sum()) // capacity)
    print(f"\n{title}: {len(lengths):,} samples, capacity {capacity}, mean length {lengths.mean():.0f}, L1 = {l1:,}")
    plan(lengths[:100], capacity)  # compile / load the numba cache outside the timings
    results = {}
    for algorithm in ("bfd", "ffd", "shuffle", "next-fit"):
        t0 = time.perf_counter()
        p = plan(lengths, capacity, algorithm=algorithm)
        results[algorithm] = (p.n_bins, time.perf_counter() - t0)
    ref = None
    if with_trl:
        try:
            trl_global = trl_rows(lengths, capacity, global_window=True)
            trl_default = trl_rows(lengths, capacity, global_window=False)
            ref = trl_global[1]
        except ImportError:
            print("  (trl not installed: pip install trl to compare)")
            with_trl = False
    for algorithm, (rows, seconds) in results.items():
        row(f"packer {algorithm}", rows, l1, int(lengths.sum()), capacity, seconds, ref)
    if with_trl:
        row("TRL bfd, global window", trl_global[0], l1, int(lengths.sum()), capacity, trl_global[1])
        row("TRL bfd, default", trl_default[0], l1, int(lengths.sum()), capacity, trl_default[1])
    pad = padded_tokens(lengths, 8)
    print(f"  {'pad B=8 (no packing)':<22} tokens computed {pad:,} = {pad / lengths.sum():.2f}x the real tokens")


def _status_kib(key: str) -> int:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith(key + ":"))


def big(n: int) -> None:
    """Run in a child process so its peak RSS is its own."""
    lengths = sft_lengths(n, 8192, seed=1)
    plan(lengths[:100], 8192)
    before = _status_kib("VmRSS")
    t0 = time.perf_counter()
    p = plan(lengths, 8192)
    dt = time.perf_counter() - t0
    peak = _status_kib("VmHWM")  # the high-water mark of this process (ru_maxrss would count the parent's pages)
    l1 = p.lower_bound
    print(f"\n10M: {n:,} samples at 8192 (lognormal), packer bfd with shuffled rows, one core")
    print(f"  {dt:.2f} s  rows {p.n_bins:,}  rows/L1 {p.n_bins / l1:.6f}  fill {100 * p.efficiency:.3f}%")
    print(f"  peak memory above the lengths array: {(peak - before) / 2**20:,.0f} MiB "
          f"= {(peak - before) / lengths.nbytes:.1f}x the lengths ({lengths.nbytes / 2**20:,.0f} MiB, int64)")


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--big":
        big(int(sys.argv[2]))
        return
    compare("sft", sft_lengths(200_000, 8192), 8192, with_trl=True)
    compare("llava", llava_lengths(200_000, 4096), 4096, with_trl=True)
    subprocess.run([sys.executable, __file__, "--big", "10000000"], check=True,
                   env={**os.environ, "OMP_NUM_THREADS": "1", "NUMBA_NUM_THREADS": "1"})


if __name__ == "__main__":
    main()
