"""A conversation rendered for its model: the chat template's messages, and the rendering waiting for its tokens.

What every record shape shares before tokenizing -- SFT conversations and each response of a preference record
alike: the messages the template is given (control tokens typed in the data marked, media as content parts or
tokens), a record's tools rendered or refused, and :class:`RenderedChat`, the rendering with its media expanded
and the edits that map a position of the template's text onto the expanded text (:func:`shift`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from packer.encode.render import Renderer
from packer.errors import BadRecord
from packer.families import Expansion
from packer.records import Conversation


@dataclass
class RenderedChat:
    """A conversation rendered and expanded, waiting for its tokens (tokenized in a batch with others).

    ``full`` is the template's rendering; ``text`` is ``full`` with each media token replaced by its
    expansion (runs written as one token): what is tokenized. ``edits`` holds, per media item in
    text order, (position in ``full``, length of the media token there, length of its replacement)."""

    full: str
    text: str
    messages: list[dict[str, Any]]
    train_on: str
    assistant: list[int]  # assistant turn indices
    trained: set[int]  # the assistant turns to train
    train_on_empty_think: bool
    items: list[tuple[int, Expansion]] = field(default_factory=list)  # (media item index, expansion) in text order
    edits: list[tuple[int, int, int]] = field(default_factory=list)
    spans: list[tuple[int, int]] | None = None  # the trained character spans of ``full``, once labelled
    clips_cut: int = 0  # audio clips longer than the encoder's window (counted as audio_truncated)
    prompt: Any = None  # a string preference record in TRL's standard format: its standard.Prompt (``text`` is no
    #                     rendering but the prompt's tail + response + EOS, see packer.encode.standard)
    completion_start: int = 0  # standard format: the first trained token
    tools: list[dict[str, Any]] | None = None  # the record's tool schemas, marked: every rendering of it gets them
    marked: bool = False  # a control token typed in the record was marked: ``text`` is encoded piece by piece


def render_tools(renderer: Renderer, messages: list[dict[str, Any]],
                 tools: list[dict[str, Any]] | None) -> str:
    """A record with tool calls or tools, rendered with them; refused (``tools_not_rendered``) where the template
    raises on them or leaves them out (its rendering without them is the same: the tool-call turn would train
    as an empty turn, or the model would learn calls to tools it was never shown)."""
    bare = [{k: v for k, v in m.items() if k != "tool_calls"} for m in messages]
    calls = sum(len(m.get("tool_calls", ())) for m in messages)
    what = " and ".join(filter(None, [f"{calls} tool call(s)" if calls else "", f"{len(tools)} tool(s)" if tools else ""]))
    try:
        full = renderer.render(messages, tools=tools)
    except BadRecord as e:  # the template's message says what it refused (a tool call id's format, ...)
        raise BadRecord("tools_not_rendered", f"the chat template cannot render the record's {what}: "
                                              f"{e.detail.removeprefix('the chat template refused the conversation: ')}"
                                              ) from None
    for name, without in (("tool calls", (bare, tools)), ("tools", (messages, None))):
        if (name == "tools" and not tools) or (name == "tool calls" and not calls):
            continue
        try:
            same = renderer.render(without[0], tools=without[1]) == full
        except BadRecord:  # the template needs them: it renders them
            same = False
        if same:
            raise BadRecord("tools_not_rendered", f"the chat template leaves out the record's {name} ({what}): it "
                                                  f"renders the record as it renders it without them; use a template "
                                                  f"that renders tools (chat_template), or drop them from the record")
    return full


def template_messages(conv: Conversation, structured: bool, media_token: Callable[[str], str],
                      mark: Callable[[str], str]) -> list[dict[str, Any]]:
    """Messages for the chat template: text marked (typed control tokens stay text); each media part as a
    ``{"type": kind}`` content part (a structured family, as ``processor.apply_chat_template`` passes it) or as its
    media token in the text (generic); a turn's reasoning under every name transformers aliases it to."""
    out = []
    for t in conv.turns:
        media = any(p.kind != "text" for p in t.parts)
        if structured and (media or t.structured):
            content: Any = [{"type": "text", "text": mark(p.text)} if p.kind == "text" else {"type": p.kind}
                            for p in t.parts]
        else:
            content = "".join(mark(p.text) if p.kind == "text" else media_token(p.kind) for p in t.parts)
        message: dict[str, Any] = {"role": t.role, "content": content}
        if t.reasoning:  # transformers' _alias_reasoning_fields: every name a template may read it by
            key, text = t.reasoning
            message = {"thinking": mark(text), **message, key: mark(text), "reasoning_content": mark(text)}
        for key, value in t.fields:  # tool_calls, tool_call_id, name: on the message, as apply_chat_template keeps them
            message[key] = marked_data(value, mark)
        out.append(message)
    return out


def marked_data(value: Any, mark: Callable[[str], str]) -> Any:
    """``value`` (JSON data: a tool call, tool schemas) with every string marked, keys left as they are -- what
    transformers' ``mark_control_tokens`` does to messages, tools and documents."""
    if isinstance(value, str):
        return mark(value)
    if isinstance(value, dict):
        return {k: marked_data(v, mark) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [marked_data(v, mark) for v in value]
    return value


def shift(pos: int, edits: list[tuple[int, int, int]]) -> int:
    """A position of the rendering in the expanded text (edits: (position, old length, new length), in order)."""
    delta = 0
    for at, old, new in edits:
        if at >= pos:
            break
        delta += new - old
    return pos + delta
