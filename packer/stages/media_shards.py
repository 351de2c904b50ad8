"""An embedded build's media shards: ``media/part-K.arrow`` holds the bytes of the blobs ``packed/part-K.arrow``'s
rows name (:data:`packer.shards.media_index.MEDIA_BLOB_SCHEMA`: ``name``, ``data``).

Order: row by row, span by span (a frame list frame by frame), each blob at its first use (deduplicated by content
within the shard). A row whose media no earlier row used reads them as one contiguous run of rows::

    packed rows   r0: [A, B]   r1: [C]   r2: [A, D]
    media shard   0: A  1: B  2: C  3: D        r0 -> rows 0..1, r1 -> 2, r2 -> 0 and 3

In a build the bytes come from the stage-1 media shards (``samples/media-part-K.arrow``, one per stage-1 task, each
blob once): a sample's blobs are in its own task's, so a span is looked up in one small name column
(:class:`BlobShards`), never in an index of every blob of the build; the bytes are copied a bounded batch at a time.
In a repack they come from the source build's media shards and its leftover shard, by name (:class:`IndexedBlobs`).

Each blob is stored once: when the packed media shards are written, the blobs no packed row uses go to one leftover
shard (``samples/media-unpacked.arrow``, :func:`write_unpacked`) and the stage-1 media shards are deleted once the
manifest is written (:func:`packer.pipeline.packing.plan_and_pack`); a repack finds every sample's blob by name in
those two.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa

from packer.io import blobs
from packer.shards.io import read_shard, write_shard_batches
from packer.shards.media_index import (
    MEDIA_BLOB_SCHEMA,
    UNPACKED_MEDIA,
    BlobIndex,
    blob_keys,
    blob_table,
    media_shard_of,
    span_refs,
)
from packer.shards.schema import ShardEntry

BATCH_BYTES = 64 * 2**20  # blob bytes held at a time while a media shard is written
OPEN_SHARDS = 64  # stage-1 media shards a worker keeps mapped (their name -> row maps with them)


class BlobShards:
    """The stage-1 media shards of a build, by sample shard: :meth:`data` of a blob named by sample shard ``k``'s
    samples. Each shard is memory-mapped and its ``name`` column turned into a map when first asked for."""

    def __init__(self, out: Path, entries: list[ShardEntry | None]):
        self.out, self.entries = out, entries
        self._open: dict[int, tuple[pa.Table, dict[str, int]]] = {}

    def _shard(self, k: int) -> tuple[pa.Table, dict[str, int]]:
        if k not in self._open:
            entry = self.entries[k]
            if entry is None:
                raise KeyError(k)
            if len(self._open) >= OPEN_SHARDS:
                self._open.pop(next(iter(self._open)))
            table = read_shard(self.out / entry.file, entry.sha256, rows=False)
            self._open[k] = (table, {n: i for i, n in enumerate(table.column("name").to_pylist())})
        return self._open[k]

    def data(self, k: int, name: str) -> bytes:
        try:
            table, rows = self._shard(k)
            return table.column("data")[rows[name]].as_py()
        except KeyError:
            what = self.entries[k].file if k < len(self.entries) and self.entries[k] else f"sample shard {k}'s media shard"
            raise FileNotFoundError(f"{name}: not in {what}, the stage-1 media shard of the samples that name it; the "
                                    f"build's samples/ are damaged (packer verify names what): rebuild") from None


class IndexedBlobs:
    """A finished build's blobs by name, whichever sample names them (``data(shard, name)`` as :class:`BlobShards`,
    ``shard`` unused): its packed media shards and its leftover shard, through a :class:`BlobIndex` of their names."""

    def __init__(self, root, entries: list[ShardEntry]):
        self.index = BlobIndex(root, entries)

    def data(self, shard: int, name: str) -> bytes:
        held = self.index.buffer(name)
        if held is None:
            raise FileNotFoundError(f"{name}: in none of the media shards of {self.index.root} (media/, "
                                    f"{UNPACKED_MEDIA}); the source build is damaged (packer verify --media names "
                                    f"what): rebuild it")
        return held.to_pybytes()


def first_use(rows: pa.Table, bins: pa.Table, sample_starts: np.ndarray, used: dict[str, int]) -> None:
    """Add to ``used`` (blob name -> sample shard) each blob ``rows`` name that it does not hold yet, in the order the
    rows name them; ``bins`` are the plan rows ``rows`` were packed from (their segments' samples)."""
    members = bins.column("samples").to_pylist()
    for spans, segment_samples in zip(rows.column("media").to_pylist(), members, strict=True):
        for m in spans:
            names = [r for r in span_refs(m["ref"]) if blobs.is_blob(r)]
            if not names:
                continue
            shard = int(np.searchsorted(sample_starts, segment_samples[m["segment"]], side="right") - 1)
            for name in names:
                used.setdefault(name, shard)


def write_media_shard(out: Path, source: BlobShards | IndexedBlobs, packed_file: str, used: dict[str, int]) -> ShardEntry:
    """``media/part-K.arrow`` for ``packed/part-K.arrow`` (``packed_file``): the blobs of ``used`` in its order, read
    from ``source``; written (even empty) so every packed shard of an embedded build has its pair."""

    def batches():
        names, data, size = [], [], 0
        for name, shard in used.items():
            names.append(name)
            data.append(source.data(shard, name))
            size += len(data[-1])
            if size >= BATCH_BYTES:
                yield blob_table(names, data)
                names, data, size = [], [], 0
        yield blob_table(names, data)

    return write_shard_batches(out / media_shard_of(packed_file), MEDIA_BLOB_SCHEMA, batches(), out)


def blob_entries(sample_shards: list[ShardEntry], blob_shards: list[ShardEntry]) -> list[ShardEntry | None]:
    """Each sample shard's stage-1 media shard (paired by name: :func:`media_shard_of`), None where its task wrote
    none."""
    by_file = {e.file: e for e in blob_shards}
    return [by_file.get(media_shard_of(e.file)) for e in sample_shards]


def write_unpacked(out: Path, store: BlobIndex, packed: list[ShardEntry]) -> ShardEntry | None:
    """``samples/media-unpacked.arrow``: every blob of ``store`` (the blobs the samples name: the stage-1 media shards
    of a build, the source's media shards of a repack) that none of the ``packed`` media shards holds, once each,
    sorted by name (so a repack's is a fresh build's); None, and no file, when there is none. Only the name columns
    are indexed; the bytes are copied a bounded batch at a time."""
    target = out / UNPACKED_MEDIA
    held = BlobIndex(out, packed)
    left: dict[bytes, tuple[int, int]] = {}  # the leftover blobs only (samples in no packed row: few)
    for k in range(len(store.entries)):
        keys = blob_keys(store.table(k).column("name"))
        for row in np.flatnonzero(~held.contains(keys)):
            left.setdefault(keys[row], (k, int(row)))

    def batches():
        names, data, size = [], [], 0
        for key in sorted(left):
            k, row = left[key]
            names.append(store.table(k).column("name")[row].as_py())
            data.append(store.table(k).column("data")[row].as_py())
            size += len(data[-1])
            if size >= BATCH_BYTES:
                yield blob_table(names, data)
                names, data, size = [], [], 0
        yield blob_table(names, data)

    if not left:
        target.unlink(missing_ok=True)
        return None
    return write_shard_batches(target, MEDIA_BLOB_SCHEMA, batches(), out)


def unpacked_setup(out: str, store_root: str, store: list[ShardEntry], packed: list[ShardEntry]):
    """The state of :func:`unpacked_task`: run on a worker (a Ray driver reads no blob)."""
    from packer.io.fs import location

    return location(out), BlobIndex(store_root, store), packed


def unpacked_task(state, _task) -> ShardEntry | None:
    out, store, packed = state
    return write_unpacked(out, store, packed)
