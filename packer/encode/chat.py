"""Render a conversation with the tokenizer's chat template and find the assistant tokens.

What is trained in a conversation: each assistant turn's text *as the template emits it
in the full rendering* plus whatever the template closes it with (``<|im_end|>\\n`` in
ChatML), never the role header, never a system / user / tool turn, never an assistant turn
marked ``trained=False`` (the context turns of a TRL prompt). A token is trained when it
starts inside a trained character span (offsets from the fast tokenizer).

Spans come from **two renderings** of the record, whatever the number of turns:

    full    = render(messages)
    skeleton = render(messages with assistant turn k's content replaced by a marker M_k)

The skeleton's text between markers is the template's own text (headers, user turns,
closings). Aligning it with ``full`` gives, for assistant turn k, the end of its header
(the last occurrence of the template's generation prompt ``<|im_start|>assistant\\n``
before M_k) and the end of its content (where the template text after M_k, up to the next
header, resumes in ``full``); the closing is the common prefix of what follows with the
template's closing text. Templates that rewrite a past turn (Qwen3 drops ``<think>…</think>``
from assistant turns before the last user turn) are handled because the span is read off
``full``, not searched for as the record's content. The generation prompt and the closing
are probed once per template (:class:`ChatTemplate`), which is also compiled once, not per
call: ``apply_chat_template`` re-checks its arguments and copies the messages every call
(~40 µs of ~160 µs per Qwen3 render, measured), and the old prefix-diff labeller rendered
``1 + 2 × assistant turns`` times per record.

Where the alignment cannot be trusted (no generation prompt, a marker the template did not
emit once, template text that differs between the two renderings before a header) the
older prefix diff is used instead, turn by turn:

    start  = common_prefix(full, render(turns[:i], add_generation_prompt=True))
    end    = common_prefix(full, render(turns[:i + 1]))

Both give identical spans on prefix-stable templates (ChatML); ``tests/test_stage1_speed.py``
compares them.

Empty reasoning blocks: Qwen3-style templates put ``<think>\\n\\n</think>\\n\\n`` before the
content of the last assistant turn(s) even when the record holds no reasoning. Whether
those tokens are trained is ``train_on_empty_think`` (default false: the model is not
taught to emit a reasoning block the data never had; a block the record's own content
spells is data, and is trained).

Templates with ``{% generation %}`` markers are asked for their own assistant mask (HF
``return_assistant_tokens_mask``), which is what their authors meant; the spans above are
the fallback when that mask is unavailable.
"""

from __future__ import annotations

import os
import re
import weakref
from dataclasses import dataclass
from typing import Any

import numpy as np

from packer.errors import BadRecord, PackerError
from packer.ingest.records import Conversation

GENERATION_TAG = re.compile(r"\{%-?\s*generation\s*-?%\}")
EMPTY_THINK = re.compile(r"<think>\s*</think>\s*")
SKELETONS = 1024  # role patterns whose skeleton a worker keeps
MARKER = "\x00packer-turn-{}\x00"  # a record whose text holds it is labelled by the prefix diff instead


def template_messages(conv: Conversation, placeholders: dict[str, str]) -> list[dict[str, str]]:
    """Messages for the template: text parts verbatim, each media item as its placeholder token."""
    return [
        {"role": t.role, "content": "".join(p.text if p.kind == "text" else placeholders[p.kind] for p in t.parts)}
        for t in conv.turns
    ]


class ChatTemplate:
    """The tokenizer's chat template, compiled once, rendered as ``apply_chat_template(tokenize=False)`` does.

    Rendering calls the compiled jinja template with the tokenizer's special tokens as
    variables, exactly what ``apply_chat_template`` passes for plain string messages (no
    tools, no documents); ``tests/test_stage1_speed.py`` checks the texts are equal.
    ``header`` / ``closing`` are probed once on a two-message conversation.
    """

    def __init__(self, tok: Any):
        self.source = tok.chat_template
        self.compiled = _compile(self.source)
        self.variables = dict(tok.special_tokens_map)
        self.generation_markers = bool(GENERATION_TAG.search(str(self.source)))
        self.header, self.closing = self._probe()
        self.skeletons: dict[tuple[str, ...], tuple[list[int], list[str]] | None] = {}  # by the roles of a conversation

    def render(self, messages: list[dict[str, str]], *, add_generation_prompt: bool = False) -> str:
        if not messages:
            raise BadRecord("template_error", "the chat template refused the conversation: Cannot apply chat template "
                                              "to an empty conversation. Provide at least one message.")
        try:
            return self.compiled.render(messages=messages, tools=None, documents=None,
                                        add_generation_prompt=add_generation_prompt, **self.variables)
        except Exception as e:  # jinja raises TemplateError (and anything the template calls)
            raise BadRecord("template_error", f"the chat template refused the conversation: {e}") from None

    def skeleton(self, messages: list[dict[str, str]], marked) -> tuple[list[int], list[str]] | None:
        """The rendering with each ``marked`` message's content a marker, cut at the markers (None: not cut cleanly)."""
        marked = list(marked)
        copy = list(messages)
        for k, j in enumerate(marked):
            copy[j] = {"role": messages[j]["role"], "content": MARKER.format(k)}
        try:
            text = self.render(copy)
        except BadRecord:
            return None
        pieces, cursor = [], 0
        for k in range(len(marked)):
            marker = MARKER.format(k)
            at = text.find(marker, cursor)
            if at < 0:
                return None
            pieces.append(text[cursor:at])
            cursor = at + len(marker)
        pieces.append(text[cursor:])
        if any("\x00packer-turn-" in p for p in pieces):  # a marker the template emitted twice
            return None
        return marked, pieces

    def span(self, full: str, start: int, content_end: int) -> tuple[int, int, int]:
        """(start, content end, end): the turn's closing is what of ``closing`` follows its content."""
        return start, content_end, content_end + _common_prefix(full[content_end : content_end + len(self.closing)], self.closing)

    def _probe(self) -> tuple[str, str]:
        """The generation prompt after a user turn, and the text closing an assistant turn ('' if unknown)."""
        user, answer = {"role": "user", "content": "packer probe question"}, "packer probe answer"
        try:
            bare = self.render([user])
            prompt = self.render([user], add_generation_prompt=True)
            pair = self.render([user, {"role": "assistant", "content": answer}])
        except BadRecord:
            return "", ""
        header = prompt[len(bare):] if prompt.startswith(bare) else ""
        at = pair.rfind(answer)
        return header, pair[at + len(answer):] if at >= 0 else ""


_JSON = (str, dict, list, tuple, int, float, bool, type(None))  # what messages and special tokens are made of


def _compile(source: str):
    """The template as transformers compiles it (its sandbox, filters and globals), in an overlay
    of that environment whose attribute check is memoised for plain values.

    The immutable sandbox asks ``is_safe_attribute(obj, attr, value)`` at every attribute a
    template reads (``message.content``, ``content.startswith``, ...): ~10 µs each, a third of
    a Qwen3 render. Its answer is a function of ``type(obj)`` and ``attr`` alone (a leading
    underscore, the internal attributes of functions / frames / generators, the mutating
    methods of lists, dicts, sets), so it is computed once per (type, attribute) for the types
    a render meets: the builtin types the messages are made of, and jinja's own loop and
    namespace objects (``loop.index0``, ``ns.last_query_index``: most of Qwen3's lookups), none
    of which can pretend to be another class. Anything else is asked every time, as before. The
    overlay is this module's own: transformers' cached environment is left as it is."""
    from jinja2.runtime import LoopContext
    from jinja2.sandbox import ImmutableSandboxedEnvironment, SandboxedEnvironment
    from jinja2.utils import Namespace
    from transformers.utils.chat_template_utils import _compile_jinja_template

    shared = _compile_jinja_template(source).environment
    known = (SandboxedEnvironment.is_safe_attribute, ImmutableSandboxedEnvironment.is_safe_attribute)
    if type(shared).is_safe_attribute not in known:
        return shared.from_string(source)  # a sandbox whose check may depend on the value: not memoised
    namespace = shared.globals.get("namespace")  # transformers' own Namespace subclass
    plain = frozenset({*_JSON, LoopContext, Namespace, *([namespace] if isinstance(namespace, type) else [])})
    env = shared.overlay()
    check, memo = env.is_safe_attribute, {}

    def is_safe_attribute(obj: Any, attr: str, value: Any) -> bool:
        kind = type(obj)
        if kind not in plain:
            return check(obj, attr, value)
        hit = memo.get((kind, attr))
        if hit is None:
            hit = memo[kind, attr] = check(obj, attr, value)
        return hit

    env.is_safe_attribute = is_safe_attribute
    return env.from_string(source)


_TEMPLATES: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def chat_template(tok: Any) -> ChatTemplate:
    """The compiled template of ``tok`` (built once per tokenizer object, rebuilt if its template changes)."""
    cached = _TEMPLATES.get(tok)
    if cached is None or cached.source != tok.chat_template:
        cached = _TEMPLATES[tok] = ChatTemplate(tok)
    return cached


def render(tok: Any, messages: list[dict[str, str]], *, add_generation_prompt: bool = False) -> str:
    return chat_template(tok).render(messages, add_generation_prompt=add_generation_prompt)


def _common_prefix(a: str, b: str) -> int:
    return len(os.path.commonprefix([a, b]))


def assistant_char_spans(tok: Any, messages: list[dict[str, str]], full: str, turns: set[int] | None = None, *,
                         train_on_empty_think: bool = True) -> list[tuple[int, int]]:
    """Character spans of ``full`` that belong to assistant turns (those numbered in ``turns``, if given).

    The two-rendering alignment (module docstring), else the prefix diff."""
    template = chat_template(tok)
    spans = _aligned_spans(template, messages, full)
    if spans is None:
        spans = _prefix_diff_spans(template, messages, full)
    out = []
    for i, (start, content_end, end) in spans.items():
        if turns is not None and i not in turns:
            continue
        if not train_on_empty_think and "<think>" not in messages[i]["content"]:
            think = EMPTY_THINK.match(full, start, content_end)
            if think is not None:
                start = think.end()
        if end > start:
            out.append((start, end))
    return out


def _aligned_spans(template: ChatTemplate, messages: list[dict[str, str]],
                   full: str) -> dict[int, tuple[int, int, int]] | None:
    """{turn: (header end, content end, closing end)}; None where no skeleton aligns with ``full``.

    First the skeleton of the record's roles (every content a marker), cached per template:
    no extra rendering for the role patterns met before. Where the template's text depends
    on the contents (Qwen3's user turns that hold a ``<tool_response>``, a template that
    trims), it does not align and the record's own skeleton (assistant contents only as
    markers) is rendered."""
    if not template.header or not any(m["role"] == "assistant" for m in messages):
        return None
    if any("\x00packer-turn-" in m["content"] for m in messages):
        return None
    roles = tuple(m["role"] for m in messages)
    cached = template.skeletons.get(roles)
    if cached is None and len(template.skeletons) < SKELETONS:
        cached = template.skeletons[roles] = template.skeleton(messages, range(len(messages)))
    spans = _align(template, messages, full, *cached) if cached else None
    if spans is None:
        own = template.skeleton(messages, [i for i, role in enumerate(roles) if role == "assistant"])
        spans = _align(template, messages, full, *own) if own else None
    return spans


def _align(template: ChatTemplate, messages: list[dict[str, str]], full: str, marked: list[int],
           pieces: list[str]) -> dict[int, tuple[int, int, int]] | None:
    """Walk ``full`` along a skeleton: ``pieces[k]`` is the template text before marked message ``marked[k]``.

    Before an assistant content only the text up to the end of its header must match (what
    follows, an inserted ``<think>`` block say, is the turn's own emission); a non-assistant
    marked message must appear verbatim. An assistant turn's content ends where the next
    fixed text is found (or where the tail starts)."""
    header, spans = template.header, {}
    pos, pending = 0, None  # pending: (turn, start) of an assistant turn whose end is not found yet
    for k, j in enumerate(marked):
        piece, message = pieces[k], messages[j]
        assistant = message["role"] == "assistant"
        if assistant:
            h = piece.rfind(header)
            if h < 0:
                return None
            fixed = piece[: h + len(header)]
        else:
            fixed = piece + message["content"]
        if pending is not None:
            at = full.find(fixed, pending[1])
            if at < 0:
                return None
            spans[pending[0]] = template.span(full, pending[1], at)
            pos, pending = at, None
        if not full.startswith(fixed, pos):
            return None
        pos += len(fixed)
        if assistant:
            pending = (j, pos)
    tail = pieces[-1]
    if pending is not None:
        content_end = len(full) - len(tail)
        if content_end < pending[1] or not full.endswith(tail):
            return None
        spans[pending[0]] = template.span(full, pending[1], content_end)
    elif full[pos:] != tail:
        return None
    return spans


def _prefix_diff_spans(template: ChatTemplate, messages: list[dict[str, str]],
                       full: str) -> dict[int, tuple[int, int, int]]:
    """{turn: (start, content end, end)} by rendering growing prefixes (``1 + 2 ×`` turns renders).

    When the diffed span does not hold the turn's content (a template that is not
    prefix-stable), the span is rebuilt from the content's position in ``full`` plus the
    closing text the template puts after it."""
    spans = {}
    for i, m in enumerate(messages):
        if m["role"] != "assistant":
            continue
        try:
            before = template.render(messages[:i], add_generation_prompt=True) if i else ""
        except BadRecord:  # some templates cannot render a prefix; the header is then trained too
            before = ""
        start = _common_prefix(full, before)
        prefix = template.render(messages[: i + 1])
        end = _common_prefix(full, prefix)
        content = m["content"]
        content_end = end
        if end <= start or content not in full[start:end]:
            at = full.find(content, start)
            if at < 0:
                raise BadRecord("template_error", f"cannot locate assistant turn {i} in the rendered conversation")
            closing = prefix[prefix.rfind(content) + len(content) :]
            end = content_end = at + len(content)
            end += _common_prefix(full[end:], closing)
        else:
            content_end = start + full[start:end].rfind(content) + len(content)
        spans[i] = (start, content_end, end)
    return spans


def has_generation_markers(tok: Any) -> bool:
    return chat_template(tok).generation_markers


@dataclass
class RenderedChat:
    """A conversation rendered, waiting for its tokens (tokenized in a batch with others)."""

    text: str
    messages: list[dict[str, str]]
    train_on: str
    assistant: list[int]  # assistant turn indices
    trained: set[int]  # the assistant turns to train
    train_on_empty_think: bool


def render_conversation(tok: Any, conv: Conversation, placeholders: dict[str, str], train_on: str,
                        train_on_empty_think: bool = False) -> RenderedChat:
    """Render ``conv`` (the text to tokenize); labels come from :func:`conversation_labels` once tokenized."""
    if not tok.chat_template:
        raise PackerError(
            "the tokenizer has no chat template, so conversations cannot be rendered; "
            "use a chat tokenizer or set one in its tokenizer_config.json"
        )
    messages = template_messages(conv, placeholders)
    full = render(tok, messages)
    assistant = [i for i, t in enumerate(conv.turns) if t.role == "assistant"]
    # Assistant turns given as context (a TRL prompt's) are rendered but never trained.
    trained = {i for i in assistant if conv.turns[i].trained}
    return RenderedChat(full, messages, train_on, assistant, trained, train_on_empty_think)


def conversation_labels(tok: Any, chat: RenderedChat, ids: np.ndarray, starts: np.ndarray) -> np.ndarray:
    """The bool mask of ``ids`` (the tokens of ``chat.text``) to train on; ``starts[t]`` is the character token ``t``
    starts at (the fast tokenizer's offsets, :func:`token_starts`, or :class:`~packer.encode.offsets.ByteStarts`)."""
    if chat.train_on == "all":
        return np.ones(len(ids), dtype=bool)
    if has_generation_markers(tok):
        mask = _generation_mask(tok, chat.messages, ids)
        if mask is not None:
            context = set(chat.assistant) - chat.trained
            if context:
                mask &= ~_span_mask(starts, assistant_char_spans(tok, chat.messages, chat.text, context))
            return mask
    spans = assistant_char_spans(tok, chat.messages, chat.text, chat.trained,
                                 train_on_empty_think=chat.train_on_empty_think)
    if len(starts) < 2 or (starts[1:] >= starts[:-1]).all():  # starts in order (byte-level BPE): a span is one run
        mask = np.zeros(len(ids), dtype=bool)
        for s, e in spans:
            mask[np.searchsorted(starts, s) : np.searchsorted(starts, e)] = True
        return mask
    return _span_mask(starts, spans)


def token_starts(offsets) -> np.ndarray:
    """The start character of each token, from the fast tokenizer's ``(start, end)`` offsets."""
    return np.fromiter((s for s, _ in offsets), dtype=np.int64, count=len(offsets))


def tokenize_conversation(tok: Any, conv: Conversation, placeholders: dict[str, str], train_on: str,
                          train_on_empty_think: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """Token ids of the rendered conversation and a bool mask of the tokens to train on (one record, unbatched)."""
    chat = render_conversation(tok, conv, placeholders, train_on, train_on_empty_think)
    enc = tok(chat.text, add_special_tokens=False, return_offsets_mapping=True)
    ids = np.asarray(enc["input_ids"], dtype=np.int32)
    return ids, conversation_labels(tok, chat, ids, token_starts(enc["offset_mapping"]))


def _span_mask(starts: np.ndarray, spans: list[tuple[int, int]]) -> np.ndarray:
    """Tokens (by their first character) that start inside one of ``spans``."""
    mask = np.zeros(len(starts), dtype=bool)
    for s, e in spans:
        mask |= (starts >= s) & (starts < e)
    return mask


def _generation_mask(tok: Any, messages: list[dict[str, str]], ids: np.ndarray) -> np.ndarray | None:
    try:
        out = tok.apply_chat_template(messages, tokenize=True, return_dict=True, return_assistant_tokens_mask=True)
    except Exception:
        return None
    if list(out["input_ids"]) != ids.tolist():
        return None
    return np.asarray(out["assistant_masks"], dtype=bool)
