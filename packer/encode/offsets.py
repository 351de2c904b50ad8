"""Where each token starts in its text, from token byte lengths instead of the tokenizer's offsets.

Labels need the character each token starts at. The fast tokenizer can report offsets,
but tracking them costs ~20% of the Rust encode and ~25 µs a chat to hand them to Python
as a list of tuples. For a byte-level BPE tokenizer they follow from the ids alone: every
vocabulary token stands for a fixed byte string (one byte per character of its byte-level
spelling), every added token for its own text, and the tokens' bytes, in order, are the
text's UTF-8 bytes whenever nothing rewrites the text on the way. A token then starts at the
character that holds its first byte, which is what the tokenizer's offsets say (a character
split over two byte tokens gives both that character's start).

That holds for a tokenizer that has (checked once, :meth:`ByteStarts.for_tokenizer`):

- a BPE model with no byte fallback, no unknown token, no subword prefix or word suffix,
  and a vocabulary spelled in the byte-level alphabet;
- no normalizer, or NFC;
- a ``ByteLevel`` pre-tokenizer that adds no prefix space, alone or after ``Split`` steps
  that keep what they match;
- no post-processor that trims offsets (``ByteLevel`` with ``trim_offsets``, ``RobertaProcessing``);
- added tokens that strip nothing around them.

and for a text that is NFC already (when the normalizer is NFC) and whose tokens' bytes add
up to its own; :meth:`ByteStarts.starts` returns None for any other text, and the caller
asks the tokenizer for offsets. Qwen2 / Qwen2.5 / Qwen3, Llama 3 and GPT-2-style tokenizers
qualify. ``tests/test_offsets.py`` compares the two on generated Unicode text.

:func:`normal_form` names the Unicode form a tokenizer's normalizer is, for the same reason:
a text already in that form comes out of it unchanged, so stage 1 lets such texts skip it.
"""

from __future__ import annotations

import json
import unicodedata
from typing import Any

import numpy as np


def _byte_alphabet() -> frozenset[str]:
    """The 256 characters byte-level BPE spells bytes with (GPT-2's ``bytes_to_unicode``)."""
    keep = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    moved = [b for b in range(256) if b not in keep]
    return frozenset([*map(chr, keep), *(chr(256 + i) for i in range(len(moved)))])


def _state(state: dict, component: str) -> dict:
    """One component (``normalizer``, ``pre_tokenizer``, ...) of the serialized tokenizer, {} when absent."""
    return state.get(component) or {}


def serialized_state(tok: Any, serialized: str | None = None) -> dict:
    """The tokenizer's backend as its ``tokenizer.json`` holds it (public ``to_str``), without the ``model``
    (vocabulary and merges: megabytes, ~2 s of ``json.loads`` for Qwen's; none of the checks need it)."""
    text = serialized if serialized is not None else tok.backend_tokenizer.to_str()
    decoder = json.JSONDecoder()
    out: dict = {}
    at = text.index("{") + 1
    while True:
        while text[at] in " \t\r\n,":
            at += 1
        if text[at] == "}":
            return out
        key, at = decoder.raw_decode(text, at)
        at = text.index(":", at) + 1
        while text[at] in " \t\r\n":
            at += 1
        if key == "model":  # the tokenizers library serializes it last: nothing the checks need follows
            out[key] = None
            return out
        out[key], at = decoder.raw_decode(text, at)


def _pre_tokenizer_ok(state: dict) -> bool:
    steps = state.get("pretokenizers", []) if state.get("type") == "Sequence" else [state]
    if not steps or steps[-1].get("type") != "ByteLevel" or steps[-1].get("add_prefix_space"):
        return False
    # A Split step cuts the text and keeps every piece, unless its behaviour removes the matches.
    return all(step.get("type") == "Split" and step.get("behavior") != "Removed" for step in steps[:-1])


def _post_processor_ok(state: dict) -> bool:
    steps = state.get("processors", []) if state.get("type") == "Sequence" else [state] if state else []
    for step in steps:
        if step.get("type") == "ByteLevel" and step.get("trim_offsets"):
            return False
        if step.get("type") not in ("ByteLevel", "TemplateProcessing", "BertProcessing"):
            return False  # RobertaProcessing trims offsets; anything unknown is not trusted
    return True


NORMAL_FORMS = ("NFC", "NFD", "NFKC", "NFKD")


def normal_form(tok: Any, state: dict | None = None) -> str | None:
    """The Unicode normal form ``tok``'s normalizer is ("NFC", ...), None for no normalizer or any other.

    A text already in that form (``unicodedata.is_normalized``) comes out of it unchanged. None
    too where an added token is matched on normalized text and its content is not in that form:
    the backend stores such a token normalized, by whatever normalizer is set at the time."""
    backend = tok.backend_tokenizer
    form = _state(state if state is not None else serialized_state(tok), "normalizer").get("type")
    if form not in NORMAL_FORMS:
        return None
    if any(t.normalized and not unicodedata.is_normalized(form, t.content)
           for t in backend.get_added_tokens_decoder().values()):
        return None
    return form


class ByteStarts:
    """Token start characters from byte lengths, for a tokenizer where that is exact (module docstring).

    A vocabulary token's length is looked up the first time an id is met (``id_to_token``;
    a whole ``get_vocab()`` of a 151k vocabulary costs ~0.15 s a process); a token not
    spelled in the byte-level alphabet turns the helper off for good."""

    def __init__(self, backend: Any, added: dict[int, str], size: int, nfc: bool):
        self.backend = backend
        self.nbytes = np.full(size, -1, dtype=np.int64)  # bytes each token id stands for; -1: not looked up yet
        for i, content in added.items():
            self.nbytes[i] = len(content.encode("utf-8"))
        self.nfc = nfc  # the normalizer is NFC: a text must be NFC already
        self.alphabet = _byte_alphabet()
        self.usable = True

    @classmethod
    def for_tokenizer(cls, tok: Any, state: dict | None = None) -> ByteStarts | None:
        """The helper for ``tok`` (an HF fast tokenizer), or None where byte lengths are not exact offsets.
        ``state``: the tokenizer's serialized form (:func:`serialized_state`), when the caller has it."""
        backend = tok.backend_tokenizer
        state = state if state is not None else serialized_state(tok)
        model = backend.model
        if type(model).__name__ != "BPE" or model.byte_fallback or model.unk_token or model.dropout:
            return None
        if model.continuing_subword_prefix or model.end_of_word_suffix:
            return None
        normalizer = _state(state, "normalizer").get("type")
        if normalizer not in (None, "NFC"):
            return None
        if not _pre_tokenizer_ok(_state(state, "pre_tokenizer")) or not _post_processor_ok(_state(state, "post_processor")):
            return None
        added = backend.get_added_tokens_decoder()
        if any(t.lstrip or t.rstrip or (t.normalized and not unicodedata.is_normalized("NFC", t.content))
               for t in added.values()):
            return None
        size = max(backend.get_vocab_size(with_added_tokens=True), max(added, default=-1) + 1)
        return cls(backend, {i: t.content for i, t in added.items()}, size, normalizer == "NFC")

    def _lengths(self, ids: np.ndarray) -> np.ndarray | None:
        if len(ids) and (ids.min() < 0 or ids.max() >= len(self.nbytes)):
            return None
        lengths = self.nbytes[ids]
        if (lengths < 0).any():
            for i in np.unique(ids[lengths < 0]).tolist():
                token = self.backend.id_to_token(i)
                if token is None or not set(token) <= self.alphabet:
                    self.usable = False  # not a byte-level vocabulary after all
                    return None
                self.nbytes[i] = len(token)
            lengths = self.nbytes[ids]
        return lengths

    def starts(self, ids: np.ndarray, text: str) -> np.ndarray | None:
        """The character each of ``ids`` (the tokens of ``text``) starts at; None where that is not exact here."""
        if not self.usable or (self.nfc and not text.isascii() and not unicodedata.is_normalized("NFC", text)):
            return None
        try:
            data = text.encode("utf-8")
        except UnicodeEncodeError:  # a lone surrogate: the tokenizer refuses such a text anyway
            return None
        lengths = self._lengths(ids)
        if lengths is None:
            return None
        ends = np.cumsum(lengths)
        if (ends[-1] if len(ends) else 0) != len(data):
            return None
        byte_starts = ends - lengths
        if len(data) == len(text):  # ASCII: bytes are characters
            return byte_starts
        lead = (np.frombuffer(data, dtype=np.uint8) & 0xC0) != 0x80  # the first byte of each character
        return (np.cumsum(lead) - 1)[byte_starts]
