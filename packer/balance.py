"""Equal-count, cost-balanced assignment of items to ranks (pure numpy).

Used by the samplers at training time and by the report to show the imbalance they
remove, so both compute exactly the same assignment.
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


def imbalance(costs: np.ndarray, assignment: np.ndarray) -> float:
    """Mean over steps of (slowest rank / mean rank) for ``assignment[steps, ranks, per_rank]``."""
    load = costs[assignment].sum(-1)
    return float(np.mean(load.max(1) / np.maximum(load.mean(1), 1e-12)))
