"""Weighted mixing of sources: how many copies of each sample the plan sees.

A source is one ``--input`` entry (a file or a glob) with an optional weight and cap, and optionally its own
packing (``max_length``, ``packing``, ``oversize``, media caps: :data:`POLICY`)::

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

from packer.config import FIELDS
from packer.errors import ConfigError

SEPARATOR = "#"
# A weight repeats each record up to ceil(weight) times; only the ratios between sources matter to a mix, so a larger
# repeat factor is better written as smaller weights of the other sources (a weight of 1e7 tried to hold 10^7 copies
# of every record). The mix's copies together are bounded too (:data:`MAX_COPIES`), once the records are counted.
MAX_WEIGHT = 1000.0
# The plan holds about 100 bytes a planned sample at its peak (docs/distributed.md, sizing model): 2^31 copies would
# need over 200 GB for the plan alone.
MAX_COPIES = 2**31 - 1


# A source's own packing policy: these build options, set per input, override the build's for its samples
POLICY = {"max_length": int, "packing": bool, "oversize": str, "max_media": int, "max_images": int, "max_audio": int,
          "max_videos": int}
OVERSIZE = FIELDS["oversize"].metadata["choices"]  # the build's own --oversize policies


@dataclass(frozen=True)
class Source:
    pattern: str
    weight: float = 1.0
    cap: int = 0  # 0: no cap
    policy: tuple[tuple[str, object], ...] = ()  # (option, value) of POLICY, sorted: this source's own packing

    @property
    def mixed(self) -> bool:
        return self.weight != 1.0 or self.cap > 0

    def options(self) -> dict[str, object]:
        """The build options this source's samples are planned with instead of the build's (``packing = false``:
        ``max_segments = 1``, each sample a row of its own)."""
        out = dict(self.policy)
        if out.pop("packing", True) is False:
            out["max_segments"] = 1
        return out

    def mixing_spec(self) -> str:
        """This source as an ``input`` entry with its weight and cap only (its own packing left out)."""
        return f"{self.pattern}{SEPARATOR}weight={self.weight!r},cap={self.cap}"

    @classmethod
    def parse(cls, spec: str) -> Source:
        """``FILE#key=value,...``: the options after the last ``#``. A file whose name holds a ``#`` is ``FILE#``
        (nothing after the last ``#``: no option), which :class:`packer.config.BuildConfig` writes for an input
        that names an existing file whole."""
        pattern, sep, params = spec.rpartition(SEPARATOR) if SEPARATOR in spec else (spec, "", "")
        if not sep:
            return cls(spec)
        values: dict[str, object] = {}
        for item in filter(None, params.split(",")):
            key, eq, value = item.partition("=")
            if not eq or key not in ALLOWED:
                raise ConfigError(f"input {spec!r}: {item!r} after '#' is not an option; give weight=W, cap=N and this "
                                  f"source's own packing ({', '.join(f'{k}=...' for k in POLICY)}; e.g. "
                                  f"'video.jsonl#max_length=16384,packing=false'); a file whose name holds a '#' is "
                                  f"written with one more '#' at its end ({pattern + SEPARATOR + params + SEPARATOR!r})")
            if key in values:
                raise ConfigError(f"input {spec!r}: {key} is given twice")
            try:
                values[key] = _value(key, value)
            except (ValueError, OverflowError):
                raise ConfigError(f"input {spec!r}: {key} = {value!r} is not {ALLOWED[key]}") from None
        for key, v in values.items():
            if not _allowed(key, v):
                raise ConfigError(f"input {spec!r}: {key} = {v!r} is not {ALLOWED[key]}")
        policy = tuple(sorted((k, v) for k, v in values.items() if k in POLICY))
        return cls(pattern, float(values.get("weight", 1.0)), int(values.get("cap", 0)), policy)


# What each option after the '#' takes (the build's own checks: its max_length over every source's, the
# algorithm's constraints, are BuildConfig's and check_plan_options')
ALLOWED = {"weight": f"a number from 0 to {MAX_WEIGHT:g} (only the ratios between sources matter: lower the other "
                     f"sources' weights instead)", "cap": "a whole number >= 0 (0: no cap)",
           "max_length": "a whole number >= 1 (at most the build's max_length)", "packing": "true or false",
           "oversize": f"one of {', '.join(OVERSIZE)}",
           **{k: "a whole number >= 0 (0: no limit)" for k in POLICY if k.startswith("max_") and k != "max_length"}}


def _allowed(key: str, value: object) -> bool:
    if key == "oversize":
        return value in OVERSIZE
    if key == "packing":
        return isinstance(value, bool)
    if key == "weight":
        return 0 <= value <= MAX_WEIGHT  # type: ignore[operator]  # nan and inf fail too
    return value >= (1 if key == "max_length" else 0)  # type: ignore[operator]


def policy_text(policy: dict[str, object]) -> str:
    """``max_length=4096, packing=false``: a source's own packing as it is written after the ``#``."""
    return ", ".join(f"{k}={str(v).lower() if isinstance(v, bool) else v}" for k, v in policy.items())


def capacity_text(max_length: int, groups: list[dict]) -> str:
    """What a fill is of: ``8,192 tokens per row``, or where source groups have their own ``max_length``, each
    row's own capacity with the rows of each (``4 rows of 2,048, 9 of 4,096``)."""
    rows: dict[int, int] = {}
    for g in groups:
        rows[int(g["capacity"])] = rows.get(int(g["capacity"]), 0) + int(g["rows"])
    if len(rows) < 2:
        return f"{next(iter(rows), max_length):,} tokens per row"
    listed = ", ".join(f"{n:,}{' rows' if k == 0 else ''} of {c:,}" for k, (c, n) in enumerate(sorted(rows.items())))
    return f"each row's own max_length ({listed})"


def _value(key: str, value: str) -> object:
    if key == "weight":
        return float(value)
    kind = POLICY.get(key, int)
    if kind is bool:
        if value.lower() not in ("true", "false"):
            raise ValueError
        return value.lower() == "true"
    return value if kind is str else int(value)


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
    total = int(copies.sum())
    if total > MAX_COPIES:
        heavy = max((s for s in sources if s.mixed), key=lambda s: s.weight)
        raise ConfigError(f"the mix plans {total:,} samples ({len(copies):,} records read), over the {MAX_COPIES:,} a "
                          f"plan can hold: lower the weights (input {heavy.pattern!r} has weight={heavy.weight:g}; only "
                          f"the ratios between sources matter) or give a source a cap")
    return Mix(np.repeat(np.arange(len(copies)), copies), copies)
