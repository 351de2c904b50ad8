"""The equivalence harness every model family is tested with: a family is done when all of these pass.

For a family (``tests/family_assets.py``: its processor saved into a checkpoint folder, its tiny model):

1. awkward records are written (:func:`write_records`: thin, 1x1, EXIF-rotated, 16-bit and animated images,
   1 to 30 images in a record, clips from 0.1 s to 20 s with a variable frame rate and a rotation, frame
   lists with and without a rate, audio 0.1-60 s at 8-48 kHz, several turns, a system prompt, text only);
2. packer builds them with ``--family NAME --processor FOLDER`` (the folder also gives the tokenizer and
   the chat template);
3. :func:`check_ids`: each packed segment's ``input_ids`` equal what the HF processor returns for that
   record run the plain HF way -- ``processor.apply_chat_template(messages, tokenize=False)`` then
   ``processor(text=..., images=..., videos=..., audio=...)`` on the record's own files (videos decoded by
   transformers' PyAV reader and sampled by the processor itself);
4. :func:`check_equivalence`: through ``model(**model_inputs(batch))`` the packed rows give every segment
   the logits the record gets alone (positions computed by the model), and the loss gradients equal the
   sum over the records run alone, towers included;
5. :func:`check_sequence_parallel`: sliced for sequence parallelism, each rank's placeholders take the rows of
   the unsliced batch's features the model scatters there.

The families are the registry's (``packer.families.FAMILIES``): each declares its assets and what differs as data
(``tests/assets_<module>.py``, :mod:`family_assets`); :func:`family_build` builds the harness's records for it once a
session, and :func:`conformance` makes its :class:`FamilyConformance`. A family's own test module
(``tests/test_family_<name>.py``) names it (``FAMILY``) and holds ``TestConformance = conformance(FAMILY)`` beside the
family's own tests, which take the same build (the ``built`` and ``alone`` fixtures of ``tests/conftest.py``); a
registered family without one runs its suite from ``tests/test_family_conformance.py``.
"""

from __future__ import annotations

import dataclasses
import inspect
import json
import tomllib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from family_assets import assets_for, declared_families, read
from media_fixtures import write_audio, write_images, write_videos

from packer.build import build
from packer.config import resolve
from packer.loader import PackedCollator, PackedDataset, model_inputs, packed_loss

IGNORE = -100
QUESTIONS = ["What is shown here?", "Describe it.", "Which colours do you see?", "Is it bright?", "Count the shapes."]
ANSWERS = ["A gradient with some noise.", "It fades from dark to light.", "Mostly red and blue tones.", "Yes, fairly.",
           "There are none: it is a gradient."]
IMAGE_CYCLE = ["exif6.jpg", "thin_10x2000.png", "one_1x1.png", "cmyk.jpg", "gray16.png", "palette_alpha.png",
               "animated.gif", "photo.webp", "plain_300x200.jpg", "exif8.jpg", "flat_2600x13.png"]


def write_media(folder: Path, kinds: tuple[str, ...]) -> dict[str, Path]:
    files: dict[str, Path] = {}
    if "image" in kinds or "video" in kinds:
        files.update(write_images(folder / "img"))
    if "audio" in kinds:
        files.update(write_audio(folder / "aud"))
    if "video" in kinds:
        files.update(write_videos(folder / "vid"))
    return files


def _part(kind: str, name: Any, files: dict[str, Path], root: Path, fps: float | None = None) -> dict:
    if isinstance(name, list):  # a frame list
        part = {"type": "video", "video": [str(files[n].relative_to(root)) for n in name]}
        if fps:
            part["fps"] = fps
        return part
    return {"type": kind, kind: str(files[name].relative_to(root))}


def record_media(kinds: tuple[str, ...], images: list[str], audio: list[str], videos: list[str]) -> list[list[tuple]]:
    """Per record, the (kind, name[, fps]) media of its first user turn; the sets a family's kinds allow."""
    sets: list[list[tuple]] = []
    if "image" in kinds:
        sets += [[("image", "exif6.jpg")], [("image", n) for n in ("thin_10x2000.png", "one_1x1.png", "flat_2600x13.png")],
                 [("image", IMAGE_CYCLE[k % len(IMAGE_CYCLE)]) for k in range(30)],  # 30 images
                 [("image", "gray16.png"), ("image", "animated.gif")], [("image", "plain_300x200.jpg")]]
    if "video" in kinds:
        sets += [[("video", "odd_17f.mp4")], [("video", "twenty_s.mp4")], [("video", "tenth_s.mp4"), ("video", "rot90_2s.mp4")],
                 [("video", "one_s_vfr.mp4")], [("video", "thin_16x200.mp4")],
                 [("video", ["plain_300x200.jpg"] * 5)], [("video", ["plain_300x200.jpg"] * 6, 2.0)]]
        if "image" in kinds:
            sets.append([("video", "odd_17f.mp4"), ("image", "photo.webp")])
    if "audio" in kinds:
        sets += [[("audio", n)] for n in audio]
    sets.append([])  # text only
    return sets


def write_records(folder: Path, kinds: tuple[str, ...], files: dict[str, Path], name: str = "records.jsonl") -> tuple[Path, list[dict]]:
    """Records holding the awkward media, one JSONL file in ``folder``; returns (its path, the records)."""
    audio = [n for n in files if n.endswith((".wav", ".flac", ".ogg", ".mp3"))]
    records = []
    for k, media in enumerate(record_media(kinds, [], audio, [])):
        parts = [_part(m[0], m[1], files, folder, m[2] if len(m) > 2 else None) for m in media]
        user = [*parts, {"type": "text", "text": QUESTIONS[k % len(QUESTIONS)]}]
        messages = [{"role": "user", "content": user}, {"role": "assistant", "content": ANSWERS[k % len(ANSWERS)]}]
        if k % 3 == 1:
            messages = [{"role": "system", "content": "Answer briefly."}, *messages,
                        {"role": "user", "content": [{"type": "text", "text": "And then?"}]},
                        {"role": "assistant", "content": "Nothing more."}]
        records.append({"id": f"r{k}", "messages": messages})
    path = folder / name
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path, records


def build_family(family: str, processor_folder: Path, source: Path, out: Path,
                 quarantined: dict[str, str] | None = None, **settings: Any) -> dict:
    """Build ``source``; nothing is quarantined but the records ``quarantined`` names (id -> reason)."""
    manifest = build(resolve(None, input=[str(source)], output=str(out), family=family, processor=str(processor_folder),
                             max_length=settings.pop("max_length", 4096), order="planner",
                             max_bad_fraction=1.0 if quarantined else 0.0, **settings), progress=False).to_dict()
    lines = (out / "quarantine.jsonl").read_text().splitlines() if quarantined else []
    found = {json.loads(line)["id"]: json.loads(line)["reason"] for line in lines}
    assert found == (quarantined or {}), found
    assert manifest["accounting"]["quarantined"] == len(found), manifest["accounting"]
    return manifest


# ---------------------------------------------------------------- the plain HF way


def hf_inputs(processor, record: dict, root: Path, nest_images: bool = False,
              call: dict[str, Any] | None = None) -> dict[str, Any]:
    """The record through its HF processor: the template rendered, its own files loaded as transformers loads
    them (``load_image``; ``load_video`` with PyAV, every frame, sampled by the processor; ``load_audio``).
    ``nest_images``: the images as one list for the one text (``[[...]]``, what ``apply_chat_template`` hands the
    processor), for a family whose processor treats a record's several images apart (LLaVA-OneVision).
    ``call``: keyword arguments of the processor call (Gemma 3's ``do_pan_and_scan=True``). A rendering that
    starts with the tokenizer's BOS is tokenized without adding another, the rule of the processor's
    ``apply_chat_template(tokenize=True)`` (Gemma's tokenizers add a BOS, and their templates write one). A content
    part written without its type (``{"audio": ref}``, as packer reads it) is given one for the template."""
    from transformers.audio_utils import load_audio
    from transformers.image_utils import load_image
    from transformers.video_utils import load_video

    messages = [{**m, "content": [_typed(p) for p in m["content"]]} if isinstance(m.get("content"), list) else m
                for m in record["messages"]]
    text = processor.apply_chat_template(messages, tokenize=False)
    images, videos, metadata, audio = [], [], [], []
    for message in messages:
        content = message["content"]
        for part in content if isinstance(content, list) else []:
            kind = part["type"]
            if kind == "image":
                images.append(load_image(str(root / part["image"])))
            elif kind == "video":
                if isinstance(part["video"], list):
                    videos.append([load_image(str(root / f)) for f in part["video"]])
                    metadata.append({"total_num_frames": len(part["video"]), "fps": part["fps"]} if part.get("fps") else None)
                else:
                    frames, meta = load_video(str(root / part["video"]), backend="pyav")
                    videos.append(_upright(frames, root / part["video"]))
                    metadata.append(meta)
            elif kind == "audio":
                rate = processor.feature_extractor.sampling_rate
                audio.append(load_audio(str(root / part["audio"]), sampling_rate=rate))
    kwargs: dict[str, Any] = dict(call or {})
    bos = processor.tokenizer.bos_token
    if bos is not None and text.startswith(bos):
        kwargs["add_special_tokens"] = False
    if images:
        kwargs["images"] = [images] if nest_images else images
    if videos:
        kwargs["videos"] = videos
        if any(m is not None for m in metadata):
            kwargs["video_metadata"] = [m if m is not None else {"total_num_frames": len(v)} for m, v in zip(metadata, videos)]
    if audio:
        kwargs["audio"] = audio
    return processor(text=[text], return_tensors="pt", **kwargs)


def _typed(part: dict) -> dict:
    """A content part with its ``type``: packer reads ``{"audio": ref}`` as an audio part, the template needs the type."""
    if "type" in part:
        return part
    return {"type": next((k for k in ("image", "video", "audio") if k in part), "text"), **part}


def _upright(frames: np.ndarray, path: Path) -> np.ndarray:
    """transformers' PyAV reader ignores a clip's display rotation (a phone's portrait clip comes out on its
    side); packer's convention, like EXIF for images, is the upright frame: turn them as packer does."""
    from packer.media.video import probe_video

    rotation = probe_video(str(path)).rotation
    return np.ascontiguousarray(np.rot90(frames, k=rotation // 90, axes=(1, 2))) if rotation else frames


def segments(row: dict) -> list[tuple[int, int, str]]:
    cu = np.asarray(row["cu_seqlens"])
    return [(int(a), int(b), row["segment_ids"][k]) for k, (a, b) in enumerate(zip(cu[:-1], cu[1:], strict=True))]


def check_ids(ds: PackedDataset, processor, records: list[dict], root: Path, nest_images: bool = False,
              call: dict[str, Any] | None = None) -> int:
    """Every packed segment's ids equal the HF processor's ids for its record; returns the segments checked."""
    by_id = {r["id"]: r for r in records}
    checked = 0
    for row in (ds[i] for i in range(len(ds))):
        for a, b, rid in segments(row):
            expected = hf_inputs(processor, by_id[rid], root, nest_images, call)["input_ids"][0].tolist()
            got = np.asarray(row["input_ids"][a:b]).tolist()
            assert got == expected, f"{rid}: packer {len(got)} ids, the HF processor {len(expected)}"
            checked += 1
    assert checked == len(records)
    return checked


def _ce(logits: torch.Tensor, labels: np.ndarray) -> tuple[torch.Tensor, int]:
    target = torch.as_tensor(labels[1:], dtype=torch.long)
    ce = torch.nn.functional.cross_entropy(logits[:-1], target.clamp(min=0), reduction="none") * (target != IGNORE)
    return ce.sum(), int((target != IGNORE).sum())


def check_equivalence(model, ds: PackedDataset, processor, records: list[dict], root: Path, impl: str,
                      rows: list[int] | None = None, towers: tuple[str, ...] = ("visual", "vision_tower", "audio_tower"),
                      nest_images: bool = False, reference_mask: bool = False, call: dict[str, Any] | None = None,
                      **collator: Any) -> None:
    """Packed rows through ``model(**model_inputs(batch))`` = each record alone through the HF processor and the
    model (positions computed by the model): logits per segment (relative 1e-4) and gradients (1e-4).
    ``reference_mask``: keep the processor's all-ones ``attention_mask`` in the record-alone call (Qwen3-Omni's
    thinker computes its 3-D positions only when given one); ``call``: the processor call's options (:func:`hf_inputs`).

    The packed batch runs first; then each record alone, its logits compared and its share of the loss
    backpropagated at once, so at most one record's graph is held (logits are vocabulary-wide)."""
    by_id = {r["id"]: r for r in records}
    picked = [ds[i] for i in (rows if rows is not None else range(len(ds)))]
    collate = PackedCollator(attention=impl, pad_to_multiple_of=64, processor=processor, family=ds.family, **collator)
    batch = collate(picked)
    model.zero_grad()
    logits = model(**model_inputs(batch)).logits
    packed_loss(logits, batch).backward()
    logits = logits.detach()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}

    model.zero_grad()
    n_total = sum(int((np.asarray(row["labels"][a + 1 : b]) != IGNORE).sum()) for row in picked for a, b, _ in segments(row))
    for r, row in enumerate(picked):
        for a, b, rid in segments(row):
            enc = hf_inputs(processor, by_id[rid], root, nest_images, call)
            if not reference_mask:
                enc.pop("attention_mask", None)
            if "token_type_ids" not in inspect.signature(model.forward).parameters:  # the wrapper's own names hide them
                enc.pop("token_type_ids", None)
            alone = model(**enc, use_cache=False).logits[0]
            ref = alone.detach()
            diff = (logits[r, a:b] - ref).abs().max() / ref.abs().max()
            assert diff <= 1e-4, f"row {r} segment {rid}: relative logit difference {diff:.2e}"
            loss, _ = _ce(alone, np.asarray(row["labels"][a:b]))
            (loss / n_total).backward()
            del alone, loss
    grads_ref = {n: p.grad for n, p in model.named_parameters() if p.grad is not None}
    compared = 0
    floor = 1e-6 * max(g.abs().max() for g in grads_ref.values())  # gradients that are zero in exact arithmetic
    for name, _ in model.named_parameters():
        if name not in grads_ref:
            assert name not in grads or not grads[name].any(), name
            continue
        ref = grads_ref[name]
        scale = ref.abs().max().clamp(min=floor)
        assert name in grads, f"{name} has a gradient alone and none packed"
        assert (grads[name] - ref).abs().max() / scale <= 1e-4, f"gradient of {name}"
        compared += any(t in name for t in towers)
    assert compared > 0, "the towers' gradients were not compared"


def check_flex_forward(flex_model, reference_model, ds: PackedDataset, processor, records: list[dict], root: Path,
                       rows: list[int], call: dict[str, Any] | None = None, **collator: Any) -> None:
    """FlexAttention on a CPU, forward only (its backward needs CUDA): packed rows through ``flex_model`` with the
    collator's ``BlockMask`` s give each segment the logits ``reference_model`` (same weights, sdpa) gives the
    record alone (relative 1e-4)."""
    import warnings

    by_id = {r["id"]: r for r in records}
    picked = [ds[i] for i in rows]
    # static shapes only: a recompile for other shapes would go dynamic, and inductor's dynamic-shape flex kernel for
    # the CPU does not compile with torch 2.11 (CppCompileError)
    torch._dynamo.reset()
    with torch.no_grad(), warnings.catch_warnings(), torch._dynamo.config.patch(automatic_dynamic_shapes=False):
        warnings.simplefilter("ignore")
        batch = PackedCollator(attention="flex", pad_to_multiple_of=128, processor=processor, family=ds.family,
                               **collator)(picked)
        logits = flex_model(**model_inputs(batch)).logits
        for r, row in enumerate(picked):
            for a, b, rid in segments(row):
                enc = hf_inputs(processor, by_id[rid], root, call=call)
                enc.pop("attention_mask", None)
                ref = reference_model(**enc, use_cache=False).logits[0]
                diff = (logits[r, a:b] - ref).abs().max() / ref.abs().max()
                assert diff <= 1e-4, f"flex: row {r} segment {rid}: relative logit difference {diff:.2e}"


def check_pipeline_ids(pipeline: Path, out: Path) -> int:
    """A sample pipeline (``pipelines/NAME.toml``) built over ``sample_data/``: every packed segment of a record written
    in ``messages`` form with media parts has the ids its processor folder's processor (``AutoProcessor``) returns for
    that record. Returns the segments checked."""
    from transformers import AutoProcessor

    config = resolve(pipeline, output=str(out))  # paths relative to the pipeline file, as the CLI resolves them
    build(config, progress=False)
    processor = AutoProcessor.from_pretrained(config.processor)
    records = {}
    for f in config.input_files():
        for line in Path(f).read_text(encoding="utf-8").splitlines():
            try:
                r = json.loads(line)
            except ValueError:
                continue
            if isinstance(r, dict) and "id" in r and any(isinstance(m.get("content"), list) for m in r.get("messages", [])):
                records[r["id"]] = (r, Path(f).parent)
    ds = PackedDataset(out)
    checked = 0
    for row in (ds[i] for i in range(len(ds))):
        for a, b, rid in segments(row):
            if rid in records:
                record, root = records[rid]
                assert np.asarray(row["input_ids"][a:b]).tolist() == hf_inputs(processor, record, root)["input_ids"][0].tolist(), rid
                checked += 1
    return checked


def check_rows_collate(ds: PackedDataset, processor, model, forward: bool = True, **collator: Any) -> int:
    """No build writes a row its own loader refuses: every row of the build, alone, collates through
    ``PackedCollator.for_build`` (the build's family, the model's attention and config) with its media loaded and
    every count checked, reaches ``model_inputs`` and, with ``forward``, runs through the tiny model. Returns the
    media items loaded."""
    collate = PackedCollator.for_build(ds, model, processor=processor, **collator)
    items = 0
    with torch.no_grad():
        for i in range(len(ds)):
            batch = collate([ds[i]])
            inputs = model_inputs(batch, model)
            items += sum(not m.get("dummy") for m in batch["media"])
            if forward:
                model(**inputs)
    return items


# ---------------------------------------------------------------- the conformance suite

TOKEN_TYPES = {"image": 1, "video": 2, "audio": 3}  # the value a placeholder of each kind has in a token-type column


def covering_rows(ds: PackedDataset, rows: list[int]) -> list[int]:
    """Of ``rows``, a few that between them hold every media kind ``rows`` hold: packed rows (two segments or more)
    before single ones, shorter before longer, each taken only for a kind not yet held."""
    chosen, seen = [], set()
    for i in sorted(rows, key=lambda i: (len(ds[i]["cu_seqlens"]) < 3, ds[i]["n_tokens"])):
        kinds = {m["kind"] for m in ds[i]["media"]}
        if kinds - seen or not chosen:
            chosen.append(i)
            seen |= kinds
    return sorted(chosen)


def media_kinds(ds: PackedDataset, rows: list[int] | None = None) -> set[str]:
    return {m["kind"] for i in (rows if rows is not None else range(len(ds))) for m in ds[i]["media"]}


def check_sequence_parallel(ds: PackedDataset, mode: str, sizes: tuple[int, ...] = (2, 3), layer_types: set[str] | None = None,
                            **collator: Any) -> int:
    """Every row of ``ds`` in one batch, sliced for each of ``sizes`` sequence-parallel ranks: each rank's placeholders take
    exactly the rows of the unsliced batch's features the model scatters there (``local_media_rows``; text a family
    writes between a span's runs takes none), kinds sharing one placeholder (InternVL's images and frames) together;
    the masks of ``layer_types`` (a family whose masks depend on the layer) stay global; a token-type column
    (``token_type_ids``, ``mm_token_type_ids``) and ``visual_pos_masks`` (DeepStack) follow the slice. Returns the
    spans of several runs (text between them) the batch holds."""
    from test_sequence_parallel import global_position

    from packer.loader import local_media_rows, shard_for_sequence_parallel

    batch = PackedCollator(attention="varlen" if mode == "ring" else "sdpa", family=ds.family, **collator)(
        [ds[i] for i in range(len(ds))])
    run_ids, kinds = ds.family["run_ids"], sorted({m["kind"] for m in batch["media"]})
    sharing: dict[int, list[str]] = {}  # placeholder -> the kinds whose features it takes
    for kind in kinds:
        sharing.setdefault(run_ids[kind], []).append(kind)
    feature = {}
    for token, shared in sharing.items():
        assert len(shared) == 1 or shared == kinds, sharing
        where = batch["input_ids"] == token
        assert int(where.sum()) == sum(m["tokens"] for m in batch["media"] if m["kind"] in shared), shared
        feature[token] = (where.flatten().cumsum(0) - 1).reshape(where.shape)  # row-major: k-th placeholder, k-th row
    cut = 0
    for size, rank in ((n, r) for n in sizes for r in range(n)):
        part = shard_for_sequence_parallel(batch, rank, size, mode=mode)
        ids = part["input_ids"]
        if layer_types:
            assert set(part["attention_mask"]) == set(batch["attention_mask"]) == layer_types, (size, rank)
        for token, shared in sharing.items():
            local = torch.nonzero(ids == token).tolist()
            at = [(b, int(part["global_index"][t]) if mode == "ulysses" else global_position(part, mode, t)) for b, t in local]
            rows = local_media_rows(part["media"], batch["media"], kind=shared[0] if len(shared) == 1 else None)
            assert rows.tolist() == [int(feature[token][b, g]) for b, g in at], (size, rank, shared)
        for column in ("token_type_ids", "mm_token_type_ids"):
            for kind in kinds if column in batch else ():
                assert torch.equal(part[column] == TOKEN_TYPES[kind], ids == run_ids[kind]), (size, rank, column, kind)
        if "visual_pos_masks" in part:
            visual = [run_ids[k] for k in ("image", "video") if k in run_ids]
            assert torch.equal(part["visual_pos_masks"], torch.isin(ids, torch.tensor(visual))), (size, rank)
        cut += any(p["offset"] > 0 for p in part["media"])
    assert cut, "no span is cut between ranks"
    return sum(len(m.get("runs") or []) > 1 for m in batch["media"])


def _parts(record: dict) -> list[dict]:
    return [p for m in record["messages"] if isinstance(m["content"], list) for p in m["content"]]


@dataclass(frozen=True)
class Built:
    """A family's build of the harness's records: its folder, the records, the processor (a checkpoint folder loaded
    back) and a maker of the family's tiny model."""

    family: str
    out: Path  # the build folder
    root: Path  # the records' folder (their media paths are relative to it)
    records: list[dict]
    processor: Any
    model: Callable[..., Any]  # (impl, **config) -> a tiny random-init model of the family's class
    manifest: dict[str, Any] = field(default_factory=dict)
    nest_images: bool = False  # the processor takes a record's images as one list (LLaVA-OneVision)
    forward: bool = True  # every row runs through the model (Qwen3.5 refuses packed rows on CPU)
    call: dict[str, Any] | None = None  # the processor call's options the build was made for (Gemma 3's pan and scan)
    refused: list[dict] = field(default_factory=list)  # records of the harness the processor refuses (left out)


_BUILDS: dict[tuple[str, str], Built] = {}  # (family, "" or the alone build's folder) -> its build, once a session


def family_build(name: str, tmp_path_factory) -> Built:
    """The harness's awkward records built for the registered family ``name`` as its assets declare (the kinds, the
    records kept, the build settings over ``max_segments=4``, the records quarantined), once a session."""
    key = (name, "")
    if key not in _BUILDS:
        assets = assets_for(name)
        root = tmp_path_factory.mktemp(name)
        files = write_media(root, assets.kinds)
        source, records = write_records(root, assets.kinds, files)
        refused: list[dict] = []
        if assets.records is not None:
            records, refused = assets.records(root, records)
            source.write_text("".join(json.dumps(r) + "\n" for r in records))
        processor = assets.processor(root / "checkpoint")
        manifest = build_family(name, root / "checkpoint", source, root / "out", quarantined=assets.quarantined or None,
                                **{"max_segments": 4, **assets.build})
        kept = [r for r in records if r["id"] not in assets.quarantined]
        _BUILDS[key] = Built(name, root / "out", root, kept, processor, _model_maker(assets.model, processor), manifest,
                             nest_images=assets.nest_images, forward=assets.forward, refused=refused)
    return _BUILDS[key]


def alone_build(name: str, tmp_path_factory) -> Built:
    """The packed == alone check's build the family declares (:class:`family_assets.Alone`), once a session; the
    harness's build where it declares none."""
    built, spec = family_build(name, tmp_path_factory), assets_for(name).alone
    if spec is None:
        return built
    key = (name, spec.out)
    if key not in _BUILDS:
        root = built.root
        records, source = built.records, root / "records.jsonl"
        if spec.keep is not None:
            records = [r for r in records if spec.keep(r)]
            source = root / f"{spec.out}.jsonl"
            source.write_text("".join(json.dumps(r) + "\n" for r in records))
        manifest = build_family(name, root / "checkpoint", source, root / spec.out,
                                **{"max_segments": 4, **assets_for(name).build, **spec.build})
        _BUILDS[key] = dataclasses.replace(built, out=root / spec.out, records=records, manifest=manifest, call=spec.call)
    return _BUILDS[key]


def _model_maker(model: Callable[..., Any], processor) -> Callable[..., Any]:
    def make(impl: str, **config: Any):
        return model(processor, impl, **config)

    return make


def sample_pipelines(name: str) -> list[Path]:
    """The pipelines of ``pipelines/`` over sample_data that name the family ``name``."""
    from conftest import ROOT

    return [path for path in sorted((ROOT / "pipelines").glob("*.toml"))
            if tomllib.loads(path.read_text()).get("family") == name]


class FamilyConformance:
    """What every registered family is tested for, written once; :func:`conformance` makes a family's subclass, its
    differences below taken from its declared assets; ``tests/test_family_interface.py`` checks that every named
    family runs it.

    The packed == alone check runs on the ``alone`` fixture's build (``built`` unless the family declares another: a
    build of fewer records, or Gemma 3's pan and scan), on :meth:`alone_rows`; sequence parallelism is checked on
    both builds."""

    family = ""
    towers: tuple[str, ...] = ("visual", "vision_tower", "audio_tower")  # whose gradients must be among those compared
    rows_per_batch: int = 2  # rows of a batch in the packed == alone check, longest first: rows of a length together (a
    #                          batch pads its rows to its longest, and its logits are vocabulary-wide)
    max_images: int | None = None  # rows holding a record of more images are left out of it (their logits are wide)
    reference_mask: bool = False  # the record alone keeps the processor's attention_mask (see check_equivalence)
    sp_modes: tuple[str, ...] = ("ulysses",)  # the sequence-parallel modes the family's batches are sliced for
    sp_refused: str | None = None  # the refusal (a match) where the family's layers cannot be sliced
    split_runs: bool = False  # the builds hold spans of several runs (timestamps, crops, tiles): SP must meet them

    def pytest_generate_tests(self, metafunc):
        if "sp_mode" in metafunc.fixturenames:
            metafunc.parametrize("sp_mode", self.sp_modes)

    @pytest.fixture
    def case(self, tmp_path_factory):
        return family_build(self.family, tmp_path_factory)

    @pytest.fixture
    def alone(self, tmp_path_factory):
        return alone_build(self.family, tmp_path_factory)

    def alone_rows(self, ds: PackedDataset, records: list[dict], impl: str) -> list[int]:
        """The rows of the packed == alone check: every row but those holding a record of over ``max_images`` under
        sdpa; under eager (the same masks, another kernel) the fewest of them that hold every media kind between
        them, rows of several segments first (:func:`covering_rows`)."""
        rows = list(range(len(ds)))
        if self.max_images is not None:
            many = {r["id"] for r in records if sum(p["type"] == "image" for p in _parts(r)) > self.max_images}
            rows = [i for i in rows if not many & set(ds[i]["segment_ids"])]
        return rows if impl == "sdpa" else covering_rows(ds, rows)

    def test_the_manifest_names_the_family_and_its_processor_class(self, case):
        from packer.families import FAMILIES

        family = case.manifest["tokenizer"]["family"]
        assert family["name"] == self.family and family["processor_class"] == FAMILIES[self.family].processor_class

    def test_ids_equal_the_hf_processor(self, case):
        assert case.family == self.family
        check_ids(PackedDataset(case.out), case.processor, case.records, case.root, nest_images=case.nest_images,
                  call=case.call)

    @pytest.mark.slow  # every row through the tiny model
    def test_every_row_of_the_build_collates_for_its_family(self, case):
        ds = PackedDataset(case.out)
        assert check_rows_collate(ds, case.processor, case.model("sdpa"), forward=case.forward) > 0

    @pytest.mark.slow  # a real forward and backward of every row compared
    @pytest.mark.parametrize("impl", ["sdpa", "eager"])
    def test_packed_rows_equal_each_record_alone(self, case, alone, impl):
        from packer.loader.isolation import check_packed_isolation

        ds = PackedDataset(alone.out)
        rows = self.alone_rows(ds, alone.records, impl)
        assert media_kinds(ds, rows) == media_kinds(PackedDataset(case.out)), "the rows compared miss a kind of media"
        model = alone.model(impl)
        assert check_packed_isolation(model) == []  # every layer keeps packed segments apart: nothing to refuse
        rows = sorted(rows, key=lambda i: -ds[i]["n_tokens"])
        for at in range(0, len(rows), self.rows_per_batch):
            check_equivalence(model, ds, alone.processor, alone.records, alone.root, impl,
                              rows=rows[at : at + self.rows_per_batch],
                              towers=self.towers, nest_images=alone.nest_images, reference_mask=self.reference_mask,
                              call=alone.call, model_config=model.config)

    def test_sequence_parallel_pieces_take_their_feature_rows(self, case, alone, sp_mode):
        from packer.families import FAMILIES
        from packer.loader import shard_for_sequence_parallel

        if self.sp_refused:
            ds = PackedDataset(case.out)
            batch = PackedCollator(attention="sdpa", family=ds.family)([ds[0]])
            with pytest.raises(ValueError, match=self.sp_refused):
                shard_for_sequence_parallel(batch, 0, 2, mode=sp_mode)
            return
        config = case.model("sdpa").config if FAMILIES[self.family].layer_masks else None  # masks per layer type
        types = set(config.get_text_config().layer_types) if config is not None else None
        split = sum(check_sequence_parallel(PackedDataset(out), sp_mode, layer_types=types, model_config=config)
                    for out in dict.fromkeys((case.out, alone.out)))
        assert split or not self.split_runs, "the builds hold no span of several runs"


    def test_settings_equal_the_processor(self, case):
        """The build's settings (its manifest's) equal its processor's, as the family declares them
        (:class:`family_assets.Equal`: ``FamilyAssets.settings``)."""
        from packer.families import FAMILIES

        settings = FAMILIES[self.family].settings_class(**case.manifest["tokenizer"]["family"]["settings"])
        check_settings(assets_for(self.family).settings, settings, case.processor)

    def test_defaults_equal_the_classes(self):
        """The family's settings without a checkpoint are its settings class's defaults, and they equal the
        transformers classes' defaults, as the family declares them (``FamilyAssets.defaults``)."""
        import transformers

        from packer.families import FAMILIES
        from packer.families.checkpoint import Checkpoint, read_checkpoint

        cls = FAMILIES[self.family].settings_class
        defaults = cls()
        assert cls.resolve(Checkpoint()) == defaults == cls.resolve(read_checkpoint(""))
        check_settings(assets_for(self.family).defaults, defaults, transformers)

    @pytest.mark.slow  # builds the sample pipeline
    def test_sample_pipeline_ids_equal_its_processor(self, tmp_path):
        """Each ``pipelines/*.toml`` naming the family, built over sample_data: its records' ids equal the sample
        processor folder's processor's."""
        assets = assets_for(self.family)
        if assets.sample_segments is None:
            pytest.skip(f"family {self.family} declares no sample pipeline check")
        pipelines = sample_pipelines(self.family)
        assert pipelines, f"no pipelines/*.toml names family {self.family}"
        for k, pipeline in enumerate(pipelines):
            assert check_pipeline_ids(pipeline, tmp_path / f"out{k}") >= assets.sample_segments, pipeline.name

    @pytest.mark.slow  # the real processor over a sample of the build, twice
    def test_verify_against_processor_passes_on_the_build_and_names_a_changed_setting(self, case, tmp_path):
        verify_against_processor_check(case, assets_for(self.family), tmp_path)


def check_settings(spec, settings: Any, source: Any, fixed: bool = True) -> None:
    """``settings`` (a family's settings object) equal what ``spec`` (:class:`family_assets.Equal`) reads off
    ``source``, row by row, and pass its exception; ``fixed``: they also equal its fixed values (not for another
    checkpoint than the test processor's, such as the sample one)."""
    for key, readers in spec.table.items():
        for reader in readers if isinstance(readers, tuple) else (readers,):
            _equal(getattr(settings, key), read(source, reader) if isinstance(reader, str) else reader(source), key)
    for key, value in spec.values.items() if fixed else ():
        _equal(getattr(settings, key), value, key)
    if spec.exception is not None:
        spec.exception(source, settings)


def _equal(got: Any, want: Any, key: str) -> None:
    if isinstance(want, bool) or want is None:
        assert got is want, (key, got, want)
    else:
        assert got == want, (key, got, want)


def verify_against_processor_check(built: Built, assets, tmp_path: Path) -> None:
    """``verify --against-processor`` as the family declares it (:class:`family_assets.Verify`): the build's own
    processor finds every sampled record equal; one saved with other settings finds image and video items differing,
    each mismatch a real one; through ``packer verify`` where declared (exit 0, then 6 naming the first difference)."""
    from packer.verify.against_processor import verify_against_processor

    spec = assets.verify
    if spec is None:
        pytest.skip(f"family {assets.name} declares no verify --against-processor check")
    root = built.root
    mismatches, checked = verify_against_processor(root / "out", str(root / "checkpoint"), sample=spec.sample)
    assert checked == spec.sample and mismatches == [], [str(m) for m in mismatches]
    if spec.cli:
        from click.testing import CliRunner

        from packer.cli import main

        ok = CliRunner().invoke(main, ["verify", str(root / "out"), "--against-processor", str(root / "checkpoint"),
                                       "--sample", "3"])
        assert ok.exit_code == 0 and "ids equal" in ok.output, ok.output
    other = assets.processor(tmp_path / "other", **spec.other)
    if spec.other_image_size is not None:
        other.image_processor.size = dict(spec.other_image_size)  # another max_pixels
        other.save_pretrained(str(tmp_path / "other"))
    mismatches, checked = verify_against_processor(root / "out", str(tmp_path / "other"), sample=spec.other_sample)
    assert mismatches and all(m.packer_tokens != m.processor_tokens or m.first_difference >= 0 for m in mismatches)
    assert {"image", "video"} <= {k for m in mismatches for k in ("image", "video") if k in m.detail}
    if spec.cli:
        bad = CliRunner().invoke(main, ["verify", str(root / "out"), "--against-processor", str(tmp_path / "other"),
                                        "--sample", str(spec.other_sample)])
        assert bad.exit_code == 6 and "differ from" in bad.output and "first difference at token" in bad.output, bad.output


_DIFFERENCES = ("towers", "rows_per_batch", "max_images", "reference_mask", "sp_modes", "sp_refused", "split_runs")
_CLASSES: dict[str, type[FamilyConformance]] = {}


def conformance(name: str) -> type[FamilyConformance]:
    """The registered family ``name``'s :class:`FamilyConformance`: its declared differences as class data, its own
    ``alone_rows`` where it declares one."""
    if name not in _CLASSES:
        assets = assets_for(name)
        body: dict[str, Any] = {"family": name, "__module__": __name__, **{k: getattr(assets, k) for k in _DIFFERENCES}}
        if assets.sample_segments is None:  # not collected: nothing declared to check
            body["test_sample_pipeline_ids_equal_its_processor"] = None
        if assets.verify is None:
            body["test_verify_against_processor_passes_on_the_build_and_names_a_changed_setting"] = None
        if assets.settings is None:
            body["test_settings_equal_the_processor"] = None
        if assets.defaults is None:
            body["test_defaults_equal_the_classes"] = None
        if assets.alone_rows is not None:
            rows = assets.alone_rows
            body["alone_rows"] = lambda self, ds, records, impl: rows(ds, records, impl)
        _CLASSES[name] = type(f"Conformance_{name}", (FamilyConformance,), body)
    return _CLASSES[name]


def unowned_conformance() -> dict[str, type[FamilyConformance]]:
    """The suites ``tests/test_family_conformance.py`` runs: every registered family without a test module of its
    own (``tests/test_family_<name>.py``), by the test class name it is collected under."""
    tests = Path(__file__).parent
    return {f"TestConformance_{name}": conformance(name) for name in declared_families()
            if not (tests / f"test_family_{name}.py").exists()}

