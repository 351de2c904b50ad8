"""Preference records as planner items, and the segments they become. Pure numpy, no I/O.

A preference sample holds each response's whole conversation one after the other (``starts``,
``lengths``: its responses' token ranges) and ``prefix``, the tokens every response starts
with (:mod:`packer.encode.preference`). The planner places it as **one item** that is never
split across rows, of its length in the build's layout:

- ``pairs``: each response whole, one segment each, adjacent: ``sum(lengths)`` tokens;
- ``tree``: the shared prompt once (``prefix`` tokens, a segment of its own), then each
  response's remaining tokens as a branch: ``sum(lengths) - (k - 1) * prefix`` tokens.

A single response (an unpaired ``completion`` + ``label``) is one segment in both layouts.
:func:`expand` turns a plan of items into a plan of those segments (token ranges of the
sample, in order), and :func:`structure` gives each segment of a packed row its parent, its
group and which response it is.

Example, two responses of 9 and 12 tokens sharing 6 (``P`` the prompt, ``a`` / ``b`` the rest)::

    responses   P P P P P P a a a | P P P P P P b b b b b b     starts [0, 9], lengths [9, 12], prefix 6
    pairs       [0, 9) [9, 21)                                  2 segments, 21 tokens
    tree        [0, 6) [6, 9) [15, 21)                          prompt + 2 branches, 15 tokens (6 saved)
    stored      P P P P P P a a a b b b b b b                   the prompt once (15 tokens), media spans once

Token ranges (``starts``, the plan's segments) count the responses whole, one after the other, as
above; the sample *stores* the shared prompt once, then each response's remaining tokens
(:func:`stored_ranges` maps one onto the other), so a record of ``k`` responses costs its tokens,
not ``k`` copies of its prompt.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from packer._ranges import concat_ranges, csr_offsets

LAYOUTS = ("pairs", "tree")
PROMPT = -1  # structure()'s response number of a tree's prompt
PLAIN = -2  # ... of a segment that is no preference record's


@dataclasses.dataclass(frozen=True)
class Responses:
    """The preference samples of a build: ``sample[j]`` has ``n[j]`` responses, its response ``r`` at
    tokens ``starts[off[j] + r] : + lengths[off[j] + r]`` of the sample, sharing ``prefix[j]`` tokens."""

    sample: np.ndarray  # int64 [m], sorted
    n: np.ndarray  # int64 [m]
    prefix: np.ndarray  # int64 [m]
    starts: np.ndarray  # int64 [sum n]
    lengths: np.ndarray  # int64 [sum n]

    @property
    def off(self) -> np.ndarray:
        return csr_offsets(self.n)

    def item_lengths(self, layout: str) -> np.ndarray:
        """Each preference sample's tokens in ``layout``."""
        if layout not in LAYOUTS:
            raise ValueError(f"unknown preference layout {layout!r}; known: {', '.join(LAYOUTS)}")
        total = np.add.reduceat(self.lengths, self.off[:-1]) if len(self.n) else np.zeros(0, np.int64)
        return total - (self.n - 1) * self.prefix if layout == "tree" else total

    def segments(self, layout: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``(count, starts, lengths)``: each preference sample's segments in ``layout`` (CSR by ``count``)."""
        if layout not in LAYOUTS:
            raise ValueError(f"unknown preference layout {layout!r}; known: {', '.join(LAYOUTS)}")
        tree = (self.n > 1) & (layout == "tree")
        count = self.n + tree
        starts, lengths = self.starts.copy(), self.lengths.copy()
        owner = np.repeat(np.arange(len(self.n)), self.n)
        cut = tree[owner]
        starts[cut] += self.prefix[owner[cut]]
        lengths[cut] -= self.prefix[owner[cut]]
        first = self.off[:-1][tree]  # a tree's prompt goes before its first branch
        starts = np.insert(starts, first, 0)
        lengths = np.insert(lengths, first, self.prefix[tree])
        return count, starts, lengths


def expand(indices: np.ndarray, offsets: np.ndarray, starts: np.ndarray, lengths: np.ndarray, responses: Responses,
           layout: str) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """A plan's bins (``offsets`` over the plan's segments: sample ``indices``, each from ``starts`` for
    ``lengths`` tokens; a split sample's pieces start past 0) with each preference sample's item replaced
    by its segments: ``(offsets, indices, starts, lengths)`` per segment. Other segments keep their own."""
    count, seg_starts, seg_lengths = responses.segments(layout)
    pos = np.searchsorted(responses.sample, indices)
    pos = np.minimum(pos, max(len(responses.sample) - 1, 0))
    hit = (responses.sample[pos] == indices) if len(responses.sample) else np.zeros(len(indices), bool)
    per = np.where(hit, count[pos] if len(count) else 1, 1)
    new_indices = np.repeat(indices, per)
    new_starts = np.repeat(np.asarray(starts, np.int64), per)
    new_lengths = np.repeat(np.asarray(lengths, np.int64), per)
    at = csr_offsets(per)
    seg_off = csr_offsets(count)
    where = concat_ranges(at[:-1][hit], per[hit])
    taken = concat_ranges(seg_off[:-1][pos[hit]], per[hit])
    new_starts[where] = seg_starts[taken]
    new_lengths[where] = seg_lengths[taken]
    bins = np.add.reduceat(per, offsets[:-1]) if len(offsets) > 1 and len(per) else np.zeros(len(offsets) - 1, np.int64)
    return csr_offsets(bins), new_indices, new_starts, new_lengths


def structure(seg_sample: np.ndarray, seg_start: np.ndarray, seg_length: np.ndarray, row_offsets: np.ndarray,
              info: dict[int, tuple[int, np.ndarray, np.ndarray]]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per segment of packed rows (``row_offsets``: CSR of segments per row): ``(parent, group, response)``.

    ``info[sample] = (prefix, response starts, response lengths)`` for the preference samples among
    ``seg_sample``. ``parent`` and ``group`` are segment numbers within the row (-1: no parent);
    ``response`` is the response's number, :data:`PROMPT` for a tree's prompt, :data:`PLAIN` for a
    segment of another record. A record's segments are consecutive (one item); its group starts at
    its first segment (the one at the sample's token 0)."""
    n = len(seg_sample)
    parent = np.full(n, -1, np.int64)
    group = np.arange(n, dtype=np.int64)
    response = np.full(n, PLAIN, np.int64)
    row_start = np.repeat(row_offsets[:-1], np.diff(row_offsets))
    lookup: dict[int, tuple[dict, dict]] = {}  # sample -> ({(start, length): response}, same for branches)
    leader = prompt = -1
    for j in range(n):
        sample = int(seg_sample[j])
        entry = info.get(sample)
        if entry is None:
            continue
        prefix, starts, lengths = entry
        if sample not in lookup:  # each response found by its range in O(1): a record may have 10^4 segments
            pairs = list(zip(starts.tolist(), lengths.tolist(), strict=True))
            lookup[sample] = ({}, {})
            for r, (a, m) in reversed(list(enumerate(pairs))):  # the first response of a range wins, as before
                lookup[sample][0][a, m] = r
                lookup[sample][1][a + prefix, m - prefix] = r
        whole, branch = lookup[sample]
        s, m = int(seg_start[j]), int(seg_length[j])
        if s == 0:  # a record's first segment: its tree prompt, or its first response
            leader = j
            prompt = -1
        if s == 0 and len(starts) > 1 and m == prefix:
            response[j], prompt = PROMPT, j
        elif prompt >= 0 and (s, m) in branch:
            response[j], parent[j] = branch[s, m], prompt - row_start[j]
        elif (s, m) in whole:
            response[j] = whole[s, m]
        else:
            raise ValueError(f"segment {j} (tokens {s}:{s + m} of sample {sample}) is no response of it")
        group[j] = leader
    return parent, group - row_start, response


def stored_ranges(seg_start: np.ndarray, seg_length: np.ndarray, starts: np.ndarray, lengths: np.ndarray,
                  prefix: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Where tokens ``seg_start : + seg_length`` (ranges over the responses whole, each inside one response) of a
    preference sample lie in its stored tokens (the ``prefix`` shared tokens once, then each response's rest):
    ``(head_start, head_length, rest_start, rest_length)``, the part in the shared prompt then the response's own.

    >>> [x.tolist() for x in stored_ranges(np.array([9, 15]), np.array([12, 6]), np.array([0, 9]), np.array([9, 12]), 6)]
    [[0, 6], [6, 0], [9, 9], [6, 6]]
    """
    seg_start, seg_length = np.asarray(seg_start, np.int64), np.asarray(seg_length, np.int64)
    starts, lengths = np.asarray(starts, np.int64), np.asarray(lengths, np.int64)
    k = np.searchsorted(starts, seg_start, "right") - 1
    rest_at = prefix + csr_offsets(lengths - prefix)[:-1]  # where response k's own tokens are stored
    a = seg_start - starts[k]
    b = a + seg_length
    head = np.clip(np.minimum(b, prefix) - a, 0, None)
    own = np.maximum(a, prefix)
    return a, head, rest_at[k] + own - prefix, np.clip(b - own, 0, None)


def response_row(row: dict, k: int) -> dict:
    """Response ``k`` of a preference sample's row (``input_ids``, ``labels`` when present, ``media``, ``responses``,
    ``prefix``) as the row of that conversation alone: its tokens whole, and its media spans (the prompt's)."""
    spans = row["responses"]
    starts = np.array([r["start"] for r in spans], np.int64)
    lengths = np.array([r["length"] for r in spans], np.int64)
    prefix = int(row["prefix"]) if len(spans) > 1 else 0
    head_at, head, rest_at, rest = (int(x[0]) for x in stored_ranges(starts[k : k + 1], lengths[k : k + 1], starts,
                                                                      lengths, prefix))
    out = {"media": [dict(m) for m in row["media"] if m["start"] + m["length"] <= int(lengths[k])]}
    for column in ("input_ids", "labels"):
        if column in row:
            values = np.asarray(row[column])
            out[column] = np.concatenate([values[head_at : head_at + head], values[rest_at : rest_at + rest]])
    return out
