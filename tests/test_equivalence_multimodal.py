"""The product's claim on the real model classes: packed multimodal rows, through
``model(**model_inputs(batch))``, give each record the logits, loss and gradients
(vision / audio towers included) it gets run alone the plain HF way -- the HF processor
on the record's own files (``load_image`` / ``load_audio``), positions computed by the
model. fp32, tiny random models built from configs (tests/mm_models.py), sdpa and eager.

The media are the awkward fixtures (EXIF 6 / 8, a 10x2000 strip, CMYK, 16-bit, palette
+ alpha, animated GIF, WebP; clips from 20 ms to 45 s, 8-48 kHz, stereo, MP3 / OGG /
FLAC), so the build's counts and the processors' must agree on every one of them.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from media_fixtures import write_audio, write_images
from mm_models import FAMILIES

from conftest import TOKENIZER
from packer.build import build
from packer.config import resolve
from packer.loader import PackedCollator, PackedDataset, model_inputs, packed_loss

pytestmark = pytest.mark.slow  # ten real VLM / audio-LM forward and backward passes

IGNORE = -100
QUESTIONS = ["What is shown here?", "Describe it.", "Which colours do you see?", "Is it bright?", "Count the shapes."]
ANSWERS = ["A gradient with some noise.", "It fades from dark to light.", "Mostly red and blue tones.", "Yes, fairly.",
           "There are none: it is a gradient."]
IMAGE_SETS = {  # per family: which fixture images its records hold
    "qwen2vl": [["exif6.jpg", "thin_10x2000.png"], ["exif8.jpg", "cmyk.jpg"], [], ["palette_alpha.png", "one_1x1.png"],
                ["animated.gif", "photo.webp"], ["gray16.png", "flat_2600x13.png"], ["plain_300x200.jpg"]],
    "llava": [["exif6.jpg"], ["one_1x1.png"], [], ["thin_10x2000.png", "cmyk.jpg"], ["gray16.png"], ["animated.gif"],
              ["palette_alpha.png", "photo.webp"]],
    "llava_next": [["exif6.jpg"], ["exif8.jpg"], [], ["flat_2600x13.png"], ["gray16.png", "photo.webp"], ["animated.gif"],
                   ["plain_300x200.jpg"]],
}
IMAGE_SETS["qwen2_5vl"] = IMAGE_SETS["qwen2vl"]
AUDIO_SETS = [["1s_48k_stereo.wav"], ["3s_22k.ogg"], [], ["2s_44k.mp3", "1s_48k_stereo.wav"], ["29.99s_16k.flac"],
              ["31s_24k.flac"], ["45s_8k.flac"]]


@pytest.fixture(scope="module")
def media(tmp_path_factory):
    folder = tmp_path_factory.mktemp("media")
    return {**write_images(folder / "img"), **write_audio(folder / "aud")}, folder


def _records(family: str, media_files: dict[str, Path], root: Path) -> list[dict]:
    kind = FAMILIES[family].kinds[0]
    sets = AUDIO_SETS if kind == "audio" else IMAGE_SETS[family]
    records = []
    for k, names in enumerate(sets):
        parts = [{"type": kind, kind: str(media_files[n].relative_to(root))} for n in names]
        user = [*parts, {"type": "text", "text": QUESTIONS[k % len(QUESTIONS)]}]
        records.append({"id": f"{family}-{k}", "messages": [{"role": "user", "content": user},
                                                            {"role": "assistant", "content": ANSWERS[k % len(ANSWERS)]}]})
    return records


@pytest.fixture(scope="module")
def builds(media, tmp_path_factory):
    files, root = media
    out = {}
    for name, family in FAMILIES.items():
        path = root / f"{name}.jsonl"
        path.write_text("".join(json.dumps(r) + "\n" for r in _records(name, files, root)))
        dest = tmp_path_factory.mktemp(name) / "out"
        manifest = build(resolve(None, input=[str(path)], output=str(dest), tokenizer=TOKENIZER, max_length=2048,
                                 order="planner", max_bad_fraction=0.0, max_segments=4, **family.build), progress=False).to_dict()
        assert manifest["accounting"]["quarantined"] == 0, manifest["accounting"]
        out[name] = dest
    return out


def _alone(model, processor, tok, ids: np.ndarray, spans: list[dict], kind: str) -> torch.Tensor:
    """One record the plain HF way: its text with one placeholder per media item, its own
    files through the HF processor (which expands the placeholders), no positions given."""
    from transformers.audio_utils import load_audio
    from transformers.image_utils import load_image

    collapsed, cursor = [], 0
    for s in spans:
        collapsed += ids[cursor : s["start"]].tolist() + [int(ids[s["start"]])]
        cursor = s["start"] + s["length"]
    text = tok.decode(collapsed + ids[cursor:].tolist(), skip_special_tokens=False)
    if kind == "audio":
        rate = processor.feature_extractor.sampling_rate
        extra = {"audio": [load_audio(s["path"], sampling_rate=rate, backend="soundfile") for s in spans] or None}
    else:
        extra = {"images": [load_image(s["path"]) for s in spans] or None}
    enc = processor(text=[text], return_tensors="pt", **{k: v for k, v in extra.items() if v is not None})
    assert enc["input_ids"][0].tolist() == ids.tolist(), "packer's sample differs from the HF processor's expansion"
    enc.pop("attention_mask", None)
    return model(**enc, use_cache=False).logits[0]


def _segments(row: dict) -> list[tuple[int, int, list[dict]]]:
    cu = np.asarray(row["cu_seqlens"])
    out = []
    for k, (a, b) in enumerate(zip(cu[:-1], cu[1:], strict=True)):
        spans = [{**m, "start": m["start"] - int(a)} for m in row["media"] if m["segment"] == k]
        out.append((int(a), int(b), sorted(spans, key=lambda m: m["start"])))
    return out


def _ce(logits: torch.Tensor, labels: np.ndarray) -> tuple[torch.Tensor, int]:
    target = torch.as_tensor(labels[1:], dtype=torch.long)
    ce = torch.nn.functional.cross_entropy(logits[:-1], target.clamp(min=0), reduction="none") * (target != IGNORE)
    return ce.sum(), int((target != IGNORE).sum())


@pytest.mark.parametrize("impl", ["sdpa", "eager"])
@pytest.mark.parametrize("family", list(FAMILIES))
def test_packed_rows_equal_each_record_alone(family, impl, builds):
    fam = FAMILIES[family]
    ds = PackedDataset(builds[family])
    tok = ds.tokenizer()
    ids = ds.placeholder_ids
    assert {t: tok.convert_tokens_to_ids(t) for t in ids} == ids  # OUT/tokenizer gives the manifest's ids
    model = fam.model(ids, len(tok) + 1, impl)
    processor = fam.processor(tok)
    rope = "mrope" if family.startswith("qwen2") and "vl" in family else "default"
    rows = [ds[i] for i in range(len(ds))]
    assert len(rows) >= 2 and max(len(r["cu_seqlens"]) - 1 for r in rows) >= 2  # several records share a row

    model.zero_grad()
    total, n_total, reference = 0.0, 0, {}
    for r, row in enumerate(rows):
        for a, b, spans in _segments(row):
            logits = _alone(model, processor, tok, np.asarray(row["input_ids"][a:b]), spans, fam.kinds[0])
            reference[(r, a)] = logits.detach()
            loss, n = _ce(logits, np.asarray(row["labels"][a:b]))
            total, n_total = total + loss, n_total + n
    (total / n_total).backward()
    grads_ref = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}

    collate = PackedCollator(attention=impl, rope=rope, pad_to_multiple_of=64, processor=processor)
    batch = collate(rows)
    model.zero_grad()
    logits = model(**model_inputs(batch)).logits
    for r, row in enumerate(rows):
        for a, b, _ in _segments(row):
            ref = reference[(r, a)]
            diff = (logits[r, a:b] - ref).abs().max() / ref.abs().max()
            assert diff <= 1e-4, f"row {r} segment at {a}: relative logit difference {diff:.2e}"
    packed_loss(logits, batch).backward()
    towers = 0
    floor = 1e-6 * max(g.abs().max() for g in grads_ref.values())  # for gradients that are zero in exact arithmetic
    for name, p in model.named_parameters():
        if name not in grads_ref:
            assert p.grad is None or not p.grad.any(), name
            continue
        ref = grads_ref[name]
        scale = ref.abs().max().clamp(min=floor)
        assert (p.grad - ref).abs().max() / scale <= 1e-4, f"gradient of {name}"
        towers += any(t in name for t in ("visual", "vision_tower", "audio_tower"))
    assert towers > 0, "the towers' gradients were not compared"
