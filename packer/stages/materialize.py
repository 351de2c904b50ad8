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
from packer.schema import IGNORE, PACKED_SCHEMA, SAMPLE_SCHEMA, ShardEntry
from packer.stages.state import Journal, shard_payload

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
    plan_sha256: str
    journal: Journal


def setup(out: str, sample_files: list[str], plan_sha256: str) -> MaterializeState:
    out_path = Path(out)
    samples = read_shards([out_path / f for f in sample_files], SAMPLE_SCHEMA)
    return MaterializeState(samples, read_shard(out_path / "plan.arrow"), out_path, plan_sha256, Journal(out_path))


def materialize_task(state: MaterializeState, task: MaterializeTask) -> ShardEntry:
    identity = {"plan_sha256": state.plan_sha256, "rows": [task.row_start, task.row_stop]}
    done = state.journal.load("pack", task.index, check=identity)
    if done is not None:
        return ShardEntry(**done["shard"])
    bins = state.plan.slice(task.row_start, task.row_stop - task.row_start)
    table = pack_rows(state.samples, bins)
    entry = write_shard(state.out / "packed" / f"part-{task.index:05d}.arrow", table, state.out)
    state.journal.record("pack", task.index, shard_payload(entry, **identity))
    return entry


def pack_rows(samples: pa.Table, bins: pa.Table) -> pa.Table:
    """Build packed rows: segment ``j`` of row ``r`` is tokens ``starts[r][j] :
    starts[r][j] + lengths[r][j]`` of sample ``samples[r][j]``, in order.

    A segment's first label is set to -100 whatever the sample said (a split piece
    starts mid-sample), media spans move with their segment, and a piece of a sample
    is named ``key@start`` so every segment id stays unique.
    """
    members = bins.column("samples").combine_chunks()
    seg_idx = members.flatten().to_numpy()
    seg_from = bins.column("starts").combine_chunks().flatten().to_numpy().astype(np.int64)
    seg_len = bins.column("lengths").combine_chunks().flatten().to_numpy().astype(np.int64)
    row_seg = members.offsets.to_numpy().astype(np.int64)
    row_seg -= row_seg[0]
    sub = samples.take(pa.array(seg_idx))
    tok_off = csr_offsets(seg_len)  # segment j occupies tok_off[j]:tok_off[j+1] of the shard's tokens
    row_tok = tok_off[row_seg]
    seg_start_in_row = tok_off[:-1] - np.repeat(row_tok[:-1], np.diff(row_seg))

    def gather(column: str) -> np.ndarray:
        lists = sub.column(column).combine_chunks()
        offsets = lists.offsets.to_numpy().astype(np.int64)
        return lists.values.to_numpy()[concat_ranges(offsets[:-1] + seg_from, seg_len)]

    labels = gather("labels")
    labels[tok_off[:-1]] = IGNORE
    n_cu = np.diff(row_seg) + 1
    cu_values = tok_off[concat_ranges(row_seg[:-1], n_cu)] - np.repeat(row_tok[:-1], n_cu)
    row_seg32 = pa.array(row_seg, pa.int32())
    row_tok32 = pa.array(row_tok, pa.int32())
    modality = pc.dictionary_encode(sub.column("modality").cast(pa.string()).combine_chunks())
    keys = sub.column("key").to_pylist()
    keys = [k if s == 0 else f"{k}@{s}" for k, s in zip(keys, seg_from.tolist(), strict=True)]
    seg_media = sub.column("media").to_pylist()
    media = []
    for r in range(len(row_seg) - 1):
        spans = []
        for j in range(row_seg[r], row_seg[r + 1]):
            lo, hi = seg_from[j], seg_from[j] + seg_len[j]
            for m in seg_media[j]:
                if lo <= m["start"] and m["start"] + m["length"] <= hi:  # cuts never go through a span
                    spans.append({**m, "segment": int(j - row_seg[r]), "start": int(m["start"] - lo + seg_start_in_row[j])})
        media.append(spans)
    return pa.table(
        {
            "input_ids": pa.ListArray.from_arrays(row_tok32, pa.array(gather("input_ids"), pa.int32())),
            "labels": pa.ListArray.from_arrays(row_tok32, pa.array(labels, pa.int32())),
            "cu_seqlens": pa.ListArray.from_arrays(pa.array(csr_offsets(n_cu), pa.int32()), pa.array(cu_values, pa.int32())),
            "segment_ids": pa.ListArray.from_arrays(row_seg32, pa.array(keys, pa.string())),
            "segment_modality": pa.ListArray.from_arrays(row_seg32, modality),
            "media": pa.array(media, PACKED_SCHEMA.field("media").type),
            "n_tokens": pa.array(np.diff(row_tok), pa.int32()),
        },
        schema=PACKED_SCHEMA,
    )
