"""Stage 1: ingest + encode. Input lines in, ``samples/*.arrow`` and quarantine entries out.

The driver scans each input file once and cuts it into tasks of at most ``chunk_records``
consecutive non-blank lines and about :func:`task_bytes` bytes (a task never spans two
files): a small input still gives up to ``TARGET_TASKS`` tasks, so every worker has work.
A task is a byte range with the number of its first line, so a worker -- a local process
or a Ray worker on another machine -- reads its own lines and record identity (file +
line) stays exact. Task ``k`` writes ``samples/part-k.arrow``. Boundaries depend only on
the input and the config (never on the worker count) and results are consumed in task
order, so every byte of the output is the same for any worker count or engine.

A record that meets a packer bug (``internal_error``: an exception nobody foresaw) stops
the build by default: the record, where it was met and the traceback are written to
``OUT/internal_error.json`` and :class:`InternalRecordError` (exit 1) names it.
``--on-internal-error quarantine`` quarantines it instead, like a bad record.
"""

from __future__ import annotations

import json
import traceback
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa

from packer.cost import COSTS, CostModel
from packer.encode import Encoder, EncoderSpec
from packer.errors import BadRecord, PackerError, StrictModeError
from packer.ingest.reader import MAX_LINE_BYTES, read_lines, scan_lines
from packer.io import blobs
from packer.io.files import set_durable, write_text_atomic
from packer.io.fs import location, open_binary, parent
from packer.records import RawLine
from packer.shards.io import read_shard, write_shard
from packer.shards.media_index import blob_table, span_refs
from packer.shards.schema import SAMPLE_SCHEMA, QuarantineEntry, Sample, ShardEntry, to_table
from packer.shards.stats import sample_stats
from packer.stages.media_files import write_task_blobs
from packer.stages.planning import plan_columns
from packer.stages.state import INTERNAL_ERROR_FILE, Journal, shard_payload

RAW_PREVIEW = 2000  # characters of a bad line kept in the quarantine
TARGET_TASKS = 64  # a small input is cut into about this many tasks...
MIN_TASK_BYTES = 64 * 2**10  # ...of at least this many bytes (a task costs a shard file and a journal entry)


class InternalRecordError(PackerError):
    """A record met a packer bug and ``on_internal_error`` is ``stop``: the build stops (exit 1)."""


def task_bytes(total_bytes: int) -> int:
    """Bytes after which a task ends (it also ends at ``chunk_records`` records): the input cut
    into about ``TARGET_TASKS`` tasks, none under ``MIN_TASK_BYTES``. A function of the input's
    size only, so task boundaries (and the output's bytes) never depend on the worker count."""
    return max(MIN_TASK_BYTES, -(-total_bytes // TARGET_TASKS))


@dataclass(frozen=True)
class EncodeTask:
    index: int
    file: str  # as the user named it; used in keys and reports
    start: int  # byte range of the task's lines
    end: int
    first_line: int  # line number at ``start``
    records: int  # non-blank lines in the range
    max_line_bytes: int = MAX_LINE_BYTES
    file_index: int = 0  # the file's number in the build's inputs (a sample's source_index)
    format: str = "jsonl"  # packer.ingest.units.FORMATS; a table's start / end are row groups / batches, a tar's its bytes
    columns: tuple[tuple[str, str], ...] = ()  # the source's column mapping (packer.ingest.layouts.mapped)
    stored_bytes: int = -1  # input bytes the task covers, where start / end are not bytes (a table's groups)

    @property
    def nbytes(self) -> int:
        return self.stored_bytes if self.stored_bytes >= 0 else self.end - self.start

    def lines(self) -> list[RawLine]:
        """The task's records as read: JSONL lines, table rows, tar samples (``records`` -1: a tar's are not counted
        before it is read)."""
        return list(self.iter_lines())

    def iter_lines(self) -> Iterator[RawLine]:
        """:meth:`lines` one at a time (a table's a row group at a time, a tar's a sample at a time)."""
        if self.format == "jsonl":
            return read_lines(self.file, None, self.max_line_bytes, start=self.start, end=self.end,
                              first_line=self.first_line)
        from packer.ingest import records_of

        return records_of.task_records(self)


@dataclass
class EncodeResult:
    index: int
    file: str
    records: int
    quarantine: list[QuarantineEntry]
    shard: ShardEntry | None
    reused: bool = False  # found finished in the journal (a resumed build)
    nbytes: int = 0  # input bytes the task covered (progress)
    columns: pa.Table | None = None  # the shard's plan columns (planning.plan_columns): the driver plans from these
    media: list | None = None  # media_files.media_rows of the shard: the driver writes the media index from these
    audio_truncated: int = 0  # clips of the task's samples cut to the audio encoder's window
    content_changed: dict | None = None  # Encoder.content_changed over the task: text the build encoded otherwise
    blobs: ShardEntry | None = None  # samples/media-part-*.arrow: the bytes of the embedded media its samples name


def make_tasks(files: list, chunk_records: int, counts: dict[str, int],
               max_line_bytes: int = MAX_LINE_BYTES, max_task_bytes: int | None = None,
               readings: list[tuple[str, tuple]] | None = None) -> Iterator[EncodeTask]:
    """Stage 1's tasks over ``files``, in order: at most ``chunk_records`` records each, ended
    after the line that reaches ``max_task_bytes`` (None: no byte bound). The driver's scan:
    lines are located a block at a time (:func:`~packer.ingest.reader.scan_lines`) and tasks
    cut per batch of lines, not per line."""
    index = 0
    for file_index, path in enumerate(files):
        fmt, columns = readings[file_index] if readings else ("jsonl", ())
        if fmt != "jsonl":  # a table's row groups, a tar whole: from metadata, never the records
            for task in _container_tasks(path, fmt, columns, index, file_index, chunk_records, max_line_bytes,
                                         max_task_bytes):
                yield task
                index += 1
            continue
        first: tuple[int, int] | None = None  # (line, offset) of the open task's first record
        n = end = 0  # records in the open task; the end of its last one
        for lines, starts, ends in scan_lines(path, counts, max_line_bytes):
            k, m = 0, len(lines)
            while k < m:
                if first is None:
                    first = (int(lines[k]), int(starts[k]))
                last = k + chunk_records - n - 1  # the line that fills the task by count
                if max_task_bytes is not None:  # or the first that reaches the byte bound
                    last = min(last, k + int(np.searchsorted(ends[k:], first[1] + max_task_bytes)))
                if last >= m:  # the task goes on in the next batch
                    n, end, k = n + m - k, int(ends[m - 1]), m
                    continue
                n, end, k = n + last - k + 1, int(ends[last]), last + 1
                yield EncodeTask(index, str(path), first[1], end, first[0], n, max_line_bytes, file_index)
                index, first, n = index + 1, None, 0
        if first is not None:
            yield EncodeTask(index, str(path), first[1], end, first[0], n, max_line_bytes, file_index)
            index += 1


def _container_tasks(path, fmt: str, columns: tuple, index: int, file_index: int, chunk_records: int,
                     max_line_bytes: int, max_task_bytes: int | None) -> Iterator[EncodeTask]:
    """A parquet / Arrow file's tasks (runs of row groups / batches: :func:`packer.ingest.units.table_units`), or a
    tar's one task."""
    from packer.ingest.units import MAX_TABLE_TASK_BYTES, table_columns, table_units
    from packer.io import fs

    if fmt == "webdataset":
        yield EncodeTask(index, str(path), 0, fs.stat(path)[0], 0, -1, max_line_bytes, file_index, fmt, columns)
        return
    limit = min(max_task_bytes or MAX_TABLE_TASK_BYTES, MAX_TABLE_TASK_BYTES)
    columns = table_columns(path, fmt, columns)  # the schema checked (and its media features mapped) before any record
    for k, unit in enumerate(table_units(path, fmt, chunk_records, limit)):
        yield EncodeTask(index + k, str(path), unit.start, unit.end, unit.first_row, unit.rows, max_line_bytes,
                         file_index, fmt, columns, unit.nbytes)


@dataclass(frozen=True)
class EncodeState:
    encoder: Encoder
    out: Path
    strict: bool
    journal: Journal
    on_internal_error: str = "stop"
    cost: CostModel = CostModel()  # each sample's cost vector (with_costs)


def setup(spec: EncoderSpec, out: str, strict: bool, durable: bool = True, on_internal_error: str = "stop") -> EncodeState:
    """A stage-1 worker's state (the driver's too). The cost model comes resolved in ``spec`` (the driver resolved it
    once: :meth:`EncoderSpec.from_config`): a worker on another machine may not see the checkpoint or cost model
    file the setting names, and every worker must charge the samples alike, so none resolves it again."""
    if spec.cost_model is None:
        raise ValueError("stage 1 needs the build's cost model resolved on the driver: make the spec with "
                         "EncoderSpec.from_config or EncoderSpec.of")
    set_durable(durable)
    where = location(out)  # a local folder, or a URL the worker writes directly
    return EncodeState(Encoder(spec), where, strict, Journal(where), on_internal_error,
                       CostModel(**spec.cost_model["coefficients"]))


def with_costs(table: pa.Table, cost: CostModel) -> pa.Table:
    """``table`` (rows of the samples schema) with each sample's cost vector filled in: :meth:`CostModel.vector` of
    the sample's :func:`~packer.shards.stats.sample_stats` (a packed row of it alone)."""
    vector = cost.vector(sample_stats(table))
    for k, name in enumerate(COSTS):
        column = f"cost_{name}"
        table = table.set_column(table.schema.get_field_index(column), table.schema.field(column),
                                 pa.array(vector[:, k], pa.float64()))
    return table


def encode_task(state: EncodeState, task: EncodeTask) -> EncodeResult:
    identity = {"file": task.file, "first_line": task.first_line, "records": task.records}
    done = state.journal.load("encode", task.index, check=identity)
    if done is not None and state.on_internal_error == "stop" and any(
            q.get("reason") == "internal_error" for q in done["quarantine"]):
        done = None  # quarantined by an earlier run that allowed it: redone, and stopped at
    if done is not None:
        shard = ShardEntry(**done["shard"]) if done["shard"] else None
        table = read_shard(state.out / shard.file, shard.sha256) if shard else None
        return EncodeResult(task.index, task.file, done.get("read", task.records),
                            [QuarantineEntry(**q) for q in done["quarantine"]], shard, reused=True, nbytes=task.nbytes,
                            columns=plan_columns(table) if shard else None,
                            media=_media(state, table) if shard else [], audio_truncated=done.get("audio_truncated", 0),
                            content_changed=done.get("content_changed", {}),
                            blobs=ShardEntry(**done["blobs"]) if done.get("blobs") else None)
    samples, bad = [], []
    blobs.STORE.forget_urls()  # what an earlier task read of remote media: read afresh
    embed_files = getattr(state.encoder.spec.config, "media", "auto") == "embed"  # files / URLs read into blobs too
    file_dir = parent(task.file)
    read_count = 0
    written: set[str] = set()  # blobs already in the task's media shard

    def groups():  # the task's records and what they become, a group at a time; each group's blobs yielded
        nonlocal read_count
        for group in record_groups(task):
            read_count += len(group)
            fresh: list[str] = []
            # records are parsed and rendered one by one, tokenized together, then finished one by one; each
            # failure is that record's (see Encoder.encode_lines)
            for raw, result in zip(group, encode_records(state.encoder, group, task.file, file_dir, task.file_index),
                                   strict=True):
                if isinstance(result, BadRecord) and result.reason == "internal_error" and state.on_internal_error == "stop":
                    stop_on_internal_error(state.out, task.file, raw, result)
                if not isinstance(result, BadRecord) and embed_files:
                    result = embedded(result, state.encoder.spec.media_base)
                if isinstance(result, BadRecord):
                    if state.strict:
                        raise StrictModeError(_clean(f"{raw.place(task.file)}: {result.reason}: {result.detail}")) from None
                    bad.append(quarantine_entry(task.file, raw, result))
                else:
                    samples.append(result)
                    fresh += [n for m in result.media for n in span_refs(m.ref) if blobs.is_blob(n) and n not in written]
            names = sorted(set(fresh))
            written.update(names)
            yield blob_table(names, [blobs.STORE.get(n) for n in names])
            blobs.STORE.forget()  # written (or never needed): a worker holds one group's media at a time

    cut_before = state.encoder.clips_cut
    changed_before = state.encoder.content_changed()
    shard = columns = media = None
    target = state.out / "samples" / f"part-{task.index:05d}.arrow"
    try:  # output I/O (disk full, permissions) stops the build with the path, not a traceback
        blob_shard = write_task_blobs(state.out / "samples" / f"media-part-{task.index:05d}.arrow", groups(), state.out)
        if task.records >= 0 and read_count != task.records:
            raise PackerError(f"{task.file} changed while it was read (task {task.index} expected {task.records} "
                              f"records, read {read_count})")
        cut = state.encoder.clips_cut - cut_before
        changed = {k: n - changed_before[k] for k, n in state.encoder.content_changed().items()}
        read: dict = {"read": read_count} if task.records < 0 else {}  # a tar's records, counted as read
        if samples:
            table = with_costs(to_table(samples, SAMPLE_SCHEMA), state.cost)
            shard = write_shard(target, table, state.out)
            columns, media = plan_columns(table), _media(state, table)
        if blob_shard is not None:
            read["blobs"] = asdict(blob_shard)
        state.journal.record("encode", task.index, shard_payload(shard, quarantine=[asdict(q) for q in bad],
                                                                 audio_truncated=cut, content_changed=changed,
                                                                 **identity, **read))
    except OSError as e:
        raise PackerError(f"cannot write stage-1 output for task {task.index} under {state.out}: {e}; check the "
                          f"free space and permissions there") from e
    finally:
        blobs.STORE.forget()
    return EncodeResult(task.index, task.file, read_count, bad, shard, nbytes=task.nbytes, columns=columns,
                        media=media if shard else [], audio_truncated=cut, content_changed=changed, blobs=blob_shard)


GROUP_RECORDS = 1000  # records read, encoded and their media written at a time (TOKENIZE_BATCH: one tokenizer call)
GROUP_BLOB_BYTES = 64 * 2**20  # ...or fewer, once their embedded media reach this many bytes


def record_groups(task: EncodeTask) -> Iterator[list[RawLine]]:
    """``task``'s records in groups of at most ``GROUP_RECORDS``, a group closing once the media its records embed
    (held in :data:`packer.io.blobs.STORE` until the group is written) reach ``GROUP_BLOB_BYTES``: a worker holds a
    group's records and media, never a whole task's (a WebDataset shard of gigabytes, data: URLs in a large JSONL).
    A read error is the input's: the build stops naming the file."""
    group: list[RawLine] = []
    try:
        for raw in task.iter_lines():
            group.append(raw)
            if len(group) >= GROUP_RECORDS or (raw.record is not None and blobs.STORE.nbytes() >= GROUP_BLOB_BYTES):
                yield group
                group = []
    except OSError as e:  # the input, not one record
        raise PackerError(f"cannot read {task.file}: {e}") from e
    if group:
        yield group


def embedded(sample, media_base: str):
    """``sample`` with every media file it names read into a blob (``--media embed`` of file / URL inputs): the
    stored ref becomes the bytes' name, so the task's media shard carries them. A file that can no longer be read
    is the record's ``missing_<kind>`` (its count was read a moment before: the window is the task's length)."""
    from dataclasses import replace

    from packer.media.refs import resolve_ref, stored_frames

    def blob(ref: str, kind: str) -> str:
        if blobs.is_blob(ref):
            return ref
        try:
            with open_binary(resolve_ref(ref, media_base)) as f:
                return blobs.STORE.put(f.read())
        except BadRecord as e:  # an http(s):// URL that failed this time (packer.io.http)
            return e
        except OSError as e:
            return BadRecord(f"missing_{kind}", f"{kind} {ref!r} could not be read to embed it: {e}")

    spans = []
    for m in sample.media:
        listed = stored_frames(m.ref)
        names = [blob(r, m.kind) for r in (listed[0] if listed else [m.ref])]
        bad = next((n for n in names if isinstance(n, BadRecord)), None)
        if bad is not None:
            return bad
        ref = json.dumps({"frames": names, "fps": listed[1]}, ensure_ascii=False) if listed else names[0]
        spans.append(replace(m, ref=ref))
    return replace(sample, media=tuple(spans))


def _media(state: EncodeState, table: pa.Table) -> list:
    """The media-index rows of a task's samples, looked up here on the worker (:func:`media_rows`)."""
    from packer.stages.media_files import media_rows

    return media_rows(table, state.encoder.spec.media_base, bool(getattr(state.encoder.spec.config, "media_hash", False)))


def stop_on_internal_error(out: Path, file: str, raw: RawLine, error: BadRecord) -> None:
    """Write the record, the place and the traceback to ``OUT/internal_error.json``; raise
    :class:`InternalRecordError` naming it."""
    entry = quarantine_entry(file, raw, error)
    path = out / INTERNAL_ERROR_FILE
    report = {**asdict(entry), "traceback": _clean(getattr(error, "trace", "") or "")}
    try:
        write_text_atomic(path, json.dumps(report, ensure_ascii=False, indent=1, sort_keys=True) + "\n")
        where = f"the record and the traceback are in {path}"
    except OSError as e:
        where = f"(writing {path} failed: {e})"
    raise InternalRecordError(f"{raw.place(file)}: a packer bug met this record ({entry.detail}); {where}: please report "
                              f"them. Nothing else is wrong with the build: to quarantine such records and pack the rest, "
                              f"rerun with --on-internal-error quarantine") from None


def encode_records(encoder: Encoder, lines: list[RawLine], file: str, file_dir,
                   source_index: int = 0) -> list[Sample | BadRecord]:
    """``encoder.encode_lines`` (batched tokenization), each record's failure its BadRecord (see :func:`as_bad_record`)."""
    return encoder.encode_lines(lines, file, file_dir, source_index, failure=as_bad_record)


def encode_record(encoder: Encoder, raw: RawLine, file: str, file_dir, source_index: int = 0) -> Sample:
    """``encoder.encode_line``, with every failure that belongs to this one record a BadRecord."""
    try:
        return encoder.encode_line(raw, file, file_dir, source_index)
    except Exception as e:  # noqa: BLE001 -- as_bad_record re-raises what is not this record's
        raise as_bad_record(e) from None


def as_bad_record(e: Exception) -> BadRecord:
    """The BadRecord for an exception met while encoding one record, or the exception re-raised.

    Anything the code did not foresee (a library raising on hostile input, a bug) becomes
    ``internal_error`` naming the exception and where it was raised, so one record never stops
    a build and the quarantine shows the bug. A PackerError (the tokenizer has no chat
    template, ...) is about the whole build and stops it; so do MemoryError and interrupts
    (not Exceptions: never caught)."""
    if isinstance(e, BadRecord):
        return e
    if isinstance(e, (PackerError, MemoryError)):
        raise e
    if isinstance(e, RecursionError):
        return BadRecord("nesting_too_deep", "the record nests deeper than Python's recursion limit")
    frame = traceback.extract_tb(e.__traceback__)[-1]
    where = f"{Path(frame.filename).name}:{frame.lineno} in {frame.name}"
    bad = BadRecord("internal_error", f"{type(e).__name__}: {e} (raised at {where}); a bug in packer or a library "
                                      f"it calls")
    bad.trace = "".join(traceback.format_exception(e))  # for OUT/internal_error.json (--on-internal-error stop)
    return bad


def quarantine_entry(file: str, raw: RawLine, error: BadRecord) -> QuarantineEntry:
    return QuarantineEntry(
        file=file,
        line=raw.line,
        id=_peek_id(raw.data) if raw.record is None else _record_id(raw.record),
        reason=error.reason,
        detail=_clean(error.detail),
        raw=_clean(raw.data[: RAW_PREVIEW * 4].decode("utf-8", errors="replace")[:RAW_PREVIEW]),
        where=raw.where,
        member=raw.member or None,
    )


def _record_id(obj) -> str | None:
    """The record's id if it has a usable one (a string or an integer), for the quarantine."""
    value = obj.get("id") if isinstance(obj, dict) else None
    return _clean(str(value)) if isinstance(value, (str, int)) and not isinstance(value, bool) else None


def _clean(text: str) -> str:
    """``text`` writable as UTF-8: a lone surrogate (from a record's JSON) as its escape, ``\\ud83d``."""
    return text.encode("utf-8", errors="backslashreplace").decode("utf-8")


def _peek_id(data: bytes) -> str | None:
    """The record's id if the line is JSON enough to have one (for the quarantine)."""
    try:
        obj = json.loads(data)
    except Exception:  # noqa: BLE001 -- malformed, invalid UTF-8, a huge integer, nesting too deep: no id
        return None
    return _record_id(obj)
