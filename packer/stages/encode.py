"""Stage 1: ingest + encode. Input lines in, ``samples/*.arrow`` and quarantine entries out.

The driver cuts each input file into tasks of ``chunk_records`` consecutive non-blank
lines (a task never spans two files); task ``k`` writes ``samples/part-k.arrow``. Task
boundaries depend only on the input, and results are consumed in task order, so the
samples' global order -- and every byte after it -- is the same for any worker count.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path

from packer.encode import Encoder, EncoderSpec
from packer.errors import BadRecord, StrictModeError
from packer.ingest.reader import MAX_LINE_BYTES, RawLine, read_lines
from packer.io.arrow import write_shard
from packer.schema import SAMPLE_SCHEMA, QuarantineEntry, ShardEntry, to_table
from packer.stages.state import Journal, shard_payload

RAW_PREVIEW = 2000  # characters of a bad line kept in the quarantine


@dataclass(frozen=True)
class EncodeTask:
    index: int
    file: str  # as the user named it; used in keys and reports
    lines: tuple[RawLine, ...]


@dataclass
class EncodeResult:
    index: int
    file: str
    records: int
    quarantine: list[QuarantineEntry]
    shard: ShardEntry | None
    reused: bool = False  # found finished in the journal (a resumed build)


def make_tasks(files: list[Path], chunk_records: int, counts: dict[str, int],
               max_line_bytes: int = MAX_LINE_BYTES) -> Iterator[EncodeTask]:
    index = 0
    for path in files:
        chunk: list[RawLine] = []
        for raw in read_lines(path, counts, max_line_bytes):
            chunk.append(raw)
            if len(chunk) == chunk_records:
                yield EncodeTask(index, str(path), tuple(chunk))
                index, chunk = index + 1, []
        if chunk:
            yield EncodeTask(index, str(path), tuple(chunk))
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
    identity = {"file": task.file, "first_line": task.lines[0].line, "records": len(task.lines)}
    done = state.journal.load("encode", task.index, check=identity)
    if done is not None:
        shard = ShardEntry(**done["shard"]) if done["shard"] else None
        return EncodeResult(task.index, task.file, len(task.lines), [QuarantineEntry(**q) for q in done["quarantine"]],
                            shard, reused=True)
    samples, bad = [], []
    file_dir = Path(task.file).parent
    for raw in task.lines:
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
    return EncodeResult(task.index, task.file, len(task.lines), bad, shard)


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
