"""The typed records that cross floors: a record's normalised shape, and the raw line it was read from.

Ground floor (the standard library only), so the reader and parsers that make these records (``packer.ingest``)
and the encoder, stages and checks that take them need not import each other for the types.

LLaVA / ShareGPT ``conversations``, HF/OpenAI ``messages``, TRL ``prompt`` / ``completion``,
Alpaca and ``text`` documents all become a :class:`Conversation` (turns of text and media
parts) or a :class:`Document`, so the encoder has one code path per kind, not one per
input format. Preference and multi-response records (TRL ``prompt`` / ``chosen`` /
``rejected``, unpaired ``completion`` + ``label``, a list of ``responses``) become a
:class:`Preference`: one prompt and its responses, each a :class:`Response`. A :class:`RawLine`
is one JSONL line as :func:`packer.ingest.reader.read_lines` yields it, with its file position.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

# "tool": a tool's / function's output (ShareGPT ``observation`` / ``function``), rendered by the
# chat template as it renders that role (ChatML: ``<|im_start|>tool``), never trained.
ROLES = ("system", "user", "assistant", "tool")


@dataclass(frozen=True)
class RawLine:
    """One input record as read, before parsing: a JSONL line, a table row or a tar sample.

    ``line`` is the record's place in its file: a JSONL line's number (1-based), a table row's number (0-based, as
    ``dataset[row]`` counts) or a tar sample's (0-based, in the tar's order; ``member`` its key); ``where`` says
    which. A table row or tar sample comes decoded (``record``), or as the error that made it unreadable
    (``error``: quarantined as that record's)."""

    line: int
    data: bytes  # the line without its line ending (only its start if too_long); a row's JSON preview
    too_long: int = 0  # the line's length in bytes when it exceeded the limit
    offset: int = 0  # byte offset of the line's start in the file
    end: int = 0  # byte offset just past the line (its newline included)
    where: str = "line"  # "line" | "row" | "member"
    member: str = ""  # a tar sample's key
    record: Any = None  # a table row / tar sample, decoded (media as refs: packer.ingest.layouts)
    error: Any = None  # a BadRecord met reading it

    def place(self, file: str) -> str:
        """``file:12`` (a line), ``file row 11``, ``file member 000011``: how messages name the record."""
        if self.where == "row":
            return f"{file} row {self.line}"
        if self.where == "member":
            return f"{file} member {self.member}"
        return f"{file}:{self.line}"


@dataclass(frozen=True)
class Part:
    """A piece of a turn: text, or a media item (``ref`` as written, ``path`` resolved)."""

    kind: str  # "text" | "image" | "audio" | "video"
    text: str = ""
    ref: str = ""  # a video given as frame images: the JSON list of the frames' refs as written
    path: str = ""  # a frame list: its first frame
    frames: tuple[str, ...] = ()  # a video given as frame images: every frame, resolved
    fps: float = 0.0  # a frame list's stated rate (0: the video policy's)


@dataclass(frozen=True)
class Turn:
    role: str  # one of ROLES
    parts: tuple[Part, ...]
    trained: bool = True  # False: an assistant turn given as context (a TRL prompt's): rendered, never trained
    structured: bool = False  # the record gave the content as a list of parts (rendered as a list where the family
    #                           renders structured content, as HF's processor.apply_chat_template would)
    reasoning: tuple[str, str] = ()  # (field, text): the turn's reasoning_content / thinking / reasoning, for the template
    fields: tuple[tuple[str, Any], ...] = ()  # tool keys kept on the message (tool_calls, tool_call_id, name)


@dataclass(frozen=True)
class Conversation:
    turns: tuple[Turn, ...]
    id: str | None = None
    tools: tuple[dict[str, Any], ...] | None = None  # the record's tool schemas: the template's ``tools``

    @property
    def media(self) -> tuple[Part, ...]:
        return tuple(p for t in self.turns for p in t.parts if p.kind != "text")


@dataclass(frozen=True)
class Document:
    text: str
    id: str | None = None


@dataclass(frozen=True)
class Response:
    """One response of a :class:`Preference`: its turns (assistant turns trained), its role and weight.

    ``role`` is ``chosen`` / ``rejected`` (a pair), ``desirable`` / ``undesirable`` (unpaired, TRL's
    KTO ``label``), or the response's index as a string (``"0"``, ``"1"``, ...) in a list of responses;
    ``weight`` its reward / weight when the record gives one (NaN when it does not)."""

    turns: tuple[Turn, ...]
    role: str
    weight: float = float("nan")


@dataclass(frozen=True)
class Preference:
    """A prompt (context turns, never trained) and its responses, each rendered after it alone."""

    prompt: tuple[Turn, ...]
    responses: tuple[Response, ...]
    id: str | None = None
    strings: bool = False  # the prompt and every response were given as strings (TRL's standard, non-chat, format)
    tools: tuple[dict[str, Any], ...] | None = None

    def conversation(self, k: int) -> Conversation:
        """The prompt followed by response ``k``: what the record's ``k``-th response is, run alone."""
        return Conversation(self.prompt + self.responses[k].turns, self.id, self.tools)
