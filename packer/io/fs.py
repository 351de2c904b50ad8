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

from packer.errors import BadRecord, ConfigError
from packer.io import blobs, http

FETCH_THREADS = 16  # remote media read at once by one process (stage-1 worker, loader batch): round trips overlap
PREFETCH_MAX_BYTES = 64 * 2**20  # a larger object is not read whole ahead (a long video: its reader reads its header)
HEAD_BYTES = 64 * 2**10  # what a header probe reads of a remote image first (a ranged read); more only if it needs it


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


# Filesystems whose files are gone when the process ends: refused as a build's output
NON_DURABLE = ("memory",)
# Where each store reads its credentials from: the fix a refused URL names
CREDENTIALS = {
    "s3": "AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (or AWS_PROFILE, or an instance role); AWS_ENDPOINT_URL for "
          "an S3-compatible store that is not AWS",
    "gs": "GOOGLE_APPLICATION_CREDENTIALS (a service account's key file), or `gcloud auth application-default login`",
    "az": "AZURE_STORAGE_CONNECTION_STRING, or AZURE_STORAGE_ACCOUNT_NAME with AZURE_STORAGE_ACCOUNT_KEY or "
          "AZURE_STORAGE_SAS_TOKEN",
}
CREDENTIALS.update(s3a=CREDENTIALS["s3"], gcs=CREDENTIALS["gs"], abfs=CREDENTIALS["az"], abfss=CREDENTIALS["az"],
                   adl=CREDENTIALS["az"])


def _fs(url: str):
    """fsspec's filesystem for ``url``; a protocol fsspec does not know, or whose package is not installed, is a
    :class:`~packer.errors.ConfigError` naming the URL and the fix."""
    import fsspec

    try:
        return fsspec.core.url_to_fs(url)
    except ImportError as e:  # fsspec's message names the package: "Please install gcsfs to access Google Storage"
        raise ConfigError(f"{url}: {_first_line(e)} (pip install it on every machine the build runs on)") from None
    except ValueError as e:
        if "protocol" not in str(e).lower():
            raise
        raise ConfigError(f"{url}: {_first_line(e)}; packer reads and writes local paths and fsspec URLs (s3://, gs://, "
                          f"az://, file://, ...)") from None


def _first_line(e: BaseException) -> str:
    return (str(e).strip().splitlines() or [type(e).__name__])[0][:300]


def check_reachable(url: str, *, output: bool = False, what: str = "") -> None:
    """Ask the store behind ``url`` once, so that missing credentials, a wrong endpoint or a refused request
    are one line (:class:`~packer.errors.ConfigError`, exit 2) naming the URL and the fix, before a build
    starts, rather than a traceback from inside it or an input that "matches no file" (fsspec's
    ``exists`` / ``glob`` answer False to a store they could not ask). An absent file is an answer: not
    refused here. An ``output`` on a filesystem that keeps nothing after the process (``memory://``) is
    refused: the build would be gone when ``packer build`` exits. ``what`` names the URL in the message
    (``output`` / ``input`` by default)."""
    protocol = str(url).split("://", 1)[0].lower()
    if output and protocol in NON_DURABLE:
        raise ConfigError(f"output {url}: {protocol}:// keeps its files only while this process runs, so the build "
                          f"would be gone when packer exits; write it to a folder or to durable storage (s3://, gs://, "
                          f"az://)")
    fs, path = _fs(str(url))
    probe = path.split("*", 1)[0].split("?", 1)[0].split("[", 1)[0]  # a pattern: the part before its first wildcard
    probe = probe if probe == path else posixpath.dirname(probe)
    try:
        fs.invalidate_cache()
        fs.info(probe.rstrip("/") or probe)
    except FileNotFoundError:
        return
    except Exception as e:  # noqa: BLE001 -- each store raises its own (botocore, google.auth, azure.core): named below
        what = what or ("output" if output else "input")
        denied = isinstance(e, PermissionError)
        fix = (f"give this machine (and every worker) credentials that may {'write' if output else 'read'} it"
               if denied else "give this machine (and every worker) credentials and check the URL's endpoint")
        where = CREDENTIALS.get(protocol)
        raise ConfigError(f"{what} {url}: cannot reach it ({type(e).__name__}: {_first_line(e)}); {fix}"
                          + (f": {where}" if where else "")) from None


def is_remote_media(path) -> bool:
    """A medium another machine serves (``s3://``, ``http(s)://``, ...): worth reading ahead, many at once."""
    text = str(path)
    return is_url(text) and not text.startswith(("file://", "memory://")) and not blobs.is_blob(text)


def _held(path) -> tuple[str, int, int] | None:
    """What is known of a remote ``path`` read ahead (:func:`prefetch`); its failure raised again."""
    failure = blobs.STORE.url_failure(str(path))
    if failure is not None:
        raise failure.with_traceback(None)
    return blobs.STORE.url(str(path))


def prefetch(paths, threads: int = FETCH_THREADS, budget: int = 2**30, heads=()) -> list[str]:
    """Read the remote media among ``paths`` whole, ``threads`` at a time, and hold them (with their size and
    time) in :data:`packer.io.blobs.STORE`, so their probes and loads ask no store again; a failure is held
    too, and met by the reader. Objects over :data:`PREFETCH_MAX_BYTES`, and those past ``budget`` bytes read
    in all, are left to their readers. Of the URLs in ``heads`` (a header probe's: an image under
    ``--image-check header``) only the first :data:`HEAD_BYTES` are read (a ranged read; the whole when it is no
    larger, or the server ignores the range), held apart for :func:`open_header` alone. Returns the URLs it asked
    for (:meth:`~packer.io.blobs.Store.release_urls` forgets them)."""
    from concurrent.futures import ThreadPoolExecutor

    heads = set(map(str, heads))
    wanted = [p for p in dict.fromkeys(map(str, paths))
              if is_remote_media(p) and blobs.STORE.url_bytes(p) is None and blobs.STORE.url_failure(p) is None
              and not (p in heads and blobs.STORE.head(p) is not None)]
    if not wanted:
        return []
    spent = 0

    def one(url: str):
        nonlocal spent
        if spent >= budget:
            return None
        first = HEAD_BYTES if url in heads else None
        try:
            if http.is_http(url):
                body = http.fetch_first(url, first) if first else http.fetch(url)
                data, mtime, size = body.data, body.mtime_ns, body.size
            else:
                fsys, p = _fs(url)
                # s3fs, gcsfs, adlfs: one HEAD (the file's details), one GET (of the first bytes for a header)
                with fsys.open(p, "rb", **({"block_size": first, "cache_type": "none"} if first else {})) as f:
                    info = getattr(f, "details", None) or fsys.info(p)
                    size = int(info["size"])
                    if size > PREFETCH_MAX_BYTES and not first:
                        return None
                    data, mtime = f.read(first or -1), _mtime(info)
        except Exception as e:  # noqa: BLE001 -- the reader meets it (a BadRecord, FileNotFoundError, a store's error)
            return e
        spent += len(data)
        return data, mtime, size

    with ThreadPoolExecutor(min(threads, len(wanted))) as pool:
        for url, got in zip(wanted, pool.map(one, wanted), strict=True):
            if isinstance(got, tuple):
                data, mtime, size = got
                if size < 0 or size == len(data):
                    blobs.STORE.hold_url(url, data, mtime)
                else:
                    blobs.STORE.hold_head(url, data, size, mtime)
            elif isinstance(got, (FileNotFoundError, BadRecord)):  # the object's answer, not the network's mood
                blobs.STORE.fail_url(url, got)
    return wanted


def open_binary(path: str | Path) -> IO[bytes]:
    if blobs.is_blob(path):  # embedded media, held in memory (packer.io.blobs)
        return blobs.STORE.open(str(path))
    if is_url(path) and _held(path) is not None and (data := blobs.STORE.url_bytes(str(path))) is not None:
        import io

        return io.BytesIO(data)
    if http.is_http(path):
        import io

        return io.BytesIO(http.fetch(str(path)).data)
    if is_url(path):
        import io

        from fsspec.spec import AbstractBufferedFile

        fs, p = _fs(str(path))
        f = fs.open(p, "rb")
        # fsspec's buffered files (s3, gcs, az, http) take no size in readline(): the reader needs it
        return io.BufferedReader(f, buffer_size=2**20) if isinstance(f, AbstractBufferedFile) else f
    return open(path, "rb")


def open_header(path: str | Path) -> tuple[IO[bytes], bool]:
    """``path`` opened for a header probe, and whether what it reads is only the first bytes of a remote object
    (:func:`prefetch`'s ``heads``): a probe that finds them short reads the whole (:func:`drop_header`, then
    :func:`open_binary`). Every other reader uses :func:`open_binary`, which never sees a part."""
    if is_url(path) and (head := blobs.STORE.head(str(path))) is not None:
        import io

        return io.BytesIO(head), True
    return open_binary(path), False


def drop_header(path: str | Path) -> None:
    """Forget the first bytes held of ``path`` (:func:`open_header`): its next probe reads it whole."""
    blobs.STORE.drop_head(str(path))


def exists(path: str | Path) -> bool:
    if blobs.is_blob(path):
        return str(path) in blobs.STORE
    if http.is_http(path):
        try:
            http.head(str(path))
        except FileNotFoundError:
            return False
        return True
    if is_url(path):
        fs, p = _fs(str(path))
        return fs.isfile(p)
    return Path(path).is_file()


def stat(path: str | Path) -> tuple[int, int]:
    """(size, modification time in ns or 0 where the filesystem has none)."""
    if blobs.is_blob(path):  # its name is its content: no time
        return len(blobs.STORE.get(str(path))), 0
    if is_url(path) and (held := _held(path)) is not None:
        return held[1], held[2]
    if http.is_http(path):
        answer = http.head(str(path))
        return answer.size, answer.mtime_ns
    if is_url(path):
        fs, p = _fs(str(path))
        info = fs.info(p)
        return int(info["size"]), _mtime(info)
    st = Path(path).stat()
    return st.st_size, st.st_mtime_ns


def _mtime(info: dict) -> int:
    """An fsspec ``info``'s modification time in ns (0 where the store gives none)."""
    mtime = info.get("mtime") or info.get("LastModified") or info.get("created") or 0
    return int(mtime.timestamp() * 1e9) if hasattr(mtime, "timestamp") else int(float(mtime) * 1e9)


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
