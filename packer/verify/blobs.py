"""The media shards of an embedded build (``--media embed``; format in docs/format.md), beyond the file check every
listed file gets (present, same size and sha256, a sound Arrow file of its row count):

- ``--media`` (:func:`blob_problems`): every blob's sha256 equals its name (a packed shard's media shard's and the
  leftover shard's, ``samples/media-unpacked.arrow``), every span of every packed row names blobs its shard's media
  shard holds, and every blob a sample names is held by one of them (what ``packer repack`` reads);
- ``--deep`` (:func:`order_problems`): each media shard holds exactly the blobs its packed shard's rows name, in the
  order they first name them (the order stage 3 writes: :mod:`packer.stages.media_shards`), and the leftover shard
  none of those (each blob is stored once).
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np
import pyarrow as pa

from packer.errors import PackerError
from packer.io import blobs
from packer.shards.io import read_shard
from packer.shards.manifest import Manifest
from packer.shards.media_index import BlobIndex, blob_keys, media_shard_of, span_refs
from packer.shards.schema import ShardEntry
from packer.verify.problem import Problem


def _read(out: Path, entry: ShardEntry, columns: list[str]):
    try:
        return read_shard(out / entry.file, entry.sha256, rows=False).select(columns), None
    except PackerError as e:  # named by the file check already; its rows are not checked
        return None, Problem(entry.file, None, str(e))


def _used(out: Path, packed: ShardEntry) -> tuple[list[list[str]] | None, Problem | None]:
    """Per row of ``packed``, the blob names its spans name, in order."""
    table, problem = _read(out, packed, ["media"])
    if table is None:
        return None, problem
    return [[r for m in spans for r in span_refs(m["ref"]) if blobs.is_blob(r)]
            for spans in table.column("media").to_pylist()], None


def blob_problems(out: Path, manifest: Manifest) -> tuple[list[Problem], int]:
    """Every blob against its name, every span's blob in its media shard: ``(problems, blobs checked)``."""
    files = manifest.files
    problems, checked = [], 0
    for entry in files.blob_store:
        table, problem = _read(out, entry, ["name", "data"])
        if table is None:
            problems.append(problem)
            continue
        names = table.column("name").to_pylist()
        for row, name in enumerate(names):
            digest = hashlib.sha256(table.column("data")[row].as_buffer()).hexdigest()
            checked += 1
            if name != blobs.PREFIX + digest:
                problems.append(Problem(entry.file, row, f"holds bytes of sha256 {digest[:16]}... under the name "
                                                         f"{name[:23]}...: the media shard is damaged; rebuild"))
        if len(set(names)) != len(names):
            problems.append(Problem(entry.file, None, "holds a blob twice (a media shard holds each once)"))
    listed = {e.file: e for e in files.media_shards}
    for packed in files.packed if files.embedded else []:
        media = listed.get(media_shard_of(packed.file))
        if media is None:
            problems.append(Problem(packed.file, None, f"has no media shard ({media_shard_of(packed.file)} is not listed): "
                                                       f"its rows' embedded media are nowhere"))
            continue
        used, problem = _used(out, packed)
        table, other = _read(out, media, ["name"])
        if used is None or table is None:
            problems += [p for p in (problem, other) if p is not None]
            continue
        held = set(table.column("name").to_pylist())
        for row, names in enumerate(used):
            missing = [n for n in names if n not in held]
            if missing:
                problems.append(Problem(packed.file, row, f"a span names {missing[0][:23]}..., which {media.file} does "
                                                          f"not hold: the row's media are missing; rebuild"))
    return problems + sample_problems(out, manifest), checked


def sample_problems(out: Path, manifest: Manifest) -> list[Problem]:
    """Every blob the samples name, against the build's media shards (by name: :class:`BlobIndex`): a repack reads
    them there."""
    files = manifest.files
    if not files.embedded:
        return []
    index, problems = BlobIndex(out, files.blob_store), []
    for entry in files.samples:
        table, problem = _read(out, entry, ["media"])
        if table is None:
            problems.append(problem)
            continue
        names = sorted({r for spans in table.column("media").to_pylist() for m in spans for r in span_refs(m["ref"])
                        if blobs.is_blob(r)})
        held = index.contains(blob_keys(pa.array(names, pa.string())))
        if not held.all():
            name = names[int(np.flatnonzero(~held)[0])]
            problems.append(Problem(entry.file, None, f"its samples name {int((~held).sum())} blob(s) no media shard "
                                                      f"holds ({name[:23]}... first): a repack could not read them; "
                                                      f"rebuild"))
    return problems


def order_problems(out: Path, manifest: Manifest) -> list[Problem]:
    """Each media shard against the blobs its packed shard's rows name, in first-use order (``--deep``)."""
    files = manifest.files
    listed = {e.file: e for e in files.media_shards}
    problems = []
    for packed in files.packed if files.embedded else []:
        media = listed.get(media_shard_of(packed.file))
        if media is None:
            continue  # named by blob_problems / the folder check
        used, problem = _used(out, packed)
        table, other = _read(out, media, ["name"])
        if used is None or table is None:
            continue  # a damaged file: named by the file check
        derived = list(dict.fromkeys(n for names in used for n in names))
        names = table.column("name").to_pylist()
        if names != derived:
            at = next((k for k, (a, b) in enumerate(zip(names, derived, strict=False)) if a != b), min(len(names), len(derived)))
            problems.append(Problem(media.file, at, f"holds {len(names)} blobs where {packed.file}'s rows name {len(derived)} "
                                                    f"in another order or set (first difference at row {at}): it is not "
                                                    f"the media shard stage 3 writes for those rows; rebuild"))
    if files.unpacked_media is not None and files.media_shards:
        table, _ = _read(out, files.unpacked_media, ["name"])
        if table is not None:
            twice = BlobIndex(out, files.media_shards).contains(blob_keys(table.column("name")))
            if twice.any():
                at = int(np.flatnonzero(twice)[0])
                problems.append(Problem(files.unpacked_media.file, at, f"holds {int(twice.sum())} blob(s) a packed "
                                                                       f"shard's media shard holds too (the leftover "
                                                                       f"shard holds only blobs no packed row uses); "
                                                                       f"rebuild"))
    return problems
