"""The step plan: which packed rows each data-parallel rank trains at each step, balanced on every
cost a row has at once (pure numpy).

A row costs a step three things (:meth:`packer.cost.CostModel.vector`): ``llm`` (its tokens and
attention pairs through the language model), ``encoder`` (its images, frames and clips through the
towers) and ``supervised`` (the tokens its loss counts, which weigh a rank's gradient). A rank that
draws the video rows waits for nobody but makes everybody wait; a rank of prompts and few answers
trains on a fraction of the others' tokens. Balancing total tokens (or one scalar cost) leaves both.

The plan of an epoch, for ``ranks`` x ``batch_size`` rows a step (a micro-step: with gradient
accumulation every micro-step is balanced, so their sums are too):

1. shuffle the rows (seed + epoch); pad to whole steps with rows from the start of that order, as
   ``DistributedSampler`` does (or drop the tail);
2. cut the order into windows of ``window`` steps; within a window, group the rows into steps of
   similar cost vectors: split the window's rows along the cost (each divided by its mean over all
   rows) they spread most in, at a whole number of steps, and recurse until a part is one step
   (a k-d tree whose leaves are steps);
3. at one row per rank, swap rows between neighbouring steps while that lowers the sum of their slowest ranks,
   then split each step with its nearest steps again toward the plan's worst cost, never slowing the simulated
   epoch (:mod:`packer.schedule.grouping`);
   deal each step's rows to the ranks, ``batch_size`` each: costliest first (by its largest cost
   relative to the step's mean rank), each to the rank with room whose worst cost after taking it
   is lowest; then swap rows between the worst rank and the others while that lowers the step's
   worst cost ratio;
4. shuffle the window's steps.

At one row per rank, step 3 can do nothing (any deal of one row each is as good as another): the
balance comes from step 2, and from rows that cost alike (:mod:`packer.pack` can cap a row's
encoder cost). ``window`` trades randomness for balance as in :mod:`packer.schedule.balance`; by default it is the
whole epoch: the plan is made offline, so its steps are shuffled over the epoch, but a step's rows are rows of
alike costs (at one row per rank that is the price of balance; a smaller window mixes them more).

Mixture stages (:class:`Stage`) change the sources' weights by step range without re-packing: the
rows of each stage's steps are drawn from each source's rows in proportion to the stage's weights
(each source's rows in a seeded order, a new order each time they run out), then planned as above
window by window.

:func:`measure` reports a plan per cost: Σ over steps of the slowest rank over Σ of the mean rank
(what the ranks wait, as :func:`packer.schedule.balance.imbalance` weighted), and the simulated step time,
Σ over steps of the slowest rank's ``llm + encoder``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from packer.errors import ArgumentError
from packer.schedule.balance import WINDOW, token_balanced
from packer.schedule.grouping import group, refine, regroup

SWAP_ROUNDS = 8  # improving swaps tried per step (each lowers the step's worst ratio, or the step is done)
MAX_PASSES = 1000  # a plan names at most this many passes over the build's rows (epochs, or stages' repeats)
MAX_SLOTS = 1 << 27  # and at most this many row slots (1 GiB as int64, a few times that while planning)


@dataclass(frozen=True)
class Stage:
    """Steps ``[start, end)`` draw their rows from the sources in proportion to ``weights`` (source name ->
    weight; a source left out gets none)."""

    start: int
    end: int
    weights: dict[str, float]


def normalized(costs: np.ndarray) -> np.ndarray:
    """``costs[n, k]`` divided by each cost's mean over the rows; a cost all zero is left out."""
    costs = np.asarray(costs, dtype=np.float64).reshape(len(costs), -1)
    mean = costs.mean(0) if len(costs) else np.zeros(costs.shape[1])
    keep = mean > 0
    return costs[:, keep] / mean[keep]


def deal(step: np.ndarray, costs: np.ndarray, ranks: int, per_rank: int) -> np.ndarray:
    """One step's rows as ``[ranks, per_rank]``, minimizing the step's worst ratio of a rank's cost to the mean
    rank's, over every cost (``costs`` normalized, indexed by row number)."""
    if per_rank == 1 or not costs.shape[1]:
        return step.reshape(ranks, per_rank) if per_rank > 1 else step.reshape(ranks, 1)
    c = costs[step]
    target = np.maximum(c.sum(0) / ranks, 1e-12)
    order = np.argsort(-(c / target).max(1), kind="stable")
    load = np.zeros((ranks, c.shape[1]))
    slots: list[list[int]] = [[] for _ in range(ranks)]
    for i in order.tolist():
        worst = ((load + c[i]) / target).max(1)
        worst[[len(s) >= per_rank for s in slots]] = np.inf
        r = int(np.argmin(worst))
        slots[r].append(i)
        load[r] += c[i]
    for _ in range(SWAP_ROUNDS):
        ratio = (load / target).max(1)
        a = int(np.argmax(ratio))
        best, move = ratio[a], None
        for b in range(ranks):
            if b == a:
                continue
            for i in slots[a]:
                for j in slots[b]:
                    delta = c[j] - c[i]
                    new = max(((load[a] + delta) / target).max(), ((load[b] - delta) / target).max())
                    if new < best - 1e-12:
                        best, move = new, (b, i, j)
        if move is None:
            break
        b, i, j = move
        slots[a][slots[a].index(i)], slots[b][slots[b].index(j)] = j, i
        load[a] += c[j] - c[i]
        load[b] += c[i] - c[j]
    return step[np.asarray(slots, dtype=np.int64)]


def plan_window(rows: np.ndarray, costs: np.ndarray, ranks: int, per_rank: int,
                rng: np.random.Generator | None, time: np.ndarray | None = None) -> np.ndarray:
    """``[steps, ranks, per_rank]`` of one window's rows (a multiple of ``ranks * per_rank``); ``time``: each row's
    simulated time (:func:`step_time`), which regrouping may not raise."""
    grouped = group(rows, costs, ranks * per_rank)
    if per_rank == 1 and costs.shape[1]:
        grouped = regroup(refine(grouped, costs), costs, time=time)
    steps = [deal(s, costs, ranks, per_rank) for s in grouped]
    if rng is not None:
        steps = [steps[k] for k in rng.permutation(len(steps))]
    return np.stack(steps) if steps else np.zeros((0, ranks, per_rank), np.int64)


def plan_steps(costs: np.ndarray, ranks: int, per_rank: int = 1, *, seed: int = 0, epoch: int = 0,
               window: int | None = None, shuffle: bool = True, drop_last: bool = False,
               accumulation: int = 1) -> np.ndarray:
    """``[steps, ranks, per_rank]`` row numbers of one epoch of rows whose costs are ``costs[n, k]`` (module doc);
    a pure function of its arguments. Every row once (``drop_last=False``: the last step completed with rows
    from the start of the epoch's order). ``window``: steps per grouping window, the whole epoch by default.

    ``accumulation`` > 1: the ranks wait for each other only at the optimizer step, every ``accumulation``
    micro-steps (DDP under ``no_sync``), so a rank's ``accumulation x per_rank`` rows of an optimizer step are
    balanced together and the result is in micro-steps (``[steps x accumulation, ranks, per_rank]``). Leave it 1
    under FSDP / ZeRO-3, which gather parameters at every micro-step: each is balanced then."""
    if accumulation < 1:
        raise ArgumentError(f"accumulation must be at least 1, got {accumulation}")
    if accumulation > 1:
        whole = plan_steps(costs, ranks, per_rank * accumulation, seed=seed, epoch=epoch, window=window,
                           shuffle=shuffle, drop_last=drop_last)
        return micro_steps(whole, accumulation)
    if window is None:  # 0 is refused below, not read as "the whole epoch"
        window = max(1, -(-len(costs) // (ranks * per_rank)))
    _check(ranks, per_rank, window)
    if seed < 0:
        raise ArgumentError(f"seed = {seed} is below 0: give a seed >= 0 (numpy's seeds are non-negative)")
    time, costs = step_time(costs), normalized(costs)
    n, per_step = len(costs), ranks * per_rank
    steps = n // per_step if drop_last else -(-n // per_step)
    rng = np.random.default_rng(seed + epoch)
    order = rng.permutation(n) if shuffle else np.arange(n)
    order = np.resize(order, steps * per_step) if n else np.zeros(0, np.int64)
    span = window * per_step
    parts = [plan_window(order[a : a + span], costs, ranks, per_rank, rng if shuffle else None, time)
             for a in range(0, len(order), span)]
    return np.concatenate(parts) if parts else np.zeros((0, ranks, per_rank), np.int64)


def step_time(costs: np.ndarray) -> np.ndarray:
    """Each row's simulated time: its ``llm + encoder`` cost (the first two of ``costs[n, k]``), what :func:`measure`'s
    ``time`` sums over each step's slowest rank."""
    costs = np.asarray(costs, dtype=np.float64).reshape(len(costs), -1)
    return costs[:, :2].sum(1)


def micro_steps(plan: np.ndarray, accumulation: int) -> np.ndarray:
    """``[steps, ranks, accumulation x b]`` as ``[steps x accumulation, ranks, b]``: each rank's rows of an optimizer
    step spread over its micro-steps in order."""
    steps, ranks, per = plan.shape
    b = per // accumulation
    return plan.reshape(steps, ranks, accumulation, b).transpose(0, 2, 1, 3).reshape(steps * accumulation, ranks, b)


def plan_stages(costs: np.ndarray, source: np.ndarray, names: list[str], stages: list[Stage], ranks: int,
                per_rank: int = 1, *, seed: int = 0, window: int | None = None) -> np.ndarray:
    """``[steps, ranks, per_rank]`` over the stages' steps (``stages`` consecutive from step 0): each stage's rows
    drawn from the sources (``source[n]`` indexes ``names``) by its weights, by largest remainder over the stage,
    each source's rows in a seeded order that starts again, reshuffled, when they run out; then planned window by
    window (the whole stage by default) as :func:`plan_steps` plans an epoch."""
    check_stages(stages, names)
    if window is None:  # the longest stage: each stage is planned whole
        window = max((s.end - s.start for s in stages), default=1)
    _check(ranks, per_rank, window)
    if seed < 0:
        raise ArgumentError(f"seed = {seed} is below 0: give a seed >= 0 (numpy's seeds are non-negative)")
    time, costs = step_time(costs), normalized(costs)
    source = np.asarray(source, np.int64)
    per_step = ranks * per_rank
    rng = np.random.default_rng([seed, 1])
    pools = [_Pool(np.flatnonzero(source == s), np.random.default_rng([seed, 2, s])) for s in range(len(names))]
    out = []
    for stage in stages:
        need = (stage.end - stage.start) * per_step
        weights = np.array([stage.weights.get(n, 0.0) for n in names], dtype=np.float64)
        weights[[not len(p.rows) for p in pools]] = 0.0
        if need and weights.sum() <= 0:
            have = {n: len(p.rows) for n, p in zip(names, pools, strict=True)}
            raise ArgumentError(f"stage {stage.start}-{stage.end}: none of its sources {sorted(stage.weights)} has rows "
                               f"(rows by source: {have}); weigh a source with rows")
        counts = _largest_remainder(need, weights)
        drawn = np.concatenate([pools[s].take(int(k)) for s, k in enumerate(counts)] or [np.zeros(0, np.int64)])
        drawn = drawn[rng.permutation(len(drawn))]
        span = window * per_step
        out += [plan_window(drawn[a : a + span], costs, ranks, per_rank, rng, time) for a in range(0, len(drawn), span)]
    return np.concatenate(out) if out else np.zeros((0, ranks, per_rank), np.int64)


def check_stages(stages: list[Stage], names: list[str], *, rows: int | None = None, per_step: int = 1) -> None:
    """Refuse stages that do not run consecutively from step 0 (a gap, an overlap, an empty or negative range), weigh
    a source the build lacks, or a weight that is not a finite number >= 0 (all zero: nothing to draw); with
    ``rows`` (the build's), stages that draw more than :func:`check_size` allows. :class:`ArgumentError`, naming the
    value, what was expected and the fix."""
    if not stages:
        raise ArgumentError("no stages: give at least one [[stages]] table (start, end, weights = {source = weight})")
    at = 0
    for s in stages:
        span = f"stage {s.start}-{s.end}"
        for key in ("start", "end"):
            value = getattr(s, key)
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
                raise ArgumentError(f"{span}: {key} = {value!r} is not a whole number of steps: give an integer")
        if s.start < 0 or s.end <= s.start:
            raise ArgumentError(f"stages must run consecutively from step 0, each at least one step: {span} is "
                               f"{'negative' if min(s.start, s.end) < 0 else 'empty'}; give end > start >= 0")
        if s.start != at:
            what = (f"steps {at}-{s.start} belong to no stage (a gap)" if s.start > at
                    else f"it overlaps the stage before, which ends at step {at}")
            raise ArgumentError(f"stages must run consecutively from step 0: {span} starts at step {s.start}, {what}; "
                               f"start it at step {at}")
        if not isinstance(s.weights, dict) or not s.weights:
            raise ArgumentError(f"{span} weighs no source: give weights = {{source = weight}} (sources: {names})")
        unknown = sorted(set(s.weights) - set(names))
        if unknown:
            import difflib
            import fnmatch

            hints = []
            for u in unknown:
                globbed = [n for n in names if fnmatch.fnmatchcase(n, u)]
                close = difflib.get_close_matches(u, names, n=1)
                if globbed:
                    hints.append(f"{u!r} is a glob over the sources {globbed}: weigh each by its name")
                elif close:
                    hints.append(f"{u!r}: did you mean {close[0]!r}?")
            hint = "; ".join(hints)
            raise ArgumentError(f"stage {s.start}-{s.end} weighs {unknown}, which are not sources of this build "
                               f"(sources: {names}; a source is named by its input entry exactly as the build's config "
                               f"lists it, a glob only where that entry is the glob){': ' + hint if hint else ''}")
        bad = {k: w for k, w in s.weights.items()
               if isinstance(w, bool) or not isinstance(w, (int, float, np.number)) or not np.isfinite(w) or w < 0}
        if bad:
            raise ArgumentError(f"stage {s.start}-{s.end}: weights must be >= 0 and finite, got {bad}; give each source a "
                               f"number >= 0 (0 or left out: none of its rows)")
        if not sum(s.weights.values()) > 0:
            raise ArgumentError(f"stage {s.start}-{s.end}: every weight is 0 ({s.weights}), so it draws no row; give at "
                               f"least one source a weight above 0")
        at = s.end
    if rows is not None:
        check_size(rows, per_step, at, what=f"the stages end at step {at:,}",
                   fix="end the last stage by step {steps:,} or build more rows")


def check_size(rows: int, per_step: int, steps: int, *, what: str, fix: str) -> None:
    """Refuse a plan of ``steps`` steps of ``per_step`` rows over a build of ``rows`` rows that names more than
    :data:`MAX_PASSES` passes over them or :data:`MAX_SLOTS` row slots (the plan is held in memory whole); ``fix``
    may name ``{steps}``, the most steps allowed."""
    limit = min(MAX_PASSES * rows, MAX_SLOTS)
    if steps * per_step > limit:
        most = limit // per_step
        raise ArgumentError(f"{what}: {steps * per_step:,} row slots ({per_step:,} a step), more than {limit:,} (at most "
                           f"{MAX_PASSES:,} passes over the build's {rows:,} rows and {MAX_SLOTS:,} slots in all, i.e. "
                           f"{most:,} steps); {fix.format(steps=most)}")


def check_settings(rows: int, ranks: int, per_rank: int = 1, *, accumulation: int = 1, seed: int = 0,
                   window: int | None = None, epochs: int = 1) -> None:
    """Refuse settings no plan of ``rows`` rows can have: ranks, rows per rank, accumulation or epochs below 1, a
    window below one step, a seed numpy cannot take (< 0), fewer rows than one whole step (a plan of nothing but
    padding), or a plan over :func:`check_size`'s bound. :class:`ArgumentError` with the value and the fix."""
    for name, value in (("ranks", ranks), ("batch_size", per_rank), ("accumulation", accumulation), ("epochs", epochs),
                        ("seed", seed), *([("window", window)] if window is not None else [])):
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
            raise ArgumentError(f"{name} = {value!r} is not an integer: give a whole number")
    for name, value, least, fix in (("ranks", ranks, 1, "the data-parallel world size"),
                                    ("batch_size", per_rank, 1, "rows per rank a step"),
                                    ("accumulation", accumulation, 1, "1 for no gradient accumulation"),
                                    ("epochs", epochs, 1, "epochs to plan"),
                                    ("seed", seed, 0, "numpy's seeds are non-negative"),
                                    ("window", window, 1, "steps per grouping window; None: the whole epoch")):
        if value is not None and value < least:
            raise ArgumentError(f"{name} = {value} is below {least}: give {name} >= {least} ({fix})")
    per_step = ranks * per_rank * accumulation
    if rows < per_step:
        most = rows // (per_rank * accumulation)
        at = f"batch size {per_rank}" + (f" and accumulation {accumulation}" if accumulation > 1 else "")
        fix = (f"use at most {most:,} ranks at {at}" if most
               else f"use batch size 1{' and accumulation 1' if accumulation > 1 else ''}")
        raise ArgumentError(f"{rows:,} rows make no whole step of {ranks:,} ranks x {per_rank:,} rows"
                           f"{f' x {accumulation} micro-steps' if accumulation > 1 else ''} ({per_step:,} rows a step): "
                           f"{fix}, or build more rows")
    steps = -(-rows // per_step) * accumulation
    check_size(rows, ranks * per_rank, steps * epochs, what=f"{epochs:,} epochs of {steps:,} steps",
               fix="plan fewer epochs, or let StepPlanSampler plan each epoch itself (plan=None)")


class _Pool:
    """A source's rows, handed out in a seeded order, reshuffled each time they run out."""

    def __init__(self, rows: np.ndarray, rng: np.random.Generator):
        self.rows, self.rng, self.order, self.at = rows, rng, rows[rng.permutation(len(rows))], 0

    def take(self, k: int) -> np.ndarray:
        out = []
        while k > 0:
            if self.at == len(self.order):
                self.order, self.at = self.rows[self.rng.permutation(len(self.rows))], 0
            got = self.order[self.at : self.at + k]
            out.append(got)
            self.at += len(got)
            k -= len(got)
        return np.concatenate(out) if out else np.zeros(0, np.int64)


def _largest_remainder(total: int, weights: np.ndarray) -> np.ndarray:
    share = total * weights / weights.sum() if weights.sum() > 0 else np.zeros_like(weights)
    counts = np.floor(share).astype(np.int64)
    counts[np.argsort(-(share - counts), kind="stable")[: total - int(counts.sum())]] += 1
    return counts


def _check(ranks: int, per_rank: int, window: int) -> None:
    if ranks < 1 or per_rank < 1:
        raise ArgumentError(f"a step needs at least one rank and one row a rank, got {ranks} x {per_rank}")
    if window < 1:
        raise ArgumentError(f"window must be at least one step, got {window}")


def measure(costs: np.ndarray, assignment: np.ndarray, names: tuple[str, ...] = ("llm", "encoder", "supervised"),
            accumulation: int = 1) -> dict[str, float]:
    """Per cost (``costs[n, k]`` in any units, named by ``names``), Σ over steps of the slowest rank / Σ of the mean
    rank (1.0 for a cost no row has); ``time``: Σ over steps of the slowest rank's ``llm + encoder`` (the first
    two costs), the simulated time of the plan. ``accumulation``: the ranks wait at every ``accumulation``
    micro-steps of ``assignment`` (a rank's load is its rows over them)."""
    costs = np.asarray(costs, dtype=np.float64).reshape(len(costs), -1)
    micro, ranks, per = assignment.shape
    steps = assignment.reshape(micro // accumulation, accumulation, ranks, per).transpose(0, 2, 1, 3)
    rows = steps.reshape(micro // accumulation, ranks, accumulation * per)
    load = costs[rows].sum(2)  # [steps, ranks, k]
    out = {}
    for k, name in enumerate(names[: costs.shape[1]]):
        mean = load[:, :, k].mean(1).sum()
        out[name] = float(load[:, :, k].max(1).sum() / mean) if mean > 0 else 1.0
    out["time"] = float(step_time(costs)[rows].sum(2).max(1).sum())
    return out


def absent_costs(costs: np.ndarray, stats: dict, *, note: str, fix: str) -> dict[str, str]:
    """The costs no row has (``costs[n, 3]`` as :data:`packer.cost.COSTS`), with why: :func:`measure` gives such a cost
    1.0, which would read as a perfect balance. The encoder where the rows hold no media (``stats["media_items"]``),
    or where the cost model charges none (``note``: which cost model and why it has no media terms, ``fix``: how to
    give one that has); supervised where no row has a trained token."""
    out = {}
    if not costs[:, 1].any():
        if not np.asarray(stats.get("media_items", 0)).any():
            out["encoder"] = "the build's rows hold no media"
        else:
            out["encoder"] = f"the cost model charges no media ({note}): {fix}"
    if not costs[:, 2].any():
        out["supervised"] = "no row has a trained token in its statistics"
    return out


def cost_note(manifest) -> str:
    """Why the build's cost model is what it is (its manifest's ``stats.cost_model.note``), for :func:`absent_costs`."""
    return (manifest.stats.get("cost_model") or {}).get("note") or "the build's cost model"


def random_steps(n: int, ranks: int, per_rank: int = 1, seed: int = 0) -> np.ndarray:
    """Whole steps of a random order of ``n`` rows (the tail that fills no step left out): no balancing at all."""
    per_step = ranks * per_rank
    return np.random.default_rng(seed).permutation(n)[: n // per_step * per_step].reshape(-1, ranks, per_rank)


def token_only(costs: np.ndarray, scalar: np.ndarray, ranks: int, per_rank: int = 1, *, seed: int = 0,
               epoch: int = 0, window: int = WINDOW) -> np.ndarray:
    """The plan :class:`~packer.loader.TokenBalancedSampler` makes from one scalar cost per row (tokens and
    attention): the baseline :func:`measure` compares against (:func:`packer.schedule.balance.token_balanced`)."""
    return token_balanced(np.asarray(scalar, np.float64), ranks, per_rank, seed=seed, epoch=epoch, window=window)
