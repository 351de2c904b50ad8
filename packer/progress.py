"""Progress that works in a terminal and in a log.

On a terminal (stderr is a TTY) a stage shows a tqdm bar with its total and ETA; in a
log (a cluster job, ``2> build.log``) it prints one plain line every ``interval``
seconds instead. Either way every stage ends with one line saying what it did and how
fast, so a log always shows where a build got to::

    packer: encode    2,000 records, 0.21 MB of 0.40 MB (52%), 1,913 rec/s, ETA 0:00:01
    packer: encode    done: 3,812 records (7 quarantined) in 2.0 s, 1,906 rec/s
    packer: plan      done: 3,805 samples -> 412 rows (lower bound 412) in 0.02 s
"""

from __future__ import annotations

import sys
import time
from typing import TextIO


def _mb(n: float) -> str:
    return f"{n / 1e6:,.2f} MB"


def _clock(seconds: float) -> str:
    seconds = int(max(0, seconds))
    return f"{seconds // 3600}:{seconds % 3600 // 60:02d}:{seconds % 60:02d}"


class Stage:
    """One stage's progress. ``total`` (and ``advance``'s amounts) are in ``unit``; with
    ``bytes_total`` the ETA comes from bytes done (stage 1 knows its input's size, not
    its record count)."""

    def __init__(self, name: str, unit: str, *, total: int | None = None, bytes_total: int | None = None,
                 enabled: bool = True, stream: TextIO | None = None, interval: float = 10.0):
        self.name, self.unit, self.total, self.bytes_total = name, unit, total, bytes_total
        self.enabled = enabled
        self.stream = stream or sys.stderr
        self.interval = interval
        self.count = self.bytes = 0
        self.start = self.last = time.monotonic()
        self.bar = None
        if enabled and self.stream.isatty():
            from tqdm import tqdm

            if bytes_total:
                self.bar = tqdm(total=bytes_total, desc=name, unit="B", unit_scale=True, leave=False, file=self.stream)
            else:
                self.bar = tqdm(total=total, desc=name, unit=unit, leave=False, file=self.stream)

    def advance(self, n: int, nbytes: int = 0) -> None:
        self.count += n
        self.bytes += nbytes
        if self.bar is not None:
            self.bar.update(nbytes if self.bytes_total else n)
            if self.bytes_total:
                self.bar.set_postfix_str(f"{self.count:,} {self.unit}", refresh=False)
            return
        now = time.monotonic()
        if self.enabled and now - self.last >= self.interval:
            self.last = now
            self.line(self._status(now))

    def _status(self, now: float) -> str:
        rate = self.count / max(now - self.start, 1e-9)
        parts = [f"{self.count:,} {self.unit}"]
        if self.bytes_total:
            share = self.bytes / self.bytes_total
            parts.append(f"{_mb(self.bytes)} of {_mb(self.bytes_total)} ({100 * share:.0f}%)")
            eta = (now - self.start) * (1 - share) / share if share else None
        elif self.total:
            eta = (self.total - self.count) / rate if rate else None
            parts.append(f"of {self.total:,} ({100 * self.count / self.total:.0f}%)")
        else:
            eta = None
        parts.append(f"{rate:,.0f} {self.unit}/s")
        if eta is not None:
            parts.append(f"ETA {_clock(eta)}")
        return ", ".join(parts)

    def line(self, text: str) -> None:
        if not self.enabled:
            return
        if self.bar is not None:
            self.bar.clear()
        print(f"packer: {self.name:<9} {text}", file=self.stream, flush=True)

    def done(self, text: str) -> None:
        """Close the bar and print the stage's final line (``text`` + time taken)."""
        if self.bar is not None:
            self.bar.close()
            self.bar = None
        self.line(f"done: {text} in {time.monotonic() - self.start:,.1f} s")

    @property
    def seconds(self) -> float:
        return time.monotonic() - self.start
