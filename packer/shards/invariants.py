"""The invariants of a build's rows, in one place: what a packed row, a sample and a plan entry must hold.

Each rule is stated once, in a table per shard kind (:data:`RULES`): a vectorised check over rows (the first row
that breaks it) and the words each reader uses for a break. Two readers run the same table, each in its form:

- every read of a shard (:func:`packer.shards.integrity.check_table`, before any row is used): :func:`batch_problem`
  runs the rules over a whole record batch and stops at the first problem (a damaged shard is refused on one line);
  it needs nothing but the shard (and the vocabulary size where known), so the rules that need the manifest
  (``max_length``, placeholder ids, media kinds) are not asked;
- ``packer verify``, row by row, naming every problem of a packed row: :func:`packed_row_problems` runs every rule
  on one row (a rule whose break leaves the rest unreadable stops there), with the build's ``max_length``,
  placeholder ids and media kinds; and :func:`source_problems` (a row of sources with their own packing: one
  policy, its capacity, ``packing = false``).

A rule's two wordings differ where the readers differ: the per-read one names the first row of a batch in a few
words, verify's names the values of the row it reads.

What a packed row must hold: ``cu_seqlens`` starts at 0, increases, ends at ``n_tokens`` = the number of ids and
labels; ``n_tokens <= max_length``; ids in ``[0, vocab_size)``, labels -100 or such an id; one entry per segment in
each ``segment_*`` list; ``segment_trained`` / ``n_trained`` the labels' own counts; labels -100 at every segment
start and on every placeholder / begin / end token; media spans inside their segment, starting and ending with
their kind's placeholder id and holding ``tokens`` of them, and no placeholder id outside a span; and the
preference structure: a record's segments consecutive (its group), of one input line; a parent an earlier
segment of the group, a tree's ``prompt`` (untrained, holding the record's media: no media in a branch), its
branches starting with one same token; a ``chosen`` with exactly one ``rejected`` in its group.

Over 450 lines on purpose: the rules, their vectorised checks and both wordings sit in one table here, so that a rule
is read, and changed, in one place (split, each rule's check and its words would live apart again).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import cached_property

import numpy as np
import pyarrow as pa

from packer.shards.schema import IGNORE


class _Lists:
    """A list column over rows: per-row starts and lengths in its flat values, and those values (an Arrow array of
    a record batch's column, or the numpy array of one row's list)."""

    def __init__(self, offsets: np.ndarray, values):
        self.lengths = np.diff(offsets)
        self.starts = offsets[:-1] - offsets[0]
        self.values = values

    @classmethod
    def of_array(cls, array: pa.ListArray) -> _Lists:
        offsets = array.offsets.to_numpy().astype(np.int64)
        return cls(offsets, array.values.slice(int(offsets[0]), int(offsets[-1] - offsets[0])))

    @classmethod
    def of_row(cls, values: list) -> _Lists:
        return cls(np.array([0, len(values)], np.int64), np.asarray(values))

    def numbers(self) -> np.ndarray:
        return self.values if isinstance(self.values, np.ndarray) else self.values.to_numpy(zero_copy_only=False)


def _top(vocab_size: int | None) -> int:
    """The first value past the token ids: ``vocab_size``, or no bound where it is not known."""
    return np.iinfo(np.int64).max if vocab_size is None else vocab_size


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


def _ints(column) -> np.ndarray:
    return np.asarray(column.to_numpy(zero_copy_only=False) if isinstance(column, pa.Array) else column).astype(np.int64)


class _Rows:
    """Rows as the rules read them: a record batch (the per-read check), or one row as ``to_pylist`` gives it
    (``packer verify``, with what the manifest says). Columns are read when a rule first asks for them."""

    def __init__(self, kind: str, batch: pa.RecordBatch | None = None, row: dict | None = None, vocab: int | None = None,
                 max_length: int | None = None, placeholders: set[int] | None = None,
                 kind_ids: dict[str, int | None] | None = None):
        self.kind, self.batch, self.row, self.vocab = kind, batch, row, vocab
        self.max_length, self.placeholders, self.kind_ids = max_length, placeholders, kind_ids
        self.names = list(batch.schema.names) if batch is not None else list(row)
        self._lists: dict[str, _Lists] = {}

    @property
    def top(self) -> int:
        return _top(self.vocab)

    def lists(self, name: str) -> _Lists:
        if name not in self._lists:
            self._lists[name] = (_Lists.of_array(self.batch.column(name)) if self.batch is not None
                                 else _Lists.of_row(self.row[name]))
        return self._lists[name]

    def column(self, name: str) -> np.ndarray:
        """A scalar column, one value per row."""
        return np.asarray(self.batch.column(name).to_numpy(zero_copy_only=False) if self.batch is not None
                          else [self.row[name]])

    @cached_property
    def stored(self) -> np.ndarray:
        """The length each row stores ids and labels for: ``n_tokens``; a sample's ``length`` less its shared prompt
        stored once (``prefix x (responses - 1)``, :mod:`packer.pack.trees`)."""
        if self.kind == "packed":
            return self.column("n_tokens").astype(np.int64)
        return self.length - self.prefix * np.maximum(self.lists("responses").lengths - 1, 0)

    @cached_property
    def length(self) -> np.ndarray:
        return self.column("n_tokens" if self.kind == "packed" else "length").astype(np.int64)

    @cached_property
    def prefix(self) -> np.ndarray:
        return self.column("prefix").astype(np.int64)

    @cached_property
    def supervised(self) -> np.ndarray:
        """Per flat label: 1 where supervised (int8, for sums)."""
        return (self.lists("labels").numbers() != IGNORE).view(np.int8)

    @cached_property
    def cu(self) -> np.ndarray:
        return self.lists("cu_seqlens").numbers().astype(np.int64)

    @cached_property
    def segments(self) -> np.ndarray | None:
        return self.lists("cu_seqlens").lengths - 1 if "cu_seqlens" in self.names else None

    @cached_property
    def counts(self) -> np.ndarray:
        """The labels' supervised tokens per segment, over all rows' segments in order."""
        cu, labels = self.lists("cu_seqlens"), self.lists("labels")
        bounds = np.repeat(labels.starts, cu.lengths) + self.cu  # segment boundaries in the flat labels
        seg_start = np.delete(bounds, cu.starts + cu.lengths - 1)
        return _sums(self.supervised, seg_start, np.delete(bounds, cu.starts) - seg_start)

    @cached_property
    def stores_trained(self) -> bool:
        """Whether the rows store their supervised counts (a build that stored none: the loader derives them); one
        row read by verify stores them where it has the key."""
        if self.batch is None:
            return "segment_trained" in self.row
        return "segment_trained" in self.names and self.batch.column("segment_trained").offsets.to_numpy()[-1] > 0

    @cached_property
    def spans(self) -> tuple[_Lists, dict[str, np.ndarray]]:
        """The media spans (their list, and each field over the flat spans)."""
        media = self.lists("media") if self.batch is not None else _Lists.of_row(self.row["media"])
        if self.batch is not None:
            fields = dict(zip([f.name for f in media.values.type], media.values.flatten(), strict=True))
            return media, {k: v.to_numpy(zero_copy_only=False) for k, v in fields.items()}
        spans = self.row["media"]
        return media, {k: np.asarray([m[k] for m in spans]) for k in ("start", "length", "tokens", "segment")}

    @cached_property
    def span_bad(self) -> np.ndarray:
        """Per span: outside its row (and, in a packed row, outside its segment)."""
        media, fields = self.spans
        start, length, tokens = (fields[k].astype(np.int64) for k in ("start", "length", "tokens"))
        of = np.repeat(np.arange(len(media.lengths)), media.lengths)  # each span's row (few: one per media item)
        bad = (start < 0) | (length < 1) | (tokens < 0) | (tokens > length) | (start + length > self.stored[of])
        if self.segments is not None:
            seg = fields["segment"].astype(np.int64)
            bad |= (seg < 0) | (seg >= self.segments[of])
            at = self.lists("cu_seqlens").starts[of] + np.where(bad, 0, seg)  # each span's segment start in the flat cu
            bad |= ~bad & ((start < self.cu[at]) | (start + length > self.cu[np.minimum(at + 1, len(self.cu) - 1)]))
        return bad


@dataclass(frozen=True)
class Check:
    """One vectorised test: ``first(rows)`` the first row that breaks it (or None); ``batch`` the per-read wording
    of that row (None: verify asks it only, it needs the manifest); ``row``: whether verify asks it."""
    first: Callable[[_Rows], int | None]
    batch: Callable[[_Rows, int], str] | None
    row: bool = True


@dataclass(frozen=True)
class Rule:
    """One invariant: its checks (in order: a later one may read what an earlier one holds) and verify's wording
    of a break of one row (a list: a rule over spans names each; None where verify does not ask it; a rule
    without a check verify asks words its problems itself). ``stop``: the rules after it cannot read a row that
    breaks it (verify's list ends there)."""
    what: str
    checks: Callable[[_Rows], Iterator[Check]]
    row: Callable[[_Rows], list[str]] | None = None
    stop: bool = False


def _fixed(*checks: Check) -> Callable[[_Rows], Iterator[Check]]:
    return lambda rows: iter(checks)


def _said(text: str) -> Callable[[_Rows, int], str]:
    return lambda rows, row: text


# ------------------------------------------------------------------ the rules over every kind's tokens


def _lengths(name: str) -> Check:
    def first(rows: _Rows) -> int | None:
        return _first(rows.lists(name).lengths != rows.stored)
    return Check(first, lambda rows, row: f"{rows.lists(name).lengths[row]} {name} for {rows.stored[row]} tokens")


TOKENS = Rule("one id and one label per token", _fixed(_lengths("input_ids"), _lengths("labels")), stop=True,
              row=lambda rows: [f"{len(rows.row['input_ids'])} ids and {len(rows.row['labels'])} labels for n_tokens "
                                f"{rows.row['n_tokens']}"])


def _ids_in_range(rows: _Rows) -> int | None:
    """Reductions first (min, max): the row of a bad value is looked for only when there is one."""
    values, top = rows.lists("input_ids").numbers(), rows.top
    if len(values) and (values.min() < 0 or values.max() >= top):
        return _first((values < 0) | (values >= top), rows.lists("input_ids"))
    return None


def _labels_in_range(rows: _Rows) -> int | None:
    lab, top = rows.lists("labels").numbers(), rows.top
    supervised = rows.supervised.view(bool)
    if len(lab) and (lab.max() >= top or np.count_nonzero(lab < 0) != len(lab) - np.count_nonzero(supervised)):
        return _first(supervised & ((lab < 0) | (lab >= top)), rows.lists("labels"))
    return None


RANGE = Rule("ids in [0, vocab_size), labels -100 or an id",
             _fixed(Check(_ids_in_range, lambda rows, row: f"a token id outside [0, {rows.top})"),
                    Check(_labels_in_range, _said(f"a label that is neither {IGNORE} nor a token id"))),
             row=lambda rows: [f"a token id or label outside [0, {rows.top}) (labels: or {IGNORE})"])


def _negative(name: str, what: str) -> Rule:
    return Rule(f"{name} not negative", _fixed(Check(lambda rows: _first(rows.column(name) < 0), _said(what), row=False)))


def _spans_first(rows: _Rows) -> int | None:
    media, _ = rows.spans
    return _first(rows.span_bad, media) if len(rows.span_bad) else None


def _spans_outside(rows: _Rows) -> list[str]:
    return [f"media span {m['ref']} at {m['start']}+{m['length']} lies outside segment {m['segment']}"
            for m, bad in zip(rows.row["media"], rows.span_bad, strict=True) if bad]


SPANS = Rule("media spans inside their row (a packed row's: inside their segment)",
             _fixed(Check(_spans_first, _said("a media span outside its row"))), row=_spans_outside)


# ------------------------------------------------------------------ packed rows


def _cu_entries(rows: _Rows) -> int | None:
    return _first(rows.segments < 1)


def _cu_runs(rows: _Rows) -> int | None:
    cu, values, n = rows.lists("cu_seqlens"), rows.cu, rows.length
    first, last = values[cu.starts], values[cu.starts + cu.lengths - 1]
    inside = np.ones(len(values) - 1, bool)
    inside[(cu.starts + cu.lengths - 1)[:-1]] = False  # a row's last entry and the next row's first
    row = _first((first != 0) | (last != n))
    return _first(inside & (np.diff(values) <= 0), cu) if row is None else row


_CU = (Check(_cu_entries, _said("cu_seqlens with fewer than 2 entries")),
       Check(_cu_runs, _said("cu_seqlens that do not run from 0 up to n_tokens")))


def _shape_words(rows: _Rows) -> list[str]:
    """verify names a row's cu_seqlens first: the ids and labels are counted against what they bound."""
    if any(check.first(rows) is not None for check in _CU):
        return [f"cu_seqlens {rows.cu.tolist()[:8]}... must start at 0, increase and end at n_tokens {rows.row['n_tokens']}"]
    return TOKENS.row(rows)


SHAPE = Rule("one id and one label per token; cu_seqlens from 0, increasing, to n_tokens",
             _fixed(_lengths("input_ids"), _lengths("labels"), *_CU), row=_shape_words, stop=True)

MAX_LENGTH = Rule("n_tokens <= max_length", _fixed(Check(lambda rows: _first(rows.length > rows.max_length), None)),
                  row=lambda rows: [f"n_tokens {rows.row['n_tokens']} > max_length {rows.max_length}"])

# segment_* lists: each column's values a build writes (parents and groups earlier segments of the row)
# (segment_trained's: the rule over the stored counts)
_VALUES = {"segment_source": "count", "segment_line": "count", "segment_start": "count", "segment_parent": "parent",
           "segment_group": "group"}


def _entries(names: tuple[str, ...] | None, asked: tuple[str, ...]) -> Callable[[_Rows], Iterator[Check]]:
    """One entry per segment in each list of ``names`` (verify's, for a row; None: every ``segment_*`` column the
    rows hold, each with the values a build writes, the per-read check's), verify asking those of ``asked``."""

    def checks(rows: _Rows) -> Iterator[Check]:
        if names is not None and rows.batch is not None:
            return  # the per-read check asks every column in the rule over them all
        for name in [n for n in rows.names if n.startswith("segment_")] if names is None else names:
            if name not in rows.names:
                yield Check(lambda rows: 0, None)  # a row without the list: none of its entries
                continue
            if name == "segment_trained" and rows.batch is not None and not rows.lists(name).lengths.any():
                continue  # a build that stored no counts: the loader derives them
            yield Check(lambda rows, name=name: _first(rows.lists(name).lengths != rows.segments),
                        _said(f"{name} does not hold one entry per segment"), row=name in asked)
            if name in _VALUES and rows.batch is not None:
                yield Check(lambda rows, name=name: _bad_value(rows, name), _said(f"{name} holds a value no build writes"),
                            row=False)

    return checks


def _bad_value(rows: _Rows, name: str) -> int | None:
    lists = rows.lists(name)
    v = lists.numbers()
    if _VALUES.get(name, "count") == "count":
        return _first(v < 0, lists)
    own = np.arange(len(lists.values)) - np.repeat(lists.starts, lists.lengths)  # each segment's number in its row
    return _first((v < -1) | (v > own) | (v == own) if _VALUES[name] == "parent" else (v < 0) | (v > own), lists)


SEGMENT_LISTS = Rule("one entry per segment in each segment_* list", _entries(None, ("segment_ids", "segment_modality")),
                     row=lambda rows: ["segment_ids / segment_modality do not have one entry per segment"])


def _counted(rows: _Rows) -> bool:
    """Whether the stored counts can be compared: over a batch, every row's list one entry per segment (else the
    rule over the segment lists names it); one row read by verify is compared as it is."""
    if not rows.stores_trained:
        return False
    return rows.batch is None or not np.any(rows.lists("segment_trained").lengths != rows.segments)


def _trained_segments(rows: _Rows) -> int | None:
    if not _counted(rows):
        return None
    stored = rows.lists("segment_trained")
    if rows.batch is None and stored.lengths[0] != rows.segments[0]:
        return 0
    bad = np.flatnonzero(rows.counts != stored.numbers().astype(np.int64))
    return int(np.searchsorted(np.cumsum(rows.segments), bad[0], side="right")) if len(bad) else None


def _trained_rows(rows: _Rows) -> int | None:
    if not _counted(rows) or "n_trained" not in rows.names:
        return None if rows.batch is not None or not rows.stores_trained else 0
    labels = rows.lists("labels")
    stored = rows.column("n_trained")
    if rows.batch is None and stored[0] is None:
        return 0
    return _first(stored.astype(np.int64) != _sums(rows.supervised, labels.starts, labels.lengths))


def _trained_words(rows: _Rows) -> list[str]:
    row, counts = rows.row, rows.counts.tolist()
    return [f"segment_trained {list(row['segment_trained'])[:8]} / n_trained {row.get('n_trained')} differ from "
            f"the labels' supervised tokens {counts[:8]} / {sum(counts)} (the loss would be normalised wrong)"]


TRAINED = Rule("segment_trained / n_trained the labels' own counts (the loss denominators the collator reads)",
               _fixed(Check(lambda rows: _bad_value(rows, "segment_trained") if rows.stores_trained else None,
                            _said("segment_trained holds a value no build writes"), row=False),
                      Check(_trained_segments, _said("segment_trained / n_trained differ from the labels' supervised tokens")),
                      Check(_trained_rows, _said("segment_trained / n_trained differ from the labels' supervised tokens"))),
               row=_trained_words)


def _verify_only(what: str, problems: Callable[[_Rows], list[str]]) -> Rule:
    """A rule of the manifest's (placeholder ids, media kinds) or of the preference structure: verify asks it, row
    by row, and it words its problems itself (none where it holds); the per-read check does not."""
    return Rule(what, _fixed(), row=problems)


def _first_labels(rows: _Rows) -> list[str]:
    labels = rows.lists("labels").numbers()
    return (["a segment's first token has a label (it would be trained on the previous segment)"]
            if np.any(labels[rows.cu[:-1]] != IGNORE) else [])


def _placeholders_trained(rows: _Rows) -> list[str]:
    ids, labels = rows.lists("input_ids").numbers(), rows.lists("labels").numbers()
    return (["a placeholder / begin / end token is trained"]
            if np.any(labels[np.isin(ids, list(rows.placeholders))] != IGNORE) else [])


def _span_contents(rows: _Rows) -> list[str]:
    ids, out = rows.lists("input_ids").numbers(), []
    for m, bad in zip(rows.row["media"], rows.span_bad, strict=True):
        span = ids[m["start"] : m["start"] + m["length"]]
        pad = rows.kind_ids.get(m["kind"])
        if not bad and (pad is None or not len(span) or span[0] != pad or span[-1] != pad
                        or int((span == pad).sum()) != m["tokens"]):
            out.append(f"media span {m['ref']} does not start and end with the {m['kind']} placeholder or does not hold "
                       f"its {m['tokens']} placeholders")
    return out


def _pads_covered(rows: _Rows) -> list[str]:
    ids = rows.lists("input_ids").numbers()
    covered = np.zeros(len(ids), dtype=bool)
    for m, bad in zip(rows.row["media"], rows.span_bad, strict=True):
        if not bad:
            covered[m["start"] : m["start"] + m["length"]] = True
    pads = np.isin(ids, [v for v in rows.kind_ids.values() if v is not None])
    return ["a placeholder id lies outside every media span"] if np.any(pads & ~covered) else []


_TREE = ("segment_parent", "segment_group", "segment_role", "segment_weight")
TREE_LISTS = Rule("one entry per segment in each preference list", _entries(_TREE, _TREE), stop=True,
                  row=lambda rows: ["segment_parent / segment_group / segment_role / segment_weight do not have one "
                                    "entry per segment"])


def _tree_problems(rows: _Rows) -> list[str]:
    """The preference structure of a packed row (see the module docstring)."""
    row, cu = rows.row, rows.cu
    ids, labels = rows.lists("input_ids").numbers(), rows.lists("labels").numbers()
    n = len(cu) - 1
    parent, group, role = (row[k] for k in ("segment_parent", "segment_group", "segment_role"))
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


# ------------------------------------------------------------------ samples and plan entries (the per-read check only)


def _sample_trained(rows: _Rows) -> int | None:
    labels = rows.lists("labels")
    return _first(rows.column("n_trained").astype(np.int64) != _sums(rows.supervised, labels.starts, labels.lengths))


def _not_negative_or_nan(name: str) -> Rule:
    return Rule(f"{name} >= 0", _fixed(Check(lambda rows: _first(~(rows.column(name) >= 0)),  # NaN too
                                             _said(f"a negative or NaN {name}"), row=False)))


def _responses_first(rows: _Rows) -> int | None:
    responses = rows.lists("responses")
    if not len(responses.values):
        return None
    fields = dict(zip([f.name for f in responses.values.type], responses.values.flatten(), strict=True))
    start, length = (_ints(fields[k]) for k in ("start", "length"))
    of = np.repeat(np.arange(len(responses.lengths)), responses.lengths)
    return _first((start < 0) | (length < 1) | (start + length > rows.length[of]), responses)


def _plan_entries(rows: _Rows) -> int | None:
    samples, starts, lengths = (rows.lists(k) for k in ("samples", "starts", "lengths"))
    return _first((starts.lengths != samples.lengths) | (lengths.lengths != samples.lengths))


def _plan_values(rows: _Rows) -> Iterator[Check]:
    for name, low in (("samples", 0), ("starts", 0), ("lengths", 1)):
        yield Check(lambda rows, name=name, low=low: _first(rows.lists(name).numbers() < low, rows.lists(name)),
                    _said(f"a {name} entry no plan holds"), row=False)


RULES: dict[str, list[Rule]] = {  # per packer.kind of the schema metadata, in the order they are asked
    "packed": [
        _negative("n_tokens", "a negative n_tokens"), SHAPE, MAX_LENGTH, RANGE, TRAINED, SEGMENT_LISTS,
        _verify_only("labels -100 at every segment start", _first_labels),
        _verify_only("labels -100 on every placeholder / begin / end token", _placeholders_trained),
        SPANS,
        _verify_only("a media span starts and ends with its kind's placeholder and holds its tokens", _span_contents),
        _verify_only("no placeholder id outside a media span", _pads_covered),
        TREE_LISTS,
        _verify_only("the preference structure", _tree_problems),
    ],
    "samples": [
        _negative("length", "a negative length"), TOKENS, RANGE,
        Rule("n_trained the labels' own count",
             _fixed(Check(_sample_trained, _said("n_trained differs from the labels' supervised tokens"), row=False))),
        _negative("source_index", "a negative source_index"), _negative("source_line", "a negative source_line"),
        Rule("prefix inside the sample", _fixed(Check(lambda rows: _first((rows.prefix < 0) | (rows.prefix > rows.length)),
                                                      _said("a prefix outside the sample"), row=False))),
        *(_not_negative_or_nan(name) for name in ("cost_llm", "cost_encoder", "cost_supervised")),
        Rule("response spans inside the sample",
             _fixed(Check(_responses_first, _said("a response span outside the sample"), row=False))),
        SPANS,
    ],
    "plan": [
        Rule("one sample, start and length per segment",
             _fixed(Check(_plan_entries, _said("samples / starts / lengths do not have one entry per segment"), row=False))),
        Rule("no negative sample or start, no empty length", _plan_values),
    ],
}


def _nulls(batch: pa.RecordBatch) -> tuple[None, str] | None:
    """A build writes no null: one in a column (or in a list's values) is a damaged validity bitmap."""
    for field, column in zip(batch.schema, batch.columns, strict=True):
        values = column.values if pa.types.is_list(field.type) else None
        if not field.nullable and (column.null_count or (values is not None and values.null_count)):
            return None, f"nulls in {field.name}"
    return None


def batch_problem(batch: pa.RecordBatch, kind: str, vocab_size: int | None) -> tuple[int | None, str] | None:
    """The first problem of ``batch`` (a record batch of a shard of ``kind``: ``packed``, ``samples`` or ``plan``)
    as ``(row in the batch or None, what)``, or None: the rules of :data:`RULES` over the batch, in order, stopping at
    the first. Raises on shapes no build writes (the caller names them)."""
    problem = _nulls(batch)
    if problem is not None:
        return problem
    rows = _Rows(kind, batch=batch, vocab=vocab_size)
    for rule in RULES[kind]:
        for check in rule.checks(rows):
            if check.batch is None:
                continue
            row = check.first(rows)
            if row is not None:
                return row, check.batch(rows, row)
    return None


def packed_row_problems(row: dict, max_length: int, placeholders: set[int], kind_ids: dict[str, int | None],
                        vocab: int | None = None) -> list[str]:
    """Every problem of one packed row (a dict, as ``to_pylist`` gives it), each a message: the rules of
    :data:`RULES` run on the row, a rule's ``stop`` ending the list. ``placeholders`` every placeholder / begin /
    end id, ``kind_ids`` each media kind's placeholder id."""
    rows = _Rows("packed", row=row, vocab=vocab, max_length=max_length, placeholders=placeholders, kind_ids=kind_ids)
    out: list[str] = []
    for rule in RULES["packed"]:
        if rule.row is None:
            continue
        asked = [check for check in rule.checks(rows) if check.row]
        problems = rule.row(rows) if not asked or any(check.first(rows) is not None for check in asked) else []
        out += problems
        if problems and rule.stop:
            return out
    return out


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
