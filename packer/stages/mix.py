"""The seeded copy: how many copies of each sample the plan sees, under each source's weight and cap.

A weight ``w`` gives each sample ``floor(w)`` copies plus one more with probability ``w - floor(w)``; a cap then
keeps a seeded random subset of the source's copies (the source specs themselves: :mod:`packer.config.sources`).
Stage 1 encodes every record once; mixing happens when planning, from the seed, so the same inputs and settings
give the same rows.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from packer.config.sources import Source
from packer.errors import ConfigError

# The plan holds about 100 bytes a planned sample at its peak (docs/distributed.md, sizing model): 2^31 copies would
# need over 200 GB for the plan alone.
MAX_COPIES = 2**31 - 1


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
