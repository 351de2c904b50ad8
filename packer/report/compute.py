"""The report: merged shard stats plus the comparisons a user cares about.

All numbers come from the packed shards (and the manifest's accounting), so
``packer report OUT`` recomputes them for any build of this schema version:

- fill = tokens / (rows x max_length); L1 = ceil(tokens / max_length) and the gap to it;
- per modality: samples, tokens, trained tokens, media items and media tokens;
- histograms of sample lengths (per modality), segments per row and fill per row;
- attention work: sum of seg^2 over rows, against rows x L^2 for dense causal masks;
- tokens computed for the same samples when (a) random batches of B are padded to their
  longest, (b) batches of B are length-grouped within a modality (mega-batches of 50 B
  sorted by length, as HF's LengthGroupedSampler / Prismatic's split-modality sampler),
  (c) packed -- as the share of real tokens and the speed-up of packing;
- per-step cost imbalance (slowest rank / mean rank) across 8 and 64 data-parallel ranks,
  one row per rank per step: round-robin vs :class:`TokenBalancedSampler`'s assignment.
"""

from __future__ import annotations

import dataclasses
import json
from collections import Counter
from functools import reduce
from pathlib import Path
from typing import Any

import numpy as np

from packer.balance import balance, imbalance
from packer.cost import CostModel
from packer.io.files import write_text_atomic
from packer.shards.manifest import Manifest
from packer.shards.stats import ShardStats, length_edges, shard_stats

MEGABATCH = 50
RANKS = (8, 64)
ROWS_PER_RANK = 4  # rows each rank takes per step (balancing needs a choice: one row per rank leaves none)


def padded_tokens(lengths: np.ndarray, batch: int, rng: np.random.Generator) -> int:
    order = rng.permutation(len(lengths))
    return _pad_cost(lengths[order], batch)


def grouped_tokens(lengths: np.ndarray, modality: np.ndarray, batch: int, rng: np.random.Generator) -> int:
    total = 0
    for m in sorted(set(modality.tolist())):
        group = lengths[modality == m]
        group = group[rng.permutation(len(group))]
        mega = batch * MEGABATCH
        for s in range(0, len(group), mega):
            total += _pad_cost(np.sort(group[s : s + mega])[::-1], batch)
    return total


def _pad_cost(lengths: np.ndarray, batch: int) -> int:
    n = len(lengths)
    if n == 0:
        return 0
    full = n // batch * batch
    cost = int(lengths[:full].reshape(-1, batch).max(1).sum()) * batch if full else 0
    if n > full:
        cost += int(lengths[full:].max()) * (n - full)
    return cost


def rank_imbalance(stats: dict[str, np.ndarray], ranks: int, seed: int) -> dict[str, float] | None:
    costs = CostModel()(stats)
    per_step = ranks * ROWS_PER_RANK
    steps = len(costs) // per_step
    if steps == 0:
        return None
    order = np.random.default_rng(seed).permutation(len(costs))[: steps * per_step].reshape(steps, per_step)
    round_robin = order.reshape(steps, ROWS_PER_RANK, ranks).transpose(0, 2, 1)  # row k of a step to rank k mod R
    balanced = np.stack([balance(s, costs[s], ranks, ROWS_PER_RANK) for s in order])
    return {"steps": int(steps), "rows_per_rank": ROWS_PER_RANK, "round_robin": imbalance(costs, round_robin),
            "balanced": imbalance(costs, balanced)}


def quarantine_examples(out: Path, manifest: Manifest, per_reason: int = 3) -> list[dict[str, Any]]:
    if manifest.files.quarantine is None:
        return []
    path = out / manifest.files.quarantine.file
    examples: dict[str, list[str]] = {}
    counts: Counter[str] = Counter()
    if path.is_file():
        with path.open(encoding="utf-8") as f:
            for line in f:
                e = json.loads(line)
                counts[e["reason"]] += 1
                if len(examples.setdefault(e["reason"], [])) < per_reason:
                    examples[e["reason"]].append(f"{e['file']}:{e['line']}")
    return [{"reason": r, "count": n, "examples": examples[r]} for r, n in counts.most_common()]


def report(out: str | Path, manifest: Manifest | None = None, *, batch_size: int = 8, seed: int = 0) -> dict[str, Any]:
    out = Path(out)
    manifest = manifest or Manifest.read(out)
    shards = [shard_stats(out / e.file) for e in manifest.files.packed]
    s = reduce(ShardStats.merge, shards, ShardStats())
    cap = manifest.max_length
    lengths = s.array("seg_lengths").astype(np.int64)
    modality = s.array("seg_modality").astype(object) if s.seg_modality else np.zeros(0, dtype=object)
    real = int(lengths.sum())
    lower = -(-s.tokens // cap)
    rng = np.random.default_rng(seed)
    packed_cost = s.rows * cap
    schemes = {
        "padded_random": padded_tokens(lengths, batch_size, rng),
        "length_grouped": grouped_tokens(lengths, modality, batch_size, rng),
        "packed": packed_cost,
    }
    edges = length_edges(cap)
    row_fill = s.array("row_tokens") / cap if s.rows else np.zeros(0)
    row_stats = {"tokens": s.array("row_tokens"), "attention": s.array("row_attention"),
                 "media_items": s.array("row_media_items"), "media_tokens": s.array("row_media_tokens")}
    acc, stats = manifest.accounting, manifest.stats
    return {
        "schema_version": manifest.schema_version,
        "build": {"name": manifest.config.get("name", ""), "created_at": manifest.created_at,
                  "packer_version": manifest.packer_version},
        "records": acc.records_read, "samples": s.samples(), "segments": s.segments, "duplicate_ids": s.duplicate_ids(),
        "rows": s.rows, "tokens": s.tokens, "max_length": cap,
        "fill": s.tokens / max(1, s.rows * cap), "lower_bound": lower, "gap_to_lower_bound": s.rows - lower,
        "per_modality": {k: v.__dict__ for k, v in sorted(s.per_modality.items())},
        "histograms": {
            "length_edges": edges.tolist(),
            "sample_lengths": {m: np.histogram(lengths[modality == m], bins=edges)[0].tolist() for m in sorted(s.per_modality)},
            "segments_per_row": {str(k): v for k, v in sorted(s.segments_per_row.items())},
            "fill_edges": np.linspace(0, 1, 11).tolist(),
            "fill_per_row": np.histogram(np.minimum(row_fill, 1), bins=np.linspace(0, 1, 11))[0].tolist(),
        },
        "accounting": dataclasses.asdict(acc),
        "oversize": {k: stats.get(k, 0) for k in ("truncated_samples", "truncated_tokens", "split_samples", "split_pieces",
                                                  "split_pieces_dropped", "split_lost_media")},
        "quarantine_top": quarantine_examples(out, manifest),
        "attention": {"block_diagonal": s.attention, "dense": float(s.rows) * cap * cap,
                      "ratio": s.attention / max(1.0, float(s.rows) * cap * cap)},
        "batching": {
            "batch_size": batch_size, "real_tokens": real,
            **{k: {"computed": v, "real_share": real / max(1, v)} for k, v in schemes.items()},
            "speedup_vs_padded_random": schemes["padded_random"] / max(1, packed_cost),
            "speedup_vs_length_grouped": schemes["length_grouped"] / max(1, packed_cost),
        },
        "rank_imbalance": {str(r): rank_imbalance(row_stats, r, seed) for r in RANKS},
        "config": manifest.config,
    }


def write_report(out: str | Path, manifest: Manifest | None = None, *, html_path: str | Path | None = None) -> dict:
    from packer.report.html import render

    out = Path(out)
    data = report(out, manifest)
    write_text_atomic(out / "report.json", json.dumps(data, indent=2, sort_keys=True) + "\n")
    write_text_atomic(Path(html_path) if html_path else out / "report.html", render(data))
    return data
