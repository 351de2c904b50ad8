"""An embedded build's media at train time: a span's ``ref`` ``sha256:<hex>`` read from the media shard beside its
row's shard (``media/part-K.arrow`` for ``packed/part-K.arrow``), format in docs/format.md. A stage-1 shard's samples
(:class:`packer.loader.SampleDataset`) have no media shard of their own: their blobs are found by name in the build's
media shards and its leftover shard (:class:`packer.shards.media_index.BlobIndex`, built when first needed).

:class:`MediaShards` is attached to this process's blob store (:data:`packer.io.blobs.STORE`), so the collator, the
family hooks and every decoder open a blob name as they open a file. When a row is read, its blobs are located in
its own media shard and taken as one contiguous slice of the memory-mapped file (a row's media are adjacent there,
:mod:`packer.stages.media_shards`); the slices are zero-copy views, so holding the last few thousand costs no memory.
"""

from __future__ import annotations

from collections import OrderedDict
from pathlib import Path

import pyarrow as pa

from packer.io import blobs
from packer.shards.io import read_shard
from packer.shards.media_index import BlobIndex, media_shard_of, span_refs
from packer.shards.schema import ShardEntry

HELD = 65536  # blob views kept for the collator (a batch's media; views of the mapped file, no copies)


class MediaShardError(FileNotFoundError):
    """A span names a blob its row's media shard does not hold (a damaged or edited build)."""


class MediaShards:
    """The media shards paired with a dataset's shards (``entries[k]``: shard ``k``'s, or None), and every media shard of
    the build (``listed``) for a blob looked up by name."""

    def __init__(self, out: Path, entries: list[ShardEntry | None], listed: list[ShardEntry] | None = None):
        self.out, self.entries = out, entries
        self.index = BlobIndex(out, listed if listed is not None else [e for e in entries if e is not None])
        self._open: dict[int, tuple[pa.Table, dict[str, int]]] = {}
        self._held: OrderedDict[str, pa.Buffer] = OrderedDict()

    @classmethod
    def of(cls, out: Path, shards: list[ShardEntry], listed: list[ShardEntry]) -> MediaShards | None:
        """The media shards of ``shards`` among ``listed`` (a manifest's), paired by name; None when the build has
        none."""
        by_file = {e.file: e for e in listed}
        entries = [by_file.get(media_shard_of(e.file)) for e in shards]
        return cls(out, entries, listed) if listed else None

    def __getstate__(self) -> dict:
        return {"out": self.out, "entries": self.entries, "index": self.index, "_open": {}, "_held": OrderedDict()}

    def _shard(self, k: int) -> tuple[pa.Table, dict[str, int]]:
        if k not in self._open:
            entry = self.entries[k]
            if entry is None:
                raise MediaShardError(f"shard {k} of {self.out} has no media shard")
            table = read_shard(self.out / entry.file, entry.sha256, rows=False)
            self._open[k] = (table, {n: i for i, n in enumerate(table.column("name").to_pylist())})
        return self._open[k]

    def hold(self, k: int, spans: list[dict]) -> None:
        """Locate the blobs ``spans`` (a row of shard ``k``) name and hold views of their bytes: one contiguous slice
        of the media shard from the first to the last."""
        names = list(dict.fromkeys(r for m in spans for r in span_refs(m["ref"]) if blobs.is_blob(r)))
        if not names:
            return
        blobs.STORE.attach(self)
        if self.entries[k] is None:  # a sample shard's: each blob by name
            for name in names:
                held = self.index.buffer(name)
                if held is None:
                    raise MediaShardError(f"no media shard of {self.out} holds {name}, which a row of shard {k} names: "
                                          f"the build is damaged (packer verify --media names every such blob); rebuild")
                self._hold(name, held)
            return
        table, rows = self._shard(k)
        missing = [n for n in names if n not in rows]
        if missing:
            raise MediaShardError(f"{self.out / self.entries[k].file} does not hold {missing[0]}, which a row of shard "
                                  f"{k} names: the build is damaged (packer verify --media names every such span); "
                                  f"rebuild, or copy the build's media/ again")
        where = [rows[n] for n in names]
        lo = min(where)
        run = table.column("data").slice(lo, max(where) - lo + 1)
        for name, i in zip(names, where, strict=True):
            self._hold(name, run[i - lo].as_buffer())

    def _hold(self, name: str, data: pa.Buffer) -> None:
        self._held[name] = data
        self._held.move_to_end(name)
        while len(self._held) > HELD:
            self._held.popitem(last=False)

    def find(self, name: str) -> pa.Buffer | None:
        """``name``'s bytes: held for a row read lately, else from an opened media shard, else from whichever media
        shard of the build holds it, else None."""
        held = self._held.get(name)
        if held is not None:
            return held
        for table, rows in self._open.values():
            if name in rows:
                return table.column("data")[rows[name]].as_buffer()
        return self.index.buffer(name)
