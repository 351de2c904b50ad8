"""Stage 3: materialize. The plan and the samples in, ``packed/*.arrow`` out.

Shard boundaries are decided on the driver from the plan alone (at most
``shard_rows`` rows and about ``shard_bytes`` bytes each), and each task builds its
shard with vectorised gathers over the memory-mapped samples: no per-token Python.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from packer._ranges import concat_ranges, csr_offsets
from packer.io.arrow import read_shard, read_shards, write_shard
from packer.schema import PACKED_SCHEMA, SAMPLE_SCHEMA, ShardEntry

BYTES_PER_TOKEN = 8  # input_ids + labels, int32 each
BYTES_PER_SEGMENT = 64  # cu_seqlens entry, key, modality, list offsets (an estimate)


@dataclass(frozen=True)
class MaterializeTask:
    index: int
    row_start: int
    row_stop: int


def shard_tasks(bin_tokens: np.ndarray, bin_segments: np.ndarray, shard_rows: int, shard_bytes: int) -> list[MaterializeTask]:
    tasks, start, size = [], 0, 0
    row_bytes = bin_tokens * BYTES_PER_TOKEN + bin_segments * BYTES_PER_SEGMENT
    for row, nbytes in enumerate(row_bytes.tolist()):
        if row > start and (row - start == shard_rows or size + nbytes > shard_bytes):
            tasks.append(MaterializeTask(len(tasks), start, row))
            start, size = row, 0
        size += nbytes
    if len(bin_tokens) > start:
        tasks.append(MaterializeTask(len(tasks), start, len(bin_tokens)))
    return tasks


@dataclass(frozen=True)
class MaterializeState:
    samples: pa.Table
    plan: pa.Table
    out: Path


def setup(out: str, sample_files: list[str]) -> MaterializeState:
    out_path = Path(out)
    samples = read_shards([out_path / f for f in sample_files], SAMPLE_SCHEMA)
    return MaterializeState(samples, read_shard(out_path / "plan.arrow"), out_path)


def materialize_task(state: MaterializeState, task: MaterializeTask) -> ShardEntry:
    bins = state.plan.slice(task.row_start, task.row_stop - task.row_start)
    table = pack_rows(state.samples, bins)
    return write_shard(state.out / "packed" / f"part-{task.index:05d}.arrow", table, state.out)


def pack_rows(samples: pa.Table, bins: pa.Table) -> pa.Table:
    """Build packed rows: bin ``r`` concatenates the first ``lengths[r][j]`` tokens of
    sample ``samples[r][j]`` for each ``j``, in order."""
    members = bins.column("samples").combine_chunks()
    seg_idx = members.flatten().to_numpy()
    seg_len = bins.column("lengths").combine_chunks().flatten().to_numpy().astype(np.int64)
    row_seg = members.offsets.to_numpy().astype(np.int64)
    row_seg -= row_seg[0]
    sub = samples.take(pa.array(seg_idx))
    tok_off = csr_offsets(seg_len)  # segment j occupies tok_off[j]:tok_off[j+1] of the shard's tokens
    row_tok = tok_off[row_seg]
    seg_start_in_row = tok_off[:-1] - np.repeat(row_tok[:-1], np.diff(row_seg))

    def gather(column: str) -> pa.Array:
        lists = sub.column(column).combine_chunks()
        offsets = lists.offsets.to_numpy().astype(np.int64)
        values = lists.values.to_numpy()
        picked = values[concat_ranges(offsets[:-1], seg_len)]  # the first seg_len[j] tokens of sample j
        return pa.ListArray.from_arrays(pa.array(row_tok, pa.int32()), pa.array(picked, pa.int32()))

    n_cu = np.diff(row_seg) + 1
    cu_values = tok_off[concat_ranges(row_seg[:-1], n_cu)] - np.repeat(row_tok[:-1], n_cu)
    row_seg32 = pa.array(row_seg, pa.int32())
    modality = pc.dictionary_encode(sub.column("modality").cast(pa.string()).combine_chunks())
    seg_media = sub.column("media").to_pylist()
    media = []
    for r in range(len(row_seg) - 1):
        spans = []
        for j in range(row_seg[r], row_seg[r + 1]):
            for m in seg_media[j]:
                if m["start"] + m["length"] <= seg_len[j]:  # truncation never cuts a span, it drops it
                    spans.append({**m, "segment": int(j - row_seg[r]), "start": int(m["start"] + seg_start_in_row[j])})
        media.append(spans)
    return pa.table(
        {
            "input_ids": gather("input_ids"),
            "labels": gather("labels"),
            "cu_seqlens": pa.ListArray.from_arrays(pa.array(csr_offsets(n_cu), pa.int32()), pa.array(cu_values, pa.int32())),
            "segment_ids": pa.ListArray.from_arrays(row_seg32, sub.column("key").combine_chunks()),
            "segment_modality": pa.ListArray.from_arrays(row_seg32, modality),
            "media": pa.array(media, PACKED_SCHEMA.field("media").type),
            "n_tokens": pa.array(np.diff(row_tok), pa.int32()),
        },
        schema=PACKED_SCHEMA,
    )
