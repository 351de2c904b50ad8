"""A few fixed row lengths (buckets) for compiled training. Pure: no I/O, no torch.

A compiled model, a CUDA graph or a shape-specialised kernel (FlashAttention-4's backward) is
built per input shape, so rows padded to their batch's longest length make a new shape almost
every step. Padding every row to ``max_length`` gives one shape and wastes the tail rows'
padding; ``k`` lengths chosen from the planned rows bound the shapes at ``k`` and waste the
least padding any ``k`` lengths can::

    rows' tokens   4090 4071 3998 4087 2210 4096 1030 3977      (capacity 4096, k = 3, multiple 64)
    lengths        1088 2240 4096       each row padded to the smallest length that holds it
    padding        345 tokens, against 5,209 for one length of 4096

The lengths are multiples of ``multiple`` (kernels like aligned shapes), the largest holds the
longest row, and among such choices they minimise the total padding (dynamic programming over
the distinct candidate lengths, exact; tests compare it with brute force).
"""

from __future__ import annotations

import numpy as np

from packer.config.fields import ROW_LENGTHS_AUTO, parse_row_lengths

MULTIPLE = 64  # row lengths are multiples of this (or the capacity itself)
DEFAULT_COUNT = ROW_LENGTHS_AUTO  # lengths chosen by ``auto``


def bucket_of(tokens: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """Index of the smallest length holding each row (``lengths`` sorted ascending)."""
    return np.searchsorted(np.asarray(lengths), np.asarray(tokens), side="left")


def padding(tokens: np.ndarray, lengths: np.ndarray) -> int:
    """Padding tokens when each row is padded to the smallest of ``lengths`` that holds it."""
    tokens = np.asarray(tokens, np.int64)
    return int((np.asarray(lengths, np.int64)[bucket_of(tokens, lengths)] - tokens).sum()) if len(tokens) else 0


def choose_lengths(tokens, k: int, capacity: int, multiple: int = MULTIPLE) -> np.ndarray:
    """At most ``k`` lengths (ascending, multiples of ``multiple`` up to ``capacity``) minimising the padding of
    ``tokens`` (each row padded to the smallest length that holds it)."""
    tokens = np.asarray(tokens, np.int64)
    if k < 1:
        raise ValueError(f"the number of row lengths must be at least 1, got {k}")
    if len(tokens) == 0:
        return np.asarray([capacity], np.int64)
    if tokens.max() > capacity:
        raise ValueError(f"a row of {int(tokens.max())} tokens is over the capacity {capacity}")
    # Candidate lengths: each row's length rounded up to the multiple (capped at the capacity); a best
    # choice only ever uses these (lowering any other length to the next candidate saves padding).
    cands = np.unique(np.minimum(-(-tokens // multiple) * multiple, capacity))
    m = len(cands)
    if m <= k:
        return cands
    counts = np.bincount(np.searchsorted(cands, np.minimum(-(-tokens // multiple) * multiple, capacity)), minlength=m)
    sums = np.bincount(np.searchsorted(cands, np.minimum(-(-tokens // multiple) * multiple, capacity)), weights=tokens,
                       minlength=m)
    n_before = np.concatenate([[0], np.cumsum(counts)])  # rows in candidates [0, j)
    s_before = np.concatenate([[0.0], np.cumsum(sums)])
    # cost(i, j): rows of candidates i..j padded to cands[j]
    i = np.arange(m)[:, None]
    j = np.arange(m)[None, :]
    cost = np.where(i <= j, cands[None, :] * (n_before[j + 1] - n_before[i]) - (s_before[j + 1] - s_before[i]), np.inf)
    best = cost[0].copy()  # best[j]: candidates 0..j covered by one length, the last at cands[j]
    choice = [np.full(m, -1)]
    for _ in range(1, k):
        # best'[j] = min(best[j], min_{p<j} best[p] + cost(p+1, j))
        prev = np.where(np.arange(m)[:, None] < np.arange(m)[None, :], best[:, None] + np.vstack([cost[1:], np.full((1, m),
                        np.inf)]), np.inf)
        arg = np.argmin(prev, axis=0)
        val = prev[arg, np.arange(m)]
        take = val < best
        best = np.where(take, val, best)
        choice.append(np.where(take, arg, -1))
    # walk back from the last candidate (the longest row must be held)
    lengths, j = [int(cands[-1])], m - 1
    for step in range(k - 1, 0, -1):
        p = choice[step][j]
        if p < 0:
            continue
        lengths.append(int(cands[p]))
        j = int(p)
    return np.asarray(sorted(lengths), np.int64)


def parse(spec: str, capacity: int) -> tuple[int | None, np.ndarray | None]:
    """``auto`` / ``auto:K`` -> (K, None); ``N,N,...`` -> (None, the lengths, ``capacity`` added when the
    largest is smaller: every row must fit one); empty -> (None, None). The spec's grammar is the config's
    (:func:`packer.config.fields.parse_row_lengths`, which checks it when the config is made)."""
    k, lengths = parse_row_lengths(spec, capacity)
    return k, None if lengths is None else np.asarray(lengths, np.int64)
