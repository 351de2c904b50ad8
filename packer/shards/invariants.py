"""The invariants of a build's rows, in one place: what a packed row, a sample and a plan entry must hold.

Two readers ask them, each in the form it needs:

- every read of a shard (:func:`packer.shards.integrity.check_table`, before any row is used): :func:`batch_problem`,
  vectorised over a whole record batch, the first problem only (a damaged shard is refused on one line); it
  needs nothing but the shard (and the vocabulary size where known);
- ``packer verify``, row by row, naming every problem of a packed row: :func:`packed_row_problems` (the row's
  own structure, with the build's ``max_length``, placeholder ids and media kinds) and :func:`source_problems`
  (a row of sources with their own packing: one policy, its capacity, ``packing = false``).

What a packed row must hold (``packer verify``'s list; the per-read check holds the part that needs no
manifest): ``cu_seqlens`` starts at 0, increases, ends at ``n_tokens`` = the number of ids and labels;
``n_tokens <= max_length``; ids in ``[0, vocab_size)``, labels -100 or such an id; ``segment_trained`` /
``n_trained`` the labels' own counts; one entry per segment in each ``segment_*`` list; labels -100 at every
segment start and on every placeholder / begin / end token; media spans inside their segment, starting and ending
with their kind's placeholder id and holding ``tokens`` of them, and no placeholder id outside a span; and the
preference structure: a record's segments consecutive (its group), of one input line; a parent an earlier
segment of the group, a tree's ``prompt`` (untrained, holding the record's media: no media in a branch), its
branches starting with one same token; a ``chosen`` with exactly one ``rejected`` in its group.

The helpers both forms use (the token id range, the labels' supervised counts per segment) are written once here.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from packer.shards.schema import IGNORE


def batch_problem(batch: pa.RecordBatch, kind: str, vocab_size: int | None) -> tuple[int | None, str] | None:
    """The first problem of ``batch`` (a record batch of a shard of ``kind``: ``packed``, ``samples`` or ``plan``)
    as ``(row in the batch or None, what)``, or None. Raises on shapes no build writes (the caller names them)."""
    return _nulls(batch) or BATCH_CHECKS[kind](batch, vocab_size)


def _top(vocab_size: int | None) -> int:
    """The first value past the token ids: ``vocab_size``, or no bound where it is not known."""
    return np.iinfo(np.int64).max if vocab_size is None else vocab_size


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
    top = _top(vocab_size)
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


BATCH_CHECKS = {"packed": _packed, "samples": _samples, "plan": _plan}  # per packer.kind of the schema metadata


def source_problems(row: dict, inputs: list[str], group: list[int], capacity: list[int], unpacked: list[bool]) -> list[str]:
    """A row of sources with their own packing: one policy's sources only, within its capacity, one sample when
    unpacked (a preference record's segments or a split sample's piece are one)."""
    out = []
    files = row["segment_source"]
    if len({group[f] for f in files}) > 1:
        named = sorted({inputs[f] for f in files})
        out.append(f"segments of sources packed by different policies in one row ({', '.join(named)})")
    first = files[0]
    if row["n_tokens"] > capacity[first]:
        out.append(f"n_tokens {row['n_tokens']} > max_length {capacity[first]} of its source {inputs[first]!r}")
    samples = len(set(zip(files, row["segment_line"], strict=True)))
    if unpacked[first] and samples > 1:
        out.append(f"{samples} samples in a row of source {inputs[first]!r}, whose packing = false")
    return out


def packed_row_problems(row: dict, max_length: int, placeholders: set[int], kind_ids: dict[str, int | None],
                        vocab: int | None = None) -> list[str]:
    """Every problem of one packed row (a dict, as ``to_pylist`` gives it), each a message (see the module docstring):
    ``placeholders`` every placeholder / begin / end id, ``kind_ids`` each media kind's placeholder id."""
    out = []
    cu = np.asarray(row["cu_seqlens"], dtype=np.int64)
    ids = np.asarray(row["input_ids"], dtype=np.int64)
    labels = np.asarray(row["labels"], dtype=np.int64)
    n = row["n_tokens"]
    if len(cu) < 2 or cu[0] != 0 or np.any(np.diff(cu) <= 0) or cu[-1] != n:
        return [f"cu_seqlens {cu.tolist()[:8]}... must start at 0, increase and end at n_tokens {n}"]
    if len(ids) != n or len(labels) != n:
        out.append(f"{len(ids)} ids and {len(labels)} labels for n_tokens {n}")
        return out
    if n > max_length:
        out.append(f"n_tokens {n} > max_length {max_length}")
    top = _top(vocab)
    if np.any((ids < 0) | (ids >= top)) or np.any((labels != IGNORE) & ((labels < 0) | (labels >= top))):
        out.append(f"a token id or label outside [0, {top}) (labels: or {IGNORE})")
    if "segment_trained" in row:  # the loss denominators the collator reads: they must be the labels' own counts
        counts = _sums((labels != IGNORE).view(np.int8), cu[:-1], np.diff(cu)).tolist()
        if list(row["segment_trained"]) != counts or row.get("n_trained") != sum(counts):
            out.append(f"segment_trained {list(row['segment_trained'])[:8]} / n_trained {row.get('n_trained')} differ from "
                       f"the labels' supervised tokens {counts[:8]} / {sum(counts)} (the loss would be normalised wrong)")
    if not len(row["segment_ids"]) == len(row["segment_modality"]) == len(cu) - 1:
        out.append("segment_ids / segment_modality do not have one entry per segment")
    if np.any(labels[cu[:-1]] != IGNORE):
        out.append("a segment's first token has a label (it would be trained on the previous segment)")
    special = np.isin(ids, list(placeholders))
    if np.any(labels[special] != IGNORE):
        out.append("a placeholder / begin / end token is trained")
    covered = np.zeros(n, dtype=bool)
    for m in row["media"]:
        seg = m["segment"]
        if not 0 <= seg < len(cu) - 1 or m["start"] < cu[seg] or m["start"] + m["length"] > cu[seg + 1]:
            out.append(f"media span {m['ref']} at {m['start']}+{m['length']} lies outside segment {seg}")
            continue
        span = ids[m["start"] : m["start"] + m["length"]]
        pad = kind_ids.get(m["kind"])
        if pad is None or not len(span) or span[0] != pad or span[-1] != pad or int((span == pad).sum()) != m["tokens"]:
            out.append(f"media span {m['ref']} does not start and end with the {m['kind']} placeholder or does not hold "
                       f"its {m['tokens']} placeholders")
        covered[m["start"] : m["start"] + m["length"]] = True
    pads = np.isin(ids, [v for v in kind_ids.values() if v is not None])
    if np.any(pads & ~covered):
        out.append("a placeholder id lies outside every media span")
    return out + _tree_problems(row, cu, ids, labels)


def _tree_problems(row: dict, cu: np.ndarray, ids: np.ndarray, labels: np.ndarray) -> list[str]:
    """The preference structure of a packed row (see the module docstring)."""
    n = len(cu) - 1
    parent, group, role, weight = (row.get(k) for k in ("segment_parent", "segment_group", "segment_role", "segment_weight"))
    if any(v is None or len(v) != n for v in (parent, group, role, weight)):
        return ["segment_parent / segment_group / segment_role / segment_weight do not have one entry per segment"]
    out = []
    identity = list(zip(row["segment_source"], row["segment_line"], strict=True))
    media_segments = {m["segment"] for m in row["media"]}
    for j in range(n):
        g, p = group[j], parent[j]
        if not 0 <= g <= j or group[g] != g or (g < j and (group[j - 1] != g or identity[j] != identity[g])):
            out.append(f"segment {j}'s group {g} is not a run of consecutive segments of one record")
        if role[j] == "" and (g != j or p != -1):
            out.append(f"segment {j} belongs to no preference record but has a group or a parent")
        if p == -1:
            continue
        if not g <= p < j or role[p] != "prompt" or role[j] in ("", "prompt"):
            out.append(f"segment {j} ({role[j]!r}) has parent {p}, which is not an earlier prompt of its record")
            continue
        first = next(k for k in range(p + 1, j + 1) if parent[k] == p)
        if ids[cu[j]] != ids[cu[first]]:
            out.append(f"segment {j}: a tree's branches do not start with the same (last shared) token")
        if j in media_segments:
            out.append(f"segment {j} is a tree's branch holding media (a prompt's media belong to the prompt, once)")
    for j in range(n):
        if role[j] == "prompt" and np.any(labels[cu[j] : cu[j + 1]] != IGNORE):
            out.append(f"segment {j} is a tree's prompt with trained tokens")
        if role[j] == "prompt" and j + 1 < n and parent[j + 1] != j:
            out.append(f"segment {j} is a tree's prompt that no branch follows")
    for g in sorted(set(group)):
        members = [role[j] for j in range(n) if group[j] == g]
        if ("chosen" in members or "rejected" in members) and (members.count("chosen"), members.count("rejected")) != (1, 1):
            out.append(f"the record at segment {g} holds {members.count('chosen')} chosen and "
                       f"{members.count('rejected')} rejected responses (1 and 1 expected)")
    return out


