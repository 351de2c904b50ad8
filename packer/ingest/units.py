"""What an input file is and the pieces stage 1 cuts it into, without reading its records.

An input file is one of :data:`FORMATS`, detected from its name (:func:`detect`) or set per source (``format=``):

- ``jsonl``: lines; a task is a byte range (:func:`packer.stages.encode.make_tasks` scans it);
- ``parquet``: a task is a run of row groups, cut from the footer alone (:func:`table_units`);
- ``arrow``: an Arrow IPC file or stream (``datasets.save_to_disk`` writes streams); a task is a run of record
  batches, located from the batches' headers;
- ``webdataset``: a tar shard; a task is the whole shard (a tar has no index to cut it by).

So the driver reads a parquet footer or an Arrow file's batch headers, never the data, and a worker reads its own
row groups / batches / shard (:mod:`packer.ingest.tables`, :mod:`packer.ingest.webdataset`).
"""

from __future__ import annotations

import posixpath
from dataclasses import dataclass
from pathlib import Path

from packer.errors import ConfigError

FORMATS = ("jsonl", "parquet", "arrow", "webdataset")
SUFFIXES = {".jsonl": "jsonl", ".json": "jsonl", ".ndjson": "jsonl", ".parquet": "parquet", ".arrow": "arrow",
            ".feather": "arrow", ".ipc": "arrow", ".tar": "webdataset", ".tgz": "webdataset"}
MAX_TABLE_TASK_BYTES = 64 * 2**20  # a table task's row groups hold at most this many (stored) bytes, one at least


def detect(path, declared: str = "auto") -> str:
    """The format of the input file ``path``: ``declared`` unless it is ``auto``, else from its suffix (``.gz`` and
    friends aside: a compressed JSONL is JSONL), JSONL by default."""
    if declared != "auto":
        return declared
    name = posixpath.basename(str(path)).lower()
    for compressed in (".gz", ".zst", ".bz2", ".xz"):
        name = name.removesuffix(compressed)
    return SUFFIXES.get(posixpath.splitext(name)[1], "jsonl")


@dataclass(frozen=True)
class Unit:
    """A run of one table file's row groups (parquet) or record batches (Arrow): ``[start, end)``, its first row's
    number, its rows and stored bytes."""

    start: int
    end: int
    first_row: int
    rows: int
    nbytes: int


def table_units(path, fmt: str, max_rows: int, max_bytes: int) -> list[Unit]:
    """``path`` cut into runs of whole row groups / batches of at most ``max_rows`` rows and ``max_bytes`` stored
    bytes (one group at least), from the file's metadata only. A damaged footer is a ConfigError naming the file."""
    groups = _groups(path, fmt)
    units: list[Unit] = []
    start = first = rows = nbytes = 0
    row = 0
    for k, (n, size) in enumerate(groups):
        if k > start and (rows + n > max_rows or nbytes + size > max_bytes):
            units.append(Unit(start, k, first, rows, nbytes))
            start, first, rows, nbytes = k, row, 0, 0
        rows, nbytes, row = rows + n, nbytes + size, row + n
    if start < len(groups):
        units.append(Unit(start, len(groups), first, rows, nbytes))
    return units


def _groups(path, fmt: str) -> list[tuple[int, int]]:
    """(rows, stored bytes) of each row group / record batch."""
    from packer.ingest import tables

    try:
        return tables.groups(path, fmt)
    except ConfigError:
        raise
    except Exception as e:  # noqa: BLE001 -- pyarrow's ArrowInvalid / OSError for a damaged or foreign file
        raise ConfigError(f"input {path}: cannot read it as {fmt} ({type(e).__name__}: {str(e)[:300]}); check that "
                          f"the file is whole (a copy cut short loses parquet's footer) or set format= to what it "
                          f"is") from None


def is_local_dir(path) -> bool:
    return "://" not in str(path) and Path(path).is_dir()
