"""``packer build``: run the stages in order over one output folder.

    1. encode       engine.map over input chunks  -> samples/*.arrow, quarantine.jsonl
    2. plan         in this process, lengths only -> plan.arrow
    3. materialize  engine.map over plan chunks   -> packed/*.arrow
    4. manifest     accounting checked            -> manifest.json (last: the build is done)

This module runs stage 1 and the checks and warnings around it; stages 2 to 4 are
:func:`packer.pipeline.packing.plan_and_pack`, shared with :mod:`packer.pipeline.repack`.
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
from pathlib import Path
from typing import Any

import pyarrow as pa

from packer.config.fields import BuildConfig
from packer.encode import EncoderSpec
from packer.engine import freeze_collector, get_engine, stop_on_signals
from packer.errors import ConfigError
from packer.io import fs
from packer.io.files import atomic_open, set_durable, sha256_file
from packer.media.refs import media_base
from packer.pipeline.accounting import check_bad_fraction
from packer.pipeline.encoded import Encoded
from packer.pipeline.packing import plan_and_pack
from packer.pipeline.preflight import check_output_outside_inputs, preflight
from packer.progress import Stage
from packer.shards.io import read_shards
from packer.shards.manifest import Manifest
from packer.shards.schema import SAMPLE_SCHEMA, ShardEntry
from packer.stages import encode
from packer.stages.manifest import FileAccount
from packer.stages.media_files import write_media_index
from packer.stages.planning import plan_columns
from packer.stages.state import INTERRUPTED, BuildLock, fingerprint, open_state

SMALL_INPUT_BYTES = 16 * 2**20


def build(config: BuildConfig, *, progress: bool = True) -> Manifest:
    """Build ``config.output`` from ``config.input``; returns the manifest.

    Rerunning after a crash (same inputs and settings) resumes: finished stage-1 and
    stage-3 shards are reused and the result is byte-identical to an uninterrupted build.
    An fsspec URL output is written directly, by every worker (no shared disk needed);
    with ``staging_dir`` it is built in that local folder and uploaded when done. An output URL the
    store refuses (no credentials, a wrong endpoint) or one that keeps nothing (``memory://``) is
    refused first (:func:`packer.io.fs.check_reachable`).
    """
    preflight(config)  # before any input is expanded or record read
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
    inputs = config.input_sources()
    files = [f for f, _ in inputs]
    check_output_outside_inputs(config, files)
    warn_duplicate_inputs(config)
    counts: dict[str, int] = {}
    tasks = encode.make_tasks(files, config.chunk_records, counts, config.max_line_bytes,
                              encode.task_bytes(sum(fs.stat(f)[0] for f in files)), readings(config, inputs))
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
            embed = media_mode(config, encoded) == "embed"  # ref with embedded media: refused before any plan
            warn_no_encoder(out, driver.encoder.family.kinds, encoded)
            warn_internal_errors(out, encoded)
            check_bad_fraction(out, config, encoded, tokenizer)
            tokenizer_files = save_tokenizer(driver.encoder.shipped_tokenizer(), out)
            media_index = write_media_index(out, encoded.media)  # the workers looked the files up
            sections = media_passes(out, config, encoded, embedder, extractor, progress, engine, media_root)
            return plan_and_pack(out, config, encoded, tokenizer, engine, progress, media_root=media_root, earlier=earlier,
                                 sections=sections, tokenizer_files=tokenizer_files, media_index=media_index, embed=embed)
        finally:
            if frozen:
                gc.unfreeze()
            lock.release()


def readings(config: BuildConfig, inputs: list[tuple]) -> list[tuple[str, tuple]]:
    """How each input file is read: its format (the source's ``format=``, else from its name) and its source's
    column mapping."""
    from packer.ingest.units import readings as of_inputs

    return of_inputs(config.sources(), inputs)


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


def warn_duplicate_inputs(config: BuildConfig) -> None:
    for first, again in config.duplicate_inputs():
        same = "is named twice" if str(first) == str(again) else f"is the same file as {first}"
        print(f"packer: warning: input {again} {same}; it is read once, as {first}", file=sys.stderr)


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


def encode_inputs(out: Path, files: list[Path], tasks, counts: dict[str, int], setup_args: tuple, driver, engine,
                  progress, *, earlier: str = INTERRUPTED) -> Encoded:
    """Stage 1: every input line becomes a sample or a quarantine entry (``tasks`` from
    :func:`packer.stages.encode.make_tasks`, which fills ``counts``); ``earlier``: the run a resume reuses
    finished tasks from (:func:`packer.stages.state.open_state`), named on the stage's line."""
    by_file = {str(f): FileAccount() for f in files}
    quarantined: Counter[str] = Counter()
    shards, columns, media, blob_shards, blob_inputs = [], [], {}, [], {}
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
            if res.blobs is not None:
                blob_shards.append(res.blobs)
                blob_inputs[res.file] = True
            reused, n_tasks, cut = reused + res.reused, n_tasks + 1, cut + res.audio_truncated
            changed.update(res.content_changed or {})
            stage.advance(res.records, res.nbytes)
    resumed = f"; {reused} of {n_tasks} tasks reused from {earlier}" if reused else ""
    stage.done(f"{stage.count:,} records ({sum(quarantined.values()):,} quarantined){resumed}")
    quarantine = ShardEntry(qpath.name, sum(quarantined.values()), qpath.stat().st_size, sha256_file(qpath))
    return Encoded(list(by_file), shards, by_file, dict(quarantined), quarantine, counts.get("blank_lines", 0),
                   columns=pa.concat_tables(columns) if columns else plan_columns(SAMPLE_SCHEMA.empty_table()),
                   media=list(media.values()), audio_truncated=cut, content_changed=dict(sorted(changed.items())),
                   blob_shards=blob_shards, blob_inputs=list(blob_inputs))


def media_mode(config: BuildConfig, encoded: Encoded) -> str:
    """``embed`` or ``ref``, the build's ``media`` setting resolved after stage 1: ``auto`` embeds exactly when some
    sample names embedded media (bytes with no file to point at). ``ref`` with such media is refused, naming the
    inputs, since a span of a ``ref`` build must name a file the trainer can open."""
    held = encoded.blob_inputs
    if config.media == "ref" and held:
        more = f" and {len(held) - 1:,} more" if len(held) > 1 else ""
        raise ConfigError(f"media = 'ref' but the media of {held[0]}{more} are embedded in the input (parquet / tar cells, "
                          f"data: URLs): they have no file a packed row could name; use --media embed (or auto, the "
                          f"default), or give the media as files")
    return "embed" if config.media == "embed" or held else "ref"


def auto_workers(workers: int, files: list) -> int:
    """``0`` means one per core, except for small inputs, where starting worker
    processes (each loads the tokenizer) costs more than it saves."""
    from packer.io.fs import stat

    if workers == 0 and sum(stat(f)[0] for f in files) < SMALL_INPUT_BYTES:
        return 1
    return workers
