"""``packer build``: run the stages in order over one output folder.

    1. encode       engine.map over input chunks  -> samples/*.arrow, quarantine.jsonl
    2. plan         in this process, lengths only -> plan.arrow
    3. materialize  engine.map over plan chunks   -> packed/*.arrow
    4. manifest     accounting checked            -> manifest.json (last: the build is done)
"""

from __future__ import annotations

import shutil
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.compute as pc

from packer.config import BuildConfig
from packer.encode import EncoderSpec
from packer.engine import get_engine
from packer.errors import ConfigError, NotAvailableError
from packer.io.arrow import read_shards, write_shard
from packer.io.files import atomic_open, sha256_file
from packer.schema import SAMPLE_SCHEMA, ShardEntry
from packer.stages import encode, materialize
from packer.stages.manifest import FileAccount, accounting, write_manifest
from packer.stages.planning import plan_samples, plan_table

SMALL_INPUT_BYTES = 16 * 2**20
OWNED = ("samples", "packed", "plan.arrow", "quarantine.jsonl", "manifest.json", "report.json", "report.html")


def build(config: BuildConfig, *, progress: bool = True) -> dict[str, Any]:
    """Build ``config.output`` from ``config.input``; returns the manifest."""
    if config.oversize == "split":
        raise NotAvailableError("--oversize split is not available yet in this version; use truncate or drop")
    files = config.input_files()
    engine = get_engine(config.engine, auto_workers(config.workers, files))
    out = prepare_output(Path(config.output))
    spec = EncoderSpec.from_config(config)
    driver = encode.setup(spec, str(out), config.strict)  # also checks the tokenizer before any work

    # Stage 1: encode.
    counts: dict[str, int] = {}
    by_file = {str(f): FileAccount() for f in files}
    quarantined: Counter[str] = Counter()
    lengths, sample_file, sample_shards = [], [], []
    n_bad = 0
    tasks = encode.make_tasks(files, config.chunk_records, counts)
    with atomic_open(out / "quarantine.jsonl", "w") as qf, _bar(progress, "encode", "rec") as bar:
        for res in engine.map(encode.encode_task, tasks, encode.setup, (spec, str(out), config.strict), in_process_state=driver):
            for entry in res.quarantine:
                qf.write(entry.to_json() + "\n")
                quarantined[entry.reason] += 1
            acc = by_file[res.file]
            acc.records += res.records
            acc.quarantined += len(res.quarantine)
            n_bad += len(res.quarantine)
            lengths.append(res.lengths)
            sample_file.append(np.full(len(res.lengths), list(by_file).index(res.file), dtype=np.int32))
            if res.shard is not None:
                sample_shards.append(res.shard)
            bar.update(res.records)
    qpath = out / "quarantine.jsonl"
    quarantine = ShardEntry(qpath.name, n_bad, qpath.stat().st_size, sha256_file(qpath))
    all_lengths = np.concatenate(lengths) if lengths else np.zeros(0, np.int32)
    file_of_sample = np.concatenate(sample_file) if sample_file else np.zeros(0, np.int32)

    # Stage 2: plan.
    samples = read_shards([out / e.file for e in sample_shards], SAMPLE_SCHEMA)
    outcome = plan_samples(
        all_lengths, samples, capacity=config.max_length, oversize=config.oversize,
        algorithm=config.algorithm, seed=config.seed, shuffle_rows=config.shuffle_rows,
    )
    p = outcome.plan
    plan_entry = write_shard(out / "plan.arrow", plan_table(p), out)

    # Stage 3: materialize.
    bin_tokens = p.bin_tokens()
    tasks3 = materialize.shard_tasks(bin_tokens, np.diff(p.offsets), config.shard_rows, config.shard_bytes)
    packed = []
    with _bar(progress, "pack", "row", total=p.n_bins) as bar:
        state = (str(out), [e.file for e in sample_shards])
        for entry in engine.map(materialize.materialize_task, tasks3, materialize.setup, state):
            packed.append(entry)
            bar.update(entry.rows)

    # Stage 4: accounting and manifest.
    names = list(by_file)
    dropped_per_file = np.bincount(file_of_sample[outcome.dropped_samples], minlength=len(names))
    samples_per_file = np.bincount(file_of_sample, minlength=len(names))
    for k, name in enumerate(names):
        by_file[name].dropped = int(dropped_per_file[k])
        by_file[name].packed = int(samples_per_file[k] - dropped_per_file[k])
    tokens = int(bin_tokens.sum())
    modality = pc.value_counts(samples.column("modality").cast("string").take(p.indices)).to_pylist() if len(p.indices) else []
    stats = {
        "max_length": config.max_length,
        "rows": p.n_bins,
        "segments": int(len(p.indices)),
        "tokens": tokens,
        "fill": tokens / max(1, p.n_bins * config.max_length),
        "lower_bound": p.lower_bound,
        "gap_to_lower_bound": p.n_bins - p.lower_bound,
        "truncated_samples": outcome.truncated_samples,
        "truncated_tokens": outcome.truncated_tokens,
        "samples_by_modality": {m["values"]: m["counts"] for m in sorted(modality, key=lambda m: m["values"])},
    }
    return write_manifest(
        out, config=config.to_dict(), tokenizer=driver.encoder.fingerprint(), samples=sample_shards,
        packed=packed, plan=plan_entry, quarantine=quarantine,
        accounts=accounting(by_file, dict(quarantined), outcome.dropped, counts.get("blank_lines", 0)),
        stats=stats,
    )


def auto_workers(workers: int, files: list[Path]) -> int:
    """``0`` means one per core, except for small inputs, where starting worker
    processes (each loads the tokenizer) costs more than it saves."""
    if workers == 0 and sum(f.stat().st_size for f in files) < SMALL_INPUT_BYTES:
        return 1
    return workers


def prepare_output(out: Path) -> Path:
    """Clear what an earlier build left in ``out``; refuse a folder packer does not own."""
    if out.exists():
        if not out.is_dir():
            raise ConfigError(f"output {out} exists and is not a folder")
        entries = list(out.iterdir())
        if entries and not any(e.name in OWNED for e in entries):
            raise ConfigError(f"output {out} is not empty and holds no packer build; choose another -o or empty it")
        (out / "manifest.json").unlink(missing_ok=True)  # first, so a half-done rebuild never looks finished
        for e in entries:
            if e.name in OWNED or ".tmp-" in e.name:
                shutil.rmtree(e) if e.is_dir() else e.unlink(missing_ok=True)
    out.mkdir(parents=True, exist_ok=True)
    return out


def _bar(enabled: bool, desc: str, unit: str, total: int | None = None):
    from tqdm import tqdm

    return tqdm(total=total, desc=desc, unit=unit, disable=None if enabled else True, leave=False)
