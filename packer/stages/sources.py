"""Accounting per source: what became of each ``input`` entry's records and the rows its samples fill.

A source (one ``-i`` entry or ``[[sources]]`` table, a file or a glob) sums its files' accounts
(``Accounting.by_file``: records, packed, quarantined, dropped, skipped, repeated), adds the reasons
(quarantine.jsonl's per file, the plan's drops per sample) and the rows from the plan, each against its
own lower bound at its own capacity (its ``max_length``, else the build's)::

    chat.jsonl   max_length=1024        records 40, packed 40, 11 rows of 1,024, bound 10, fill 93.1%
    llava.jsonl  packing=false          records 12, packed 12, 12 rows of 4,096, bound 12 (a row a sample)

Sources of one policy are planned together, so two of them may share a row: ``rows`` counts the rows
holding a segment of the source, ``shared_rows`` those also holding another source's; then the group's
line in ``policy_groups`` is the one whose rows add up. Records, outcomes, segments and tokens always
add up to the build's totals.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np

from packer.config.fields import BuildConfig
from packer.pack.plan import Plan
from packer.shards.manifest import FileAccount
from packer.stages.planning import bound_and_fill, own_caps, placed_items


def quarantined_by_file(path: Path | None) -> dict[str, Counter]:
    """Per input file, its quarantined records by reason (from ``quarantine.jsonl``)."""
    out: dict[str, Counter] = {}
    if path is None or not path.is_file():
        return out
    with path.open("r", encoding="utf-8") as f:
        for line in f:
            if line.strip():
                e = json.loads(line)
                out.setdefault(e["file"], Counter())[e["reason"]] += 1
    return out


def source_accounts(config: BuildConfig, inputs: list[str], input_sources: list[int], by_file: dict[str, FileAccount],
                    file_of_sample: np.ndarray, p: Plan, quarantined: dict[str, Counter],
                    media: dict[str, np.ndarray] | None = None, preference: np.ndarray | None = None) -> list[dict[str, Any]]:
    """One account per ``input`` entry, in their order (see the module docstring); ``media``: each sample's media
    counts per kind, so a source's bound honours its media caps (``preference``: the preference samples, whose
    media are not counted: :func:`packer.stages.planning.placed_items`)."""
    sources = config.sources()
    n = len(sources)
    of_file = np.asarray(input_sources or [0] * len(inputs), np.int64)
    of_sample = of_file[np.asarray(file_of_sample, np.int64)] if len(of_file) else np.zeros(0, np.int64)
    seg = of_sample[p.indices]
    tokens = np.bincount(seg, weights=p.lengths, minlength=n).astype(np.int64)
    segments = np.bincount(seg, minlength=n)
    pairs = np.unique(np.repeat(np.arange(p.n_bins), np.diff(p.offsets)) * n + seg)  # (row, source) held
    per_row = np.bincount(pairs // n, minlength=p.n_bins)
    rows = np.bincount(pairs % n, minlength=n)
    shared = np.bincount(pairs[per_row[pairs // n] > 1] % n, minlength=n)
    dropped = {r: np.bincount(of_sample[v], minlength=n) for r, v in sorted(p.dropped.items()) if len(v)}
    placed = placed_items(p, len(of_sample), media or {}, np.zeros(0, np.int64) if preference is None else preference)
    of_item = of_sample[placed["sample"]]
    items = np.bincount(of_item, minlength=n)
    kinds = {k: np.bincount(of_item, weights=v, minlength=n).astype(np.int64) for k, v in placed.items() if k != "sample"}
    out = []
    for k, source in enumerate(sources):
        own = source.options()
        capacity = int(own.get("max_length", config.max_length))
        max_segments, caps = own_caps(config, own)
        files = [name for name, s in zip(inputs, of_file.tolist(), strict=True) if s == k]
        acc = {key: sum(getattr(by_file[f], key) for f in files)
               for key in ("records", "packed", "quarantined", "dropped", "skipped", "repeated")}
        reasons = sum((quarantined.get(f, Counter()) for f in files), Counter())
        bound, fill = bound_and_fill(int(tokens[k]), int(items[k]), {kind: int(c[k]) for kind, c in kinds.items()},
                                     int(rows[k]), capacity, max_segments, caps)  # media caps, packing = false too
        out.append({
            "input": source.pattern, "policy": dict(source.policy), "files": len(files), **acc,
            "quarantined_by_reason": dict(sorted(reasons.items())),
            "dropped_by_reason": {r: int(c[k]) for r, c in dropped.items() if c[k]},
            "capacity": capacity, "segments": int(segments[k]), "tokens": int(tokens[k]), "rows": int(rows[k]),
            "shared_rows": int(shared[k]), "lower_bound": bound, "gap_to_lower_bound": int(rows[k]) - bound,
            "fill": fill,
        })
    return out
