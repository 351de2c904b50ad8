"""Token-count policies against the worked numbers and HF's own processors, media probing
and the quarantine of bad media files."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import SAMPLE, TOKENIZER
from packer.encode import Encoder, EncoderSpec
from packer.errors import BadRecord, ConfigError
from packer.ingest.reader import RawLine
from packer.media.policies import AnyRes, Dynamic, Fixed, Qwen2Audio, Rate, Whisper, parse_policy
from packer.media.probe import probe_audio, probe_image


def test_worked_numbers():
    assert Fixed(model="ViT-L-14-336").count(100, 900).length == 576
    assert Fixed(model="ViT-L-14-336").count(1, 1).grid == (1, 24, 24)
    assert Fixed(model="ViT-B-32").count(5, 5).length == 49
    assert Fixed(image_size=224, patch_size=14, cls_token=True).count(5, 5).length == 257
    d = Dynamic()
    assert d.count(448, 448).length == 256 and d.count(448, 448).grid == (1, 16, 16)
    assert d.count(1080, 1920).length == 1222 and d.count(1080, 1920).grid == (1, 26, 47)
    a = AnyRes()
    assert [a.count(h, w).length for h, w in [(672, 672), (480, 640), (336, 336)]] == [2928, 2340, 1176]
    q = Qwen2Audio()
    assert q.count(160_000, 16_000).length == 250 and q.count(480_000, 16_000).length == 750
    assert q.count(441_000, 44_100).length == 250  # 10 s at 44.1 kHz
    assert q.count(1_600_000, 16_000).length == 750  # 100 s truncated to 30 s
    assert Qwen2Audio(long="split").count(1_600_000, 16_000).length == 3 * 750 + 250
    assert Whisper().count(16_000 * 45, 16_000).length == 3000 and Whisper(windows="one").count(16_000 * 45, 16_000).length == 1500
    assert Rate(per_second=25).count(16_000 * 3, 16_000).length == 75 and Rate().count(1, 16_000).length == 1


@settings(max_examples=300, deadline=None)
@given(st.integers(28, 4000), st.integers(28, 4000))
def test_dynamic_equals_hf_smart_resize(h, w):
    from transformers.models.qwen2_vl.image_processing_qwen2_vl import smart_resize

    hr, wr = smart_resize(h, w, factor=28, min_pixels=56 * 56, max_pixels=28 * 28 * 1280)
    assert Dynamic().resize(h, w) == (hr, wr)
    assert Dynamic().count(h, w).length == (hr // 28) * (wr // 28)


@pytest.fixture(scope="module")
def llava_next_processor():
    from transformers import AutoTokenizer, LlavaNextImageProcessor, LlavaNextProcessor

    return LlavaNextProcessor(image_processor=LlavaNextImageProcessor(), tokenizer=AutoTokenizer.from_pretrained(TOKENIZER),
                              patch_size=14, vision_feature_select_strategy="default")


@settings(max_examples=300, deadline=None)
@given(st.integers(16, 3000), st.integers(16, 3000))
def test_anyres_equals_hf_llava_next(llava_next_processor, h, w):
    assert AnyRes().count(h, w).length == llava_next_processor._get_number_of_features(h, w, 336, 336)


@pytest.mark.parametrize("seconds, rate", [(0.5, 16000), (1.0, 16000), (2.37, 22050), (10.0, 44100), (29.99, 8000), (31.0, 16000)])
def test_qwen2_audio_equals_hf_feature_extractor(seconds, rate):
    import torch
    import torchaudio.functional as F
    from transformers import WhisperFeatureExtractor

    n = int(seconds * rate)
    wave = torch.zeros(n)
    resampled = F.resample(wave, rate, 16000) if rate != 16000 else wave
    fe = WhisperFeatureExtractor(feature_size=128)
    mask = fe(resampled.numpy(), sampling_rate=16000, return_attention_mask=True, padding="max_length")["attention_mask"]
    frames = int(np.asarray(mask).sum())
    expected = ((frames - 1) // 2 + 1 - 2) // 2 + 1  # Qwen2AudioProcessor's formula
    assert Qwen2Audio().count(n, rate).length == expected


@pytest.mark.parametrize(
    "spec, match",
    [
        ("square", "unknown image token policy 'square'; known: anyres, dynamic, fixed"),
        ("dynamic:max_pix=5", "unknown parameter 'max_pix'"),
        ("dynamic:max_pixels=lots", "dynamic.max_pixels = 'lots' is not a valid int"),
        ("fixed:model=NoSuchNet", "open_clip has no model config 'NoSuchNet'"),
        ("fixed:image_size=100,patch_size=14", "not a multiple of patch_size"),
        ("anyres:pinpoints=big", "pinpoints 'big' must look like"),
    ],
)
def test_bad_image_policy_specs(spec, match):
    with pytest.raises(ConfigError, match=match):
        p = parse_policy(spec, "image")
        p.count(10, 10)


def test_bad_audio_policy_spec():
    with pytest.raises(ConfigError, match="unknown audio token policy 'mp3'"):
        parse_policy("mp3", "audio")
    with pytest.raises(ConfigError, match="whisper: windows must be ceil or one"):
        parse_policy("whisper:windows=two", "audio")


def test_probe_reads_headers():
    info = probe_image(str(SAMPLE / "images" / "tall_300x900.png"))
    assert (info.height, info.width, info.format) == (900, 300, "PNG")
    audio = probe_audio(str(SAMPLE / "audio" / "chord_a_minor_4s.wav"))
    assert (audio.frames, audio.sample_rate) == (4 * 22050, 22050)
    assert probe_audio(str(SAMPLE / "audio" / "tone_g3_7s.flac")).seconds == pytest.approx(7.5)


@pytest.fixture
def bad_media(tmp_path):
    png = (SAMPLE / "images" / "square_336.png").read_bytes()
    jpg = (SAMPLE / "images" / "photo_1024x768.jpg").read_bytes()
    flac = (SAMPLE / "audio" / "tone_c5_2s.flac").read_bytes()
    (tmp_path / "truncated.png").write_bytes(png[: len(png) // 2])
    (tmp_path / "truncated.jpg").write_bytes(jpg[: len(jpg) // 2])
    (tmp_path / "text.png").write_text("not an image at all")
    (tmp_path / "empty.png").write_bytes(b"")
    (tmp_path / "truncated.flac").write_bytes(flac[: len(flac) // 2])
    (tmp_path / "noise.wav").write_bytes(b"RIFF\x00\x00\x00\x00WAVEjunk" * 8)
    (tmp_path / "photo.txt").write_text("hello")
    shutil.copy(SAMPLE / "images" / "square_336.png", tmp_path / "ok.png")
    return tmp_path


def record(kind, ref):
    if kind == "image":
        return {"image": ref, "conversations": [{"from": "human", "value": "<image>"}, {"from": "gpt", "value": "ok"}]}
    return {"messages": [{"role": "user", "content": [{"type": "audio", "audio": ref}]}, {"role": "assistant", "content": "ok"}]}


@pytest.mark.parametrize(
    "kind, ref, check, reason, match",
    [
        ("image", "truncated.png", "verify", "corrupt_image", "damaged or truncated"),
        ("image", "truncated.jpg", "decode", "corrupt_image", "damaged or truncated"),
        ("image", "text.png", "verify", "corrupt_image", "not an image PIL can read"),
        ("image", "empty.png", "header", "corrupt_image", "not an image PIL can read"),
        ("image", "photo.txt", "header", "corrupt_image", "not an image"),
        ("image", "gone.png", "verify", "missing_image", "not found"),
        ("audio", "truncated.flac", "verify", "corrupt_audio", "not audio soundfile can read"),
        ("audio", "noise.wav", "verify", "corrupt_audio", "not audio soundfile can read"),
        ("audio", "ok.png", "verify", "corrupt_audio", "not audio soundfile can read"),
        ("audio", "gone.wav", "verify", "missing_audio", "not found"),
    ],
)
def test_bad_media_is_a_bad_record(bad_media, kind, ref, check, reason, match):
    enc = Encoder(EncoderSpec.of(tokenizer=TOKENIZER, image_check=check))
    with pytest.raises(BadRecord, match=match) as e:
        enc.encode_line(RawLine(1, json.dumps(record(kind, ref)).encode()), "x.jsonl", bad_media)
    assert e.value.reason == reason


def test_truncated_jpeg_passes_verify_but_not_decode(bad_media):
    """What the cheap check does not catch (documented in packer/media/probe.py)."""
    enc = Encoder(EncoderSpec.of(tokenizer=TOKENIZER, image_check="verify"))
    s = enc.encode_line(RawLine(1, json.dumps(record("image", "truncated.jpg")).encode()), "x.jsonl", bad_media)
    assert s.media[0].length == 576


def test_begin_end_tokens_wrap_placeholders_outside_the_span():
    spec = EncoderSpec.of(tokenizer=TOKENIZER, image_token="<|image_pad|>", image_begin="<|vision_start|>",
                       image_end="<|vision_end|>", image_tokens="dynamic")
    enc = Encoder(spec)
    rec = {"messages": [{"role": "user", "content": [{"type": "image", "image": "images/landscape_640x480.jpg"},
                                                     {"type": "text", "text": "What is it?"}]},
                        {"role": "assistant", "content": "Shapes."}]}
    s = enc.encode_line(RawLine(1, json.dumps(rec).encode()), "x.jsonl", SAMPLE)
    (span,) = s.media
    vocab = enc.tok.get_vocab()
    assert span.length == Dynamic().count(480, 640).length and span.llm_grid == (1, 17, 23)
    assert s.input_ids[span.start - 1] == vocab["<|vision_start|>"]
    assert s.input_ids[span.start + span.length] == vocab["<|vision_end|>"]
    assert np.all(s.input_ids[span.start : span.start + span.length] == vocab["<|image_pad|>"])
    assert np.all(s.labels[span.start - 1 : span.start + span.length + 1] == -100)


def test_audio_spans_follow_the_policy():
    enc = Encoder(EncoderSpec.of(tokenizer=TOKENIZER, audio_tokens="whisper"))
    rec = {"messages": [{"role": "user", "content": [{"audio": "audio/tone_g3_7s.flac"}, {"type": "text", "text": "Pitch?"}]},
                        {"role": "assistant", "content": "G3."}]}
    s = enc.encode_line(RawLine(1, json.dumps(rec).encode()), "x.jsonl", SAMPLE)
    assert [(m.kind, m.length, m.llm_grid) for m in s.media] == [("audio", 1500, (1,))]
    assert s.modality == "audio"


@pytest.fixture(scope="module")
def tiny_vit(tmp_path_factory):
    import open_clip

    d = tmp_path_factory.mktemp("oc")
    (d / "packer-tiny-vit.json").write_text(json.dumps({
        "embed_dim": 32,
        "vision_cfg": {"image_size": 64, "layers": 2, "width": 64, "patch_size": 16, "head_width": 32},
        "text_cfg": {"context_length": 16, "vocab_size": 1000, "width": 32, "heads": 2, "layers": 1},
    }))
    open_clip.add_model_config(d / "packer-tiny-vit.json")
    return "packer-tiny-vit"


@pytest.mark.parametrize("output, shape", [("pooled", [32]), ("tokens", [17, 64])])  # tokens: CLS + 4 x 4 patches
def test_image_embeddings_and_audio_features(tiny_vit, tmp_path, monkeypatch, output, shape):
    import pyarrow as pa

    from conftest import ROOT
    from packer.build import build, repack
    from packer.config import resolve
    from packer.loader.stored import StoredFeatures

    monkeypatch.chdir(ROOT)
    config = resolve(ROOT / "pipelines" / "sample.toml", output=str(tmp_path / "e"), image_embeddings=f"{tiny_vit}:random",
                     embed_output=output, embed_device="cpu", audio_features="whisper:feature_size=80")
    m = build(config, progress=False).to_dict()
    emb = m["embeddings"]
    assert emb["model"] == tiny_vit and emb["pretrained"] == "random" and emb["dtype"] == "float16"
    assert emb["preprocessing"]["image_size"] == [64, 64] and emb["images"] == 8
    table = pa.concat_tables([pa.ipc.open_stream(pa.memory_map(str(tmp_path / "e" / f["file"]))).read_all() for f in emb["files"]])
    packed_refs = {s["ref"] for f in m["files"]["packed"]
                   for r in pa.ipc.open_stream(pa.memory_map(str(tmp_path / "e" / f["file"]))).read_all().column("media").to_pylist()
                   for s in r if s["kind"] == "image"}
    assert set(table.column("ref").to_pylist()) == packed_refs
    for row in table.to_pylist():
        assert row["shape"] == shape and len(row["values"]) == int(np.prod(shape)) and np.isfinite(row["values"]).all()
    if output == "tokens":
        assert emb["layer"] == -2 and "class token first" in emb["layout"]
    stored = StoredFeatures(tmp_path / "e", "embeddings")
    assert set(stored) == packed_refs and all(stored[r].shape == tuple(shape) for r in packed_refs)
    feats = m["audio_features"]
    assert feats["clips"] == 5 and feats["feature_size"] == 80 and feats["dtype"] == "float32" and feats["frames"] == 3000
    audio = StoredFeatures(tmp_path / "e", "audio_features")
    assert audio["audio/tone_a4_1s.wav"].shape == (80, 3000) and audio["audio/tone_a4_1s.wav"].dtype == np.float32
    assert audio.valid_frames("audio/tone_a4_1s.wav") == 100  # 1 s at 10 ms hops; the rest is padding
    assert audio.valid_frames("audio/tone_g3_7s.flac") == 750
    m2 = repack(tmp_path / "e", output=str(tmp_path / "r"), max_length=8192, progress=False).to_dict()
    assert m2["embeddings"] == emb and (tmp_path / "r" / emb["files"][0]["file"]).exists()


def test_embedding_weights_are_checked_before_any_work(tmp_path, write_jsonl):
    from packer.build import build
    from packer.config import BuildConfig
    from packer.errors import PackerError

    f = write_jsonl("in.jsonl", [{"text": "x y z"}])
    config = BuildConfig(input=(str(f),), output=str(tmp_path / "o"), tokenizer=TOKENIZER,
                         image_embeddings="ViT-B-32:not-a-tag")
    with pytest.raises(PackerError, match="neither a checkpoint file nor a pretrained tag of ViT-B-32"):
        build(config, progress=False)
    assert not (tmp_path / "o" / "samples").exists()
