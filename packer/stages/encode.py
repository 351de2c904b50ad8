"""Stage 1: ingest + encode. Input lines in, ``samples/*.arrow`` and quarantine entries out.

The driver scans each input file once and cuts it into tasks of ``chunk_records``
consecutive non-blank lines (a task never spans two files). A task is a byte range with
the number of its first line, so a worker -- a local process or a Ray worker on another
machine -- reads its own lines and record identity (file + line) stays exact. Task ``k``
writes ``samples/part-k.arrow``. Boundaries depend only on the input and results are
consumed in task order, so every byte of the output is the same for any worker count or
engine.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path

from packer.encode import Encoder, EncoderSpec
from packer.errors import BadRecord, PackerError, StrictModeError
from packer.ingest.reader import MAX_LINE_BYTES, RawLine, read_lines
from packer.io.arrow import write_shard
from packer.io.fs import parent
from packer.schema import SAMPLE_SCHEMA, QuarantineEntry, ShardEntry, to_table
from packer.stages.state import Journal, shard_payload

RAW_PREVIEW = 2000  # characters of a bad line kept in the quarantine


@dataclass(frozen=True)
class EncodeTask:
    index: int
    file: str  # as the user named it; used in keys and reports
    start: int  # byte range of the task's lines
    end: int
    first_line: int  # line number at ``start``
    records: int  # non-blank lines in the range
    max_line_bytes: int = MAX_LINE_BYTES

    def lines(self) -> list[RawLine]:
        return list(read_lines(self.file, None, self.max_line_bytes, start=self.start, end=self.end,
                               first_line=self.first_line))


@dataclass
class EncodeResult:
    index: int
    file: str
    records: int
    quarantine: list[QuarantineEntry]
    shard: ShardEntry | None
    reused: bool = False  # found finished in the journal (a resumed build)


def make_tasks(files: list, chunk_records: int, counts: dict[str, int],
               max_line_bytes: int = MAX_LINE_BYTES) -> Iterator[EncodeTask]:
    index = 0
    for path in files:
        first: RawLine | None = None
        n = 0
        for raw in read_lines(path, counts, max_line_bytes):
            if first is None:
                first = raw
            n += 1
            if n == chunk_records:
                yield EncodeTask(index, str(path), first.offset, raw.end, first.line, n, max_line_bytes)
                index, first, n = index + 1, None, 0
        if first is not None:
            yield EncodeTask(index, str(path), first.offset, raw.end, first.line, n, max_line_bytes)
            index += 1


@dataclass(frozen=True)
class EncodeState:
    encoder: Encoder
    out: Path
    strict: bool
    journal: Journal


def setup(spec: EncoderSpec, out: str, strict: bool) -> EncodeState:
    return EncodeState(Encoder(spec), Path(out), strict, Journal(Path(out)))


def encode_task(state: EncodeState, task: EncodeTask) -> EncodeResult:
    identity = {"file": task.file, "first_line": task.first_line, "records": task.records}
    done = state.journal.load("encode", task.index, check=identity)
    if done is not None:
        shard = ShardEntry(**done["shard"]) if done["shard"] else None
        return EncodeResult(task.index, task.file, task.records, [QuarantineEntry(**q) for q in done["quarantine"]],
                            shard, reused=True)
    samples, bad = [], []
    file_dir = parent(task.file)
    lines = task.lines()
    if len(lines) != task.records:
        raise PackerError(f"{task.file} changed while it was read (task {task.index} expected {task.records} records)")
    for raw in lines:
        try:
            samples.append(state.encoder.encode_line(raw, task.file, file_dir))
        except BadRecord as e:
            if state.strict:
                raise StrictModeError(f"{task.file}:{raw.line}: {e.reason}: {e.detail}") from None
            bad.append(quarantine_entry(task.file, raw, e))
    shard = None
    if samples:
        table = to_table(samples, SAMPLE_SCHEMA)
        shard = write_shard(state.out / "samples" / f"part-{task.index:05d}.arrow", table, state.out)
    state.journal.record("encode", task.index, shard_payload(shard, quarantine=[asdict(q) for q in bad], **identity))
    return EncodeResult(task.index, task.file, task.records, bad, shard)


def quarantine_entry(file: str, raw: RawLine, error: BadRecord) -> QuarantineEntry:
    return QuarantineEntry(
        file=file,
        line=raw.line,
        id=_peek_id(raw.data),
        reason=error.reason,
        detail=error.detail,
        raw=raw.data[: RAW_PREVIEW * 4].decode("utf-8", errors="replace")[:RAW_PREVIEW],
    )


def _peek_id(data: bytes) -> str | None:
    """The record's id if the line is JSON enough to have one (for the quarantine)."""
    try:
        obj = json.loads(data)
    except (ValueError, UnicodeDecodeError):
        return None
    value = obj.get("id") if isinstance(obj, dict) else None
    return str(value) if isinstance(value, (str, int)) and not isinstance(value, bool) else None
