"""The planner's entry point: lengths in, a CSR plan of bins out. Pure: no I/O, no torch.

    >>> p = plan([5, 3, 4, 4], capacity=8, order="planner")
    >>> [p.bin(b).tolist() for b in range(p.n_bins)]
    [[0, 1], [2, 3]]
    >>> p.lower_bound, p.efficiency
    (2, 1.0)

The whole dataset is planned at once (no windows). Options, all keyword-only:

- ``algorithm``: a name from :data:`ALGORITHMS` (``bfd``, ``ffd``, ``shuffle``, ``next-fit``).
- ``oversize``: ``error`` | ``drop`` | ``truncate`` | ``split`` (see :mod:`packer.pack.oversize`),
  with ``protected`` spans and ``trained`` masks for the samples over capacity.
- ``max_segments``: most samples per row.
- ``media`` + ``max_media``: per-sample item counts by kind (``{"image": counts}``) and
  per-row caps by kind, or ``"total"`` for all kinds together.
- ``resources`` + ``budgets``: per-sample float costs by name (``{"encoder": costs}``) and per-row budgets
  (:data:`RESOURCE_UNITS` below): a row's total stays within each budget. A sample over a budget on its own is
  still placed, never dropped (``Plan.over_budget``): it takes its row's whole budget, so only samples without
  that resource share its row.
- ``group_by``: a label per sample (e.g. its modality); every row holds one label only.
  (To mix groups with a limit instead, leave ``group_by`` out and cap the media kinds.)
- ``row_key``: a family's row constraint (:meth:`packer.families.Family.row_key`): an int per sample, -1 where
  the sample mixes with anything; a row holds samples of one key at most (LLaVA-OneVision: videos of one frame
  count). Each key's samples are packed into rows of their own, then each such row is one item, at most one a
  row (a resource capped at 1), that the keyless samples fill around, best fit: a keyless sample still goes into
  any row, so the rows stay near the token lower bound.
- ``order``: ``shuffle`` (seeded, the default) | ``sequential`` (rows by their earliest
  sample: source order, for curricula) | ``planner`` (algorithm order) |
  ``longest-first`` (the costliest row, by tokens then attention work, first; then shuffled).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

import numpy as np

from packer.pack import _small
from packer.pack.oversize import resolve
from packer.pack.registry import ALGORITHMS, Constraints, check_supported

ORDERS = ("shuffle", "sequential", "planner", "longest-first")
# A float resource is packed as whole units of budget / RESOURCE_UNITS, each sample's need rounded *up*, so no
# row ever exceeds its budget (a row is refused a sample that would fit by under a unit: at most 1/32 of it).
RESOURCE_UNITS = 128


@dataclass(frozen=True)
class Plan:
    """Bins in CSR layout: bin ``b`` holds segments ``offsets[b]:offsets[b+1]``.

    Segment ``k`` is tokens ``starts[k] : starts[k] + lengths[k]`` of sample
    ``indices[k]`` (a whole sample unless it was truncated or split).
    """

    offsets: np.ndarray  # int64 [n_bins + 1]
    indices: np.ndarray  # int64 [n_placed], sample numbers
    starts: np.ndarray  # int64 [n_placed]
    lengths: np.ndarray  # int64 [n_placed]
    capacity: int
    dropped: dict[str, np.ndarray] = field(default_factory=dict)  # sample numbers by reason
    truncated: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    split: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    truncated_tokens: int = 0
    pieces_dropped: int = 0
    pieces_lost_media: int = 0  # split pieces left out: they follow a media span they do not hold
    over_budget: dict[str, np.ndarray] = field(default_factory=dict)  # samples over a resource budget alone, by name
    resource_bound: int = 0  # no packing within the budgets uses fewer rows (:func:`resource_bound`); 0: no budget
    cap_bound: int = 0  # no packing within max_segments and the media caps uses fewer rows (:func:`cap_bound`)
    budgets: dict[str, float] = field(default_factory=dict)  # the per-row resource budgets the plan honours
    # rows planned apart by source policy (packer.stages.planning.plan_sources): each group's rows, tokens, capacity
    # and lower bound; the plan's bound and fill are then the groups' (a group's rows never take another's samples)
    groups: tuple[dict, ...] = ()

    @property
    def n_bins(self) -> int:
        return len(self.offsets) - 1

    @property
    def tokens(self) -> int:
        return int(self.lengths.sum())

    @property
    def lower_bound(self) -> int:
        """No packing of these segments uses fewer bins: L1 = ceil(placed tokens / capacity), or more where
        ``max_segments`` or a media cap needs more (``cap_bound``: 10 images at ``max_media={"image": 2}`` take 5
        rows however short); summed over the ``groups`` of a plan by source policy, each at its own capacity."""
        if self.groups:
            return groups_bound_and_fill(self.groups, self.tokens)[0]
        return max(-(-self.tokens // self.capacity), self.cap_bound)

    @property
    def bound(self) -> int:
        """The lower bound the plan is measured against: ``max(lower_bound, resource_bound)``."""
        return max(self.lower_bound, self.resource_bound)

    @property
    def efficiency(self) -> float:
        """Placed tokens / (bins x capacity), each group's rows at its own capacity."""
        if self.groups:
            return groups_bound_and_fill(self.groups, self.tokens)[1]
        return self.tokens / max(1, self.n_bins * self.capacity)

    def bin(self, b: int) -> np.ndarray:
        return self.indices[self.offsets[b] : self.offsets[b + 1]]

    def bin_tokens(self) -> np.ndarray:
        """Tokens in each bin, int64 [n_bins]."""
        if not self.n_bins:
            return np.zeros(0, np.int64)
        return np.add.reduceat(self.lengths, self.offsets[:-1])

    def bin_attention(self) -> np.ndarray:
        """Sum of squared segment lengths per bin: block-diagonal attention work."""
        if not self.n_bins:
            return np.zeros(0)
        return np.add.reduceat(self.lengths.astype(np.float64) ** 2, self.offsets[:-1])

    def reorder(self, order: np.ndarray) -> Plan:
        """The same bins in another order (``order`` is a permutation of bin numbers)."""
        order = np.asarray(order, np.int64)
        offsets = np.zeros(len(order) + 1, np.int64)
        np.cumsum(np.diff(self.offsets)[order], out=offsets[1:])
        if len(self.indices) < _small.SMALL:
            reorder_values = _small.reorder_values
            moved = {k: reorder_values(self.offsets, offsets, order, getattr(self, k)) for k in ("indices", "lengths")}
        else:
            from packer.pack._bits import reorder_pair, reorder_values

            moved = dict(zip(("indices", "lengths"), reorder_pair(self.offsets, offsets, order, self.indices,
                                                                  self.lengths), strict=True))
        # Whole samples start at 0: keep the (untouched, lazily allocated) zeros rather than copy them.
        starts = reorder_values(self.offsets, offsets, order, self.starts) if self.starts.any() else self.starts
        return dataclasses.replace(self, offsets=offsets, starts=starts, **moved)


def plan(lengths, capacity: int, *, algorithm: str = "bfd", seed: int = 0, order: str = "shuffle",
         oversize: str = "error", protected: dict[int, np.ndarray] | None = None,
         trained: dict[int, np.ndarray] | None = None, max_segments: int | None = None,
         media: dict[str, np.ndarray] | None = None, max_media: dict[str, int] | None = None,
         group_by: np.ndarray | None = None, row_key: np.ndarray | None = None,
         resources: dict[str, np.ndarray] | None = None, budgets: dict[str, float] | None = None) -> Plan:
    """Pack samples of the given ``lengths`` into bins of ``capacity`` tokens."""
    lengths = _check_lengths(lengths)
    if capacity < 1:
        raise ValueError(f"capacity must be at least 1, got {capacity}")
    if algorithm not in ALGORITHMS:
        raise ValueError(f"unknown packing algorithm {algorithm!r}; known: {', '.join(sorted(ALGORITHMS))}")
    if order not in ORDERS:
        raise ValueError(f"unknown row order {order!r}; known: {', '.join(ORDERS)}")
    spec = ALGORITHMS[algorithm]
    need, caps, names = _media_needs(len(lengths), media, max_media)
    n_media = len(caps)  # the media columns come first, the budgeted resources (if any) after them
    r_need, r_caps, r_names, over_budget, r_bound = _resource_needs(len(lengths), resources, budgets)
    if len(r_caps):
        need, caps, names = np.hstack([need, r_need]), np.concatenate([caps, r_caps]), (*names, *r_names)
    constraints = Constraints(int(max_segments or 0), need, caps, names)
    check_supported(algorithm, constraints.used())
    if max_segments is not None and max_segments < 1:
        raise ValueError(f"max_segments must be at least 1, got {max_segments}")

    segs = resolve(lengths, capacity, oversize, protected=protected, trained=trained)
    dropped = dict(segs.dropped)
    if len(caps):
        over_cap = np.any(need[segs.sample] > caps, axis=1)
        if over_cap.any():
            dropped["over_media_cap"] = np.unique(segs.sample[over_cap])
            keep = ~np.isin(segs.sample, dropped["over_media_cap"])
            segs.sample, segs.start, segs.length = segs.sample[keep], segs.start[keep], segs.length[keep]
            segs.identity = False
    seg_constraints = constraints.subset(segs.sample)
    media_names = names[:n_media]
    bound = cap_bound(len(segs.length), int(max_segments or 0),
                      dict(zip(media_names, need[segs.sample, :n_media].sum(axis=0).tolist(), strict=True)),
                      dict(zip(media_names, caps[:n_media].tolist(), strict=True)))

    fn = spec.load()
    placed = None  # the segments' lengths in bin order, when the algorithm gives them (no gather needed)
    keys = None if row_key is None else np.asarray(row_key, np.int64)[segs.sample]
    if keys is not None and len(np.unique(keys[keys >= 0])) < 2:  # one key (or none): nothing to keep apart
        keys = None
    if group_by is None and keys is None:
        bins = fn(segs.length, capacity, seed=seed, constraints=seg_constraints)
        offsets, take = np.asarray(bins[0], np.int64), np.asarray(bins[1], np.int64)
        placed = np.asarray(bins[2], np.int64) if len(bins) > 2 else None
    else:  # one independent packing per group (row keys honoured inside each), bins concatenated
        groups = np.unique(np.asarray(group_by)[segs.sample], return_inverse=True)[1] if group_by is not None \
            else np.zeros(len(segs.length), np.int64)
        offsets_parts, members = [np.zeros(1, np.int64)], []
        for g in range(int(groups.max()) + 1 if len(groups) else 0):
            idx = np.flatnonzero(groups == g)
            offs, indices = _keyed(spec, segs.length[idx], capacity, seed + g, seg_constraints.subset(idx),
                                   None if keys is None else keys[idx])
            offsets_parts.append(np.asarray(offs[1:], np.int64) + sum(len(m) for m in members))
            members.append(idx[np.asarray(indices, np.int64)])
        offsets = np.concatenate(offsets_parts)
        take = np.concatenate(members) if members else np.zeros(0, np.int64)
    if segs.identity:  # no sample was cut: segment k is sample k, whole
        indices, starts = take, np.zeros(len(take), np.int64)
    else:
        indices, starts = segs.sample[take], segs.start[take]
    result = Plan(offsets, indices, starts, segs.length[take] if placed is None else placed, capacity,
                  dropped, segs.truncated, segs.split, segs.truncated_tokens, segs.pieces_dropped,
                  pieces_lost_media=segs.pieces_lost_media, over_budget=over_budget, resource_bound=r_bound,
                  budgets=dict(budgets or {}), cap_bound=bound)
    _check_plan(result)
    return _ordered(result, order, seed)


def _keyed(spec, lengths: np.ndarray, capacity: int, seed: int, constraints: Constraints,
           keys: np.ndarray | None) -> tuple[np.ndarray, np.ndarray]:
    """Bins (offsets, indices) of items whose rows may hold one ``keys`` value at most (-1: any row): each key's
    items packed alone, each of those rows then one item (at most one a row: an extra resource capped at 1) that
    the keyless items fill around. An algorithm that takes no resource caps packs the keyless items apart."""
    fn = spec.load()
    if keys is None or not (keys >= 0).any():
        return tuple(np.asarray(x, np.int64) for x in fn(lengths, capacity, seed=seed, constraints=constraints)[:2])
    free = np.flatnonzero(keys < 0)
    groups: list[np.ndarray] = []  # the members of each keyed row
    for k, key in enumerate(np.unique(keys[keys >= 0]).tolist()):
        idx = np.flatnonzero(keys == key)
        offs, ind = fn(lengths[idx], capacity, seed=seed + k, constraints=constraints.subset(idx))[:2]
        ind = idx[np.asarray(ind, np.int64)]
        groups += [ind[a:b] for a, b in zip(offs[:-1], offs[1:], strict=True)]
    if "max_media" not in spec.supports:  # keyed rows as they are, the keyless items in rows of their own
        parts = list(groups)
        if len(free):
            offs, ind = fn(lengths[free], capacity, seed=seed, constraints=constraints.subset(free))[:2]
            parts += [free[np.asarray(ind, np.int64)[a:b]] for a, b in zip(offs[:-1], offs[1:], strict=True)]
        return _csr(parts)
    n_rows = len(groups)
    need = constraints.need_for(len(lengths))
    row_need = np.stack([need[g].sum(axis=0) for g in groups]) if need.shape[1] else np.zeros((n_rows, 0), np.int64)
    count = np.concatenate([[len(g) for g in groups], np.ones(len(free), np.int64)])
    exclusive = np.concatenate([np.ones(n_rows, np.int64), np.zeros(len(free), np.int64)])
    columns = [np.concatenate([row_need, need[free]]), exclusive[:, None]]
    caps = [constraints.caps, [1]]
    names = (*constraints.names, "row_key")
    if constraints.max_segments:  # a keyed row is one item but holds several segments
        columns.append(count[:, None])
        caps.append([constraints.max_segments])
        names = (*names, "segments")
    items = Constraints(0, np.concatenate(columns, axis=1), np.concatenate(caps).astype(np.int64), names)
    item_lengths = np.concatenate([[int(lengths[g].sum()) for g in groups], lengths[free]]).astype(np.int64)
    offs, ind = fn(item_lengths, capacity, seed=seed, constraints=items)[:2]
    members = [*groups, *([i] for i in free)]
    ind = np.asarray(ind, np.int64)
    return _csr([np.concatenate([members[i] for i in ind[a:b]]) for a, b in zip(offs[:-1], offs[1:], strict=True)])


def _csr(rows: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    offsets = np.concatenate([[0], np.cumsum([len(r) for r in rows])]).astype(np.int64)
    return offsets, (np.concatenate(rows).astype(np.int64) if rows else np.zeros(0, np.int64))


def _check_lengths(lengths) -> np.ndarray:
    lengths = np.asarray(lengths)
    if lengths.ndim != 1 or (lengths.size and not np.issubdtype(lengths.dtype, np.integer)):
        raise ValueError(f"lengths must be a 1-D integer array, got shape {lengths.shape} dtype {lengths.dtype}")
    lengths = lengths.astype(np.int64, copy=False)
    if lengths.size and lengths.min() < 1:
        raise ValueError(f"sample {int(np.argmin(lengths))} has length {lengths.min()}; lengths must be >= 1")
    return lengths


def _media_needs(n: int, media: dict[str, np.ndarray] | None, max_media: dict[str, int] | None):
    if not max_media:
        return np.zeros((n, 0), np.int64), np.zeros(0, np.int64), ()
    media = media or {}
    columns, caps, names = [], [], []
    for kind, cap in sorted(max_media.items()):
        if cap is None:
            continue
        if cap < 0:
            raise ValueError(f"max_media[{kind!r}] must be >= 0, got {cap}")
        if kind == "total":
            col = sum((np.asarray(v, np.int64) for v in media.values()), np.zeros(n, np.int64))
        elif kind in media:
            col = np.asarray(media[kind], np.int64)
        else:
            raise ValueError(f"max_media caps {kind!r} but media has no {kind!r} counts (has: {', '.join(media) or 'none'})")
        if col.shape != (n,):
            raise ValueError(f"media counts for {kind!r} must have one entry per sample ({n}), got shape {col.shape}")
        columns.append(col)
        caps.append(int(cap))
        names.append(kind)
    if not columns:
        return np.zeros((n, 0), np.int64), np.zeros(0, np.int64), ()
    return np.stack(columns, axis=1), np.asarray(caps, np.int64), tuple(names)


def _resource_needs(n: int, resources: dict[str, np.ndarray] | None, budgets: dict[str, float] | None):
    """Integer needs of the budgeted resources (units of budget / RESOURCE_UNITS, rounded up; a sample over the
    budget alone needs every unit), their caps, names, the samples over each budget, and the rows bound."""
    empty = (np.zeros((n, 0), np.int64), np.zeros(0, np.int64), (), {}, 0)
    if not budgets:
        return empty
    resources = resources or {}
    columns, names, over, bound = [], [], {}, 0
    for name, budget in sorted(budgets.items()):
        if not budget or budget <= 0 or not np.isfinite(budget):
            raise ValueError(f"budgets[{name!r}] must be a positive number, got {budget}")
        if name not in resources:
            raise ValueError(f"budgets name {name!r} but resources has no {name!r} costs (has: {', '.join(resources) or 'none'})")
        cost = np.asarray(resources[name], np.float64)
        if cost.shape != (n,) or (n and (not np.isfinite(cost).all() or cost.min() < 0)):
            raise ValueError(f"resources[{name!r}] must be one finite cost >= 0 per sample ({n}), got shape {cost.shape}")
        # exact multiples stay; a cost over twice the budget counts as twice it (cost / budget may pass float64's range)
        with np.errstate(over="ignore"):
            units = np.ceil(np.minimum(cost / budget, 2.0) * RESOURCE_UNITS - 1e-9).astype(np.int64)
        above = units > RESOURCE_UNITS
        over[name] = np.flatnonzero(above)
        columns.append(np.minimum(units, RESOURCE_UNITS))
        names.append(name)
        bound = max(bound, resource_bound(cost, budget))
    return (np.stack(columns, axis=1), np.full(len(columns), RESOURCE_UNITS, np.int64), tuple(names),
            {k: v for k, v in over.items() if len(v)}, bound)


def groups_bound_and_fill(groups: tuple[dict, ...] | list[dict], tokens: int) -> tuple[int, float]:
    """``(lower bound, fill)`` of rows planned apart by policy group (:attr:`Plan.groups`, the manifest's
    ``stats.policy_groups``): the groups' bounds summed, and ``tokens`` over the rows' room, each group's rows at its
    own capacity. The plan, the manifest and the summary all state them from here."""
    room = sum(int(g["rows"]) * int(g["capacity"]) for g in groups)
    return sum(int(g["lower_bound"]) for g in groups), tokens / max(1, room)


def cap_bound(items: int, max_segments: int, held: dict[str, int], caps: dict[str, int]) -> int:
    """Rows no packing of ``items`` goes below under ``max_segments`` (0: no limit) and the per-row ``caps`` of the
    media ``held`` (by kind, as :func:`plan` takes them: ``total`` counts every kind): ``ceil(items / max_segments)``
    and, per cap, ``ceil(held / cap)``: 10 images at a cap of 2 a row need 5 rows however short their text.
    0 when nothing is capped (the token bound is then the only one)."""
    bound = -(-items // max_segments) if max_segments > 0 else 0
    for kind, cap in caps.items():
        if cap > 0:
            bound = max(bound, -(-int(held.get(kind, 0)) // cap))
    return int(bound)


def resource_bound(cost: np.ndarray, budget: float) -> int:
    """Rows no packing within ``budget`` goes below: each sample over the budget takes a row's whole budget (its
    row shares none), the others need ``ceil(Σ cost / budget)`` rows between them at least."""
    cost = np.asarray(cost, np.float64)
    above = cost > budget
    return int(above.sum()) + int(np.ceil(cost[~above].sum() / budget - 1e-9))


def _check_plan(p: Plan) -> None:
    """Cheap guards every plan must pass, whatever algorithm made it."""
    sizes = np.diff(p.offsets)
    if p.offsets[0] != 0 or np.any(sizes < 1) or p.offsets[-1] != len(p.indices):
        raise AssertionError("planner produced a malformed CSR layout")
    if p.n_bins and p.bin_tokens().max() > p.capacity:
        raise AssertionError("planner overfilled a bin")


def _ordered(p: Plan, order: str, seed: int) -> Plan:
    if order == "planner" or p.n_bins < 2:
        return p
    if order == "sequential":  # rows by their earliest sample: source order, for curricula
        return p.reorder(np.argsort(np.minimum.reduceat(p.indices, p.offsets[:-1]), kind="stable"))
    perm = np.random.default_rng(seed).permutation(p.n_bins)
    if order == "longest-first":
        tokens, attention = p.bin_tokens(), p.bin_attention()
        first = int(np.lexsort((attention, tokens))[-1])  # most tokens, then most attention work
        perm = np.concatenate([[first], perm[perm != first]])
    return p.reorder(perm)


NO_ENCODER_COST = "no sample has an encoder cost"  # stats' row_budget ``none`` where no budget could apply


def budget_applied(row_budget: dict | None) -> bool:
    """Whether stats' ``row_budget`` holds a budget the rows were planned under (the build's or a source group's):
    ``auto`` (the default) applies none where no sample has an encoder cost or each budget would add a row."""
    return bool(row_budget) and (row_budget.get("budget") is not None or bool(row_budget.get("group_budgets")))
