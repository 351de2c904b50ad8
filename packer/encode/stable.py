"""How much of a text's tokens no continuation can change: the part of a prompt every ``tok(prompt + response)`` shares.

TRL tokenizes a string (standard-format) preference record as ``tok(prompt + response)`` for each response, in one
call (:mod:`packer.encode.standard`): BPE may merge the prompt's last word with the response's first characters, so
the prompt's own tokens are not the answer. Tokenized whole, a 100 KB prompt with 500 responses costs the tokenizer
500 prompts. For a tokenizer whose tokens cannot cross a boundary that the prompt alone already fixes, only the
prompt's tail from that boundary needs tokenizing with each response, and the tokens before it are the prompt's.

The tokenizer's pipeline, for ``T = prompt + response`` cut at character ``c`` of the prompt:

1. added tokens are taken out of the raw text first (leftmost-longest); ``c`` is past the last one in the prompt and
   at least the longest added token before the prompt's end, so ``T`` holds no added token that starts before ``c``
   or spans it, and no flag (``lstrip`` / ``rstrip`` / ``single_word`` / ``normalized``) reaches across it: every
   added token of the tokenizer has none;
2. the normalizer is none or NFC, and ``prompt[c]`` cannot combine with what precedes it (NFC of the two halves is
   NFC of the whole);
3. the pre-tokenizer is one of the regex splits known to decide a boundary from the text before it and a bounded
   look past it (GPT-2's ByteLevel regex; Qwen2's and Llama 3's ``Split``; their alternatives are runs of one
   character class, no lookbehind, no anchor, one ``(?!\\S)``): ``c`` is the start of the prompt's second-to-last
   pre-token, so the whole pre-token after ``c`` ends inside the prompt and no match attempt before ``c`` read as
   far as the prompt's end. "No lookbehind" alone is not enough: ``a+b|a`` splits ``aaaa`` into four and ``aaaab``
   into one;
4. the model (BPE, no dropout) works on each pre-token alone, and the post-processor adds the same special tokens
   around any text (a BOS before it: ``lead`` of them).

So ``tok(prompt + response) = tok(prompt)[:lead + j] + tok(prompt[c:] + response)[lead:]``, ``j`` the prompt's
tokens before ``c``. Any other tokenizer (SentencePiece without a pre-tokenizer: Llama 2, Gemma; a ``Metaspace``
or a normalizer that prepends) gets ``c = 0``: each response is tokenized with the whole prompt, exact and
quadratic. ``tests/test_preference_strings.py`` compares both routes on adversarial texts with two tokenizers.
"""

from __future__ import annotations

import unicodedata
from typing import Any

import numpy as np

GPT2 = "GPT-2"  # the regex ByteLevel(use_regex=True) splits by
KNOWN_SPLITS = {  # Split patterns whose alternatives are runs of a character class (module docstring, point 3)
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+",  # Qwen2
    # Llama 3
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+",
}


def regex_split(state: dict) -> bool:
    """Whether the serialized tokenizer's pre-tokenizer is exactly one known regex split, byte-mapped, no prefix space."""
    pre = state.get("pre_tokenizer") or {}
    steps = pre.get("pretokenizers", []) if pre.get("type") == "Sequence" else [pre]
    splits = 0
    for step in steps:
        kind = step.get("type")
        if kind == "ByteLevel" and not step.get("add_prefix_space"):
            splits += bool(step.get("use_regex", True))
        elif kind == "Split" and step.get("behavior") == "Isolated" and not step.get("invert") \
                and (step.get("pattern") or {}).get("Regex") in KNOWN_SPLITS:
            splits += 1
        else:
            return False
    return splits == 1


def cuttable(state: dict, backend: Any, split_special: bool) -> bool:
    """Whether a prompt's tokens can be cut for this tokenizer at all (module docstring, points 1-4)."""
    normalizer = state.get("normalizer")
    if normalizer is not None and normalizer.get("type") != "NFC":
        return False
    if split_special or not regex_split(state):
        return False
    model = backend.model
    if type(model).__name__ != "BPE" or getattr(model, "dropout", None):
        return False
    return not any(a.lstrip or a.rstrip or a.single_word or a.normalized for a in backend.get_added_tokens_decoder().values())


def stable_start(left: str, ch: str, nfc: bool) -> bool:
    """Whether NFC cannot join ``ch`` to the ``left`` character before it (no normalizer: always)."""
    if not nfc or ch.isascii():
        return True
    if unicodedata.combining(ch) or not unicodedata.is_normalized("NFC", ch):
        return False
    return unicodedata.normalize("NFC", left + ch) == unicodedata.normalize("NFC", left) + ch


def cut(backend: Any, prompt: str, ids: np.ndarray, starts: np.ndarray, added: dict[int, str], longest: int,
        nfc: bool, tries: int = 64) -> tuple[int, int]:
    """``(c, j)``: the prompt's characters and tokens (``ids`` / ``starts``: ``tok(prompt)`` without special tokens,
    with each token's start character) that every ``tok(prompt + response)`` begins with; ``(0, 0)`` where no cut is
    known to hold. ``backend`` is a tokenizer :func:`cuttable` accepts; ``added`` its added tokens' contents."""
    last = np.flatnonzero(np.isin(ids, list(added))) if added else np.zeros(0, np.int64)
    a = int(starts[last[-1]]) + len(added[int(ids[last[-1]])]) if len(last) else 0  # past the last added token
    rest = prompt[a:]
    if nfc:
        rest = unicodedata.normalize("NFC", rest)
    pieces = backend.pre_tokenizer.pre_tokenize_str(rest)
    for k in range(len(pieces) - 2, max(len(pieces) - 2 - tries, 0), -1):  # a whole pre-token after the cut
        c = len(prompt) - (len(rest) - pieces[k][1][0])
        if c > len(prompt) - longest:
            continue
        if c <= a or prompt[c:] != rest[pieces[k][1][0]:]:
            return 0, 0
        if not (stable_start(prompt[c - 1], prompt[c], nfc) and (not nfc or unicodedata.is_normalized("NFC", prompt[c:]))):
            continue
        j = int(np.searchsorted(starts, c))
        return (c, j) if j < len(starts) and starts[j] == c else (0, 0)
    return 0, 0
