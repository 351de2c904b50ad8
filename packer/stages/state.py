"""Crash safety and resume: a lock, a fingerprint, and a journal of finished tasks.

``OUT/.state/`` holds:

- ``fingerprint.json``: what decides the output -- each input file's path, size and
  modification time (and an object's content tag where its store gives one: :func:`content_tag`), the content
  settings of the config (not workers or engine), the tokenizer's fingerprint, the cost model's coefficients,
  packer's version and schema version. A rerun with the same fingerprint resumes; a different one is refused
  (saying what changed) unless ``--overwrite``, which starts over.
- ``encode-NNNNN.json`` / ``pack-NNNNN.json``: one per finished stage-1 / stage-3 task,
  written (atomically) after the task's shard. A resumed task is skipped when its journal
  entry exists and its shard still has the recorded sha256; otherwise it is redone.

``OUT/.packer.lock`` is held (``flock``) for the whole build, so two builds cannot write
one folder; the kernel releases it when a process dies, ``kill -9`` included. A build to
a URL (object storage has no lock) holds it in a local folder named after the URL
(:func:`packer.io.cache.lock_folder`): two builds of one URL from one machine exclude
each other, builds from two machines must not share a URL.
"""

from __future__ import annotations

import fcntl
import functools
import json
import os
import re
import sys
from dataclasses import asdict
from pathlib import Path
from typing import Any

from packer import __version__
from packer.errors import ConfigError, PackerError
from packer.io.files import sha256_file, write_text_atomic
from packer.shards.media_index import UNPACKED_MEDIA
from packer.shards.schema import SCHEMA_VERSION, ShardEntry

STATE_DIR = ".state"
LOCK_FILE = ".packer.lock"


class BuildLock:
    """``OUT/.packer.lock``, held with ``flock``. A build refused before it wrote anything
    (:meth:`release` with ``discard``) leaves no lock file, and no folder it made."""

    def __init__(self, out: Path):
        if not isinstance(out, Path):  # a RemotePath (an fsspec URL)
            from packer.io.cache import lock_folder

            out = lock_folder(str(out))
        if out.exists() and not out.is_dir():
            raise ConfigError(f"output {out} is a file, not a folder; choose another -o")
        self.out = out
        self.made_folder = not out.exists()
        self.path = out / LOCK_FILE
        try:
            out.mkdir(parents=True, exist_ok=True)
            while True:
                self.made_file = not self.path.exists()
                self.file = open(self.path, "a+")
                try:
                    fcntl.flock(self.file, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    self.file.seek(0)
                    holder = self.file.read().strip() or "another process"
                    self.file.close()
                    raise PackerError(f"{out} is being built by {holder}; wait for it or choose another -o") from None
                try:  # a refused build removes its lock file: the file locked must still be the one at the path
                    if os.stat(self.path).st_ino == os.fstat(self.file.fileno()).st_ino:
                        break
                except FileNotFoundError:
                    pass
                self.file.close()
        except OSError as e:
            raise PackerError(f"cannot write to the output folder {out}: {e.strerror or e}") from None
        self.file.seek(0)
        self.file.truncate()
        self.file.write(f"pid {os.getpid()}")
        self.file.flush()

    def release(self, *, discard: bool = False) -> None:
        """Unlock; with ``discard`` (the build was refused before writing), also remove the lock
        file and the output folder when this build made them (a folder only when left empty)."""
        if self.file.closed:
            return
        if discard and self.made_file:
            self.path.unlink(missing_ok=True)  # while still locked: see the inode check in __init__
        fcntl.flock(self.file, fcntl.LOCK_UN)
        self.file.close()
        if discard and self.made_folder:
            try:
                self.out.rmdir()
            except OSError:
                pass


def fingerprint(files: list, content: dict[str, Any], tokenizer: dict[str, Any], media_root: str = "",
                cost_model: dict[str, Any] | None = None) -> dict[str, Any]:
    """``cost_model``: the resolved cost model (:func:`packer.cost.resolve_cost_model`), whose coefficients are in
    every sample's cost vector: a ``config.json`` beside the processor that changed changes the samples' bytes."""
    from packer.io.fs import is_url, stat

    inputs = []
    for f in files:
        size, mtime = stat(f)
        entry = {"path": str(f), "size": size, "mtime_ns": mtime}
        tag = content_tag(str(f)) if is_url(f) else ""
        if tag:
            entry["tag"] = tag
        inputs.append(entry)
    return {"packer_version": __version__, "schema_version": SCHEMA_VERSION, "inputs": inputs,
            "config": content, "tokenizer": tokenizer, "media_root": media_root, "cost_model": cost_model,
            **code_identity()}


# What a store's listing says of an object's content, first found first: S3's / GCS's / Azure's ETag, GCS's md5 and
# crc32c, the hub's LFS sha256 and git blob id (hf:// gives no modification time: its files are told apart by these)
TAG_KEYS = ("ETag", "etag", "md5Hash", "crc32c", "checksum", "content_md5", "blob_id")


def content_tag(url: str) -> str:
    """An fsspec object's content tag (:data:`TAG_KEYS`; an hf:// LFS file's sha256), ``""`` where the store gives
    none: in the fingerprint beside size and time, so an input rewritten within a second, or on a store that keeps
    no time, is still noticed."""
    import fsspec

    try:
        fs, path = fsspec.core.url_to_fs(url)
        info = fs.info(path)
    except Exception:  # noqa: BLE001 -- stat() above asked the same store: a tag is extra, never a new failure
        return ""
    lfs = info.get("lfs")
    if isinstance(lfs, dict) and lfs.get("sha256"):
        return f"sha256:{lfs['sha256']}"
    for key in TAG_KEYS:
        if info.get(key):
            return f"{key}:{str(info[key]).strip(chr(34))}"
    return ""


# The libraries whose versions can change a build's bytes: tokenization and chat templates,
# media headers (counts), the Arrow writer.
LIBRARIES = ("tokenizers", "transformers", "jinja2", "pillow", "soundfile", "av", "numpy", "pyarrow")
CODE_KEYS = ("packer_version", "packer_code", "libraries")  # a change of these alone: rebuilt, not refused


@functools.cache
def code_identity() -> dict[str, Any]:
    """What code makes the build: packer's version, a sha256 over its source files (every
    ``packer/**/*.py``, path and content, in path order) and the versions of :data:`LIBRARIES`
    (``None``: not installed). A resumed build whose code changed re-encodes everything."""
    import hashlib
    from importlib import metadata

    root = Path(__file__).resolve().parents[1]
    h = hashlib.sha256()
    for path in sorted(root.rglob("*.py")):
        h.update(path.relative_to(root).as_posix().encode() + b"\0" + path.read_bytes() + b"\0")
    versions = {}
    for name in LIBRARIES:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = None
    return {"packer_code": h.hexdigest(), "libraries": versions}


def changes(old: dict[str, Any], new: dict[str, Any]) -> list[str]:
    out = []
    if old.get("inputs") != new.get("inputs"):
        out.append("input files")
    out += [f"config.{k}" for k in sorted(set(old.get("config", {})) | set(new.get("config", {})))
            if old.get("config", {}).get(k) != new.get("config", {}).get(k)]
    out += [k for k in ("tokenizer", "media_root", "cost_model", "schema_version", *CODE_KEYS) if old.get(k) != new.get(k)]
    return out


class Journal:
    """Finished-task records in ``OUT/.state``; safe to read from worker processes."""

    def __init__(self, out: Path):
        self.out = out
        self.dir = out / STATE_DIR

    def record(self, stage: str, index: int, payload: dict[str, Any]) -> None:
        write_text_atomic(self.dir / f"{stage}-{index:05d}.json", json.dumps(payload, sort_keys=True))

    def load(self, stage: str, index: int, *, check: dict[str, Any] | None = None) -> dict[str, Any] | None:
        """The record of a finished task whose shard is intact (and matches ``check``), else None."""
        path = self.dir / f"{stage}-{index:05d}.json"
        try:
            payload = json.loads(path.read_text())
        except (FileNotFoundError, ValueError):
            return None
        if check and any(payload.get(k) != v for k, v in check.items()):
            return None
        for key in ("shard", "blobs"):  # blobs: a stage-1 task's media shard (samples/media-part-*.arrow)
            shard = payload.get(key)
            if shard is not None:
                p = self.out / shard["file"]
                if not p.is_file() or p.stat().st_size != shard["bytes"] or sha256_file(p) != shard["sha256"]:
                    return None
        return payload


INTERNAL_ERROR_FILE = "internal_error.json"  # the record a packer bug stopped the build at (packer.stages.encode)
BUILD_FILES = ("manifest.json", "report.json", "report.html", "quarantine.jsonl", "dropped.jsonl", "plan.arrow",
               "media.arrow", INTERNAL_ERROR_FILE)
BUILD_DIRS = ("samples", "packed", "media", "embeddings", "audio_features", "tokenizer")
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "chat_template.jinja",
                   "chat_template.json", "added_tokens.json", "vocab.json", "merges.txt", "vocab.txt", "tokenizer.model")
SHARD_NAME = re.compile(r"part-\d{5}\.arrow")


INTERRUPTED = "the interrupted run"
FINISHED = "the finished build already in the output (same inputs and settings)"


def open_state(out: Path, fp: dict[str, Any], *, overwrite: bool) -> str:
    """Decide between resume and start-over for ``out`` (the lock is already held); returns what a resume reuses
    finished tasks from, for the stages' lines: :data:`FINISHED` when ``out`` holds a complete build of the same job
    (the command run again), else :data:`INTERRUPTED` (a start-over reuses nothing, so its lines name none).

    Starting over (``--overwrite``) removes only what a packer build wrote there -- the
    files its manifest and resume journal list, its fixed file names, its temporaries --
    and never another file: a user's file inside ``samples/`` stays, and so does its folder.
    """
    state = out / STATE_DIR
    old_path = state / "fingerprint.json"
    entries = [e for e in out.iterdir() if e.name != LOCK_FILE]
    if old_path.is_file():
        try:
            old = json.loads(old_path.read_text())
        except ValueError:
            old = {}
        if old == fp:  # resume: finished tasks are reused; a crashed writer's temporaries go
            for e in [*_temporaries(out), out / INTERNAL_ERROR_FILE]:
                e.unlink(missing_ok=True)
            return FINISHED if _complete(out) else INTERRUPTED
        changed = changes(old, fp)
        if changed and set(changed) <= set(CODE_KEYS):  # the same job made by other code: its shards may be stale
            print(f"packer: note: {out} was built by other code ({', '.join(changed)} changed): nothing of it is reused, "
                  f"everything is encoded again", file=sys.stderr)
        elif not overwrite:
            raise ConfigError(f"{out} holds a build of other inputs or settings (changed: {', '.join(changed)}); "
                              f"pass --overwrite to replace it, or choose another -o")
    elif not entries:
        pass  # a new or empty folder
    elif not (out / "manifest.json").is_file():
        raise ConfigError(f"output {out} is not empty and holds no packer build (no manifest.json, no {STATE_DIR}/); "
                          f"choose another -o or empty it: packer never deletes files it did not write")
    elif not overwrite:
        raise ConfigError(f"{out} holds a build without resume state (made by an older packer); "
                          f"pass --overwrite to replace it")
    clear_build(out)
    state.mkdir(parents=True, exist_ok=True)
    write_text_atomic(old_path, json.dumps(fp, indent=1, sort_keys=True))
    return INTERRUPTED


def _complete(out: Path) -> bool:
    """Whether ``out`` holds the manifest of a finished build (written last: a run stopped before it has none, a
    failed one says so in ``status``)."""
    try:
        return json.loads((out / "manifest.json").read_text()).get("status") == "complete"
    except (OSError, ValueError, AttributeError):
        return False


def written_by_build(out: Path) -> set[Path]:
    """Every file a packer build in ``out`` wrote, from its manifest and journal."""
    files = {out / n for n in BUILD_FILES} | {out / "tokenizer" / n for n in TOKENIZER_FILES} | {out / UNPACKED_MEDIA}
    try:
        manifest = json.loads((out / "manifest.json").read_text(encoding="utf-8"))
        listed = manifest["files"]
        entries = [*listed.get("samples", []), *listed.get("packed", []), *listed.get("tokenizer", []),
                   *listed.get("sample_media", []), *listed.get("media_shards", [])]
        entries += [e for e in (listed.get("plan"), listed.get("quarantine"), listed.get("dropped"),
                                listed.get("unpacked_media")) if e]
        entries += [e for section in ("embeddings", "audio_features") for e in manifest.get(section, {}).get("files", [])]
        files |= {out / e["file"] for e in entries}
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        pass  # no manifest (a crashed build) or a damaged one: the journal and the names below still hold
    for record in (out / STATE_DIR).glob("*.json"):
        try:
            payload = json.loads(record.read_text())
            files |= {out / payload[k]["file"] for k in ("shard", "blobs") if payload.get(k)}
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            continue
    for folder in BUILD_DIRS[:-1]:  # shards a crash left between rename and journal record: packer's own names
        files |= {p for p in (out / folder).glob("*part-*.arrow") if SHARD_NAME.fullmatch(p.name.removeprefix("media-"))}
    return files | set(_temporaries(out))


def clear_build(out: Path) -> None:
    """Remove what :func:`written_by_build` names, the resume state, and build folders left empty."""
    from packer.io.fs import rmtree

    (out / "manifest.json").unlink(missing_ok=True)  # first, so a half-done rebuild never looks finished
    for path in sorted(written_by_build(out)):
        if path.is_file() or (isinstance(path, Path) and path.is_symlink()):
            path.unlink(missing_ok=True)
    rmtree(out / STATE_DIR)
    rmtree(out / ".tokenizer.tmp")
    for folder in BUILD_DIRS:
        try:
            (out / folder).rmdir()  # only when empty: a user's file keeps its folder
        except OSError:
            pass


def _temporaries(out: Path) -> list[Path]:
    """Files a crashed writer left (``name.tmp-PID...``), at the top and in the build folders."""
    places = [out, *(out / d for d in BUILD_DIRS)]
    return [e for place in places if place.is_dir() for e in place.glob("*.tmp-*") if e.is_file()]


def shard_payload(shard: ShardEntry | None, **extra: Any) -> dict[str, Any]:
    return {"shard": asdict(shard) if shard is not None else None, **extra}
