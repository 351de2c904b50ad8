"""Media held as bytes rather than files: a record's embedded image (a parquet cell, a tar member, a ``data:`` URL, a
fetched ``http(s)://`` body), named by its content.

A blob is named ``sha256:<hex>`` (:func:`name`): the name is its content, so the same picture embedded in two records
is one blob, and a build's media shards can be checked against the names alone. The bytes live in this process's
:data:`STORE` while a stage-1 task (or a loader batch) needs them; :mod:`packer.io.fs` opens and stats such a name like
a file, so every media probe and decoder reads them unchanged. A task forgets its blobs when it has written them
(:meth:`Store.forget`): a worker never holds more than one task's media.
"""

from __future__ import annotations

import hashlib
import io
import re
import weakref

PREFIX = "sha256:"
NAME = re.compile(r"sha256:[0-9a-f]{64}\Z")


def is_blob(path) -> bool:
    """True for a blob's name (``sha256:`` and 64 lowercase hex digits)."""
    return isinstance(path, str) and path.startswith(PREFIX) and NAME.match(path) is not None


def name(data: bytes) -> str:
    """The blob name of ``data``."""
    return PREFIX + hashlib.sha256(data).hexdigest()


class Store:
    """Blobs by name, held in memory: :meth:`put` when read, :meth:`get` by the probes and the task's writer."""

    def __init__(self) -> None:
        self._data: dict[str, bytes] = {}
        self._nbytes = 0  # of what _data holds (_hold, _drop): asked once a record by stage 1's grouping
        self._urls: dict[str, tuple[str, int, int]] = {}  # a remote URL fetched whole -> (blob name, size, mtime ns)
        self._failed: dict[str, BaseException] = {}  # a remote URL whose fetch failed -> the error, met again on use
        self._heads: dict[str, bytes] = {}  # a remote URL read in part (its first bytes: a header) -> those bytes
        self._only_urls: set[str] = set()  # blobs held for URLs alone (release_urls may drop them)
        self._shelves: list[weakref.ref] = []  # where a name not held is looked up: a loader's media shards

    def attach(self, shelf) -> None:
        """Look up a name this store does not hold in ``shelf`` too (``shelf.find(name)``: bytes-like or None), for
        as long as ``shelf`` lives: an embedded build's media shards, opened by :class:`packer.loader.PackedDataset`."""
        self._shelves = [r for r in self._shelves if r() is not None]
        if not any(r() is shelf for r in self._shelves):
            self._shelves.append(weakref.ref(shelf))

    def _find(self, key: str):
        for ref in self._shelves:
            shelf = ref()
            found = shelf.find(key) if shelf is not None else None
            if found is not None:
                return found
        return None

    def _hold(self, key: str, data: bytes) -> None:
        if key not in self._data:
            self._data[key] = data
            self._nbytes += len(data)

    def _drop(self, key: str) -> None:
        data = self._data.pop(key, None)
        if data is not None:
            self._nbytes -= len(data)

    def put(self, data: bytes) -> str:
        key = name(data)
        self._only_urls.discard(key)  # a reader's blob now, not only a URL's
        self._hold(key, bytes(data))
        return key

    def add(self, key: str, data: bytes) -> None:
        """Hold ``data`` under ``key``, a name computed before (a media shard's row)."""
        self._hold(key, data)

    def get(self, key: str) -> bytes:
        data = self._data.get(key)
        if data is None:
            data = self._find(key)
        if data is None:
            raise FileNotFoundError(f"{key}: no embedded media of that content is held")
        return data

    def __contains__(self, key: str) -> bool:
        return key in self._data or self._find(key) is not None

    def __len__(self) -> int:
        return len(self._data)

    def nbytes(self) -> int:
        return self._nbytes

    def hold_url(self, url: str, data: bytes, mtime_ns: int = 0) -> str:
        """Hold the body of a remote ``url`` (fetched whole by a prefetch, :mod:`packer.io.fs`) as a blob; its name,
        size and time stay known (:meth:`url`) after the bytes are forgotten, until :meth:`forget` of all."""
        key = name(data)
        if key not in self._data:
            self._only_urls.add(key)
            self._hold(key, bytes(data))
        self._urls[url] = (key, len(data), mtime_ns)
        return key

    def hold_head(self, url: str, data: bytes, size: int, mtime_ns: int = 0) -> None:
        """Hold the first bytes of a remote ``url`` of ``size`` bytes (a ranged read, :func:`packer.io.fs.prefetch`):
        only a header probe reads them (:meth:`head`); its size and time are known (:meth:`url`, no blob name), and
        every other reader of ``url`` fetches it whole."""
        self._heads[url] = bytes(data)
        self._urls[url] = ("", size, mtime_ns)

    def head(self, url: str) -> bytes | None:
        """The first bytes of ``url`` held by :meth:`hold_head` (None when none are, or it is held whole)."""
        return self._heads.get(url)

    def drop_head(self, url: str) -> None:
        self._heads.pop(url, None)

    def forget_urls(self) -> None:
        """Drop all that is known of URLs (a stage-1 task's start: its URLs are read afresh)."""
        for key in self._only_urls:
            self._drop(key)
        self._only_urls.clear()
        self._urls.clear()
        self._failed.clear()
        self._heads.clear()

    def url(self, url: str) -> tuple[str, int, int] | None:
        """(blob name, size, modification time in ns) of a URL held by :meth:`hold_url`; None when never held."""
        return self._urls.get(url)

    def url_bytes(self, url: str) -> bytes | None:
        """The held body of ``url``, None when it is not (or no longer) held."""
        seen = self._urls.get(url)
        return self._data.get(seen[0]) if seen and seen[0] else None

    def fail_url(self, url: str, error: BaseException) -> None:
        """Remember that fetching ``url`` failed, so its reader meets the same error without asking again."""
        self._failed[url] = error

    def url_failure(self, url: str) -> BaseException | None:
        return self._failed.get(url)

    def release_urls(self, urls, keep_facts: bool = False) -> None:
        """Forget the bodies of ``urls`` where no other URL or reader holds the same bytes, and all else known of
        them (a loader's batch, when it is loaded); with ``keep_facts`` their size, time and failure stay known
        (a stage-1 task's probed media: its media index asks no store for them again)."""
        urls = list(urls)
        for url in urls:
            self._heads.pop(url, None)
        if keep_facts:
            names = {seen[0] for url in urls if (seen := self._urls.get(url)) is not None}
            kept = set()
        else:
            names = {seen[0] for url in urls if (seen := self._urls.pop(url, None)) is not None}
            for url in urls:
                self._failed.pop(url, None)
            kept = {v[0] for v in self._urls.values()}
        for key in names - kept:
            if key in self._only_urls:
                self._only_urls.discard(key)
                self._drop(key)

    def forget(self, keys=None) -> None:
        """Drop ``keys`` (all when None: what is known of URLs, their size, time or failure, stays until
        :meth:`forget_urls`, so a task's media index asks no store for them again)."""
        if keys is None:
            self._data.clear()
            self._nbytes = 0
            self._only_urls.clear()
            return
        for k in keys:
            self._drop(k)

    def open(self, key: str) -> io.BytesIO:
        return io.BytesIO(self.get(key))


STORE = Store()  # this process's: a stage-1 worker's current task, a loader's batch
