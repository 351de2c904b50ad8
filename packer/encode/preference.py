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

import os

import numpy as np

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
    ``media_ends`` the token after each media span of the responses."""
    agree = len(os.path.commonprefix(texts))
    need = max(prompt_ends)
    if agree < need:
        k = next((k for k, t in enumerate(texts[1:], 1) if t[agree : agree + 1] != texts[0][agree : agree + 1]), 1)
        raise BadRecord("preference_prompt_diverges",
                        f"the responses' renderings differ at character {agree} of the prompt's {need} (response "
                        f"{roles[k]!r} against {roles[0]!r}: {texts[k][max(0, agree - 12) : agree + 12]!r} / "
                        f"{texts[0][max(0, agree - 12) : agree + 12]!r}): the chat template renders the prompt differently "
                        f"for each response, so no prompt is the one every response follows; fix the template (or the "
                        f"record), or drop it")
    b = min(common_prefix(ids), *(first_trained(t) for t in trained))
    if b < 2:
        raise BadRecord("preference_prompt_diverges", f"the responses share {b} leading token(s): nothing to share as a "
                                                      f"prompt")
    if media_ends and max(media_ends) > b - 1:
        raise BadRecord("preference_prompt_diverges", f"a media item of the prompt ends at token {max(media_ends)}, after "
                                                      f"the {b - 1} tokens the responses share")
    return b - 1
