"""Which tokens of a rendered conversation are trained: the assistant turns' own text.

What is trained: each assistant turn's text *as the template emits it in the full rendering*
plus whatever the template closes it with (``<|im_end|>\\n`` in ChatML), never the role
header, never a system / user / tool turn, never an assistant turn marked ``trained=False``
(the context turns of a TRL prompt). A token is trained when it starts inside a trained
character span.

Spans come from **two renderings** of the record, whatever the number of turns:

    full     = render(messages)
    skeleton = render(messages with turn k's content replaced by a marker M_k)

The skeleton's text between markers is the template's own text (headers, closings). Walking
``full`` along it gives, for assistant turn k, the end of its header (the last occurrence of the
template's generation prompt before M_k) and the end of its content; the closing is the common
prefix of what follows with the template's closing text. Templates that rewrite a past turn
(Qwen3 drops ``<think>…</think>`` from assistant turns before the last user turn) are handled
because the span is read off ``full``.

The content's end is found where the turn's own text ends when ``full`` holds that text right
after the header (or, after an inserted ``<think>`` block, at its next occurrence) followed by
the template's next fixed text: an assistant turn that *types* the template's next text
(``...<|im_end|>\\n<|im_start|>user\\nHi``, scraped data holds such strings) cannot end early
and train the real user turn after it. (Control tokens typed in messages are also marked and
encoded as plain text, :mod:`packer.encode.render`.) Only a turn the template rewrote is
searched for by the next fixed text.

The markers are built from a private-use character that no message holds (found per record,
in one pass over the text), so no content can forge or break them.

Where the walk cannot be trusted (no generation prompt, a marker the template did not emit
once, template text that differs between the two renderings) the prefix diff is used, turn by
turn (``1 + 2 x`` turns renderings, so it is refused past :data:`PREFIX_DIFF_TURNS` assistant
turns: ``template_not_aligned``):

    start  = common_prefix(full, render(turns[:i], add_generation_prompt=True))
    end    = common_prefix(full, render(turns[:i + 1]))

Templates with ``{% generation %}`` markers give their own spans (transformers' tracker),
which is what their authors meant.

Empty reasoning blocks: Qwen3-style templates put ``<think>\\n\\n</think>\\n\\n`` before the last
assistant turn(s) even when the record holds no reasoning. Whether those tokens are trained
is ``train_on_empty_think`` (default false).
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from packer.encode.render import Renderer
from packer.errors import BadRecord

GENERATION_TAG = re.compile(r"\{%-?\s*generation\s*-?%\}")
EMPTY_THINK = re.compile(r"<think>\s*</think>\s*")
SKELETONS = 1024  # role patterns whose skeleton a worker keeps
PREFIX_DIFF_TURNS = 64  # most assistant turns the quadratic prefix diff is run for
MARKER_FIRST = 0xF0010  # markers are spelled with a plane-15 private-use character no message holds
MARKER_RANGE = re.compile(f"[{chr(MARKER_FIRST)}-\U0010ffff]")  # a character a marker may be spelled with


@dataclass
class Labeller:
    """The span finder of one template (probed once, skeletons cached by role pattern)."""

    renderer: Renderer
    header: str = ""
    closing: str = ""
    generation_markers: bool = False
    skeletons: dict = field(default_factory=dict)
    tools: list[dict[str, Any]] | None = None  # the record being labelled: its tool schemas (set by trained_spans)

    def __post_init__(self):
        self.generation_markers = bool(GENERATION_TAG.search(str(self.renderer.source)))
        self.header, self.closing = self._probe()

    def _probe(self) -> tuple[str, str]:
        """The generation prompt after a user turn, and the text closing an assistant turn ('' if unknown)."""
        user, answer = {"role": "user", "content": "packer probe question"}, "packer probe answer"
        try:
            bare = self.renderer.render([user])
            prompt = self.renderer.render([user], add_generation_prompt=True)
            pair = self.renderer.render([user, {"role": "assistant", "content": answer}])
        except BadRecord:
            return "", ""
        header = prompt[len(bare):] if prompt.startswith(bare) else ""
        at = pair.rfind(answer)
        return header, pair[at + len(answer):] if at >= 0 else ""

    # ------------------------------------------------------------ spans

    def spans(self, messages: list[dict[str, Any]], full: str, turns: set[int] | None = None, *,
              train_on_empty_think: bool = True) -> list[tuple[int, int]]:
        """Character spans of ``full`` that belong to assistant turns (those numbered in ``turns``, if given)."""
        found = self.aligned(messages, full)
        if found is None:
            found = self.prefix_diff(messages, full)
        out = []
        for i, (start, content_end, end) in found.items():
            if turns is not None and i not in turns:
                continue
            if not train_on_empty_think and "<think>" not in text_of(messages[i]):
                think = EMPTY_THINK.match(full, start, content_end)
                if think is not None:
                    start = think.end()
            if end > start:
                out.append((start, end))
        return out

    def aligned(self, messages: list[dict[str, Any]], full: str) -> dict[int, tuple[int, int, int]] | None:
        """{turn: (header end, content end, closing end)}; None where no skeleton aligns with ``full``.

        First the skeleton of the record's roles (every content a marker), cached per template:
        no extra rendering for the role patterns met before. Where the template's text depends on
        the contents (Qwen3's user turns that hold a ``<tool_response>``, a template that trims), it
        does not align and the record's own skeleton (assistant contents only as markers) is rendered."""
        if not any(m["role"] == "assistant" for m in messages):
            return None
        marker = marker_for(messages)
        roles = tuple(m["role"] for m in messages)
        spans = None
        calls = self.tools is not None or any("tool_calls" in m for m in messages)  # a skeleton of its own
        if not calls and all(isinstance(m["content"], str) for m in messages if m["role"] != "assistant"):
            cached = self.skeletons.get(roles)
            if cached is None and roles not in self.skeletons and len(self.skeletons) < SKELETONS:
                cached = self.skeletons[roles] = self.skeleton(messages, range(len(messages)), marker)
            spans = self._align(messages, full, *cached) if cached else None
        if spans is None:
            own = self.skeleton(messages, [i for i, role in enumerate(roles) if role == "assistant"], marker)
            spans = self._align(messages, full, *own) if own else None
        return spans

    def skeleton(self, messages: list[dict[str, Any]], marked, marker: str) -> tuple[list[int], list[str]] | None:
        """The rendering with each ``marked`` message's content a marker, cut at the markers (None: not cut cleanly)."""
        marked = list(marked)
        copy = list(messages)
        for k, j in enumerate(marked):
            text = f"{marker}{k}{marker}"
            content = messages[j]["content"]
            copy[j] = {**messages[j], "content": [{"type": "text", "text": text}] if isinstance(content, list) else text}
        try:
            rendered = self.renderer.render(copy, tools=self.tools)
        except BadRecord:
            return None
        pieces, cursor = [], 0
        for k in range(len(marked)):
            text = f"{marker}{k}{marker}"
            at = rendered.find(text, cursor)
            if at < 0:
                return None
            pieces.append(rendered[cursor:at])
            cursor = at + len(text)
        pieces.append(rendered[cursor:])
        if any(marker in p for p in pieces):  # a marker the template emitted twice
            return None
        return marked, pieces

    def _align(self, messages: list[dict[str, Any]], full: str, marked: list[int],
               pieces: list[str]) -> dict[int, tuple[int, int, int]] | None:
        """Walk ``full`` along a skeleton: ``pieces[k]`` is the template text before marked message ``marked[k]``.

        Before an assistant content only the text up to the end of its header must match (what
        follows, an inserted ``<think>`` block say, is the turn's own emission; a template with no
        generation prompt -- Mistral's ``[/INST]`` then ``" " + content`` -- has all of it fixed); a
        non-assistant marked message must appear verbatim. An assistant turn's content ends where its own text
        ends when that is followed by the next fixed text, else where the next fixed text is found.

        An assistant turn's tool calls are rendered after its content, in the template text that follows its marker:
        they are the turn's own emission, up to the template's closing (``closing``), so that text is moved from the
        next piece into the turn's content."""
        header, spans = self.header, {}
        pieces, emitted = list(pieces), {}
        for k, j in enumerate(marked):
            if messages[j]["role"] == "assistant" and "tool_calls" in messages[j]:
                cut = pieces[k + 1].find(self.closing) if self.closing else -1
                if cut < 0 or not isinstance(messages[j]["content"], str):
                    return None
                emitted[j], pieces[k + 1] = pieces[k + 1][:cut], pieces[k + 1][cut:]
        own = {j: {**messages[j], "content": messages[j]["content"] + text} for j, text in emitted.items()}
        pos, pending = 0, None  # pending: (turn, start) of an assistant turn whose end is not found yet
        for k, j in enumerate(marked):
            piece, message = pieces[k], messages[j]
            assistant = message["role"] == "assistant"
            if assistant:
                h = _header_at(piece, header, message)
                if h >= 0:
                    fixed = piece[: h + len(header)]
                else:  # the prompt opens more than the turn shows (DeepSeek-R1: "<｜Assistant｜><think>\n"): its start
                    n = next((n for n in range(len(header) - 1, 0, -1) if piece.endswith(header[:n])), 0)
                    if not n:
                        return None
                    fixed = piece
            else:
                content = message["content"]
                if not isinstance(content, str):
                    return None  # a structured user turn: its rendering is the template's, not verbatim
                fixed = piece + content
            if pending is not None:
                at = self._content_end(full, own.get(pending[0], messages[pending[0]]), pending[1], fixed)
                if at < 0:
                    return None
                spans[pending[0]] = self._span(full, pending[1], at)
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
            spans[pending[0]] = self._span(full, pending[1], content_end)
        elif full[pos:] != tail:
            return None
        return spans

    @staticmethod
    def _content_end(full: str, message: dict[str, Any], start: int, fixed: str) -> int:
        """Where an assistant turn's content ends in ``full``: after its own text when the next fixed text
        follows it there (right at ``start``, or after an inserted block), else the next fixed text's start.
        Every search stops near the turn (the next fixed text, plus the content's length when the content itself
        holds that text): a template that rewrote the turn (Qwen3 drops past reasoning) costs its own length, not
        the rest of the conversation, so labelling stays linear in the record."""
        content = message["content"]
        if isinstance(content, str) and content:
            if full.startswith(content, start) and full.startswith(fixed, start + len(content)):
                return start + len(content)
            nxt = full.find(fixed, start)
            if nxt < 0:
                return -1
            at = full.find(content, start, nxt + len(content))
            if at >= 0 and full.startswith(fixed, at + len(content)):
                return at + len(content)
            return nxt
        return full.find(fixed, start)

    def _span(self, full: str, start: int, content_end: int) -> tuple[int, int, int]:
        """(start, content end, end): the turn's closing is what of ``closing`` follows its content."""
        tail = full[content_end : content_end + len(self.closing)]
        return start, content_end, content_end + len(os.path.commonprefix([tail, self.closing]))

    def prefix_diff(self, messages: list[dict[str, Any]], full: str) -> dict[int, tuple[int, int, int]]:
        """{turn: (start, content end, end)} by rendering growing prefixes (``1 + 2 ×`` turns renders).

        When the diffed span does not hold the turn's content (a template that is not prefix-stable),
        the span is rebuilt from the content's position in ``full`` plus the closing text the template
        puts after it."""
        turns = [i for i, m in enumerate(messages) if m["role"] == "assistant"]
        if len(turns) > PREFIX_DIFF_TURNS:
            raise BadRecord("template_not_aligned", f"the chat template's turns could not be told apart from two "
                                                    f"renderings, and the record has {len(turns)} assistant turns (the "
                                                    f"turn-by-turn fallback stops at {PREFIX_DIFF_TURNS}); split the "
                                                    f"conversation, or use a template that renders turns in order")
        spans = {}
        for i in turns:
            try:
                before = self.renderer.render(messages[:i], add_generation_prompt=True, tools=self.tools) if i else ""
            except BadRecord:  # some templates cannot render a prefix; the header is then trained too
                before = ""
            start = common_chars(full, before)
            prefix = self.renderer.render(messages[: i + 1], tools=self.tools)
            end = common_chars(full, prefix)
            content = text_of(messages[i])
            content_end = end
            if end <= start or content not in full[start:end]:
                at = full.find(content, start)
                if at < 0:
                    raise BadRecord("template_error", f"cannot locate assistant turn {i} in the rendered conversation")
                closing = prefix[prefix.rfind(content) + len(content) :]
                end = content_end = at + len(content)
                end += len(os.path.commonprefix([full[end:], closing]))
            else:
                content_end = start + full[start:end].rfind(content) + len(content)
            spans[i] = (start, content_end, end)
        return spans

    # ------------------------------------------------------------ masks

    def trained_spans(self, messages: list[dict[str, Any]], full: str, assistant: list[int], trained: set[int],
                      train_on_empty_think: bool, tools: list[dict[str, Any]] | None = None) -> list[tuple[int, int]]:
        """The character spans to train: the template's generation blocks (minus context turns) when it marks
        them, else the assistant spans of the turns in ``trained``. ``tools``: the record's tool schemas, rendered
        with every rendering of the record."""
        self.tools = tools
        try:
            return self._trained_spans(messages, full, assistant, trained, train_on_empty_think)
        finally:
            self.tools = None

    def _trained_spans(self, messages: list[dict[str, Any]], full: str, assistant: list[int], trained: set[int],
                       train_on_empty_think: bool) -> list[tuple[int, int]]:
        if self.generation_markers:
            try:
                rendered, blocks = self.renderer.generation_spans(messages, self.tools)
            except Exception:  # noqa: BLE001 -- the tracker refused: the spans below
                rendered, blocks = None, []
            if rendered == full and blocks:
                context = set(assistant) - trained
                if context:
                    drop = self.spans(messages, full, context)
                    blocks = subtract(blocks, drop)
                return blocks
        return self.spans(messages, full, trained, train_on_empty_think=train_on_empty_think)


REASONING = ("reasoning_content", "thinking", "reasoning")  # the fields transformers lets a template read reasoning from


def _header_at(piece: str, header: str, message: dict[str, Any]) -> int:
    """Where the assistant turn's header starts in the template text before its content: the last one, or, when the
    template wrote the turn's reasoning field there (gpt-oss's analysis message before its final one), the last one
    before that reasoning -- so the reasoning the turn emits is trained with it."""
    for key in REASONING:
        value = message.get(key)
        if isinstance(value, str) and value:
            r = piece.rfind(value)
            if r >= 0:
                return piece.rfind(header, 0, r)
    return piece.rfind(header)


def common_chars(a: str, b: str) -> int:
    """How many leading characters ``a`` and ``b`` share. ``os.path.commonprefix`` walks them a character at a
    time in Python (~20 ns each: 2 ms for a 100 KB prompt, once per response of a record); this compares
    halving slices in C, ``n / 2 + n / 4 + ...`` characters, so a record of many responses costs no more than
    copying their text."""
    n = min(len(a), len(b))
    if a[:n] == b[:n]:
        return n
    lo, hi = 0, n  # a[:lo] == b[:lo]; a[:hi] != b[:hi]
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if a[lo:mid] == b[lo:mid]:
            lo = mid
        else:
            hi = mid
    return lo


def text_of(message: dict[str, Any]) -> str:
    content = message["content"]
    if isinstance(content, str):
        return content
    return "".join(p.get("text", "") for p in content if isinstance(p, dict) and p.get("type") == "text")


def marker_for(messages: list[dict[str, Any]]) -> str:
    """A private-use character that no message's text holds (one pass over the texts, in C where none holds one:
    ``max(text)`` walked a 100 KB prompt a character at a time, 2.4 ms for each response of a record)."""
    texts = [text_of(m) for m in messages]
    if not any(MARKER_RANGE.search(t) for t in texts if not t.isascii()):  # the usual case: no character that high
        return "\x00" + chr(MARKER_FIRST)
    used = set().union(*(set(t) for t in texts))
    code = MARKER_FIRST
    while chr(code) in used:
        code += 1
    return "\x00" + chr(code)


def subtract(spans: list[tuple[int, int]], drop: list[tuple[int, int]]) -> list[tuple[int, int]]:
    out = []
    for s, e in spans:
        pieces = [(s, e)]
        for ds, de in drop:
            pieces = [p for a, b in pieces for p in ((a, min(b, ds)), (max(a, de), b)) if p[1] > p[0]]
        out += pieces
    return out


def span_mask(starts: np.ndarray, spans: list[tuple[int, int]], length: int) -> np.ndarray:
    """Tokens that overlap one of ``spans`` (character ranges of a text of ``length`` characters), as transformers'
    ``return_assistant_tokens_mask`` decides: token ``t`` covers ``starts[t]`` up to the next token's start. So a
    token that merges the template's space with the content's first word (Mistral's ``" " + content``, a
    SentencePiece ``▁Hello``) is trained with the content it carries."""
    mask = np.zeros(len(starts), dtype=bool)
    if not len(starts) or not spans:
        return mask
    ends = np.append(starts[1:], length)
    if (ends >= starts).all():  # starts in order: a span is one run of tokens
        for s, e in spans:
            if e > s:  # tokens starting in the span, and the one reaching into it from before (its end past s)
                first = min(np.searchsorted(ends, s, side="right"), np.searchsorted(starts, s))
                mask[first : np.searchsorted(starts, e)] = True
        return mask
    for s, e in spans:  # offsets out of order (a tokenizer that reorders): by start only
        mask |= (starts >= s) & (starts < e)
    return mask
