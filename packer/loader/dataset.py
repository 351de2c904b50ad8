"""Map-style datasets over a build, memory-mapped: ``PackedDataset`` (packed rows) and
``SampleDataset`` (the unpacked samples of stage 1, for unpacked training).

Only the build's path crosses into DataLoader workers (``__getstate__``); each worker
maps the shards itself on first access, so pickling is cheap and no memory is copied.
"""

from __future__ import annotations

import bisect
import functools
import math
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from packer.io import blobs
from packer.io.fs import is_remote, location
from packer.io.fs import stat as fs_stat
from packer.loader.blobs import MediaShards
from packer.media.refs import resolve_ref, stored_frames
from packer.shards.io import read_shard
from packer.shards.manifest import Manifest
from packer.shards.media_index import MediaIndex
from packer.shards.schema import IGNORE
from packer.shards.stats import ROW_FIELDS, shard_stats

ARRAY_COLUMNS = ("input_ids", "labels", "cu_seqlens")


class MediaChangedError(ValueError):
    """A media file differs from the one the build counted (size, or modification time)."""


class _ShardedTable:
    kind = ""
    columns: tuple[str, ...] = ()

    def __init__(self, out: str | Path, *, format: str = "numpy", media_root: str | Path | None = None,
                 check_media: bool = True):
        if format not in ("numpy", "torch"):
            raise ValueError(f"format must be numpy or torch, got {format!r}")
        self.out = location(out)  # a local folder, or a URL: shards are then read through a local copy
        self.format = format
        self.manifest = Manifest.read(self.out)  # raises SchemaVersionError on an unknown version
        # Stored refs are relative to the build's media root; another root when the media moved.
        self.media_root = str(media_root) if media_root is not None else self.manifest.media_root
        self.moved = self.media_root != self.manifest.media_root
        entry = self.manifest.files.media
        self.media_index = MediaIndex(self.out / entry.file) if entry is not None and check_media else None
        self.entries = getattr(self.manifest.files, self.kind)
        files = self.manifest.files  # an embedded build's media shards, paired with the shards of rows (None: none)
        self.blob_media = MediaShards.of(self.out, self.entries, files.blob_store)
        self.starts = np.concatenate([[0], np.cumsum([e.rows for e in self.entries])]).astype(np.int64)
        self._tables: dict[int, pa.Table] = {}
        if self.entries:
            self._table(0)  # check the first shard's schema version now, not in a worker

    @property
    def max_length(self) -> int:
        return self.manifest.max_length

    def __len__(self) -> int:
        return int(self.starts[-1])

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_tables"] = {}
        return state

    def _table(self, k: int) -> pa.Table:
        if k not in self._tables:
            self._tables[k] = read_shard(self.out / self.entries[k].file, self.entries[k].sha256,  # checked: never a crash
                                         vocab_size=self.manifest.tokenizer.get("vocab_size"))
        return self._tables[k]

    def column(self, name: str) -> pa.ChunkedArray:
        return pa.chunked_array([c for k in range(len(self.entries)) for c in self._table(k).column(name).chunks])

    def __getitem__(self, index: int) -> dict[str, Any]:
        if index < 0:
            index += len(self)
        if not 0 <= index < len(self):
            raise IndexError(f"row {index} out of range for {len(self)} rows")
        k = bisect.bisect_right(self.starts, index) - 1
        row = self._table(k).slice(int(index - self.starts[k]), 1).to_pylist()[0]
        out = {}
        for name in self.columns:
            if name not in row:  # a column newer than the build (supervised counts): derived by the subclass
                continue
            value = row[name]
            if name in ARRAY_COLUMNS:
                value = np.asarray(value, dtype=np.int32)
                if self.format == "torch":
                    import torch

                    value = torch.from_numpy(value.astype(np.int64))
            out[name] = value
        if "media" in out:
            cache: dict[str, np.ndarray] = {}
            for m in out["media"]:
                self._resolve(m, row["input_ids"], cache)
            if self.blob_media is not None:  # embedded media: the row's bytes located in its media shard
                self.blob_media.hold(k, out["media"])
        return out

    def _resolve(self, m: dict[str, Any], input_ids, cache: dict[str, np.ndarray]) -> dict[str, Any]:
        """Give a media span its file (``path``; ``frames`` and ``fps`` for a video given as frame images),
        checked against the build's media index, and its ``runs`` where text lies between them."""
        if m["tokens"] != m["length"]:  # text between the item's runs: where each run is
            if "ids" not in cache:
                cache["ids"] = np.asarray(input_ids, dtype=np.int64)
            m["runs"] = _runs(cache["ids"][m["start"] : m["start"] + m["length"]] == self._run_ids[m["kind"]])
        listed = stored_frames(m["ref"])
        if listed is not None:  # a video given as frame images: {"frames": [refs], "fps": rate}
            m["frames"] = [resolve_ref(r, self.media_root) for r in listed[0]]
            m["path"], m["fps"] = m["frames"][0], listed[1]
            for ref, path in zip(listed[0], m["frames"], strict=True):
                self._check_media(ref, path)
        else:
            m["path"] = resolve_ref(m["ref"], self.media_root)
            self._check_media(m["ref"], m["path"])
        return m

    def _check_media(self, ref: str, path: str) -> None:
        """The file as the build read it (``media.arrow``): the same size, and the same modification
        time while the media root is the build's (a copy elsewhere changes the time). A missing file
        is left to the collator, whose error names the media root to give."""
        if self.media_index is None:
            return
        recorded = self.media_index.get(ref)
        if recorded is None or recorded.bytes < 0:
            return
        try:
            size, mtime = fs_stat(path)
        except OSError:
            return
        if size != recorded.bytes or (not self.moved and mtime != recorded.mtime_ns):
            what = f"{size:,} bytes, the build read {recorded.bytes:,}" if size != recorded.bytes else \
                "the same size but a later modification time than the build read"
            raise MediaChangedError(f"{path} (ref {ref!r}) changed since the build ({what}): its placeholder count "
                                    f"may no longer match. Rebuild, or check it with packer verify {self.out} --media "
                                    f"hash; PackedDataset(..., check_media=False) trains on the files as they are")

    @functools.cached_property
    def _run_ids(self) -> dict[str, int | None]:
        return {k: self.manifest.placeholder_id(k) for k in ("image", "audio", "video")}

    @property
    def family(self) -> dict[str, Any] | None:
        """The model family the build reproduces (the manifest's), with each kind's placeholder id
        (``run_ids``): ``PackedCollator(family=ds.family, ...)`` gives the family's model inputs."""
        family = self.manifest.tokenizer.get("family")
        if not family:
            return None
        return {**family, "run_ids": {k: v for k, v in self._run_ids.items() if v is not None}}

    @property
    def placeholder_ids(self) -> dict[str, int]:
        """Token string -> id of every placeholder / begin / end token the build added."""
        return self.manifest.placeholders

    def tokenizer(self):
        """The tokenizer as the build used it (``OUT/tokenizer``), placeholder tokens included."""
        from transformers import AutoTokenizer

        folder = self.out / "tokenizer"
        if is_remote(self.out):
            from packer.io.cache import local_folder

            folder = local_folder([(self.out / e.file, e.file.split("/", 1)[-1], e.sha256)
                                   for e in self.manifest.files.tokenizer])
        return AutoTokenizer.from_pretrained(str(folder), trust_remote_code=False)  # OUT/tokenizer: saved by packer


def _runs(is_placeholder: np.ndarray) -> list[list[int]]:
    """[offset, length] of each run of True in ``is_placeholder`` (a span's placeholders)."""
    edges = np.flatnonzero(np.diff(np.concatenate([[0], is_placeholder.astype(np.int8), [0]])))
    return [[int(a), int(b - a)] for a, b in zip(edges[::2], edges[1::2], strict=True)]


class PackedDataset(_ShardedTable):
    """Packed rows: ``input_ids``, ``labels``, ``cu_seqlens`` (arrays), ``segment_ids``,
    ``segment_modality``, ``media``, ``segment_trained`` (lists), ``n_tokens``, ``n_trained`` and
    ``index`` (the row's number). Each media span gets a
    ``path``: its ``ref`` joined onto the build's media root (``Manifest.media_root``),
    or onto ``media_root=`` when the media moved; a moved build folder needs nothing.
    Each media file is checked against the build's media index when a row is read (one
    ``stat``): a file replaced since the build -- same size included, while the media root
    is the build's -- raises :class:`MediaChangedError` instead of training silently
    (``check_media=False`` turns the check off)."""

    kind = "packed"
    columns = ("input_ids", "labels", "cu_seqlens", "segment_ids", "segment_modality", "segment_parent", "segment_group",
               "segment_role", "segment_weight", "media", "n_tokens", "segment_trained", "n_trained")

    def __getitem__(self, index: int) -> dict[str, Any]:
        row = super().__getitem__(index)
        row["index"] = index if index >= 0 else index + len(self)  # which row: the batch lists them (``rows``)
        if "segment_trained" not in row:  # a build from before the stored counts: count them here
            counts = supervised_counts(row["labels"], row["cu_seqlens"])
            row["segment_trained"], row["n_trained"] = counts.tolist(), int(counts.sum())
        return row

    @property
    def row_lengths(self) -> list[int] | None:
        """The build's fixed row lengths (``--row-lengths``), for ``PackedCollator(row_lengths=...)``; None without."""
        return self.manifest.stats.get("row_lengths")

    def to_hf_dataset(self):
        """The packed rows as a ``datasets.Dataset``: the shards memory-mapped (``Dataset.from_file``,
        nothing copied), with a transform that gives each media span its ``path`` as this dataset
        does. For trainers that take only HF datasets (TRL's ``SFTTrainer``, docs/training.md);
        rows keep every column, so give the trainer :class:`PackedCollator` and
        ``remove_unused_columns=False``."""
        import datasets

        if not self.entries:
            raise ValueError(f"{self.out} holds no packed rows")
        parts = [datasets.Dataset.from_file(str(self.out / e.file)) for e in self.entries]
        table = datasets.concatenate_datasets(parts) if len(parts) > 1 else parts[0]

        def with_paths(batch: dict[str, list]) -> dict[str, list]:
            if self.blob_media is not None:
                blobs.STORE.attach(self.blob_media)  # a blob is found in whichever media shard holds it
            if "media" in batch:
                batch["media"] = [[self._resolve(dict(m), ids, {}) for m in spans]
                                  for spans, ids in zip(batch["media"], batch["input_ids"], strict=True)]
            return batch

        table.set_transform(with_paths)
        return table

    def row_stats(self) -> dict[str, np.ndarray]:
        """Per row: tokens, sum of squared segment lengths, media items and media tokens
        (the inputs of a sampler's cost model): :func:`packer.shards.stats.shard_stats`,
        the numbers the report shows."""
        stats = [shard_stats(self.out / e.file) for e in self.entries]
        return {name: np.concatenate([s.array(f"row_{name}") for s in stats]) if stats else np.zeros(0)
                for name in ROW_FIELDS}


def supervised_counts(labels, cu_seqlens) -> np.ndarray:
    """Supervised tokens (label != -100, a segment's first token never) of each segment, int64."""
    trained = np.asarray(labels) != IGNORE
    cu = np.asarray(cu_seqlens, dtype=np.int64)
    trained[cu[:-1][cu[:-1] < len(trained)]] = False
    return np.asarray([int(trained[a:b].sum()) for a, b in zip(cu[:-1], cu[1:], strict=True)], dtype=np.int64)


class SampleDataset(_ShardedTable):
    """Unpacked samples (``samples/``): one sample per item, as a one-segment row, so
    :class:`~packer.loader.PackedCollator` batches them with padding masks too. A preference
    sample is a row of its responses, each a segment (the ``pairs`` layout)."""

    kind = "samples"
    columns = ("input_ids", "labels", "key", "modality", "media", "length", "responses", "prefix")

    def __getitem__(self, index: int) -> dict[str, Any]:
        row = super().__getitem__(index)
        n = int(row["length"])
        responses = row.pop("responses")
        prefix = row.pop("prefix", 0)
        if responses:
            return _responses_row(row, responses, prefix)
        row["cu_seqlens"] = np.asarray([0, n], dtype=np.int32)
        row["n_tokens"] = n
        row["segment_ids"], row["segment_modality"] = [row["key"]], [row["modality"]]
        # no response, as a packed row's SFT segment says: a batch of them gives packed_logps no response (not "no
        # --preference build"), and a flattened batch keeps the responses of the preference samples beside them
        row["segment_role"], row["segment_weight"], row["segment_parent"], row["segment_group"] = [""], [math.nan], [-1], [0]
        cap = int(self.capacities[index if index >= 0 else index + len(self)])
        if n > cap:  # stored whole; train on the first max_length tokens (its source's own), as packing would
            row["input_ids"], row["labels"] = row["input_ids"][:cap], row["labels"][:cap]
            row["cu_seqlens"][-1] = row["n_tokens"] = cap
            row["media"] = [m for m in row["media"] if m["start"] + m["length"] <= cap]
        counts = supervised_counts(row["labels"], row["cu_seqlens"])
        row["segment_trained"], row["n_trained"] = counts.tolist(), int(counts.sum())
        return row

    @property
    def lengths(self) -> np.ndarray:
        return np.minimum(self.column("length").to_numpy(), self.capacities)

    @property
    def capacities(self) -> np.ndarray:
        """Each sample's longest row: its source's own ``max_length`` (``Manifest.file_capacities``), else the
        build's."""
        if "_capacities" not in self.__dict__:
            caps = np.asarray(self.manifest.file_capacities() or [self.max_length], np.int64)
            own = len(set(caps.tolist())) > 1 or caps[0] != self.max_length
            self._capacities = caps[self.column("source_index").to_numpy().astype(np.int64)] if own and len(self) \
                else np.full(len(self), self.max_length, np.int64)
        return self._capacities

    @property
    def modalities(self) -> np.ndarray:
        return self.column("modality").cast(pa.string()).to_numpy(zero_copy_only=False)


def _responses_row(row: dict[str, Any], responses: list[dict[str, Any]], prefix: int) -> dict[str, Any]:
    """A preference sample as a row of its responses (each the prompt + that response, a segment of its own)."""
    from packer.pack.trees import response_row

    k = len(responses)
    bounds = [r["start"] for r in responses] + [responses[-1]["start"] + responses[-1]["length"]]
    torch_format = not isinstance(row["input_ids"], np.ndarray)
    stored = {**row, "input_ids": np.asarray(row["input_ids"]), "labels": np.asarray(row["labels"]), "responses": responses,
              "prefix": prefix}
    whole = [response_row(stored, j) for j in range(k)]  # stored with the prompt once: each response whole
    for column in ("input_ids", "labels"):
        values = np.concatenate([w[column] for w in whole]).astype(np.int32)
        if torch_format:
            import torch

            values = torch.from_numpy(values.astype(np.int64))
        row[column] = values
    row["media"] = [{**m, "start": m["start"] + b} for w, b in zip(whole, bounds, strict=False) for m in w["media"]]
    row["cu_seqlens"] = np.asarray(bounds, dtype=np.int32)
    row["n_tokens"] = int(bounds[-1])
    row["segment_ids"], row["segment_modality"] = [row["key"]] * k, [row["modality"]] * k
    row["segment_role"] = [r["role"] for r in responses]
    row["segment_weight"] = [r["weight"] for r in responses]
    row["segment_parent"], row["segment_group"] = [-1] * k, [0] * k
    row["media"] = [{**m, "segment": bisect.bisect_right(bounds, m["start"]) - 1} for m in row["media"]]
    return row
