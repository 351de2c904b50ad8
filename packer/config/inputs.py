"""Input expansion: the ``input`` entries' patterns made into the files a build reads, each once.

A pattern is a local file, a local glob, or an fsspec URL (a glob there too); every pattern must match.
A file named by two entries (two patterns, a relative and an absolute spelling, a symlink to it) is read
once, for the first, and only when both entries give it the same settings.
"""

from __future__ import annotations

from pathlib import Path

from packer.config.sources import Source, settings_text
from packer.errors import ConfigError
from packer.io import fs


def expand_inputs(sources: list[Source]) -> tuple[list[tuple], list[tuple]]:
    """``(file, source number)`` for every input file, in order, and ``(file read, file left out)`` for every file
    named twice. Local files come back as ``Path``, fsspec URLs as ``str``."""
    files: list = []
    for k, source in enumerate(sources):
        pattern = source.pattern
        if fs.is_url(pattern):
            fs.check_reachable(pattern)  # a store that cannot be asked is named, not taken for "no file"
            matched = fs.glob(pattern) if any(c in pattern for c in "*?[") else [pattern] if fs.exists(pattern) else []
            if not matched:
                raise ConfigError(f"input {pattern!r} matches no file")
            files.extend((f, k) for f in matched)
            continue
        p = Path(pattern)
        if any(c in pattern for c in "*?["):
            anchor = Path(p.anchor) if p.is_absolute() else Path(".")
            rel = str(p.relative_to(p.anchor)) if p.is_absolute() else pattern
            matched = sorted(q for q in anchor.glob(rel) if q.is_file())
            if not matched:
                raise ConfigError(f"input pattern {pattern!r} matches no file")
            files.extend((f, k) for f in matched)
        elif p.is_file():
            files.append((p, k))
        else:
            raise ConfigError(f"input file {pattern!r} does not exist")
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
        if (a.weight, a.cap, a.policy) != (b.weight, b.cap, b.policy):  # read once: one of the two would be lost
            raise ConfigError(f"input {f} is named by two sources of different settings, {settings_text(a)} (input "
                              f"{a.pattern!r}) and {settings_text(b)} (input {b.pattern!r}); a file is read once, "
                              f"under one source's: name it in one source only (narrow the other's pattern)")
        duplicates.append((first, f))
    if not unique:
        raise ConfigError("no input given: set `input` in the pipeline or pass -i FILE.jsonl")
    return unique, duplicates
