"""WebDataset tar shards: members grouped by key into samples, the record from the ``json`` member.

A member ``dir/00042.jpg`` belongs to the sample ``dir/00042`` (the key is the name up to the first ``.`` of its last
component, as WebDataset cuts it) with the extension ``jpg``; a sample's members are consecutive in the tar. The
record is the ``json`` member; media members go to the record's ``images`` / ``audios`` / ``videos`` lists by
extension (:data:`KINDS`), several of one kind ordered by name (``0.jpg``, ``1.jpg``, ...), unless the json names
them itself: a string in its ``images`` (``audios``, ``videos``, or singular) list that is a member's extension
(``"0.jpg"``, ``"jpg"``) or full name is that member's bytes.
"""

from __future__ import annotations

import json
import posixpath
import tarfile
from collections.abc import Iterator
from typing import Any

from packer.errors import BadRecord

KINDS = {"jpg": "image", "jpeg": "image", "png": "image", "webp": "image", "bmp": "image", "gif": "image",
         "tif": "image", "tiff": "image", "mp4": "video", "webm": "video", "mkv": "video", "avi": "video",
         "mov": "video", "wav": "audio", "flac": "audio", "mp3": "audio", "ogg": "audio", "opus": "audio",
         "m4a": "audio"}
LISTS = {"image": ("images", "image"), "audio": ("audios", "audio"), "video": ("videos", "video")}
MAX_MEMBER_BYTES = 256 * 2**20  # a member over this is its sample's error, skipped without being held
MAX_JSON_BYTES = 64 * 2**20


def split_name(name: str) -> tuple[str, str]:
    """``a/b/00042.0.jpg`` -> (``a/b/00042``, ``0.jpg``)."""
    folder, base = posixpath.split(name)
    stem, dot, ext = base.partition(".")
    return posixpath.join(folder, stem) if folder else stem, ext.lower() if dot else ""


def read_samples(path) -> Iterator[tuple[int, str, dict[str, Any] | BadRecord]]:
    """``(number, key, record or BadRecord)`` of every sample of the tar at ``path``, in order."""
    from packer.io import fs

    number = 0
    with fs.open_binary(path) as raw:
        key: str | None = None
        members: dict[str, bytes] = {}
        errors: list[BadRecord] = []
        try:
            with tarfile.open(fileobj=raw, mode="r|*") as tar:
                for info in tar:
                    if not info.isfile():
                        continue
                    k, ext = split_name(info.name)
                    if k != key:
                        if key is not None:
                            yield number, key, _sample(key, members, errors)
                            number += 1
                        key, members, errors = k, {}, []
                    limit = MAX_JSON_BYTES if ext == "json" else MAX_MEMBER_BYTES
                    if info.size > limit:
                        errors.append(BadRecord("media_too_large" if ext != "json" else "line_too_long",
                                                f"member {info.name} holds {info.size:,} bytes, over the "
                                                f"{limit:,}-byte limit"))
                        continue
                    f = tar.extractfile(info)
                    data = f.read() if f is not None else b""
                    if len(data) != info.size:
                        raise tarfile.ReadError(f"member {info.name} is cut short")
                    members[ext] = data
        except (tarfile.TarError, EOFError, OSError) as e:
            if key is not None:
                errors.append(BadRecord("truncated_tar", f"the tar ends inside this sample ({type(e).__name__}: {e})"))
                yield number, key, _sample(key, members, errors)
                return
            raise BadRecord("truncated_tar", f"cannot read the tar ({type(e).__name__}: {e})") from None
        if key is not None:
            yield number, key, _sample(key, members, errors)


def _sample(key: str, members: dict[str, bytes], errors: list[BadRecord]) -> dict[str, Any] | BadRecord:
    if errors:
        return errors[0]
    if "json" not in members:
        return BadRecord("missing_json", f"sample {key!r} has no json member (members: {', '.join(sorted(members)) or 'none'})")
    try:
        record = json.loads(members.pop("json"))
    except (ValueError, RecursionError) as e:
        return BadRecord("invalid_json", f"sample {key!r}: its json member does not parse ({e})")
    if not isinstance(record, dict):
        return BadRecord("wrong_type", f"sample {key!r}: its json member must be an object")
    used: set[str] = set()
    for kind, (plural, singular) in LISTS.items():
        field = plural if plural in record else singular if singular in record else None
        if field is not None and record[field] is not None:
            named = record[field] if isinstance(record[field], list) else [record[field]]
            out = []
            for name in named:
                own = isinstance(name, str) and name.startswith(key.rsplit("/", 1)[-1] + ".")  # "00042.jpg": "jpg"
                ext = name.split(".", 1)[1].lower() if own else name
                if isinstance(ext, str) and ext.lower() in members:
                    out.append(members[ext.lower()])
                    used.add(ext.lower())
                elif isinstance(name, str) and name.lower() in KINDS and name.lower() not in members:
                    return BadRecord(f"missing_{kind}", f"sample {key!r}: its json names member {name!r}, which the tar "
                                                         f"does not hold")
                else:
                    out.append(name)
            record[field] = out if isinstance(record[field], list) else out[0]
    for kind, (plural, singular) in LISTS.items():
        if plural in record or singular in record:
            continue
        found = sorted((ext for ext in members if ext not in used and KINDS.get(ext.rsplit(".", 1)[-1]) == kind),
                       key=_order)
        if found:
            record[plural] = [members[ext] for ext in found]
    return record


def _order(ext: str) -> tuple:
    head = ext.rsplit(".", 1)[0] if "." in ext else ""
    return (int(head) if head.isdigit() else -1, ext)
