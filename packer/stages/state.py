"""Crash safety and resume: a lock, a fingerprint, and a journal of finished tasks.

``OUT/.state/`` holds:

- ``fingerprint.json``: what decides the output -- each input file's path, size and
  modification time, the content settings of the config (not workers or engine), the
  tokenizer's fingerprint, packer's version and schema version. A rerun with the same
  fingerprint resumes; a different one is refused (saying what changed) unless
  ``--overwrite``, which starts over.
- ``encode-NNNNN.json`` / ``pack-NNNNN.json``: one per finished stage-1 / stage-3 task,
  written (atomically) after the task's shard. A resumed task is skipped when its journal
  entry exists and its shard still has the recorded sha256; otherwise it is redone.

``OUT/.packer.lock`` is held (``flock``) for the whole build, so two builds cannot write
one folder; the kernel releases it when a process dies, ``kill -9`` included.
"""

from __future__ import annotations

import fcntl
import json
import os
from dataclasses import asdict
from pathlib import Path
from typing import Any

from packer import __version__
from packer.errors import ConfigError, PackerError
from packer.io.files import sha256_file, write_text_atomic
from packer.shards.schema import SCHEMA_VERSION, ShardEntry

STATE_DIR = ".state"
LOCK_FILE = ".packer.lock"


class BuildLock:
    def __init__(self, out: Path):
        out.mkdir(parents=True, exist_ok=True)
        self.path = out / LOCK_FILE
        self.file = open(self.path, "a+")
        try:
            fcntl.flock(self.file, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            self.file.seek(0)
            holder = self.file.read().strip() or "another process"
            self.file.close()
            raise PackerError(f"{out} is being built by {holder}; wait for it or choose another -o") from None
        self.file.seek(0)
        self.file.truncate()
        self.file.write(f"pid {os.getpid()}")
        self.file.flush()

    def release(self) -> None:
        if not self.file.closed:
            fcntl.flock(self.file, fcntl.LOCK_UN)
            self.file.close()


def fingerprint(files: list, content: dict[str, Any], tokenizer: dict[str, Any]) -> dict[str, Any]:
    from packer.io.fs import stat

    inputs = []
    for f in files:
        size, mtime = stat(f)
        inputs.append({"path": str(f), "size": size, "mtime_ns": mtime})
    return {"packer_version": __version__, "schema_version": SCHEMA_VERSION, "inputs": inputs,
            "config": content, "tokenizer": tokenizer}


def changes(old: dict[str, Any], new: dict[str, Any]) -> list[str]:
    out = []
    if old.get("inputs") != new.get("inputs"):
        out.append("input files")
    out += [f"config.{k}" for k in sorted(set(old.get("config", {})) | set(new.get("config", {})))
            if old.get("config", {}).get(k) != new.get("config", {}).get(k)]
    out += [k for k in ("tokenizer", "packer_version", "schema_version") if old.get(k) != new.get(k)]
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
        shard = payload.get("shard")
        if shard is not None:
            p = self.out / shard["file"]
            if not p.is_file() or p.stat().st_size != shard["bytes"] or sha256_file(p) != shard["sha256"]:
                return None
        return payload


def open_state(out: Path, fp: dict[str, Any], *, overwrite: bool, owned: tuple[str, ...]) -> None:
    """Decide between resume and start-over for ``out`` (the lock is already held)."""
    state = out / STATE_DIR
    old_path = state / "fingerprint.json"
    entries = [e for e in out.iterdir() if e.name != LOCK_FILE]
    if old_path.is_file():
        old = json.loads(old_path.read_text())
        if old == fp:  # resume: finished tasks are reused; a crashed writer's temporaries go
            for e in out.rglob("*.tmp-*"):
                e.unlink(missing_ok=True)
            return
        if not overwrite:
            raise ConfigError(f"{out} holds a build of other inputs or settings (changed: {', '.join(changes(old, fp))}); "
                              f"pass --overwrite to replace it, or choose another -o")
    elif entries and not any(e.name in owned for e in entries):
        raise ConfigError(f"output {out} is not empty and holds no packer build; choose another -o or empty it")
    elif any(e.name in owned for e in entries) and not overwrite:
        raise ConfigError(f"{out} holds a build without resume state (made by an older packer); "
                          f"pass --overwrite to replace it")
    _clear(out, owned)
    state.mkdir(parents=True, exist_ok=True)
    write_text_atomic(old_path, json.dumps(fp, indent=1, sort_keys=True))


def _clear(out: Path, owned: tuple[str, ...]) -> None:
    import shutil

    (out / "manifest.json").unlink(missing_ok=True)  # first, so a half-done rebuild never looks finished
    for e in out.iterdir():
        if e.name in owned or e.name == STATE_DIR or ".tmp-" in e.name:
            shutil.rmtree(e) if e.is_dir() else e.unlink(missing_ok=True)


def shard_payload(shard: ShardEntry | None, **extra: Any) -> dict[str, Any]:
    return {"shard": asdict(shard) if shard is not None else None, **extra}
