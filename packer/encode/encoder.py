"""Encode raw JSONL lines into :class:`~packer.shards.schema.Sample` rows, or BadRecord.

The :class:`Encoder` is built once per worker process from a small picklable
:class:`EncoderSpec`, so the local and the Ray engine construct it the same way.

Stage 1 hands the encoder a whole task (:meth:`Encoder.encode_lines`), which goes through
it in chunks of ``TOKENIZE_BATCH`` records: every record is parsed and its chat template
rendered, then the chunk's texts go to the fast tokenizer in two calls (documents,
conversations), then each record is finished (labels, media counts, checks). Per record
the HF tokenizer call costs ~160 µs of wrapper on top of the Rust encode (Qwen2
vocabulary, ~160-token chats, measured on 2 shared cores); batched, that overhead is paid
once per chunk. Everything that can fail for one record stays per record,
so a bad record is quarantined alone; if a batched tokenizer call itself raises, the
task's records are tokenized one by one instead. The tokens are the same either way
(``tests/test_stage1_speed.py``).
"""

from __future__ import annotations

import json
import os
import unicodedata
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from packer.encode.chat import RenderedChat, conversation_labels, render_conversation, token_starts
from packer.encode.offsets import ByteStarts, normal_form
from packer.encode.tokenizer import fingerprint, load_tokenizer
from packer.errors import BadRecord
from packer.ingest.formats import decode_json, parse_record, record_id
from packer.ingest.reader import RawLine
from packer.ingest.records import Conversation, Document
from packer.io.fs import is_url
from packer.media.counter import MediaCounter
from packer.shards.schema import IGNORE, MEDIA_KINDS, MediaSpan, Sample

MEDIA_ORDER = MEDIA_KINDS  # the order a modality name lists its kinds in
TOKENIZE_BATCH = 1000  # texts per tokenizer call: the wrapper's cost is paid per call, memory grows with the batch


def _isin(a: np.ndarray, values: list[int]) -> np.ndarray:
    """``np.isin`` for a handful of values: ~3 µs instead of ~50 µs per call (it sorts and sets up every call)."""
    hit = np.zeros(a.shape, dtype=bool)
    for v in values:
        hit |= a == v
    return hit


def _reraise(e: Exception) -> BadRecord:
    raise e


@dataclass(frozen=True)
class EncoderSpec:
    tokenizer: str
    format: str = "auto"
    train_on: str = "assistant"
    append_eos: bool = True
    image_tag: str = "<image>"
    audio_tag: str = "<audio>"
    image_token: str = "<image>"
    audio_token: str = "<audio>"
    media_root: str | None = None
    image_tokens: str = "fixed:image_size=336,patch_size=14"
    audio_tokens: str = "qwen2-audio"
    image_begin: str = ""
    image_end: str = ""
    audio_begin: str = ""
    audio_end: str = ""
    video_tag: str = "<video>"
    video_token: str = "<video>"
    video_tokens: str = "qwen2vl"
    video_begin: str = ""
    video_end: str = ""
    image_check: str = "verify"
    allow_outside_media_root: bool = False
    modalities: tuple[str, ...] = MEDIA_ORDER  # media kinds the model has an encoder for
    media_base: str = ""  # stored refs are relative to this folder (the build's media root); "": as resolved
    train_on_empty_think: bool = False  # train the empty <think></think> a template adds to a turn without reasoning
    video_check: str = "header"  # how hard to check videos (packer.media.video.probe_video)

    @classmethod
    def from_config(cls, config, media_base: str = "") -> EncoderSpec:
        fields = [f for f in cls.__dataclass_fields__ if f != "media_base"]
        return cls(**{f: getattr(config, f) for f in fields}, media_base=media_base)

    @property
    def tags(self) -> dict[str, str]:
        """Media markers in the input text (LLaVA's ``<image>``)."""
        return {"image": self.image_tag, "audio": self.audio_tag, "video": self.video_tag}

    @property
    def placeholders(self) -> dict[str, str]:
        """The placeholder token each media item expands to in ``input_ids``."""
        return {"image": self.image_token, "audio": self.audio_token, "video": self.video_token}

    @property
    def wrappers(self) -> dict[str, tuple[str, str]]:
        return {"image": (self.image_begin, self.image_end), "audio": (self.audio_begin, self.audio_end),
                "video": (self.video_begin, self.video_end)}

    def special_tokens(self) -> list[str]:
        """Every token string packer itself inserts (added to the tokenizer if absent)."""
        tokens = [*self.placeholders.values(), *(t for pair in self.wrappers.values() for t in pair if t)]
        return list(dict.fromkeys(tokens))  # images and videos may share <|vision_start|> / <|vision_end|>


class Encoder:
    def __init__(self, spec: EncoderSpec):
        self.spec = spec
        self.tags = spec.tags
        self.tok = load_tokenizer(spec.tokenizer, spec.special_tokens())
        self.placeholder_ids = {k: self.tok.convert_tokens_to_ids(t) for k, t in spec.placeholders.items()}
        ids = lambda t: [self.tok.convert_tokens_to_ids(t)] if t else []  # noqa: E731
        self.begin_ids = {k: ids(begin) for k, (begin, _) in spec.wrappers.items()}
        self.end_ids = {k: ids(end) for k, (_, end) in spec.wrappers.items()}
        self.wrapper_tokens = [t for pair in spec.wrappers.values() for t in pair if t]
        self.reserved_ids = {self.tok.convert_tokens_to_ids(t): t for t in spec.special_tokens()}
        self.reserved_list = list(self.reserved_ids)
        self.placeholder_list = list(self.placeholder_ids.values())
        self.counter = MediaCounter(spec.image_tokens, spec.audio_tokens, spec.image_check, video_tokens=spec.video_tokens,
                                    video_check=spec.video_check)
        self.byte_starts = ByteStarts.for_tokenizer(self.tok)  # None: token starts come from the tokenizer's offsets
        self.normal_form = normal_form(self.tok)  # None: every text goes through the tokenizer's normalizer
        self._memo: dict = {}  # texts tokenized in a batch, for the records of one encode_lines call

    def fingerprint(self) -> dict:
        return fingerprint(self.tok, self.spec.tokenizer, self.spec.special_tokens())

    def encode_line(self, raw: RawLine, file: str, file_dir: Path | str, source_index: int = 0) -> Sample:
        """Encode one line of ``file``; ``file`` (as displayed) and ``raw.line`` name it. Raises what it meets."""
        return self._finish(raw, file, source_index, *self._prepare(raw, file_dir))

    def encode_lines(self, raws: list[RawLine], file: str, file_dir: Path | str, source_index: int = 0,
                     failure: Callable[[Exception], BadRecord] = _reraise) -> list[Sample | BadRecord]:
        """Encode lines of ``file`` together (one tokenizer call per kind), each result a Sample or a BadRecord.

        ``failure`` turns an exception met by one record into that record's BadRecord (or
        raises it, to stop the task); stage 1 passes its quarantine classifier. Results are
        in input order and equal to :meth:`encode_line` on each line. Lines go through in
        chunks of ``TOKENIZE_BATCH``, so the tokens waiting for their records never outgrow one chunk."""
        results: list[Sample | BadRecord] = []
        for at in range(0, len(raws), TOKENIZE_BATCH):
            results += self._encode_chunk(raws[at : at + TOKENIZE_BATCH], file, file_dir, source_index, failure)
        return results

    def _encode_chunk(self, raws: list[RawLine], file: str, file_dir: Path | str, source_index: int,
                      failure: Callable[[Exception], BadRecord]) -> list[Sample | BadRecord]:
        results: list[Any] = [None] * len(raws)
        prepared: list[Any] = [None] * len(raws)
        for j, raw in enumerate(raws):
            try:
                prepared[j] = self._prepare(raw, file_dir)
            except Exception as e:  # noqa: BLE001 -- classified (or re-raised) by ``failure``
                results[j] = failure(e)
        self._pretokenize([p for p in prepared if p is not None])
        try:
            for j, raw in enumerate(raws):
                if prepared[j] is None:
                    continue
                try:
                    results[j] = self._finish(raw, file, source_index, *prepared[j])
                except Exception as e:  # noqa: BLE001 -- classified (or re-raised) by ``failure``
                    results[j] = failure(e)
        finally:
            self._memo = {}
        return results

    def _pretokenize(self, prepared: list[tuple]) -> None:
        """Tokenize every prepared record's text in one call per kind, into ``self._memo``.

        A batch that raises leaves the memo empty for its kind: each record then tokenizes
        its own text in :meth:`_finish`, so the failure (if it is one record's) stays that record's."""
        docs = list(dict.fromkeys(rec.text for _, rec, _ in prepared if isinstance(rec, Document)))
        chats = list(dict.fromkeys(chat.text for _, _, chat in prepared if chat is not None))
        memo: dict = {}
        try:  # a chunk holds at most TOKENIZE_BATCH records: one call per kind
            for text, (ids, _) in zip(docs, self._encode_batch(docs, special=True, split=True, offsets=False), strict=True):
                memo["doc", text] = ids
        except Exception:  # noqa: BLE001 -- per record below
            pass
        try:
            encoded = self._encode_batch(chats, special=False, split=self.tok.split_special_tokens, offsets=True)
            for text, hit in zip(chats, encoded, strict=True):
                memo["chat", text] = hit
        except Exception:  # noqa: BLE001 -- per record below
            pass
        self._memo = memo

    def _encode_batch(self, texts: list[str], *, special: bool, split: bool,
                      offsets: bool) -> list[tuple[np.ndarray, np.ndarray | None]]:
        """``(ids, start character of each token)`` of each text (starts None unless ``offsets``), equal to what the
        HF call gives, through the Rust tokenizer's batch call without the HF wrapper's per-text conversion into
        Python dicts (~40 µs a text, measured). A backend with truncation or padding configured goes through the
        HF call. Offsets cost ~20% of the encode and ~25 µs a chat to convert: where token byte lengths give the
        same starts (:class:`ByteStarts`), they are not asked for."""
        backend = self.tok.backend_tokenizer
        if backend.truncation is not None or backend.padding is not None:
            enc = self.tok(texts, add_special_tokens=special, split_special_tokens=split, return_offsets_mapping=offsets)
            return [(np.asarray(ids, dtype=np.int32), token_starts(enc["offset_mapping"][k]) if offsets else None)
                    for k, ids in enumerate(enc["input_ids"])]
        before = backend.encode_special_tokens
        backend.encode_special_tokens = split
        try:
            if not offsets or self.byte_starts is None:
                return [(np.array(e.ids, dtype=np.int32), token_starts(e.offsets) if offsets else None)
                        for e in self._encode_rust(texts, special, offsets=offsets)]
            out = []
            for text, e in zip(texts, self._encode_rust(texts, special, offsets=False), strict=True):
                ids = np.array(e.ids, dtype=np.int32)
                out.append((ids, self.byte_starts.starts(ids, text)))
            redo = [k for k, (_, starts) in enumerate(out) if starts is None]  # not exact from bytes: real offsets
            for k, e in zip(redo, self._encode_rust([texts[k] for k in redo], special, offsets=True), strict=True):
                out[k] = (np.array(e.ids, dtype=np.int32), token_starts(e.offsets))
            return out
        finally:
            backend.encode_special_tokens = before

    def _encode_rust(self, texts: list[str], special: bool, *, offsets: bool) -> list:
        """The backend's batch encodings of ``texts`` in order (``encode_batch_fast``, which tracks no offsets, unless
        ``offsets``). A normalizer that is one Unicode normal form leaves a text already in that form as it is, so
        such texts (ASCII always) skip it: the same ids and offsets, ~10% less encode for Qwen2's NFC."""
        backend = self.tok.backend_tokenizer
        run = backend.encode_batch if offsets else backend.encode_batch_fast
        form = self.normal_form
        plain = [t.isascii() or unicodedata.is_normalized(form, t) for t in texts] if form else []
        if not any(plain):
            return run(texts, add_special_tokens=special)
        normalizer = backend.normalizer
        backend.normalizer = None
        try:
            skipped = iter(run([t for t, p in zip(texts, plain, strict=True) if p], add_special_tokens=special))
        finally:
            backend.normalizer = normalizer
        rest = iter(run([t for t, p in zip(texts, plain, strict=True) if not p], add_special_tokens=special)
                    if not all(plain) else ())
        return [next(skipped) if p else next(rest) for p in plain]

    def _document_tokens(self, text: str) -> np.ndarray:
        # Literal "<image>" in a document is text, not a placeholder: split special tokens.
        return np.asarray(self.tok(text, add_special_tokens=True, split_special_tokens=True)["input_ids"], dtype=np.int32)

    def _chat_tokens(self, text: str) -> tuple[np.ndarray, np.ndarray]:
        hit = self._memo.get(("chat", text))
        if hit is None:
            enc = self.tok(text, add_special_tokens=False, return_offsets_mapping=True)
            hit = np.asarray(enc["input_ids"], dtype=np.int32), token_starts(enc["offset_mapping"])
        return hit

    def _prepare(self, raw: RawLine, file_dir: Path | str) -> tuple[dict, Conversation | Document, RenderedChat | None]:
        """Everything before tokenizing: parse, check, render the chat template."""
        if raw.too_long:
            raise BadRecord("line_too_long", f"the line has {raw.too_long:,} bytes, over the max_line_bytes limit")
        obj = decode_json(raw.data)
        base_dir = Path(self.spec.media_root) if self.spec.media_root else file_dir
        record = parse_record(obj, self.spec.format, base_dir, self.tags,
                              allow_outside_root=self.spec.allow_outside_media_root)
        if isinstance(record, Document):
            return obj, record, None
        self._check_modalities(record)
        self._check_wrapper_text(record)
        chat = render_conversation(self.tok, record, self.spec.placeholders, self.spec.train_on, self.spec.train_on_empty_think)
        return obj, record, chat

    def _finish(self, raw: RawLine, file: str, source_index: int, obj: dict, record: Conversation | Document,
                chat: RenderedChat | None) -> Sample:
        """Everything after rendering: tokens (from the batch when there is one), labels, media, checks."""
        if isinstance(record, Document):
            ids, trained, media = self._encode_document(record)
        else:
            ids, trained, media = self._encode_conversation(record, chat)
        labels = ids.copy() if trained is None else np.where(trained, ids, IGNORE).astype(np.int32)
        if len(labels):
            labels[0] = IGNORE  # a segment's first token is never the target of the previous one
        self._check_reserved_untrained(labels)
        n_trained = int(np.count_nonzero(labels != IGNORE))
        if n_trained == 0:
            raise BadRecord("no_trainable_tokens", "the record has no token to train on (no assistant turn?)")
        kinds = [k for k in MEDIA_ORDER if any(m.kind == k for m in media)]
        rid = record_id(obj)
        return Sample(
            key=rid if rid is not None else f"{file}:{raw.line}",
            source_file=file,
            source_index=source_index,
            source_line=raw.line,
            modality="+".join(kinds) or "text",
            input_ids=ids,
            labels=labels,
            length=len(ids),
            n_trained=n_trained,
            media=tuple(media),
        )

    def _check_modalities(self, conv: Conversation) -> None:
        """Refuse media the model has no encoder for, before any file is probed."""
        for kind in MEDIA_ORDER:
            n = sum(p.kind == kind for p in conv.media)
            if n and kind not in self.spec.modalities:
                raise BadRecord(
                    "no_encoder",
                    f"the record holds {n} {kind} item(s) but this pipeline's modalities are "
                    f"{list(self.spec.modalities)} (no {kind} encoder): pack it with a pipeline that declares {kind}, "
                    f"or add {kind!r} to modalities if the model encodes it",
                )

    def _check_wrapper_text(self, conv: Conversation) -> None:
        """Refuse a begin / end token typed in any turn's text (``<|vision_start|>``).

        The chat template path would read it as that special token: trained in an assistant
        turn, a media opener with no media in any turn. Typed placeholders are caught later,
        by the placeholder count (``media_placeholder_mismatch``)."""
        for i, turn in enumerate(conv.turns):
            for part in turn.parts:
                token = next((t for t in self.wrapper_tokens if part.kind == "text" and t in part.text), None)
                if token is not None:
                    raise BadRecord("reserved_token_in_text",
                                    f"turn {i} ({turn.role}) holds {token!r}, a token packer reserves for media begin / end "
                                    f"markers; remove it from the text (or escape it) in the source data")

    def _check_reserved_untrained(self, labels: np.ndarray) -> None:
        """The invariant ``packer verify`` checks: no placeholder / begin / end id is a label."""
        hit = _isin(labels, self.reserved_list)
        if hit.any():
            token = self.reserved_ids[int(labels[np.argmax(hit)])]
            raise BadRecord("reserved_token_in_text",
                            f"the record's text encodes to {token!r}, a token packer reserves for media, at a trained "
                            f"position; remove it from the text in the source data")

    def _encode_document(self, doc: Document) -> tuple[np.ndarray, np.ndarray | None, list[MediaSpan]]:
        ids = self._memo.get(("doc", doc.text))
        if ids is None:
            ids = self._document_tokens(doc.text)
        eos = self.tok.eos_token_id
        if self.spec.append_eos and eos is not None and (not len(ids) or ids[-1] != eos):
            ids = np.append(ids, np.int32(eos))
        return ids, None, []  # None: every token trained

    def _encode_conversation(self, conv: Conversation, chat: RenderedChat) -> tuple[np.ndarray, np.ndarray, list[MediaSpan]]:
        ids, starts = self._chat_tokens(chat.text)
        trained = conversation_labels(self.tok, chat, ids, starts)
        items = conv.media
        positions = np.flatnonzero(_isin(ids, self.placeholder_list))
        found = [k for i in positions for k, pid in self.placeholder_ids.items() if ids[i] == pid]
        if found != [p.kind for p in items]:
            raise BadRecord(
                "media_placeholder_mismatch",
                f"the rendered conversation holds placeholders {found} where the record has media {[p.kind for p in items]}"
                " (a placeholder string typed in the text, or a template that drops a turn)",
            )
        if not items:
            return ids, trained, []
        # Expand each placeholder into [begin] + count copies + [end]; none of it is trained.
        pieces_ids, pieces_mask, media = [], [], []
        cursor, out_pos = 0, 0
        for pos, part in zip(positions, items, strict=True):
            count = self.counter.count(part)
            begin, end = self.begin_ids[part.kind], self.end_ids[part.kind]
            expanded = np.asarray([*begin, *[self.placeholder_ids[part.kind]] * count.length, *end], dtype=np.int32)
            pieces_ids += [ids[cursor:pos], expanded]
            pieces_mask += [trained[cursor:pos], np.zeros(len(expanded), dtype=bool)]
            out_pos += pos - cursor + len(begin)
            ref = (json.dumps({"frames": [stored_ref(f, self.spec.media_base) for f in part.frames], "fps": part.fps},
                              ensure_ascii=False)  # a video given as frame images: the frames and the stated rate
                   if part.frames else stored_ref(part.path, self.spec.media_base))
            media.append(MediaSpan(segment=0, kind=part.kind, start=int(out_pos), length=count.length, ref=ref,
                                   grid=count.grid, second_per_grid_t=float(getattr(count, "second_per_grid_t", 0.0))))
            out_pos += count.length + len(end)
            cursor = pos + 1
        pieces_ids.append(ids[cursor:])
        pieces_mask.append(trained[cursor:])
        return np.concatenate(pieces_ids), np.concatenate(pieces_mask), media


def stored_ref(path: str, media_base: str) -> str:
    """How a media file is named in the shards: relative to the build's media root when
    inside it (so the build and its media can move together), else absolute, or the URL.
    The loader joins it back onto the root the manifest records (or one the user gives)."""
    if is_url(path) or not media_base:
        return str(path)
    absolute = os.path.abspath(path)
    if absolute == media_base or absolute.startswith(media_base.rstrip(os.sep) + os.sep):
        return Path(os.path.relpath(absolute, media_base)).as_posix()
    return absolute


def media_base(config, files: list) -> str:
    """The build's media root: ``--media-root``, else the deepest folder holding every
    input file (absolute). Empty when inputs are URLs."""
    if config.media_root:
        return config.media_root if is_url(config.media_root) else os.path.abspath(config.media_root)
    if not files or any(is_url(f) for f in files):
        return ""
    return os.path.commonpath([os.path.dirname(os.path.abspath(f)) for f in files])
