"""``packer repack``: re-plan a finished build into another folder with other plan options.

It starts at stage 2 from the build's ``samples/``: a new context length or plan without re-tokenizing a record or
re-reading a media file; the samples, the media sections and the tokenizer are linked (or copied) over. An embedded
build's new media shards (and its own leftover shard) are written from the source build's media shards and leftover
shard, each blob found by name (:class:`packer.shards.media_index.BlobIndex`): the sources are never read.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

from packer.config.fields import FIELDS, REPACK_KEYS, BuildConfig
from packer.engine import get_engine, stop_on_signals
from packer.errors import ConfigError
from packer.io.files import sha256_file
from packer.pipeline.encoded import Encoded
from packer.pipeline.packing import plan_and_pack
from packer.pipeline.preflight import preflight
from packer.shards.manifest import SECTIONS, Manifest
from packer.stages.manifest import FileAccount
from packer.stages.state import INTERRUPTED, BuildLock, code_identity, open_state


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
    preflight(config)
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
    store = manifest.files.blob_store
    for e in store:  # read in place by the new build's stage 3: checked here once
        _check(source / e.file, e.sha256)
    engine = get_engine(config.engine, config.workers or 1, address=config.ray_address, cpus_per_task=config.cpus_per_task)
    return plan_and_pack(out, config, encoded, manifest.tokenizer, engine, progress, media_root=manifest.media_root,
                         earlier=earlier, sections=manifest.sections, tokenizer_files=manifest.files.tokenizer,
                         media_index=manifest.files.media, embed=manifest.files.embedded,
                         repacked_from={"path": str(source), "manifest_created_at": manifest.created_at},
                         blob_store=(source.resolve(), store) if store else None)


def _check(src: Path, sha256: str) -> None:
    if not src.is_file():
        raise ConfigError(f"{src} is missing: the source build is damaged (packer verify on it lists every problem); "
                          f"rebuild it")
    if sha256_file(src) != sha256:
        raise ConfigError(f"{src} does not match its manifest (sha256 differs): the source build is damaged; rebuild it")


def _link_or_copy(src: Path, dst: Path, sha256: str) -> None:
    """Hard-link (or copy) a finished file of another build, after checking its hash."""
    _check(src, sha256)
    dst.parent.mkdir(parents=True, exist_ok=True)
    if dst.is_file() and (dst.samefile(src) or sha256_file(dst) == sha256):
        return  # a resumed repack: already in place
    dst.unlink(missing_ok=True)
    try:
        os.link(src, dst)
    except OSError:
        shutil.copyfile(src, dst)
