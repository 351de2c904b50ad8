"""``packer build`` and ``packer repack``: run the stages in order over one output folder.

    1. encode       engine.map over input chunks  -> samples/*.arrow, quarantine.jsonl
    2. plan         in this process, lengths only -> plan.arrow
    3. materialize  engine.map over plan chunks   -> packed/*.arrow
    4. manifest     accounting checked            -> manifest.json (last: the build is done)

``repack`` starts at stage 2 from another build's ``samples/``: a new context length or
plan without re-tokenizing a record or re-reading a media file.
"""

from __future__ import annotations

import dataclasses
import gc
import hashlib
import itertools
import json
import os
import shutil
import sys
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from packer import reasons
from packer.config import FIELDS, REPACK_KEYS, BuildConfig
from packer.encode import EncoderSpec
from packer.engine import freeze_collector, get_engine, stop_on_signals
from packer.errors import BuildFailedError, ConfigError
from packer.io import fs
from packer.io.files import atomic_open, set_durable, sha256_file
from packer.media.refs import media_base
from packer.pack import ALGORITHMS, Plan
from packer.pack.registry import check_supported
from packer.progress import Stage
from packer.shards.io import read_shards, write_shard
from packer.shards.manifest import SECTIONS, Files, Manifest
from packer.shards.schema import SAMPLE_SCHEMA, ShardEntry
from packer.stages import encode, materialize
from packer.stages.manifest import FileAccount, accounting
from packer.stages.media_files import write_media_index
from packer.stages.planning import (
    CAP_FIELDS,
    SampleRows,
    media_counts,
    modality_codes,
    own_caps,
    plan_build,
    plan_columns,
    plan_table,
    policy_groups,
    preference_responses,
)
from packer.stages.sources import quarantined_by_file, source_accounts
from packer.stages.state import INTERRUPTED, BuildLock, code_identity, fingerprint, open_state

SMALL_INPUT_BYTES = 16 * 2**20


@dataclass
class Encoded:
    """What stage 1 leaves for the later stages (also rebuilt from a manifest by repack)."""

    inputs: list[str]  # the input files in order: a sample's source_index points into it
    sample_shards: list[ShardEntry]
    by_file: dict[str, FileAccount]  # records and quarantined filled in
    quarantined: dict[str, int]
    quarantine: ShardEntry
    blank_lines: int
    input_sources: list[int] = field(default_factory=list)  # the `input` entry each input file came from
    audio_truncated: int = 0  # clips of the samples cut to the audio encoder's window (--long-audio truncate)
    content_changed: dict = field(default_factory=dict)  # Encoder.content_changed, summed over the tasks
    columns: pa.Table | None = None  # planning.plan_columns of every sample, from the stage-1 results (None: read the shards)
    media: list = field(default_factory=list)  # the media index's rows, one per file, from the stage-1 results
    cost_model: dict = field(default_factory=dict)  # the samples' cost model (packer.cost.resolve_cost_model's record)


def build(config: BuildConfig, *, progress: bool = True) -> Manifest:
    """Build ``config.output`` from ``config.input``; returns the manifest.

    Rerunning after a crash (same inputs and settings) resumes: finished stage-1 and
    stage-3 shards are reused and the result is byte-identical to an uninterrupted build.
    An fsspec URL output is written directly, by every worker (no shared disk needed);
    with ``staging_dir`` it is built in that local folder and uploaded when done. An output URL the
    store refuses (no credentials, a wrong endpoint) or one that keeps nothing (``memory://``) is
    refused first (:func:`packer.io.fs.check_reachable`).
    """
    if fs.is_url(config.output) and not config.output.startswith("file://"):
        fs.check_reachable(config.output, output=True)
    if fs.is_url(config.output) and config.staging_dir and not config.output.startswith("file://"):
        staging = config.staging_dir
        manifest = _build(dataclasses.replace(config, output=staging), progress)
        manifest.execution["output"] = config.output
        manifest.write(staging)
        fs.upload(Path(staging), config.output)
        return manifest
    return _build(config, progress)


@stop_on_signals()  # SIGTERM / SIGINT: workers killed, then Interrupted unwinds (lock released last)
def _build(config: BuildConfig, progress: bool) -> Manifest:
    check_plan_options(config)
    inputs = config.input_sources()
    files = [f for f, _ in inputs]
    check_output_outside_inputs(config, files)
    warn_duplicate_inputs(config)
    counts: dict[str, int] = {}
    tasks = encode.make_tasks(files, config.chunk_records, counts, config.max_line_bytes,
                              encode.task_bytes(sum(fs.stat(f)[0] for f in files)))
    engine = get_engine(config.engine, auto_workers(config.workers, files), address=config.ray_address,
                        cpus_per_task=config.cpus_per_task)
    head = list(itertools.islice(tasks, engine.workers))  # never more workers than tasks: the first few are cut now
    tasks = itertools.chain(head, tasks)
    media_root = media_base(config, files)
    spec = EncoderSpec.from_config(config, media_root, ship_files=config.engine == "ray")  # workers elsewhere
    setup_args = (spec, config.output, config.strict, config.durable, config.on_internal_error)
    with engine.started(encode.setup, setup_args, tasks=len(head)):  # its workers load the tokenizer while this process does
        driver = encode.setup(*setup_args)  # checks the tokenizer first,
        embedder, extractor = media_models(config)  # and the embedding weights, before an old build is touched
        out = fs.location(config.output)  # a local folder, or a URL (RemotePath) the workers write directly
        lock = BuildLock(out)
        frozen = freeze_collector()  # for this build only: unfrozen below (never when the process had frozen objects)
        try:
            tokenizer = driver.encoder.fingerprint()  # hashes the serialized tokenizer: once
            try:
                earlier = open_state(out, fingerprint(files, config.content_dict(), tokenizer, media_root, spec.cost_model),
                                     overwrite=config.overwrite)
            except ConfigError:
                lock.release(discard=True)  # refused: no lock file left in a folder that holds no build of ours
                raise
            set_durable(config.durable)  # this process; the stages' worker setups get it too
            warn_sample_tokenizer(config, files)  # once the build is under way (a refused one says only why)
            encoded = encode_inputs(out, files, tasks, counts, setup_args, driver, engine, progress, earlier=earlier)
            encoded.input_sources = [k for _, k in inputs]
            encoded.cost_model = spec.cost_model
            warn_no_encoder(out, driver.encoder.family.kinds, encoded)
            warn_internal_errors(out, encoded)
            check_bad_fraction(out, config, encoded, tokenizer)
            tokenizer_files = save_tokenizer(driver.encoder.shipped_tokenizer(), out)
            media_index = write_media_index(out, encoded.media)  # the workers looked the files up
            sections = media_passes(out, config, encoded, embedder, extractor, progress, engine, media_root)
            return plan_and_pack(out, config, encoded, tokenizer, engine, progress, media_root=media_root, earlier=earlier,
                                 sections=sections, tokenizer_files=tokenizer_files, media_index=media_index)
        finally:
            if frozen:
                gc.unfreeze()
            lock.release()


def sample_tokenizer(tokenizer: str) -> Path | None:
    """The ``sample_data`` folder when ``tokenizer`` is its toy tokenizer or one of its sample processor checkpoints
    (``sample_data/processors/NAME``: the family pipelines' own), else None."""
    path = Path(tokenizer)
    if not tokenizer or "://" in tokenizer or not path.is_dir():
        return None
    path = path.resolve()
    if path.parts[-2:] == ("sample_data", "tokenizer"):
        return path.parent
    return path.parents[1] if path.parts[-3:-1] == ("sample_data", "processors") else None


def warn_sample_tokenizer(config: BuildConfig, files: list) -> None:
    """One line on stderr when data from outside ``sample_data`` is built with the sample tokenizer or a sample
    processor checkpoint (a pipeline file run with -i / -o keeps it): the build would be useless for a real model."""
    which = config.tokenizer or config.processor
    folder = sample_tokenizer(which)
    if folder is None:
        return
    outside = [f for f in files if fs.is_url(f) or folder not in Path(f).resolve().parents]
    if outside:
        what = ("--tokenizer with your model's" if config.tokenizer or not config.processor
                else "--processor with your model's checkpoint")
        print(f"packer: warning: {outside[0]}{f' and {len(outside) - 1:,} more' if len(outside) > 1 else ''} built with "
              f"{which}, a toy the pipelines ship with for sample_data: pass {what} (a hub name or a folder)",
              file=sys.stderr)


def warn_no_encoder(out: Path, kinds: tuple[str, ...], encoded: Encoded) -> None:
    """One line on stderr when stage 1 quarantined records of a modality the model has no encoder for, naming
    each kind quarantined and its records (from the quarantine's details), and the kinds the build encodes."""
    n = encoded.quarantined.get("no_encoder", 0)
    if n:
        print(f"packer: warning: {n:,} record(s) hold media of a kind this pipeline declares no encoder for: "
              f"{no_encoder_kinds(out / encoded.quarantine.file)} (modalities: {', '.join(kinds) or 'text only'}); "
              f"quarantined as no_encoder in {out / 'quarantine.jsonl'} (--strict refuses them)", file=sys.stderr)


def no_encoder_kinds(quarantine) -> str:
    """``audio in 3 record(s), video in 1``: the kinds the ``no_encoder`` entries of a quarantine file name."""
    import re

    records: dict[str, int] = {}
    with quarantine.open("r", encoding="utf-8") as f:
        for line in f:
            entry = json.loads(line) if line.strip() else {}
            if entry.get("reason") == "no_encoder":
                held = str(entry.get("detail", "")).split(" but ", 1)[0]
                for kind in dict.fromkeys(re.findall(r"\d+ (image|audio|video) item", held)):
                    records[kind] = records.get(kind, 0) + 1
    return ", ".join(f"{k} in {v:,}{' record(s)' if not i else ''}" for i, (k, v) in enumerate(records.items())) or "?"


def warn_internal_errors(out: Path, encoded: Encoded) -> None:
    """One line on stderr for records quarantined by a packer bug (``--on-internal-error quarantine``)."""
    n = encoded.quarantined.get("internal_error", 0)
    if n:
        print(f"packer: warning: {n:,} record(s) met a packer bug and were quarantined as internal_error "
              f"(--on-internal-error quarantine; not counted by --max-bad-fraction); please report them: each is in "
              f"{out / 'quarantine.jsonl'}", file=sys.stderr)


def check_output_outside_inputs(config: BuildConfig, files: list) -> None:
    """Refuse, before anything is written or deleted, an output folder that holds an input file, or
    whose files an input pattern would match (``-i 'data/**/*.jsonl' -o data/out``): the build's own
    quarantine.jsonl would be read back on the next run, and ``--overwrite`` would delete a finished
    build, then fail on what it read."""
    if fs.is_url(config.output):
        return
    out = Path(os.path.abspath(config.output))
    inside = [f for f in files if not isinstance(f, str) and out.resolve() in Path(f).resolve().parents]
    own = [out / name for name in ("quarantine.jsonl", "dropped.jsonl", "samples/part-00000.arrow", "manifest.json")]
    caught = [(s.pattern, p) for s in config.sources() if not fs.is_url(s.pattern) for p in own
              if _pattern_matches(s.pattern, p)]
    if inside or caught:
        what = f"input {inside[0]} lies inside" if inside else f"input pattern {caught[0][0]!r} matches {caught[0][1]} in"
        raise ConfigError(f"{what} the output folder {config.output}: the build's own files would be read back as input; "
                          f"choose an -o outside the inputs, or narrow the -i pattern")


def _pattern_matches(pattern: str, path: Path) -> bool:
    """Would ``glob(pattern)`` (``**`` any number of folders) match ``path`` if it existed?"""
    import fnmatch
    import re

    if not any(c in pattern for c in "*?["):
        return False
    parts = Path(os.path.abspath(pattern)).parts
    target = path.parts
    regex = [None if p == "**" else re.compile(fnmatch.translate(p)) for p in parts]

    def match(i: int, j: int) -> bool:
        if i == len(regex):
            return j == len(target)
        if regex[i] is None:
            return any(match(i + 1, k) for k in range(j, len(target) + 1))
        return j < len(target) and bool(regex[i].match(target[j])) and match(i + 1, j + 1)

    return match(0, 0)


def warn_duplicate_inputs(config: BuildConfig) -> None:
    for first, again in config.duplicate_inputs():
        same = "is named twice" if str(first) == str(again) else f"is the same file as {first}"
        print(f"packer: warning: input {again} {same}; it is read once, as {first}", file=sys.stderr)


def check_bad_fraction(out: Path, config: BuildConfig, encoded: Encoded, tokenizer: dict[str, Any],
                       dropped: dict[str, int] | None = None, packed: int | None = None) -> None:
    """Fail the build, loudly, when too much of the input was lost: more than
    ``--max-bad-fraction`` of the records quarantined or dropped (``no_encoder`` aside: a
    declared choice, warned about), or nothing packed at all. Checked after stage 1
    (quarantine only: no time spent planning a lost cause) and after the plan."""
    records = sum(a.records for a in encoded.by_file.values())
    lost = {r: n for r, n in encoded.quarantined.items() if r not in reasons.NOT_BAD and r != "internal_error"}
    lost.update({r: lost.get(r, 0) + n for r, n in (dropped or {}).items()})
    bad = sum(lost.values())
    if records and bad / records > config.max_bad_fraction:
        message = (f"{bad:,} of {records:,} records ({100 * bad / records:.1f}%) were quarantined or dropped, over "
                   f"--max-bad-fraction {config.max_bad_fraction}: {reasons.top(lost)}. Each one is listed in "
                   f"{out / 'quarantine.jsonl'}{' and ' + str(out / 'dropped.jsonl') if dropped else ''}; fix the "
                   f"input, or pass --max-bad-fraction 1.0 to pack what is left")
    elif packed == 0 or (records and not encoded.sample_shards):
        message = (f"the build packed nothing: {records:,} records read, "
                   f"{sum(encoded.quarantined.values()):,} quarantined, {sum((dropped or {}).values()):,} dropped"
                   + (f" ({reasons.top({**encoded.quarantined, **(dropped or {})})})" if records else "")
                   + f"; see {out / 'quarantine.jsonl'}")
    else:
        return
    Manifest(config=config.content_dict(), tokenizer=tokenizer, inputs=encoded.inputs,
             files=Files(samples=encoded.sample_shards, quarantine=encoded.quarantine),
             accounting=accounting(encoded.by_file, encoded.quarantined, dict(dropped or {}), encoded.blank_lines,
                                   check=False),
             status="failed", failure=message, execution=config.execution_dict()).write(out)
    raise BuildFailedError(message)


def media_models(config: BuildConfig):
    """The optional embedding model and feature extractor, loaded before any record is read."""
    embedder = extractor = None
    if config.image_embeddings:
        from packer.media.embed import EmbedSpec, ImageEmbedder

        embedder = ImageEmbedder(EmbedSpec.from_config(config))
    if config.audio_features:
        from packer.media.features import FeatureSpec, WhisperFeatures

        extractor = WhisperFeatures(FeatureSpec.parse(config.audio_features))
    return embedder, extractor


def save_tokenizer(tok, out: Path) -> list[ShardEntry]:
    """``OUT/tokenizer/``: the tokenizer as the build used it, placeholder / begin / end
    tokens included, so ``AutoTokenizer.from_pretrained(OUT / "tokenizer")`` gives the
    manifest's ids. Written to a temporary folder and renamed into place."""
    if fs.is_remote(out):
        return _save_tokenizer_remote(tok, out)
    target = out / "tokenizer"
    tmp = out / ".tokenizer.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    tok.save_pretrained(str(tmp))
    shutil.rmtree(target, ignore_errors=True)
    os.replace(tmp, target)
    return [ShardEntry(p.relative_to(out).as_posix(), 0, p.stat().st_size, sha256_file(p)) for p in tokenizer_files(target)]


def tokenizer_files(folder: Path) -> list[Path]:
    """The files ``save_pretrained`` wrote under ``folder``, sorted, those of its subfolders included (a tokenizer of
    named chat templates saves them in ``additional_chat_templates/``)."""
    return sorted((p for p in folder.rglob("*") if p.is_file()), key=lambda p: p.relative_to(folder).as_posix())


def _save_tokenizer_remote(tok, out) -> list[ShardEntry]:
    """``save_tokenizer`` for a URL: saved locally, then each file written atomically to ``OUT/tokenizer/``."""
    import tempfile

    with tempfile.TemporaryDirectory(prefix="packer-tokenizer-") as tmp:
        tok.save_pretrained(tmp)
        entries = []
        for p in tokenizer_files(Path(tmp)):
            data, name = p.read_bytes(), p.relative_to(tmp).as_posix()
            with atomic_open(out / "tokenizer" / name, "wb") as f:
                f.write(data)
            entries.append(ShardEntry(f"tokenizer/{name}", 0, len(data), hashlib.sha256(data).hexdigest()))
    return entries


def media_passes(out: Path, config: BuildConfig, encoded: Encoded, embedder, extractor, progress, engine,
                 media_root: str = "") -> dict[str, Any]:
    if embedder is None and extractor is None:
        return {}
    from packer.stages import media_pass

    samples = read_shards([out / e.file for e in encoded.sample_shards], SAMPLE_SCHEMA)
    extra = {}
    if embedder is not None and config.engine == "ray":  # one task on a worker with embed_gpus GPUs
        extra["embeddings"] = engine.run_once(media_pass.embeddings_task, str(out), [e.file for e in encoded.sample_shards],
                                              config, media_root, num_gpus=config.embed_gpus)
    elif embedder is not None:
        stage = Stage("embed", "images", enabled=progress)
        extra["embeddings"] = media_pass.image_embeddings(out, samples, embedder, config, stage, media_root)
        stage.done(f"{stage.count:,} images")
    if extractor is not None:
        stage = Stage("features", "clips", enabled=progress)
        extra["audio_features"] = media_pass.audio_features(out, samples, extractor, config, stage, media_root)
        stage.done(f"{stage.count:,} clips")
    return extra


@stop_on_signals()
def repack(source: str | Path, *, progress: bool = True, **overrides: Any) -> Manifest:
    """Re-plan the build in ``source`` into ``overrides['output']`` with other plan options."""
    from packer.stages.state import STATE_DIR

    source = Path(source)
    manifest = Manifest.read(source)
    unknown = sorted(set(overrides) - set(FIELDS))
    if unknown:
        raise ConfigError(f"unknown option(s) {', '.join(unknown)}; repack takes {', '.join(REPACK_KEYS)}")
    bad = sorted(set(overrides) - set(REPACK_KEYS))  # content keys: decided by stage 1
    if bad:
        raise ConfigError(f"repack cannot change {', '.join(bad)} (that needs re-encoding: run packer build)")
    if not overrides.get("output"):
        raise ConfigError("repack needs an output folder: -o OUT2")
    config = manifest.build_config(**{k: v for k, v in overrides.items() if v is not None})
    was = manifest.config.get("preference", "none")
    if (was == "none") != (config.preference == "none"):
        raise ConfigError(f"repack cannot change preference from {was!r} to {config.preference!r}: whether preference "
                          f"records are read is decided by stage 1 (run packer build); repack switches pairs <-> tree")
    if Path(config.output).resolve() == source.resolve():
        raise ConfigError("repack writes a new build: -o must differ from the source folder")
    check_plan_options(config)
    out = Path(config.output)
    lock = BuildLock(out)
    try:
        fp = {"repack_of": {"path": str(source.resolve()), "created_at": manifest.created_at},
              "config": config.content_dict(), "tokenizer": manifest.tokenizer, **code_identity()}
        try:
            own = json.loads((out / STATE_DIR / "fingerprint.json").read_text())["repack_of"]["path"] == str(source.resolve())
        except (OSError, ValueError, KeyError, TypeError):
            own = False
        try:
            earlier = open_state(out, fp, overwrite=config.overwrite or own)  # our own earlier repack of this source: replaced
        except ConfigError:
            lock.release(discard=True)
            raise
        return _repack_into(out, source, manifest, config, progress, earlier)
    finally:
        lock.release()


def _repack_into(out: Path, source: Path, manifest: Manifest, config: BuildConfig, progress: bool,
                 earlier: str = INTERRUPTED) -> Manifest:
    for entry in [*manifest.files.samples, manifest.files.quarantine]:
        _link_or_copy(source / entry.file, out / entry.file, entry.sha256)
    for section in SECTIONS:  # embeddings and features do not depend on the plan: carried over
        for e in manifest.section_files(section):
            _link_or_copy(source / e.file, out / e.file, e.sha256)
    for e in [*manifest.files.tokenizer, *([manifest.files.media] if manifest.files.media else [])]:
        _link_or_copy(source / e.file, out / e.file, e.sha256)
    acc = manifest.accounting
    by_file = {name: FileAccount(records=f.records, quarantined=f.quarantined) for name, f in acc.by_file.items()}
    encoded = Encoded(manifest.inputs, manifest.files.samples, by_file, acc.quarantined_by_reason, manifest.files.quarantine,
                      acc.blank_lines, manifest.input_sources, audio_truncated=int(manifest.stats.get("audio_truncated", 0)),
                      content_changed=dict(manifest.stats.get("content_changed", {})),
                      cost_model=dict(manifest.stats.get("cost_model", {})))
    engine = get_engine(config.engine, config.workers or 1, address=config.ray_address, cpus_per_task=config.cpus_per_task)
    return plan_and_pack(out, config, encoded, manifest.tokenizer, engine, progress, media_root=manifest.media_root,
                         earlier=earlier, sections=manifest.sections, tokenizer_files=manifest.files.tokenizer,
                         media_index=manifest.files.media,
                         repacked_from={"path": str(source), "manifest_created_at": manifest.created_at})


def check_plan_options(config: BuildConfig) -> None:
    """Fail before any work on plan options the chosen algorithm cannot honour: the build's, and those of each
    group of sources with its own packing (a source's ``packing = false`` or media caps)."""
    if config.algorithm not in ALGORITHMS:
        raise ConfigError(f"unknown algorithm {config.algorithm!r}; known: {', '.join(sorted(ALGORITHMS))}")
    sources = config.sources()
    for policy, members, own in policy_groups(config):
        try:
            _check_plan_options(own)
        except ConfigError as e:
            if not policy:
                raise
            raise ConfigError(f"input {sources[members[0]].pattern!r} (its own packing "
                              f"{', '.join(f'{k}={v}' for k, v in policy)}): {e}") from None


def _check_plan_options(config: BuildConfig) -> None:
    used = {"max_segments"} if config.max_segments else set()
    used |= {"max_media"} if config.media_caps() else set()
    try:
        check_supported(config.algorithm, used)
    except ValueError as e:
        raise ConfigError(str(e)) from None
    if config.algorithm == "bfd":  # its tables: one stack head per (bin class, free space); refused here, not after stage 1
        from packer.pack.bfd import MAX_CLASS_CELLS

        caps = config.media_caps()
        classes = int(np.prod([c + 1 for c in caps.values()])) if caps else 1
        if classes * (config.max_length + 1) > MAX_CLASS_CELLS:
            caps_text = f" and media caps {', '.join(f'{k} {v}' for k, v in sorted(caps.items()))} ({classes:,} bin classes)"
            needs = f"{caps_text} need" if caps else " needs"
            raise ConfigError(f"--max-length {config.max_length:,}{needs} {classes:,} x "
                              f"{config.max_length + 1:,} planner cells, over bfd's {MAX_CLASS_CELLS:,}: lower "
                              f"--max-length{' or the caps' if caps else ''}, or use --algorithm next-fit")


def encode_inputs(out: Path, files: list[Path], tasks, counts: dict[str, int], setup_args: tuple, driver, engine,
                  progress, *, earlier: str = INTERRUPTED) -> Encoded:
    """Stage 1: every input line becomes a sample or a quarantine entry (``tasks`` from
    :func:`packer.stages.encode.make_tasks`, which fills ``counts``); ``earlier``: the run a resume reuses
    finished tasks from (:func:`packer.stages.state.open_state`), named on the stage's line."""
    by_file = {str(f): FileAccount() for f in files}
    quarantined: Counter[str] = Counter()
    shards, columns, media = [], [], {}
    qpath = out / "quarantine.jsonl"
    stage = Stage("encode", "records", bytes_total=sum(fs.stat(f)[0] for f in files), enabled=progress)
    reused = n_tasks = cut = 0
    changed: Counter = Counter()
    with atomic_open(qpath, "w") as qf:
        for res in engine.map(encode.encode_task, tasks, encode.setup, setup_args, in_process_state=driver):
            for entry in res.quarantine:
                qf.write(entry.to_json() + "\n")
                quarantined[entry.reason] += 1
            by_file[res.file].records += res.records
            by_file[res.file].quarantined += len(res.quarantine)
            if res.shard is not None:
                shards.append(res.shard)
                columns.append(res.columns)
                for row in res.media or ():
                    media.setdefault(row.ref, row)  # a file several tasks name: its first row, in task order
            reused, n_tasks, cut = reused + res.reused, n_tasks + 1, cut + res.audio_truncated
            changed.update(res.content_changed or {})
            stage.advance(res.records, res.nbytes)
    resumed = f"; {reused} of {n_tasks} tasks reused from {earlier}" if reused else ""
    stage.done(f"{stage.count:,} records ({sum(quarantined.values()):,} quarantined){resumed}")
    quarantine = ShardEntry(qpath.name, sum(quarantined.values()), qpath.stat().st_size, sha256_file(qpath))
    return Encoded(list(by_file), shards, by_file, dict(quarantined), quarantine, counts.get("blank_lines", 0),
                   columns=pa.concat_tables(columns) if columns else plan_columns(SAMPLE_SCHEMA.empty_table()),
                   media=list(media.values()), audio_truncated=cut, content_changed=dict(sorted(changed.items())))


def plan_and_pack(out: Path, config: BuildConfig, encoded: Encoded, tokenizer: dict[str, Any], engine, progress, *,
                  media_root: str = "", sections: dict[str, Any] | None = None,
                  repacked_from: dict[str, Any] | None = None, tokenizer_files: list[ShardEntry] | None = None,
                  media_index: ShardEntry | None = None, earlier: str = INTERRUPTED) -> Manifest:
    """Stages 2-4 over the samples in ``out/samples``: planned from their columns (stage 1's results),
    whole rows read only for the few samples that need them (over capacity, dropped); ``earlier``: the run a
    resume reuses finished shards from, named on the pack stage's line."""
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
    packed, stats, reused = [], [], 0
    stage = Stage("pack", "rows", total=p.n_bins, enabled=progress)
    state = (str(out), [e.file for e in encoded.sample_shards], plan_entry.sha256, config.durable,
             [e.sha256 for e in encoded.sample_shards])
    # memory maps, cheap: with the local engine this process is a worker too (a Ray driver reads no shard)
    here = materialize.setup(*state) if engine.in_process else None
    for res in engine.map(materialize.materialize_task, tasks, materialize.setup, state, in_process_state=here):
        packed.append(res.shard)
        stats.append(res.stats)
        reused += res.reused
        stage.advance(res.shard.rows)
    stage.done(f"{p.n_bins:,} rows in {len(packed)} shard(s)"
               + (f"; {reused} of {len(packed)} shards reused from {earlier}" if reused else ""))

    by_file = {k: dataclasses.replace(v) for k, v in encoded.by_file.items()}
    _count_outcomes(by_file, encoded.inputs, samples, p, m)
    quarantine = out / encoded.quarantine.file if encoded.quarantine is not None else None
    sources = source_accounts(config, encoded.inputs, encoded.input_sources, by_file, _file_of_sample(samples), p,
                              quarantined_by_file(quarantine), media_counts(samples), preference_responses(samples).sample)
    manifest = Manifest(
        config=config.content_dict(), tokenizer=tokenizer, inputs=encoded.inputs, media_root=media_root,
        input_sources=list(encoded.input_sources),
        files=Files(samples=encoded.sample_shards, packed=packed, plan=plan_entry, quarantine=encoded.quarantine,
                    dropped=write_dropped(out, rows, p, file_caps(config, encoded)), tokenizer=list(tokenizer_files or []),
                    media=media_index),
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


def write_dropped(out: Path, rows: SampleRows, p: Plan, caps: list[dict[str, int]] | None = None) -> ShardEntry:
    """``dropped.jsonl``: every sample the plan dropped, with its file, line, id and reason; the detail of an
    ``over_media_cap`` drop gives its media against the caps of its input file (``caps``: :func:`file_caps`)."""
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
                f.write(json.dumps({"file": r["source_file"], "line": r["source_line"], "id": r["key"], "reason": reason,
                                    "detail": detail}, ensure_ascii=False, sort_keys=True) + "\n")
                n += 1
    return ShardEntry(path.name, n, path.stat().st_size, sha256_file(path))


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


def _count_outcomes(by_file: dict[str, FileAccount], inputs: list[str], samples, p: Plan, m) -> None:
    """Packed, dropped, skipped (by the mix) and repeated per input file, from each sample's
    source_index."""
    file_of_sample = _file_of_sample(samples)
    dropped = np.concatenate(list(p.dropped.values())) if p.dropped else np.zeros(0, np.int64)
    extra = np.maximum(m.copies - 1, 0)
    extra[dropped] = 0
    n_dropped = np.bincount(file_of_sample[dropped], minlength=len(inputs))
    n_skipped = np.bincount(file_of_sample[m.skipped], minlength=len(inputs))
    n_samples = np.bincount(file_of_sample, minlength=len(inputs))
    n_repeated = np.bincount(file_of_sample, weights=extra, minlength=len(inputs)) if len(extra) else np.zeros(len(inputs))
    for k, name in enumerate(inputs):
        acc = by_file[name]
        acc.dropped, acc.skipped, acc.repeated = int(n_dropped[k]), int(n_skipped[k]), int(n_repeated[k])
        acc.packed = int(n_samples[k] - n_dropped[k] - n_skipped[k])


def _file_of_sample(samples) -> np.ndarray:
    """Each sample's input file (its number in ``inputs``)."""
    return samples.column("source_index").to_numpy().astype(np.int64) if samples.num_rows else np.zeros(0, np.int64)


def _preference_stats(config: BuildConfig, samples, p: Plan) -> dict[str, Any] | None:
    """The packed preference records (each copy an item) and their tokens in both layouts."""
    responses = preference_responses(samples)
    if not len(responses.sample):
        return None
    items = p.indices[p.starts == 0]  # one segment of each item starts at its sample's token 0
    at = np.searchsorted(responses.sample, items)
    at = at[(at < len(responses.sample)) & (responses.sample[np.minimum(at, len(responses.sample) - 1)] == items)]
    return {"layout": config.preference, "records": int(len(at)), "responses": int(responses.n[at].sum()),
            **{f"{layout}_tokens": int(responses.item_lengths(layout)[at].sum()) for layout in ("pairs", "tree")}}


def _budget_stats(config: BuildConfig, p: Plan) -> dict[str, Any]:
    """``max_row_encoder``'s effect: the bound the rows are measured against (``token_bound``: the plan's lower bound
    of tokens, ``max_segments`` and media caps; the encoder's), samples over it."""
    groups = {", ".join(g["sources"]): g["budgets"]["encoder"] for g in p.groups if "encoder" in g.get("budgets", {})}
    return {"setting": config.max_row_encoder, "budget": p.budgets.get("encoder"), "token_bound": p.lower_bound,
            "encoder_bound": p.resource_bound, "bound": p.bound, "gap_to_bound": p.n_bins - p.bound,
            "over_budget": int(sum(len(v) for v in p.over_budget.values())),
            **({"group_budgets": groups} if groups and p.budgets.get("encoder") is None else {})}


def plan_stats(config: BuildConfig, samples, p: Plan) -> dict[str, Any]:
    """The manifest's ``stats`` that the plan ``p`` of ``samples`` (:func:`plan_columns`) under ``config`` decides: rows,
    tokens, fill, the lower bound ..., the row lengths. ``packer verify --deep`` re-derives them."""
    return {**_stats(config, samples, p), **_row_lengths(config, p)}


def _stats(config: BuildConfig, samples, p: Plan) -> dict[str, Any]:
    codes, names = modality_codes(samples)
    placed = np.zeros(len(codes), bool)  # a byte a sample, no sort: split pieces count their sample once
    placed[p.indices] = True
    counts = np.bincount(codes[placed], minlength=len(names)) if len(p.indices) else np.zeros(len(names))
    preference = _preference_stats(config, samples, p)
    return {
        **({"preference": preference} if preference else {}),
        "max_length": config.max_length,
        "rows": p.n_bins,
        "segments": int(len(p.indices)),
        "tokens": p.tokens,
        "fill": p.efficiency,
        "lower_bound": p.lower_bound,
        "gap_to_lower_bound": p.n_bins - p.lower_bound,
        **({"row_budget": _budget_stats(config, p)} if config.max_row_encoder.strip() != "off" else {}),
        **({"policy_groups": list(p.groups)} if p.groups else {}),
        "truncated_samples": int(len(p.truncated)),
        "truncated_tokens": int(p.truncated_tokens),
        "split_samples": int(len(p.split)),
        "split_pieces": int(np.isin(p.indices, p.split).sum()) if len(p.split) else 0,
        "split_pieces_dropped": int(p.pieces_dropped),
        "split_lost_media": int(p.pieces_lost_media),
        "samples_by_modality": {n: int(c) for n, c in sorted(zip(names, counts, strict=True)) if c},
    }


def _row_lengths(config: BuildConfig, p: Plan) -> dict[str, Any]:
    """``--row-lengths``: the lengths (chosen from the planned rows for ``auto``), rows per length and the padding."""
    from packer.pack import buckets

    k, given = buckets.parse(config.row_lengths, config.max_length)
    if k is None and given is None:
        return {}
    tokens = p.bin_tokens()
    lengths = given if given is not None else buckets.choose_lengths(tokens, k, config.max_length)
    rows = np.bincount(buckets.bucket_of(tokens, lengths), minlength=len(lengths))
    return {"row_lengths": [int(x) for x in lengths], "rows_by_length": [int(x) for x in rows],
            "row_length_padding": buckets.padding(tokens, lengths)}


def auto_workers(workers: int, files: list) -> int:
    """``0`` means one per core, except for small inputs, where starting worker
    processes (each loads the tokenizer) costs more than it saves."""
    from packer.io.fs import stat

    if workers == 0 and sum(stat(f)[0] for f in files) < SMALL_INPUT_BYTES:
        return 1
    return workers


def _link_or_copy(src: Path, dst: Path, sha256: str) -> None:
    """Hard-link (or copy) a finished file of another build, after checking its hash."""
    if not src.is_file():
        raise ConfigError(f"{src} is missing: the source build is damaged (packer verify on it lists every problem); "
                          f"rebuild it")
    if sha256_file(src) != sha256:
        raise ConfigError(f"{src} does not match its manifest (sha256 differs): the source build is damaged; rebuild it")
    dst.parent.mkdir(parents=True, exist_ok=True)
    if dst.is_file() and (dst.samefile(src) or sha256_file(dst) == sha256):
        return  # a resumed repack: already in place
    dst.unlink(missing_ok=True)
    try:
        os.link(src, dst)
    except OSError:
        shutil.copyfile(src, dst)
