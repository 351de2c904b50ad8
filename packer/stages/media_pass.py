"""Optional stage 1b: image embeddings and audio features, once per distinct media file.

Runs in the driver (one accelerator is the usual case) after stage 1, over the media
refs the encoded samples hold, in order of first appearance, so the output is
deterministic. Shards are bounded by ``shard_bytes``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from packer.errors import PackerError
from packer.io.arrow import write_shard
from packer.schema import FEATURE_SCHEMA, ShardEntry


def media_paths(samples: pa.Table, kind: str, media_root: str | None) -> dict[str, str]:
    """ref -> resolved path for every media item of ``kind``, in order of first use."""
    with_media = samples.filter(pc.greater(pc.list_value_length(samples.column("media")), 0))
    refs: dict[str, str] = {}
    for row in with_media.select(["source_file", "media"]).to_pylist():
        base = Path(media_root) if media_root else Path(row["source_file"]).parent
        for m in row["media"]:
            if m["kind"] != kind:
                continue
            path = str(Path(m["ref"]) if Path(m["ref"]).is_absolute() else base / m["ref"])
            if refs.setdefault(m["ref"], path) != path:
                raise PackerError(f"{kind} ref {m['ref']!r} names two files ({refs[m['ref']]} and {path}); "
                                  f"features are keyed by ref: use --media-root or absolute paths")
    return refs


def run_pass(out: Path, folder: str, refs: dict[str, str], compute: Callable[[list[str]], list[np.ndarray]],
             batch_size: int, shard_bytes: int, progress_bar) -> list[ShardEntry]:
    shards: list[ShardEntry] = []
    buffer: list[tuple[str, np.ndarray]] = []
    size = 0

    def flush():
        nonlocal buffer, size
        if not buffer:
            return
        values = [a.reshape(-1) for _, a in buffer]
        offsets = pa.array(np.concatenate([[0], np.cumsum([len(v) for v in values])]).astype(np.int32))
        table = pa.table({
            "ref": pa.array([r for r, _ in buffer], pa.string()),
            "shape": pa.array([list(a.shape) for _, a in buffer], pa.list_(pa.int32())),
            "values": pa.ListArray.from_arrays(offsets, pa.array(np.concatenate(values).astype(np.float16))),
        }, schema=FEATURE_SCHEMA)
        shards.append(write_shard(out / folder / f"part-{len(shards):05d}.arrow", table, out))
        buffer, size = [], 0

    items = list(refs.items())
    for start in range(0, len(items), batch_size):
        batch = items[start : start + batch_size]
        for (ref, _), array in zip(batch, compute([p for _, p in batch]), strict=True):
            buffer.append((ref, array))
            size += array.nbytes
            if size >= shard_bytes:
                flush()
        progress_bar.update(len(batch))
    flush()
    return shards


def image_embeddings(out: Path, samples: pa.Table, embedder, config, bar) -> dict[str, Any]:
    refs = media_paths(samples, "image", config.media_root)
    files = run_pass(out, "embeddings", refs, embedder.embed, config.embed_batch_size, config.shard_bytes, bar)
    return {**embedder.describe(), "images": len(refs), "files": [dataclasses.asdict(e) for e in files]}


def audio_features(out: Path, samples: pa.Table, extractor, config, bar) -> dict[str, Any]:
    refs = media_paths(samples, "audio", config.media_root)
    files = run_pass(out, "audio_features", refs, lambda paths: [extractor.features(p) for p in paths], 8,
                     config.shard_bytes, bar)
    return {**extractor.describe(), "clips": len(refs), "files": [dataclasses.asdict(e) for e in files]}


class _NoBar:
    def update(self, n: int) -> None:
        pass


def embeddings_task(out: str, sample_files: list[str], config) -> dict[str, Any]:
    """The embedding pass as one self-contained task (what the Ray engine ships to a GPU worker)."""
    from packer.io.arrow import read_shards
    from packer.media.embed import EmbedSpec, ImageEmbedder
    from packer.schema import SAMPLE_SCHEMA

    embedder = ImageEmbedder(EmbedSpec.parse(config.image_embeddings, output=config.embed_output,
                                             device=config.embed_device, batch_size=config.embed_batch_size))
    samples = read_shards([Path(out) / f for f in sample_files], SAMPLE_SCHEMA)
    return image_embeddings(Path(out), samples, embedder, config, _NoBar())
