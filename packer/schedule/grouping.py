"""Which rows share a step (pure numpy): the grouping of :func:`packer.schedule.steps.plan_steps`, its costs
normalized (each divided by its mean over the rows, so that 1 is a mean row on every cost).

A plan's figure per cost is Σ over steps of the slowest rank / Σ of the mean rank, and its worst figure is the
plan's. Σ of the mean rank is fixed; at one row per rank a step's slowest rank on a cost is its costliest row on it,
so only which rows share a step counts, and a step of rows alike on every cost wastes little.

- :func:`group`: a k-d split of the rows along the widest cost at a whole number of steps, recursed until a part
  is one step: steps of alike rows, in decreasing cost.
- :func:`refine`: swaps of two rows between neighbouring steps while a swap lowers the sum over costs of the two
  steps' slowest ranks.
- :func:`regroup`: many rows moved at once, toward the plan's worst cost. Each step and the steps nearest it in
  cost (their costliest rows) are split again (:func:`split`: the k-d split choosing the cost and the cut, costs
  weighted toward the plan's worst figure) and refined; the new steps are kept where the plan's worst figure falls
  (or stays and the sum of its figures falls) and the simulated epoch (Σ over steps of the slowest rank's
  ``llm + encoder``) stays no slower than the k-d split's.

Why the last. :func:`group` and :func:`refine` lower the three costs' sum and stop where no swap of two rows lowers
it. On a mix with long tails of trained tokens and of encoder work (a video-heavy mix) that leaves the encoder and
supervised figures a few percent above the llm's, and no swap of two rows moves waste from one cost to another:
one step's better grouping on the worst cost needs rows of several steps. On the held-out-like set of
docs/BENCHMARKS.md (``bench/bench_steps.py``, its held-out-like table, no row budget) the worst figure falls from
1.037-1.065 to 1.026-1.057, for 0.1-0.2 s more a plan of 1,200 rows; a plan of 10^5 rows at 8 x 1 takes 7 s
instead of 2 (:data:`SPLITS` bounds the search).
"""

from __future__ import annotations

import numpy as np

NEAR = 8  # steps split together: a step and its 7 nearest in cost
PASSES = 2  # passes of regroup over the steps, each step once the centre of its neighbourhood
SPLITS = 4096  # and at most this many neighbourhoods split in all (about 1 ms each): the costliest steps' first
SHARPNESS = 50.0  # a cost's weight in regroup's splits: exp(SHARPNESS x (its figure - the plan's worst figure))


def group(rows: np.ndarray, costs: np.ndarray, per_step: int) -> list[np.ndarray]:
    """``rows`` (a multiple of ``per_step`` of them) as steps of rows of similar ``costs`` (normalized rows of
    costs, indexed by row number): a k-d split along the widest cost at a whole number of steps."""
    return _kd(rows, costs, per_step, _widest_middle)


def split(rows: np.ndarray, costs: np.ndarray, per_step: int) -> list[np.ndarray]:
    """``rows`` (a multiple of ``per_step``) as steps: cut in two along the cost and at the cut (a whole number of
    steps, a quarter to three quarters of them) that leave the two parts the least Σ over costs of their range
    times their steps (the waste their steps will hold), recursed until a part is one step."""
    return _kd(rows, costs, per_step, _least_waste)


def _kd(rows: np.ndarray, costs: np.ndarray, per_step: int, cut_of) -> list[np.ndarray]:
    """``rows`` cut in two by ``cut_of(c, steps) -> (order, cut)`` (``c``: the part's costs; the part sorted by
    ``order``, its first ``cut`` steps one side), recursed until a part is one step; steps in the first side's
    order first (decreasing cost)."""
    out: list[np.ndarray] = []
    stack = [rows]
    while stack:
        part = stack.pop()
        steps = len(part) // per_step
        if steps <= 1 or not costs.shape[1]:
            out.extend(part.reshape(-1, per_step))
            continue
        order, cut = cut_of(costs[part], steps)
        part = part[order]
        cut *= per_step
        stack.extend([part[cut:], part[:cut]])  # popped first side first
    return out


def _widest_middle(c: np.ndarray, steps: int) -> tuple[np.ndarray, int]:
    """Along the cost of the widest range, half the steps each side."""
    d = int(np.argmax(c.max(0) - c.min(0)))
    return np.argsort(-c[:, d], kind="stable"), steps // 2


def _least_waste(c: np.ndarray, steps: int) -> tuple[np.ndarray, int]:
    """Along the cost and at the cut (a quarter to three quarters of the steps) of the least Σ over costs of each
    side's range times its steps."""
    per_step = len(c) // steps
    cuts = np.arange(max(1, steps // 4), min(steps - 1, -(-3 * steps // 4)) + 1)
    best: tuple[float, np.ndarray, int] = (np.inf, np.arange(len(c)), int(cuts[0]))
    for d in range(c.shape[1]):
        order = np.argsort(-c[:, d], kind="stable")
        s = c[order]
        head = (np.maximum.accumulate(s) - np.minimum.accumulate(s))[cuts * per_step - 1].sum(1)
        tail = (np.maximum.accumulate(s[::-1]) - np.minimum.accumulate(s[::-1]))[::-1][cuts * per_step].sum(1)
        score = head * cuts + tail * (steps - cuts)
        k = int(np.argmin(score))
        if score[k] < best[0]:
            best = (float(score[k]), order, int(cuts[k]))
    return best[1], best[2]


def refine(steps: list[np.ndarray], costs: np.ndarray, passes: int = 4) -> list[np.ndarray]:
    """At one row per rank: swap rows between neighbouring steps (alike after :func:`group`) while a swap lowers the
    sum over costs of the two steps' slowest ranks -- what Σ slowest / Σ mean measures, the mean being fixed."""
    steps = [s.copy() for s in steps]
    for _ in range(passes):
        changed = False
        for k in range(len(steps) - 1):
            a, b = steps[k], steps[k + 1]
            ca, cb = costs[a], costs[b]
            now = ca.max(0).sum() + cb.max(0).sum()
            # every swap (i of a, j of b) at once: a without i (top two per cost) plus b's j, and the other way
            top_a, top_b = _without(ca), _without(cb)
            new_a = np.maximum(top_a[:, None, :], cb[None, :, :])  # [i, j, cost]
            new_b = np.maximum(top_b[None, :, :], ca[:, None, :])
            total = new_a.sum(2) + new_b.sum(2)
            i, j = np.unravel_index(int(np.argmin(total)), total.shape)
            if total[i, j] < now - 1e-9:
                a[i], b[j] = b[j], a[i]
                changed = True
        if not changed:
            break
    return steps


def _without(c: np.ndarray) -> np.ndarray:
    """``[i, cost]``: each cost's maximum over the rows of ``c`` but row i."""
    order = np.argsort(-c, axis=0, kind="stable")
    first = c[order[0], np.arange(c.shape[1])]
    second = c[order[1], np.arange(c.shape[1])] if len(c) > 1 else np.full(c.shape[1], -np.inf)
    return np.where(np.arange(len(c))[:, None] == order[0][None, :], second[None, :], first[None, :])


def regroup(steps: list[np.ndarray], costs: np.ndarray, near: int = NEAR, passes: int = PASSES,
            splits: int = SPLITS, time: np.ndarray | None = None) -> list[np.ndarray]:
    """At one row per rank (module doc): each step in turn with its ``near - 1`` nearest steps (L1 between their
    costliest rows) split again by :func:`split` and refined, the costs weighted toward the plan's worst figure;
    kept where the plan's worst figure falls, or stays and the sum of its figures falls, and Σ over steps of the
    slowest row's ``time`` (each row's, indexed by row number: :func:`packer.schedule.steps.step_time`) stays at
    most what it was. Neighbourhoods in decreasing waste on the weighted costs, one split each until something in
    them changes; at most ``splits`` splits. The steps keep their places; deterministic."""
    if len(steps) < 2 or not costs.shape[1]:
        return steps
    plan = np.stack(steps)
    per_step = plan.shape[1]
    top = costs[plan].max(1)  # [steps, cost]: each step's slowest rank
    mean = costs[plan.reshape(-1)].sum(0) / per_step  # Σ over steps of the mean rank, per cost
    total = top.sum(0)
    time = np.zeros(costs.shape[0]) if time is None else time
    slowest = time[plan].max(1)  # [steps]: each step's simulated time
    limit = slowest.sum() * (1 + 1e-9)  # the plan's simulated time may not rise above the first grouping's
    spent = slowest.sum()
    version = np.zeros(len(plan), np.int64)  # a step's contents: changed when regrouped
    tried: set[tuple[int, ...]] = set()  # neighbourhoods split to no gain, as (step, version) pairs
    budget = splits
    for _ in range(passes):
        changed = False
        figure = total / mean
        weight = np.exp(SHARPNESS * (figure - figure.max()))
        waste = ((per_step * top - costs[plan].sum(1)) * weight).sum(1)  # [steps]: what a step's ranks wait
        for s in np.argsort(-waste, kind="stable").tolist():
            distance = np.abs(top - top[s]).sum(1)
            here = np.sort(np.argpartition(distance, near - 1)[:near] if near < len(plan) else np.arange(len(plan)))
            key = tuple(here.tolist() + version[here].tolist())
            if key in tried:
                continue
            if budget == 0:
                return list(plan)
            budget -= 1
            rows = plan[here].reshape(-1)
            figure = total / mean
            weighted = costs[rows] * np.exp(SHARPNESS * (figure - figure.max()))  # indexed by place in rows
            new = rows[np.stack(refine(split(np.arange(len(rows)), weighted, per_step), weighted, passes=2))]
            new_top, new_slowest = costs[new].max(1), time[new].max(1)
            after = total - top[here].sum(0) + new_top.sum(0)
            later = spent - slowest[here].sum() + new_slowest.sum()
            if _better(after / mean, figure) and later <= limit:
                plan[here], top[here], slowest[here], total, spent = new, new_top, new_slowest, after, later
                version[here] += 1
                changed = True
            else:
                tried.add(key)
        if not changed:
            break
    return list(plan)


def _better(a: np.ndarray, b: np.ndarray) -> bool:
    """Figures ``a`` better than ``b``: a lower worst, or the same worst and a lower sum."""
    return bool(a.max() < b.max() - 1e-12 or (a.max() <= b.max() + 1e-12 and a.sum() < b.sum() - 1e-12))
