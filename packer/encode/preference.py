"""Where a preference record's responses stop sharing tokens: the tree's boundary. Pure numpy.

Each response ``k`` is encoded as the conversation ``prompt + response k`` alone (rendered with the
chat template, media expanded, tokenized, labelled): ``ids[k]``, ``trained[k]``. Those are the
tokens it is trained on in either layout, so nothing here changes a token; this only finds how
many leading tokens the responses share, token for token, in their own renderings -- not in a
rendering of the prompt alone: a template may render a prompt differently when a response
follows (a generation prompt, an empty ``<think>`` block it adds before the answer) and BPE may
merge a token across the prompt's end, so the prompt's own tokens are not to be trusted.

``b``, the shared length, is the longest common prefix of all ``ids[k]``, cut at the first
trained token of any response (a trained token is the response's own, never shared). The tree's
prompt is ``ids[k][:b - 1]`` and branch ``k`` is ``ids[k][b - 1:]``: each branch starts with the
last shared token, untrained, whose logits predict the response's first token inside the
branch itself, so a branch's first label is ``-100`` like every segment's and the shifted loss
never crosses a segment (one token per branch is the price).

Refused (``preference_prompt_diverges``, in either layout, so that a build can be repacked from
one layout to the other) where the responses' renderings differ in *text* before the prompt's
end (the response's header: ``prompt_ends``, characters) -- the template then renders the prompt
differently for each response and no prompt is the one every response follows; where fewer than
two tokens are shared; and where a media item of the prompt is not among the shared tokens. A
prompt whose text agrees but whose last word BPE merges with a response (``jump`` + ``ing``) is
not refused: the tokens diverge there, and each branch starts at the last token they share.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from packer.encode.labels import common_chars
from packer.errors import BadRecord


def common_prefix(ids: list[np.ndarray]) -> int:
    """Tokens every array of ``ids`` starts with."""
    n = min(len(a) for a in ids)
    same = np.ones(n, dtype=bool)
    for a in ids[1:]:
        same &= a[:n] == ids[0][:n]
    differ = np.flatnonzero(~same)
    return int(differ[0]) if len(differ) else n


def first_trained(trained: np.ndarray) -> int:
    hit = np.flatnonzero(trained)
    return int(hit[0]) if len(hit) else len(trained)


def tree_prefix(ids: list[np.ndarray], trained: list[np.ndarray], texts: list[str], prompt_ends: list[int],
                media_ends: list[int], roles: list[str]) -> int:
    """The tree prompt's length ``b - 1`` for responses ``ids`` (see the module docstring): ``texts`` are the
    renderings that were tokenized, ``prompt_ends[k]`` where response ``k``'s prompt ends in ``texts[k]``,
    ``media_ends`` the token after each media span of the responses. All at once: :class:`SharedPrefix` over them."""
    shared = SharedPrefix()
    for k, (a, t, text, end) in enumerate(zip(ids, trained, texts, prompt_ends, strict=True)):
        shared.add(a, t, text, end, media_ends if k == 0 else [])
    return shared.prefix(roles)


@dataclass
class SharedPrefix:
    """:func:`tree_prefix` over responses added one at a time with :meth:`add`.

    Response 0 is kept whole (``ids0`` / ``trained0``); response ``k > 0`` only from ``keep[k]``, the
    token before the most it can share with response 0, since a token it shares is response 0's.
    :meth:`response` gives any response back whole once the prefix is known."""

    ids0: np.ndarray | None = None
    trained0: np.ndarray | None = None
    text0: str = ""
    keep: list[int] = field(default_factory=list)
    tails: list[tuple[np.ndarray, np.ndarray]] = field(default_factory=list)
    lengths: list[int] = field(default_factory=list)
    total: int = 0  # sum(lengths)
    b: int = 0  # tokens every response so far shares, up to the first trained one
    agree: int = 0  # characters every rendering so far shares with the first
    differs: tuple[int, str] = (0, "")  # the first response whose rendering shares only ``agree`` characters, near there
    need: int = 0  # the furthest prompt end
    media_end: int = 0

    def add(self, ids: np.ndarray, trained: np.ndarray, text: str, prompt_end: int, media_ends: list[int]) -> None:
        k = len(self.lengths)
        self.need = max(self.need, prompt_end)
        self.media_end = max([self.media_end, *media_ends])
        self.lengths.append(len(ids))
        self.total += len(ids)
        if k == 0:
            self.ids0, self.trained0, self.text0 = ids, trained, text
            self.b, self.agree = first_trained(trained), len(text)
            self.keep.append(0)
            self.tails.append((ids, trained))
            return
        own = min(common_prefix([self.ids0, ids]), first_trained(trained))
        self.b = min(self.b, own)
        agree = common_chars(self.text0, text)
        if agree < self.agree:
            self.agree, self.differs = agree, (k, text[max(0, agree - 12) : agree + 12])
        keep = max(own - 1, 0)
        self.keep.append(keep)
        self.tails.append((ids[keep:].copy(), trained[keep:].copy()))  # a copy: a view would keep the whole alive

    def tree_lower_bound(self, n: int) -> int:
        """The fewest tokens the record (``n`` responses) can take as a tree, from the responses added so far."""
        p = max(self.b - 1, 0)
        return self.total - (len(self.lengths) - 1) * p + (n - len(self.lengths))

    def prefix(self, roles: list[str]) -> int:
        """What :func:`tree_prefix` gives (and refuses) for the responses added."""
        if self.agree < self.need:
            k, near = self.differs
            raise BadRecord("preference_prompt_diverges",
                            f"the responses' renderings differ at character {self.agree} of the prompt's {self.need} "
                            f"(response {roles[k]!r} against {roles[0]!r}: {near!r} / "
                            f"{self.text0[max(0, self.agree - 12) : self.agree + 12]!r}): the chat template renders the "
                            f"prompt differently for each response, so no prompt is the one every response follows; fix "
                            f"the template (or the record), or drop it")
        if self.b < 2:
            raise BadRecord("preference_prompt_diverges", f"the responses share {self.b} leading token(s): nothing to "
                                                          f"share as a prompt")
        if self.media_end > self.b - 1:
            raise BadRecord("preference_prompt_diverges", f"a media item of the prompt ends at token {self.media_end}, "
                                                          f"after the {self.b - 1} tokens the responses share")
        return self.b - 1

    def response(self, k: int) -> tuple[np.ndarray, np.ndarray]:
        """Response ``k``'s tokens and trained mask, whole."""
        ids, trained = self.tails[k]
        keep = self.keep[k]
        if keep == 0:
            return ids, trained
        return np.concatenate([self.ids0[:keep], ids]), np.concatenate([self.trained0[:keep], trained])
