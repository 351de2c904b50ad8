"""A stage-1 task's records from a table (parquet / Arrow) or a WebDataset tar, as :class:`~packer.records.RawLine`
items: each row / sample decoded into a record (:func:`packer.ingest.layouts.to_record`), or the error that makes
it one bad record, named by its row number or tar key."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

from packer.errors import BadRecord
from packer.ingest import layouts
from packer.records import RawLine

PREVIEW_BYTES = 8000  # of a row's JSON kept for the quarantine


def preview(row: Any) -> bytes:
    """A row as JSON for the quarantine, embedded bytes shown as their size."""

    def short(value: Any) -> Any:
        if isinstance(value, (bytes, bytearray, memoryview)):
            return f"<{len(value):,} bytes>"
        return repr(value)

    try:
        return json.dumps(row, ensure_ascii=False, default=short)[:PREVIEW_BYTES].encode("utf-8", "backslashreplace")
    except (ValueError, TypeError, RecursionError):
        return b""


def task_records(task) -> Iterator[RawLine]:
    if task.format == "webdataset":
        from packer.ingest import webdataset

        for number, key, sample, text in webdataset.read_samples(task.file):
            yield _record(sample, number, task.columns, "member", key, text)
        return
    from packer.ingest import tables

    number = task.first_line
    for _, rows in tables.read_rows(task.file, task.format, task.start, task.end):
        for row in rows:
            yield _record(row, number, task.columns, "row", "")
            number += 1


def _record(row: Any, number: int, columns: tuple, where: str, member: str, text: bytes = b"") -> RawLine:
    if isinstance(row, BadRecord):  # a tar sample's json as it is, for the quarantine's preview
        return RawLine(number, text[:PREVIEW_BYTES], where=where, member=member, error=row)
    data = preview(row)
    try:
        return RawLine(number, data, where=where, member=member, record=layouts.to_record(row, columns))
    except BadRecord as e:
        return RawLine(number, data, where=where, member=member, error=e)
