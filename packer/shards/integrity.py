"""Is a shard's content what a packer shard can hold? Checked on every read, before any row is used.

A shard whose bytes were damaged (a flipped block on disk, a bad copy) can still parse: Arrow reads the
buffers it is told to, and a list offset past its buffer makes a later row access read outside the
mapped file (a segfault, not an error). :func:`check_table` refuses such a table with
:class:`~packer.errors.DamagedShardError` naming the file, the row and what is wrong, in one line:

- Arrow's full validation: every list offset inside its values, in order; every dictionary index
  inside its dictionary; every string valid UTF-8;
- per kind (``packer.kind`` in the schema metadata), the values a build writes, vectorised over the
  whole table (a pass over the tokens, ~0.2 s per GB of ids and labels):

  - ``packed``: ``len(input_ids) == len(labels) == n_tokens``; ``cu_seqlens`` from 0, increasing, to
    ``n_tokens``; one entry per segment in each ``segment_*`` list; ids in ``[0, vocab_size)`` (where
    given), labels -100 or such an id; ``segment_trained`` / ``n_trained`` the labels' own counts;
    parents and groups earlier segments of the row; media spans inside the row and their segment list;
  - ``samples``: ``len(input_ids) == len(labels) == length`` (a preference sample: ``length`` less the shared
    prompt stored once, ``prefix x (responses - 1)``), ids and labels as above, ``n_trained``
    the labels' count, media and response spans inside the sample, ``prefix <= length``, costs non-negative;
  - ``plan``: one sample, start and length per segment, none negative.

What this cannot see is a damaged value that is still a valid one (a token id replaced by another):
``packer verify`` compares each file's sha256, and its deep mode re-derives the packed rows (:mod:`packer.verify_deep`).
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from packer.errors import DamagedShardError
from packer.shards.schema import IGNORE, KIND_KEY


def check_table(table: pa.Table, where: str, vocab_size: int | None = None, *, rows: bool = True) -> None:
    """Raise :class:`DamagedShardError` if ``table`` (read from ``where``) is not a sound packer shard;
    ``rows=False``: Arrow's validation only (the caller checks each row itself, as ``packer verify`` does)."""
    try:
        table.validate(full=True)
    except (pa.ArrowInvalid, pa.ArrowException) as e:
        raise damaged(where, None, f"Arrow validation: {e}") from None
    if not rows:
        return
    kind = (table.schema.metadata or {}).get(KIND_KEY, b"").decode(errors="replace")
    check = {"packed": _packed, "samples": _samples, "plan": _plan}.get(kind)
    if check is None:
        return
    first = 0
    for batch in table.to_batches():
        try:
            problem = _nulls(batch) or check(batch, vocab_size)
        except (IndexError, ValueError, TypeError, KeyError, pa.ArrowException) as e:  # shapes no build writes
            problem = None, f"{type(e).__name__}: {e}"
        if problem is not None:
            row, what = problem
            raise damaged(where, None if row is None else first + row, what)
        first += batch.num_rows


def damaged(where: str, row: int | None, what: object) -> DamagedShardError:
    """The error for a damaged shard: its file, the row where known, what is wrong, on one line."""
    what = " ".join(str(what).split())  # one line, whatever Arrow's message held
    reason = f"{'' if row is None else f'row {row}: '}damaged ({what})"
    return DamagedShardError(f"{where} {reason}: packer verify lists every problem, a rebuild (or a fresh copy) "
                             f"replaces it", reason)


def _nulls(batch: pa.RecordBatch) -> tuple[None, str] | None:
    """A build writes no null: one in a column (or in a list's values) is a damaged validity bitmap."""
    for field, column in zip(batch.schema, batch.columns, strict=True):
        values = column.values if pa.types.is_list(field.type) else None
        if not field.nullable and (column.null_count or (values is not None and values.null_count)):
            return None, f"nulls in {field.name}"
    return None


class _Lists:
    """A list column of one record batch: per-row starts and lengths in its flat values, and those values."""

    def __init__(self, array: pa.ListArray):
        offsets = array.offsets.to_numpy().astype(np.int64)
        self.lengths = np.diff(offsets)
        self.starts = offsets[:-1] - offsets[0]
        self.values = array.values.slice(int(offsets[0]), int(offsets[-1] - offsets[0]))

    def numbers(self) -> np.ndarray:
        return self.values.to_numpy(zero_copy_only=False)


def _first(bad: np.ndarray, lists: _Lists | None = None) -> int | None:
    """The row of the first True of ``bad`` (over rows; or over the flat values of ``lists``), or None."""
    hit = np.flatnonzero(bad)
    if not len(hit):
        return None
    return int(hit[0] if lists is None else np.searchsorted(lists.starts, hit[0], side="right") - 1)


def _sums(flags: np.ndarray, starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """``flags[starts[k] : starts[k] + lengths[k]].sum()`` for each k (ranges consecutive, in order)."""
    if not len(flags):
        return np.zeros(len(starts), np.int64)
    out = np.add.reduceat(flags, np.minimum(starts, len(flags) - 1), dtype=np.int64)
    out[lengths == 0] = 0  # reduceat gives the next element for an empty range
    return out


def _tokens(batch: pa.RecordBatch, n: np.ndarray, vocab_size: int | None) -> tuple[tuple[int, str] | None, _Lists, np.ndarray]:
    """ids and labels: one per token, ids in range, labels -100 or an id; (problem, labels, supervised per token).
    Reductions first (min, max, counts): the row of a bad value is looked for only when there is one."""
    ids, labels = _Lists(batch.column("input_ids")), _Lists(batch.column("labels"))
    for name, lists in (("input_ids", ids), ("labels", labels)):
        row = _first(lists.lengths != n)
        if row is not None:
            return (row, f"{lists.lengths[row]} {name} for {n[row]} tokens"), labels, np.zeros(0, np.int8)
    top = np.iinfo(np.int64).max if vocab_size is None else vocab_size
    values = ids.numbers()
    if len(values) and (values.min() < 0 or values.max() >= top):
        return (_first((values < 0) | (values >= top), ids), f"a token id outside [0, {top})"), labels, np.zeros(0, np.int8)
    lab = labels.numbers()
    supervised = lab != IGNORE
    if len(lab) and (lab.max() >= top or np.count_nonzero(lab < 0) != len(lab) - np.count_nonzero(supervised)):
        row = _first(supervised & ((lab < 0) | (lab >= top)), labels)
        return (row, f"a label that is neither {IGNORE} nor a token id"), labels, supervised.view(np.int8)
    return None, labels, supervised.view(np.int8)


def _packed(batch: pa.RecordBatch, vocab_size: int | None) -> tuple[int | None, str] | None:
    n = batch.column("n_tokens").to_numpy(zero_copy_only=False).astype(np.int64)
    row = _first(n < 0)
    if row is not None:
        return row, "a negative n_tokens"
    problem, labels, supervised = _tokens(batch, n, vocab_size)
    if problem is not None:
        return problem
    cu = _Lists(batch.column("cu_seqlens"))
    segments = cu.lengths - 1
    row = _first(segments < 1)
    if row is not None:
        return row, "cu_seqlens with fewer than 2 entries"
    values = cu.numbers().astype(np.int64)
    first, last = values[cu.starts], values[cu.starts + cu.lengths - 1]
    step = np.diff(values)
    inside = np.ones(len(step), bool)
    inside[(cu.starts + cu.lengths - 1)[:-1]] = False  # a row's last entry and the next row's first
    row = _first((first != 0) | (last != n))
    if row is None:
        row = _first(inside & (step <= 0), cu)
    if row is not None:
        return row, "cu_seqlens that do not run from 0 up to n_tokens"
    names = [f.name for f in batch.schema if f.name.startswith("segment_")]
    for name in names:
        lists = _Lists(batch.column(name))
        if name == "segment_trained" and not lists.lengths.any():
            continue  # a build that stored no counts: the loader derives them
        row = _first(lists.lengths != segments)
        if row is not None:
            return row, f"{name} does not hold one entry per segment"
        if name in ("segment_source", "segment_line", "segment_start", "segment_trained"):
            row = _first(lists.numbers() < 0, lists)
        elif name in ("segment_parent", "segment_group"):
            own = np.arange(len(lists.values)) - np.repeat(lists.starts, lists.lengths)  # each segment's number in its row
            v = lists.numbers()
            row = _first((v < -1) | (v > own) | (v == own) if name == "segment_parent" else (v < 0) | (v > own), lists)
        if row is not None:
            return row, f"{name} holds a value no build writes"
    if "segment_trained" in names and batch.column("segment_trained").offsets.to_numpy()[-1] > 0:
        trained = _Lists(batch.column("segment_trained")).numbers().astype(np.int64)
        bounds = np.repeat(labels.starts, cu.lengths) + values  # segment boundaries in the flat labels
        last = cu.starts + cu.lengths - 1
        seg_start = np.delete(bounds, last)
        seg_len = np.delete(bounds, cu.starts) - seg_start
        per_segment = _sums(supervised, seg_start, seg_len)
        bad = np.flatnonzero(per_segment != trained)
        row = int(np.searchsorted(np.cumsum(segments), bad[0], side="right")) if len(bad) else None
        if row is None and "n_trained" in batch.schema.names:
            stored = batch.column("n_trained").to_numpy(zero_copy_only=False).astype(np.int64)
            row = _first(stored != _sums(supervised, labels.starts, labels.lengths))
        if row is not None:
            return row, "segment_trained / n_trained differ from the labels' supervised tokens"
    return _media(batch, n, segments)


def _media(batch: pa.RecordBatch, n: np.ndarray, segments: np.ndarray | None) -> tuple[int, str] | None:
    media = _Lists(batch.column("media"))
    if not len(media.values):
        return None
    fields = dict(zip([f.name for f in media.values.type], media.values.flatten(), strict=True))
    start, length, tokens = (fields[k].to_numpy(zero_copy_only=False).astype(np.int64) for k in ("start", "length", "tokens"))
    of = np.repeat(np.arange(len(media.lengths)), media.lengths)  # each span's row (few: one per media item)
    bad = (start < 0) | (length < 1) | (tokens < 0) | (tokens > length) | (start + length > n[of])
    if segments is not None:
        seg = fields["segment"].to_numpy(zero_copy_only=False)
        bad |= (seg < 0) | (seg >= segments[of])
    row = _first(bad, media)
    return None if row is None else (row, "a media span outside its row")


def _samples(batch: pa.RecordBatch, vocab_size: int | None) -> tuple[int, str] | None:
    n = batch.column("length").to_numpy(zero_copy_only=False).astype(np.int64)
    row = _first(n < 0)
    if row is not None:
        return row, "a negative length"
    prefix = batch.column("prefix").to_numpy(zero_copy_only=False).astype(np.int64)
    responses = _Lists(batch.column("responses"))
    # a preference sample stores its shared prompt once: length counts it once per response (packer.pack.trees)
    held = n - prefix * np.maximum(responses.lengths - 1, 0)
    problem, labels, supervised = _tokens(batch, held, vocab_size)
    if problem is not None:
        return problem
    stored = batch.column("n_trained").to_numpy(zero_copy_only=False).astype(np.int64)
    row = _first(stored != _sums(supervised, labels.starts, labels.lengths))
    if row is not None:
        return row, "n_trained differs from the labels' supervised tokens"
    for name in ("source_index", "source_line"):
        row = _first(batch.column(name).to_numpy(zero_copy_only=False) < 0)
        if row is not None:
            return row, f"a negative {name}"
    row = _first((prefix < 0) | (prefix > n))
    if row is not None:
        return row, "a prefix outside the sample"
    for name in ("cost_llm", "cost_encoder", "cost_supervised"):
        row = _first(~(batch.column(name).to_numpy(zero_copy_only=False) >= 0))  # NaN too
        if row is not None:
            return row, f"a negative or NaN {name}"
    if len(responses.values):
        fields = dict(zip([f.name for f in responses.values.type], responses.values.flatten(), strict=True))
        start, length = (fields[k].to_numpy(zero_copy_only=False).astype(np.int64) for k in ("start", "length"))
        of = np.repeat(np.arange(len(responses.lengths)), responses.lengths)
        row = _first((start < 0) | (length < 1) | (start + length > n[of]), responses)
        if row is not None:
            return row, "a response span outside the sample"
    return _media(batch, held, None)


def _plan(batch: pa.RecordBatch, vocab_size: int | None) -> tuple[int, str] | None:
    samples, starts, lengths = (_Lists(batch.column(k)) for k in ("samples", "starts", "lengths"))
    row = _first((starts.lengths != samples.lengths) | (lengths.lengths != samples.lengths))
    if row is not None:
        return row, "samples / starts / lengths do not have one entry per segment"
    for name, lists, low in (("samples", samples, 0), ("starts", starts, 0), ("lengths", lengths, 1)):
        row = _first(lists.numbers() < low, lists)
        if row is not None:
            return row, f"a {name} entry no plan holds"
    return None
