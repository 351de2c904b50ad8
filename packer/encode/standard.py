"""String preference records in TRL's standard (non-chat) format, tokenized as TRL's trainers tokenize them.

A record whose prompt and responses are all strings (``{"prompt": "...", "chosen": "...", "rejected": "..."}``,
KTO's ``{"prompt", "completion", "label"}``, a list of string ``responses``) is, for TRL, *standard* data: no
chat template. ``DPOTrainer._prepare_dataset`` (and ``KTOTrainer``'s, the same steps) does, per record:

1. append ``tokenizer.eos_token`` (the string) to each response that does not already end with it;
2. ``prompt_ids = tok(prompt)`` and ``ids_k = tok(prompt + response_k)``: the tokenizer's own call, so its
   special tokens (a BOS) are added, and special tokens typed in the text (a prompt that holds a rendered
   chat, ``<|im_start|>user ...``) are parsed as those tokens -- unlike chat messages, whose typed control
   tokens packer keeps as text (:mod:`packer.encode.render`);
3. the completion starts at ``min_k common_prefix(prompt_ids, ids_k)`` (the prompt's last word may merge
   with a response's first under BPE): every token from there on is trained, the EOS included.

Worked example (a tokenizer without BOS, EOS ``<|im_end|>``)::

    prompt "Sky colour?"   chosen " Blue."   rejected " Green."
    ids_chosen   = [Sky][ colour][?][ Blue][.][<|im_end|>]      trained from token 3
    ids_rejected = [Sky][ colour][?][ Green][.][<|im_end|>]     trained from token 3

So each response's segment is ``ids_k`` with labels from that token on: the sequence and the targets
``DPOTrainer`` concatenates and scores. ``preference_strings = "chat"`` renders such records with the chat
template instead (a user turn, an assistant turn). A string record with media is refused
(``media_in_string_preference``): TRL's vision collator tokenizes prompt and response apart, with no special
tokens and no EOS, another convention; give its prompt as messages.

Those are TRL's tokens; packer gets them without tokenizing the prompt once per response where the tokenizer allows
(:class:`Prompt`, :mod:`packer.encode.stable`): the prompt's tokens up to a pre-token boundary near its end are the
same whatever follows, so only its tail is tokenized with each response.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from packer.errors import BadRecord
from packer.records import Preference


@dataclass(frozen=True)
class Prompt:
    """A string record's prompt, tokenized once: ``ids`` is ``tok(prompt)`` (TRL's ``prompt_ids``), and every
    ``tok(prompt + response)`` is ``ids[:shared]`` then ``tok(prompt[cut:] + response)[lead:]`` (``lead``: the special
    tokens the tokenizer puts before a text; :mod:`packer.encode.stable`). ``cut = 0``: the whole prompt goes with each
    response, as TRL sends it."""

    text: str
    ids: np.ndarray
    cut: int = 0
    shared: int = 0
    lead: int = 0

    def tail(self, response: str) -> str:
        """What the tokenizer is sent for ``response`` (its EOS appended)."""
        return self.text[self.cut:] + response

    def tokens(self, tail: np.ndarray) -> np.ndarray:
        """``tok(prompt + response)`` from ``tail``, the tokens of :meth:`tail`."""
        return np.concatenate([self.ids[:self.shared], tail[self.lead:]]) if self.cut else tail


def texts(record: Preference, eos_token: str | None) -> tuple[str, list[str]]:
    """(prompt, [response + EOS, ...]) of a string record, TRL's ``add_eos`` applied."""
    held = [p.kind for t in record.prompt for p in t.parts if p.kind != "text"]
    if held:
        raise BadRecord("media_in_string_preference",
                        f"the string prompt holds {len(held)} media item(s) ({', '.join(held)}): packer reads string "
                        f"records as TRL's standard (non-chat) text format; give the prompt as a list of messages with "
                        f"media parts, or set preference_strings = 'chat' (--preference-strings chat)")
    prompt = "".join(p.text for t in record.prompt for p in t.parts)
    out = []
    for r in record.responses:
        response = "".join(p.text for t in r.turns for p in t.parts)
        if eos_token and not response.endswith(eos_token):
            response += eos_token
        out.append(response)
    return prompt, out


def completion_start(prompt: Prompt, tails: list[np.ndarray]) -> int:
    """TRL's ``prompt_len``: the fewest leading tokens the prompt alone shares with any prompt + response (``tails``:
    their :meth:`Prompt.tail` tokens; the shared tokens are the prompt's own, so only the rest is compared)."""
    start, rest = len(prompt.ids), prompt.ids[prompt.shared:]
    for tail in tails:
        a = tail[prompt.lead:] if prompt.cut else tail
        n = min(len(a), len(rest))
        differ = np.flatnonzero(a[:n] != rest[:n])
        start = min(start, prompt.shared + (int(differ[0]) if len(differ) else n))
    return start
