"""Stage 2: plan. The samples' lengths (and a few attributes) in, ``plan.arrow`` out.

Only the lengths array and, where constraints ask for them, per-sample media counts
and modality labels are held in memory. Samples over ``max_length`` are the only rows
read in full: their media spans (never cut through; a split piece that follows a span it
does not hold is left out, ``split_lost_media``) and label masks (a piece with nothing to
train is left out) feed the oversize policy of :func:`packer.pack.plan`.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from packer.config import BuildConfig
from packer.errors import ConfigError
from packer.mix import Mix, mix
from packer.pack import Plan, plan
from packer.pack.trees import Responses, expand
from packer.shards.schema import IGNORE, MEDIA_KINDS, PLAN_SCHEMA


def media_counts(samples: pa.Table) -> dict[str, np.ndarray]:
    """Number of media items of each kind per sample, chunk by chunk (no full copy)."""
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


def oversize_inputs(samples: pa.Table, over: np.ndarray) -> tuple[dict[int, np.ndarray], dict[int, np.ndarray]]:
    """Media spans and trained-token masks of the samples over capacity (only those rows are read)."""
    protected, trained = {}, {}
    if over.size:
        rows = [samples.slice(int(i), 1).select(["labels", "media"]).to_pylist()[0] for i in over]
        for i, row in zip(over.tolist(), rows, strict=True):
            protected[i] = np.array([(m["start"], m["length"]) for m in row["media"]], np.int64).reshape(-1, 2)
            trained[i] = np.asarray(row["labels"]) != IGNORE
    return protected, trained


def preference_responses(samples: pa.Table) -> Responses:
    """The preference samples' responses and shared prefixes (only those rows' lists are read)."""
    n = pc.list_value_length(samples.column("responses")).to_numpy(zero_copy_only=False).astype(np.int64) \
        if samples.num_rows else np.zeros(0, np.int64)
    rows = np.flatnonzero(n > 0)
    if not len(rows):
        empty = np.zeros(0, np.int64)
        return Responses(empty, empty, empty, empty, empty)
    picked = samples.select(["responses", "prefix"]).take(pa.array(rows))
    spans = pc.list_flatten(picked.column("responses"))
    return Responses(rows, n[rows], picked.column("prefix").to_numpy().astype(np.int64),
                     pc.struct_field(spans, "start").to_numpy().astype(np.int64),
                     pc.struct_field(spans, "length").to_numpy().astype(np.int64))


def plan_samples(samples: pa.Table, config: BuildConfig, source_of_file: list[int] | None = None) -> tuple[Plan, Mix]:
    """The plan of ``samples`` under ``config``, after the sources' weights and caps
    (:mod:`packer.mix`): the planner sees every copy; the plan names samples.
    ``source_of_file[k]`` is the ``input`` entry input file ``k`` came from.

    A preference sample is one item of its length in the build's layout (:mod:`packer.pack.trees`),
    never cut: one over ``max_length`` is dropped (``preference_too_long``) whatever the oversize
    policy. The plan then holds its segments (a tree's prompt and branches, or each response)."""
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
    file_of_sample = samples.column("source_index").to_numpy().astype(np.int64) if samples.num_rows else np.zeros(0, np.int64)
    sources = config.sources()
    if source_of_file is not None and any(s.mixed for s in sources):
        source_of_sample = np.asarray(source_of_file, np.int64)[file_of_sample]
    else:
        source_of_sample = np.zeros(len(lengths), np.int64)
    m = mix(source_of_sample, sources, config.seed)
    sel = m.selection
    dropped_long = np.zeros(0, np.int64)
    if len(long_items):
        dropped_long = np.intersect1d(long_items, sel)
        sel = sel[~np.isin(sel, long_items)]
    over = np.flatnonzero(lengths > config.max_length) if config.oversize in ("truncate", "split") else np.zeros(0, np.int64)
    over = over[~np.isin(over, responses.sample)]
    protected, trained = oversize_inputs(samples, over)
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
    p = plan(
        lengths[sel], config.max_length, algorithm=config.algorithm, seed=config.seed, order=config.order,
        oversize=config.oversize, max_segments=config.max_segments or None, media=media, max_media=caps or None,
        group_by=group_by,
        protected={int(q): protected[i] for i, qs in positions.items() for q in qs},
        trained={int(q): trained[i] for i, qs in positions.items() for q in qs},
    )
    if not (len(sel) == len(lengths) and np.array_equal(sel, np.arange(len(lengths)))):  # copy k is not sample k
        p = dataclasses.replace(
            p, indices=sel[p.indices], dropped={r: np.unique(sel[v]) for r, v in p.dropped.items()},
            truncated=np.unique(sel[p.truncated]), split=np.unique(sel[p.split]))
    if len(dropped_long):
        p = dataclasses.replace(p, dropped=dict(sorted({**p.dropped, "preference_too_long": dropped_long}.items())))
    if len(responses.sample):
        offsets, indices, starts, seg_lengths = expand(p.indices, p.offsets, p.lengths, responses, layout)
        p = dataclasses.replace(p, offsets=offsets, indices=indices, starts=starts, lengths=seg_lengths)
    return p, m


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
