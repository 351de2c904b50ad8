"""Stage 2: plan. The samples' lengths (and a few attributes) in, ``plan.arrow`` out.

The driver holds a few columns per sample (:func:`plan_columns`: length, input file,
line, modality, media counts; 32 bytes a sample), which each stage-1 task returns with its
result, so the samples shards themselves are not read to plan (a remote build's would be
downloaded). Samples over ``max_length`` are the only rows read in full
(:class:`SampleRows`): their media spans (never cut through; a split piece that follows a
span it does not hold is left out, ``split_lost_media``) and label masks (a piece with
nothing to train is left out) feed the oversize policy of :func:`packer.pack.plan`.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from packer.config import BuildConfig
from packer.mix import Mix, mix
from packer.pack import Plan, plan
from packer.shards.schema import IGNORE, MEDIA_KINDS, PLAN_SCHEMA


def plan_columns(samples: pa.Table) -> pa.Table:
    """The columns of ``samples`` (rows of the samples schema) that stage 2 and the accounting read."""
    counts = media_counts(samples)
    return pa.table({"length": samples.column("length"), "source_index": samples.column("source_index"),
                     "source_line": samples.column("source_line"), "modality": samples.column("modality"),
                     **{f"media_{k}": pa.array(v, pa.int32()) for k, v in counts.items()}})


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


def oversize_inputs(rows, over: np.ndarray) -> tuple[dict[int, np.ndarray], dict[int, np.ndarray]]:
    """Media spans and trained-token masks of the samples over capacity (only those rows are read:
    ``rows(indices, columns)``, a :class:`SampleRows`)."""
    protected, trained = {}, {}
    if over.size:
        for i, row in zip(over.tolist(), rows(over, ["labels", "media"]).to_pylist(), strict=True):
            protected[i] = np.array([(m["start"], m["length"]) for m in row["media"]], np.int64).reshape(-1, 2)
            trained[i] = np.asarray(row["labels"]) != IGNORE
    return protected, trained


def plan_samples(samples: pa.Table, config: BuildConfig, source_of_file: list[int] | None = None,
                 rows=None) -> tuple[Plan, Mix]:
    """The plan of ``samples`` under ``config``, after the sources' weights and caps
    (:mod:`packer.mix`): the planner sees every copy; the plan names samples.
    ``samples``: :func:`plan_columns` of the samples (or the samples themselves);
    ``rows``: their whole rows (:class:`SampleRows`; by default taken from ``samples``).
    ``source_of_file[k]`` is the ``input`` entry input file ``k`` came from."""
    if rows is None:
        rows = lambda indices, columns: samples.select(columns).take(pa.array(indices))  # noqa: E731
    lengths = samples.column("length").to_numpy().astype(np.int64)
    sources = config.sources()
    mixed = source_of_file is not None and any(s.mixed for s in sources)
    if mixed:
        file_of_sample = samples.column("source_index").to_numpy().astype(np.int64)
        m = mix(np.asarray(source_of_file, np.int64)[file_of_sample], sources, config.seed)
    else:  # every sample once: the selection is the identity (not built from source numbers, not copied below)
        m = Mix(np.arange(len(lengths), dtype=np.int64), np.ones(len(lengths), np.int64))
    sel = m.selection
    over = np.flatnonzero(lengths > config.max_length) if config.oversize in ("truncate", "split") else np.zeros(0, np.int64)
    protected, trained = oversize_inputs(rows, over)
    positions = {int(i): range(int(np.searchsorted(sel, i)), int(np.searchsorted(sel, i, "right"))) for i in over}
    caps = config.media_caps()
    group_by = modality_codes(samples)[0][sel] if config.group_by == "modality" else None
    media = {k: v[sel] for k, v in media_counts(samples).items()} if caps else None
    p = plan(
        lengths[sel] if mixed else lengths, config.max_length, algorithm=config.algorithm, seed=config.seed, order=config.order,
        oversize=config.oversize, max_segments=config.max_segments or None, media=media, max_media=caps or None,
        group_by=group_by,
        protected={int(q): protected[i] for i, qs in positions.items() for q in qs},
        trained={int(q): trained[i] for i, qs in positions.items() for q in qs},
    )
    if not mixed or (len(sel) == len(lengths) and np.array_equal(sel, np.arange(len(lengths)))):  # copy k is sample k
        return p, m
    return dataclasses.replace(
        p, indices=sel[p.indices], dropped={r: np.unique(sel[v]) for r, v in p.dropped.items()},
        truncated=np.unique(sel[p.truncated]), split=np.unique(sel[p.split])), m


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
