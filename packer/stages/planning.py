"""Stage 2: plan. The samples' lengths (and a few attributes) in, ``plan.arrow`` out.

The driver holds a few columns per sample (:func:`plan_columns`: length, input file,
line, modality, media counts, cost vector; 64 bytes a sample), which each stage-1 task returns with its
result, so the samples shards themselves are not read to plan (a remote build's would be
downloaded). Samples over ``max_length`` are the only rows read in full
(:class:`SampleRows`): their media spans (never cut through; a split piece that follows a
span it does not hold is left out, ``split_lost_media``) and label masks (a piece with
nothing to train is left out) feed the oversize policy of :func:`packer.pack.plan`.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from packer._ranges import csr_offsets
from packer.config.fields import BuildConfig
from packer.cost import COSTS
from packer.errors import ConfigError
from packer.pack import Plan, cap_bound, plan
from packer.pack.trees import Responses, expand
from packer.shards.schema import IGNORE, MEDIA_KINDS, PLAN_SCHEMA
from packer.stages.mix import Mix, mix


def plan_columns(samples: pa.Table) -> pa.Table:
    """The columns of ``samples`` (rows of the samples schema) that stage 2 and the accounting read; a
    preference sample's shared ``prefix`` and its responses' lengths (``response_lengths``, empty for other
    samples: its responses are consecutive from token 0); its cost vector (``cost_llm``, ``cost_encoder``,
    ``cost_supervised``: float64, :data:`packer.cost.COSTS`)."""
    counts = media_counts(samples)
    spans = samples.column("responses").combine_chunks() if samples.num_rows else pa.array([], samples.schema.field(
        "responses").type)
    response_lengths = pa.ListArray.from_arrays(spans.offsets, pc.struct_field(spans.values, "length"))
    return pa.table({"length": samples.column("length"), "source_index": samples.column("source_index"),
                     "source_line": samples.column("source_line"), "modality": samples.column("modality"),
                     **{f"media_{k}": pa.array(v, pa.int32()) for k, v in counts.items()},
                     "prefix": samples.column("prefix"), "response_lengths": response_lengths,
                     **{f"cost_{k}": samples.column(f"cost_{k}") for k in COSTS}})


class SampleRows:
    """Whole rows of the samples shards by sample number; a shard is read (a remote one
    downloaded) only when one of its rows is asked for."""

    def __init__(self, paths: list, rows: list[int], sha256: list[str | None] | None = None):
        from packer.shards.io import read_shard

        self.read = read_shard
        self.paths, self.sha256 = paths, sha256 or [None] * len(paths)
        self.starts = np.concatenate([[0], np.cumsum(rows)]).astype(np.int64)
        self.tables: dict[int, pa.Table] = {}

    def __call__(self, indices: np.ndarray, columns: list[str]) -> pa.Table:
        indices = np.asarray(indices, np.int64)
        shard = np.searchsorted(self.starts, indices, side="right") - 1
        parts, order = [], []
        for k in np.unique(shard).tolist():
            if k not in self.tables:
                self.tables[k] = self.read(self.paths[k], self.sha256[k])
            mine = np.flatnonzero(shard == k)
            parts.append(self.tables[k].select(columns).take(pa.array(indices[mine] - self.starts[k])))
            order.append(mine)
        if not parts:
            from packer.shards.schema import SAMPLE_SCHEMA

            return SAMPLE_SCHEMA.empty_table().select(columns)
        table = pa.concat_tables(parts)
        return table.take(pa.array(np.argsort(np.concatenate(order), kind="stable")))


def media_counts(samples: pa.Table) -> dict[str, np.ndarray]:
    """Number of media items of each kind per sample, chunk by chunk (no full copy); from
    :func:`plan_columns`' counts when ``samples`` holds those."""
    if "media" not in samples.column_names:
        return {k: samples.column(f"media_{k}").to_numpy().astype(np.int64) for k in MEDIA_KINDS}
    counts = {k: np.zeros(samples.num_rows, np.int64) for k in MEDIA_KINDS}
    base = 0
    for chunk in samples.column("media").chunks:
        parents = pc.list_parent_indices(chunk).to_numpy() + base
        kinds = pc.struct_field(pc.list_flatten(chunk), "kind").to_numpy(zero_copy_only=False)
        for k in MEDIA_KINDS:
            np.add.at(counts[k], parents[kinds == k], 1)
        base += len(chunk)
    return counts


def modality_codes(samples: pa.Table) -> tuple[np.ndarray, list[str]]:
    """Each sample's modality as a small integer, chunk by chunk (no string column built)."""
    names: dict[str, int] = {}
    codes = []
    for chunk in samples.column("modality").chunks:
        local = [names.setdefault(v, len(names)) for v in chunk.dictionary.to_pylist()]
        codes.append(np.asarray(local, np.int32)[chunk.indices.to_numpy()] if len(chunk) else np.zeros(0, np.int32))
    return (np.concatenate(codes) if codes else np.zeros(0, np.int32)), list(names)


def oversize_inputs(rows, over: np.ndarray, joined: tuple[str, ...] = ()) -> tuple[dict[int, np.ndarray], dict[int, np.ndarray]]:
    """Media spans and trained-token masks of the samples over capacity (only those rows are read:
    ``rows(indices, columns)``, a :class:`SampleRows`). The items of a ``joined`` kind (a family whose count of one
    item depends on the others: ``Family.joined_kinds``) are protected as one span from the first to the last, so
    a cut keeps all of them or none."""
    protected, trained = {}, {}
    if over.size:
        for i, row in zip(over.tolist(), rows(over, ["labels", "media"]).to_pylist(), strict=True):
            spans = [(m["start"], m["length"]) for m in row["media"] if m["kind"] not in joined]
            for kind in joined:
                items = [(m["start"], m["start"] + m["length"]) for m in row["media"] if m["kind"] == kind]
                if items:
                    first, last = min(a for a, _ in items), max(b for _, b in items)
                    spans.append((first, last - first))
            protected[i] = np.array(sorted(spans), np.int64).reshape(-1, 2)
            trained[i] = np.asarray(row["labels"]) != IGNORE
    return protected, trained


def row_keys(samples: pa.Table, rows, family: Any) -> np.ndarray | None:
    """Each sample's row key under ``family``'s row constraint (:meth:`packer.families.Family.row_key`), coded
    0, 1, ... in the keys' sorted order, -1 for a sample that mixes with anything; None when the family has no
    such constraint. Only the rows holding media are read (their ``media`` column)."""
    if family is None or not family.keys_rows:
        return None
    codes = np.full(samples.num_rows, -1, np.int64)
    counts = media_counts(samples)
    holding = np.flatnonzero(sum(counts.values(), np.zeros(samples.num_rows, np.int64)) > 0) if counts else \
        np.zeros(0, np.int64)
    found: dict[int, Any] = {}
    for i, row in zip(holding.tolist(), rows(holding, ["media"]).to_pylist() if len(holding) else [], strict=True):
        keys = family.row_keys(row["media"])
        if len(keys) > 1:  # stage 1 quarantines these (incompatible_media): a build from before it
            raise ValueError(f"sample {i}: {family.row_key_reason(keys)}")
        if keys:
            found[i] = keys[0]
    order = {k: c for c, k in enumerate(sorted(set(found.values()), key=str))}
    for i, key in found.items():
        codes[i] = order[key]
    return codes


def preference_responses(samples: pa.Table) -> Responses:
    """The preference samples' responses and shared prefixes, from :func:`plan_columns` (``response_lengths``)
    or from the samples themselves (``responses``); only those rows' lists are read."""
    column = "response_lengths" if "response_lengths" in samples.column_names else "responses"
    n = pc.list_value_length(samples.column(column)).to_numpy(zero_copy_only=False).astype(np.int64) \
        if samples.num_rows else np.zeros(0, np.int64)
    rows = np.flatnonzero(n > 0)
    if not len(rows):
        empty = np.zeros(0, np.int64)
        return Responses(empty, empty, empty, empty, empty)
    picked = samples.select([column, "prefix"]).take(pa.array(rows))
    flat = pc.list_flatten(picked.column(column))
    lengths = (flat if column == "response_lengths" else pc.struct_field(flat, "length")).to_numpy().astype(np.int64)
    counts = n[rows]
    before = np.cumsum(lengths) - lengths  # tokens of the responses listed before each, over all samples
    starts = before - np.repeat(before[csr_offsets(counts)[:-1]], counts)  # consecutive from each sample's token 0
    return Responses(rows, counts, picked.column("prefix").to_numpy().astype(np.int64), starts, lengths)


def plan_samples(samples: pa.Table, config: BuildConfig, source_of_file: list[int] | None = None,
                 rows=None, joined: tuple[str, ...] = (), row_key: np.ndarray | None = None) -> tuple[Plan, Mix]:
    """The plan of ``samples`` under ``config``, after the sources' weights and caps
    (:mod:`packer.stages.mix`): the planner sees every copy; the plan names samples.
    ``samples``: :func:`plan_columns` of the samples (or the samples themselves);
    ``rows``: their whole rows (:class:`SampleRows`; by default taken from ``samples``).
    ``source_of_file[k]`` is the ``input`` entry input file ``k`` came from; ``joined``: the family's kinds
    whose items are cut all or none (:func:`oversize_inputs`); ``row_key``: the family's row keys (:func:`row_keys`).

    A preference sample is one item of its length in the build's layout (:mod:`packer.pack.trees`),
    never cut: one over ``max_length`` is dropped (``preference_too_long``) whatever the oversize
    policy. The plan then holds its segments (a tree's prompt and branches, or each response)."""
    if rows is None:
        rows = lambda indices, columns: samples.select(columns).take(pa.array(indices))  # noqa: E731
    lengths = samples.column("length").to_numpy().astype(np.int64)
    responses = preference_responses(samples)
    layout = config.preference
    if len(responses.sample) and layout == "none":
        raise ConfigError(f"the samples hold {len(responses.sample):,} preference record(s) but preference = 'none': "
                          f"plan them with preference = 'pairs' or 'tree'")
    long_items = np.zeros(0, np.int64)
    if len(responses.sample):
        items = responses.item_lengths(layout)
        lengths = lengths.copy()
        lengths[responses.sample] = items
        long_items = responses.sample[items > config.max_length]
    sources = config.sources()
    mixed = source_of_file is not None and any(s.mixed for s in sources)
    if mixed:
        file_of_sample = samples.column("source_index").to_numpy().astype(np.int64)
        m = mix(np.asarray(source_of_file, np.int64)[file_of_sample], sources, config.seed)
    else:  # every sample once: the selection is the identity (not built from source numbers, not copied below)
        m = Mix(np.arange(len(lengths), dtype=np.int64), np.ones(len(lengths), np.int64))
    sel = m.selection
    dropped_long = np.zeros(0, np.int64)
    if len(long_items):
        dropped_long = np.intersect1d(long_items, sel)
        sel = sel[~np.isin(sel, long_items)]
    subset = mixed or len(dropped_long) > 0  # the planner sees lengths[sel], not every sample once
    over = np.flatnonzero(lengths > config.max_length) if config.oversize in ("truncate", "split") else np.zeros(0, np.int64)
    over = over[~np.isin(over, responses.sample)]
    protected, trained = oversize_inputs(rows, over, joined)
    positions = {int(i): range(int(np.searchsorted(sel, i)), int(np.searchsorted(sel, i, "right"))) for i in over}
    caps = config.media_caps()
    group_by = modality_codes(samples)[0][sel] if config.group_by == "modality" else None
    media = None
    if caps:
        counts = media_counts(samples)
        if layout == "tree" and len(responses.sample):  # a tree holds its prompt's media once, not once per response
            for v in counts.values():
                v[responses.sample] //= responses.n
        media = {k: v[sel] for k, v in counts.items()}
    cost, budgets = encoder_budgets(samples, config, lengths[sel] if subset else lengths, sel if subset else None)
    planned = functools.partial(
        plan, lengths[sel] if subset else lengths, config.max_length, algorithm=config.algorithm, seed=config.seed,
        order=config.order, oversize=config.oversize, max_segments=config.max_segments or None, media=media,
        max_media=caps or None, group_by=group_by, row_key=None if row_key is None else row_key[sel],
        protected={int(q): protected[i] for i, qs in positions.items() for q in qs},
        trained={int(q): trained[i] for i, qs in positions.items() for q in qs},
    )
    p = with_budget(planned, cost, budgets)
    if subset and not (len(sel) == len(lengths) and np.array_equal(sel, np.arange(len(lengths)))):  # copy k != sample k
        p = dataclasses.replace(
            p, indices=sel[p.indices], dropped={r: np.unique(sel[v]) for r, v in p.dropped.items()},
            truncated=np.unique(sel[p.truncated]), split=np.unique(sel[p.split]),
            over_budget={r: np.unique(sel[v]) for r, v in p.over_budget.items()})
    if len(dropped_long):
        p = dataclasses.replace(p, dropped=dict(sorted({**p.dropped, "preference_too_long": dropped_long}.items())))
    if len(responses.sample):
        offsets, indices, starts, seg_lengths = expand(p.indices, p.offsets, p.starts, p.lengths, responses, layout)
        p = dataclasses.replace(p, offsets=offsets, indices=indices, starts=starts, lengths=seg_lengths)
    return p, m


def encoder_budgets(samples: pa.Table, config: BuildConfig, lengths: np.ndarray, sel: np.ndarray | None
                    ) -> tuple[np.ndarray | None, list[float]]:
    """Each planned sample's ``cost_encoder`` (the samples' stored cost vector) and the budgets ``max_row_encoder``
    allows (:meth:`BuildConfig.encoder_budgets`), ``auto`` against the mean row at the token lower bound of ``lengths``
    (what the planner sees: copies of a mix, preference items); ``(None, [])`` when off."""
    if config.max_row_encoder.strip() == "off":
        return None, []
    cost = samples.column("cost_encoder").to_numpy().astype(np.float64)
    cost = cost if sel is None else cost[sel]
    rows = -(-int(np.minimum(lengths, config.max_length).sum()) // config.max_length)
    return cost, config.encoder_budgets(float(cost.sum()), rows)


def with_budget(planned: Callable[..., Plan], cost: np.ndarray | None, budgets: list[float]) -> Plan:
    """``planned()`` under the first of ``budgets`` on each row's encoder ``cost``: the only one, or (several: ``auto``,
    tightest first) the first whose plan has no more rows than the plan without a budget, else that plan."""
    if not budgets:
        return planned()
    if len(budgets) == 1:
        return planned(resources={"encoder": cost}, budgets={"encoder": budgets[0]})
    free = planned()
    for budget in budgets:
        p = planned(resources={"encoder": cost}, budgets={"encoder": budget})
        if p.n_bins <= free.n_bins:
            return p
    return free


def plan_sources(samples: pa.Table, config: BuildConfig, source_of_file: list[int] | None = None, rows=None,
                 joined: tuple[str, ...] = (), row_key: np.ndarray | None = None) -> tuple[Plan, Mix]:
    """:func:`plan_samples`, each group of sources that share a packing policy (their own ``max_length``,
    ``packing``, ``oversize``, media caps: :class:`packer.config.sources.Source`) planned apart with its options, so rows never
    mix policies; the groups' rows concatenated (groups in the order of their first source) then put in the build's
    ``order`` together. Without a source of its own policy, exactly :func:`plan_samples`."""
    sources = config.sources()
    if source_of_file is None or not any(s.policy for s in sources):
        return plan_samples(samples, config, source_of_file, rows, joined, row_key)
    if rows is None:
        rows = lambda indices, columns: samples.select(columns).take(pa.array(indices))  # noqa: E731
    source = np.asarray(source_of_file, np.int64)[samples.column("source_index").to_numpy().astype(np.int64)]
    plans, copies, groups = [], np.zeros(samples.num_rows, np.int64), []
    counts = media_counts(samples)
    for policy, members, own in policy_groups(config):
        idx = np.flatnonzero(np.isin(source, members))
        own = dataclasses.replace(own, order="planner")
        sub_rows = lambda indices, columns, idx=idx: rows(idx[np.asarray(indices, np.int64)], columns)  # noqa: E731
        p, m = plan_samples(samples.take(pa.array(idx)), own, source_of_file, sub_rows, joined,
                            None if row_key is None else row_key[idx])
        copies[idx] = m.copies
        plans.append(_renumbered(p, idx))
        items = placed_items(p, len(idx), {k: v[idx] for k, v in counts.items()}, preference_responses(
            samples.take(pa.array(idx))).sample)
        max_segments, caps = own_caps(config, sources[members[0]].options())
        bound, fill = bound_and_fill(p.tokens, len(items["sample"]),
                                     {k: int(v.sum()) for k, v in items.items() if k != "sample"}, p.n_bins,
                                     own.max_length, max_segments, caps)  # its media caps too (packing = false: a row an item)
        groups.append({"sources": [sources[k].pattern for k in members], "policy": dict(policy),
                       "capacity": own.max_length, "rows": p.n_bins, "tokens": p.tokens,
                       "lower_bound": bound, "fill": fill,
                       **({"budgets": dict(p.budgets)} if p.budgets else {})})
    merged = _concat(plans, config.max_length, tuple(groups))
    from packer.pack.plan import _ordered

    return _ordered(merged, config.order, config.seed), Mix(np.repeat(np.arange(len(copies)), copies), copies)


def plan_build(samples: pa.Table, config: BuildConfig, tokenizer: dict[str, Any], source_of_file: list[int] | None,
               rows=None) -> tuple[Plan, Mix, np.ndarray | None]:
    """Stage 2 of a build: :func:`plan_sources` under the family the build's ``tokenizer`` record names (its joined
    kinds, its row keys: :func:`row_keys`); ``(plan, mix, row keys or None)``. The build plans with it, and the deep
    check of ``packer verify`` (:mod:`packer.verify.deep`) re-plans with it from the samples' lengths and the manifest's
    settings."""
    from packer.families import Family

    record = tokenizer.get("family")
    family = Family.from_record(record) if record else None
    joined = family.joined_kinds() if family is not None else ()
    keys = None
    if family is not None and family.keys_rows:
        if rows is None:
            rows = lambda indices, columns: samples.select(columns).take(pa.array(indices))  # noqa: E731
        keys = row_keys(samples, rows, family)
    p, m = plan_sources(samples, config, source_of_file, rows, joined, keys)
    return p, m, keys


CAP_FIELDS = {"total": "max_media", "image": "max_images", "audio": "max_audio", "video": "max_videos"}


def own_caps(config: BuildConfig, options: dict[str, Any]) -> tuple[int, dict[str, int]]:
    """``(max_segments, media caps)`` a source with these own ``options`` (:meth:`packer.config.sources.Source.options`) is
    planned with: its own over the build's (0 / left out: no limit)."""
    caps = {k: int(options.get(f, getattr(config, f))) for k, f in CAP_FIELDS.items()}
    return int(options.get("max_segments", config.max_segments) or 0), {k: v for k, v in caps.items() if v > 0}


def placed_items(p: Plan, n_samples: int, media: dict[str, np.ndarray], preference: np.ndarray) -> dict[str, np.ndarray]:
    """Each item the plan placed -- a sample (a copy, a piece) in a row, once per row -- as ``sample`` and its media
    counts per kind (``media``: per sample), which the planner's caps charge a row for. A preference sample's media
    count 0 here (its layout shares its prompt's media among segments): a bound built on these never overshoots."""
    rows = np.repeat(np.arange(p.n_bins, dtype=np.int64), np.diff(p.offsets))
    pairs = np.unique(rows * max(1, n_samples) + p.indices)
    sample = pairs % max(1, n_samples)
    counted = ~np.isin(sample, preference)
    return {"sample": sample, **{k: np.where(counted, v[sample], 0) for k, v in media.items()}}


def row_bound(tokens: int, items: int, media: dict[str, int], capacity: int, max_segments: int,
              caps: dict[str, int]) -> int:
    """Rows no packing of these segments goes below: ``ceil(tokens / capacity)``, ``ceil(items / max_segments)``
    (packing = false: a row an item) and, per media cap, ``ceil(items of the kind / cap)`` (``total``: all kinds):
    a source of ``max_images = 2`` with 10 images needs 5 rows however short its text (:func:`packer.pack.cap_bound`,
    the planner's own)."""
    held = {**media, "total": sum(media.values())}
    return max(-(-tokens // capacity), cap_bound(items, max_segments, held, caps))


def bound_and_fill(tokens: int, items: int, media: dict[str, int], rows: int, capacity: int, max_segments: int,
                   caps: dict[str, int]) -> tuple[int, float]:
    """``(lower bound, fill)`` of the rows holding a policy group's (or one source's) segments: :func:`row_bound` of
    its ``tokens``, ``items`` and ``media`` at its own ``capacity``, ``max_segments`` and media caps, and ``tokens``
    over its ``rows`` x ``capacity``. The plan's groups (:func:`plan_sources`) and the per-source accounts
    (:func:`packer.stages.sources.source_accounts`) are both stated from here."""
    return row_bound(tokens, items, media, capacity, max_segments, caps), tokens / max(1, rows * capacity)


def policy_groups(config: BuildConfig) -> list[tuple[tuple, list[int], BuildConfig]]:
    """``(policy, source numbers, the options they are planned with)`` per group of sources sharing a packing
    policy, in the order of their first source (one group, the build's options, without a source's own)."""
    sources = config.sources()
    members: dict[tuple, list[int]] = {}
    for k, s in enumerate(sources):
        members.setdefault(s.policy, []).append(k)
    if not any(s.policy for s in sources):
        return [((), list(range(len(sources))), config)]
    # the sources' weights and caps kept (the mix draws each source's copies alike in every group), their own
    # packing dropped: a group's config is checked as a build's, and another source's max_length may be over its own
    mixing = tuple(s.mixing_spec() for s in sources)
    return [(policy, ks, dataclasses.replace(config, input=mixing, **sources[ks[0]].options()))
            for policy, ks in members.items()]


def _renumbered(p: Plan, idx: np.ndarray) -> Plan:
    """``p`` (of a subset of samples, numbered 0..) in the numbers of the whole: sample k of the subset is idx[k]."""
    return dataclasses.replace(
        p, indices=idx[p.indices], dropped={r: idx[v] for r, v in p.dropped.items()}, truncated=idx[p.truncated],
        split=idx[p.split], over_budget={r: idx[v] for r, v in p.over_budget.items()})


def _concat(plans: list[Plan], capacity: int, groups: tuple[dict, ...]) -> Plan:
    """The groups' plans as one: their rows one after another, their accounting merged."""
    offsets = [np.zeros(1, np.int64)]
    for p in plans:
        offsets.append(p.offsets[1:] + offsets[-1][-1])
    def cat(name: str) -> np.ndarray:
        return np.concatenate([getattr(p, name) for p in plans])

    def merged_keys(name: str) -> dict[str, np.ndarray]:
        keys = sorted({k for p in plans for k in getattr(p, name)})
        return {k: np.sort(np.concatenate([getattr(p, name)[k] for p in plans if k in getattr(p, name)])) for k in keys}

    return Plan(np.concatenate(offsets), cat("indices"), cat("starts"), cat("lengths"), capacity,
                dropped=merged_keys("dropped"), truncated=np.sort(cat("truncated")), split=np.sort(cat("split")),
                truncated_tokens=sum(p.truncated_tokens for p in plans),
                pieces_dropped=sum(p.pieces_dropped for p in plans),
                pieces_lost_media=sum(p.pieces_lost_media for p in plans), over_budget=merged_keys("over_budget"),
                resource_bound=sum(p.resource_bound for p in plans),
                budgets=_common([p.budgets for p in plans]), groups=groups)


def _common(budgets: list[dict[str, float]]) -> dict[str, float]:
    """The budgets every group has alike (each group's own are in its ``groups`` entry)."""
    keys = {k for b in budgets for k in b}
    return {k: budgets[0][k] for k in sorted(keys) if all(b.get(k) == budgets[0].get(k) for b in budgets)}


def plan_table(p: Plan) -> pa.Table:
    offsets = pa.array(p.offsets.astype(np.int32))
    return pa.table(
        {
            "samples": pa.ListArray.from_arrays(offsets, pa.array(p.indices, pa.int64())),
            "starts": pa.ListArray.from_arrays(offsets, pa.array(p.starts.astype(np.int32))),
            "lengths": pa.ListArray.from_arrays(offsets, pa.array(p.lengths.astype(np.int32))),
        },
        schema=PLAN_SCHEMA,
    )
