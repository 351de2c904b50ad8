"""Stage 3: materialize. The plan and the samples in, ``packed/*.arrow`` out.

Shard boundaries are decided on the driver from the plan alone (at most
``shard_rows`` rows and about ``shard_bytes`` bytes each), and each task builds its
shard with vectorised gathers over the memory-mapped samples: no per-token Python.

An embedded build (``media = "embed"``) also writes ``media/part-K.arrow`` beside ``packed/part-K.arrow``: the bytes of
every blob its rows name, in the order the rows use them, each once (:mod:`packer.stages.media_shards`).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from packer._ranges import concat_ranges, csr_offsets
from packer.errors import PackerError
from packer.io.files import set_durable
from packer.io.fs import location
from packer.pack.trees import PLAIN, PROMPT, stored_ranges, structure
from packer.shards.io import read_shard, write_shard_batches
from packer.shards.schema import IGNORE, PACKED_SCHEMA, SAMPLE_SCHEMA, ShardEntry
from packer.shards.stats import ShardStats, table_stats
from packer.stages.media_shards import BlobShards, IndexedBlobs, first_use, write_media_shard
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


ROWS_PER_BATCH = 256  # rows gathered at a time: bounds a task's memory whatever the shard size


class SampleStore:
    """Rows of the memory-mapped samples shards by global sample number.

    A take over one concatenated table would let Arrow combine the chunks (copying every
    sample into memory); taking from each shard separately touches only the rows asked for.
    Token columns are not taken row by row at all: :meth:`gather_tokens` copies just the
    tokens a segment keeps, straight from each shard's flat values.
    """

    def __init__(self, tables: list[pa.Table]):
        self.tables = tables
        self.starts = np.concatenate([[0], np.cumsum([t.num_rows for t in tables])]).astype(np.int64)
        self._flat: dict[tuple[int, str], list[tuple[int, np.ndarray, np.ndarray]]] = {}

    def take(self, indices: np.ndarray, columns: list[str] | None = None) -> pa.Table:
        shard = np.searchsorted(self.starts, indices, side="right") - 1
        order = np.argsort(shard, kind="stable")
        parts = []
        for k in np.unique(shard):
            local = indices[shard == k] - self.starts[k]
            table = self.tables[k] if columns is None else self.tables[k].select(columns)
            parts.append(table.take(pa.array(local)))
        if not parts:
            empty = SAMPLE_SCHEMA.empty_table()
            return empty if columns is None else empty.select(columns)
        grouped = pa.concat_tables(parts).combine_chunks()
        inverse = np.empty_like(order)
        inverse[order] = np.arange(len(order))
        return grouped.take(pa.array(inverse))

    def _located(self, column: str, indices: np.ndarray):
        """For each record batch of ``column`` holding samples of ``indices``: (positions in ``indices``, their rows in
        the batch, the batch's list offsets, its flat values)."""
        shard = np.searchsorted(self.starts, indices, side="right") - 1
        for k in np.unique(shard).tolist():
            in_shard = np.flatnonzero(shard == k)
            local = indices[in_shard] - self.starts[k]
            for first, offsets, values in self._flat_column(k, column):
                in_batch = (local >= first) & (local < first + len(offsets) - 1)
                if in_batch.any():
                    yield in_shard[in_batch], local[in_batch] - first, offsets, values

    def gather_tokens(self, column: str, indices: np.ndarray, starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
        """Tokens ``starts[j] : starts[j] + lengths[j]`` of sample ``indices[j]``'s ``column``, concatenated in ``j`` order."""
        out_at = csr_offsets(lengths)
        out = np.empty(int(out_at[-1]), dtype=np.int32)
        for sel, rows, offsets, values in self._located(column, indices):
            out[concat_ranges(out_at[sel], lengths[sel])] = values[concat_ranges(offsets[rows] + starts[sel], lengths[sel])]
        return out

    def list_lengths(self, column: str, indices: np.ndarray) -> np.ndarray:
        """The length of list ``column`` of each sample of ``indices``, from the shards' offsets (nothing copied)."""
        out = np.zeros(len(indices), np.int64)
        for sel, rows, offsets, _ in self._located(column, indices):
            out[sel] = offsets[rows + 1] - offsets[rows]
        return out

    def _flat_column(self, k: int, column: str) -> list[tuple[int, np.ndarray, np.ndarray]]:
        """``(first row, offsets, flat values)`` of each record batch of shard ``k``'s list column (zero-copy views)."""
        key = (k, column)
        if key not in self._flat:
            parts, row = [], 0
            for chunk in self.tables[k].column(column).chunks:
                parts.append((row, chunk.offsets.to_numpy().astype(np.int64), chunk.values.to_numpy()))
                row += len(chunk)
            self._flat[key] = parts
        return self._flat[key]


@dataclass(frozen=True)
class MaterializeState:
    samples: SampleStore
    plan: pa.Table
    out: Path
    plan_sha256: str
    journal: Journal
    blobs: BlobShards | IndexedBlobs | None = None  # an embedded build's: the stage-1 media shards (a repack: the source's)


def setup(out: str, sample_files: list[str], plan_sha256: str, durable: bool = True,
          sample_sha256: list[str] | None = None, blob_files: list[ShardEntry | None] | None = None,
          blob_store: tuple[str, list[ShardEntry]] | None = None) -> MaterializeState:
    """The samples and the plan, memory-mapped (a remote build's through local copies, checked
    against ``sample_sha256`` / ``plan_sha256``). Each worker runs this: the samples get Arrow's
    validation here (safe to read), their values were checked once by the driver that planned them.
    ``blob_files`` (an embedded build): each sample shard's stage-1 media shard, or None where its samples name no
    blob; opened when a task first needs one. ``blob_store`` (a repack of an embedded build): the source build's folder
    and media shards, where each blob is found by name instead."""
    set_durable(durable)
    out_path = location(out)
    shas = sample_sha256 or [None] * len(sample_files)
    source = BlobShards(out_path, blob_files) if blob_files is not None else None
    if blob_store is not None:
        source = IndexedBlobs(*blob_store)
    samples = SampleStore([read_shard(out_path / f, sha, rows=False) for f, sha in zip(sample_files, shas, strict=True)])
    return MaterializeState(samples, read_shard(out_path / "plan.arrow", plan_sha256), out_path, plan_sha256,
                            Journal(out_path), source)


@dataclass(frozen=True)
class MaterializeResult:
    shard: ShardEntry
    reused: bool = False  # found finished in the journal (a resumed build)
    stats: ShardStats | None = None  # the report's accumulators for this shard, so the driver never reads it back
    media: ShardEntry | None = None  # an embedded build's media/part-K.arrow


def materialize_task(state: MaterializeState, task: MaterializeTask) -> MaterializeResult:
    identity = {"plan_sha256": state.plan_sha256, "rows": [task.row_start, task.row_stop]}
    done = state.journal.load("pack", task.index, check=identity)
    if done is not None and (state.blobs is None or done.get("blobs")):
        entry = ShardEntry(**done["shard"])
        return MaterializeResult(entry, reused=True, stats=table_stats(read_shard(state.out / entry.file, entry.sha256)),
                                 media=ShardEntry(**done["blobs"]) if done.get("blobs") else None)
    stats = [ShardStats()]
    used: dict[str, int] = {}  # blob name -> the sample shard whose task holds it, in the order the rows use them

    def batches():
        for start in range(task.row_start, task.row_stop, ROWS_PER_BATCH):
            bins = state.plan.slice(start, min(ROWS_PER_BATCH, task.row_stop - start))
            rows = pack_rows(state.samples, bins)
            if state.blobs is not None:
                first_use(rows, bins, state.samples.starts, used)
            stats[0] = stats[0].merge(table_stats(rows))
            yield rows

    entry = write_shard_batches(state.out / "packed" / f"part-{task.index:05d}.arrow", PACKED_SCHEMA, batches(), state.out)
    media = write_media_shard(state.out, state.blobs, entry.file, used) if state.blobs is not None else None
    extra = {"blobs": dataclasses.asdict(media)} if media is not None else {}
    state.journal.record("pack", task.index, shard_payload(entry, **identity, **extra))
    return MaterializeResult(entry, stats=stats[0], media=media)


def pack_rows(samples: SampleStore, bins: pa.Table) -> pa.Table:
    """Build packed rows: segment ``j`` of row ``r`` is tokens ``starts[r][j] :
    starts[r][j] + lengths[r][j]`` of sample ``samples[r][j]``, in order.

    A segment's first label is set to -100 whatever the sample said (a split piece
    starts mid-sample), media spans move with their segment; a segment is identified by
    its sample's input file number, line and piece start (a piece is displayed ``key@start``).
    A preference sample's segments (its responses, or a tree's prompt and branches, as the plan
    cut them) get their parent, group, role and weight (:func:`packer.pack.trees.structure`).
    """
    members = bins.column("samples").combine_chunks()
    seg_idx = members.flatten().to_numpy()
    seg_from = bins.column("starts").combine_chunks().flatten().to_numpy().astype(np.int64)
    seg_len = bins.column("lengths").combine_chunks().flatten().to_numpy().astype(np.int64)
    row_seg = members.offsets.to_numpy().astype(np.int64)
    row_seg -= row_seg[0]
    # Each sample's row once (a preference record is one sample of many segments: its lists are not copied
    # per segment), and its scalar columns per segment through ``inverse``.
    unique, inverse = np.unique(seg_idx, return_inverse=True)
    own = samples.take(unique, ["key", "modality", "source_index", "source_line", "media", "responses", "prefix"])
    sub = own.select(["key", "modality", "source_index", "source_line"]).take(pa.array(inverse))
    tok_off = csr_offsets(seg_len)  # segment j occupies tok_off[j]:tok_off[j+1] of the shard's tokens
    row_tok = tok_off[row_seg]
    seg_start_in_row = tok_off[:-1] - np.repeat(row_tok[:-1], np.diff(row_seg))

    preference = pc.list_value_length(own.column("responses")).to_numpy(zero_copy_only=False).any() if len(seg_idx) else False
    stored = _stored_pieces(own, inverse, seg_from, seg_len, samples.list_lengths("input_ids", unique)) if preference \
        else (seg_from, seg_len, None)  # no preference sample: each segment is its own range

    def gather(column: str) -> np.ndarray:
        if stored[2] is None:
            return samples.gather_tokens(column, seg_idx, seg_from, seg_len)
        return samples.gather_tokens(column, np.repeat(seg_idx, 2), stored[0], stored[1])

    labels = gather("labels")
    labels[tok_off[:-1]] = IGNORE
    supervised = (labels != IGNORE).view(np.int8)
    seg_trained = np.add.reduceat(supervised, tok_off[:-1], dtype=np.int64) if len(seg_len) else np.zeros(0, np.int64)
    seg_trained[seg_len == 0] = 0  # reduceat gives the next element for an empty range (never planned; kept exact)
    n_cu = np.diff(row_seg) + 1
    cu_values = tok_off[concat_ranges(row_seg[:-1], n_cu)] - np.repeat(row_tok[:-1], n_cu)
    row_seg32 = pa.array(row_seg, pa.int32())
    row_tok32 = pa.array(row_tok, pa.int32())
    modality = pc.dictionary_encode(sub.column("modality").cast(pa.string()).combine_chunks())
    tree = _tree_columns(own, unique, seg_idx, seg_from, seg_len, row_seg)
    keys = sub.column("key").to_pylist()
    keys = [k if s == 0 or r != "" else f"{k}@{s}" for k, s, r in zip(keys, seg_from.tolist(), tree["role"], strict=True)]
    sample_media = [_SpanIndex(m) for m in own.column("media").to_pylist()]
    stored_media = (pc.list_value_length(own.column("responses")).to_numpy(zero_copy_only=False) > 0)[inverse] \
        if len(seg_idx) else np.zeros(0, bool)  # a preference segment: its response's media, in that response's tokens
    media = []
    for r in range(len(row_seg) - 1):
        spans = []
        for j in range(row_seg[r], row_seg[r + 1]):
            lo = int(stored[0][2 * j]) if stored_media[j] else int(seg_from[j])  # in its media's coordinates
            hi = lo + int(seg_len[j])
            for m in sample_media[inverse[j]].within(lo, hi):  # cuts never go through a span
                spans.append({**m, "segment": int(j - row_seg[r]), "start": int(m["start"] - lo + seg_start_in_row[j])})
        media.append(spans)
    return pa.table(
        {
            "input_ids": pa.ListArray.from_arrays(row_tok32, pa.array(gather("input_ids"), pa.int32())),
            "labels": pa.ListArray.from_arrays(row_tok32, pa.array(labels, pa.int32())),
            "cu_seqlens": pa.ListArray.from_arrays(pa.array(csr_offsets(n_cu), pa.int32()), pa.array(cu_values, pa.int32())),
            "segment_ids": pa.ListArray.from_arrays(row_seg32, pa.array(keys, pa.string())),
            "segment_source": pa.ListArray.from_arrays(row_seg32, sub.column("source_index").combine_chunks().cast(pa.int32())),
            "segment_line": pa.ListArray.from_arrays(row_seg32, sub.column("source_line").combine_chunks().cast(pa.int64())),
            "segment_start": pa.ListArray.from_arrays(row_seg32, pa.array(seg_from, pa.int32())),
            "segment_modality": pa.ListArray.from_arrays(row_seg32, modality),
            "segment_parent": pa.ListArray.from_arrays(row_seg32, pa.array(tree["parent"], pa.int32())),
            "segment_group": pa.ListArray.from_arrays(row_seg32, pa.array(tree["group"], pa.int32())),
            "segment_role": pa.ListArray.from_arrays(row_seg32, pc.dictionary_encode(pa.array(tree["role"], pa.string()))),
            "segment_weight": pa.ListArray.from_arrays(row_seg32, pa.array(tree["weight"], pa.float32())),
            "media": pa.array(media, PACKED_SCHEMA.field("media").type),
            "n_tokens": pa.array(np.diff(row_tok), pa.int32()),
            "segment_trained": pa.ListArray.from_arrays(row_seg32, pa.array(seg_trained, pa.int32())),
            "n_trained": pa.array(np.add.reduceat(seg_trained, row_seg[:-1]) if len(seg_trained) else np.zeros(len(row_seg) - 1),
                                  pa.int32()),
        },
        schema=PACKED_SCHEMA,
    )


def _stored_pieces(own: pa.Table, inverse: np.ndarray, seg_from: np.ndarray, seg_len: np.ndarray,
                   stored_lengths: np.ndarray) -> tuple[np.ndarray, np.ndarray, bool]:
    """``(starts, lengths, True)`` of two stored pieces per segment (interleaved: segment ``j`` is pieces ``2j``, ``2j + 1``):
    a preference sample stores its shared prompt once (:func:`packer.pack.trees.stored_ranges`); any other segment
    is its own range and an empty piece."""
    starts = np.zeros(2 * len(seg_from), np.int64)
    lengths = np.zeros(2 * len(seg_from), np.int64)
    starts[0::2], lengths[0::2] = seg_from, seg_len
    counts = pc.list_value_length(own.column("responses")).to_numpy(zero_copy_only=False) if len(seg_from) else []
    prefixes = own.column("prefix").to_numpy() if len(seg_from) else []
    order = np.argsort(inverse, kind="stable")
    bounds = np.searchsorted(inverse[order], np.arange(len(counts) + 1))
    for u in np.flatnonzero(np.asarray(counts) > 0).tolist():
        spans = own.column("responses")[u].values
        mine = order[bounds[u] : bounds[u + 1]]
        prefix = int(prefixes[u]) if counts[u] > 1 else 0
        whole = spans.field("length").to_numpy()
        expected = int(whole.sum()) - (len(whole) - 1) * prefix  # the prompt once, then each response's rest
        if int(stored_lengths[u]) != expected:
            raise PackerError(f"sample {own.column('key')[u].as_py()!r} holds {int(stored_lengths[u]):,} tokens where its "
                              f"responses stored with their prompt once make {expected:,}: samples written by an earlier "
                              f"packer (each response stored whole); rebuild: packer build ... --overwrite")
        head_at, head, rest_at, rest = stored_ranges(seg_from[mine], seg_len[mine], spans.field("start").to_numpy(),
                                                     whole, prefix)
        starts[2 * mine], lengths[2 * mine], starts[2 * mine + 1], lengths[2 * mine + 1] = head_at, head, rest_at, rest
    return starts, lengths, True


class _SpanIndex:
    """A sample's media spans, found by token range in ``O(log n + found)``: a preference sample holds its prompt's
    spans once per response, and each of its segments looks up only its own."""

    def __init__(self, spans: list[dict]):
        self.spans = spans
        starts = np.array([m["start"] for m in spans], np.int64)
        self.order = np.argsort(starts, kind="stable")
        self.starts = starts[self.order]

    def within(self, lo: int, hi: int) -> list[dict]:
        """The spans wholly inside tokens ``lo : hi``, in stored order."""
        a, b = np.searchsorted(self.starts, [lo, hi])
        picked = [self.spans[k] for k in np.sort(self.order[a:b]).tolist()]
        return [m for m in picked if m["start"] + m["length"] <= hi]


def _tree_columns(own: pa.Table, unique: np.ndarray, seg_idx: np.ndarray, seg_from: np.ndarray, seg_len: np.ndarray,
                  row_seg: np.ndarray) -> dict[str, list]:
    """Each segment's parent and group (segment numbers in its row), role and weight. ``own`` holds each sample of
    ``unique`` once: a preference record's response list is read once, whatever its number of segments."""
    n = len(seg_idx)
    counts = pc.list_value_length(own.column("responses")).to_numpy(zero_copy_only=False) if n else np.zeros(0)
    if not counts.any():
        return {"parent": np.full(n, -1), "group": np.arange(n) - np.repeat(row_seg[:-1], np.diff(row_seg)),
                "role": [""] * n, "weight": np.full(n, np.nan, np.float32)}
    info, meta = {}, {}
    prefixes = own.column("prefix").to_numpy()
    for u in np.flatnonzero(counts).tolist():
        spans = own.column("responses")[u].as_py()
        sample = int(unique[u])
        info[sample] = (int(prefixes[u]), np.array([r["start"] for r in spans]), np.array([r["length"] for r in spans]))
        meta[sample] = ([r["role"] for r in spans], [r["weight"] for r in spans])
    parent, group, response = structure(seg_idx, seg_from, seg_len, row_seg, info)
    role, weight = [""] * n, np.full(n, np.nan, np.float32)
    for j in np.flatnonzero(response != PLAIN).tolist():
        if response[j] == PROMPT:
            role[j] = "prompt"
        else:
            roles, weights = meta[int(seg_idx[j])]
            role[j], weight[j] = roles[response[j]], weights[response[j]]
    return {"parent": parent, "group": group, "role": role, "weight": weight}
