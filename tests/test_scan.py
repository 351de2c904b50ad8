"""The driver's stage-1 scan (scan_lines / make_tasks) finds exactly the records, line numbers,
byte ranges and blank lines that read_lines does, whatever the bytes: BOMs, CRLF, whitespace
of every kind, a last line without a newline, lines across block boundaries and lines over
max_line_bytes (handed to read_lines)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from packer.ingest import reader
from packer.ingest.reader import read_lines, scan_lines
from packer.stages import encode


def reference_tasks(files, chunk_records, counts, max_line_bytes, max_task_bytes=None):
    """make_tasks as it was: a read_lines loop."""
    index = 0
    for file_index, path in enumerate(files):
        first, n = None, 0
        for raw in read_lines(path, counts, max_line_bytes):
            first = first or raw
            n += 1
            if n == chunk_records or (max_task_bytes is not None and raw.end - first.offset >= max_task_bytes):
                yield encode.EncodeTask(index, str(path), first.offset, raw.end, first.line, n, max_line_bytes, file_index)
                index, first, n = index + 1, None, 0
        if first is not None:
            yield encode.EncodeTask(index, str(path), first.offset, raw.end, first.line, n, max_line_bytes, file_index)
            index += 1


PIECES = [b"{", b"a", b"}", b" ", b"\t", b"\r", b"\n", b"\n", b"\n", b"\x0b", b"\x0c", b"\xef\xbb\xbf", b"\xff", b"\x00",
          b"{\"text\": \"x\"}\n", b"   \n", b"\r\n"]


@settings(max_examples=300, deadline=None)
@given(files=st.lists(st.tuples(st.booleans(), st.lists(st.sampled_from(PIECES), max_size=80)), min_size=1, max_size=3),
       block=st.integers(1, 40), max_line_bytes=st.integers(1, 60), chunk_records=st.integers(1, 6),
       max_task_bytes=st.one_of(st.none(), st.integers(1, 80)))
def test_scan_equals_read_lines(tmp_path_factory, files, block, max_line_bytes, chunk_records, max_task_bytes):
    folder = tmp_path_factory.mktemp("scan")
    paths = []
    for k, (bom, pieces) in enumerate(files):
        path = folder / f"f{k}.jsonl"
        path.write_bytes((b"\xef\xbb\xbf" if bom else b"") + b"".join(pieces))
        paths.append(path)
    saved = reader.SCAN_BLOCK
    reader.SCAN_BLOCK = block  # many block boundaries, inside lines and BOMs too
    try:
        want_counts, got_counts = {}, {}
        want = list(reference_tasks(paths, chunk_records, want_counts, max_line_bytes, max_task_bytes))
        got = list(encode.make_tasks(paths, chunk_records, got_counts, max_line_bytes, max_task_bytes))
        assert got == want and got_counts == want_counts
        for path in paths:
            lines = [(r.line, r.offset, r.end) for r in read_lines(path, None, max_line_bytes)]
            scanned = [(int(a), int(b), int(c)) for batch in scan_lines(path, None, max_line_bytes) for a, b, c in zip(*batch)]
            assert scanned == lines
    finally:
        reader.SCAN_BLOCK = saved


@pytest.mark.parametrize("data", [b"", b"\n\n", b"\xef\xbb\xbf\n", b"\xef\xbb\xbf \n{}", b"{}", b"{}\n \n\t\r\n{}\r\n"])
def test_small_files(tmp_path, data):
    path = tmp_path / "x.jsonl"
    path.write_bytes(data)
    want, got = {}, {}
    assert list(encode.make_tasks([path], 2, got)) == list(reference_tasks([path], 2, want, reader.MAX_LINE_BYTES))
    assert got == want


def test_tasks_read_while_the_scan_goes_on_over_a_shared_memory_file(monkeypatch):
    """memory:// gives every open() of a file the same object: a task read between two blocks of the
    scan (the local engine runs tasks as they are cut) must not move the scan."""
    import fsspec

    from conftest import SAMPLE

    monkeypatch.setattr(reader, "SCAN_BLOCK", 4096)
    fsspec.filesystem("memory").pipe("/scan/docs.jsonl", (SAMPLE / "docs.jsonl").read_bytes())
    tasks = []
    for task in encode.make_tasks(["memory://scan/docs.jsonl"], 10_000, {}, reader.MAX_LINE_BYTES, 20_000):
        assert len(task.lines()) == task.records  # read now, as the in-process worker does
        tasks.append(task)
    want = reference_tasks([SAMPLE / "docs.jsonl"], 10_000, {}, reader.MAX_LINE_BYTES, 20_000)
    assert [(t.start, t.end, t.first_line, t.records) for t in tasks] == \
        [(t.start, t.end, t.first_line, t.records) for t in want] and len(tasks) > 5
