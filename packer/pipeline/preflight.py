"""The checks a build's options pass where the build starts, before any input is expanded or record read.

The config checks what it can judge alone when it is made (:class:`packer.config.fields.BuildConfig`); what needs
more than the config knows is checked here, once, for ``packer build`` and ``packer repack``: the family and the
modalities it encodes, the chat template's clock, the plan options the algorithm can honour (the build's and each
source group's own), and an output folder that would hold an input.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from packer.config.fields import BuildConfig
from packer.encode.render import template_clock
from packer.errors import ConfigError
from packer.families import FAMILIES, resolve_kinds
from packer.io import fs
from packer.pack import ALGORITHMS
from packer.pack.registry import check_supported
from packer.stages.planning import policy_groups


def preflight(config: BuildConfig) -> None:
    """Every check of ``config`` that needs more than the config knows, in one pass: the family (one of
    :data:`packer.families.FAMILIES`, and the modalities it encodes), the template clock and the plan options
    (:func:`check_plan_options`). Errors keep their messages and exit code (ConfigError: 2)."""
    if config.family not in FAMILIES:
        raise ConfigError(f"family = {config.family!r} is not one of {', '.join(FAMILIES)}")
    if config.family != "generic":
        resolve_kinds(config.family, config.modalities)
    template_clock(config.template_time)  # a malformed time fails here
    check_plan_options(config)


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
