"""The media side of encoding a conversation, between the chat template and the tokens.

A rendering's media tokens are found (a typed one, marked by the renderer, stays text), each is paired with the
record's item of its kind in order, as the processor pairs them, and expanded by the family from the file's header
(:mod:`packer.families`); after tokenizing, every placeholder run is widened to its count and the media spans are
recorded. The record checks that belong to media live here too: media the model has no encoder for, a text-only
tokenizer under the generic defaults, a media-reserved id at a trained position, a row the model class cannot take.
"""

from __future__ import annotations

import re
from typing import Any

import numpy as np

from packer.encode.render import MARK_START
from packer.errors import BadRecord
from packer.families import Expansion, Family, RecordMedia
from packer.media import bounds as setting_bounds
from packer.media import refs
from packer.media.counter import MediaProber, kept_seconds
from packer.records import Conversation
from packer.shards.schema import MEDIA_KINDS, MediaSpan

MEDIA_ORDER = MEDIA_KINDS  # the order a modality name lists its kinds in


def isin(a: np.ndarray, values: list[int]) -> np.ndarray:
    """``np.isin`` for a handful of values: ~3 µs instead of ~50 µs per call (it sorts and sets up every call)."""
    hit = np.zeros(a.shape, dtype=bool)
    for v in values:
        hit |= a == v
    return hit


def defaults(config: Any, kind: str) -> bool:
    """Are ``kind``'s generic settings (placeholder token, begin / end, count policy) all the defaults?"""
    from packer.config import FIELDS

    return all(getattr(config, key) == FIELDS[key].default
               for key in (f"{kind}_token", f"{kind}_tokens", f"{kind}_begin", f"{kind}_end"))


def span_fields(m: MediaSpan) -> dict[str, Any]:
    """A span as the loader and :meth:`packer.families.Family.row_key` see it (a stored ``media`` entry)."""
    return {"kind": m.kind, "start": m.start, "length": m.length, "tokens": m.tokens, "llm_grid": list(m.llm_grid)}


class MediaExpander:
    """One encoder's media: its family, the ids of its placeholder / begin / end tokens in ``tok`` (the pipeline's
    tokens already added), the prober, and the kinds nobody chose settings for (``unchosen``, for a tokenizer
    without media tokens)."""

    def __init__(self, config: Any, family: Family, tok: Any, tokenizer: str, unchosen: set[str], media_base: str):
        self.config = config
        self.family = family
        self.tokenizer = tokenizer  # as the spec names it, for messages
        self.unchosen = unchosen
        self.media_base = media_base
        self.run_tokens = family.run_tokens()
        self.run_ids = {t: tok.convert_tokens_to_ids(t) for t in self.run_tokens.values()}
        self.reserved_ids = {tok.convert_tokens_to_ids(t): t for t in family.special_tokens()}
        self.reserved_list = list(self.reserved_ids)
        self.run_id_list = list(dict.fromkeys(self.run_ids.values()))
        self.prober = MediaProber(config.image_check, video_check=getattr(config, "video_check", "verify"))
        self.kept_audio = kept_seconds(family)  # seconds of a clip the audio encoder sees (None: all)
        tokens = {family.media_token(k): k for k in family.kinds}
        alternatives = "(" + "|".join(map(re.escape, sorted(tokens, key=len, reverse=True))) + ")"
        # a typed media token, marked, is text; a record that marked nothing may hold U+F0000 of its own before one
        self._media_re = (re.compile(f"(?<!{MARK_START}){alternatives}"), re.compile(alternatives)) if tokens else None
        self.kind = tokens  # media token -> its kind

    @property
    def placeholder_ids(self) -> dict[str, int]:
        """kind -> the id its placeholder runs are made of."""
        return {k: self.run_ids[t] for k, t in self.run_tokens.items() if k in self.family.kinds}

    def positions(self, full: str, marked: bool) -> list[tuple[int, str]]:
        """(character offset, media token) of each media token of the rendering ``full`` (``marked``: the renderer
        marked control tokens in it, so a marked media token is text)."""
        if self._media_re is None:
            return []
        return [(m.start(), m.group(1)) for m in self._media_re[0 if marked else 1].finditer(full)]

    def expand(self, conv: Conversation, found: list[str]) -> tuple[list[tuple[int, Expansion]], int]:
        """(media item index, expansion) for each media token of the rendering, in order (``found``: their
        kinds): the i-th token of a kind is the record's i-th item of that kind, as the processor pairs them; and
        how many of the record's clips are cut to the audio encoder's window."""
        media = conv.media
        if sorted(found) != sorted(p.kind for p in media):
            raise BadRecord("media_placeholder_mismatch",
                            f"the rendered conversation holds media tokens for {found} where the record has media "
                            f"{[p.kind for p in media]} (a template that drops or repeats a media part)")
        if not media:
            return [], 0
        record = RecordMedia({k: sum(p.kind == k for p in media) for k in MEDIA_ORDER}, tuple(media), self.prober.probe)
        by_kind = {k: [i for i, p in enumerate(media) if p.kind == k] for k in MEDIA_ORDER}
        taken = dict.fromkeys(MEDIA_ORDER, 0)
        out, collate, cut = [], 0, 0  # bytes the record's media need at collate time (estimated: packer.media.bounds)
        for kind in found:
            index = by_kind[kind][taken[kind]]
            taken[kind] += 1
            part = media[index]
            info = self.prober.probe(part)
            if kind == "audio" and self.kept_audio is not None and info.frames > self.kept_audio * info.sample_rate:
                if getattr(self.config, "long_audio", "truncate") == "drop":  # the model would see only the window
                    raise BadRecord("audio_too_long", f"{part.ref!r} is {info.seconds:.1f} s; the audio encoder sees "
                                                      f"{self.kept_audio:g} s (--long-audio drop)")
                cut += 1
            if kind == "audio":
                kept = info.seconds if self.kept_audio is None else min(info.seconds, self.kept_audio)
                collate += setting_bounds.audio_collate_bytes(kept)
                if collate > setting_bounds.COLLATE_BYTES:
                    raise BadRecord("media_over_memory",
                                    f"{part.ref!r} ({info.seconds / 60:,.1f} min of audio, all of it encoded by family "
                                    f"{self.family.name}) brings the record's media to about {collate / 2**30:.1f} GiB "
                                    f"when its row is collated, over the {setting_bounds.COLLATE_BYTES / 2**30:g} GiB a "
                                    f"row's media may need: cut it into shorter clips")
            try:
                expansion = self.family.expand(kind, info, part, record)
            except ValueError as e:
                raise BadRecord(f"unsupported_{kind}", f"{part.ref!r}: {e} (family {self.family.name})") from None
            if expansion.tokens < 1:
                raise BadRecord(f"{kind}_too_short" if kind == "audio" else f"unsupported_{kind}",
                                f"{part.ref!r} gives the encoder no position (family {self.family.name})")
            out.append((index, expansion))
        return out, cut

    def widen(self, ids: np.ndarray, trained: np.ndarray, items: list[tuple[int, Expansion]],
              parts: Any) -> tuple[np.ndarray, np.ndarray, list[MediaSpan]]:
        """The tokens with every placeholder run widened to its count (never trained) and the media spans, from
        the rendering's ``items`` (:meth:`expand`) over the record's media ``parts``; checks that the tokens hold
        exactly the runs the expansions give and that the model class can take the row."""
        runs = np.flatnonzero(isin(ids, self.run_id_list))
        expected = [(n, run) for n, (_, expansion) in enumerate(items) for run in expansion.runs]
        if len(runs) != len(expected) or any(int(ids[p]) != self.run_ids[run.token]
                                             for p, (_, run) in zip(runs, expected, strict=True)):
            raise BadRecord("media_placeholder_mismatch",
                            f"the tokens hold {len(runs)} placeholder run(s) where the expansions of the record's media "
                            f"give {len(expected)} (a tokenizer that splits a placeholder, or a template that writes one)")
        if not len(runs):
            return ids, trained, []
        pieces_ids, pieces_mask, first, last = [], [], {}, {}
        cursor, out_pos = 0, 0
        for p, (n, run) in zip(runs.tolist(), expected, strict=True):
            pieces_ids += [ids[cursor:p], np.full(run.count, ids[p], dtype=np.int32)]
            pieces_mask += [trained[cursor:p], np.zeros(run.count, dtype=bool)]
            out_pos += p - cursor
            first.setdefault(n, out_pos)
            out_pos += run.count
            last[n] = out_pos
            cursor = p + 1
        pieces_ids.append(ids[cursor:])
        pieces_mask.append(trained[cursor:])
        media = []
        for n, (index, expansion) in enumerate(items):
            part = parts[index]
            ref = refs.stored_part_ref(part, self.media_base)
            media.append(MediaSpan(segment=0, kind=part.kind, start=int(first[n]), length=int(last[n] - first[n]),
                                   tokens=expansion.tokens, ref=ref, llm_grid=tuple(expansion.llm_grid),
                                   second_per_grid_t=float(expansion.second_per_grid_t)))
        media.sort(key=lambda m: m.start)
        why = self.family.row_problem([span_fields(m) for m in media])
        if why:  # the model class cannot take the record's own items in one call (its processor neither)
            raise BadRecord("incompatible_media", why)
        return np.concatenate(pieces_ids), np.concatenate(pieces_mask), media

    def check_modalities(self, conv: Conversation) -> None:
        """Refuse media the model has no encoder for, before any file is probed; stop the build at the first
        media record when the generic family would count it for a text-only tokenizer (:meth:`_refuse_text_tokenizer`)."""
        counts = {kind: sum(p.kind == kind for p in conv.media) for kind in MEDIA_ORDER}
        for kind, n in counts.items():
            if n and kind in self.unchosen and kind in self.family.kinds:
                self._refuse_text_tokenizer(kind)
        missing = {kind: n for kind, n in counts.items() if n and kind not in self.family.kinds}
        if missing:
            kinds = " and ".join(missing)
            raise BadRecord(
                "no_encoder",
                f"the record holds {' and '.join(f'{n} {k} item(s)' for k, n in missing.items())} but this "
                f"pipeline's modalities are {list(self.family.kinds)} (no {kinds} encoder): pack it with a pipeline "
                f"that declares {kinds}, or add {' and '.join(map(repr, missing))} to modalities if the model "
                f"encodes it",
            )

    def _refuse_text_tokenizer(self, kind: str) -> None:
        """A record with media under the generic family's default media settings (nobody chose a placeholder or a
        policy) and a tokenizer holding none of the pipeline's media tokens: a text-only model's tokenizer, where
        packer would add ``<image>`` and count each image by the default policy (576 tokens, LLaVA-1.5's CLIP at
        336 px) -- a build for no model. Stops the build (a configuration error, not a bad record)."""
        from packer.errors import ConfigError
        from packer.families import family_names

        token = self.family.run_tokens()[kind]
        policy = getattr(self.config, f"{kind}_tokens")
        named = ", ".join(n for n in family_names() if n != "generic")
        raise ConfigError(f"the records hold {kind} items, but tokenizer {self.tokenizer!r} has no {token} (nor "
                          f"any of {', '.join(self.family.special_tokens())}) and no {kind} setting was chosen: packer "
                          f"would add {token} to a text-only tokenizer and count each "
                          f"{kind} by the generic default {policy!r}, which is no model's. Expected: a vision/audio "
                          f"model's tokenizer and its counting. For a released model pass --family NAME --processor "
                          f"CHECKPOINT ({named}); for a placeholder pipeline (LLaVA-1.5 style) choose its "
                          f"--{kind}-token / --{kind}-tokens (a pipeline file, e.g. pipelines/llava15.toml), or give "
                          f"--tokenizer the model's tokenizer holding {token}")

    def check_reserved_untrained(self, labels: np.ndarray) -> None:
        """The invariant ``packer verify`` checks: no placeholder / begin / end id is a label."""
        hit = isin(labels, self.reserved_list)
        if hit.any():
            token = self.reserved_ids[int(labels[np.argmax(hit)])]
            raise BadRecord("reserved_token_in_text",
                            f"the record's text encodes to {token!r}, a token packer reserves for media, at a trained "
                            f"position; remove it from the text in the source data")
