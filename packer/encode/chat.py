"""Render a conversation with the tokenizer's chat template and find the assistant tokens.

Which tokens are "assistant tokens" must work for any template, and most real templates
carry no ``{% generation %}`` markers. packer renders growing prefixes of the
conversation and diffs them against the full rendering, in characters:

    full   = render(turns)
    start  = common_prefix(full, render(turns[:i], add_generation_prompt=True))
    end    = common_prefix(full, render(turns[:i + 1]))

so turn ``i``'s trained span is ``full[start:end]``: its content and whatever the
template closes it with (``<|im_end|>\\n`` in ChatML), without the role header. A token
is trained when it starts inside a span. Templates that do have generation markers are
asked for their own assistant mask instead (HF ``return_assistant_tokens_mask``), which
is what their authors meant; the diff is the fallback when that mask is unavailable.
Only assistant turns are trained: ``system``, ``user`` and ``tool`` turns never are, nor
assistant turns marked ``trained=False`` (the context turns of a TRL prompt).
"""

from __future__ import annotations

import os
import re
from typing import Any

import numpy as np

from packer.errors import BadRecord, PackerError
from packer.ingest.records import Conversation


def template_messages(conv: Conversation, placeholders: dict[str, str]) -> list[dict[str, str]]:
    """Messages for the template: text parts verbatim, each media item as its placeholder token."""
    return [
        {"role": t.role, "content": "".join(p.text if p.kind == "text" else placeholders[p.kind] for p in t.parts)}
        for t in conv.turns
    ]


def render(tok: Any, messages: list[dict[str, str]], *, add_generation_prompt: bool = False) -> str:
    try:
        return tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=add_generation_prompt)
    except Exception as e:  # jinja raises TemplateError (and anything the template calls)
        raise BadRecord("template_error", f"the chat template refused the conversation: {e}") from None


def _common_prefix(a: str, b: str) -> int:
    return len(os.path.commonprefix([a, b]))


def assistant_char_spans(tok: Any, messages: list[dict[str, str]], full: str,
                         turns: set[int] | None = None) -> list[tuple[int, int]]:
    """Character spans of ``full`` that belong to assistant turns (those numbered in ``turns``, if given).

    Prefix diff first. Some templates are not prefix-stable (Qwen3 renders the last
    assistant turn with a ``<think>`` block that earlier turns do not get), so when the
    diffed span does not hold the turn's content, the span is rebuilt from the content's
    position in ``full`` plus the closing text the template puts after it.
    """
    spans = []
    for i, m in enumerate(messages):
        if m["role"] != "assistant" or (turns is not None and i not in turns):
            continue
        try:
            before = render(tok, messages[:i], add_generation_prompt=True) if i else ""
        except BadRecord:  # some templates cannot render a prefix; the header is then trained too
            before = ""
        start = _common_prefix(full, before)
        prefix = render(tok, messages[: i + 1])
        end = _common_prefix(full, prefix)
        content = m["content"]
        if end <= start or content not in full[start:end]:
            at = full.find(content, start)
            if at < 0:
                raise BadRecord("template_error", f"cannot locate assistant turn {i} in the rendered conversation")
            closing = prefix[prefix.rfind(content) + len(content) :]
            end = at + len(content)
            end += _common_prefix(full[end:], closing)
        if end > start:
            spans.append((start, end))
    return spans


GENERATION_TAG = re.compile(r"\{%-?\s*generation\s*-?%\}")


def has_generation_markers(tok: Any) -> bool:
    return bool(GENERATION_TAG.search(str(tok.chat_template)))


def tokenize_conversation(tok: Any, conv: Conversation, placeholders: dict[str, str],
                          train_on: str) -> tuple[np.ndarray, np.ndarray]:
    """Token ids of the rendered conversation and a bool mask of the tokens to train on."""
    if not tok.chat_template:
        raise PackerError(
            "the tokenizer has no chat template, so conversations cannot be rendered; "
            "use a chat tokenizer or set one in its tokenizer_config.json"
        )
    messages = template_messages(conv, placeholders)
    full = render(tok, messages)
    enc = tok(full, add_special_tokens=False, return_offsets_mapping=True)
    ids = np.asarray(enc["input_ids"], dtype=np.int32)
    if train_on == "all":
        return ids, np.ones(len(ids), dtype=bool)
    # Assistant turns given as context (a TRL prompt's) are rendered but never trained.
    assistant = [i for i, t in enumerate(conv.turns) if t.role == "assistant"]
    trained = {i for i in assistant if conv.turns[i].trained}
    starts = np.asarray([s for s, _ in enc["offset_mapping"]], dtype=np.int64)
    if has_generation_markers(tok):
        mask = _generation_mask(tok, messages, ids)
        if mask is not None:
            context = set(assistant) - trained
            if context:
                mask &= ~_span_mask(starts, assistant_char_spans(tok, messages, full, context))
            return ids, mask
    return ids, _span_mask(starts, assistant_char_spans(tok, messages, full, trained))


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
