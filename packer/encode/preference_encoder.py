"""Preference records encoded: each response as its own conversation, the tokens they share, TRL's standard format.

:class:`PreferenceEncoder` is the :class:`~packer.encode.encoder.Encoder`'s collaborator for records of several
responses (pairs, KTO, many responses): it renders and tokenizes the responses one batch of text at a time, keeps
only what each does not share with the first (:mod:`packer.encode.preference`: where the tree's prompt ends) and
drops a record that cannot fit ``max_length`` before the rest is rendered. Kept apart from the encoder, which
reads rows of every shape, because these bounds on memory and time are their own job; it uses the encoder's
tokenizer, renderers and per-chunk memo of tokenized texts.
"""

from __future__ import annotations

from typing import Any

import numpy as np

import packer.encode.preference as preference
import packer.encode.standard as standard
from packer.encode.chat import RenderedChat, marked_data, shift
from packer.encode.labels import common_chars
from packer.encode.tokens import Known
from packer.errors import BadRecord
from packer.records import Conversation, Preference
from packer.shards.schema import ResponseSpan

PREFERENCE_BATCH_BYTES = 1 << 18  # a preference record whose line times its responses is over this is rendered and
#   tokenized apart from the chunk's batch, its first response alone then this many bytes of renderings at a time
#   (each rendering repeats the prompt: all of them at once would cost the responses times the prompt)


class PreferenceEncoder:
    """The preference records of one :class:`~packer.encode.encoder.Encoder` (module docstring)."""

    def __init__(self, encoder: Any):  # the Encoder (not imported: it imports this module)
        self.encoder = encoder

    def standard_prompt(self, record: Preference, prompt: str) -> standard.Prompt:
        """The string record's prompt tokenized once (:class:`standard.Prompt`: where its tail starts, for a record of
        several responses). Drops a record whose prompt alone, with a token for each response, cannot fit
        ``max_length`` even as a tree, before any response is tokenized."""
        ids = self.standard_tokens(prompt)[0]
        need = len(ids) + len(record.responses)
        if need > self.encoder.config.max_length:
            raise BadRecord("preference_too_long", f"the prompt and {len(record.responses):,} responses take at least "
                                                   f"{need:,} tokens as a tree (pairs take more), over max_length "
                                                   f"{self.encoder.config.max_length:,}: dropped before the responses were "
                                                   f"tokenized")
        if len(record.responses) < 2:
            return standard.Prompt(prompt, ids)
        cut, shared, lead = self.encoder.text.stable_head(prompt, ids)
        return standard.Prompt(prompt, ids, cut, shared, lead)

    def standard_encode(self, texts: list[str]) -> list[tuple[np.ndarray, None]]:
        """``tok(text)`` as TRL calls it on standard-format text: special tokens added, typed ones parsed. Ids only:
        the labels follow from TRL's token count (:func:`standard.completion_start`), not from characters. At most
        ``PREFERENCE_BATCH_BYTES`` of text a call: a record of many responses repeats its prompt in each, and one
        call over all of them held every token's encoding at once (2 GB for a 100 KB prompt and 500 responses)."""
        out, batch, size = [], [], 0
        for text in texts:
            batch.append(text)
            size += len(text)
            if size >= PREFERENCE_BATCH_BYTES:
                out += self.encoder.text.encode(batch, special=True, split=self.encoder.text.split_default, offsets=False)
                batch, size = [], 0
        if batch:
            out += self.encoder.text.encode(batch, special=True, split=self.encoder.text.split_default, offsets=False)
        return out

    def standard_tokens(self, text: str) -> tuple[np.ndarray, None]:
        hit = self.encoder._memo.get(("standard", text))
        return hit if hit is not None else self.standard_encode([text])[0]

    def encode(self, record: Preference, chats: list[RenderedChat | None]):
        """Each response as its own conversation (prompt + response), one after the other, and the tokens they
        share (:mod:`packer.encode.preference`): ``(ids, trained, media, responses, prefix)``.

        The responses go through one at a time (``chats[k]`` is None when the record was too large to render whole
        in :meth:`Encoder._prepare`), keeping only what each does not share with the first; once the responses so far
        cannot fit ``max_length`` as a tree (the shorter layout), the record is dropped before the rest are
        rendered (``preference_too_long``)."""
        roles = [r.role for r in record.responses]
        n = len(roles)
        plain = chats[0] is not None and chats[0].prompt is not None  # TRL's standard format (packer.encode.standard)
        if plain:
            start = standard.completion_start(chats[0].prompt, [self.standard_tokens(c.text)[0] for c in chats])
            for chat in chats:
                chat.completion_start = start
        prompt = self._prompt_rendering(record) if n > 1 and not plain else None
        shared, media, known = preference.SharedPrefix(), [], None
        for k, role in enumerate(roles):
            if chats[k] is None:  # render (and tokenize in one call) the next responses, up to PREFERENCE_BATCH_BYTES
                known = self._render_batch(record, chats, k, known)
            chat = chats[k]
            ids, trained, spans = self.encoder._encode_conversation(record.conversation(k), chat)
            self.encoder._memo.pop(("chat", chat.text), None)
            if not trained[1:].any():
                raise BadRecord("no_trainable_tokens", f"response {role!r} has no token to train on (no assistant turn, "
                                                       f"or an empty one)")
            if k == 0:
                media = spans
            end = 0 if n == 1 else len(chat.prompt.text) - chat.prompt.cut if plain else self._prompt_end(chat, prompt)
            shared.add(ids, trained, chat.text, end, [m.start + m.length for m in spans])
            chats[k] = chat if k == 0 else None  # the first counts the prompt's clips (Encoder._finish); no other is kept
            if k < n - 1 and shared.tree_lower_bound(n) > self.encoder.config.max_length:
                raise BadRecord("preference_too_long",
                                f"the first {k + 1:,} of its {n:,} responses already take at least "
                                f"{shared.tree_lower_bound(n):,} tokens as a tree (pairs take more), over max_length "
                                f"{self.encoder.config.max_length:,}: dropped before the other responses were rendered")
        prefix = shared.prefix(roles) if n > 1 else 0
        responses, start, ids_out, trained_out = [], 0, [], []
        for k, response in enumerate(record.responses):  # stored: the shared prompt once, then each response's rest
            ids, trained = shared.response(k)
            responses.append(ResponseSpan(start, len(ids), response.role, response.weight))
            cut = prefix if k else 0
            ids_out.append(ids[cut:])
            trained_out.append(trained[cut:])
            start += len(ids)
        return np.concatenate(ids_out), np.concatenate(trained_out), media, responses, prefix

    def _render_batch(self, record: Preference, chats: list[RenderedChat | None], k: int, known: Known | None) -> Known | None:
        """Render responses ``k``, ``k + 1``, ... of ``record`` into ``chats`` until their texts reach
        ``PREFERENCE_BATCH_BYTES``, and tokenize them in one call (into the memo): a record's responses are not
        all held at once, nor tokenized one call each. The first response is tokenized whole and returned
        (``known``, None where it cannot be cut: a marked text, split special tokens); the others send the
        tokenizer only what follows the last control token they share with it (``<|im_start|>`` of the response's
        turn: :meth:`TextTokenizer.encode_sharing`), so a long prompt is tokenized once, not once per response."""
        size, texts, first = 0, [], k
        while k < len(chats) and (k == first or (first > 0 and size < PREFERENCE_BATCH_BYTES)):  # the first alone: it
            #                                                       may show the record cannot fit (:meth:`encode`)
            chats[k] = self.encoder._render(record.conversation(k))
            if not chats[k].marked:
                texts.append(chats[k].text)
            size += len(chats[k].text)
            k += 1
        try:
            if first > 0 and known is not None:
                encoded = self.encoder.text.encode_sharing(known, texts)
            else:
                encoded = self.encoder.text.encode(texts, special=False, split=self.encoder.text.split_default, offsets=True)
            for text, hit in zip(texts, encoded, strict=True):
                self.encoder._memo["chat", text] = hit
        except Exception:  # noqa: BLE001 -- each response tokenizes its own text, as in Encoder._pretokenize
            pass
        if first == 0:
            hit = self.encoder._memo.get(("chat", chats[0].text)) if not chats[0].marked else None
            text = self.encoder.text
            return text.known(chats[0].text, *hit) if hit is not None and not text.split_default else None
        return known

    def _prompt_rendering(self, record: Preference) -> str | None:
        """The prompt's turns rendered alone, where some response does not open with its trained assistant turn (an
        implicit prompt whose responses go on with a user turn, TRL's ``extract_prompt``); None otherwise."""
        if all(r.turns and r.turns[0].role == "assistant" and r.turns[0].trained for r in record.responses):
            return None
        renderer = self.encoder._renderer_for(record.tools)
        tools = marked_data(list(record.tools), renderer.mark) if record.tools else None
        return renderer.render(self.encoder._messages(Conversation(record.prompt, record.id), renderer), tools=tools) \
            if record.prompt else ""

    def _prompt_end(self, chat: RenderedChat, prompt: str | None = None) -> int:
        """Where the prompt ends in ``chat.text``: the header of the first trained turn (its start when the template
        has no generation prompt), or, where the response opens with other turns, the end of what the conversation
        shares with the prompt rendered alone (``prompt``)."""
        full, at = chat.full, min(s for s, _ in chat.spans)
        header = (self.encoder.tool_labeller if chat.tools else self.encoder.labeller).header
        h = full.rfind(header, 0, at) if header else -1
        end = h if h >= 0 else at
        if prompt is not None:
            end = min(end, common_chars(prompt, full))
        return shift(end, chat.edits)
