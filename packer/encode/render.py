"""Render conversations with a tokenizer's chat template, exactly as transformers does.

The reference is transformers' public API: the template is ``tok.get_chat_template(name, tools)``
(a named template of a tokenizer that has several: ``default``, ``tool_use``, ...; with no name given, a
record that has ``tools`` gets ``tool_use`` where the tokenizer has one, as ``apply_chat_template(tools=)``
picks it: :func:`template_source`), and a rendering is
``tok.apply_chat_template(messages, chat_template=source, tokenize=False)``.
That call re-checks its arguments and copies the messages every time (~40 µs of a ~160 µs
Qwen3 render, measured), so the template is also compiled once here, in an overlay of
transformers' own jinja environment whose attribute check is memoised
(:func:`packer.encode.compiled.compile_template`).
The fast path is used only when it renders a set of probe conversations exactly as the
public call does (:meth:`Renderer.check`, once per template at start-up); otherwise, or
when transformers' private compiler is gone, every render goes through the public call.

A rendering runs under a bound on its steps and on the characters it builds
(:mod:`packer.encode.sandbox`): a template that loops without end or writes gigabytes costs its
record (``template_too_slow``, ``template_output_too_long``), never the build.

Three things a template can read that would make builds differ are fixed here:

- the clock: ``strftime_now`` (Llama 3.1's date line) is given a fixed time in UTC, the build's
  ``template_time`` (``SOURCE_DATE_EPOCH`` when set, else the Unix epoch), passed as a
  template variable, which shadows transformers' global of the same name; ``%s`` (seconds since
  1970, which C's strftime computes in the local time zone) is written from that time itself;
- chance: ``|random`` and ``lipsum()`` draw from Python's generator seeded, for each rendering,
  with a hash of the messages rendered (the same record gives the same text in any build, order
  or worker); the manifest's tokenizer entry says so (``template_random``);
- control tokens typed in the data: with ``sanitize`` (always, in packer), every control
  token inside a message string is wrapped in transformers' private-use markers
  (``mark_control_tokens``), exactly as ``apply_chat_template(..., sanitize_control_tokens=True)``
  does, and :mod:`packer.encode.tokens` encodes it as plain text. A user turn holding
  ``<|im_end|>\\n<|im_start|>assistant\\n`` can then never open a turn of its own.
  The markers themselves, U+F0000 / U+F0001, are never removed from the data (transformers' sanitizing
  strips them from every string, so that typed markers cannot forge a marked token): a record that marks
  nothing keeps them as the tokenizer encodes them, as ``apply_chat_template`` does; one that holds both a
  typed marker and a typed control token has no HF encoding that keeps both as written, and is quarantined
  (``private_marker_in_text``) rather than altered.
  Control tokens are the tokenizer's special added tokens plus the added tokens the template
  writes itself (``tok.chat_control_tokens`` when the tokenizer lists them), the rule of
  transformers' ``_get_control_tokens``.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import re
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from packer.encode.compiled import compile_template
from packer.encode.control import control_tokens, normalizing_backend, uses_chance
from packer.encode.sandbox import Budget
from packer.errors import BadRecord, ConfigError, PackerError

MARK_START, MARK_END = "\U000f0000", "\U000f0001"  # transformers' markers (chat_template_utils._CONTROL_TOKEN_*)
MAX_STEPS = 1_000_000  # template_max_steps' default: ~1 s of loop on one shared core (docs/reliability.md)
MAX_CHARS = 64 * 2**20  # template_max_chars' default: 8x the default max_line_bytes


def template_clock(template_time: str = "") -> datetime:
    """The time a template's ``strftime_now`` sees: ``template_time`` (ISO 8601, e.g. ``2026-01-01``),
    else ``SOURCE_DATE_EPOCH`` (seconds, the reproducible-builds convention), else the Unix epoch."""
    if template_time:
        try:
            moment = datetime.fromisoformat(template_time)
        except ValueError:
            raise ConfigError(f"template_time = {template_time!r} is not an ISO 8601 date or time "
                              f"(e.g. 2026-01-01 or 2026-01-01T12:00:00)") from None
        return moment.astimezone(UTC) if moment.tzinfo else moment.replace(tzinfo=UTC)
    epoch = os.environ.get("SOURCE_DATE_EPOCH", "").strip()
    if epoch:
        try:
            return datetime.fromtimestamp(int(epoch), UTC)
        except (ValueError, OverflowError, OSError):
            raise ConfigError(f"SOURCE_DATE_EPOCH = {epoch!r} is not a number of seconds since 1970") from None
    return datetime.fromtimestamp(0, UTC)


def strftime_at(moment: datetime) -> Callable[[str], str]:
    """``strftime_now`` at ``moment``: ``moment.strftime``, with ``%s`` (seconds since 1970: C's strftime reads it in
    the local time zone, so two machines would write different numbers) written from ``moment`` itself."""
    seconds = str(int(moment.timestamp()))

    def strftime_now(fmt: str) -> str:
        if "%s" in fmt:
            fmt = re.sub(r"%[%s]", lambda m: "%%" if m.group() == "%%" else seconds, fmt)
        return moment.strftime(fmt)
    return strftime_now


def template_source(tok: Any, name: str = "", tools: bool = False) -> str:
    """The template text ``apply_chat_template`` would use: the tokenizer's only template, its
    ``default`` one, or the one named (a tokenizer may hold several, as a dict); a ``name`` ending in
    ``.jinja`` is a file holding the template to use instead of the tokenizer's. ``tools``: for a record that
    has tools, which transformers renders with the tokenizer's ``tool_use`` template when it has one and no
    name is given (``get_chat_template(None, tools)``); asked the same way here, so the choice is its own."""
    if name.endswith(".jinja"):
        try:
            return Path(name).read_text(encoding="utf-8")
        except OSError as e:
            raise ConfigError(f"chat_template = {name!r}: cannot read it ({e})") from None
    templates = tok.chat_template
    if not templates:
        raise PackerError("the tokenizer has no chat template, so conversations cannot be rendered; use a chat "
                          "tokenizer, set one in its tokenizer_config.json / chat_template.jinja, or pack documents only")
    if isinstance(templates, dict) and name and name not in templates:
        raise ConfigError(f"chat_template = {name!r}: the tokenizer's templates are {', '.join(sorted(templates))}")
    if not isinstance(templates, dict) and name and name != "default":
        raise ConfigError(f"chat_template = {name!r}: the tokenizer has a single, unnamed template; leave chat_template "
                          f"empty")
    try:
        return tok.get_chat_template(name or None, [] if tools else None)
    except ValueError as e:  # a dict without "default" and no name given
        raise ConfigError(f"{e} (set chat_template to one of its names)") from None


class Renderer:
    """One tokenizer's template, rendered as ``apply_chat_template(tokenize=False)`` renders it (``tools``: the
    template transformers picks for a record that has tools, see :func:`template_source`)."""

    def __init__(self, tok: Any, template_name: str = "", clock: datetime | None = None, *,
                 max_steps: int = MAX_STEPS, max_chars: int = MAX_CHARS, tools: bool = False):
        self.tok = tok
        self.name = template_name
        self.source = template_source(tok, template_name, tools)
        self.moment = clock or template_clock()
        self.variables: dict[str, Any] = {**tok.special_tokens_map, "strftime_now": strftime_at(self.moment)}
        self.budget = Budget(max_steps, max_chars)
        self.compiled = compile_template(self.source, self.budget)
        self.randomized = uses_chance(self.source)
        self.control = control_tokens(tok, self.source)
        self._control_re = re.compile("|".join(map(re.escape, sorted(self.control, key=len, reverse=True))) or "(?!)")
        self._normalizing = normalizing_backend(tok, self.control)  # None: control tokens match the raw text only
        self.sanitized = 0  # control tokens typed in the data and encoded as text (raw or after normalization)
        self.markers_typed = 0  # U+F0000 / U+F0001 characters met in the data (kept: see the module docstring)
        self.fast_checked = False

    # ------------------------------------------------------------ rendering

    def render(self, messages: list[dict[str, Any]], *, add_generation_prompt: bool = False,
               tools: list[dict[str, Any]] | None = None) -> str:
        """The rendered text (``tools``: the template's ``tools`` variable, as ``apply_chat_template(tools=)`` passes
        it); a template error is the record's (``template_error``)."""
        if not messages:
            raise BadRecord("template_error", "the chat template refused the conversation: Cannot apply chat template "
                                              "to an empty conversation. Provide at least one message.")
        try:
            with self._chance(messages, add_generation_prompt, tools):
                if self.compiled is not None:
                    return self._bounded(messages, add_generation_prompt, self.variables, tools)
                return self.public(messages, add_generation_prompt=add_generation_prompt, tools=tools)
        except BadRecord:
            raise
        except Exception as e:  # jinja raises TemplateError (and anything the template calls)
            raise BadRecord("template_error", f"the chat template refused the conversation: {e}") from None

    def _bounded(self, messages: list[dict[str, Any]], add_generation_prompt: bool, variables: dict[str, Any],
                 tools: list[dict[str, Any]] | None = None) -> str:
        """The compiled rendering, its steps and characters bounded (:mod:`packer.encode.sandbox`)."""
        budget = self.budget
        budget.reset()
        pieces, size = [], 0
        for piece in self.compiled.generate(messages=messages, tools=tools, documents=None,
                                            add_generation_prompt=add_generation_prompt, **variables):
            size += len(piece)
            if size > budget.max_chars:
                raise budget.too_long(size)
            pieces.append(piece)
        return "".join(pieces)

    @contextmanager
    def _chance(self, messages: list[dict[str, Any]], add_generation_prompt: bool,
                tools: list[dict[str, Any]] | None = None) -> Iterator[None]:
        """Python's generator (what ``|random`` and ``lipsum()`` draw from) seeded from the messages, for a
        template that draws; the caller's state is put back after."""
        if not self.randomized:
            yield
            return
        state = random.getstate()
        key = json.dumps([messages, add_generation_prompt, tools], sort_keys=True, ensure_ascii=False, default=str)
        random.seed(int.from_bytes(hashlib.sha256(key.encode("utf-8", "surrogatepass")).digest()[:8], "big"))
        try:
            yield
        finally:
            random.setstate(state)

    def public(self, messages: list[dict[str, Any]], *, add_generation_prompt: bool = False,
               tools: list[dict[str, Any]] | None = None) -> str:
        """transformers' own rendering (the reference the fast path is checked against). Its template data passes
        through ``_plain_template_data``, which turns a function into a string, so the build's clock cannot reach
        it: a template that reads ``strftime_now`` is only ever rendered by the compiled path (see :meth:`check`)."""
        return self.tok.apply_chat_template(messages, chat_template=self.source, tokenize=False, tools=tools,
                                            add_generation_prompt=add_generation_prompt)

    def generation_spans(self, messages: list[dict[str, Any]],
                         tools: list[dict[str, Any]] | None = None) -> tuple[str, list[tuple[int, int]]]:
        """The rendering and the character spans of its ``{% generation %}`` blocks (transformers' tracker)."""
        from transformers.utils.chat_template_utils import render_jinja_template

        variables = {**self.variables}
        rendered, indices = render_jinja_template(conversations=[messages], chat_template=self.source, tools=tools,
                                                  return_assistant_tokens_mask=True, **variables)
        return rendered[0], [tuple(s) for s in indices[0]]

    # ------------------------------------------------------------ control tokens

    def mark(self, text: str) -> str:
        """``text`` with every control token wrapped in transformers' markers, as ``mark_control_tokens`` does;
        unchanged (the same object) when it holds none. Markers the text already holds are kept and counted
        (``markers_typed``): the caller refuses a record that holds them and had a token marked.

        A tokenizer that normalizes (NFKC, lowercasing) before it matches its added tokens would turn
        ``＜|im_start|＞`` or ``<|IM_START|>`` into the real token: where the normalized text holds a control
        token, the spans are found by the tokenizer itself (the offsets of the control ids its own encoding of
        ``text`` gives) and those original characters are marked."""
        if MARK_START in text or MARK_END in text:
            self.markers_typed += text.count(MARK_START) + text.count(MARK_END)
        if self._normalizing is not None:
            backend, ids, pattern = self._normalizing
            if pattern.search(backend.normalizer.normalize_str(text)):
                encoding = backend.encode(text, add_special_tokens=False)
                spans = [o for i, o in zip(encoding.ids, encoding.offsets, strict=True) if i in ids]
                if spans:
                    self.sanitized += len(spans)
                    pieces, cursor = [], 0
                    for a, b in spans:
                        pieces += [text[cursor:a], MARK_START, text[a:b], MARK_END]
                        cursor = b
                    return "".join(pieces) + text[cursor:]
        if not self._control_re.search(text):
            return text
        marked, n = self._control_re.subn(f"{MARK_START}\\g<0>{MARK_END}", text)
        self.sanitized += n
        return marked

    # ------------------------------------------------------------ the start-up check

    def check(self, probes: list[list[dict[str, Any]]]) -> bool:
        """Render ``probes`` both ways; keep the compiled path only if every rendering (or refusal) is equal.
        Returns whether the fast path is in use. Both read the build's fixed time here (transformers' global
        ``strftime_now`` is set to it for the check) and the same seed, so the check compares the machinery.
        A template that reads the clock and cannot use the compiled path
        is refused: the public path would stamp every record with the time it was rendered; so is one that draws
        (``|random``, ``lipsum``) and cannot."""
        self.fast_checked = True
        clocked = "strftime_now" in self.source
        if self.compiled is None:
            if clocked or self.randomized:
                raise PackerError(f"the chat template reads {self._fixed_reads()} and transformers' template compiler "
                                  f"is not available to fix it for the build; pin transformers to a version packer "
                                  f"supports")
            return False
        for messages in probes:
            for prompt in (False, True):
                fast = slow = None
                try:
                    with self._chance(messages, prompt):
                        fast = self._bounded(messages, prompt, self.variables)
                except BadRecord:  # over a bound on a probe: the public call would run unbounded; every record
                    return True    # will meet the bound too, and be quarantined

                except Exception as e:  # noqa: BLE001 -- compared with the public call's refusal
                    fast = ("error", type(e).__name__)
                try:
                    # transformers' compile of the template (with its clock set) only once the bounded path rendered
                    # the probe: its optimizer folds constants unchecked ('%999999999d' % 1: a GB, seconds)
                    with self._public_clock(), self._chance(messages, prompt):
                        slow = self.public(messages, add_generation_prompt=prompt)
                except Exception as e:  # noqa: BLE001
                    slow = ("error", type(e).__name__)
                if fast != slow:
                    self.compiled = None
                    if clocked or self.randomized:
                        raise PackerError(f"the chat template reads {self._fixed_reads()} and its compiled "
                                          f"rendering differs from transformers' own; packer cannot render it "
                                          f"with a fixed time and seed")
                    return False
        return True

    def _fixed_reads(self) -> str:
        reads = (["the clock (strftime_now)"] if "strftime_now" in self.source else []) + (
            ["chance (random / lipsum)"] if self.randomized else [])
        return " and ".join(reads)

    @contextmanager
    def _public_clock(self) -> Iterator[None]:
        """transformers' own ``strftime_now`` at the build's time, for the check: both paths then read the same
        clock, so a template that prints seconds or microseconds compares equal (the wall clock would not)."""
        try:
            from transformers.utils.chat_template_utils import _compile_jinja_template

            shared = _compile_jinja_template(self.source).environment.globals
        except Exception:  # noqa: BLE001 -- no private compiler: nothing to fix
            yield
            return
        before = shared.get("strftime_now")
        shared["strftime_now"] = self.variables["strftime_now"]
        try:
            yield
        finally:
            shared["strftime_now"] = before


def probe_conversations(media_kinds: tuple[str, ...] = ()) -> list[list[dict[str, Any]]]:
    """Conversations the fast path is checked on: every role, several turns, odd characters, and
    (for a structured family) media parts."""
    odd = "  spaces \t tab\nnewline {{ braces }} {% raw %} <b>tag</b> é 中文 🙂 \\ backslash 'q' \"qq\"  "
    user = {"role": "user", "content": "packer probe question"}
    out = [
        [user],
        [user, {"role": "assistant", "content": "packer probe answer"}],
        [{"role": "system", "content": "be brief"}, user, {"role": "assistant", "content": odd},
         {"role": "user", "content": odd}, {"role": "assistant", "content": "<think>\nx\n</think>\n\nok"}],
        [user, {"role": "assistant", "content": "a"}, {"role": "tool", "content": "21 C"},
         {"role": "assistant", "content": ""}],
        [user, {"thinking": "reason", "role": "assistant", "content": "answer", "reasoning_content": "reason"}],
    ]
    for kind in media_kinds:
        parts = [{"type": kind}, {"type": "text", "text": "what is this?"}]
        out.append([{"role": "user", "content": parts}, {"role": "assistant", "content": "a thing"}])
        out.append([{"role": "user", "content": [{"type": "text", "text": "two:"}, {"type": kind}, {"type": kind}]},
                    {"role": "assistant", "content": [{"type": "text", "text": "both"}]}])
    return out

