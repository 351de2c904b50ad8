"""Token ids and the character each token starts at, for many texts at once.

The HF call (``tok(texts, return_offsets_mapping=True)``) pays ~40 µs a text to turn the Rust
encodings into Python dicts and ~20% of the encode to track offsets; stage 1 asks the Rust
backend's batch call directly and gets token starts from byte lengths where that is exact
(:class:`~packer.encode.offsets.ByteStarts`). It works on a **private copy** of the backend
(``Tokenizer.from_str(backend.to_str())``), whose flags it sets per call (split special tokens
or not; Qwen2's NFC normalizer skipped for texts already in NFC): the user's tokenizer is never
touched. The copy has no truncation or padding, as the HF call has none when it is not asked for.

A text holding transformers' control-token markers (a message that typed ``<|im_end|>``, see
:mod:`packer.encode.render`) is encoded as ``encode_marked_chat`` encodes it: cut at the
markers, each marked token as plain text, each piece apart (after a ``\\n`` that is then dropped,
transformers' trick against SentencePiece's prefix space).

Texts that begin alike (a preference record's renderings: the prompt, then each response) share the tokens
before a control token they share (:meth:`TextTokenizer.encode_sharing`): the tokenizer takes its added tokens
out of the text first (leftmost-longest, before normalizing and pre-tokenizing), and encodes the pieces between
them each on its own, so ``text`` encodes as ``text[:c]`` then ``text[c:]`` where such a token starts at ``c``.
Only the rest is sent to the tokenizer: a record's cost is its bytes, not its responses times its prompt.
"""

from __future__ import annotations

import bisect
import re
import unicodedata
from dataclasses import dataclass
from typing import Any

import numpy as np

from packer.encode import stable
from packer.encode.offsets import ByteStarts, normal_form, serialized_state
from packer.encode.render import MARK_END, MARK_START


@dataclass(frozen=True)
class Known:
    """A text and its tokens, whose tokens up to a control token other texts share are theirs too
    (:meth:`TextTokenizer.encode_sharing`). ``cuts``: the characters where a token a text may be cut before
    starts, ascending; ``at``: its index in ``ids``."""

    text: str
    ids: np.ndarray
    starts: np.ndarray
    cuts: list[int]
    at: list[int]


def token_starts(offsets) -> np.ndarray:
    """The start character of each token, from the fast tokenizer's ``(start, end)`` offsets."""
    return np.fromiter((s for s, _ in offsets), dtype=np.int64, count=len(offsets))


class TextTokenizer:
    """Batch encodings of one tokenizer (see the module docstring)."""

    def __init__(self, tok: Any, serialized: str | None = None):
        from tokenizers import Tokenizer

        serialized = serialized if serialized is not None else tok.backend_tokenizer.to_str()
        self.state = serialized_state(tok, serialized)
        self.backend = Tokenizer.from_str(serialized)  # private: its flags are this object's to set
        self.backend.no_truncation()
        self.backend.no_padding()
        self.split_default = bool(tok.split_special_tokens)
        self.byte_starts = ByteStarts.for_tokenizer(tok, self.state)  # None: starts come from offsets
        self.normal_form = normal_form(tok, self.state)  # None: every text goes through the normalizer
        self.normalizer = self.backend.normalizer
        # a marked span: a control token, or text the tokenizer's normalizer turns into one (＜|im_start|＞ under NFKC)
        self._markers = re.compile(f"{MARK_START}([^{MARK_START}{MARK_END}]+){MARK_END}|[{MARK_START}{MARK_END}]")
        self._control_ids = {t for t, a in tok.added_tokens_decoder.items()}
        self._newline = self._rust(["\n"], special=False, split=False, offsets=False)[0].ids
        added = self.backend.get_added_tokens_decoder()
        # a text is cut before an added token matched in the raw text (not normalized) that takes nothing to its
        # left (lstrip) and matches whatever precedes it (single_word): the pieces on either side are encoded apart
        self._cut_before = {i for i, a in added.items() if not (a.normalized or a.lstrip or a.single_word)}
        self._longest_added = max((len(a.content) for a in added.values()), default=0)
        self._added = {i: a.content for i, a in added.items()}
        self._cuttable = stable.cuttable(self.state, self.backend, self.split_default)

    # ------------------------------------------------------------ batches

    def encode(self, texts: list[str], *, special: bool, split: bool,
               offsets: bool) -> list[tuple[np.ndarray, np.ndarray | None]]:
        """``(ids, start character of each token)`` of each text (starts None unless ``offsets``), equal to
        ``tok(text, add_special_tokens=special, split_special_tokens=split)``."""
        if not offsets or self.byte_starts is None:
            return [(np.array(e.ids, dtype=np.int32), token_starts(e.offsets) if offsets else None)
                    for e in self._rust(texts, special=special, split=split, offsets=offsets)]
        out = []
        for text, e in zip(texts, self._rust(texts, special=special, split=split, offsets=False), strict=True):
            ids = np.array(e.ids, dtype=np.int32)
            out.append((ids, self.byte_starts.starts(ids, text)))
        redo = [k for k, (_, starts) in enumerate(out) if starts is None]  # not exact from bytes: real offsets
        for k, e in zip(redo, self._rust([texts[k] for k in redo], special=special, split=split, offsets=True), strict=True):
            out[k] = (np.array(e.ids, dtype=np.int32), token_starts(e.offsets))
        return out

    def known(self, text: str, ids: np.ndarray, starts: np.ndarray) -> Known:
        """``text`` with its tokens (``encode([text], special=False, split=False, offsets=True)``), for
        :meth:`encode_sharing`."""
        at = np.flatnonzero(np.isin(ids, list(self._cut_before))).tolist() if self._cut_before else []
        return Known(text, ids, starts, starts[at].tolist(), at)

    def encode_sharing(self, known: Known, texts: list[str]) -> list[tuple[np.ndarray, np.ndarray]]:
        """``encode(texts, special=False, split=False, offsets=True)``, sending the tokenizer only what each text
        has after the last cut token (see :class:`Known`) it shares with ``known.text``: the tokens before it are
        ``known``'s.

        Exact: the tokenizer finds added tokens leftmost-longest, each match decided by the text up to its start
        plus the longest added token, so a text that agrees with ``known.text`` that far past a cut token's start
        ``c`` holds that token at ``c`` too; the text before ``c`` (normalized, pre-tokenized, encoded without it)
        and the text from ``c`` on are then encoded apart, and with no special tokens added nothing else joins
        them. A text sharing no cut token is encoded whole."""
        from packer.encode.labels import common_chars

        cut, rest = [], []
        for text in texts:
            reach = common_chars(known.text, text) - self._longest_added  # a cut token starting up to here is text's
            n = bisect.bisect_right(known.cuts, reach)
            cut.append((known.cuts[n - 1], known.at[n - 1]) if n else (0, 0))
            rest.append(text[cut[-1][0]:])
        out = []
        for (c, j), (ids, starts) in zip(cut, self.encode(rest, special=False, split=False, offsets=True), strict=True):
            out.append((np.concatenate([known.ids[:j], ids]), np.concatenate([known.starts[:j], starts + c])))
        return out

    def stable_head(self, text: str, special_ids: np.ndarray) -> tuple[int, int, int]:
        """``(c, n, lead)`` such that, for any ``x``, ``encode([text + x], special=True, split=False)`` is
        ``special_ids[:n]`` then ``encode([text[c:] + x], special=True, split=False)`` from its ``lead``-th token on;
        ``special_ids`` is ``text``'s own (special tokens added). ``(0, 0, 0)`` where this tokenizer, or this text,
        gives no such cut (:mod:`packer.encode.stable`)."""
        if not self._cuttable:
            return 0, 0, 0
        (ids, starts), = self.encode([text], special=False, split=False, offsets=True)
        lead = [k for k in range(len(special_ids) - len(ids) + 1) if np.array_equal(special_ids[k:k + len(ids)], ids)]
        if len(lead) != 1:  # the special tokens around a text are not told apart from it
            return 0, 0, 0
        c, j = stable.cut(self.backend, text, ids, starts, self._added, self._longest_added, self.normal_form == "NFC")
        return (c, lead[0] + j, lead[0]) if c else (0, 0, 0)

    def _rust(self, texts: list[str], *, special: bool, split: bool, offsets: bool) -> list:
        """The backend's encodings of ``texts`` in order (``encode_batch_fast`` unless ``offsets``). A
        normalizer that is one Unicode normal form leaves a text already in that form as it is, so such
        texts (ASCII always) skip it: the same ids and offsets, ~10% less encode for Qwen2's NFC."""
        backend = self.backend
        backend.encode_special_tokens = split
        run = backend.encode_batch if offsets else backend.encode_batch_fast
        form = self.normal_form
        plain = [t.isascii() or unicodedata.is_normalized(form, t) for t in texts] if form else []
        if not any(plain):
            return run(texts, add_special_tokens=special)
        backend.normalizer = None
        try:
            skipped = iter(run([t for t, p in zip(texts, plain, strict=True) if p], add_special_tokens=special))
        finally:
            backend.normalizer = self.normalizer
        rest = iter(run([t for t, p in zip(texts, plain, strict=True) if not p], add_special_tokens=special)
                    if not all(plain) else ())
        return [next(skipped) if p else next(rest) for p in plain]

    # ------------------------------------------------------------ marked chats

    def encode_marked(self, text: str) -> tuple[np.ndarray, np.ndarray]:
        """Ids and token starts (characters of ``text``, markers included) of a chat rendered from marked
        messages, as ``transformers.utils.chat_template_utils.encode_marked_chat`` encodes it. A marked
        token the tokenizer produces from plain text too cannot be sanitized: ``ValueError``."""
        pieces: list[tuple[int, str, bool]] = []  # (start char, text, as plain text)
        cursor = 0
        for m in self._markers.finditer(text):
            pieces.append((cursor, text[cursor:m.start()], False))
            if m.group(1):
                pieces.append((m.start(1), m.group(1), True))
            cursor = m.end()
        pieces.append((cursor, text[cursor:], False))
        ids_parts, start_parts = [], []
        for k, (at, piece, as_text) in enumerate(pieces):
            if not piece:
                continue
            split = as_text or self.split_default  # a marked token as plain text, the rest as the tokenizer does
            if k == 0:
                ids, starts = self._offsets(piece, split=split)
            else:
                ids, starts = self._offsets("\n" + piece, split=split)
                n = len(self._newline)
                if ids[:n].tolist() == self._newline:
                    ids, starts = ids[n:], starts[n:] - 1
                else:
                    ids, starts = self._offsets(piece, split=split)
            if as_text:
                made = [i for i in ids.tolist() if i in self._control_ids]
                if made:
                    raise ValueError(f"cannot encode {piece!r} as plain text: the tokenizer produces "
                                     f"{self.backend.id_to_token(made[0])!r} from plain text")
            ids_parts.append(ids)
            start_parts.append(starts + at)
        if not ids_parts:
            return np.zeros(0, np.int32), np.zeros(0, np.int64)
        return np.concatenate(ids_parts).astype(np.int32), np.concatenate(start_parts)

    def _offsets(self, text: str, *, split: bool) -> tuple[np.ndarray, np.ndarray]:
        e = self._rust([text], special=False, split=split, offsets=True)[0]
        return np.array(e.ids, dtype=np.int32), token_starts(e.offsets)
