"""``media.arrow``: every media file a build's samples name, as it was when the build read it.

One row per file (a frame-list video: one per frame), sorted by ``ref`` (the name the
spans store, relative to the manifest's ``media_root`` or absolute): its size and
modification time, and its sha256 when the build's ``media_hash`` setting is on (empty
otherwise). Written after stage 1, listed in the manifest (``files.media``). Two readers:

- ``packer verify`` (its media check, ``stat`` or ``hash``) compares every file with its row;
- :class:`packer.loader.PackedDataset` checks each file it hands the collator (size, and
  modification time while the media root is the build's), so a file replaced after the
  build -- same size included -- fails loudly instead of training silently.

Lookups are binary searches over the memory-mapped ``ref`` column: no dict of every ref
per DataLoader worker.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

import pyarrow as pa

from packer.shards.schema import Int64, Str, arrow_schema

MEDIA_INDEX = "media.arrow"


@dataclass(frozen=True)
class MediaFile:
    ref: Str
    bytes: Int64  # -1: the file could no longer be read when the index was written
    mtime_ns: Int64
    sha256: Str  # "" unless the build's media_hash setting is on


MEDIA_INDEX_SCHEMA = arrow_schema(MediaFile, "media_index")


def span_refs(ref: str) -> list[str]:
    """The file refs one stored span ``ref`` names: itself, or each frame of a frame-list video
    (stored as JSON ``{"frames": [...], "fps": ...}``)."""
    if ref.startswith("{"):
        return [str(r) for r in json.loads(ref).get("frames", [])]
    return [ref]


def media_table(rows: list[MediaFile]) -> pa.Table:
    rows = sorted(rows, key=lambda r: r.ref)
    return pa.table({"ref": pa.array([r.ref for r in rows], pa.string()),
                     "bytes": pa.array([r.bytes for r in rows], pa.int64()),
                     "mtime_ns": pa.array([r.mtime_ns for r in rows], pa.int64()),
                     "sha256": pa.array([r.sha256 for r in rows], pa.string())}, schema=MEDIA_INDEX_SCHEMA)


class MediaIndex:
    """``ref -> MediaFile`` over a build's ``media.arrow`` (memory-mapped on first use; picklable)."""

    def __init__(self, path: str | Path):
        self.path = path if type(path).__name__ == "RemotePath" else Path(path)  # a remote build's: read via a local copy
        self._table: pa.Table | None = None

    def __getstate__(self) -> dict[str, Any]:
        return {"path": self.path, "_table": None}

    @property
    def table(self) -> pa.Table:
        if self._table is None:
            from packer.shards.io import read_shard

            self._table = read_shard(self.path)
        return self._table

    def __len__(self) -> int:
        return self.table.num_rows

    def __iter__(self):
        for batch in self.table.to_batches():
            for row in batch.to_pylist():
                yield MediaFile(**row)

    def get(self, ref: str) -> MediaFile | None:
        refs = self.table.column("ref")
        lo, hi = 0, len(refs)
        while lo < hi:  # the column is sorted (media_table): the first index whose ref is >= ref
            mid = (lo + hi) // 2
            if refs[mid].as_py() < ref:
                lo = mid + 1
            else:
                hi = mid
        if lo < len(refs) and refs[lo].as_py() == ref:
            row = self.table.slice(lo, 1).to_pylist()[0]
            return MediaFile(**row)
        return None


@dataclass(frozen=True)
class MediaBlob:
    """One embedded medium's bytes in a media shard (``samples/media-part-*.arrow`` after stage 1, ``media/`` beside
    the packed shards): ``name`` is ``sha256:<hex>`` of ``data`` (:mod:`packer.io.blobs`), the ref its spans store."""

    name: Str
    data: Annotated[bytes, pa.large_binary()]


MEDIA_BLOB_SCHEMA = arrow_schema(MediaBlob, "media_blobs")
MEDIA_DIR = "media"  # OUT/media/part-K.arrow: the blobs of OUT/packed/part-K.arrow's rows


def media_shard_of(file: str) -> str:
    """The media shard paired with a shard of rows: ``packed/part-00003.arrow`` -> ``media/part-00003.arrow`` (the
    packed rows'), ``samples/part-00007.arrow`` -> ``samples/media-part-00007.arrow`` (a stage-1 task's)."""
    folder, _, name = file.rpartition("/")
    if folder == "packed":
        return f"{MEDIA_DIR}/{name}"
    return f"{folder}/media-{name}" if folder else f"media-{name}"


def blob_table(names: list[str], data: list[bytes]) -> pa.Table:
    return pa.table({"name": pa.array(names, pa.string()), "data": pa.array(data, pa.large_binary())},
                    schema=MEDIA_BLOB_SCHEMA)
