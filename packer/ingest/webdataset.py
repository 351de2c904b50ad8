"""WebDataset tar shards: members grouped by key into samples, the record from the ``json`` member.

Members are cut as WebDataset cuts them: ``a.b/00042.0.jpg`` is the sample ``a.b/00042`` (folder, then the member's
name up to its first ``.``) and the extension ``0.jpg`` (the rest, lower-cased). A name without a ``.`` after its
folder (``README``), a hidden one (``._00042.jpg``, macOS's), WebDataset's ``__meta__`` entries and members that are
not regular files (folders, links) are ignored. A sample's members are consecutive in the tar, each extension once::

    00042.json    {"conversations": [{"from": "human", "value": "<image>\\nWhat is this?"}, ...]}
    00042.0.jpg   the first image
    00042.1.jpg   the second
    00043.json    ...

The record is the ``json`` member, in any of the record shapes JSONL reads. Its media:

- named by the json: a string in its ``images`` / ``audios`` / ``videos`` lists (or singular, or a message part's
  ``image`` / ``audio`` / ``video``) that is a member's extension (``"jpg"``, ``"0.jpg"``) or full name
  (``"00042.0.jpg"``) is that member's bytes; one that only looks like a member name (a media extension, alone or
  after a number or the key, no folder) names a member the sample lacks: a bad record (``missing_member``). Any other
  string is a path or URL, as in JSONL;
- else by extension (:data:`KINDS`): a kind the json gives no list for gets one of the sample's members of that kind
  the json did not name, in name order (``0.jpg``, ``1.jpg``, ..., ``10.jpg``).

A reader holds one sample's members at a time, a member over :data:`MAX_MEMBER_BYTES` never (it is skipped, read
through in blocks: ``media_too_large``). What is wrong with a sample is its bad record, named by its key: no json
(``missing_json``), a json that does not parse (``invalid_json``), an extension twice (``duplicate_member``), a key met
again after other samples (``duplicate_key``), the tar cut or damaged in it or right after it (``truncated_tar``: the
samples before it are read; a tar that ends without its end-of-archive blocks is taken as cut). A file that is not a
tar at all is one error for the input (:class:`~packer.errors.ConfigError`, exit 2).
"""

from __future__ import annotations

import json
import posixpath
import re
import tarfile
from collections.abc import Iterator
from typing import Any

from packer.errors import BadRecord, ConfigError

KINDS = {"jpg": "image", "jpeg": "image", "png": "image", "webp": "image", "bmp": "image", "gif": "image",
         "tif": "image", "tiff": "image", "mp4": "video", "webm": "video", "mkv": "video", "avi": "video",
         "mov": "video", "wav": "audio", "flac": "audio", "mp3": "audio", "ogg": "audio", "opus": "audio",
         "m4a": "audio"}
LISTS = {"image": ("images", "image"), "audio": ("audios", "audio"), "video": ("videos", "video")}
MESSAGE_FIELDS = ("messages", "conversations", "prompt", "completion", "chosen", "rejected")  # parts may name members
MAX_MEMBER_BYTES = 256 * 2**20  # a member over this is its sample's error, skipped without being held
MAX_JSON_BYTES = 64 * 2**20
NAME = re.compile(r"^((?:.*/|)[^.]+)[.]([^/]*)$")  # WebDataset's base_plus_ext
META = re.compile(r"__[^/]*__($|/)")  # WebDataset's skip_meta


def split_name(name: str) -> tuple[str, str] | None:
    """``a/b/00042.0.jpg`` -> (``a/b/00042``, ``0.jpg``); None for a name WebDataset ignores."""
    m = NAME.match(name)
    if m is None or META.match(name) or posixpath.basename(name).startswith("."):  # macOS's ._00042.jpg too
        return None
    return m.group(1), m.group(2).lower()


def read_samples(path) -> Iterator[tuple[int, str, dict[str, Any] | BadRecord, bytes]]:
    """``(number, key, record or BadRecord, json bytes)`` of every sample of the tar at ``path``, in order (numbered
    from 0). The json bytes (possibly empty) are for the quarantine's preview of a sample that did not parse."""
    from packer.io import fs

    number = 0
    seen: set[str] = set()
    key: str | None = None
    members: dict[str, bytes] = {}
    errors: list[BadRecord] = []

    def close() -> tuple[int, str, dict[str, Any] | BadRecord, bytes]:
        text = members.get("json", b"")
        return number, key, _sample(key, members, errors), text

    with fs.open_binary(path) as raw:
        try:
            tar = tarfile.open(fileobj=raw, mode="r|*", tarinfo=_Header, ignore_zeros=True)
        except tarfile.TarError as e:
            raise ConfigError(f"input {path} is not a tar ({e}); give WebDataset shards (.tar, .tar.gz), or set "
                              f"format= to what the file is") from None
        with tar:
            try:
                for info in tar:
                    tar.members = []  # a stream's TarFile keeps every header read: not one per member of a big shard
                    cut = _damage(tar)
                    if cut and key is not None:
                        errors.append(cut)
                    named = split_name(info.name) if info.isfile() else None
                    if named is None:
                        continue
                    k, ext = named
                    if k != key:
                        if key is not None:
                            yield close()
                            number += 1
                        key, members, errors = k, {}, []
                        if k in seen:
                            errors.append(BadRecord("duplicate_key", f"the key {k!r} is met again after other "
                                                    f"samples (at member {info.name}): a sample's members must be "
                                                    f"consecutive in the tar, as WebDataset writes them"))
                        seen.add(k)
                    if not ext:
                        continue
                    if ext in members:
                        errors.append(BadRecord("duplicate_member", f"member {info.name}: the sample holds a .{ext} "
                                                                    f"member twice"))
                        continue
                    limit = MAX_JSON_BYTES if ext == "json" else MAX_MEMBER_BYTES
                    if info.size > limit:  # skipped: the next header is reached by reading through, block by block
                        errors.append(BadRecord("media_too_large" if ext != "json" else "line_too_long",
                                                f"member {info.name} holds {info.size:,} bytes, over the "
                                                f"{limit:,}-byte limit"))
                        continue
                    members[ext] = tar.extractfile(info).read()
            except (tarfile.TarError, EOFError) as e:  # a damaged stream; an OSError is the storage's: it stops
                if key is None:
                    raise ConfigError(f"input {path} is not a readable tar ({type(e).__name__}: {e}); check the "
                                      f"file, or set format= to what it is") from None
                errors.append(BadRecord("truncated_tar", f"the tar ends inside this sample ({type(e).__name__}: {e})"))
                yield close()
                return
            cut = _damage(tar) or (None if getattr(tar, "zeros", False) else BadRecord(
                "truncated_tar", f"the tar ends right after this sample, at byte {tar.offset:,}, without the "
                                 f"end-of-archive blocks a whole tar has: it is cut, and more of the sample may be lost"))
            if key is None and cut is not None:  # nothing but damage
                raise ConfigError(f"input {path} is not a readable tar ({cut.detail}); check the file, or set format= "
                                  f"to what it is")
            if key is not None:
                if cut:
                    errors.append(cut)
                yield close()


class _Header(tarfile.TarInfo):
    """A tar header that records on its TarFile what ended or broke the reading: ``zeros`` (the last block read was
    an end-of-archive block) and ``damage`` (a header that does not parse, or is cut, at ``offset``), which
    ``ignore_zeros`` reading would otherwise step over in silence."""

    @classmethod
    def fromtarfile(cls, tar):
        try:
            header = super().fromtarfile(tar)
        except tarfile.EOFHeaderError:
            tar.zeros = True
            raise
        except (tarfile.InvalidHeaderError, tarfile.TruncatedHeaderError) as e:
            if tar.offset == 0:
                raise tarfile.ReadError(str(e)) from None
            if getattr(tar, "damage", None) is None:
                tar.damage = (tar.offset, str(e))
            raise
        tar.zeros = False
        return header


def _damage(tar) -> BadRecord | None:
    """The damage met since the last call, as the bad record of the sample it is in or right after."""
    damage = getattr(tar, "damage", None)
    if damage is None:
        return None
    tar.damage = None
    return BadRecord("truncated_tar", f"the tar is cut or damaged in or right after this sample: the header at byte "
                                      f"{damage[0]:,} does not read ({damage[1]})")


def _sample(key: str, members: dict[str, bytes], errors: list[BadRecord]) -> dict[str, Any] | BadRecord:
    if errors:
        return errors[0]
    if "json" not in members:
        return BadRecord("missing_json", f"sample {key!r} has no json member (its members: "
                                         f"{', '.join(sorted(members)) or 'none'})")
    try:
        record = json.loads(members["json"])
    except (ValueError, RecursionError) as e:
        return BadRecord("invalid_json", f"sample {key!r}: its json member does not parse ({e})")
    if not isinstance(record, dict):
        return BadRecord("wrong_type", f"sample {key!r}: its json member must be an object, got "
                                       f"{type(record).__name__}")
    media = {ext: data for ext, data in members.items() if ext != "json"}
    used: set[str] = set()
    try:
        for plural, singular in LISTS.values():
            for field in (plural, singular):
                if record.get(field) is not None:
                    record[field] = _named(key, record[field], media, used)
        for field in MESSAGE_FIELDS:
            for message in record.get(field) if isinstance(record.get(field), list) else ():
                content = message.get("content") if isinstance(message, dict) else None
                for part in content if isinstance(content, list) else ():
                    for kind in LISTS if isinstance(part, dict) else ():
                        if isinstance(part.get(kind), (str, list)):
                            part[kind] = _named(key, part[kind], media, used)
    except BadRecord as e:
        return e
    for kind, (plural, singular) in LISTS.items():
        if record.get(plural) is not None or record.get(singular) is not None:
            continue
        found = sorted((ext for ext in media if ext not in used and KINDS.get(ext.rsplit(".", 1)[-1]) == kind),
                       key=_order)
        if found:
            record[plural] = [media[ext] for ext in found]
            used.update(found)
    unused = sorted(ext for ext in media if ext not in used and KINDS.get(ext.rsplit(".", 1)[-1]))
    if unused:  # the json names this kind's media, and not these: which goes where is unknown, never guessed
        return BadRecord("unused_member", f"sample {key!r}: its json names its media, but not the member(s) "
                                          f"{', '.join(unused)}; name every medium in the json (or none, to take "
                                          f"them all in name order)")
    return record


def _named(key: str, value: Any, media: dict[str, bytes], used: set[str]) -> Any:
    """``value`` (a string, or lists of them: a video's frames) with each string that names a member as its bytes."""
    if isinstance(value, list):
        return [_named(key, v, media, used) for v in value]
    if not isinstance(value, str) or "/" in value or ":" in value:
        return value
    stem = key.rsplit("/", 1)[-1]
    ext = value.lower()
    ext = ext[len(stem) + 1:] if ext.startswith(stem.lower() + ".") else ext
    if ext in media:
        used.add(ext)
        return media[ext]
    last = ext.rsplit(".", 1)[-1]
    if last in KINDS and (ext == last or value.lower().startswith(stem.lower() + ".") or ext.split(".")[0].isdigit()):
        raise BadRecord("missing_member", f"sample {key!r}: its json names the member {value!r}, which the tar does "
                                          f"not hold for this key (its members: {', '.join(sorted(media)) or 'none'})")
    return value


def _order(ext: str) -> tuple:
    head = ext.rsplit(".", 1)[0] if "." in ext else ""
    return (int(head) if head.isdigit() else -1, head, ext)
