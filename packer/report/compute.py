"""The report: merged shard stats plus the comparisons a user cares about.

All numbers come from the packed shards (and the manifest's accounting), so
``packer report OUT`` recomputes them for any build of this schema version:

- fill = tokens / (rows x max_length); L1 = ceil(tokens / max_length) and the gap to it (a row of a source
  with its own ``max_length`` at that capacity, the bound summed over ``policy_groups``); ``sources``: each
  input entry's records, outcomes, rows, tokens, bound and fill (the manifest's ``stats.sources``);
- per modality: samples, tokens, trained tokens, media items and media tokens;
- histograms of sample lengths (per modality), segments per row and fill per row;
- attention work: sum of seg^2 over rows, against rows x L^2 for dense causal masks;
- tokens computed for the same samples when (a) random batches of B are padded to their
  longest, (b) batches of B are length-grouped within a modality (mega-batches of 50 B
  sorted by length, as HF's LengthGroupedSampler / Prismatic's split-modality sampler),
  (c) packed -- as the share of real tokens and the speed-up of packing;
- per-step cost imbalance (slowest rank / mean rank) for the sampler the build records
  (``report_ranks`` x ``report_batch`` rows, ``report_window``; default 8 and 64 ranks x 1
  row, window 64): random order vs :class:`TokenBalancedSampler`'s assignment, by the mean
  over steps and weighted by step time, against the best any assignment of the rows reaches;
- padding saved by packing, in tokens and in GPU-hours at a stated throughput
  (``tokens_per_gpu_second``, default :data:`TOKENS_PER_GPU_SECOND`);
- which samples were truncated (from the packed shards against the samples shards), which
  were dropped (``dropped.jsonl``) and the quarantine's reasons with examples (file:line,
  id, detail); lists capped at :data:`LIST_CAP` entries, with the total count;
- ``title``: the build's ``name`` when one is set, else the output folder's name;
- ``trained_tokens`` / ``trained_share``: the tokens with a label, of all tokens;
- ``sample_row`` (one row decoded, trained tokens marked) and ``media`` (tokens per image / clip,
  image sizes and clip durations): :mod:`packer.report.examples`; ``oversize.audio_truncated``,
  clips cut to the audio encoder's window;
- ``family``: the model family, its processor class, checkpoint and resolved settings
  (:mod:`packer.report.family`); ``media_counts``: images / videos / audio clips packed and their
  placeholder tokens; ``config``: the resolved config, without the generic image / audio / video
  policies for a named family's build (they played no part in it);
- ``preference`` (a ``--preference`` build): records, responses, the layout, and the tokens the
  packed records take as pairs and as trees (``saved_against_pairs``); the batching comparison
  counts each response as it runs alone (a tree's branch with its prompt).
"""

from __future__ import annotations

import dataclasses
import json
from collections import Counter
from functools import reduce
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from packer.config import FIELDS, BuildConfig
from packer.cost import COSTS, CostModel
from packer.errors import ConfigError
from packer.io.files import sha256_file, write_text_atomic
from packer.io.fs import location
from packer.report.examples import media_section, sample_row
from packer.report.family import family_section, media_counts, shown_config
from packer.schedule.balance import imbalance, imbalance_floor, token_balanced
from packer.schedule.steps import absent_costs, cost_note, measure, plan_steps
from packer.shards.io import read_shards
from packer.shards.manifest import REPORT_FILES, Manifest
from packer.shards.schema import SAMPLE_SCHEMA, ShardEntry
from packer.shards.stats import ROW_FIELDS, ShardStats, length_edges
from packer.shards.stats import shard_stats as _shard_stats

MEGABATCH = 50
# Training throughput the GPU-hour figures assume: about a 7B dense model (6 x 7e9 FLOP per token) on one
# H100-class GPU at ~40% MFU. A linear cost per token: attention's quadratic term is left out.
TOKENS_PER_GPU_SECOND = 10_000
LIST_CAP = 100  # truncated / dropped samples listed in report.json (the counts are always total)
DETAIL_CHARS = 300  # a quarantine or drop detail is cut to this many characters


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


def rank_imbalance(stats: dict[str, np.ndarray], ranks: int, seed: int, per_rank: int, window: int,
                   cost_model: CostModel | None = None) -> dict[str, Any] | None:
    """Slowest-rank / mean-rank cost (the default cost model) of one epoch at ``ranks`` x
    ``per_rank`` rows: in random order (``random``: row k of a step to rank k mod R) and as
    :class:`~packer.loader.TokenBalancedSampler` with this ``window`` deals the rows
    (``sampler``); each as the mean over steps and, ``_weighted``, as Σ slowest / Σ mean (the
    one that measures ranks waiting). ``best_weighted``: :func:`~packer.schedule.balance.imbalance_floor`
    of the same rows, the optimum at one row per rank and a lower bound above it. ``costs``: per order (and
    ``plan``, :func:`packer.schedule.steps.plan_steps` of the same rows: ``packer steps``, :class:`StepPlanSampler`), Σ
    slowest / Σ mean of each of the three costs under ``cost_model`` (:meth:`CostModel.vector`) and the
    simulated time (:func:`packer.schedule.steps.measure`)."""
    cost_model = cost_model or CostModel()
    costs = CostModel()(stats)
    per_step = ranks * per_rank
    steps = len(costs) // per_step
    if steps == 0:
        return None
    order = np.random.default_rng(seed).permutation(len(costs))[: steps * per_step]
    plans = {"random": order.reshape(steps, per_rank, ranks).transpose(0, 2, 1),
             "sampler": token_balanced(costs, ranks, per_rank, seed=seed, window=window, steps=steps)}  # same order
    vector = cost_model.vector(stats)[order]
    plans["plan"] = plan_steps(vector, ranks, per_rank, seed=seed, drop_last=True)
    return {"steps": int(steps), **{k: imbalance(costs, v) for k, v in plans.items() if k != "plan"},
            **{f"{k}_weighted": imbalance(costs, v, weighted=True) for k, v in plans.items() if k != "plan"},
            "best_weighted": imbalance_floor(costs[order], ranks, per_rank),
            "costs": {k: measure(cost_model.vector(stats), v if k != "plan" else order[v], COSTS)
                      for k, v in plans.items()}}


def step_balance(stats: dict[str, np.ndarray], manifest: Manifest, seed: int) -> dict[str, Any]:
    """:func:`rank_imbalance` for the sampler the build records (``report_ranks``,
    ``report_batch``, ``report_window``: report-only settings, kept in the manifest's
    ``execution``), so ``packer report OUT`` shows the same set-up; packer's defaults for a
    build that predates them. ``by_ranks`` holds ``null`` where the rows fill no step. ``absent``: the costs no row
    has under the build's cost model, with why (:func:`packer.schedule.steps.absent_costs`); their figures in ``costs`` are
    ``null``, not the 1.0 that would read as a perfect balance."""
    recorded = {k: manifest.execution.get(k, FIELDS[k].default) for k in ("report_ranks", "report_batch", "report_window")}
    ranks = [int(r) for r in recorded["report_ranks"]]
    per_rank, window = int(recorded["report_batch"]), int(recorded["report_window"])
    model = CostModel.of_build(manifest)
    absent = absent_costs(model.vector(stats), stats, note=cost_note(manifest),
                          fix="build with --cost-model (packer calibrate writes one, or the model's config.json)")
    by_ranks = {str(r): rank_imbalance(stats, r, seed, per_rank, window, model) for r in ranks}
    for figures in (c for v in by_ranks.values() if v for c in v["costs"].values()):
        figures.update(dict.fromkeys(absent))  # no figure: the reason is in "absent"
    return {"ranks": ranks, "rows_per_rank": per_rank, "window": window, "best_is_bound": per_rank > 1,
            "by_ranks": by_ranks, "absent": absent}


def title(out: Path, manifest: Manifest) -> str:
    """The build's ``name`` when one is set, else the output folder's name.

    A pipeline file sets ``name``; a build that should be titled by its folder (``-i/-o``
    on the command line) leaves it empty. An fsspec output built in a staging folder is
    named by the URL's last part, which the manifest records."""
    name = str(manifest.config.get("name") or "").strip()
    if name:
        return name
    target = str(manifest.execution.get("output") or "")
    if "://" in target:
        return target.rstrip("/").rsplit("/", 1)[-1] or target
    return out.resolve().name or str(out)


def _short(text: Any, limit: int = DETAIL_CHARS) -> str:
    text = "" if text is None else str(text)
    return text if len(text) <= limit else text[: limit - 1] + "\u2026"


def _jsonl(path: Path):
    if path.is_file():
        with path.open(encoding="utf-8") as f:
            for line in f:
                if line.strip():
                    yield json.loads(line)


def quarantine_examples(out: Path, manifest: Manifest, per_reason: int = 3) -> list[dict[str, Any]]:
    """Per reason, most frequent first: the count and the first ``per_reason`` entries
    (``examples`` as ``file:line``; ``entries`` with the id and the detail text)."""
    if manifest.files.quarantine is None:
        return []
    entries: dict[str, list[dict[str, Any]]] = {}
    counts: Counter[str] = Counter()
    for e in _jsonl(out / manifest.files.quarantine.file):
        counts[e["reason"]] += 1
        if len(entries.setdefault(e["reason"], [])) < per_reason:
            entries[e["reason"]].append({"file": e["file"], "line": e["line"], "id": e.get("id"),
                                         "detail": _short(e.get("detail"))})
    return [{"reason": r, "count": n, "examples": [f"{e['file']}:{e['line']}" for e in entries[r]], "entries": entries[r]}
            for r, n in counts.most_common()]


def dropped_samples(out: Path, manifest: Manifest, cap: int = LIST_CAP) -> dict[str, Any]:
    """``dropped.jsonl``: the total, by reason, and the first ``cap`` entries."""
    listed: list[dict[str, Any]] = []
    by_reason: Counter[str] = Counter()
    if manifest.files.dropped is not None:
        for e in _jsonl(out / manifest.files.dropped.file):
            by_reason[e["reason"]] += 1
            if len(listed) < cap:
                listed.append({"file": e["file"], "line": e["line"], "id": e.get("id"), "reason": e["reason"],
                               "detail": _short(e.get("detail"))})
    count = sum(by_reason.values())
    return {"count": count, "by_reason": dict(by_reason.most_common()), "listed": listed, "capped": count > len(listed)}


def truncated_samples(out: Path, manifest: Manifest, s: ShardStats, cap: int = LIST_CAP, samples: pa.Table | None = None,
                      keys=None) -> dict[str, Any]:
    """Which samples ``--oversize truncate`` cut: a packed segment (identity = input file,
    line) shorter than its sample in the samples shards. Only ``truncate`` counts samples as
    truncated, and it keeps one piece from token 0, so no segment_start check is needed
    (under ``split`` a short first piece is a split, not a truncation). A build passes the
    samples' source, line and length columns it planned from (``samples``) and ``keys(indices)``
    for the few listed, so it reads no samples shard."""
    count = int(manifest.stats.get("truncated_samples", 0))
    result: dict[str, Any] = {"count": count, "tokens_cut": int(manifest.stats.get("truncated_tokens", 0)),
                              "found": 0, "listed": [], "capped": False}
    if not count or not manifest.files.samples:
        return result
    if samples is None:
        samples = read_shards([out / e.file for e in manifest.files.samples], SAMPLE_SCHEMA)
        keys = lambda indices: samples.column("key").take(pa.array(indices)).to_pylist()  # noqa: E731
    if samples.num_rows == 0:
        return result
    sample_id = (samples.column("source_index").to_numpy().astype(np.int64) << 40) | samples.column("source_line").to_numpy()
    sample_len = samples.column("length").to_numpy().astype(np.int64)
    listed = "response_lengths" if "response_lengths" in samples.column_names else "responses"  # plan columns, or samples
    preference = pc.list_value_length(samples.column(listed)).to_numpy(zero_copy_only=False) > 0
    sample_id[preference] = -1  # a preference record's segments are its responses, never a truncation
    order = np.argsort(sample_id, kind="stable")
    seg_id = s.array("seg_identity").astype(np.int64)
    seg_len = s.array("seg_lengths").astype(np.int64)
    pos = order[np.clip(np.searchsorted(sample_id[order], seg_id), 0, max(0, len(order) - 1))]
    known = sample_id[pos] == seg_id
    cut = np.flatnonzero(known & (seg_len < sample_len[pos]))
    cut = cut[np.lexsort((seg_id[cut] & ((1 << 40) - 1), seg_id[cut] >> 40))]  # by input file, then line
    for k, key in zip(cut[:cap].tolist(), keys(pos[cut[:cap]]), strict=True):
        source = int(seg_id[k] >> 40)
        result["listed"].append({"file": manifest.inputs[source] if source < len(manifest.inputs) else str(source),
                                 "line": int(seg_id[k] & ((1 << 40) - 1)), "id": key, "kept_tokens": int(seg_len[k]),
                                 "cut_tokens": int(sample_len[pos[k]] - seg_len[k])})
    result["found"] = int(len(cut))
    result["capped"] = len(cut) > len(result["listed"])
    return result


def preference_section(s: ShardStats, manifest: Manifest) -> dict[str, Any] | None:
    """What a ``--preference`` build packed: records, responses, and its records' tokens as pairs and as trees
    (the manifest's, from the plan: both layouts, whichever was built), with the tokens the tree saves."""
    recorded = manifest.stats.get("preference")
    if not recorded and not s.preference_records:
        return None
    recorded = recorded or {}
    pairs, tree = int(recorded.get("pairs_tokens", 0)), int(recorded.get("tree_tokens", 0))
    return {"layout": manifest.config.get("preference", "none"), "records": s.preference_records,
            "responses": s.responses, "tree_prompts": s.tree_prompts, "tree_branches": s.tree_branches,
            "pairs_tokens": pairs, "tree_tokens": tree, "saved_against_pairs": pairs - tree,
            "saved_share": (pairs - tree) / max(1, pairs), "saved_in_rows": s.tokens_saved}


def padding_saved(schemes: dict[str, int], real: int, tokens_per_gpu_second: float) -> dict[str, Any]:
    """Padding per scheme (tokens computed - real tokens) and what packing saves against each,
    in tokens and in GPU-hours for one pass over the data at ``tokens_per_gpu_second``."""
    hours = lambda tokens: tokens / tokens_per_gpu_second / 3600  # noqa: E731
    packed = schemes["packed"]
    return {
        "tokens_per_gpu_second": tokens_per_gpu_second,
        "padding_tokens": {k: v - real for k, v in schemes.items()},
        "padding_gpu_hours": {k: hours(v - real) for k, v in schemes.items()},
        "saved_by_packing": {k: {"tokens": v - packed, "gpu_hours": hours(v - packed)}
                             for k, v in schemes.items() if k != "packed"},
    }


def report(out: str | Path, manifest: Manifest | None = None, *, batch_size: int = 8, seed: int = 0,
           tokens_per_gpu_second: float = TOKENS_PER_GPU_SECOND, shard_stats: list[ShardStats] | None = None,
           samples: tuple | None = None) -> dict[str, Any]:
    """``shard_stats``: the packed shards' stats in manifest order when the caller has them (a build's
    stage-3 workers computed them), else computed here from the shards; ``samples``: ``(columns,
    keys)`` for :func:`truncated_samples` when the caller has them (a build), else read from the shards."""
    out = location(out)
    manifest = manifest or Manifest.read(out)
    shards = shard_stats if shard_stats is not None else [_shard_stats(out / e.file) for e in manifest.files.packed]
    s = reduce(ShardStats.merge, shards, ShardStats())
    cap = manifest.max_length
    alone = s.array("seg_alone").astype(np.int64)  # a tree's branch with its prompt, the prompt itself left out
    kept = alone > 0
    lengths = alone[kept]
    modality = (s.array("seg_modality").astype(object) if s.seg_modality else np.zeros(0, dtype=object))[kept]
    real = int(lengths.sum())
    groups = manifest.stats.get("policy_groups") or []  # sources planned apart, each group at its own capacity
    lower = manifest.lower_bound(s.tokens)
    rng = np.random.default_rng(seed)
    row_cap = row_capacities(manifest, s)
    packed_cost = int(computed_rows(manifest, s, row_cap, batch_size, seed).sum())
    schemes = {
        "padded_random": padded_tokens(lengths, batch_size, rng),
        "length_grouped": grouped_tokens(lengths, modality, batch_size, rng),
        "packed": packed_cost,
    }
    edges = length_edges(cap)
    row_fill = s.array("row_tokens") / row_cap if s.rows else np.zeros(0)
    row_stats = {name: s.array(f"row_{name}") for name in ROW_FIELDS}
    acc, stats = manifest.accounting, manifest.stats
    trained = sum(m.trained_tokens for m in s.per_modality.values())
    return {
        "schema_version": manifest.schema_version,
        "title": title(out, manifest),
        "build": {"name": manifest.config.get("name", ""), "created_at": manifest.created_at,
                  "packer_version": manifest.packer_version},
        "records": acc.records_read, "samples": s.samples(), "segments": s.segments, "duplicate_ids": s.duplicate_ids(),
        "rows": s.rows, "tokens": s.tokens, "max_length": cap,
        "fill": s.tokens / max(1, int(row_cap.sum())),
        "lower_bound": lower, "gap_to_lower_bound": s.rows - lower, "policy_groups": groups,
        "sources": manifest.stats.get("sources") or [],
        "row_budget": manifest.stats.get("row_budget"),
        "trained_tokens": trained, "trained_share": trained / max(1, s.tokens),
        "per_modality": {k: v.__dict__ for k, v in sorted(s.per_modality.items())},
        "histograms": {
            "length_edges": edges.tolist(),
            "sample_lengths": {m: np.histogram(lengths[modality == m], bins=edges)[0].tolist() for m in sorted(s.per_modality)},
            "segments_per_row": {str(k): v for k, v in sorted(s.segments_per_row.items())},
            "fill_edges": np.linspace(0, 1, 11).tolist(),
            "fill_per_row": np.histogram(np.minimum(row_fill, 1), bins=np.linspace(0, 1, 11))[0].tolist(),
        },
        "accounting": {**dataclasses.asdict(acc), "content_changed": stats.get("content_changed", {})},
        "oversize": {k: stats.get(k, 0) for k in ("truncated_samples", "truncated_tokens", "split_samples", "split_pieces",
                                                  "split_pieces_dropped", "split_lost_media", "audio_truncated")},
        "sample_row": sample_row(out, manifest),
        "media": media_section(manifest, s),
        "preference": preference_section(s, manifest),
        "quarantine_top": quarantine_examples(out, manifest),
        "truncated": truncated_samples(out, manifest, s, LIST_CAP, *(samples or ())),
        "dropped": dropped_samples(out, manifest),
        "attention": {"block_diagonal": s.attention, "dense": float((row_cap.astype(np.float64) ** 2).sum()),
                      "ratio": s.attention / max(1.0, float((row_cap.astype(np.float64) ** 2).sum()))},
        "batching": {
            "batch_size": batch_size, "real_tokens": real,
            **{k: {"computed": v, "real_share": real / max(1, v)} for k, v in schemes.items()},
            "speedup_vs_padded_random": schemes["padded_random"] / max(1, packed_cost),
            "speedup_vs_length_grouped": schemes["length_grouped"] / max(1, packed_cost),
        },
        "padding": padding_saved(schemes, real, tokens_per_gpu_second),
        "rank_imbalance": step_balance(row_stats, manifest, seed),
        "family": family_section(manifest),
        "media_counts": media_counts(s.array("span_kinds") if s.span_kinds else [], s.array("span_tokens")),
        "config": shown_config(manifest),
    }


def computed_rows(manifest: Manifest, s: ShardStats, row_cap: np.ndarray, batch: int, seed: int) -> np.ndarray:
    """The positions a trainer computes for each packed row: a packed row its capacity (filled to it, batches padded
    to it); a row of one sample by policy (``packing = false``) what the collator pads it to, its batch's longest,
    the rows of such sources in random batches of ``batch`` like the padded baseline -- not its capacity, which
    would count a short sample as a full row and show packing slower than padding."""
    computed = row_cap.astype(np.int64).copy()
    unpacked = np.asarray(manifest.file_unpacked(), bool)
    if not s.rows or not s.row_file or not unpacked.any():
        return computed
    rows = np.flatnonzero(unpacked[s.array("row_file").astype(np.int64)])
    tokens = s.array("row_tokens").astype(np.int64)[rows]
    order = np.random.default_rng(seed).permutation(len(rows))
    for k in range(0, len(rows), batch):
        part = order[k : k + batch]
        computed[rows[part]] = tokens[part].max()
    return computed


def row_capacities(manifest: Manifest, s: ShardStats) -> np.ndarray:
    """Each row's capacity: its first segment's source's own ``max_length``, else the build's (a source's own
    packing: rows never mix sources of two policies)."""
    caps = np.asarray(manifest.file_capacities(), np.int64)
    if not s.row_file or not len(caps):
        return np.full(s.rows, manifest.max_length, np.int64)
    return caps[s.array("row_file").astype(np.int64)]


REPORT_SETTINGS = ("report_ranks", "report_batch", "report_window")


def refresh_report(out: str | Path, *, html_path: str | Path | None = None, **settings: Any) -> dict:
    """``packer report OUT``: recompute the report of a finished build, with the report settings
    given (``report_ranks``, ``report_batch``, ``report_window``; None: the build's) recorded in
    its manifest, whose entries for ``report.json`` / ``report.html`` are updated to the new files
    (so ``packer verify`` keeps passing). Refuses a setting outside its range, as a build does."""
    out = location(out)
    unknown = sorted(set(settings) - set(REPORT_SETTINGS))
    if unknown:
        raise ConfigError(f"unknown report setting(s) {', '.join(unknown)}; known: {', '.join(REPORT_SETTINGS)}")
    manifest = Manifest.read(out)
    given = {k: (tuple(v) if isinstance(v, (list, tuple)) else v) for k, v in settings.items() if v is not None}
    if given:
        BuildConfig(**given)  # the build's own checks (ConfigError): ranks >= 1, batch >= 1, window >= 1
        manifest.execution = {**manifest.execution, **{k: list(v) if isinstance(v, tuple) else v for k, v in given.items()}}
    data = write_report(out, manifest, html_path=html_path)
    here = html_path is None or Path(html_path).resolve() == (out / "report.html").resolve()
    written = [n for n in REPORT_FILES if n == "report.json" or here]
    entries = {e.file: e for e in manifest.report_files}
    for name in written:
        entries[name] = ShardEntry(name, 0, (out / name).stat().st_size, sha256_file(out / name))
    manifest.execution["report_files"] = [dataclasses.asdict(entries[n]) for n in REPORT_FILES if n in entries]
    manifest.write(out)
    return data


def write_report(out: str | Path, manifest: Manifest | None = None, *, html_path: str | Path | None = None,
                 tokens_per_gpu_second: float = TOKENS_PER_GPU_SECOND, shard_stats: list[ShardStats] | None = None,
                 samples: tuple | None = None) -> dict:
    from packer.report.html import render

    out = location(out)
    data = report(out, manifest, tokens_per_gpu_second=tokens_per_gpu_second, shard_stats=shard_stats, samples=samples)
    write_text_atomic(out / "report.json", json.dumps(data, indent=2, sort_keys=True) + "\n")
    write_text_atomic(Path(html_path) if html_path else out / "report.html", render(data))
    return data
