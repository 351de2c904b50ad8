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
# A table task's row groups hold at most this many (stored, uncompressed) bytes, one group at least: a worker holds a
# task's records and embedded media until it has encoded and written them (EncodeTask.lines), so this bounds its memory
MAX_TABLE_TASK_BYTES = 64 * 2**20


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

    return _metadata(path, fmt, tables.groups)


def _metadata(path, fmt: str, read):
    """``read(path, fmt)``, a file pyarrow cannot read as ``fmt`` a ConfigError naming it and the fix."""
    try:
        return read(path, fmt)
    except ConfigError:
        raise
    except Exception as e:  # noqa: BLE001 -- pyarrow's ArrowInvalid / OSError for a damaged or foreign file
        raise ConfigError(f"input {path}: cannot read it as {fmt} ({type(e).__name__}: {str(e)[:300]}); check that "
                          f"the file is whole (a copy cut short loses parquet's footer) or set format= to what it "
                          f"is") from None


def table_columns(path, fmt: str, columns: tuple[tuple[str, str], ...]) -> tuple[tuple[str, str], ...]:
    """The column mapping a table file is read with, from its schema alone (the driver's check, before any record):
    the source's own, every column it names present, plus the media columns its ``datasets`` features name
    (:func:`packer.ingest.layouts.feature_mapping`). A mapped column the file lacks, or a column read as media whose
    feature packer cannot decode, is a ConfigError for the whole input: every row would fail alike."""
    from packer.ingest import layouts, tables

    schema = _metadata(path, fmt, tables.schema)
    names = list(schema.names)
    missing = [f"{field}={column}" for field, column in columns if column not in names]
    if missing:
        raise ConfigError(f"input {path}: the column mapping {', '.join(missing)} names column(s) the file does not "
                          f"have (its columns: {', '.join(names)}); fix columns= to name the file's own columns")
    features = tables.features(schema)
    why = layouts.check_media_features(features, names, columns)
    if why:
        raise ConfigError(f"input {path}: {why}; map another column with columns= (images=COLUMN) or leave this "
                          f"file out")
    return layouts.feature_mapping(features, names, columns)


def where(fmt: str) -> str:
    """What a record's number counts in a file of ``fmt``: JSONL ``line``, table ``row``, tar ``member``
    (:attr:`packer.records.RawLine.where`)."""
    return {"parquet": "row", "arrow": "row", "webdataset": "member"}.get(fmt, "line")


def readings(sources: list, inputs: list[tuple]) -> list[tuple[str, tuple[tuple[str, str], ...]]]:
    """How each input file ``(file, source number)`` is read: its format (its source's ``format=``, else from its
    name) and its source's column mapping."""
    return [(detect(f, sources[k].format), sources[k].columns) for f, k in inputs]


def is_local_dir(path) -> bool:
    return "://" not in str(path) and Path(path).is_dir()
