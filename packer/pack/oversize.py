"""Oversize policies: what becomes of a sample longer than the capacity. Pure.

Each sample becomes zero or more *segments* ``(sample, start, length)``:

- ``error``:    refuse (the default of :func:`packer.pack.plan` on raw lengths);
- ``drop``:     no segment; counted as dropped (``oversize``);
- ``truncate``: one segment, the first ``capacity`` tokens, cut *before* a protected
  span (a media item's placeholders) rather than through it;
- ``split``:    consecutive pieces of at most ``capacity`` tokens, each cut before a
  protected span that would straddle it; each piece is its own segment.

A segment must keep a trained token after its first one (a segment's first token is
never trained); a sample left with none is dropped (``nothing_trainable``). A protected
span longer than the capacity can never fit: ``media_over_capacity``.

A split piece never trains on text about media it does not hold. Text after a media
item is about it, text before it is not; so a piece is kept only if it holds every
media span of its sample that starts before the piece ends. The media do not travel
with the text: a piece that fails the rule is left out and counted (``pieces_lost_media``,
``split_lost_media`` in the build stats), and a sample left with no piece because of it
is dropped as ``split_lost_media``. Since cuts never go through a span, the rule keeps
exactly the pieces that start at or before the sample's first media span: every piece
after the one that holds the first media item is lost. Text-only samples keep all their
pieces.

Example, capacity 4, sample of 10 tokens with an image at 3..5 (``I``)::

    tokens    t t t I I I t t t t
    truncate  [t t t]                      cut at 3, before the image
    split     [t t t] [I I I t] (t t t)    pieces of 3 and 4 kept; the last piece
                                           talks about the image it lacks: lost
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

POLICIES = ("error", "drop", "truncate", "split")


@dataclass
class Segments:
    sample: np.ndarray  # int64 [m]
    start: np.ndarray  # int64 [m]
    length: np.ndarray  # int64 [m]
    dropped: dict[str, np.ndarray] = field(default_factory=dict)
    truncated: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    split: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    truncated_tokens: int = 0
    pieces_dropped: int = 0  # split pieces with nothing to train, left out
    pieces_lost_media: int = 0  # trainable split pieces left out: they follow a media span they do not hold
    identity: bool = False  # segment k is sample k, whole (nothing was over capacity)


def _safe_end(start: int, end: int, spans: np.ndarray) -> int:
    """Move ``end`` back to the start of any span it would cut."""
    for s, n in spans:
        if s < end < s + n and s >= start:
            end = s
    return end


def _holds_media(start: int, end: int, spans: np.ndarray) -> bool:
    """True if ``[start, end)`` holds every span that starts before ``end``."""
    before = spans[spans[:, 0] < end]
    return bool(np.all(before[:, 0] >= start) and np.all(before.sum(axis=1) <= end))


def _trainable(trained: np.ndarray | None, start: int, end: int) -> bool:
    return end - start >= 2 if trained is None else bool(np.any(trained[start + 1 : end]))


def resolve(lengths: np.ndarray, capacity: int, policy: str, *, protected: dict[int, np.ndarray] | None = None,
            trained: dict[int, np.ndarray] | None = None) -> Segments:
    """Segments for every sample; only samples over ``capacity`` are looked at closely.

    ``protected[i]`` is an ``(m, 2)`` array of ``(start, length)`` spans of sample ``i``
    that must not be cut; ``trained[i]`` its bool mask of trained tokens. Both are
    optional and only consulted for samples over the capacity.
    """
    if policy not in POLICIES:
        raise ValueError(f"unknown oversize policy {policy!r}; known: {', '.join(POLICIES)}")
    lengths = np.asarray(lengths, np.int64)
    over = np.flatnonzero(lengths > capacity)
    if over.size == 0:
        n = len(lengths)
        return Segments(np.arange(n, dtype=np.int64), np.zeros(n, np.int64), lengths, identity=True)
    if policy == "error":
        i = int(over[0])
        raise ValueError(
            f"sample {i} is too long ({lengths[i]} > {capacity}); apply an oversize policy "
            f"(truncate, split, drop) or raise the capacity"
        )
    protected, trained = protected or {}, trained or {}
    keep = np.ones(len(lengths), dtype=bool)
    keep[over] = False
    extra_sample, extra_start, extra_length = [], [], []
    dropped: dict[str, list[int]] = {}
    truncated, split, truncated_tokens, pieces_dropped, pieces_lost_media = [], [], 0, 0, 0
    for i in over.tolist():
        spans = np.asarray(protected.get(i, np.zeros((0, 2))), np.int64).reshape(-1, 2)
        mask = trained.get(i)
        if policy == "drop":
            dropped.setdefault("oversize", []).append(i)
            continue
        if np.any(spans[:, 1] > capacity):
            dropped.setdefault("media_over_capacity", []).append(i)
            continue
        pieces, lost = [], 0
        start = 0
        while start < lengths[i]:
            end = _safe_end(start, min(start + capacity, int(lengths[i])), spans)
            if not _trainable(mask, start, end):
                pieces_dropped += policy == "split"
            elif policy == "split" and not _holds_media(start, end, spans):
                lost += 1
            else:
                pieces.append((start, end - start))
            if policy == "truncate":
                break
            start = end
        pieces_lost_media += lost
        if not pieces:
            dropped.setdefault("split_lost_media" if lost else "nothing_trainable", []).append(i)
            continue
        if policy == "truncate":
            truncated.append(i)
            truncated_tokens += int(lengths[i]) - pieces[0][1]
        else:
            split.append(i)
        for s, n in pieces:
            extra_sample.append(i)
            extra_start.append(s)
            extra_length.append(n)
    base = np.flatnonzero(keep)
    sample = np.concatenate([base, np.asarray(extra_sample, np.int64)])
    start = np.concatenate([np.zeros(len(base), np.int64), np.asarray(extra_start, np.int64)])
    length = np.concatenate([lengths[base], np.asarray(extra_length, np.int64)])
    return Segments(
        sample, start, length,
        dropped={r: np.asarray(v, np.int64) for r, v in sorted(dropped.items())},
        truncated=np.asarray(truncated, np.int64), split=np.asarray(split, np.int64),
        truncated_tokens=truncated_tokens, pieces_dropped=pieces_dropped, pieces_lost_media=pieces_lost_media,
    )
