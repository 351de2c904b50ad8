"""Stages 2 to 4 of a build or a repack: plan, materialize the packed rows, write the report and the manifest.

:class:`Encoded` is what stage 1 leaves for them (rebuilt from a manifest by :mod:`packer.pipeline.repack`).
"""

from __future__ import annotations

import dataclasses
import json
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np

from packer.config.fields import BuildConfig
from packer.io.files import atomic_open, sha256_file
from packer.pack import Plan
from packer.pipeline.accounting import _count_outcomes, _file_of_sample, check_bad_fraction, plan_stats
from packer.pipeline.encoded import Encoded
from packer.progress import Stage
from packer.shards.io import read_shards, write_shard
from packer.shards.manifest import Files, Manifest
from packer.shards.schema import SAMPLE_SCHEMA, ShardEntry
from packer.stages import materialize
from packer.stages.manifest import accounting
from packer.stages.media_shards import blob_entries, unpacked_setup, unpacked_task
from packer.stages.planning import (
    CAP_FIELDS,
    SampleRows,
    media_counts,
    own_caps,
    plan_build,
    plan_columns,
    plan_table,
    preference_responses,
)
from packer.stages.sources import quarantined_by_file, source_accounts
from packer.stages.state import INTERRUPTED, code_identity


def plan_and_pack(out: Path, config: BuildConfig, encoded: Encoded, tokenizer: dict[str, Any], engine, progress, *,
                  media_root: str = "", sections: dict[str, Any] | None = None,
                  repacked_from: dict[str, Any] | None = None, tokenizer_files: list[ShardEntry] | None = None,
                  media_index: ShardEntry | None = None, earlier: str = INTERRUPTED, embed: bool = False,
                  blob_store: tuple[Path, list[ShardEntry]] | None = None) -> Manifest:
    """Stages 2-4 over the samples in ``out/samples``: planned from their columns (stage 1's results),
    whole rows read only for the few samples that need them (over capacity, dropped); ``earlier``: the run a
    resume reuses finished shards from, named on the pack stage's line; ``embed``: each packed shard gets its media
    shard (:mod:`packer.stages.media_shards`), from stage 1's -- or, in a repack, from ``blob_store`` (the source
    build's folder and media shards). The blobs no packed row uses then go to the leftover shard, and stage 1's media
    shards are deleted once the manifest is written: the finished build holds each blob once."""
    paths, shas = [out / e.file for e in encoded.sample_shards], [e.sha256 for e in encoded.sample_shards]
    rows = SampleRows(paths, [e.rows for e in encoded.sample_shards], shas)
    samples = encoded.columns if encoded.columns is not None else plan_columns(read_shards(paths, SAMPLE_SCHEMA, shas))
    stage = Stage("plan", "samples", enabled=progress)
    p, m, keys = plan_build(samples, config, tokenizer, encoded.input_sources, rows)
    if keys is not None:  # no build writes a row its own loader refuses: each row holds one key at most
        check_row_keys(p, keys)
    dropped = {r: len(v) for r, v in p.dropped.items()}
    bound = f", encoder bound {p.resource_bound:,}" if p.budgets else ""
    stage.done(f"{samples.num_rows:,} samples -> {p.n_bins:,} rows (lower bound {p.lower_bound:,}{bound}), "
               f"{sum(dropped.values()):,} dropped")
    check_bad_fraction(out, config, encoded, tokenizer, dropped, packed=len(p.indices))
    plan_entry = write_shard(out / "plan.arrow", plan_table(p), out)  # deterministic: same bytes on a resume

    bin_tokens = p.bin_tokens()
    tasks = materialize.shard_tasks(bin_tokens, np.diff(p.offsets), config.shard_rows, config.shard_bytes)
    packed, stats, reused, media_shards = [], [], 0, []
    stage = Stage("pack", "rows", total=p.n_bins, enabled=progress)
    state = (str(out), [e.file for e in encoded.sample_shards], plan_entry.sha256, config.durable,
             [e.sha256 for e in encoded.sample_shards],
             blob_entries(encoded.sample_shards, encoded.blob_shards) if embed and blob_store is None else None,
             (str(blob_store[0]), blob_store[1]) if embed and blob_store is not None else None)
    # memory maps, cheap: with the local engine this process is a worker too (a Ray driver reads no shard)
    here = materialize.setup(*state) if engine.in_process else None
    for res in engine.map(materialize.materialize_task, tasks, materialize.setup, state, in_process_state=here):
        packed.append(res.shard)
        media_shards += [res.media] if res.media is not None else []
        stats.append(res.stats)
        reused += res.reused
        stage.advance(res.shard.rows)
    stage.done(f"{p.n_bins:,} rows in {len(packed)} shard(s)"
               + (f"; {reused} of {len(packed)} shards reused from {earlier}" if reused else ""))

    unpacked = None
    if embed:  # the blobs of samples in no packed row, kept once for a repack (stage 1's shards go below)
        root, store = blob_store if blob_store is not None else (out, encoded.blob_shards)
        args = (str(out), str(root), list(store), media_shards)
        [unpacked] = engine.map(unpacked_task, [0], unpacked_setup, args,
                                in_process_state=unpacked_setup(*args) if engine.in_process else None)

    by_file = {k: dataclasses.replace(v) for k, v in encoded.by_file.items()}
    _count_outcomes(by_file, encoded.inputs, samples, p, m)
    quarantine = out / encoded.quarantine.file if encoded.quarantine is not None else None
    sources = source_accounts(config, encoded.inputs, encoded.input_sources, by_file, _file_of_sample(samples), p,
                              quarantined_by_file(quarantine), media_counts(samples), preference_responses(samples).sample)
    manifest = Manifest(
        config=config.content_dict(), tokenizer=tokenizer, inputs=encoded.inputs, media_root=media_root,
        input_sources=list(encoded.input_sources),
        files=Files(samples=encoded.sample_shards, packed=packed, plan=plan_entry, quarantine=encoded.quarantine,
                    dropped=write_dropped(out, rows, p, file_caps(config, encoded), file_wheres(config, encoded)),
                    tokenizer=list(tokenizer_files or []),
                    media=media_index, sample_media=[] if embed else list(encoded.blob_shards), media_shards=media_shards,
                    unpacked_media=unpacked),
        accounting=accounting(by_file, encoded.quarantined, dropped, encoded.blank_lines),
        stats={**plan_stats(config, samples, p), "audio_truncated": encoded.audio_truncated,
               "content_changed": encoded.content_changed, "cost_model": encoded.cost_model, "sources": sources},
        execution=config.execution_dict(), sections=dict(sections or {}), repacked_from=repacked_from, code=code_identity(),
    )
    from packer.report import REPORT_FILES, write_report

    stage = Stage("report", "", enabled=progress)
    keys = lambda indices: rows(indices, ["key"]).column("key").to_pylist()  # noqa: E731
    # report.json and report.html from the workers' shard stats and the planned columns: no shard read back
    report = write_report(out, manifest, shard_stats=stats, samples=(samples, keys))
    manifest.stats["media"] = report["media_counts"]  # items and tokens per kind: inspect of a remote build reads it
    manifest.execution["report_files"] = [dataclasses.asdict(file_entry(out, name)) for name in REPORT_FILES]
    manifest.write(out)  # last: the build is done
    if embed:  # their blobs are in media/ and the leftover shard now; an interrupted build kept them to resume
        for e in encoded.blob_shards:
            (out / e.file).unlink(missing_ok=True)
    stage.done("report.json, report.html, manifest.json")
    return manifest


def check_row_keys(p: Plan, keys: np.ndarray) -> None:
    """Raise where a planned row holds samples of two row keys (a planner bug: never a row the loader refuses)."""
    if not p.n_bins:
        return
    k = keys[p.indices]
    keyed = np.where(k >= 0, k, np.iinfo(np.int64).max)
    lo = np.minimum.reduceat(keyed, p.offsets[:-1])
    hi = np.maximum.reduceat(np.where(k >= 0, k, -1), p.offsets[:-1])
    mixed = np.flatnonzero((hi >= 0) & (lo != hi))
    if len(mixed):
        raise AssertionError(f"the plan's row {int(mixed[0])} holds samples of row keys {int(lo[mixed[0]])} and "
                             f"{int(hi[mixed[0]])}: its family's model class could not take them in one call")


def file_entry(out: Path, name: str) -> ShardEntry:
    path = out / name
    return ShardEntry(name, 0, path.stat().st_size, sha256_file(path))


def write_dropped(out: Path, rows: SampleRows, p: Plan, caps: list[dict[str, int]] | None = None,
                  wheres: list[str] | None = None) -> ShardEntry:
    """``dropped.jsonl``: every sample the plan dropped, with its file, line, id and reason; the detail of an
    ``over_media_cap`` drop gives its media against the caps of its input file (``caps``: :func:`file_caps`). A
    sample of a table or a tar says what its ``line`` counts (``where``: ``row`` / ``member``, per input file:
    :func:`file_wheres`), as the quarantine does."""
    path = out / "dropped.jsonl"
    n = 0
    with atomic_open(path, "w") as f:
        for reason, indices in sorted(p.dropped.items()):
            if not len(indices):
                continue
            columns = ["source_file", "source_line", "key", "length", "source_index", "media"]
            for r in rows(np.sort(indices), columns).to_pylist():
                detail = f"{r['length']:,} tokens"
                if reason == "over_media_cap" and caps is not None:
                    detail = f"{over_caps(r['media'], caps[r['source_index']])}; {detail}"
                entry = {"file": r["source_file"], "line": r["source_line"], "id": r["key"], "reason": reason,
                         "detail": detail}
                if wheres is not None and wheres[r["source_index"]] != "line":
                    entry["where"] = wheres[r["source_index"]]
                f.write(json.dumps(entry, ensure_ascii=False, sort_keys=True) + "\n")
                n += 1
    return ShardEntry(path.name, n, path.stat().st_size, sha256_file(path))


def file_wheres(config: BuildConfig, encoded: Encoded) -> list[str]:
    """Per input file, what its records' numbers count: ``line``, ``row`` or ``member``
    (:func:`packer.ingest.units.where`)."""
    from packer.ingest.units import readings, where

    inputs = list(zip(encoded.inputs, encoded.input_sources or [0] * len(encoded.inputs), strict=True))
    return [where(fmt) for fmt, _ in readings(config.sources(), inputs)]


def file_caps(config: BuildConfig, encoded: Encoded) -> list[dict[str, int]]:
    """Per input file, the media caps its samples were planned with (its source's own, else the build's)."""
    sources = config.sources()
    return [own_caps(config, sources[k].options())[1] for k in (encoded.input_sources or [0] * len(encoded.inputs))]


def over_caps(media: list[dict[str, Any]], caps: dict[str, int]) -> str:
    """``3 images > max_images 2``: each cap a sample's media exceed (``total``: its items of every kind)."""
    held = Counter(m["kind"] for m in media)
    parts = []
    for kind, cap in caps.items():
        n = sum(held.values()) if kind == "total" else held.get(kind, 0)
        if n > cap:
            noun = "media items" if kind == "total" else ("audio clips" if kind == "audio" else f"{kind}s")
            parts.append(f"{n:,} {noun} > {CAP_FIELDS[kind]} {cap:,}")
    return ", ".join(parts) or f"media {dict(held)} within the caps {caps}"
