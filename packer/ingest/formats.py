"""Detect a record's shape and parse it into a :class:`Conversation` or :class:`Document`.

Shapes (auto-detected per line by their key field, or forced with ``--format``):

- ``llava``:    ``{"id", "image": path | [paths], "conversations": [{"from", "value"}]}``
- ``messages``: ``{"messages": [{"role", "content": str | [parts]}], "images"?: [...]}``;
  parts are ``{"type": "text", "text"}``, ``{"type": "image", "image" | "path" | "url"}``,
  ``{"type": "audio", "audio" | "path" | "url"}`` (``type`` may be left out when the key
  says it) and OpenAI's ``image_url``.
- ``text``:     ``{"text": "..."}``

Media positions: an ``<image>`` / ``<audio>`` tag in text, or a media part without a
path, takes the next path of the record's top-level ``image(s)`` / ``audio(s)`` list; a
part with its own path uses that. Every listed path must be used exactly once, so a tag
count that does not match the list is a bad record, not a silent misalignment.
"""

from __future__ import annotations

import json
import posixpath
import re
import stat
import sys
from pathlib import Path
from typing import Any

from packer.errors import BadRecord
from packer.ingest.records import ROLES, Conversation, Document, Part, Turn
from packer.io import fs

FORMATS = ("llava", "messages", "text")
KEY_FIELD = {"llava": "conversations", "messages": "messages", "text": "text"}
LLAVA_ROLES = {"human": "user", "user": "user", "gpt": "assistant", "assistant": "assistant", "system": "system"}
MEDIA_KINDS = ("image", "audio")
PATH_KEYS = ("path", "url", "file")


def decode_json(data: bytes) -> dict[str, Any]:
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise BadRecord("invalid_utf8", f"byte {e.start} is not valid UTF-8 ({data[e.start:e.start + 1]!r})") from None
    try:
        obj = json.loads(text)
    except json.JSONDecodeError as e:
        raise BadRecord("malformed_json", f"{e.msg} (column {e.colno})") from None
    except ValueError as e:  # Python refuses to convert integers over sys.get_int_max_str_digits() digits
        raise BadRecord("number_too_large", f"an integer in the line is too long to read ({e})") from None
    except RecursionError:
        raise BadRecord("nesting_too_deep", "the line nests arrays / objects deeper than Python's recursion limit "
                                            f"({sys.getrecursionlimit()}); flatten the record") from None
    if not isinstance(obj, dict):
        raise BadRecord("not_an_object", f"the line is a JSON {type(obj).__name__}, not an object")
    if SURROGATE_ESCAPE.search(data):
        _check_strings(obj)
    return obj


# JSON may spell a lone UTF-16 surrogate (``"\ud83d"``): Python decodes it into a str that no
# tokenizer or UTF-8 writer accepts. Valid pairs decode to one code point, so any surrogate
# left after decoding is lone; only lines with such an escape are walked.
SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")
SURROGATE = re.compile("[\ud800-\udfff]")


def _check_strings(obj: Any) -> None:
    """Raise ``invalid_id`` / ``invalid_text`` for the first key or string holding a lone surrogate."""
    stack: list[tuple[str, Any]] = [("", obj)]
    while stack:  # iterative: a record nested to the JSON decoder's limit would overflow a recursive walk
        where, value = stack.pop()
        if isinstance(value, str):
            bad = SURROGATE.search(value)
            if bad:
                code = f"U+{ord(bad.group()):04X}"
                if where == "id":
                    raise BadRecord("invalid_id", f"'id' holds a lone UTF-16 surrogate ({code}), not valid Unicode; "
                                                  f"fix the id (write the character's full surrogate pair, or drop it)")
                raise BadRecord("invalid_text", f"{where or 'the record'} holds a lone UTF-16 surrogate ({code}) at "
                                                f"character {bad.start()}, not valid Unicode; fix the text (write the "
                                                f"character's full surrogate pair, or drop it)")
        elif isinstance(value, dict):
            for k, v in reversed(value.items()):
                name = f"{where}.{k}" if where else str(k)
                if SURROGATE.search(k):
                    stack.append((f"{where}.<key>" if where else "<key>", k))
                stack.append((SURROGATE.sub("?", name), v))
        elif isinstance(value, list):
            stack.extend((f"{where}[{i}]", v) for i, v in reversed(list(enumerate(value))))


def record_id(obj: dict[str, Any]) -> str | None:
    value = obj.get("id")
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (str, int)):
        raise BadRecord("wrong_type", f"'id' must be a string or integer, got {type(value).__name__}")
    return str(value)


def detect_format(obj: dict[str, Any]) -> str:
    for fmt in FORMATS:
        if KEY_FIELD[fmt] in obj:
            return fmt
    keys = ", ".join(sorted(obj)[:8]) or "none"
    raise BadRecord("unknown_format", f"no 'conversations', 'messages' or 'text' field (keys: {keys})")


def parse_record(obj: dict[str, Any], fmt: str, base_dir: Path, tags: dict[str, str], *,
                 allow_outside_root: bool = False) -> Conversation | Document:
    """Parse a decoded JSON object of shape ``fmt`` (``auto`` detects it).

    ``base_dir`` resolves relative media paths; ``tags`` maps media kind to its tag
    string in text (``{"image": "<image>", "audio": "<audio>"}``). A media path that
    resolves outside ``base_dir`` (``../``, an absolute path, a symlink out) is refused
    unless ``allow_outside_root``.
    """
    if fmt == "auto":
        fmt = detect_format(obj)
    elif KEY_FIELD[fmt] not in obj:
        raise BadRecord("wrong_format", f"--format {fmt} needs a '{KEY_FIELD[fmt]}' field")
    rid = record_id(obj)
    if fmt == "text":
        text = obj["text"]
        if not isinstance(text, str):
            raise BadRecord("wrong_type", f"'text' must be a string, got {type(text).__name__}")
        if not text.strip():
            raise BadRecord("empty_text", "'text' is empty")
        return Document(text=text, id=rid)
    media = _MediaQueue(obj, base_dir, tags, allow_outside_root)
    turns = _llava_turns(obj, media) if fmt == "llava" else _messages_turns(obj, media)
    media.check_all_used()
    return Conversation(turns=tuple(turns), id=rid)


def _turn_list(obj: dict[str, Any], key: str) -> list[Any]:
    turns = obj[key]
    if not isinstance(turns, list):
        raise BadRecord("wrong_type", f"'{key}' must be a list, got {type(turns).__name__}")
    if not turns:
        raise BadRecord("empty_conversation", f"'{key}' is empty")
    for i, t in enumerate(turns):
        if not isinstance(t, dict):
            raise BadRecord("wrong_type", f"{key}[{i}] must be an object, got {type(t).__name__}")
    return turns


def _llava_turns(obj: dict[str, Any], media: _MediaQueue) -> list[Turn]:
    turns = []
    for i, t in enumerate(_turn_list(obj, "conversations")):
        who, value = t.get("from"), t.get("value")
        if not isinstance(who, str) or not isinstance(value, str):
            raise BadRecord("wrong_type", f"conversations[{i}] needs string 'from' and 'value'")
        role = LLAVA_ROLES.get(who.lower())
        if role is None:
            raise BadRecord("unknown_role", f"conversations[{i}].from = {who!r} (expected human, gpt or system)")
        turns.append(Turn(role, tuple(media.split_text(value))))
    return turns


def _messages_turns(obj: dict[str, Any], media: _MediaQueue) -> list[Turn]:
    turns = []
    for i, m in enumerate(_turn_list(obj, "messages")):
        role, content = m.get("role"), m.get("content")
        if not isinstance(role, str):
            raise BadRecord("wrong_type", f"messages[{i}].role must be a string")
        if role not in ROLES:
            raise BadRecord("unknown_role", f"messages[{i}].role = {role!r} (expected {', '.join(ROLES)})")
        if isinstance(content, str):
            parts = media.split_text(content)
        elif isinstance(content, list):
            parts = [p for j, item in enumerate(content) for p in _content_part(item, f"messages[{i}].content[{j}]", media)]
        else:
            raise BadRecord("wrong_type", f"messages[{i}].content must be a string or a list, got {type(content).__name__}")
        turns.append(Turn(role, tuple(parts)))
    return turns


def _content_part(item: Any, where: str, media: _MediaQueue) -> list[Part]:
    if not isinstance(item, dict):
        raise BadRecord("wrong_type", f"{where} must be an object, got {type(item).__name__}")
    kind = item.get("type")
    if kind is None:
        kind = next((k for k in ("text", *MEDIA_KINDS) if k in item), None)
    if kind == "image_url":
        url = item.get("image_url")
        url = url.get("url") if isinstance(url, dict) else url
        return [media.take("image", url, where)]
    if kind == "text":
        text = item.get("text")
        if not isinstance(text, str):
            raise BadRecord("wrong_type", f"{where}.text must be a string")
        return media.split_text(text)
    if kind in MEDIA_KINDS:
        ref = item.get(kind)
        if ref is None:
            ref = next((item[k] for k in PATH_KEYS if k in item), None)
        return [media.take(kind, ref, where)]
    raise BadRecord("wrong_type", f"{where} has unsupported part type {kind!r}")


class _MediaQueue:
    """Hands out a record's listed media paths to tags and path-less parts, in order."""

    def __init__(self, obj: dict[str, Any], base_dir: Path, tags: dict[str, str], allow_outside_root: bool):
        self.base_dir = base_dir
        self.allow_outside_root = allow_outside_root
        self.tags = tags
        self.pending = {kind: self._listed(obj, kind) for kind in MEDIA_KINDS}
        self.split = re.compile("(" + "|".join(re.escape(tags[k]) for k in MEDIA_KINDS) + ")")
        self.kind_of_tag = {tags[k]: k for k in MEDIA_KINDS}

    @staticmethod
    def _listed(obj: dict[str, Any], kind: str) -> list[str]:
        for key in (kind + "s", kind):
            if key in obj and obj[key] is not None:
                value = obj[key]
                value = [value] if isinstance(value, str) else value
                if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
                    raise BadRecord("wrong_type", f"'{key}' must be a path or a list of paths")
                return list(value)
        return []

    def split_text(self, text: str) -> list[Part]:
        parts = []
        for piece in self.split.split(text):
            if piece in self.kind_of_tag:
                parts.append(self.take(self.kind_of_tag[piece], None, f"a {piece} tag"))
            elif piece:
                parts.append(Part("text", text=piece))
        return parts

    def take(self, kind: str, ref: Any, where: str) -> Part:
        if ref is None:
            if not self.pending[kind]:
                raise BadRecord(f"{kind}_count_mismatch", f"{where} has no {kind} path left in the record's list")
            ref = self.pending[kind].pop(0)
        if not isinstance(ref, str) or not ref:
            raise BadRecord("wrong_type", f"{where}: {kind} path must be a non-empty string")
        return Part(kind, ref=ref, path=str(resolve_media(ref, self.base_dir, kind, self.allow_outside_root)))

    def check_all_used(self) -> None:
        for kind, left in self.pending.items():
            if left:
                raise BadRecord(
                    f"{kind}_count_mismatch",
                    f"{len(left)} listed {kind}(s) have no {self.tags[kind]} tag or part to go to",
                )


def resolve_media(ref: str, base_dir: Path | str, kind: str, allow_outside_root: bool = False) -> Path | str:
    """The file a record's media ``ref`` names, checked to exist (and to lie under ``base_dir``).

    A ref the file system cannot even look up -- a NUL byte, a name over the OS limit, a
    symlink loop, any other OSError -- is a ``bad_media_path``, not a crashed build."""
    if "\0" in ref:
        raise BadRecord("bad_media_path", f"{kind} path {ref!r} holds a NUL byte; no file can have that name")
    try:
        return _resolve_media(ref, base_dir, kind, allow_outside_root)
    except (OSError, ValueError, RuntimeError) as e:  # RuntimeError: pathlib's "Symlink loop" before Python 3.13
        raise BadRecord("bad_media_path", f"{kind} path {ref!r} cannot be looked up: {type(e).__name__}: {e}") from None


def _resolve_media(ref: str, base_dir: Path | str, kind: str, allow_outside_root: bool) -> Path | str:
    if fs.is_url(base_dir):  # a dataset on an fsspec filesystem: its media live there too
        if "://" in ref:
            raise BadRecord("unsupported_media_ref", f"{kind} {ref!r}: give media relative to the dataset")
        path = posixpath.normpath(posixpath.join(str(base_dir), ref)).replace(":/", "://", 1)
        if not allow_outside_root and not path.startswith(str(base_dir).rstrip("/") + "/"):
            raise BadRecord("media_outside_root", f"{kind} {ref!r} resolves outside the dataset root {base_dir} "
                                                  f"(pass --allow-outside-media-root to accept it)")
        if not fs.exists(path):
            raise BadRecord(f"missing_{kind}", f"{kind} file {ref!r} not found (looked at {path})")
        return path
    if "://" in ref and not ref.startswith("file://"):
        raise BadRecord("unsupported_media_ref", f"{kind} {ref!r} is a remote URL; packer reads local files only")
    path = Path(ref.removeprefix("file://"))
    path = path if path.is_absolute() else Path(base_dir) / path
    if not allow_outside_root and not path.resolve().is_relative_to(Path(base_dir).resolve()):
        raise BadRecord("media_outside_root", f"{kind} {ref!r} resolves outside the dataset root {base_dir} "
                                              f"(pass --allow-outside-media-root to accept it)")
    try:  # not Path.is_file(): it answers False for a symlink loop, which is a bad path, not a missing file
        is_file = stat.S_ISREG(path.stat().st_mode)
    except (FileNotFoundError, NotADirectoryError):
        is_file = False
    if not is_file:
        raise BadRecord(f"missing_{kind}", f"{kind} file {ref!r} not found (looked at {path})")
    return path
