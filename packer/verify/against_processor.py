"""``packer verify OUT --against-processor PROC``: do the build's ids still equal the processor's?

Counts change between transformers versions (a processor fixes its resize, a checkpoint changes its
budget: transformers #48071), and a build made for one processor is useless for another. This check
re-runs the real HF processor -- named by a folder or hub id, loaded with ``AutoProcessor`` -- on a sample
of the build's records, from their own lines and files, the plain HF way:

- the record's messages and its ``tools`` rendered by the processor's chat template (media as content parts, tool
  calls on their turns, as ``apply_chat_template(messages, tools=tools)`` passes them), or, for the
  configurable ``generic`` family (whose pipelines render string content), the sample's own text with each
  media span collapsed to one placeholder;
- images through ``transformers.image_utils.load_image``, videos through transformers' PyAV reader (every
  frame, turned upright, sampled by the processor itself), frame lists as images with the record's ``fps`` in
  their metadata, audio through ``load_audio`` at the feature extractor's rate. A frame list that states no rate
  is handed as the build counted it: under the generic family's video policy, every frame at the policy's
  ``fps`` with ``do_sample_frames=False`` (qwen-vl-utils' convention; a record holding only such lists), so the
  processor's ``second_per_grid_ts`` is not timed at its 24 fps default;
- ``processor(text=..., images=..., videos=..., audio=...)``, with control tokens the record typed marked as
  text (``sanitize_control_tokens``) exactly as the build did (only then: U+F0000 / U+F0001 typed in a record
  that marks nothing are its text, which sanitizing would strip);
- the build's chat template (its ``--chat-template``, else the processor's) and the build's time for a template
  that reads the clock (rendered then by packer's checked compiled path: transformers' public path reads the
  wall clock).

Each sampled record whose ids differ is a :class:`Mismatch` (file, line, id, both counts, the first
position that differs), and so is one whose videos the processor times otherwise than the build's spans
(Qwen2.5-VL's ``second_per_grid_ts`` against each span's ``second_per_grid_t``: its mRoPE time positions).
A preference record is checked response by response: each response's tokens
against the processor on its conversation (prompt + response), the id naming the response's role.
A sample is drawn with the seed, media records first, so a small ``--sample`` covers every
modality the build holds. The packed rows training reads are checked too: each segment of a sampled
record (a piece, a response, a tree's prompt or branch) holds the processor's ids at its place in the record,
so a packed shard edited after the build (its hash updated) is named even where ``samples/`` is intact.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from packer.errors import BadRecord, PackerError

if TYPE_CHECKING:
    from packer.families import Family


@dataclass(frozen=True)
class Mismatch:
    file: str
    line: int
    id: str
    packer_tokens: int
    processor_tokens: int
    first_difference: int
    detail: str = ""
    where: str = "line"  # what ``line`` counts: a JSONL line, a table "row", a tar "member" (RawLine.where)

    def __str__(self) -> str:
        place = f"{self.file}:{self.line}" if self.where == "line" else f"{self.file} {self.where} {self.line}"
        return (f"{place} ({self.id}): packer {self.packer_tokens:,} ids, the processor "
                f"{self.processor_tokens:,}; first difference at token {self.first_difference}"
                + (f" ({self.detail})" if self.detail else ""))


def verify_against_processor(out: str | Path, processor: str, *, sample: int = 32, seed: int = 0,
                             media_root: str | None = None) -> tuple[list[Mismatch], int]:
    """(mismatching records, records checked): ``sample`` records of the build at ``out`` re-run through
    ``processor`` (a folder or hub id)."""
    from packer.config import BuildConfig
    from packer.ingest.units import where
    from packer.io import fs
    from packer.shards.io import read_shards
    from packer.shards.manifest import Manifest
    from packer.shards.schema import SAMPLE_SCHEMA

    if fs.is_url(str(out)):
        raise PackerError(f"--against-processor reads a local build: copy {out} here first (packer verify without it "
                          f"checks a remote build)")
    out = Path(out)
    manifest = Manifest.read(out)
    proc = _load(processor)
    samples = read_shards([out / e.file for e in manifest.files.samples], SAMPLE_SCHEMA)
    chosen = _choose(samples, sample, seed)
    config = BuildConfig(**{k: tuple(v) if isinstance(v, list) else v for k, v in manifest.config.items()})
    family = manifest.family
    placeholders = manifest.placeholders
    root = media_root or manifest.media_root
    rows = samples.take(chosen).select(["source_index", "source_line", "key", "input_ids", "media", "responses",
                                        "prefix"]).to_pylist()
    readings = _readings(manifest, config)
    lines = _lines(manifest.inputs, {(r["source_index"], r["source_line"]) for r in rows}, readings)
    segments = _packed_segments(out, manifest, {(r["source_index"], r["source_line"]) for r in rows})
    renderers = _renderers(proc, config)
    untimed = _untimed_fps(config, family)
    mismatches = []
    for r in rows:
        file = manifest.inputs[r["source_index"]]
        raw = lines[(r["source_index"], r["source_line"])]
        try:
            record = _parse(raw, file, config)
            parts = [(r["key"], record, r)] if not r["responses"] else [
                (f"{r['key']} ({response['role']})", record.conversation(k), _response_row(r, k))
                for k, response in enumerate(r["responses"])]
            checked = [(key, sub, *_processor_ids(proc, renderers, conv, config, family, placeholders, sub, root, untimed))
                       for key, conv, sub in parts]
        except (BadRecord, OSError, ValueError) as e:
            mismatches.append(Mismatch(file, r["source_line"], r["key"], len(r["input_ids"]), 0, 0,
                                       f"the processor refused the record: {type(e).__name__}: {e}"))
            continue
        size = max(x["start"] + x["length"] for x in r["responses"]) if r["responses"] else len(r["input_ids"])
        whole: list[int | None] = [None] * size  # the processor's id at each token of the sample (its responses whole)
        sample_ok = True
        for (key, sub, expected, seconds), response in zip(checked, r["responses"] or [None], strict=True):
            got = list(sub["input_ids"])
            if got != expected:
                sample_ok = False
                first = next((i for i, (a, b) in enumerate(zip(got, expected, strict=False)) if a != b),
                             min(len(got), len(expected)))
                mismatches.append(Mismatch(file, r["source_line"], key, len(got), len(expected), first,
                                           _media_note(sub["media"])))
            else:
                mismatches += _timing_mismatches(file, r["source_line"], key, len(got), sub["media"], seconds)
            a = response["start"] if response else 0
            whole[a : a + len(expected)] = expected[: len(whole) - a]
        if sample_ok:  # the packed rows of a record whose samples/ row is right: the same ids, cut as planned
            mismatches += _packed_mismatches(file, r, whole, segments.get((r["source_index"], r["source_line"]), []))
    wheres = {file: where(fmt) for file, (fmt, _) in zip(manifest.inputs, readings, strict=True)}
    return [dataclasses.replace(m, where=wheres.get(m.file, "line")) for m in mismatches], len(rows)


def _packed_segments(out: Path, manifest, wanted: set[tuple[int, int]]) -> dict[tuple[int, int], list[tuple]]:
    """``(shard, row, segment start in the sample, ids)`` of every packed segment of the ``wanted`` records."""
    from packer.shards.io import read_shard

    found: dict[tuple[int, int], list[tuple]] = {}
    for entry in manifest.files.packed:
        table = read_shard(out / entry.file, entry.sha256)
        source = table.column("segment_source").combine_chunks()
        line = table.column("segment_line").combine_chunks()
        hits = np.flatnonzero(np.isin(source.values.to_numpy().astype(np.int64) * (1 << 40) + line.values.to_numpy(),
                                      [s * (1 << 40) + ln for s, ln in wanted]))
        if not len(hits):
            continue
        row_of = np.searchsorted(source.offsets.to_numpy(), hits, side="right") - 1
        for k, row in zip(hits.tolist(), row_of.tolist(), strict=True):
            j = k - int(source.offsets[row].as_py())
            data = table.slice(row, 1).select(["cu_seqlens", "input_ids", "segment_start"]).to_pylist()[0]
            cu = data["cu_seqlens"]
            key = (int(source.values[k].as_py()), int(line.values[k].as_py()))
            found.setdefault(key, []).append((entry.file, row, data["segment_start"][j], data["input_ids"][cu[j] : cu[j + 1]]))
    return found


def _packed_mismatches(file: str, sample: dict, whole: list[int | None], segments: list[tuple]) -> list[Mismatch]:
    out = []
    for shard, row, start, ids in segments:
        expected = whole[start : start + len(ids)]
        if any(e is not None and e != g for e, g in zip(expected, ids, strict=False)) or len(expected) < len(ids):
            first = next((i for i, (e, g) in enumerate(zip(expected, ids, strict=False)) if e is not None and e != g),
                         len(expected))
            out.append(Mismatch(file, sample["source_line"], f"{sample['key']} in {shard} row {row}", len(ids),
                                len(expected), first, "the packed row differs from its samples/ row: edited after the build"))
    return out


def _timing_mismatches(file: str, line: int, key: str, n: int, media: list[dict], seconds: list[float] | None
                       ) -> list[Mismatch]:
    """The videos whose stored ``second_per_grid_t`` differs from the processor's ``second_per_grid_ts`` (Qwen2.5-VL
    processors give them: each video's seconds per temporal grid step, its time-scaled mRoPE positions), compared
    in float32 as the spans store them; nothing where the processor gives no timing."""
    videos = sorted((m for m in media if m["kind"] == "video"), key=lambda m: m["start"])
    if seconds is None or not videos:
        return []
    if len(seconds) != len(videos):
        return [Mismatch(file, line, key, n, n, videos[0]["start"], f"the build holds {len(videos)} video span(s), the "
                                                                    f"processor timed {len(seconds)}")]
    out = []
    for j, (m, theirs) in enumerate(zip(videos, seconds, strict=True)):
        stored, theirs = float(np.float32(m["second_per_grid_t"])), float(np.float32(theirs))
        if stored != theirs:
            out.append(Mismatch(file, line, key, n, n, m["start"],
                                f"video {j + 1}: the build's second_per_grid_t {stored:g} s, the processor's "
                                f"second_per_grid_ts {theirs:g} s: Qwen2.5-VL's mRoPE time positions differ"))
    return out


def _untimed_fps(config, family: Family | None) -> float | None:
    """The rate the build timed a frame list that states none at: the generic family's video policy's ``fps`` (it
    takes such a list whole at that rate, :func:`packer.families.generic.policy_count`); None for a named family,
    which counts such a list at transformers' own assumption (its processor's default)."""
    if _named(family) or "video" not in config.modalities:
        return None
    from packer.media.policies import parse_policy

    return getattr(parse_policy(config.video_tokens, "video"), "fps", None)


def _named(family: Family | None) -> bool:
    """The build's family is a named one (its processor's chat template sees structured media parts); False for the
    generic family, or a build that records none."""
    return family is not None and not family.is_generic


def _response_row(row: dict, k: int) -> dict:
    """A preference sample's response as a row of its own: its tokens, and the media spans inside them."""
    from packer.pack.trees import response_row

    return {**response_row(row, k), "input_ids": response_row(row, k)["input_ids"].tolist()}


def _load(name: str):
    from packer.io.pretrained import load_pretrained

    try:
        from transformers import AutoProcessor
    except ImportError:  # pragma: no cover - the test layer has it
        raise PackerError("--against-processor runs the HF processor: pip install 'packer[train]'") from None
    try:
        return load_pretrained(AutoProcessor, name, "processor")
    except PackerError:
        raise
    except Exception as e:  # noqa: BLE001 -- a folder without a processor, an unknown hub id, ...
        raise PackerError(f"cannot load processor {name!r}: {type(e).__name__}: {e}") from None


def _choose(samples, n: int, seed: int) -> np.ndarray:
    """``n`` sample rows: records with media first (each modality's share kept), then text, drawn with ``seed``."""
    from packer.stages.planning import modality_codes

    codes, names = modality_codes(samples)  # small integers, no string per sample
    rng = np.random.default_rng(seed)
    is_text = np.isin(codes, [k for k, name in enumerate(names) if name == "text"])
    media, text = np.flatnonzero(~is_text), np.flatnonzero(is_text)
    picked = rng.permutation(media)[:n].tolist()
    picked += rng.permutation(text)[: max(0, n - len(picked))].tolist()
    return np.asarray(sorted(picked), dtype=np.int64)


def _readings(manifest, config) -> list[tuple[str, tuple]]:
    """Each input file's format and column mapping, as the build read it."""
    from packer.ingest.units import readings

    sources = manifest.input_sources or [0] * len(manifest.inputs)
    return readings(config.sources(), list(zip(manifest.inputs, sources, strict=True)))


def _lines(inputs: list[str], wanted: set[tuple[int, int]],
           readings: list[tuple[str, tuple]] | None = None) -> dict[tuple[int, int], bytes | dict]:
    """The raw line of each wanted ``(input, line)``; a table row's or tar sample's record, decoded as the build
    decoded it (its embedded media held as blobs: :func:`packer.ingest.records_of.task_records`)."""
    from packer.ingest.reader import read_lines

    out: dict[tuple[int, int], bytes | dict] = {}
    for index in sorted({i for i, _ in wanted}):
        lines = {line for i, line in wanted if i == index}
        fmt, columns = readings[index] if readings else ("jsonl", ())
        if fmt != "jsonl":
            for raw in _container_records(inputs[index], fmt, columns, lines):
                if raw.line in lines and raw.record is not None:
                    out[index, raw.line] = raw.record
            continue
        for raw in read_lines(inputs[index]):
            if raw.line in lines:
                out[index, raw.line] = raw.data
                if len(out) == len(wanted):
                    break
    missing = wanted - set(out)
    if missing:
        i, line = sorted(missing)[0]
        what = {"parquet": "row", "arrow": "row", "webdataset": "sample"}.get(readings[i][0], "line") if readings else "line"
        raise PackerError(f"{inputs[i]} has no {what} {line} any more: the inputs changed since the build")
    return out


def _renderers(proc, config):
    """(the build's template, the one its records with tools rendered with) -- its name or .jinja file, else the
    processor's; the tokenizer's ``tool_use`` for records with tools where it has one and no name was given, as
    the build picked it -- rendered with the build's time, and their control tokens marked as the build marked
    them; None without a template."""
    from packer.encode.render import Renderer, template_clock, template_source

    tok = proc.tokenizer
    if not config.chat_template and isinstance(getattr(proc, "chat_template", None), str) and proc.chat_template:
        import copy

        tok = copy.copy(tok)  # the processor's own template over the tokenizer's (a shallow copy: nothing shared changes)
        tok.chat_template = proc.chat_template
    def make(tools: bool = False) -> Renderer:
        return Renderer(tok, config.chat_template, template_clock(config.template_time),
                        max_steps=config.template_max_steps, max_chars=config.template_max_chars, tools=tools)

    try:
        renderer = make()
    except PackerError:
        return None  # no template: documents only
    return renderer, (renderer if template_source(tok, config.chat_template, tools=True) == renderer.source
                      else make(tools=True))


def _container_records(path: str, fmt: str, columns: tuple, lines: set[int]):
    """The records of a table's row groups holding ``lines`` (row numbers), or of a whole tar."""
    from packer.ingest import records_of, tables
    from packer.ingest.units import table_columns
    from packer.io import fs
    from packer.stages.encode import EncodeTask

    if fmt == "webdataset":
        yield from records_of.task_records(EncodeTask(0, path, 0, fs.stat(path)[0], 0, -1, format=fmt, columns=columns))
        return
    columns = table_columns(path, fmt, columns)
    first = 0
    for k, (n, _) in enumerate(tables.groups(path, fmt)):
        if any(first <= line < first + n for line in lines):
            yield from records_of.task_records(EncodeTask(0, path, k, k + 1, first, n, format=fmt, columns=columns))
        first += n


def _parse(raw: bytes | dict, file: str, config):
    from packer.ingest.formats import decode_json, parse_record
    from packer.io.fs import parent
    from packer.media.refs import record_base

    base = record_base(config.media_root, parent(file))
    tags = {"image": config.image_tag, "audio": config.audio_tag, "video": config.video_tag}
    record = raw if isinstance(raw, dict) else decode_json(raw)  # a table row / tar sample comes decoded
    return parse_record(record, config.format, base, tags, allow_outside_root=config.allow_outside_media_root)


def _processor_ids(proc, renderers, conv, config, family: Family | None, placeholders: dict[str, int], row: dict,
                   root: str, untimed: float | None = None) -> tuple[list[int], list[float] | None]:
    """The processor's ids of the conversation, and its ``second_per_grid_ts`` where it gives them (None else);
    ``untimed``: the rate a frame list stating none was timed at (:func:`_untimed_fps`)."""
    from packer.encode.chat import marked_data, template_messages

    if not hasattr(conv, "turns"):  # a document: the tokenizer alone
        ids = proc.tokenizer(conv.text, add_special_tokens=True, split_special_tokens=True)["input_ids"]
        eos = proc.tokenizer.eos_token_id
        return list(ids) + ([eos] if config.append_eos and eos is not None and (not ids or ids[-1] != eos) else []), None
    tok = proc.tokenizer
    if renderers is None:
        raise PackerError(f"{type(proc).__name__} has no chat template to render the build's conversations with")
    renderer = renderers[1] if conv.tools else renderers[0]
    sanitized = renderer.sanitized
    if not _named(family):
        text = _collapsed_text(tok, row, placeholders)
    else:
        messages = template_messages(conv, True, lambda kind: "", renderer.mark)
        tools = marked_data(list(conv.tools), renderer.mark) if conv.tools else None  # the record's, as the build's
        if "strftime_now" in renderer.source:  # the public path reads the wall clock: the build's time, compiled
            text = renderer.render(messages, tools=tools)
        else:
            text = proc.apply_chat_template(messages, tokenize=False, chat_template=renderer.source, tools=tools)
    kwargs = _media_kwargs(proc, conv.media, nest=_named(family), untimed=untimed)
    # sanitized only where packer marked a typed control token: U+F0000 / U+F0001 typed in a record that marks none
    # are its text, which transformers' sanitizing would strip (packer keeps them, as apply_chat_template does)
    enc = proc(text=[text], sanitize_control_tokens=renderer.sanitized > sanitized, **kwargs)
    seconds = enc.get("second_per_grid_ts")
    return list(enc["input_ids"][0]), None if seconds is None else [float(x) for x in seconds]


def _collapsed_text(tok, row: dict, placeholders: dict[str, int]) -> str:
    ids = list(row["input_ids"])
    collapsed, cursor = [], 0
    for m in sorted(row["media"], key=lambda m: m["start"]):
        collapsed += ids[cursor : m["start"] + 1]
        cursor = m["start"] + m["length"]
    return tok.decode(collapsed + ids[cursor:], skip_special_tokens=False)


def _media_kwargs(proc, parts, nest: bool = False, untimed: float | None = None) -> dict[str, Any]:
    """The processor's media keyword arguments; ``nest``: the record's images as one list for its one text, as
    ``apply_chat_template`` hands them over (LLaVA-OneVision tiles only the image of a one-image record);
    ``untimed``: the rate the build timed a frame list stating none at (None: transformers' own assumption). Such
    a list goes at that rate, whole (``do_sample_frames=False``, there being no rate of its own to sample it by:
    qwen-vl-utils' convention, the build's) when the record's videos are all such lists."""
    import tempfile

    with tempfile.TemporaryDirectory(prefix="packer-verify-") as folder:  # embedded media as files, while they load
        return _load_media(proc, parts, nest, untimed, Path(folder))


def _as_file(path, folder: Path) -> str:
    """``path`` as transformers' loaders take it: an embedded medium (a blob name, :mod:`packer.io.blobs`) written to
    a file in ``folder`` (the loaders read paths and URLs, not bytes), a file as it is."""
    from packer.io import blobs

    if not blobs.is_blob(str(path)):
        return str(path)
    target = folder / str(path).removeprefix(blobs.PREFIX)
    if not target.exists():
        target.write_bytes(blobs.STORE.get(str(path)))
    return str(target)


def _load_media(proc, parts, nest: bool, untimed: float | None, folder: Path) -> dict[str, Any]:
    from transformers.image_utils import load_image

    images, videos, metadata, audio = [], [], [], []
    whole = bool(untimed)  # every video a frame list without a rate, timed at ``untimed``
    for part in parts:
        if part.kind == "image":
            images.append(load_image(_as_file(part.path, folder)))
        elif part.kind == "video":
            whole = whole and bool(part.frames) and not part.fps
            if part.frames:
                videos.append([load_image(_as_file(f, folder)) for f in part.frames])
                rate = part.fps or untimed
                metadata.append({"total_num_frames": len(part.frames), "fps": rate} if rate else
                                {"total_num_frames": len(part.frames)})
            else:
                frames, meta = upright_video(_as_file(part.path, folder))
                videos.append(frames)
                metadata.append(meta)
        else:
            from transformers.audio_utils import load_audio

            audio.append(load_audio(_as_file(part.path, folder), sampling_rate=proc.feature_extractor.sampling_rate))
    out: dict[str, Any] = {}
    if images:
        out["images"] = [images] if nest else images
    if videos:
        out["videos"], out["video_metadata"] = videos, metadata
        if whole:
            out["do_sample_frames"] = False
    if audio:
        out["audio"] = audio
    return out


def upright_video(path: str):
    """transformers' PyAV reader (every frame, with its metadata), frames turned upright: its reader ignores a
    clip's display rotation, packer applies it (as EXIF for images)."""
    from transformers.video_utils import load_video

    from packer.media.video import probe_video

    frames, meta = load_video(path, backend="pyav")
    rotation = probe_video(path).rotation
    if rotation:
        frames = np.ascontiguousarray(np.rot90(frames, k=rotation // 90, axes=(1, 2)))
    return frames, meta


def _media_note(media: list[dict]) -> str:
    kinds = [m["kind"] for m in media]
    return ", ".join(f"{kinds.count(k)} {k}" for k in ("image", "video", "audio") if k in kinds) or "text only"


def report(mismatches: list[Mismatch], checked: int, processor: str) -> str:
    if not mismatches:
        return f"ids equal {processor}'s on all {checked} sampled records"
    lines = [f"{len(mismatches)} of {checked} sampled records differ from {processor}:"]
    lines += [f"  {m}" for m in mismatches[:50]]
    if len(mismatches) > 50:
        lines.append(f"  ... and {len(mismatches) - 50} more")
    lines.append("rebuild with this processor (--processor) so the counts match, or train with the processor the "
                 "build was made for")
    return "\n".join(lines)


def verify_against_processor_or_raise(out: str | Path, processor: str, **kwargs: Any) -> str:
    """The CLI's form: a line when the ids agree, :class:`~packer.errors.VerifyError` (exit 6) listing them when not."""
    from packer.errors import VerifyError

    mismatches, checked = verify_against_processor(out, processor, **kwargs)
    text = report(mismatches, checked, processor)
    if mismatches:
        raise VerifyError(f"{out}: {text}")
    return f"{out}: {text}"


__all__ = ["Mismatch", "report", "upright_video", "verify_against_processor"]
