"""Weighted mixing of sources: how many copies of each sample the plan sees.

A source is one ``--input`` entry (a file or a glob) with an optional weight and cap::

    -i 'data/chat.jsonl#weight=3'            every record three times (a repeat factor)
    -i 'data/web/*.jsonl#weight=0.2'         a fifth of the records, chosen with --seed
    -i 'data/ocr.jsonl#weight=2,cap=50000'   two copies each, at most 50,000 samples in all

or, in a pipeline file, ``[[sources]]`` tables (``input``, ``weight``, ``cap``). A weight
``w`` gives each sample ``floor(w)`` copies plus one more with probability ``w - floor(w)``
(InternVL's repeat factor; ms-swift's ``#N`` is a cap); a cap then keeps a seeded random
subset of the source's copies. Stage 1 encodes every record once; mixing happens when
planning, from the seed, so the same inputs and settings give the same rows.

Accounting per input file: every record read is packed, quarantined, dropped, or
*skipped* by the mix (0 copies); extra copies are counted as *repeated*.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from packer.errors import ConfigError

SEPARATOR = "#"


@dataclass(frozen=True)
class Source:
    pattern: str
    weight: float = 1.0
    cap: int = 0  # 0: no cap

    @property
    def mixed(self) -> bool:
        return self.weight != 1.0 or self.cap > 0

    @classmethod
    def parse(cls, spec: str) -> Source:
        pattern, sep, params = spec.rpartition(SEPARATOR) if SEPARATOR in spec else (spec, "", "")
        if not sep:
            return cls(spec)
        values: dict[str, float | int] = {}
        for item in filter(None, params.split(",")):
            key, eq, value = item.partition("=")
            try:
                if not eq or key not in ("weight", "cap") or key in values:
                    raise ValueError
                values[key] = float(value) if key == "weight" else int(value)
            except ValueError:
                raise ConfigError(f"input {spec!r}: the part after '#' must be weight=W and/or cap=N "
                                  f"(e.g. 'data.jsonl#weight=0.5,cap=1000'), got {params!r}") from None
        source = cls(pattern, float(values.get("weight", 1.0)), int(values.get("cap", 0)))
        if source.weight < 0 or source.cap < 0:
            raise ConfigError(f"input {spec!r}: weight and cap must be >= 0")
        return source


@dataclass
class Mix:
    """What the mix did: ``selection`` lists sample numbers (repeats adjacent, ascending),
    ``copies[i]`` is sample ``i``'s number of copies."""

    selection: np.ndarray
    copies: np.ndarray

    @property
    def skipped(self) -> np.ndarray:
        return np.flatnonzero(self.copies == 0)


def mix(source_of_sample: np.ndarray, sources: list[Source], seed: int) -> Mix:
    """Copies of every sample under its source's weight and cap; deterministic in ``seed``."""
    source_of_sample = np.asarray(source_of_sample, np.int64)
    copies = np.ones(len(source_of_sample), np.int64)
    for s, source in enumerate(sources):
        if not source.mixed:
            continue
        members = np.flatnonzero(source_of_sample == s)
        rng = np.random.default_rng([seed, s])
        whole, frac = divmod(source.weight, 1.0)
        n = np.full(len(members), int(whole), np.int64) + (rng.random(len(members)) < frac)
        if source.cap and n.sum() > source.cap:
            expanded = np.repeat(np.arange(len(members)), n)
            keep = rng.choice(len(expanded), size=source.cap, replace=False)
            n = np.bincount(expanded[keep], minlength=len(members))
        copies[members] = n
    return Mix(np.repeat(np.arange(len(copies)), copies), copies)
