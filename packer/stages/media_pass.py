"""Optional stage 1b: image embeddings and audio features, once per distinct media file.

Runs in the driver (one accelerator is the usual case) after stage 1, over the media
refs the encoded samples hold, in order of first appearance, so the output is
deterministic. Shards are bounded by ``shard_bytes``. Image embeddings are written with
``FEATURE_SCHEMA`` (float16), audio features with ``AUDIO_FEATURE_SCHEMA`` (float32 plus
``valid_frames``); :class:`packer.loader.stored.StoredFeatures` reads either back.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from packer.media.refs import resolve_ref
from packer.shards.io import write_shard
from packer.shards.schema import AUDIO_FEATURE_SCHEMA, FEATURE_SCHEMA, ShardEntry


def media_paths(samples: pa.Table, kind: str, media_root: str) -> dict[str, str]:
    """ref -> file for every media item of ``kind``, in order of first use. Stored refs are
    relative to the build's media root (or absolute), so one ref names one file."""
    with_media = samples.filter(pc.greater(pc.list_value_length(samples.column("media")), 0))
    refs: dict[str, str] = {}
    for spans in with_media.column("media").to_pylist():
        for m in spans:
            if m["kind"] == kind and m["ref"] not in refs:
                refs[m["ref"]] = resolve_ref(m["ref"], media_root)
    return refs


def feature_table(items: list[tuple[str, dict[str, Any]]], schema: pa.Schema) -> pa.Table:
    """One table of ``schema`` from ``(ref, {"values": array, other columns...})`` items:
    ``shape`` is each array's shape, ``values`` the array flattened to the schema's dtype."""
    dtype = schema.field("values").type.value_type
    values = [np.asarray(item["values"]).reshape(-1) for _, item in items]
    offsets = pa.array(np.concatenate([[0], np.cumsum([len(v) for v in values])]).astype(np.int32))
    columns = {
        "ref": pa.array([r for r, _ in items], pa.string()),
        "shape": pa.array([list(np.shape(item["values"])) for _, item in items], pa.list_(pa.int32())),
        "values": pa.ListArray.from_arrays(offsets, pa.array(np.concatenate(values).astype(dtype.to_pandas_dtype()))),
    }
    for name in schema.names:
        if name not in columns:
            columns[name] = pa.array([item[name] for _, item in items], schema.field(name).type)
    return pa.table(columns, schema=schema)


def run_pass(out: Path, folder: str, refs: dict[str, str], compute: Callable[[list[str]], list[dict[str, Any]]],
             batch_size: int, shard_bytes: int, progress_bar, schema: pa.Schema = FEATURE_SCHEMA) -> list[ShardEntry]:
    """``compute(paths)`` gives one ``{"values": array, ...}`` per path; rows are written in
    ``refs`` order to ``out/folder/part-NNNNN.arrow``, a new shard every ``shard_bytes``."""
    shards: list[ShardEntry] = []
    buffer: list[tuple[str, dict[str, Any]]] = []
    size = 0

    def flush():
        nonlocal buffer, size
        if not buffer:
            return
        shards.append(write_shard(out / folder / f"part-{len(shards):05d}.arrow", feature_table(buffer, schema), out))
        buffer, size = [], 0

    items = list(refs.items())
    for start in range(0, len(items), batch_size):
        batch = items[start : start + batch_size]
        for (ref, _), item in zip(batch, compute([p for _, p in batch]), strict=True):
            buffer.append((ref, item))
            size += np.asarray(item["values"]).nbytes
            if size >= shard_bytes:
                flush()
        progress_bar.advance(len(batch))
    flush()
    return shards


def image_embeddings(out: Path, samples: pa.Table, embedder, config, bar, media_root: str) -> dict[str, Any]:
    refs = media_paths(samples, "image", media_root)
    files = run_pass(out, "embeddings", refs, lambda paths: [{"values": a} for a in embedder.embed(paths)],
                     config.embed_batch_size, config.shard_bytes, bar)
    return {**embedder.describe(), "images": len(refs), "files": [dataclasses.asdict(e) for e in files]}


def audio_features(out: Path, samples: pa.Table, extractor, config, bar, media_root: str) -> dict[str, Any]:
    refs = media_paths(samples, "audio", media_root)
    files = run_pass(out, "audio_features", refs, lambda paths: [_audio_item(extractor, p) for p in paths], 8,
                     config.shard_bytes, bar, AUDIO_FEATURE_SCHEMA)
    return {**extractor.describe(), "clips": len(refs), "files": [dataclasses.asdict(e) for e in files]}


def _audio_item(extractor, path: str) -> dict[str, Any]:
    features, valid = extractor.features(path)
    return {"values": features, "valid_frames": valid}


class _NoBar:
    def advance(self, n: int) -> None:
        pass


def embeddings_task(out: str, sample_files: list[str], config, media_root: str) -> dict[str, Any]:
    """The embedding pass as one self-contained task (what the Ray engine ships to a GPU worker)."""
    from packer.io.fs import location
    from packer.media.embed import EmbedSpec, ImageEmbedder
    from packer.shards.io import read_shards
    from packer.shards.schema import SAMPLE_SCHEMA

    embedder = ImageEmbedder(EmbedSpec.from_config(config))
    where = location(out)
    samples = read_shards([where / f for f in sample_files], SAMPLE_SCHEMA)
    return image_embeddings(where, samples, embedder, config, _NoBar(), media_root)
