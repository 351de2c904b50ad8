"""Arrow IPC stream shards: written atomically, read memory-mapped, version-checked.

The stream format is what ``datasets.Dataset.from_file`` and ``load_dataset("arrow")``
read, and pyarrow and polars read it too, so shards need no packer to be opened. A shard
of a remote build (a :class:`~packer.io.remote.RemotePath`) is written straight to its
URL and read through a local copy (:mod:`packer.io.cache`).
"""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa

from packer.errors import DamagedShardError, PackerError
from packer.io.files import HashingWriter, atomic_open
from packer.io.fs import is_remote, location
from packer.shards.integrity import check_table
from packer.shards.schema import ShardEntry, check_schema

BATCH_ROWS = 1024  # record batch size inside a shard: small enough for streaming readers


def write_shard(path: str | Path, table: pa.Table, root: str | Path) -> ShardEntry:
    """Write ``table`` to ``path`` atomically; the entry names it relative to ``root``."""
    return write_shard_batches(path, table.schema, [table], root)


def write_shard_batches(path: str | Path, schema: pa.Schema, tables, root: str | Path) -> ShardEntry:
    """Like :func:`write_shard`, from an iterable of tables written one after another, so
    a shard of any size is written holding one batch of rows in memory at a time."""
    path, root = location(path), location(root)
    rows = 0
    with atomic_open(path, "wb") as f:
        hashed = HashingWriter(f)
        with pa.ipc.new_stream(hashed, schema) as writer:
            for table in tables:
                writer.write_table(table, max_chunksize=BATCH_ROWS)
                rows += table.num_rows
    return ShardEntry(file=path.relative_to(root).as_posix(), rows=rows, bytes=hashed.size, sha256=hashed.sha256())


def read_shard(path: str | Path, sha256: str | None = None, *, rows: bool = True,
               vocab_size: int | None = None) -> pa.Table:
    """Memory-map a shard (zero-copy) after checking its schema version and its content
    (:func:`~packer.shards.integrity.check_table`: Arrow's full validation, and with ``rows`` the
    values of every row, token ids below ``vocab_size`` where given). A missing or truncated file
    raises :class:`~packer.errors.PackerError` naming it, a damaged one
    :class:`~packer.errors.DamagedShardError`: never a crash on a later row access.
    A remote shard is mapped from its local copy (checked against ``sha256`` when given)."""
    try:
        local = path
        if is_remote(path):
            from packer.io.cache import local_copy

            local = local_copy(path, sha256)
        source = pa.memory_map(str(local), "r")
        reader = pa.ipc.open_stream(source)
        check_schema(reader.schema, str(path))
        table = reader.read_all()
        check_table(table, str(path), vocab_size, rows=rows)
        return table
    except FileNotFoundError:
        raise PackerError(f"{path} is missing: the build is incomplete or damaged (packer verify lists every problem)") from None
    except (pa.ArrowException, OSError, ValueError, MemoryError) as e:  # ValueError: an undecodable schema, too
        what = " ".join(str(e).split())  # one line, whatever Arrow's message held
        raise DamagedShardError(f"{path} cannot be read as a packer shard ({what}): the file is damaged or truncated; "
                                f"packer verify lists every problem, a rebuild replaces it",
                                f"cannot be read as a packer shard ({what})") from None


def read_shards(paths: list[Path], schema: pa.Schema, sha256: list[str] | None = None) -> pa.Table:
    """All shards of one kind as one (chunked, memory-mapped) table."""
    tables = [read_shard(p, h) for p, h in zip(paths, sha256 or [None] * len(paths), strict=True)]
    return pa.concat_tables(tables) if tables else schema.empty_table()
