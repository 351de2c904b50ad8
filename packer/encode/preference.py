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
one layout to the other) where the responses' renderings do not agree on every token of the
prompt -- every token that ends before the response's header (``prompt_ends``) -- since then
the prompt's tokens depend on the response and no shared prompt is the one each response is
trained after alone; and where fewer than two tokens are shared.
"""

from __future__ import annotations

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


def tree_prefix(ids: list[np.ndarray], trained: list[np.ndarray], prompt_ends: list[int], roles: list[str]) -> int:
    """The tree prompt's length ``b - 1`` for responses ``ids`` (see the module docstring); ``prompt_ends[k]``
    counts the tokens of response ``k``'s rendering that end before its first header (its prompt's tokens)."""
    shared = common_prefix(ids)
    b = min(shared, *(first_trained(t) for t in trained))
    need = max(prompt_ends)
    if b < need:
        k = next((k for k, a in enumerate(ids[1:], 1)
                  if min(len(a), len(ids[0])) <= shared or a[shared] != ids[0][shared]), 1)
        raise BadRecord("preference_prompt_diverges",
                        f"the responses' renderings differ at token {b} of the prompt's {need} (response {roles[k]!r} "
                        f"against {roles[0]!r}): the chat template renders the prompt differently for each response, so "
                        f"no prompt is the one every response follows, token for token; fix the template (or the "
                        f"record), or drop it")
    if b < 2:
        raise BadRecord("preference_prompt_diverges", f"the responses share {b} leading token(s): nothing to share as a "
                                                      f"prompt")
    return b - 1
