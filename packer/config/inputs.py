"""Input expansion: the ``input`` entries' patterns made into the files a build reads, each once.

A pattern is a local file, a local glob, or an fsspec URL (a glob there too); every pattern must match.
A file named by two entries (two patterns, a relative and an absolute spelling, a symlink to it) is read
once, for the first, and only when both entries give it the same settings.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from packer.config.sources import Source, settings_text
from packer.errors import ConfigError
from packer.io import fs


def expand_inputs(sources: list[Source]) -> tuple[list[tuple], list[tuple]]:
    """``(file, source number)`` for every input file, in order, and ``(file read, file left out)`` for every file
    named twice. Local files come back as ``Path``, fsspec URLs as ``str``."""
    files: list = []
    for k, source in enumerate(sources):
        for pattern in braces(source.pattern):  # WebDataset's train-{000000..000127}.tar
            files.extend((f, k) for f in _matched(pattern))
    seen: dict = {}

    unique, duplicates = [], []
    for f, k in files:  # one file once, however it is spelled (relative, absolute, through a link)
        key = f if isinstance(f, str) else f.resolve()
        if key not in seen:
            seen[key] = (f, k)
            unique.append((f, k))
            continue
        first, j = seen[key]
        a, b = sources[j], sources[k]
        # read once: one of the two would be lost
        if (a.weight, a.cap, a.policy, a.reading) != (b.weight, b.cap, b.policy, b.reading):
            raise ConfigError(f"input {f} is named by two sources of different settings, {settings_text(a)} (input "
                              f"{a.pattern!r}) and {settings_text(b)} (input {b.pattern!r}); a file is read once, "
                              f"under one source's: name it in one source only (narrow the other's pattern)")
        duplicates.append((first, f))
    if not unique:
        raise ConfigError("no input given: set `input` in the pipeline or pass -i FILE.jsonl")
    return unique, duplicates


def _matched(pattern: str) -> list:
    """The files ``pattern`` names: a file, a glob (each match), a ``datasets.save_to_disk`` folder (its Arrow files,
    in row order), a folder of parquet files (a hub dataset's split); local or an fsspec URL."""
    if fs.is_url(pattern):
        fs.check_reachable(pattern)  # a store that cannot be asked is named, not taken for "no file"
        if any(c in pattern for c in "*?["):
            matched = fs.glob(pattern)
        elif fs.exists(pattern):
            matched = [pattern]
        else:
            matched = _folder(pattern)
        if not matched:
            raise ConfigError(f"input {pattern!r} matches no file")
        return matched
    p = Path(pattern)
    if any(c in pattern for c in "*?["):
        anchor = Path(p.anchor) if p.is_absolute() else Path(".")
        rel = str(p.relative_to(p.anchor)) if p.is_absolute() else pattern
        matched = sorted(q for q in anchor.glob(rel) if q.is_file())
        if not matched:
            raise ConfigError(f"input pattern {pattern!r} matches no file")
        return matched
    if p.is_file():
        return [p]
    if p.is_dir():
        matched = _folder(pattern)
        if not matched:
            raise ConfigError(f"input folder {pattern!r} is neither a datasets.save_to_disk folder (no state.json or "
                              f"dataset_dict.json) nor a folder of .parquet files")
        return [Path(f) for f in matched]
    raise ConfigError(f"input file {pattern!r} does not exist")


def _folder(folder: str) -> list[str]:
    """A ``save_to_disk`` folder's Arrow files, else the parquet files under a folder (sorted)."""
    saved = saved_dataset_files(folder)
    if saved is not None:
        return saved
    if fs.is_url(folder):
        try:
            return fs.glob(folder.rstrip("/") + "/**/*.parquet")
        except (OSError, ValueError):
            return []
    return sorted(str(q) for q in Path(folder).rglob("*.parquet") if q.is_file())


BRACE = re.compile(r"\{(\d+)\.\.(\d+)\}|\{([^{}]*,[^{}]*)\}")


def braces(pattern: str) -> list[str]:
    """WebDataset's brace patterns expanded, in order: ``train-{000..002}.tar`` is three names (zero-padded to the
    first bound's width), ``{a,b}`` two; several braces multiply. A pattern without braces is itself."""
    m = BRACE.search(pattern)
    if m is None:
        return [pattern]
    head, tail = pattern[: m.start()], pattern[m.end() :]
    if m.group(3) is not None:
        choices = m.group(3).split(",")
    else:
        lo, hi = int(m.group(1)), int(m.group(2))
        if hi < lo:
            raise ConfigError(f"input {pattern!r}: the range {m.group(0)} runs backwards")
        if hi - lo >= 1_000_000:
            raise ConfigError(f"input {pattern!r}: the range {m.group(0)} names over a million files")
        width = len(m.group(1)) if m.group(1).startswith("0") else 0
        choices = [str(k).zfill(width) for k in range(lo, hi + 1)]
    return [x for c in choices for x in braces(head + c + tail)]


def saved_dataset_files(folder) -> list[str] | None:
    """The Arrow files of a ``datasets.save_to_disk`` folder, in the dataset's row order (its ``state.json``), or
    None when ``folder`` is not one. A ``DatasetDict`` folder (a ``dataset_dict.json`` naming splits) gives each
    split's files in turn."""
    state = fs.join(folder, "state.json")
    if fs.exists(state):
        with fs.open_binary(state) as f:
            files = json.loads(f.read()).get("_data_files") or []
        return [str(fs.join(folder, item["filename"])) for item in files]
    splits = fs.join(folder, "dataset_dict.json")
    if fs.exists(splits):
        with fs.open_binary(splits) as f:
            names = json.loads(f.read()).get("splits") or []
        out: list[str] = []
        for name in names:
            out += saved_dataset_files(fs.join(folder, name)) or []
        return out
    return None
