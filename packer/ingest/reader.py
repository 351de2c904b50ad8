"""Streaming JSONL reader that knows the file and line of every record.

Lines are read as bytes and decoded one by one, so a non-UTF-8 line is one bad record,
not a crashed build. A UTF-8 byte-order mark on the first line, CRLF endings and blank
lines are accepted; blank lines are skipped (and counted) rather than reported. A line
longer than ``max_line_bytes`` is never held whole: its first bytes are kept (for the
quarantine) and the rest is skipped in chunks, so one huge line cannot exhaust memory.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

BOM = b"\xef\xbb\xbf"


MAX_LINE_BYTES = 64 * 2**20
SKIP_CHUNK = 1 << 20


@dataclass(frozen=True)
class RawLine:
    line: int  # 1-based line number in the file
    data: bytes  # the line without its line ending (only its start if too_long)
    too_long: int = 0  # the line's length in bytes when it exceeded the limit
    offset: int = 0  # byte offset of the line's start in the file
    end: int = 0  # byte offset just past the line (its newline included)


def read_lines(path: str | Path, counts: dict[str, int] | None = None, max_line_bytes: int = MAX_LINE_BYTES, *,
               start: int = 0, end: int | None = None, first_line: int = 1) -> Iterator[RawLine]:
    """Yield the non-blank lines of ``path``; ``counts['blank_lines']`` counts the rest.

    ``start`` / ``end`` / ``first_line`` read one byte range of the file (a stage-1 task),
    numbering lines as in the whole file.
    """
    from packer.io.fs import open_binary

    with open_binary(path) as f:
        if start:
            f.seek(start)
        number = first_line - 1
        position = start  # counted, not asked: a buffered file's tell() is a system call (3 a line, 20% of a scan)
        while end is None or position < end:
            offset = position
            data = f.readline(max_line_bytes + 1)
            if not data:
                return
            position += len(data)
            number += 1
            if offset == 0 and data.startswith(BOM):
                data = data[len(BOM) :]
            if len(data) > max_line_bytes and not data.endswith(b"\n"):
                size = len(data)
                while not data.endswith(b"\n"):  # skip the rest of the line without keeping it
                    data = f.readline(SKIP_CHUNK)
                    if not data:
                        break
                    size += len(data)
                    position += len(data)
                yield RawLine(number, b"", too_long=size, offset=offset, end=position)
                continue
            data = data.rstrip(b"\r\n")
            if not data.strip():
                if counts is not None:
                    counts["blank_lines"] = counts.get("blank_lines", 0) + 1
                continue
            yield RawLine(number, data, offset=offset, end=position)
