"""After stage 1: ``media.arrow``, the size, modification time (and with ``--media-hash`` the
sha256) of every media file the samples name (:mod:`packer.shards.media_index`).

Each stage-1 task looks its samples' files up once more when it has written them
(:func:`media_rows`, rather than at probe time), so a file that changed while the task ran
may be recorded as it is now (the window is the task's length); the driver keeps each
file's first row, in task order, and writes the index (:func:`write_media_index`). So the
lookups (and hashes) run on the workers, in parallel, and the driver never reads the samples
back. ``packer verify --media`` and the loader compare against these rows.
"""

from __future__ import annotations

import itertools
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pyarrow.compute as pc

from packer.io import blobs, fs
from packer.media.refs import resolve_ref
from packer.shards.io import write_shard, write_shard_batches
from packer.shards.media_index import MEDIA_INDEX, MediaFile, media_table, span_refs
from packer.shards.schema import ShardEntry

HASH_THREADS = 8  # sha256 releases the GIL on large reads; a few threads keep a disk busy


def media_refs(samples) -> set[str]:
    """Every file ref the samples' media spans name (frame lists expanded), read column-wise."""
    refs: set[str] = set()
    for chunk in samples.column("media").chunks:
        flat = pc.list_flatten(chunk)
        if len(flat):
            for ref in pc.unique(pc.struct_field(flat, "ref")).to_pylist():
                refs.update(span_refs(ref))
    return refs


def file_row(ref: str, media_root: str, with_hash: bool) -> MediaFile:
    path = resolve_ref(ref, media_root)
    try:
        size, mtime = fs.stat(path)
        digest = _sha256(path) if with_hash else ""
    except OSError:
        return MediaFile(ref, -1, 0, "")
    return MediaFile(ref, size, mtime, digest)


def _sha256(path: str) -> str:
    import hashlib

    h = hashlib.sha256()
    with fs.open_binary(path) as f:
        while block := f.read(1 << 20):
            h.update(block)
    return h.hexdigest()


def media_rows(samples, media_root: str, with_hash: bool = False) -> list[MediaFile]:
    """A row for every file ``samples`` name, by ref (a stage-1 task's, on its worker); embedded media (blobs: their
    media shards hold and check them) have none."""
    refs = sorted(r for r in media_refs(samples) if not blobs.is_blob(r))
    if with_hash and len(refs) > 1:
        with ThreadPoolExecutor(HASH_THREADS) as pool:
            return list(pool.map(lambda r: file_row(r, media_root, True), refs))
    return [file_row(r, media_root, with_hash) for r in refs]


def write_task_blobs(target, tables, root) -> ShardEntry | None:
    """A stage-1 task's embedded media: ``tables`` (blob tables, a group of the task's records' new blobs each, consumed
    as they come) written one after another to the media shard ``target``; None, and no file, when they hold none."""
    tables = iter(tables)
    first = next((t for t in tables if t.num_rows), None)
    if first is None:
        return None
    return write_shard_batches(target, first.schema, itertools.chain([first], tables), root)


def write_media_index(out: Path, rows: list[MediaFile]) -> ShardEntry | None:
    """``OUT/media.arrow`` from the tasks' rows (one per ref, sorted here; None, and no file, when
    the samples name no media)."""
    if not rows:
        (out / MEDIA_INDEX).unlink(missing_ok=True)
        return None
    return write_shard(out / MEDIA_INDEX, media_table(sorted(rows, key=lambda r: r.ref)), out)
