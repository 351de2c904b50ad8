"""The one media-path convention: what a record's media reference names, and how a build stores and reads it back.

Three moments of one path:

- reading a record (:func:`resolve_media`): a ``ref`` as the record writes it is joined onto the folder its refs are
  relative to (:func:`record_base`: ``--media-root``, else the input file's folder), normalised lexically and
  refused when written outside that root (unless ``--allow-outside-media-root``) or unreadable; a ``data:`` URL is
  decoded to a blob (:mod:`packer.media.inline`), an ``http(s)://`` URL is kept as it is (fetched when probed);
- writing the shards (:func:`stored_ref`): the resolved file is stored relative to the build's media root
  (:func:`media_base`: ``--media-root``, else the deepest folder holding every input), so a build and its media can
  move together;
- reading the shards (:func:`resolve_ref`): a stored ref joined back onto the root the manifest records, or one the
  user gives.

Every refusal is a ``BadRecord`` with a named reason (``media_outside_root``, ``missing_<kind>``, ``bad_media_path``,
``unsupported_media_ref``): the record is quarantined, the build goes on.
"""

from __future__ import annotations

import json
import os
import posixpath
import stat
from pathlib import Path
from typing import Any

from packer.errors import BadRecord
from packer.io import blobs, fs
from packer.io.fs import is_url
from packer.io.http import is_http
from packer.media import inline


def record_base(media_root: str, file_dir: Path | str) -> Path | str:
    """The folder a record's media refs are relative to: the build's ``--media-root`` when set, else the folder of
    the input file the record comes from."""
    return Path(media_root) if media_root else file_dir


def resolve_media(ref: str, base_dir: Path | str, kind: str, allow_outside_root: bool = False) -> Path | str:
    """The file a record's media ``ref`` names, checked to exist (and to be written inside ``base_dir``).

    The root check is about the path as the record writes it, not about the dataset's
    layout: ``ref`` is joined onto ``base_dir`` and normalised lexically (``a/../b`` is
    ``b``, and that normalised path is the one read), and refused when it leaves the root
    (``../x``, an absolute path elsewhere) -- unless its real path still lies in the real
    root. Symlinks inside the root (an ``images/`` folder linked to another disk) are the
    dataset owner's choice and are followed wherever they lead.

    A ref the file system cannot even look up -- a NUL byte, a name over the OS limit, a
    symlink loop, any other OSError -- is a ``bad_media_path``, not a crashed build."""
    if "\0" in ref:
        raise BadRecord("bad_media_path", f"{kind} path {ref!r} holds a NUL byte; no file can have that name")
    if blobs.is_blob(ref):  # embedded bytes a reader put in the store (a parquet cell, a tar member)
        if ref not in blobs.STORE:
            raise BadRecord(f"missing_{kind}", f"{kind} {ref!r} names embedded media this record does not hold")
        return ref
    if ref[:5].lower() == "data:":
        return inline.data_url(ref, kind)
    if is_http(ref):  # fetched when probed (many at once: packer.io.fs.prefetch); the shards store the URL
        return ref
    try:
        return _resolve_media(ref, base_dir, kind, allow_outside_root)
    except (OSError, ValueError, RuntimeError) as e:  # RuntimeError: pathlib's "Symlink loop" before Python 3.13
        raise BadRecord("bad_media_path", f"{kind} path {ref!r} cannot be looked up: {type(e).__name__}: {e}") from None


def _outside_root(ref: str, kind: str, base_dir: Path | str) -> BadRecord:
    return BadRecord("media_outside_root", f"{kind} {ref!r} is written as a path outside the dataset root {base_dir}: give it "
                                           f"relative to the root, set --media-root to a folder holding it, or pass "
                                           f"--allow-outside-media-root to accept it")


def _within(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip(os.sep) + os.sep)


def _resolve_media(ref: str, base_dir: Path | str, kind: str, allow_outside_root: bool) -> Path | str:
    if fs.is_url(base_dir):  # a dataset on an fsspec filesystem: its media live there too
        if "://" in ref:
            raise BadRecord("unsupported_media_ref", f"{kind} {ref!r}: give media relative to the dataset, or as an "
                                                     f"http(s):// or data: URL")
        path = posixpath.normpath(posixpath.join(str(base_dir), ref)).replace(":/", "://", 1)
        if not allow_outside_root and not path.startswith(str(base_dir).rstrip("/") + "/"):
            raise _outside_root(ref, kind, base_dir)
        return path  # not asked for here: its probe reads it (many at once), and a missing one is missing_<kind> there
    if "://" in ref and not ref.startswith("file://"):
        raise BadRecord("unsupported_media_ref", f"{kind} {ref!r} is a {ref.split('://', 1)[0]}:// URL in a local "
                                                 f"dataset; packer reads media relative to the dataset, http(s):// and "
                                                 f"data: URLs: give its path, or put the dataset in the same store")
    path = Path(os.path.normpath(os.path.join(base_dir, ref.removeprefix("file://"))))  # an absolute ref replaces base_dir
    if not allow_outside_root:
        root = os.path.abspath(base_dir)
        if not _within(os.path.abspath(path), root) and not _within(os.path.realpath(path), os.path.realpath(root)):
            raise _outside_root(ref, kind, base_dir)
    try:  # not Path.is_file(): it answers False for a symlink loop, which is a bad path, not a missing file
        mode = path.stat().st_mode
    except (FileNotFoundError, NotADirectoryError):
        raise BadRecord(f"missing_{kind}", f"{kind} file {ref!r} not found (looked at {path})") from None
    if not stat.S_ISREG(mode):  # a folder, a FIFO (reading it would block), a device
        what = "folder" if stat.S_ISDIR(mode) else "FIFO" if stat.S_ISFIFO(mode) else "special file"
        raise BadRecord(f"missing_{kind}", f"{kind} file {ref!r} is not a regular file ({path} is a {what})")
    return path


def stored_ref(path: str, media_base: str) -> str:
    """How a media file is named in the shards: relative to the build's media root when
    inside it (so the build and its media can move together), else absolute, or the URL.
    A URL under a URL root is stored relative to it too (``s3://data/images/a.jpg`` under
    ``s3://data`` is ``images/a.jpg``), so ``PackedDataset(build, media_root=NEW)`` moves it.
    The loader joins it back onto the root the manifest records (or one the user gives)."""
    if not media_base or blobs.is_blob(path):  # embedded media are named by their content
        return str(path)
    if is_url(path):
        url, root = _normal_url(str(path)), _normal_url(media_base) if is_url(media_base) else ""
        return url[len(root) + 1:] if root and url.startswith(root + "/") else str(path)
    absolute = os.path.abspath(path)
    if absolute == media_base or absolute.startswith(media_base.rstrip(os.sep) + os.sep):
        return Path(os.path.relpath(absolute, media_base)).as_posix()
    return absolute


def stored_part_ref(part: Any, media_base: str) -> str:
    """A media item's ref as the shards store it: :func:`stored_ref` of its file, or for a video given as frame
    images the JSON ``{"frames": [stored refs], "fps": stated rate}`` (:func:`stored_frames` reads it back)."""
    if part.frames:
        return json.dumps({"frames": [stored_ref(f, media_base) for f in part.frames], "fps": part.fps}, ensure_ascii=False)
    return stored_ref(part.path, media_base)


def stored_frames(ref: str) -> tuple[list[str], float] | None:
    """The frames' stored refs and the stated rate (0: none) of a stored ref naming a video given as frame images;
    None for the ref of one file."""
    if not ref.startswith("{"):
        return None
    listed = json.loads(ref)
    return list(listed["frames"]), float(listed.get("fps") or 0.0)


def _normal_url(url: str) -> str:
    """``s3://b/x/../y/`` as ``s3://b/y``: one spelling per folder, so a prefix test is a containment test."""
    protocol, rest = url.split("://", 1)
    return f"{protocol}://{posixpath.normpath(rest).lstrip('/') if rest.strip('/') else ''}".rstrip("/")


def media_base(config, files: list) -> str:
    """The build's media root: ``--media-root``, else the deepest folder holding every
    input file (absolute; for URL inputs of one store, the deepest URL folder holding them).
    Empty when local files and URLs, or URLs of several stores, are mixed."""
    if config.media_root:
        return config.media_root if is_url(config.media_root) else os.path.abspath(config.media_root)
    if not files:
        return ""
    urls = [_normal_url(str(f)) for f in files if is_url(f)]
    if not urls:
        return os.path.commonpath([os.path.dirname(os.path.abspath(f)) for f in files])
    stores = {u.split("://", 1)[0] + "://" + u.split("://", 1)[1].split("/", 1)[0] for u in urls}
    if len(urls) != len(files) or len(stores) != 1:
        return ""
    protocol = urls[0].split("://", 1)[0]
    common = posixpath.commonpath([posixpath.dirname(u.split("://", 1)[1]) for u in urls])
    return f"{protocol}://{common}" if common else ""


def resolve_ref(ref: str, media_root: str) -> str:
    """The file a stored media ``ref`` names: absolute refs and URLs as they are, others
    joined onto the build's media root (``Manifest.media_root``)."""
    if "://" in ref or ref.startswith("/") or not media_root or blobs.is_blob(ref):
        return ref
    return f"{media_root.rstrip('/')}/{ref}"
