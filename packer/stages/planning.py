"""Stage 2: plan. Sample lengths in, ``plan.arrow`` (bins -> samples) out.

Only the lengths are held in memory. Samples longer than ``max_length`` are resolved
first, by the oversize policy, reading just those rows:

- ``truncate``: keep the front ``max_length`` tokens, but never cut through a media
  span (cut before it); a sample left with no trained token is dropped, and counted.
- ``drop``: drop it, and count it.

Rows come out of best-fit decreasing sorted by content (long samples first); they are
shuffled with the seed unless ``shuffle_rows`` is off.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa

from packer.encode.encoder import IGNORE
from packer.errors import NotAvailableError
from packer.pack import Plan, plan
from packer.schema import PLAN_SCHEMA


@dataclass
class PlanOutcome:
    plan: Plan  # indices are global sample numbers; lengths are the tokens kept per sample
    dropped: dict[str, int] = field(default_factory=dict)
    dropped_samples: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    truncated_samples: int = 0
    truncated_tokens: int = 0


def truncation_point(labels: np.ndarray, media: list[dict], capacity: int) -> int:
    """Where to cut a too-long sample: at ``capacity``, or before the media span it would split.

    Returns 0 when nothing trainable would be left (the sample is then dropped).
    """
    cut = capacity
    for span in media:
        if span["start"] < cut < span["start"] + span["length"]:
            cut = span["start"]
    if cut < 2 or not np.any(labels[1:cut] != IGNORE):
        return 0
    return cut


def plan_samples(lengths: np.ndarray, samples: pa.Table, *, capacity: int, oversize: str,
                 algorithm: str, seed: int, shuffle_rows: bool) -> PlanOutcome:
    kept = lengths.astype(np.int64)
    over = np.flatnonzero(kept > capacity)
    dropped: list[int] = []
    reasons: dict[str, int] = {}
    truncated_tokens = 0
    if over.size and oversize == "split":
        raise NotAvailableError("--oversize split is not available yet in this version; use truncate or drop")
    if over.size and oversize == "drop":
        dropped = over.tolist()
        reasons["oversize"] = len(dropped)
    elif over.size:
        rows = samples.take(pa.array(over)).select(["labels", "media"]).to_pylist()
        for i, row in zip(over.tolist(), rows, strict=True):
            cut = truncation_point(np.asarray(row["labels"]), row["media"], capacity)
            if cut == 0:
                dropped.append(i)
                reasons["truncated_to_nothing"] = reasons.get("truncated_to_nothing", 0) + 1
            else:
                truncated_tokens += int(kept[i] - cut)
                kept[i] = cut
    keep = np.ones(len(kept), dtype=bool)
    keep[dropped] = False
    keep_idx = np.flatnonzero(keep)
    p = plan(kept[keep_idx], capacity, algorithm=algorithm, seed=seed)
    p = Plan(p.offsets, keep_idx[p.indices], kept, capacity)
    if shuffle_rows and p.n_bins > 1:
        p = p.reorder(np.random.default_rng(seed).permutation(p.n_bins))
    return PlanOutcome(
        plan=p,
        dropped=reasons,
        dropped_samples=np.asarray(dropped, dtype=np.int64),
        truncated_samples=int(over.size - len(dropped)) if oversize == "truncate" else 0,
        truncated_tokens=truncated_tokens,
    )


def plan_table(p: Plan) -> pa.Table:
    offsets = pa.array(p.offsets.astype(np.int32))
    return pa.table(
        {
            "samples": pa.ListArray.from_arrays(offsets, pa.array(p.indices, pa.int64())),
            "lengths": pa.ListArray.from_arrays(offsets, pa.array(p.lengths[p.indices].astype(np.int32))),
        },
        schema=PLAN_SCHEMA,
    )
