"""Streaming JSONL reader that knows the file and line of every record.

Lines are read as bytes and decoded one by one, so a non-UTF-8 line is one bad record,
not a crashed build. A UTF-8 byte-order mark on the first line, CRLF endings and blank
lines are accepted; blank lines are skipped (and counted) rather than reported.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

BOM = b"\xef\xbb\xbf"


@dataclass(frozen=True)
class RawLine:
    line: int  # 1-based line number in the file
    data: bytes  # the line without its line ending


def read_lines(path: str | Path, counts: dict[str, int] | None = None) -> Iterator[RawLine]:
    """Yield the non-blank lines of ``path``; ``counts['blank_lines']`` counts the rest."""
    with open(path, "rb") as f:
        for number, data in enumerate(f, start=1):
            if number == 1 and data.startswith(BOM):
                data = data[len(BOM) :]
            data = data.rstrip(b"\r\n")
            if not data.strip():
                if counts is not None:
                    counts["blank_lines"] = counts.get("blank_lines", 0) + 1
                continue
            yield RawLine(number, data)
