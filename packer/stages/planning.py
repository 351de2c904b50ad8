"""Stage 2: plan. The samples' lengths (and a few attributes) in, ``plan.arrow`` out.

Only the lengths array and, where constraints ask for them, per-sample media counts
and modality labels are held in memory. Samples over ``max_length`` are the only rows
read in full: their media spans (never cut through) and label masks (a piece with
nothing to train is left out) feed the oversize policy of :func:`packer.pack.plan`.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from packer.config import BuildConfig
from packer.pack import Plan, plan
from packer.schema import IGNORE, PLAN_SCHEMA

MEDIA_KINDS = ("image", "audio")


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


def oversize_inputs(samples: pa.Table, over: np.ndarray) -> tuple[dict[int, np.ndarray], dict[int, np.ndarray]]:
    """Media spans and trained-token masks of the samples over capacity."""
    protected, trained = {}, {}
    if over.size:
        rows = samples.take(pa.array(over)).select(["labels", "media"]).to_pylist()
        for i, row in zip(over.tolist(), rows, strict=True):
            protected[i] = np.array([(m["start"], m["length"]) for m in row["media"]], np.int64).reshape(-1, 2)
            trained[i] = np.asarray(row["labels"]) != IGNORE
    return protected, trained


def plan_samples(samples: pa.Table, config: BuildConfig) -> Plan:
    lengths = samples.column("length").to_numpy().astype(np.int64)
    over = np.flatnonzero(lengths > config.max_length) if config.oversize in ("truncate", "split") else np.zeros(0, np.int64)
    protected, trained = oversize_inputs(samples, over)
    caps = config.media_caps()
    group_by = None
    if config.group_by == "modality":
        group_by = samples.column("modality").cast(pa.string()).to_numpy(zero_copy_only=False)
    return plan(
        lengths, config.max_length, algorithm=config.algorithm, seed=config.seed, order=config.row_order,
        oversize=config.oversize, protected=protected, trained=trained,
        max_segments=config.max_segments or None, media=media_counts(samples) if caps else None,
        max_media=caps or None, group_by=group_by,
    )


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
