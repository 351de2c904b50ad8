"""Atomic file writes: write to a temporary name beside the target, then rename.

A remote target (:class:`~packer.io.remote.RemotePath`) is written by
:func:`packer.io.remote.atomic_write` instead: committed whole, or not at all.

A reader (or a resumed build) therefore never sees a half-written file under its
final name; a crash leaves only ``*.tmp-*`` files, which the next build removes. Files
are fsynced before the rename unless the process said otherwise (:func:`set_durable`,
``--no-durable``: each stage's worker setup passes the build's setting): the rename then
still protects against a killed process, no longer against a power loss.
"""

from __future__ import annotations

import functools
import hashlib
import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO

_DURABLE = True


@functools.cache
def file_mode() -> int:
    """The mode ``open()`` gives a new file (0666 less the umask); mkstemp's 0600 would hide shards
    from other users. The umask is read from ``/proc/self/status`` (Linux), which changes nothing;
    elsewhere it is set and put back once, on first use (not at import: that would briefly clear
    the mask of a process that merely imports packer, under its other threads)."""
    try:
        with open("/proc/self/status") as f:
            umask = next(int(line.split()[1], 8) for line in f if line.startswith("Umask:"))
    except (OSError, StopIteration, ValueError, IndexError):
        umask = os.umask(0)
        os.umask(umask)
    return 0o666 & ~umask


def set_durable(durable: bool) -> None:
    """fsync every file before its rename (the default) or not, for this process."""
    global _DURABLE
    _DURABLE = bool(durable)


@contextmanager
def atomic_open(path: str | Path, mode: str = "wb") -> Iterator[IO]:
    if type(path).__name__ == "RemotePath":
        from packer.io.remote import atomic_write

        with atomic_write(path, mode) as f:
            yield f
        return
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=path.name + ".tmp-", dir=path.parent)
    os.fchmod(fd, file_mode())
    try:
        with os.fdopen(fd, mode, **({} if "b" in mode else {"encoding": "utf-8"})) as f:
            yield f
            f.flush()
            if _DURABLE:
                os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_text_atomic(path: str | Path, text: str) -> None:
    with atomic_open(path, "w") as f:
        f.write(text)


class HashingWriter:
    """A binary file that hashes and counts what is written through it (a shard's sha256 and
    size without reading it back: a remote one would be downloaded again)."""

    def __init__(self, f: IO[bytes]):
        self.f = f
        self.h = hashlib.sha256()
        self.size = 0

    def write(self, data) -> int:
        view = memoryview(data)
        self.h.update(view)
        self.size += view.nbytes
        return self.f.write(data)

    def flush(self) -> None:
        self.f.flush()

    def tell(self) -> int:
        return self.size

    @property
    def closed(self) -> bool:
        return self.f.closed

    def sha256(self) -> str:
        return self.h.hexdigest()


def sha256_file(path: str | Path, block: int = 1 << 20) -> str:
    h = hashlib.sha256()
    with (path.open("rb") if type(path).__name__ == "RemotePath" else open(path, "rb")) as f:
        while chunk := f.read(block):
            h.update(chunk)
    return h.hexdigest()
