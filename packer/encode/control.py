"""Which tokens of a tokenizer are control tokens for a template, and what else a template reads.

A message's control tokens are encoded as text (:meth:`packer.encode.render.Renderer.mark`); the rule for which
tokens those are is transformers' (:func:`control_tokens`), read from the template's syntax tree, as is whether the
template draws at random (:func:`uses_chance`).
"""

from __future__ import annotations

import re
from typing import Any


def control_tokens(tok: Any, source: str) -> tuple[str, ...]:
    """The tokens encoded as text when a message holds them.

    transformers' rule (``_get_control_tokens``): the special added tokens, plus the added tokens the
    tokenizer lists in ``chat_control_tokens`` or, when it lists none, the added tokens the template's
    literal text holds (whitespace tokens aside). One exception, for training data: paired XML-style
    markup tokens that are not special (``<think>`` / ``</think>``, ``<tool_call>`` / ``</tool_call>``)
    are the *content* of reasoning and tool-calling turns, which a model is trained to emit as those
    tokens (``apply_chat_template`` without sanitizing gives them as tokens); they stay tokens. Role and
    turn tokens (``<|im_start|>``, ``<|eot_id|>``, DeepSeek's ``<｜User｜>``) are never markup."""
    added = list(tok.added_tokens_decoder.values())
    listed = getattr(tok, "chat_control_tokens", None)
    if listed is not None:
        chosen = set(listed)
        return tuple(t.content for t in added if t.special or t.content in chosen)
    literal = template_literals(source)
    markup = markup_tokens([t.content for t in added if not t.special])
    return tuple(t.content for t in added
                 if t.special or (t.content in literal and not t.content.isspace() and t.content not in markup))


_TAG = re.compile(r"<(/?)([A-Za-z_][\w.-]*)>")


def markup_tokens(contents: list[str]) -> set[str]:
    """The tokens among ``contents`` that are one of an XML-style pair ``<x>`` / ``</x>`` both present."""
    tags = {(m.group(1), m.group(2)): c for c in contents if (m := _TAG.fullmatch(c))}
    return {c for (slash, name), c in tags.items() if ("" if slash else "/", name) in tags}


def template_literals(source: str) -> str:
    """The template's raw text and string constants, joined by NUL (so no match spans two)."""
    from jinja2 import nodes

    ast = _parse(source)
    literals = {n.data for n in ast.find_all(nodes.TemplateData)}
    literals |= {n.value for n in ast.find_all(nodes.Const) if isinstance(n.value, str)}
    return "\0".join(sorted(literals))


def uses_chance(source: str) -> bool:
    """Whether the template draws at random: jinja's ``|random`` filter or its ``lipsum()`` global."""
    from jinja2 import nodes

    ast = _parse(source)
    return (any(n.name == "random" for n in ast.find_all(nodes.Filter))
            or any(n.name == "lipsum" for n in ast.find_all(nodes.Name)))


def _parse(source: str):
    """The template's syntax tree (``{% generation %}`` understood)."""
    import jinja2
    from jinja2 import nodes
    from jinja2.ext import Extension

    class Generation(Extension):  # only so that {% generation %} parses
        tags = {"generation"}

        def parse(self, parser):
            lineno = next(parser.stream).lineno
            body = parser.parse_statements(["name:endgeneration"], drop_needle=True)
            return nodes.CallBlock(self.call_method("_pass"), [], [], body).set_lineno(lineno)

        def _pass(self, caller):
            return caller()

    env = jinja2.Environment(extensions=[Generation, "jinja2.ext.loopcontrols"])
    return env.parse(source)


def normalizing_backend(tok: Any, control: tuple[str, ...]):
    """(a private copy of the Rust tokenizer, the control ids, a pattern of the control tokens) when the tokenizer
    has a normalizer and matches some control token after normalizing (``normalized=True``); else None."""
    backend = tok.backend_tokenizer
    if backend.normalizer is None:
        return None
    chosen = set(control)
    normalized = [t.content for t in tok.added_tokens_decoder.values() if t.content in chosen and t.normalized]
    if not normalized:
        return None
    from tokenizers import Tokenizer

    own = Tokenizer.from_str(backend.to_str())
    own.no_truncation()
    own.no_padding()
    own.encode_special_tokens = False
    ids = {own.token_to_id(t) for t in control} - {None}
    pattern = re.compile("|".join(re.escape(own.normalizer.normalize_str(t)) for t in sorted(normalized, key=len,
                                                                                              reverse=True)))
    return own, ids, pattern
