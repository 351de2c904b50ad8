"""Detect a record's shape and parse it into a :class:`Conversation` or :class:`Document`.

Shapes (auto-detected per line by their key fields, in this order, or forced with ``--format``):

- ``llava``:    ``{"id", "image": path | [paths], "conversations": [{"from", "value"}]}``
- ``sharegpt``: ``{"conversations" | "messages": [{"from", "value"}]}``; ``from`` is one of
  ``SHAREGPT_ROLES`` (``human`` / ``gpt`` / ``system`` / ``tool`` / ``observation`` ...). LLaVA
  is ShareGPT with images, so both share one parser; ``messages`` holding ``from`` / ``value``
  turns is detected as ``sharegpt``, ``conversations`` holding ``role`` / ``content`` turns is
  read as messages. A ``from`` / ``value`` turn carrying the messages shape's ``tool_calls`` /
  ``tool_call_id`` is refused (``sharegpt_tool_calls``): ShareGPT has no such keys, and dropping
  them would lose the call.
- ``messages``: ``{"messages": [{"role", "content": str | [parts]}], "images"?: [...]}``;
  roles are ``ROLES`` (``tool`` turns are rendered by the template, never trained); parts
  are ``{"type": "text", "text"}``, ``{"type": "image", "image" | "path" | "url"}``,
  ``{"type": "audio", "audio" | "path" | "url"}`` (``type`` may be left out when the key
  says it) and OpenAI's ``{"type": "image_url", "image_url": {"url"}}``. An assistant turn's ``tool_calls``, a
  tool turn's ``tool_call_id`` / ``name`` and the record's ``tools`` are kept for the template
  (:mod:`packer.ingest.tools`).
- ``prompt_completion`` (TRL): ``{"prompt": str | [messages], "completion": str | [messages]}``.
  A string prompt is one user turn, a string completion one assistant turn; message lists
  are read as ``messages``. Completion turns are trained (assistant ones); prompt turns
  never are, assistant turns in a multi-turn prompt included.
- ``alpaca``:   ``{"instruction", "input"?, "output", "system"?, "history"?}``: an optional
  system turn, ``history`` ``[[user, assistant], ...]`` pairs as earlier turns, then the user
  turn ``instruction + "\\n\\n" + input`` (just ``instruction`` when ``input`` is empty, just
  ``input`` when ``instruction`` is) and the assistant turn ``output``.
- ``text``:     ``{"text": "..."}`` (last, so an Alpaca record's rendered ``text`` column is ignored)
- ``preference`` / ``unpaired_preference`` / ``responses``: one prompt and several responses
  (TRL ``prompt`` / ``chosen`` / ``rejected``, ``prompt`` / ``completion`` / ``label``, a list of
  ``responses``), parsed into a :class:`~packer.records.Preference` by
  :mod:`packer.ingest.preference`; detected before ``prompt_completion``.

Media positions: an ``<image>`` / ``<audio>`` tag in text, or a media part without a
path, takes the next path of the record's top-level ``image(s)`` / ``audio(s)`` list; a
part with its own path uses that. Every listed path must be used exactly once, so a tag
count that does not match the list is a bad record, not a silent misalignment.
"""

from __future__ import annotations

import dataclasses
import json
import re
import sys
from pathlib import Path
from typing import Any

from packer.errors import BadRecord
from packer.ingest import preference, tools
from packer.ingest.unicode import SURROGATE_ESCAPE, check_strings
from packer.media import refs
from packer.media.limits import check_frame_rate
from packer.records import ROLES, Conversation, Document, Part, Preference, Turn
from packer.shards.schema import MEDIA_KINDS

FORMATS = ("llava", "sharegpt", "messages", "prompt_completion", "alpaca", "text", *preference.FORMATS)
# The fields a forced --format needs: one inner tuple per field, holding the names it may go by.
NEEDS = {"llava": (("conversations",),), "sharegpt": (("conversations", "messages"),), "messages": (("messages",),),
         "prompt_completion": (("prompt",), ("completion",)), "alpaca": (("instruction",), ("output",)), "text": (("text",),),
         **preference.NEEDS}
SHAREGPT_ROLES = {"human": "user", "user": "user", "gpt": "assistant", "assistant": "assistant", "chatgpt": "assistant",
                  "bard": "assistant", "model": "assistant", "function_call": "assistant", "system": "system",
                  "tool": "tool", "function": "tool", "observation": "tool"}
SHAREGPT_UNREAD = ("tool_calls", "tool_call_id")  # the messages shape's tool keys, on a from / value turn: refused
PATH_KEYS = ("path", "url", "file")
# A message's reasoning, under any of the names transformers accepts (and aliases for the template)
REASONING_FIELDS = ("reasoning_content", "thinking", "reasoning")


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
        check_strings(obj)
    return obj


def record_id(obj: dict[str, Any]) -> str | None:
    value = obj.get("id")
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (str, int)):
        raise BadRecord("wrong_type", f"'id' must be a string or integer, got {type(value).__name__}")
    return str(value)


def detect_format(obj: dict[str, Any]) -> str:
    preference.check_conversation_beside_responses(obj)
    if "conversations" in obj:
        return "llava"
    if "messages" in obj:
        return "sharegpt" if _sharegpt_style(obj["messages"]) else "messages"
    preference.check_unambiguous(obj)
    shape = preference.detect(obj)
    if shape is not None:
        return shape
    if "prompt" in obj and "completion" in obj:
        return "prompt_completion"
    if "instruction" in obj and "output" in obj:
        return "alpaca"
    if "text" in obj:
        return "text"
    keys = ", ".join(sorted(obj)[:8]) or "none"
    hint = ""
    if "prompt" in obj:
        hint = ("; a 'prompt' needs a 'completion', 'chosen' + 'rejected' or a list of 'responses' (prompt-only records "
                "have nothing to train on)")
    elif "instruction" in obj:
        hint = "; an Alpaca 'instruction' needs an 'output'"
    raise BadRecord("unknown_format", f"no 'conversations', 'messages', 'prompt' + 'completion', 'instruction' + 'output' "
                                      f"or 'text' field (keys: {keys}){hint}; see the README's Inputs for the shapes")


def _sharegpt_style(turns: Any) -> bool:
    """A turn list written as ShareGPT ``{"from", "value"}`` (judged by its first turn)."""
    first = turns[0] if isinstance(turns, list) and turns else None
    return isinstance(first, dict) and "from" in first and "role" not in first


def parse_record(obj: dict[str, Any], fmt: str, base_dir: Path, tags: dict[str, str], *,
                 allow_outside_root: bool = False) -> Conversation | Document | Preference:
    """Parse a decoded JSON object of shape ``fmt`` (``auto`` detects it).

    ``base_dir`` resolves relative media paths; ``tags`` maps media kind to its tag
    string in text (``{"image": "<image>", "audio": "<audio>"}``). A media path written
    outside ``base_dir`` (``../``, an absolute path elsewhere) is refused unless
    ``allow_outside_root``; symlinks inside the root are followed (see :func:`packer.media.refs.resolve_media`).
    """
    if fmt == "auto":
        fmt = detect_format(obj)
    else:
        for options in NEEDS[fmt]:
            if not any(k in obj for k in options):
                fields = [" or ".join(f"'{k}'" for k in o) for o in NEEDS[fmt]]
                fields = f"a {fields[0]} field" if len(fields) == 1 else " and ".join(fields) + " fields"
                raise BadRecord("wrong_format", f"--format {fmt} needs {fields} (keys: "
                                                f"{', '.join(sorted(obj)[:8]) or 'none'}); use --format auto for mixed data")
    preference.check_label(obj, fmt)
    rid = record_id(obj)
    if fmt == "text":
        text = obj["text"]
        if not isinstance(text, str):
            raise BadRecord("wrong_type", f"'text' must be a string, got {type(text).__name__}")
        if not text.strip():
            raise BadRecord("empty_text", "'text' is empty")
        return Document(text=text, id=rid)
    media = _MediaQueue(obj, base_dir, tags, allow_outside_root)
    if fmt in preference.FORMATS:
        record = preference.parse(obj, fmt, media, lambda value, key, role: _turns_of(value, key, role, media), rid)
        schemas = tools.record_tools(obj)
        return dataclasses.replace(record, tools=schemas, strings=record.strings and schemas is None)
    if fmt == "prompt_completion":
        turns = _prompt_completion_turns(obj, media)
    elif fmt == "alpaca":
        turns = _alpaca_turns(obj, media)
    elif fmt == "messages" or (fmt == "sharegpt" and "conversations" not in obj):
        turns = _chat_turns(obj["messages"], "messages", media, sharegpt=fmt == "sharegpt")
    else:  # llava / sharegpt with a 'conversations' list
        turns = _chat_turns(obj["conversations"], "conversations", media, sharegpt=True)
    media.check_all_used()
    return Conversation(turns=tuple(turns), id=rid, tools=tools.record_tools(obj))


def _turn_list(turns: Any, key: str) -> list[Any]:
    if not isinstance(turns, list):
        raise BadRecord("wrong_type", f"'{key}' must be a list, got {type(turns).__name__}")
    if not turns:
        raise BadRecord("empty_conversation", f"'{key}' is empty")
    for i, t in enumerate(turns):
        if not isinstance(t, dict):
            raise BadRecord("wrong_type", f"{key}[{i}] must be an object, got {type(t).__name__}")
    return turns


def _chat_turns(turns: Any, key: str, media: _MediaQueue, *, sharegpt: bool) -> list[Turn]:
    """Turns of a list written as ShareGPT ``{"from", "value"}`` or as ``{"role", "content"}``.

    Each turn is read in the style its keys show; one that shows neither is read in the
    list's default style (``sharegpt``), so its error names the fields that list expects."""
    out = []
    for i, t in enumerate(_turn_list(turns, key)):
        as_sharegpt = ("from" in t and "role" not in t) or (sharegpt and not ("role" in t and "from" not in t))
        out.append(_sharegpt_turn(t, f"{key}[{i}]", media) if as_sharegpt else _message_turn(t, f"{key}[{i}]", media))
    return out


def _sharegpt_turn(t: dict[str, Any], where: str, media: _MediaQueue) -> Turn:
    who, value = t.get("from"), t.get("value")
    if not isinstance(who, str) or not isinstance(value, str):
        raise BadRecord("wrong_type", f"{where} needs string 'from' and 'value'")
    role = SHAREGPT_ROLES.get(who.lower())
    if role is None:
        raise BadRecord("unknown_role", f"{where}.from = {who!r} (expected one of {', '.join(SHAREGPT_ROLES)})")
    carried = [key for key in SHAREGPT_UNREAD if t.get(key) is not None]
    if carried:  # ShareGPT has no such keys (a call is a function_call turn's text): refused, never dropped unseen
        raise BadRecord("sharegpt_tool_calls", f"{where} is a ShareGPT from / value turn with {' and '.join(carried)}, "
                                               f"which that shape does not carry to the template (the call would be "
                                               f"lost); write the record as messages (role / content / "
                                               f"{' / '.join(carried)}), which does")
    return Turn(role, tuple(media.split_text(value)))


def _message_turn(m: dict[str, Any], where: str, media: _MediaQueue) -> Turn:
    role, content = m.get("role"), m.get("content")
    if not isinstance(role, str):
        raise BadRecord("wrong_type", f"{where}.role must be a string")
    if role not in ROLES:
        raise BadRecord("unknown_role", f"{where}.role = {role!r} (expected {', '.join(ROLES)})")
    fields = tools.message_fields(m, where)
    if content is None and any(k == "tool_calls" for k, _ in fields):  # OpenAI's tool-call turn: no content
        content = ""
    if isinstance(content, str):
        parts = media.split_text(content)
    elif isinstance(content, list):
        parts = [p for j, item in enumerate(content) for p in _content_part(item, f"{where}.content[{j}]", media)]
    else:
        raise BadRecord("wrong_type", f"{where}.content must be a string or a list, got {type(content).__name__}")
    reasoning = next(((key, m[key]) for key in REASONING_FIELDS if m.get(key) is not None), ())
    if reasoning and not isinstance(reasoning[1], str):
        raise BadRecord("wrong_type", f"{where}.{reasoning[0]} must be a string, got {type(reasoning[1]).__name__}")
    return Turn(role, tuple(parts), structured=isinstance(content, list), reasoning=reasoning, fields=fields)


def _turns_of(value: Any, key: str, role: str, media: _MediaQueue) -> list[Turn]:
    """A TRL field: a string is one turn of ``role``, a list is messages (ShareGPT or role / content)."""
    if isinstance(value, str):
        return [Turn(role, tuple(media.split_text(value)))]
    if isinstance(value, list):
        return _chat_turns(value, key, media, sharegpt=_sharegpt_style(value))
    raise BadRecord("wrong_type", f"'{key}' must be a string or a list of messages, got {type(value).__name__}")


def _prompt_completion_turns(obj: dict[str, Any], media: _MediaQueue) -> list[Turn]:
    """TRL's prompt / completion: the prompt's turns are context, the completion's are trained."""
    turns = []
    for key, role in (("prompt", "user"), ("completion", "assistant")):
        value = obj[key]
        if key == "completion" and isinstance(value, str) and not value.strip():
            raise BadRecord("empty_text", "'completion' is empty: nothing to train on")
        part = _turns_of(value, key, role, media)
        if key == "prompt":
            part = [dataclasses.replace(t, trained=False) for t in part]  # its tool calls and ids kept
        turns += part
    return turns


def _alpaca_turns(obj: dict[str, Any], media: _MediaQueue) -> list[Turn]:
    """Alpaca: [system], history pairs, user = instruction + "\\n\\n" + input, assistant = output."""
    field = {}
    for key in ("system", "instruction", "input", "output"):
        value = obj.get(key)
        if value is None and key in ("system", "input"):
            value = ""
        if not isinstance(value, str):
            raise BadRecord("wrong_type", f"'{key}' must be a string, got {type(value).__name__}")
        field[key] = value
    instruction, extra = field["instruction"], field["input"]
    if not instruction.strip() and not extra.strip():
        raise BadRecord("empty_text", "'instruction' and 'input' are both empty: no prompt for the 'output'")
    if not field["output"].strip():
        raise BadRecord("empty_text", "'output' is empty: nothing to train on")
    user = instruction if not extra.strip() else extra if not instruction.strip() else f"{instruction}\n\n{extra}"
    turns = [Turn("system", tuple(media.split_text(field["system"])))] if field["system"].strip() else []
    history = obj.get("history") or []
    if not isinstance(history, list):
        raise BadRecord("wrong_type", f"'history' must be a list of [instruction, response] pairs, got {type(history).__name__}")
    for i, pair in enumerate(history):
        if not (isinstance(pair, list) and len(pair) == 2 and all(isinstance(s, str) for s in pair)):
            raise BadRecord("wrong_type", f"history[{i}] must be an [instruction, response] pair of strings")
        turns += [Turn("user", tuple(media.split_text(pair[0]))), Turn("assistant", tuple(media.split_text(pair[1])))]
    turns += [Turn("user", tuple(media.split_text(user))), Turn("assistant", tuple(media.split_text(field["output"])))]
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
        return [media.take(kind, ref, where, fps=item.get("fps", 0.0))]
    raise BadRecord("wrong_type", f"{where} has unsupported part type {kind!r}")


class _MediaQueue:
    """Hands out a record's listed media paths to tags and path-less parts, in order."""

    def __init__(self, obj: dict[str, Any], base_dir: Path, tags: dict[str, str], allow_outside_root: bool):
        self.base_dir = base_dir
        self.allow_outside_root = allow_outside_root
        self.tags = tags
        self.pending = {kind: self._listed(obj, kind) for kind in MEDIA_KINDS}
        present = [k for k in MEDIA_KINDS if tags.get(k)]
        self.split = re.compile("(" + "|".join(re.escape(tags[k]) for k in present) + ")")
        self.kind_of_tag = {tags[k]: k for k in present}

    @staticmethod
    def _listed(obj: dict[str, Any], kind: str) -> list:
        """The record's top-level list of ``kind`` items; a video item may be a list of frame paths."""
        for key in (kind + "s", kind):
            if key in obj and obj[key] is not None:
                value = obj[key]
                value = [value] if isinstance(value, str) else value
                frames_ok = kind == "video"
                if not isinstance(value, list) or not all(
                        isinstance(v, str) or (frames_ok and isinstance(v, list) and all(isinstance(f, str) for f in v))
                        for v in value):
                    what = "a path, a list of paths, or lists of frame paths" if frames_ok else "a path or a list of paths"
                    raise BadRecord("wrong_type", f"'{key}' must be {what}")
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

    def take(self, kind: str, ref: Any, where: str, fps: Any = 0.0) -> Part:
        if ref is None:
            if not self.pending[kind]:
                raise BadRecord(f"{kind}_count_mismatch", f"{where} has no {kind} path left in the record's list")
            ref = self.pending[kind].pop(0)
        if kind == "video" and isinstance(ref, list):  # a video given as its frame images
            if not ref or not all(isinstance(r, str) and r for r in ref):
                raise BadRecord("wrong_type", f"{where}: a video's frame list must hold non-empty paths")
            if isinstance(fps, bool) or not isinstance(fps, (int, float)):
                raise BadRecord("wrong_type", f"{where}: fps must be a positive number, got {fps!r}")
            if fps != 0:  # 0: none stated (the video policy's rate); else finite and plausible (1e308, Infinity: refused)
                check_frame_rate(fps, f"{where}'s frame list")
            paths = tuple(str(refs.resolve_media(r, self.base_dir, kind, self.allow_outside_root)) for r in ref)
            return Part(kind, ref=json.dumps(ref, ensure_ascii=False), path=paths[0], frames=paths, fps=float(fps))
        if not isinstance(ref, str) or not ref:
            raise BadRecord("wrong_type", f"{where}: {kind} path must be a non-empty string")
        return Part(kind, ref=ref, path=str(refs.resolve_media(ref, self.base_dir, kind, self.allow_outside_root)))

    def check_all_used(self) -> None:
        for kind, left in self.pending.items():
            if left:
                raise BadRecord(
                    f"{kind}_count_mismatch",
                    f"{len(left)} listed {kind}(s) have no {self.tags.get(kind, 'tag')} tag or part to go to",
                )
