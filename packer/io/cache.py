"""Local copies of remote shards, so that a remote build is read memory-mapped like a local one.

A stage-3 worker, the loader (``PackedDataset("s3://...")``) and ``packer verify`` read
shards of a build in object storage; each is downloaded once per machine into
``$PACKER_CACHE`` (default ``~/.cache/packer``) under ``remote/``, then memory-mapped. A
copy whose sha256 is known (a manifest or journal entry lists it) is stored under that
hash, checked while downloading, and shared by every build and process on the machine;
otherwise the key is the URL with the size and modification tag the store reports, so a
changed file is fetched again. Downloads go to a temporary name and are renamed, so
concurrent workers on one node never read a half-written copy. The folder can be deleted
at any time. Builds to a URL also keep their lock here (:func:`lock_folder`).
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from pathlib import Path

from packer.errors import DamagedShardError, PackerError

CHUNK = 8 * 2**20


def cache_root() -> Path:
    return Path(os.environ.get("PACKER_CACHE") or Path.home() / ".cache" / "packer")


def local_copy(path, sha256: str | None = None) -> Path:
    """A local file with the bytes of the remote ``path`` (a :class:`~packer.io.remote.RemotePath`)."""
    root = cache_root() / "remote"
    if sha256:
        target = root / "sha256" / sha256[:2] / f"{sha256}{path.suffix}"
    else:
        info = path.info()
        tag = info.get("ETag") or info.get("etag") or info.get("md5Hash") or info.get("LastModified") or info.get("mtime")
        key = hashlib.sha256(f"{path.url}\0{info.get('size')}\0{tag}".encode()).hexdigest()
        target = root / "url" / key[:2] / f"{key}{path.suffix}"
    if target.is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=target.name + ".tmp-", dir=target.parent)
    h = hashlib.sha256()
    try:
        with os.fdopen(fd, "wb") as out, path.open("rb") as f:
            while chunk := f.read(CHUNK):
                h.update(chunk)
                out.write(chunk)
        if sha256 and h.hexdigest() != sha256:
            raise DamagedShardError(f"{path} does not match its manifest (sha256 differs): the file changed or is "
                                    f"damaged; packer verify lists every problem, a rebuild replaces it")
        os.replace(tmp, target)
    except FileNotFoundError:
        raise PackerError(f"{path} is missing: the build is incomplete or damaged (packer verify lists every problem)") from None
    finally:
        Path(tmp).unlink(missing_ok=True)
    return target


def local_folder(files: list[tuple[object, str, str]]) -> Path:
    """A local folder holding ``(remote path, name, sha256)`` files under their names (a tokenizer
    folder for ``from_pretrained``), shared by everything that asks for the same files."""
    import shutil

    key = hashlib.sha256("\0".join(f"{n}:{s}" for _, n, s in sorted(files, key=lambda f: f[1])).encode()).hexdigest()
    folder = cache_root() / "remote" / "folders" / key
    if folder.is_dir():
        return folder
    folder.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=key + ".tmp-", dir=folder.parent))
    for path, name, sha in files:  # a name may hold a subfolder (a tokenizer's additional_chat_templates/)
        (tmp / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(local_copy(path, sha), tmp / name)
    try:
        os.replace(tmp, folder)
    except OSError:  # another process put it there first
        shutil.rmtree(tmp, ignore_errors=True)
    return folder


def lock_folder(url: str) -> Path:
    """Where a build to ``url`` holds its lock on this machine (an object store has no ``flock``)."""
    folder = cache_root() / "locks" / hashlib.sha256(url.encode()).hexdigest()[:32]
    folder.mkdir(parents=True, exist_ok=True)
    return folder
