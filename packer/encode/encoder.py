"""Encode raw JSONL lines into :class:`~packer.shards.schema.Sample` rows, or BadRecord.

The :class:`Encoder` is built once per worker process from a small picklable
:class:`~packer.encode.spec.EncoderSpec` (the build config, the media root and the resolved model family), so the
local and the Ray engine construct it the same way.

A conversation goes through the steps its model's processor takes:

1. render: the chat template over the record's messages (:mod:`packer.encode.render`), control
   tokens typed in the data marked so they stay text; media parts as ``{"type": "image"}``
   content parts (a structured family) or as their placeholder token in the text (generic);
2. expand: every media token the rendering holds becomes the family's expansion of that item
   (:mod:`packer.encode.expand`, :mod:`packer.families`: probed from the file's header), its runs of
   placeholders written as one token each;
3. tokenize: a whole chunk of records in one call (:mod:`packer.encode.tokens`);
4. finish: labels from the assistant spans (:mod:`packer.encode.labels`), every run widened to
   its count, media spans recorded, checks (:mod:`packer.encode.expand`).

Per record the HF tokenizer call costs ~160 µs of wrapper on top of the Rust encode (Qwen2
vocabulary, ~160-token chats, measured on 2 shared cores); batched, that overhead is paid once
per chunk of ``TOKENIZE_BATCH`` records (fewer where their texts reach ``TOKENIZE_BATCH_BYTES``: a
call's encodings are held at once, ~40 bytes a character). Everything that can fail for one record stays per
record, so a bad record is quarantined alone; if a batched tokenizer call itself raises, the
chunk's records are tokenized one by one instead. The tokens are the same either way
(``tests/test_stage1_speed.py``).
"""

from __future__ import annotations

import functools
import hashlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

import packer.encode.standard as standard
from packer.encode.chat import RenderedChat, marked_data, render_tools, shift, template_messages
from packer.encode.expand import MEDIA_ORDER, MediaExpander, defaults
from packer.encode.labels import Labeller, span_mask
from packer.encode.preference_encoder import PREFERENCE_BATCH_BYTES, PreferenceEncoder
from packer.encode.render import Renderer, probe_conversations, template_clock, template_source
from packer.encode.shipped import unpack
from packer.encode.spec import EncoderSpec
from packer.encode.tokenizer import add_tokens, fingerprint, missing_tokens, open_tokenizer, require_tokens
from packer.encode.tokens import TextTokenizer
from packer.errors import BadRecord, PackerError
from packer.families import Family, Run, make_family
from packer.ingest.formats import decode_json, parse_record, record_id
from packer.io import blobs, fs
from packer.media import refs
from packer.records import Conversation, Document, Preference, RawLine
from packer.shards.schema import IGNORE, MediaSpan, Sample

TOKENIZE_BATCH = 1000  # texts per tokenizer call: the wrapper's cost is paid per call, memory grows with the batch
PREFETCH_RECORDS = 256  # records whose remote media are read ahead together (their bodies held until probed)
TOKENIZE_BATCH_BYTES = 1 << 21  # and characters of text per chunk: the encodings of one call are held together
#   (~40 bytes a character with offsets: 500 pair records of a 100 KB prompt held 4.3 GB in one chunk)


def _reraise(e: Exception) -> BadRecord:
    raise e


LOAD_ONLY_KWARGS = ("local_files_only", "is_local")  # how this copy was loaded (HF_HUB_OFFLINE=1 sets the first):
#   from_pretrained sets both anew on every load, so they say nothing of the tokenizer


class Encoder:
    def __init__(self, spec: EncoderSpec):
        self.spec = spec
        config = spec.config
        self.config = config
        self.family: Family = Family.from_record(spec.family) if spec.family else make_family(config)
        self.tags = spec.tags
        folder, template = unpack(spec.shipped) if spec.shipped is not None else (None, None)
        self.tok = open_tokenizer(folder or spec.tokenizer)
        self.unchosen: set[str] = set()  # generic kinds left at defaults nobody chose, for a tokenizer without media tokens
        if self.family.structured:  # a named family: the model's tokenizer already holds its tokens
            require_tokens(self.tok, spec.tokenizer, self.family.special_tokens(), self.family.name, config.processor)
        else:
            wanted = self.family.special_tokens()
            if len(missing_tokens(self.tok, wanted)) == len(wanted):  # not one media token: a text-only tokenizer
                self.unchosen = {k for k in self.family.run_tokens() if defaults(config, k)}
            add_tokens(self.tok, self.family.special_tokens())  # what the pipeline chose: its tokens join the tokenizer
        self.serialized = self.tok.backend_tokenizer.to_str()
        self.text = TextTokenizer(self.tok, self.serialized)
        self.media = MediaExpander(config, self.family, self.tok, spec.tokenizer, self.unchosen, spec.media_base)
        self.clips_cut = 0  # clips of the encoded samples cut to the audio encoder's window (audio_truncated)
        self.renderer: Renderer | None = None
        self.labeller: Labeller | None = None
        # a record with tools: the template transformers picks for it (a tokenizer's ``tool_use``; else the same)
        self.tool_renderer: Renderer | None = None
        self.tool_labeller: Labeller | None = None
        if self.tok.chat_template:
            probes = probe_conversations(self.family.kinds if self.family.structured else ())
            make = functools.partial(Renderer, self.tok, template or config.chat_template,
                                     template_clock(config.template_time), max_steps=config.template_max_steps,
                                     max_chars=config.template_max_chars)
            self.renderer = make()
            self.renderer.check(probes)
            self.labeller = Labeller(self.renderer)
            self.tool_renderer, self.tool_labeller = self.renderer, self.labeller
            if template_source(self.tok, self.renderer.name, tools=True) != self.renderer.source:
                self.tool_renderer = make(tools=True)
                self.tool_renderer.check(probes)
                self.tool_labeller = Labeller(self.tool_renderer)
        self._memo: dict = {}  # texts tokenized in a batch, for the records of one encode_lines call
        self._ahead = None  # the read-ahead thread (_read_ahead), made when a task has remote media
        self._remote = False  # records that may name remote media were met (_prefetch)
        self.preference = PreferenceEncoder(self)  # records of several responses

    @property
    def placeholder_ids(self) -> dict[str, int]:
        """kind -> the id its placeholder runs are made of."""
        return self.media.placeholder_ids

    def content_changed(self) -> dict[str, int]:
        """Counts of text encoded otherwise than it was written (report.json ``accounting.content_changed``):
        control tokens typed in a message and encoded as text (``control_tokens_as_text``, counted per rendering, so
        a preference record's prompt once per response)."""
        used = {id(r): r for r in (self.renderer, self.tool_renderer) if r is not None}
        return {"control_tokens_as_text": sum(r.sanitized for r in used.values())}

    def shipped_tokenizer(self):
        """The tokenizer with exactly the chat templates the build renders with (a --chat-template file's or a named
        one's text as its only template; ``default`` and ``tool_use`` where records with tools rendered with the
        tokenizer's ``tool_use``), as ``OUT/tokenizer`` ships it, so it renders what the shards hold; without
        the init kwargs that only say how it was loaded (:data:`LOAD_ONLY_KWARGS`), so ``OUT/tokenizer`` (and the
        hash of it) is the same whether the build ran with HF_HUB_OFFLINE or not, from a folder or a hub id."""
        import copy

        tok = copy.copy(self.tok)  # shallow: the encoder's tokenizer keeps its own templates and init kwargs
        tok.init_kwargs = {k: v for k, v in tok.init_kwargs.items() if k not in LOAD_ONLY_KWARGS}
        renderer, tool = self.renderer, self.tool_renderer
        if renderer is not None:  # ``default`` and ``tool_use`` where records with tools rendered with the latter, so
            # apply_chat_template on OUT/tokenizer picks between them as the build did
            used = renderer.source if tool is None or tool is renderer else {"default": renderer.source,
                                                                             "tool_use": tool.source}
            if tok.chat_template != used:
                tok.chat_template = used
        return tok

    def fingerprint(self) -> dict:
        """The manifest's ``tokenizer`` record. Its ``sha256`` covers the tokenizer as shipped (the template rendered
        with, not templates it left unused), so ``packer verify --deep`` re-derives it from ``OUT/tokenizer``."""
        out = fingerprint(self.shipped_tokenizer(), self.spec.tokenizer, self.family.special_tokens(), self.serialized)
        out["family"] = self.family.record()
        out["chat_template"] = self.config.chat_template
        out["template_time"] = template_clock(self.config.template_time).isoformat()
        out["fast_render"] = bool(self.renderer and self.renderer.compiled is not None
                                  and self.tool_renderer.compiled is not None)
        if self.renderer is not None:  # the template rendered (a --chat-template file's content, not its name)
            out["chat_template_sha256"] = hashlib.sha256(self.renderer.source.encode()).hexdigest()
            if self.tool_renderer is not self.renderer:  # records with tools render with the tokenizer's tool_use
                out["tool_template_sha256"] = hashlib.sha256(self.tool_renderer.source.encode()).hexdigest()
            if self.renderer.randomized or self.tool_renderer.randomized:
                out["template_random"] = "seeded per rendering from sha256 of its messages"
        return out

    # ------------------------------------------------------------------ batches

    def encode_line(self, raw: RawLine, file: str, file_dir: Path | str, source_index: int = 0) -> Sample:
        """Encode one line of ``file``; ``file`` (as displayed) and ``raw.line`` name it. Raises what it meets."""
        return self._finish(raw, file, source_index, *self._prepare(raw, file_dir))

    def encode_lines(self, raws: list[RawLine], file: str, file_dir: Path | str, source_index: int = 0,
                     failure: Callable[[Exception], BadRecord] = _reraise) -> list[Sample | BadRecord]:
        """Encode lines of ``file`` together (one tokenizer call per kind), each result a Sample or a BadRecord.

        ``failure`` turns an exception met by one record into that record's BadRecord (or raises it, to
        stop the task); stage 1 passes its quarantine classifier. Results are in input order and equal to
        :meth:`encode_line` on each line. Lines go through in chunks of at most ``TOKENIZE_BATCH`` records and
        ``TOKENIZE_BATCH_BYTES`` characters of text to tokenize (a chunk closes after the record that reaches it),
        so the tokens waiting for their records never outgrow one chunk."""
        results: list[Sample | BadRecord] = []
        while len(results) < len(raws):
            results += self._encode_chunk(raws[len(results) : len(results) + TOKENIZE_BATCH], file, file_dir,
                                          source_index, failure)
        return results

    def _encode_chunk(self, raws: list[RawLine], file: str, file_dir: Path | str, source_index: int,
                      failure: Callable[[Exception], BadRecord]) -> list[Sample | BadRecord]:
        """The first records of ``raws`` whose texts reach ``TOKENIZE_BATCH_BYTES`` (all of them when they do not),
        prepared, tokenized in one call per kind and finished: their results, in order."""
        results: list[Any] = []
        prepared: list[Any] = []
        size, held, ahead = 0, [], None
        keep = getattr(self.config, "media", "auto") == "embed"  # the task embeds them: its bodies stay until written
        for j, raw in enumerate(raws):
            if size >= TOKENIZE_BATCH_BYTES:
                break
            if j % PREFETCH_RECORDS == 0:  # these records' remote media, read many at once (while the records before
                # them were prepared), then probed from memory; the next ones' read meanwhile
                blobs.STORE.release_urls([] if keep else held, keep_facts=True)
                held = ahead.result() if ahead is not None else self._prefetch(raws[j : j + PREFETCH_RECORDS], file_dir)
                following = raws[j + PREFETCH_RECORDS : j + 2 * PREFETCH_RECORDS]
                ahead = self._read_ahead().submit(self._prefetch, following, file_dir) \
                    if following and self._remote else None
            try:
                prepared.append(self._prepare(raw, file_dir))
                results.append(None)
                size += _text_size(prepared[-1])
            except Exception as e:  # noqa: BLE001 -- classified (or re-raised) by ``failure``
                prepared.append(None)
                results.append(failure(e))
        if ahead is not None:  # the chunk closed early (its text reached TOKENIZE_BATCH_BYTES)
            held += ahead.result()
        blobs.STORE.release_urls([] if keep else held, keep_facts=True)
        self._pretokenize([p for p in prepared if p is not None])
        try:
            for j, raw in enumerate(raws[: len(prepared)]):
                if prepared[j] is None:
                    continue
                try:
                    results[j] = self._finish(raw, file, source_index, *prepared[j])
                except Exception as e:  # noqa: BLE001 -- classified (or re-raised) by ``failure``
                    results[j] = failure(e)
        finally:
            self._memo = {}
        return results

    def _read_ahead(self):
        """The one thread that reads the next records' remote media while these are prepared."""
        if self._ahead is None:
            from concurrent.futures import ThreadPoolExecutor

            self._ahead = ThreadPoolExecutor(1, thread_name_prefix="packer-read-ahead")
        return self._ahead

    def _prefetch(self, raws: list[RawLine], file_dir: Path | str) -> list[str]:
        """Read the remote media (s3://, http(s)://) of ``raws`` many at once (:meth:`MediaProber.prefetch`), so that
        their probes, one record at a time, wait on no round trip: with 30 ms per request, probing 1,000 images one
        by one waits ~10 requests each. The records are parsed for it only where they may name remote media (the
        dataset is remote, or a line holds ``://``); a record that fails here fails again, named, when prepared."""
        base = refs.record_base(self.config.media_root, file_dir)
        if not fs.is_remote_media(base) and not any(b"://" in raw.data for raw in raws):
            return []
        self._remote = True  # this worker's records may name remote media: read the next ones ahead too
        parts = []
        for raw in raws:
            if raw.error is not None or raw.too_long:
                continue
            try:
                obj = raw.record if raw.record is not None else decode_json(raw.data)
                record = parse_record(obj, self.config.format, base, self.tags,
                                      allow_outside_root=self.config.allow_outside_media_root)
            except Exception:  # noqa: BLE001 -- met again, and quarantined, by _prepare
                continue
            if isinstance(record, Preference):
                record = record.conversation(0)
            if isinstance(record, Conversation):
                parts += record.media
        return self.media.prober.prefetch(parts, whole=getattr(self.config, "media", "auto") == "embed")

    def _pretokenize(self, prepared: list[tuple]) -> None:
        """Tokenize every prepared record's text in one call per kind, into ``self._memo``.

        A batch that raises leaves the memo empty for its kind: each record then tokenizes its own text
        in :meth:`_finish`, so the failure (if it is one record's) stays that record's."""
        docs = list(dict.fromkeys(rec.text for _, rec, _ in prepared if isinstance(rec, Document)))
        rendered = [c for _, _, chat in prepared for c in (chat if isinstance(chat, list) else [chat])]
        chats = list(dict.fromkeys(c.text for c in rendered if c is not None and not c.marked and c.prompt is None))
        plain = list(dict.fromkeys(c.text for c in rendered if c is not None and c.prompt is not None))  # the prompt's
        #   tokens are known (standard.Prompt): each response's text from where they stop
        memo: dict = {}
        try:  # a chunk holds at most TOKENIZE_BATCH records: one call per kind
            for text, (ids, _) in zip(docs, self.text.encode(docs, special=True, split=True, offsets=False), strict=True):
                memo["doc", text] = ids
        except Exception:  # noqa: BLE001 -- per record below
            pass
        try:
            encoded = self.text.encode(chats, special=False, split=self.text.split_default, offsets=True)
            for text, hit in zip(chats, encoded, strict=True):
                memo["chat", text] = hit
        except Exception:  # noqa: BLE001 -- per record below
            pass
        try:
            for text, hit in zip(plain, self.preference.standard_encode(plain), strict=True):
                memo["standard", text] = hit
        except Exception:  # noqa: BLE001 -- per record below
            pass
        self._memo = memo

    # ------------------------------------------------------------------ one record

    def _prepare(self, raw: RawLine, file_dir: Path | str) -> tuple[dict, Conversation | Document | Preference,
                                                                      RenderedChat | list[RenderedChat] | None]:
        """Everything before tokenizing: parse, check, render the chat template, expand the media (a preference
        record: each response's conversation, prompt + response, rendered on its own)."""
        if raw.error is not None:  # a row / tar sample the reader could not make a record of
            raise raw.error
        if raw.too_long:
            raise BadRecord("line_too_long", f"the line has {raw.too_long:,} bytes, over the max_line_bytes limit")
        obj = raw.record if raw.record is not None else decode_json(raw.data)
        record = parse_record(obj, self.config.format, refs.record_base(self.config.media_root, file_dir), self.tags,
                              allow_outside_root=self.config.allow_outside_media_root)
        if isinstance(record, Document):
            return obj, record, None
        if isinstance(record, Preference):
            if self.config.preference == "none":
                raise BadRecord("preference_record", f"a preference / multi-response record ({len(record.responses)} "
                                                     f"response(s)); this build packs SFT records only: pass --preference "
                                                     f"pairs or tree to pack it with its roles")
            if record.strings and self.config.preference_strings == "standard":  # TRL's standard format
                text, responses = standard.texts(record, self.tok.eos_token)
                prompt = self.preference.standard_prompt(record, text)
                return obj, record, [RenderedChat(t, t, [], "standard", [], set(), False, prompt=prompt)
                                     for t in map(prompt.tail, responses)]
            self.media.check_modalities(record.conversation(0))  # the media are the prompt's, the same in every response
            if len(raw.data) * len(record.responses) > PREFERENCE_BATCH_BYTES:  # rendered one by one, when encoded
                return obj, record, [None] * len(record.responses)
            return obj, record, [self._render(record.conversation(k)) for k in range(len(record.responses))]
        self.media.check_modalities(record)
        return obj, record, self._render(record)

    def _render(self, conv: Conversation) -> RenderedChat:
        if self.renderer is None:
            raise PackerError("the tokenizer has no chat template, so conversations cannot be rendered; use a chat "
                              "tokenizer or set one in its tokenizer_config.json / chat_template.jinja")
        renderer = self._renderer_for(conv.tools)
        sanitized, typed = renderer.sanitized, renderer.markers_typed
        messages = self._messages(conv, renderer)
        tools = marked_data(list(conv.tools), renderer.mark) if conv.tools else None
        marked = renderer.sanitized > sanitized
        if marked and renderer.markers_typed > typed:
            raise BadRecord("private_marker_in_text",
                            f"the record types {renderer.markers_typed - typed} U+F0000 / U+F0001 character(s) and "
                            f"{renderer.sanitized - sanitized} control token(s) (the tokenizer's special tokens, "
                            f"such as a turn's end): transformers keeps typed control tokens as text by wrapping them in "
                            f"those very characters, so no HF encoding keeps both as written; remove the U+F0000 / "
                            f"U+F0001 characters (private-use, invisible) from the source data")
        full = render_tools(renderer, messages, tools) if tools or any("tool_calls" in m for m in messages) \
            else renderer.render(messages)
        positions = self.media.positions(full, marked)
        items, cut = self.media.expand(conv, [self.media.kind[token] for _, token in positions])
        text, edits = full, []
        if items:
            pieces, cursor = [], 0
            for (at, token), (_, expansion) in zip(positions, items, strict=True):
                replacement = "".join(p.token if isinstance(p, Run) else p for p in expansion.pieces)
                pieces += [full[cursor:at], replacement]
                edits.append((at, len(token), len(replacement)))
                cursor = at + len(token)
            pieces.append(full[cursor:])
            text = "".join(pieces)
        assistant = [i for i, t in enumerate(conv.turns) if t.role == "assistant"]
        trained = {i for i in assistant if conv.turns[i].trained}  # a TRL prompt's assistant turns: context
        return RenderedChat(full, text, messages, self.config.train_on, assistant, trained,
                            self.config.train_on_empty_think, items, edits, clips_cut=cut, tools=tools,
                            marked=marked)

    def _renderer_for(self, tools: Any) -> Renderer:
        """The renderer of a record that has ``tools`` (the template transformers picks for it) or has none."""
        return self.tool_renderer if tools else self.renderer

    def _messages(self, conv: Conversation, renderer: Renderer) -> list[dict[str, Any]]:
        return template_messages(conv, self.family.structured, self.family.media_token, renderer.mark)

    def _finish(self, raw: RawLine, file: str, source_index: int, obj: dict, record: Conversation | Document,
                chat: RenderedChat | None) -> Sample:
        """Everything after rendering: tokens (from the batch when there is one), labels, media, checks."""
        responses, prefix = (), 0
        if isinstance(record, Document):
            ids, trained, media = self._encode_document(record)
        elif isinstance(record, Preference):
            ids, trained, media, responses, prefix = self.preference.encode(record, chat)
        else:
            ids, trained, media = self._encode_conversation(record, chat)
        labels = ids.copy() if trained is None else np.where(trained, ids, IGNORE).astype(np.int32)
        if len(labels):  # a segment's first token is never the target of the previous one (every response's: token 0)
            labels[0] = IGNORE
        self.media.check_reserved_untrained(labels)
        n_trained = int(np.count_nonzero(labels != IGNORE))
        if n_trained == 0:
            raise BadRecord("no_trainable_tokens", "the record has no token to train on (no assistant turn?)")
        kinds = [k for k in MEDIA_ORDER if any(m.kind == k for m in media)]
        rid = record_id(obj)
        first = chat[0] if isinstance(chat, list) else chat  # a preference record's prompt clips: once, not per response
        self.clips_cut += first.clips_cut if first is not None else 0  # counted once the record is a sample
        return Sample(
            key=rid if rid is not None else raw.place(file),
            source_file=file,
            source_index=source_index,
            source_line=raw.line,
            modality="+".join(kinds) or "text",
            input_ids=ids,
            labels=labels,
            length=sum(r.length for r in responses) if responses else len(ids),
            n_trained=n_trained,
            media=tuple(media),
            responses=tuple(responses),
            prefix=prefix,
        )

    def _encode_document(self, doc: Document) -> tuple[np.ndarray, np.ndarray | None, list[MediaSpan]]:
        ids = self._memo.get(("doc", doc.text))
        if ids is None:
            # Literal "<image>" in a document is text, not a placeholder: split special tokens.
            ids = self.text.encode([doc.text], special=True, split=True, offsets=False)[0][0]
        eos = self.tok.eos_token_id
        if self.config.append_eos and eos is not None and (not len(ids) or ids[-1] != eos):
            ids = np.append(ids, np.int32(eos))
        return ids, None, []  # None: every token trained

    def _chat_tokens(self, chat: RenderedChat) -> tuple[np.ndarray, np.ndarray]:
        if chat.prompt is not None:
            return chat.prompt.tokens(self.preference.standard_tokens(chat.text)[0]), None
        hit = self._memo.get(("chat", chat.text))
        if hit is not None:
            return hit
        if chat.marked:
            try:
                return self.text.encode_marked(chat.text)
            except ValueError as e:
                raise BadRecord("special_token_in_text", f"{e}; the record types a control token this tokenizer cannot "
                                                         f"hold as text: remove it from the source data") from None
        return self.text.encode([chat.text], special=False, split=self.text.split_default, offsets=True)[0]

    def _encode_conversation(self, conv: Conversation, chat: RenderedChat) -> tuple[np.ndarray, np.ndarray, list[MediaSpan]]:
        ids, starts = self._chat_tokens(chat)
        trained = self._labels(chat, ids, starts)
        return self.media.widen(ids, trained, chat.items, conv.media)

    def _labels(self, chat: RenderedChat, ids: np.ndarray, starts: np.ndarray) -> np.ndarray:
        """The bool mask of ``ids`` to train: the assistant spans (mapped from ``full`` onto the expanded text);
        nothing a media expansion inserted is ever trained."""
        if chat.train_on == "all":
            mask = np.ones(len(ids), dtype=bool)
        elif chat.prompt is not None:  # TRL's standard format: every token from the completion's start
            mask = np.arange(len(ids)) >= chat.completion_start
        else:
            labeller = self.tool_labeller if chat.tools else self.labeller
            spans = labeller.trained_spans(chat.messages, chat.full, chat.assistant, chat.trained,
                                                chat.train_on_empty_think, chat.tools)
            chat.spans = spans
            mask = span_mask(starts, [(shift(s, chat.edits), shift(e, chat.edits)) for s, e in spans], len(chat.text))
        if chat.edits:
            inserted, delta = [], 0
            for at, old, new in chat.edits:
                inserted.append((at + delta, at + delta + new))
                delta += new - old
            mask &= ~span_mask(starts, inserted, len(chat.text))
        return mask


def _text_size(prepared: tuple) -> int:
    """Characters of text a prepared record sends to the chunk's tokenizer calls (:meth:`Encoder._pretokenize`)."""
    _, record, chat = prepared
    if isinstance(record, Document):
        return len(record.text)
    chats = chat if isinstance(chat, list) else [chat]
    return sum(len(c.text) for c in chats if c is not None)




__all__ = ["Encoder", "EncoderSpec", "RenderedChat"]
