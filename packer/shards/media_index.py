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

import numpy as np
import pyarrow as pa

from packer.io import blobs
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


UNPACKED_MEDIA = "samples/media-unpacked.arrow"  # an embedded build's blobs that no packed row uses (repack reads them)
_HEX = np.full(256, 255, np.uint8)
_HEX[np.frombuffer(b"0123456789abcdef", np.uint8)] = np.arange(16, dtype=np.uint8)


def blob_keys(names: pa.ChunkedArray | pa.Array) -> np.ndarray:
    """The 32-byte digests of blob ``names`` (``sha256:<64 hex>``) as a numpy ``S32`` array, decoded column-wise: an
    index of every blob of a build costs 32 bytes a blob, not a Python string. A name that is no blob name (a damaged
    shard's) gets the all-zero key, which no blob has."""
    chunks = names.chunks if isinstance(names, pa.ChunkedArray) else [names]
    parts = []
    for chunk in chunks:
        if not len(chunk):
            continue
        offsets = np.frombuffer(chunk.buffers()[1], np.int32)[chunk.offset : chunk.offset + len(chunk) + 1].astype(np.int64)
        if chunk.null_count or not (np.diff(offsets) == len(blobs.PREFIX) + 64).all():
            parts.append(np.array([blob_key(n) or b"" for n in chunk.to_pylist()], "S32"))
            continue
        text = np.frombuffer(chunk.buffers()[2], np.uint8)[offsets[0] : offsets[-1]].reshape(len(chunk), -1)
        nibbles = _HEX[text[:, len(blobs.PREFIX) :]]
        keys = np.ascontiguousarray((nibbles[:, 0::2] << 4) | nibbles[:, 1::2]).view("S32").ravel()
        prefix = np.frombuffer(blobs.PREFIX.encode(), np.uint8)
        bad = (nibbles == 255).any(axis=1) | (text[:, : len(blobs.PREFIX)] != prefix).any(axis=1)
        keys[bad] = b""
        parts.append(keys)
    return np.concatenate(parts) if parts else np.empty(0, "S32")


def blob_key(name: str) -> np.bytes_ | None:
    """One name's key (:func:`blob_keys`); None when it is no blob name."""
    try:
        return np.bytes_(bytes.fromhex(name[len(blobs.PREFIX) :])) if blobs.is_blob(name) and len(name) == 71 else None
    except ValueError:
        return None


class BlobIndex:
    """``name -> (media shard, row)`` over media shards ``entries`` (files relative to ``root``), built from their
    ``name`` columns when first asked: sorted 32-byte keys, memory-mapped tables, never a blob's bytes read before it
    is asked for. A blob several shards hold is found in the first of them (in ``entries`` order). Picklable."""

    def __init__(self, root, entries: list):
        from packer.io.fs import location

        self.root, self.entries = location(root) if isinstance(root, str) else root, list(entries)
        self._keys: np.ndarray | None = None
        self._where: np.ndarray | None = None  # (shard, row) per sorted key
        self._tables: dict[int, pa.Table] = {}

    def __getstate__(self) -> dict[str, Any]:
        return {"root": self.root, "entries": self.entries, "_keys": None, "_where": None, "_tables": {}}

    def table(self, k: int) -> pa.Table:
        if k not in self._tables:
            from packer.shards.io import read_shard

            entry = self.entries[k]
            self._tables[k] = read_shard(self.root / entry.file, entry.sha256, rows=False)
        return self._tables[k]

    def _build(self) -> None:
        keys, where = [], []
        for k in range(len(self.entries)):
            names = blob_keys(self.table(k).column("name"))
            keys.append(names)
            where.append(np.stack([np.full(len(names), k, np.int64), np.arange(len(names), dtype=np.int64)], axis=1))
        all_keys = np.concatenate(keys) if keys else np.empty(0, "S32")
        order = np.argsort(all_keys, kind="stable")  # equal keys keep shard order: the first shard's is found
        self._keys = all_keys[order]
        self._where = (np.concatenate(where) if where else np.empty((0, 2), np.int64))[order]

    def __len__(self) -> int:
        if self._keys is None:
            self._build()
        return len(np.unique(self._keys))

    def locate(self, name: str) -> tuple[int, int] | None:
        """``(media shard, row)`` of ``name``; None when no shard holds it."""
        if self._keys is None:
            self._build()
        key = blob_key(name)
        if key is None:
            return None
        i = int(np.searchsorted(self._keys, key))
        if i < len(self._keys) and self._keys[i] == key:
            k, row = self._where[i]
            return int(k), int(row)
        return None

    def contains(self, keys: np.ndarray) -> np.ndarray:
        """Per key of ``keys`` (:func:`blob_keys`), whether a shard holds it."""
        if self._keys is None:
            self._build()
        i = np.minimum(np.searchsorted(self._keys, keys), max(len(self._keys) - 1, 0))
        return (self._keys[i] == keys) if len(self._keys) else np.zeros(len(keys), bool)

    def buffer(self, name: str) -> pa.Buffer | None:
        """``name``'s bytes, a view of its memory-mapped shard; None when no shard holds it."""
        at = self.locate(name)
        return None if at is None else self.table(at[0]).column("data")[at[1]].as_buffer()
