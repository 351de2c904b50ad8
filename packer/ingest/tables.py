"""Reading parquet and Arrow IPC files (a ``datasets.save_to_disk`` folder's files, the hub's parquet) a run of row
groups / record batches at a time.

Only pyarrow is needed: a ``datasets`` feature (``Image()``, ``Audio()``, ``Video()``, lists of them) is read from the
schema's ``huggingface`` metadata (:func:`features`), its cells as the ``{"bytes", "path"}`` structs the hub stores.
A worker decodes one row group / batch at a time (:func:`read_rows`); the records it makes, and their embedded media
(blobs), are held until its task is encoded and written: a task is at most
:data:`packer.ingest.units.MAX_TABLE_TASK_BYTES` of stored bytes, or one row group where a group alone is more.

The driver reads a parquet footer only. An Arrow IPC *stream* (what ``save_to_disk`` writes) has no footer: its
batches are walked for their sizes, which touches only their headers in a local (memory-mapped) file, but reads the
stream through for a remote one.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pyarrow as pa


def _open(path):
    from packer.io import fs

    if fs.is_url(path):
        return fs.open_binary(path)
    return pa.memory_map(str(path), "r")


def _parquet(path):
    import pyarrow.parquet as pq

    return pq.ParquetFile(_open(path))


def _ipc(path):
    """An Arrow IPC reader over ``path``: ``(reader, is_file_format)``."""
    source = _open(path)
    try:
        return pa.ipc.open_file(source), True
    except pa.ArrowInvalid:
        source.seek(0)
        return pa.ipc.open_stream(source), False


def groups(path, fmt: str) -> list[tuple[int, int]]:
    """(rows, stored bytes) of each row group (parquet) or record batch (arrow), from metadata / batch headers."""
    if fmt == "parquet":
        meta = _parquet(path).metadata
        return [(meta.row_group(k).num_rows, meta.row_group(k).total_byte_size) for k in range(meta.num_row_groups)]
    reader, is_file = _ipc(path)
    if is_file:
        out = []
        for k in range(reader.num_record_batches):
            b = reader.get_batch(k)
            out.append((b.num_rows, b.nbytes))
        return out
    return [(b.num_rows, b.nbytes) for b in reader]


def schema(path, fmt: str) -> pa.Schema:
    if fmt == "parquet":
        return _parquet(path).schema_arrow
    return _ipc(path)[0].schema


def features(arrow_schema: pa.Schema) -> dict[str, Any]:
    """The ``datasets`` features the schema's ``huggingface`` metadata records (``{}`` when it records none)."""
    meta = (arrow_schema.metadata or {}).get(b"huggingface")
    if not meta:
        return {}
    try:
        info = json.loads(meta)
    except ValueError:
        return {}
    return (info.get("info") or {}).get("features") or {}


def read_rows(path, fmt: str, start: int, end: int) -> Iterator[tuple[pa.Schema, list[dict[str, Any]]]]:
    """The rows of row groups / batches ``[start, end)``, one group at a time: ``(schema, rows as dicts)``."""
    if fmt == "parquet":
        f = _parquet(path)
        for k in range(start, end):
            table = f.read_row_group(k)
            yield table.schema, table.to_pylist()
        return
    reader, is_file = _ipc(path)
    if is_file:
        for k in range(start, end):
            batch = reader.get_batch(k)
            yield batch.schema, batch.to_pylist()
        return
    for k, batch in enumerate(reader):
        if k >= end:
            return
        if k >= start:
            yield batch.schema, batch.to_pylist()
