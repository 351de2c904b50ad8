"""Streaming JSONL reader that knows the file and line of every record.

Lines are read as bytes and decoded one by one, so a non-UTF-8 line is one bad record,
not a crashed build. A UTF-8 byte-order mark on the first line, CRLF endings and blank
lines are accepted; blank lines are skipped (and counted) rather than reported. A line
longer than ``max_line_bytes`` is never held whole: its first bytes are kept (for the
quarantine) and the rest is skipped in chunks, so one huge line cannot exhaust memory.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np

from packer.records import RawLine

BOM = b"\xef\xbb\xbf"


MAX_LINE_BYTES = 64 * 2**20
SKIP_CHUNK = 1 << 20


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



WHITESPACE = b" \t\n\r\x0b\x0c"  # what bytes.strip() removes
SCAN_BLOCK = 8 * 2**20


def scan_lines(path: str | Path, counts: dict[str, int] | None = None, max_line_bytes: int = MAX_LINE_BYTES,
               ) -> Iterator[tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """Where the non-blank lines of ``path`` are, in batches of (line numbers, start offsets, end
    offsets): exactly the ``line`` / ``offset`` / ``end`` of what :func:`read_lines` yields, with
    ``counts['blank_lines']`` counted the same, without making a Python object per line.

    The driver's stage-1 scan needs only that (a task is a byte range) and reads every input
    byte on one core. Newlines are found a block at a time with numpy; a line is blank when it
    holds only ASCII whitespace (a first line's BOM aside), and only lines that start with
    whitespace (or the BOM) are looked at more closely. A line that comes near
    ``max_line_bytes`` hands the file, from that line on, to :func:`read_lines` (whose handling
    of huge lines is the rule).
    """
    from packer.io.fs import open_binary

    space = np.zeros(256, bool)
    space[list(WHITESPACE)] = True
    limit = max_line_bytes - len(BOM) - 1  # shorter lines are read whole by readline(max_line_bytes + 1)
    blank = 0
    number = 0  # lines ended so far
    line_start, open_line, pending = 0, False, True  # the line not ended yet; ``pending``: only whitespace so far
    position = 0  # file offset of the block
    with open_binary(path) as f:
        while True:
            if position:  # memory:// hands every reader of a file one shared object: read from our own place
                f.seek(position)
            data = f.read(SCAN_BLOCK if position else max(SCAN_BLOCK, len(BOM)))  # a BOM is seen whole
            if not data:
                break
            arr = np.frombuffer(data, np.uint8)
            nls = np.flatnonzero(arr == 10)
            k = len(nls)
            seg = np.empty(k, np.int64)  # in-block start of each piece that a newline here ends
            if k:
                seg[0] = 0
                seg[1:] = nls[:-1] + 1
            starts = position + seg
            ends = position + nls + 1
            keep = ~space[arr[seg]] if k else np.zeros(0, bool)  # a line starting with a non-space is not blank
            if k and open_line:
                starts[0] = line_start
                keep[0] = not pending or bool(data[: nls[0] + 1].strip())
            for j in np.flatnonzero(~keep).tolist():
                if not (j == 0 and open_line):
                    keep[j] = bool(data[seg[j] : nls[j] + 1].strip())
            if position == 0 and k and data.startswith(BOM):  # the first line, after its BOM
                keep[0] = bool(data[len(BOM) : nls[0] + 1].strip())
            tail = data[nls[-1] + 1 :] if k else data  # a line the next block goes on with
            if tail:
                text = tail
                if k or not open_line:
                    line_start, pending = position + len(data) - len(tail), True
                    if line_start == 0 and tail.startswith(BOM):
                        text = tail[len(BOM) :]
                pending = pending and not text.strip()
            open_line = bool(tail) or (open_line and not k)
            long = np.flatnonzero(ends - starts > limit)
            if len(long) or (open_line and position + len(data) - line_start > limit):
                j = int(long[0]) if len(long) else k  # hand over from line j (the open one when j == k)
                blank += int(j - keep[:j].sum())
                if keep[:j].any():
                    numbers = number + 1 + np.flatnonzero(keep[:j])
                    yield numbers, starts[:j][keep[:j]], ends[:j][keep[:j]]
                if counts is not None and blank:
                    counts["blank_lines"] = counts.get("blank_lines", 0) + blank
                first = int(starts[j]) if j < k else line_start
                for raw in read_lines(path, counts, max_line_bytes, start=first, first_line=number + j + 1):
                    yield np.array([raw.line]), np.array([raw.offset]), np.array([raw.end])
                return
            if k:
                blank += int(k - keep.sum())
                if keep.any():
                    yield number + 1 + np.flatnonzero(keep), starts[keep], ends[keep]
                number += k
            position += len(data)
    if open_line:  # the last line has no newline
        number += 1
        if pending:
            blank += 1
        else:
            yield np.array([number]), np.array([line_start]), np.array([position])
    if counts is not None and blank:
        counts["blank_lines"] = counts.get("blank_lines", 0) + blank
