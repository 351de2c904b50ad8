"""An fsspec URL (``s3://``, ``gs://``, ``az://``, ``memory://``...) with the slice of
pathlib's API a build uses, so the same stage code writes a local folder or a bucket.

Two things differ from a local folder and are handled here:

- **Atomic writes** (:func:`atomic_write`). An object store has no rename, but its uploads
  are already all-or-nothing: a file opened with ``autocommit=False`` uploads its parts
  as they fill and becomes visible under its name only at ``commit()`` (S3's
  CompleteMultipartUpload, GCS's last resumable chunk, Azure's block list), and
  ``discard()`` abandons it. A filesystem without that (``memory://``) gets a temporary
  name and ``mv``, as on disk. Either way a half-written shard is never seen under its
  final name, and a worker killed mid-write leaves at most an unfinished upload
  (S3: an abort-incomplete-multipart lifecycle rule removes those).
- **Listing caches.** fsspec caches directory listings per process; other processes
  (Ray workers on other nodes) write the same prefix, so every query drops the cache first.

Reading a shard memory-maps a local copy (:mod:`packer.io.cache`).
"""

from __future__ import annotations

import contextlib
import io
import posixpath
import uuid
from collections.abc import Iterator
from pathlib import PurePosixPath
from types import SimpleNamespace
from typing import IO, Any


class RemotePath:
    """``RemotePath("s3://bucket/builds/b1") / "samples" / "part-00000.arrow"``."""

    def __init__(self, url: str, fs: Any = None):
        url = str(url).rstrip("/")
        self.protocol = url.split("://", 1)[0]
        if fs is None:
            import fsspec

            fs, _ = fsspec.core.url_to_fs(url)
        self.fs = fs
        self.path = fs._strip_protocol(url).rstrip("/")
        self.url = f"{self.protocol}://{self.path.lstrip('/')}"  # one spelling per file, whatever the listing gave

    # ------------------------------------------------------------------ names

    def __truediv__(self, other: str | PurePosixPath) -> RemotePath:
        return RemotePath(posixpath.join(self.url, str(other)), self.fs)

    def __str__(self) -> str:
        return self.url

    def __repr__(self) -> str:
        return f"RemotePath({self.url!r})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, RemotePath) and other.url == self.url

    def __lt__(self, other: RemotePath) -> bool:
        return self.url < other.url

    def __hash__(self) -> int:
        return hash(self.url)

    @property
    def name(self) -> str:
        return posixpath.basename(self.path)

    @property
    def suffix(self) -> str:
        return PurePosixPath(self.name).suffix

    @property
    def parent(self) -> RemotePath:
        return RemotePath(posixpath.dirname(self.url), self.fs)

    def relative_to(self, other: RemotePath) -> PurePosixPath:
        return PurePosixPath(self.path).relative_to(other.path)

    def resolve(self) -> RemotePath:
        return self

    def samefile(self, other: object) -> bool:
        return self == other

    def _child(self, full: str) -> RemotePath:
        return RemotePath(f"{self.protocol}://{full.lstrip('/')}", self.fs)

    # ------------------------------------------------------------------ queries (never from a stale listing)

    def _fresh(self) -> Any:
        self.fs.invalidate_cache()
        return self.fs

    def exists(self) -> bool:
        return self._fresh().exists(self.path)

    def is_file(self) -> bool:
        return self._fresh().isfile(self.path)

    def is_dir(self) -> bool:
        return self._fresh().isdir(self.path)

    def info(self) -> dict[str, Any]:
        return self._fresh().info(self.path)

    def stat(self) -> SimpleNamespace:
        info = self.info()
        return SimpleNamespace(st_size=int(info["size"]))

    def iterdir(self) -> Iterator[RemotePath]:
        try:
            names = self._fresh().ls(self.path, detail=False)
        except FileNotFoundError:
            return iter(())
        return iter(sorted(self._child(n) for n in names if n.rstrip("/") != self.path))

    def glob(self, pattern: str) -> list[RemotePath]:
        return sorted(self._child(m) for m in self._fresh().glob(posixpath.join(self.path, pattern)))

    def rglob(self, pattern: str = "*") -> list[RemotePath]:
        try:
            found = self._fresh().find(self.path)
        except FileNotFoundError:
            return []
        return sorted(self._child(m) for m in found if PurePosixPath(m).match(pattern))

    # ------------------------------------------------------------------ reading

    def open(self, mode: str = "rb", encoding: str | None = None) -> IO:
        if "w" in mode or "a" in mode:
            raise ValueError("write a remote file with packer.io.files.atomic_open")
        self._fresh()
        return self.fs.open(self.path, mode, **({"encoding": encoding or "utf-8"} if "b" not in mode else {}))

    def read_bytes(self) -> bytes:
        with self.open("rb") as f:
            return f.read()

    def read_text(self, encoding: str = "utf-8") -> str:
        return self.read_bytes().decode(encoding)

    # ------------------------------------------------------------------ changing

    def mkdir(self, parents: bool = False, exist_ok: bool = False) -> None:
        """Object stores have no folders; a filesystem that has them gets one."""
        with contextlib.suppress(FileExistsError):
            self.fs.makedirs(self.path, exist_ok=True)

    def unlink(self, missing_ok: bool = False) -> None:
        try:
            self.fs.rm_file(self.path)
        except FileNotFoundError:
            if not missing_ok:
                raise
        self.fs.invalidate_cache()

    def rmdir(self) -> None:
        """Like ``Path.rmdir``: only an empty folder (an object store's prefix is gone when empty)."""
        if any(True for _ in self.iterdir()):
            raise OSError(f"{self} is not empty")
        with contextlib.suppress(FileNotFoundError, OSError, NotImplementedError):
            self.fs.rmdir(self.path)

    def rmtree(self) -> None:
        with contextlib.suppress(FileNotFoundError):
            self._fresh().rm(self.path, recursive=True)
        self.fs.invalidate_cache()


@contextlib.contextmanager
def atomic_write(path: RemotePath, mode: str = "wb") -> Iterator[IO]:
    """Write ``path`` so that it appears whole or not at all (see the module's docstring)."""
    fs = path.fs
    path.parent.mkdir(parents=True, exist_ok=True)
    f = None
    if path.protocol != "memory":  # memory:// makes a file visible at open: it takes the rename below
        with contextlib.suppress(TypeError, NotImplementedError):
            f = fs.open(path.path, "wb", autocommit=False)
    target = None
    if f is None:
        target = path.parent / f"{path.name}.tmp-{uuid.uuid4().hex}"
        f = fs.open(target.path, "wb")
    try:
        out = f if "b" in mode else io.TextIOWrapper(f, encoding="utf-8", newline="")
        yield out
        if out is not f:
            out.flush()
            out.detach()
        f.close()
        if target is None:
            f.commit()
        else:
            fs.mv(target.path, path.path)
    except BaseException:
        if target is None:
            with contextlib.suppress(Exception):
                f.discard()
            with contextlib.suppress(Exception):
                f.closed = True  # its close() must never commit what was discarded
        else:
            with contextlib.suppress(Exception):
                f.close()
            with contextlib.suppress(Exception):
                fs.rm_file(target.path)
        raise
    finally:
        fs.invalidate_cache()
