"""Cost-balanced assignment of packed rows to data-parallel ranks (pure numpy).

Used by the samplers at training time and by the report to show the imbalance they
remove, so both compute exactly the same assignment.

Two levels. :func:`balance` splits one global step's rows over the ranks (equal counts,
longest processing time first); with one row per rank it can do nothing, since any split
of one row each is as good as another. :func:`group_steps` decides which rows share a
step: within a window of ``window`` steps of shuffled rows, it sorts the rows by cost and
cuts them into consecutive steps, so a step's rows cost about the same; then it shuffles
the window's steps. ``window=1`` is plain random steps; a larger window is more balance
and less randomness (rows meet rows of similar cost; the order still spans the epoch).
:func:`token_balanced` is the whole token-only plan of an epoch (shuffle, pad, group, balance).
:func:`imbalance` measures a plan; :func:`imbalance_floor` is a floor no plan of the same
rows goes below (the optimum at one row per rank), so what is left above 1 can be told
apart as the sampler's or the data's.

Worked example, 2 ranks x 1 row, window of 2 steps, costs of the shuffled rows::

    shuffled  [9, 1, 8, 2]   random steps: (9, 1) (8, 2) -> max / mean 1.8, 1.6
    window    sorted 9 8 2 1 -> steps (9, 8) (2, 1) -> 1.06, 1.33, order shuffled
"""

from __future__ import annotations

import numpy as np


def balance(items: np.ndarray, costs: np.ndarray, ranks: int, per_rank: int) -> np.ndarray:
    """Split ``items`` (len = ranks * per_rank) into ``[ranks, per_rank]``, each rank
    the same count, greedily by cost (longest processing time first: the costliest
    item goes to the rank with the lowest load that still has room)."""
    order = items[np.argsort(-costs, kind="stable")]
    cost_sorted = np.sort(costs, kind="stable")[::-1]
    load = np.zeros(ranks)
    filled = np.zeros(ranks, dtype=np.int64)
    out = np.empty((ranks, per_rank), dtype=items.dtype)
    for item, c in zip(order.tolist(), cost_sorted.tolist(), strict=True):
        open_ranks = np.flatnonzero(filled < per_rank)
        r = open_ranks[np.argmin(load[open_ranks])]
        out[r, filled[r]] = item
        filled[r] += 1
        load[r] += c
    return out


def group_steps(order: np.ndarray, costs: np.ndarray, ranks: int, per_rank: int, window: int,
                rng: np.random.Generator | None = None) -> np.ndarray:
    """``[steps, ranks, per_rank]`` from ``order`` (row numbers, len a multiple of
    ``ranks * per_rank``; ``costs`` indexed by row number): windows of ``window`` steps,
    each sorted by cost (costliest first) and cut into consecutive steps, every step split
    over the ranks by :func:`balance`; the steps of a window shuffled with ``rng`` (kept in
    order when ``rng`` is None). ``window=1`` balances within the given random steps only."""
    per_step = ranks * per_rank
    if len(order) % per_step:
        raise ValueError(f"{len(order)} rows are not whole steps of {ranks} x {per_rank}")
    if window < 1:
        raise ValueError(f"window must be at least one step, got {window}")
    steps = []
    span = window * per_step
    for start in range(0, len(order), span):
        rows = order[start : start + span]
        if window > 1:
            rows = rows[np.argsort(-costs[rows], kind="stable")]
        block = [balance(s, costs[s], ranks, per_rank) for s in rows.reshape(-1, per_step)]
        if rng is not None and window > 1:
            block = [block[k] for k in rng.permutation(len(block))]
        steps.extend(block)
    return np.stack(steps) if steps else np.zeros((0, ranks, per_rank), dtype=order.dtype)


WINDOW = 64  # steps per sorting window of the token-only plan: see TokenBalancedSampler and docs/BENCHMARKS.md


def token_balanced(costs: np.ndarray, ranks: int, per_rank: int = 1, *, seed: int = 0, epoch: int = 0,
                   window: int = WINDOW, steps: int | None = None, shuffle: bool = True) -> np.ndarray:
    """``[steps, ranks, per_rank]`` row numbers: the token-only plan of an epoch from one scalar cost per row,
    what :class:`~packer.loader.TokenBalancedSampler` follows and ``packer steps`` measures its plan against.

    The rows in a random order (seed + epoch; row order when not ``shuffle``), repeated from the start to fill
    ``steps`` whole steps (default: every row, the last step padded), then :func:`group_steps` with the same
    generator shuffling each window's steps. One function for both, so the baseline is the sampler's plan."""
    n, per_step = len(costs), ranks * per_rank
    steps = -(-n // per_step) if steps is None else steps
    rng = np.random.default_rng(seed + epoch)
    order = rng.permutation(n) if shuffle else np.arange(n)
    order = np.resize(order, steps * per_step)  # repeats from the start to pad
    return group_steps(order, costs, ranks, per_rank, window, rng if shuffle else None)


def imbalance(costs: np.ndarray, assignment: np.ndarray, weighted: bool = False) -> float:
    """Mean over steps of (slowest rank / mean rank) for ``assignment[steps, ranks, per_rank]``;
    ``weighted``: Σ slowest / Σ mean instead, the epoch's time against a perfectly balanced one.

    The weighted figure is the one that measures ranks waiting: the time lost is Σ (slowest -
    mean) = (weighted - 1) x the balanced epoch's time. The mean over steps weighs a near-free
    step of cheap rows (where a ratio of 2 costs almost nothing) as much as an expensive one."""
    load = costs[assignment].sum(-1)
    if weighted:
        return float(load.max(1).sum() / max(load.mean(1).sum(), 1e-12))
    return float(np.mean(load.max(1) / np.maximum(load.mean(1), 1e-12)))


def imbalance_floor(costs: np.ndarray, ranks: int, per_rank: int = 1) -> float:
    """The lowest ``imbalance(..., weighted=True)`` (Σ slowest rank / Σ mean rank) that any
    assignment of these rows (all of them, len a multiple of ``ranks * per_rank``) into steps of
    ``ranks`` x ``per_rank`` can reach: exact at one row per rank, a lower bound above it.

    Why. Σ of the step means is Σ costs / ``ranks`` whatever the assignment, so only Σ of the
    slowest ranks can move. Sort the costs c_1 >= c_2 >= ... and let P = ranks * per_rank; in any
    assignment, order the steps by their costliest row, m_1 >= m_2 >= ... The (k-1)P + 1
    costliest rows do not fit in k - 1 steps, so one of them is in a step j >= k:
    m_k >= m_j >= c_((k-1)P+1). A step's slowest rank carries at least its costliest row (and
    at least the step's mean), so Σ slowest >= max(Σ_k c_((k-1)P+1), Σ costs / ranks).
    At one row per rank a rank's load is its row, and cutting the sorted rows into consecutive
    steps (:func:`group_steps` with a window of the whole epoch) makes m_k = c_((k-1)P+1): the
    bound is attained, so it is the optimum. With more rows per rank a load is a sum of rows
    (even the best split of one step is a partition problem) and the bound may not be attained."""
    per_step = ranks * per_rank
    if len(costs) % per_step:
        raise ValueError(f"{len(costs)} rows are not whole steps of {ranks} x {per_rank}")
    c = np.sort(np.asarray(costs, dtype=np.float64))[::-1]
    return float(max(1.0, c[::per_step].sum() / max(c.sum() / ranks, 1e-12)))
