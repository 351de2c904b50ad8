"""Map-style datasets over a build, memory-mapped: ``PackedDataset`` (packed rows) and
``SampleDataset`` (the unpacked samples of stage 1, for unpacked training).

Only the build's path crosses into DataLoader workers (``__getstate__``); each worker
maps the shards itself on first access, so pickling is cheap and no memory is copied.
"""

from __future__ import annotations

import bisect
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from packer.io.arrow import read_shard
from packer.media.load import resolve_ref
from packer.stages.manifest import read_manifest

ARRAY_COLUMNS = ("input_ids", "labels", "cu_seqlens")


class _ShardedTable:
    kind = ""
    columns: tuple[str, ...] = ()

    def __init__(self, out: str | Path, *, format: str = "numpy", media_root: str | Path | None = None):
        if format not in ("numpy", "torch"):
            raise ValueError(f"format must be numpy or torch, got {format!r}")
        self.out = Path(out)
        self.format = format
        self.manifest = read_manifest(self.out)  # raises SchemaVersionError on an unknown version
        # Stored refs are relative to the build's media root; another root when the media moved.
        self.media_root = str(media_root) if media_root is not None else self.manifest.get("media_root", "")
        self.entries = self.manifest["files"][self.kind]
        self.starts = np.concatenate([[0], np.cumsum([e["rows"] for e in self.entries])]).astype(np.int64)
        self._tables: dict[int, pa.Table] = {}
        if self.entries:
            self._table(0)  # check the first shard's schema version now, not in a worker

    @property
    def max_length(self) -> int:
        return int(self.manifest["config"]["max_length"])

    def __len__(self) -> int:
        return int(self.starts[-1])

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_tables"] = {}
        return state

    def _table(self, k: int) -> pa.Table:
        if k not in self._tables:
            self._tables[k] = read_shard(self.out / self.entries[k]["file"])
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
            value = row[name]
            if name in ARRAY_COLUMNS:
                value = np.asarray(value, dtype=np.int32)
                if self.format == "torch":
                    import torch

                    value = torch.from_numpy(value.astype(np.int64))
            out[name] = value
        if "media" in out:
            for m in out["media"]:
                m["path"] = resolve_ref(m["ref"], self.media_root)
        return out

    @property
    def placeholder_ids(self) -> dict[str, int]:
        """Token string -> id of every placeholder / begin / end token the build added."""
        return dict(self.manifest["tokenizer"]["placeholders"])

    def tokenizer(self):
        """The tokenizer as the build used it (``OUT/tokenizer``), placeholder tokens included."""
        from transformers import AutoTokenizer

        return AutoTokenizer.from_pretrained(str(self.out / "tokenizer"))


class PackedDataset(_ShardedTable):
    """Packed rows: ``input_ids``, ``labels``, ``cu_seqlens`` (arrays), ``segment_ids``,
    ``segment_modality``, ``media`` (lists) and ``n_tokens``. Each media span gets a
    ``path``: its ``ref`` joined onto the build's media root (``manifest["media_root"]``),
    or onto ``media_root=`` when the media moved; a moved build folder needs nothing."""

    kind = "packed"
    columns = ("input_ids", "labels", "cu_seqlens", "segment_ids", "segment_modality", "media", "n_tokens")

    def row_stats(self) -> dict[str, np.ndarray]:
        """Per row: tokens, sum of squared segment lengths, media items and media tokens
        (the inputs of a sampler's cost model), computed from the shards' columns."""
        tokens = self.column("n_tokens").to_numpy().astype(np.float64)
        attention, items, media_tokens = [], [], []
        for k in range(len(self.entries)):
            t = self._table(k)
            for cu in t.column("cu_seqlens").to_pylist():
                attention.append(float((np.diff(np.asarray(cu, dtype=np.float64)) ** 2).sum()))
            media = t.column("media")
            items.append(pc.list_value_length(media).to_numpy(zero_copy_only=False))
            lengths = pc.list_flatten(media)
            parents = pc.list_parent_indices(media).to_numpy()
            sums = np.zeros(t.num_rows)
            if len(lengths):
                np.add.at(sums, parents, pc.struct_field(lengths, "length").to_numpy(zero_copy_only=False))
            media_tokens.append(sums)
        return {
            "tokens": tokens,
            "attention": np.asarray(attention, dtype=np.float64),
            "media_items": np.concatenate(items).astype(np.float64) if items else np.zeros(0),
            "media_tokens": np.concatenate(media_tokens) if media_tokens else np.zeros(0),
        }


class SampleDataset(_ShardedTable):
    """Unpacked samples (``samples/``): one sample per item, as a one-segment row, so
    :class:`~packer.loader.PackedCollator` batches them with padding masks too."""

    kind = "samples"
    columns = ("input_ids", "labels", "key", "modality", "media", "length")

    def __getitem__(self, index: int) -> dict[str, Any]:
        row = super().__getitem__(index)
        n = int(row["length"])
        row["cu_seqlens"] = np.asarray([0, n], dtype=np.int32)
        row["n_tokens"] = n
        row["segment_ids"], row["segment_modality"] = [row["key"]], [row["modality"]]
        if n > self.max_length:  # stored whole; train on the first max_length tokens, as packing would
            row["input_ids"], row["labels"] = row["input_ids"][: self.max_length], row["labels"][: self.max_length]
            row["cu_seqlens"][-1] = row["n_tokens"] = self.max_length
            row["media"] = [m for m in row["media"] if m["start"] + m["length"] <= self.max_length]
        return row

    @property
    def lengths(self) -> np.ndarray:
        return np.minimum(self.column("length").to_numpy(), self.max_length)

    @property
    def modalities(self) -> np.ndarray:
        return self.column("modality").cast(pa.string()).to_numpy(zero_copy_only=False)
