"""Local paths and fsspec URLs behind one small interface.

Plain paths go to the OS (fast paths, memory maps). A path with ``://`` (``s3://``,
``gs://``, ``memory://``, ``file://``...) goes through fsspec, which is imported only
then: inputs and media are streamed from it. An output URL is a
:class:`~packer.io.remote.RemotePath` (:func:`location`), written directly by the
workers; with ``--staging-dir`` it is built in a local folder instead and uploaded when
finished (:func:`upload`), manifest last.
"""

from __future__ import annotations

import posixpath
from pathlib import Path
from typing import IO


def is_url(path: str | Path) -> bool:
    return "://" in str(path)


def location(path):
    """A build folder: a ``Path`` for a local path or ``file://`` URL, else a ``RemotePath``."""
    from packer.io.remote import RemotePath

    if isinstance(path, (Path, RemotePath)):
        return path
    text = str(path)
    if text.startswith("file://"):
        return Path(text[len("file://"):])
    return RemotePath(text) if is_url(text) else Path(text)


def is_remote(path) -> bool:
    """True for a :class:`~packer.io.remote.RemotePath` (a build folder in object storage)."""
    return type(path).__name__ == "RemotePath"


def rmtree(path) -> None:
    """Remove a folder and everything under it, local or remote; a missing one is fine."""
    if is_remote(path):
        path.rmtree()
    else:
        import shutil

        shutil.rmtree(path, ignore_errors=True)


def _fs(url: str):
    import fsspec

    return fsspec.core.url_to_fs(url)


def open_binary(path: str | Path) -> IO[bytes]:
    if is_url(path):
        import io

        from fsspec.spec import AbstractBufferedFile

        fs, p = _fs(str(path))
        f = fs.open(p, "rb")
        # fsspec's buffered files (s3, gcs, az, http) take no size in readline(): the reader needs it
        return io.BufferedReader(f, buffer_size=2**20) if isinstance(f, AbstractBufferedFile) else f
    return open(path, "rb")


def exists(path: str | Path) -> bool:
    if is_url(path):
        fs, p = _fs(str(path))
        return fs.isfile(p)
    return Path(path).is_file()


def stat(path: str | Path) -> tuple[int, int]:
    """(size, modification time in ns or 0 where the filesystem has none)."""
    if is_url(path):
        fs, p = _fs(str(path))
        info = fs.info(p)
        mtime = info.get("mtime") or info.get("LastModified") or info.get("created") or 0
        mtime = int(mtime.timestamp() * 1e9) if hasattr(mtime, "timestamp") else int(float(mtime) * 1e9)
        return int(info["size"]), mtime
    st = Path(path).stat()
    return st.st_size, st.st_mtime_ns


def parent(path: str) -> str | Path:
    return posixpath.dirname(path) if is_url(path) else Path(path).parent


def join(base: str | Path, ref: str) -> str | Path:
    return posixpath.join(str(base), ref) if is_url(base) else Path(base) / ref


def glob(pattern: str) -> list[str]:
    fs, p = _fs(pattern)
    protocol = pattern.split("://", 1)[0]
    return sorted(f"{protocol}://{m.lstrip('/')}" if protocol != "file" else f"file://{m}" for m in fs.glob(p))


def upload(local: Path, url: str, *, last: str = "manifest.json") -> None:
    """Copy a finished local build to ``url``, ``last`` after everything else."""
    fs, root = _fs(url)
    files = sorted(p for p in local.rglob("*") if p.is_file() and not p.name.startswith(".packer"))
    for p in sorted(files, key=lambda p: p.name == last):
        rel = p.relative_to(local).as_posix()
        if rel.startswith(".state/"):
            continue
        target = posixpath.join(root, rel)
        fs.makedirs(posixpath.dirname(target), exist_ok=True)
        fs.put_file(str(p), target)
