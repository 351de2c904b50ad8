"""Stage 3's gather: the tokens a segment keeps, read straight from the samples shards' flat values."""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from packer.stages.materialize import SampleStore


def shard(rng, rows: int, chunk: int) -> tuple[pa.Table, list[np.ndarray]]:
    """A table of ``rows`` token lists in record batches of ``chunk`` rows (as shards are written), and the lists."""
    lists = [rng.integers(-100, 50_000, rng.integers(1, 40)).astype(np.int32) for _ in range(rows)]
    table = pa.table({"input_ids": pa.array([x.tolist() for x in lists], pa.list_(pa.int32())),
                      "key": pa.array([f"r{i}" for i in range(rows)])})
    return pa.Table.from_batches(table.to_batches(max_chunksize=chunk)), lists


def test_gather_tokens_equals_slicing_each_sample():
    rng = np.random.default_rng(0)
    parts = [shard(rng, 57, 10), shard(rng, 3, 1), shard(rng, 40, 64)]
    store = SampleStore([t for t, _ in parts])
    samples = [x for _, lists in parts for x in lists]
    assert [len(t.column("input_ids").chunks) for t, _ in parts] == [6, 3, 1]
    indices = rng.integers(0, len(samples), 300)  # repeats and any order, as split pieces give
    starts = np.array([rng.integers(0, len(samples[i])) for i in indices], np.int64)
    lengths = np.array([rng.integers(1, len(samples[i]) - s + 1) for i, s in zip(indices, starts)], np.int64)
    got = store.gather_tokens("input_ids", indices, starts, lengths)
    want = np.concatenate([samples[i][s : s + n] for i, s, n in zip(indices, starts, lengths)])
    assert got.dtype == np.int32 and got.tolist() == want.tolist()
    assert store.take(indices[:5], ["key"]).column("key").to_pylist() == [f"r{i - (0 if i < 57 else 57 if i < 60 else 60)}"
                                                                          for i in indices[:5].tolist()]
