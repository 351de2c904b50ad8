"""Arrow IPC stream shards: written atomically, read memory-mapped, version-checked.

The stream format is what ``datasets.Dataset.from_file`` and ``load_dataset("arrow")``
read, and pyarrow and polars read it too, so shards need no packer to be opened.
"""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa

from packer.errors import PackerError
from packer.io.files import atomic_open, sha256_file
from packer.shards.schema import ShardEntry, check_schema

BATCH_ROWS = 1024  # record batch size inside a shard: small enough for streaming readers


def write_shard(path: str | Path, table: pa.Table, root: str | Path) -> ShardEntry:
    """Write ``table`` to ``path`` atomically; the entry names it relative to ``root``."""
    return write_shard_batches(path, table.schema, [table], root)


def write_shard_batches(path: str | Path, schema: pa.Schema, tables, root: str | Path) -> ShardEntry:
    """Like :func:`write_shard`, from an iterable of tables written one after another, so
    a shard of any size is written holding one batch of rows in memory at a time."""
    path = Path(path)
    rows = 0
    with atomic_open(path, "wb") as f:
        with pa.ipc.new_stream(f, schema) as writer:
            for table in tables:
                writer.write_table(table, max_chunksize=BATCH_ROWS)
                rows += table.num_rows
    return ShardEntry(file=path.relative_to(root).as_posix(), rows=rows, bytes=path.stat().st_size, sha256=sha256_file(path))


def read_shard(path: str | Path) -> pa.Table:
    """Memory-map a shard (zero-copy) after checking its schema version. A missing,
    truncated or damaged file raises :class:`~packer.errors.PackerError` naming it."""
    try:
        source = pa.memory_map(str(path), "r")
        reader = pa.ipc.open_stream(source)
        check_schema(reader.schema, str(path))
        return reader.read_all()
    except FileNotFoundError:
        raise PackerError(f"{path} is missing: the build is incomplete or damaged (packer verify lists every problem)") from None
    except (pa.ArrowInvalid, pa.ArrowIOError, OSError) as e:
        raise PackerError(f"{path} cannot be read as a packer shard ({e}): the file is damaged or truncated; "
                          f"packer verify lists every problem, a rebuild replaces it") from None


def read_shards(paths: list[Path], schema: pa.Schema) -> pa.Table:
    """All shards of one kind as one (chunked, memory-mapped) table."""
    tables = [read_shard(p) for p in paths]
    return pa.concat_tables(tables) if tables else schema.empty_table()
