"""One media convention: what packer counts at build time is what the HF processors load
at train time, on awkward real files (EXIF rotation, tiny sides, CMYK, 16-bit, palette,
animation, very short and long clips), and the stored features are what the models take."""

from __future__ import annotations

import pickle

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st
from media_fixtures import write_audio, write_images

from conftest import TOKENIZER
from packer.errors import BadRecord, ConfigError
from packer.ingest.records import Part
from packer.media.counter import MediaCounter
from packer.media.load import load_audio, load_image
from packer.media.policies import AnyRes, Dynamic, Qwen2Audio, parse_policy
from packer.media.probe import probe_audio, probe_image

IMAGES = ["exif6.jpg", "exif8.jpg", "thin_10x2000.png", "flat_2600x13.png", "one_1x1.png", "cmyk.jpg", "gray16.png",
          "palette_alpha.png", "animated.gif", "photo.webp", "plain_300x200.jpg"]
CLIPS = ["5ms_16k.wav", "20ms_8k.wav", "1s_48k_stereo.wav", "2s_44k.mp3", "3s_22k.ogg", "29.99s_16k.flac", "31s_24k.flac",
         "45s_8k.flac"]


@pytest.fixture(scope="module")
def images(tmp_path_factory):
    return write_images(tmp_path_factory.mktemp("images"))


@pytest.fixture(scope="module")
def clips(tmp_path_factory):
    return write_audio(tmp_path_factory.mktemp("audio"))


def hf_size(path) -> tuple[int, int]:
    """(height, width) of the image as transformers loads it."""
    from transformers.image_utils import load_image as hf_load_image

    width, height = hf_load_image(str(path)).size
    return height, width


def whisper_frames(wave: np.ndarray, feature_size: int = 128) -> int:
    from transformers import WhisperFeatureExtractor

    fe = WhisperFeatureExtractor(feature_size=feature_size)
    out = fe(wave, sampling_rate=16000, padding="max_length", return_attention_mask=True)
    return int(np.asarray(out["attention_mask"]).sum())


def qwen2_audio_tokens(frames: int) -> int:
    """Qwen2AudioProcessor's own expansion of one <|AUDIO|> token."""
    return ((frames - 1) // 2 + 1 - 2) // 2 + 1


# ------------------------------------------------------------------ images


def test_fixtures_are_the_named_files(images, clips):
    assert list(images) == IMAGES and list(clips) == CLIPS and all(p.is_file() for p in [*images.values(), *clips.values()])


@pytest.mark.parametrize("name", IMAGES)
@pytest.mark.parametrize("check", ["header", "verify", "decode"])
def test_probed_size_is_the_loaded_size(images, name, check):
    info = probe_image(str(images[name]), check)
    assert (info.height, info.width) == hf_size(images[name])
    assert load_image(str(images[name])).size == (info.width, info.height) and load_image(str(images[name])).mode == "RGB"


def test_exif_orientation_swaps_the_stored_size(images):
    from PIL import Image

    for name in ("exif6.jpg", "exif8.jpg"):
        with Image.open(images[name]) as img:
            assert img.size == (60, 40) and img.getexif()[0x0112] in (6, 8)
        assert probe_image(str(images[name])).height == 60 and probe_image(str(images[name])).width == 40


@pytest.mark.parametrize("name", ["exif6.jpg", "thin_10x2000.png", "photo.webp", "animated.gif"])
def test_probe_decodes_no_pixels(images, name, monkeypatch):
    from PIL import ImageFile

    def refuse(self):
        raise AssertionError("probe decoded pixels")

    monkeypatch.setattr(ImageFile.ImageFile, "load", refuse)
    for check in ("header", "verify"):
        assert (probe_image(str(images[name]), check).height, probe_image(str(images[name]), check).width) > (0, 0)


@pytest.fixture(scope="module")
def qwen2vl_processor():
    from transformers import Qwen2VLImageProcessor

    return Qwen2VLImageProcessor()


@pytest.mark.parametrize("name", IMAGES)
def test_dynamic_counts_equal_qwen2vl_image_processor(images, qwen2vl_processor, name):
    grid = qwen2vl_processor(load_image(str(images[name])), return_tensors="np")["image_grid_thw"][0]
    count = MediaCounter("dynamic", "qwen2-audio").count(Part("image", ref=name, path=str(images[name])))
    assert count.length == int(np.prod(grid)) // 4
    assert count.grid == (int(grid[0]), int(grid[1]) // 2, int(grid[2]) // 2)  # what mRoPE positions are built from


def test_tiny_sides_follow_transformers_not_qwen_vl_utils():
    assert Dynamic().count(2000, 10).length == 29 and Dynamic().count(13, 2600).length == 29
    assert Dynamic().resize(1, 1) == (56, 56) and Dynamic().count(1, 1).length == 4
    clamped = parse_policy("dynamic:rounding=qwen-vl-utils", "image")
    assert clamped.count(2000, 10).length == 71 and clamped.count(13, 2600).length == 93
    with pytest.raises(ConfigError, match="rounding must be transformers or qwen-vl-utils, got 'hf'"):
        parse_policy("dynamic:rounding=hf", "image")


@settings(max_examples=500, deadline=None)
@given(st.integers(1, 5000), st.integers(1, 5000))
@example(2000, 10)
@example(13, 2600)
@example(1, 1)
@example(1, 200)
@example(1, 201)
@example(27, 27)
def test_dynamic_equals_smart_resize_for_every_size(h, w):
    from transformers.models.qwen2_vl.image_processing_qwen2_vl import smart_resize

    try:
        expected = smart_resize(h, w, factor=28, min_pixels=56 * 56, max_pixels=28 * 28 * 1280)
    except ValueError:
        with pytest.raises(ValueError, match="aspect ratio"):
            Dynamic().resize(h, w)
        return
    assert Dynamic().resize(h, w) == expected
    assert Dynamic().count(h, w).length == (expected[0] // 28) * (expected[1] // 28) >= 1


def test_refused_aspect_ratio_is_an_unsupported_image(tmp_path):
    from PIL import Image

    Image.new("RGB", (2010, 10)).save(tmp_path / "strip.png")
    with pytest.raises(BadRecord, match=r"strip.png.*2010x10.*aspect ratio 201 is over 200") as e:
        MediaCounter("dynamic", "qwen2-audio").count(Part("image", ref="strip.png", path=str(tmp_path / "strip.png")))
    assert e.value.reason == "unsupported_image"


@pytest.fixture(scope="module")
def llava_next_processor():
    from transformers import AutoTokenizer, LlavaNextImageProcessor, LlavaNextProcessor

    return LlavaNextProcessor(image_processor=LlavaNextImageProcessor(), tokenizer=AutoTokenizer.from_pretrained(TOKENIZER),
                              patch_size=14, vision_feature_select_strategy="default")


@pytest.mark.parametrize("name", IMAGES)
def test_anyres_counts_equal_llava_next_for_the_loaded_size(images, llava_next_processor, name):
    width, height = load_image(str(images[name])).size
    count = MediaCounter("anyres", "qwen2-audio").count(Part("image", ref=name, path=str(images[name])))
    assert count.length == llava_next_processor._get_number_of_features(height, width, 336, 336)
    assert count.length == AnyRes().count(height, width).length


def damaged(tmp_path, name: str, data: bytes) -> Part:
    (tmp_path / name).write_bytes(data)
    return Part("image", ref=name, path=str(tmp_path / name))


def test_decompression_bomb_is_a_bad_record(tmp_path, monkeypatch):
    from PIL import Image

    Image.new("L", (64, 64)).save(tmp_path / "bomb.png")
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 100)  # 64 x 64 > 2 x 100: PIL raises DecompressionBombError
    with pytest.raises(BadRecord, match=r"bomb.png.*implausibly large.*MAX_IMAGE_PIXELS") as e:
        probe_image(str(tmp_path / "bomb.png"))
    assert e.value.reason == "corrupt_image"


def test_decompression_bomb_warning_as_error_is_a_bad_record(tmp_path, monkeypatch):
    import warnings

    from PIL import Image

    Image.new("L", (64, 64)).save(tmp_path / "big.png")
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 3000)  # 4096 pixels: over the limit, under twice it -> a warning
    with warnings.catch_warnings():
        warnings.simplefilter("error", Image.DecompressionBombWarning)
        with pytest.raises(BadRecord, match=r"big.png.*damaged or truncated: DecompressionBombWarning") as e:
            probe_image(str(tmp_path / "big.png"))
    assert e.value.reason == "corrupt_image"


def test_damaged_exif_is_a_bad_record_not_a_crash(images, tmp_path):
    jpeg = images["exif6.jpg"].read_bytes()
    at = jpeg.index(b"Exif\x00\x00") + 6
    broken = jpeg[:at] + b"XX\x2a\x00\xff\xff\xff\xff" + jpeg[at + 8 :]  # bad byte order mark and IFD offset
    part = damaged(tmp_path, "badexif.jpg", broken)
    try:
        info = probe_image(part.path)
    except BadRecord as e:
        assert e.reason == "corrupt_image" and "badexif.jpg" in str(e)
    else:  # PIL may ignore the EXIF; then the size must still be what transformers loads
        assert (info.height, info.width) == hf_size(part.path)


# ------------------------------------------------------------------ audio


@pytest.mark.parametrize("name", CLIPS)
def test_qwen2_audio_counts_equal_the_feature_extractor(clips, name):
    path = str(clips[name])
    info = probe_audio(path)
    expected = qwen2_audio_tokens(whisper_frames(load_audio(path, 16000)))
    assert Qwen2Audio().count(info.frames, info.sample_rate).length == max(0, expected)
    counter = MediaCounter("fixed", "qwen2-audio")
    if expected <= 0:
        with pytest.raises(BadRecord, match=rf"{name}' is \d+\.\d ms: the encoder produces 0 positions") as e:
            counter.count(Part("audio", ref=name, path=path))
        assert e.value.reason == "audio_too_short"
    else:
        assert counter.count(Part("audio", ref=name, path=path)).length == expected


def test_the_shortest_clips_are_quarantined_not_given_one_token(clips):
    assert [Qwen2Audio().count(*(lambda i: (i.frames, i.sample_rate))(probe_audio(str(clips[n])))).length
            for n in ("5ms_16k.wav", "20ms_8k.wav")] == [0, 0]


@pytest.mark.parametrize("samples", [1, 160, 161, 320, 321, 480, 481, 640, 641, 799, 800, 801])
def test_qwen2_audio_boundaries_equal_qwen2_audio_processor(samples):
    from transformers import AutoTokenizer, Qwen2AudioProcessor, WhisperFeatureExtractor

    tok = AutoTokenizer.from_pretrained(TOKENIZER)
    tok.add_special_tokens({"additional_special_tokens": ["<|AUDIO|>", "<|audio_bos|>", "<|audio_eos|>"]})
    processor = Qwen2AudioProcessor(feature_extractor=WhisperFeatureExtractor(feature_size=128), tokenizer=tok)
    out = processor(text="<|audio_bos|><|AUDIO|><|audio_eos|>", audio=np.zeros(samples, np.float32), sampling_rate=16000,
                    return_tensors="np")
    expanded = int((out["input_ids"] == tok.convert_tokens_to_ids("<|AUDIO|>")).sum())
    assert Qwen2Audio().count(samples, 16000).length == expanded


# ------------------------------------------------------------------ stored audio features


def test_whisper_features_equal_the_feature_extractor(clips):
    from transformers import WhisperFeatureExtractor

    from packer.media.features import FeatureSpec, WhisperFeatures

    for size in (128, 80):
        ours = WhisperFeatures(FeatureSpec.parse(f"whisper:feature_size={size}"))
        fe = WhisperFeatureExtractor(feature_size=size)
        for name in ("5ms_16k.wav", "1s_48k_stereo.wav", "2s_44k.mp3", "45s_8k.flac"):
            features, valid = ours.features(str(clips[name]))
            ref = fe(load_audio(str(clips[name]), 16000), sampling_rate=16000, padding="max_length",
                     return_attention_mask=True)
            assert features.shape == (size, 3000) and features.dtype == np.float32
            np.testing.assert_allclose(features, np.asarray(ref["input_features"][0]), atol=1e-5, rtol=0)
            assert valid == int(np.asarray(ref["attention_mask"]).sum())


@pytest.mark.parametrize("spec, match", [
    ("log-mel", "log-mel was removed .* use whisper:feature_size=128"),
    ("log-mel:n_mels=128", "log-mel was removed"),
    ("mfcc", "unknown audio features 'mfcc'; known: whisper"),
    ("whisper:n_mels=80", "unknown parameter 'n_mels'; known: feature_size"),
    ("whisper:feature_size=many", "whisper.feature_size = 'many' is not a valid int"),
])
def test_bad_audio_feature_specs(spec, match):
    from packer.config import BuildConfig
    from packer.media.features import FeatureSpec

    with pytest.raises(ConfigError, match=match):
        FeatureSpec.parse(spec)
    with pytest.raises(ConfigError, match=match):
        BuildConfig(audio_features=spec)


def fake_build(tmp_path, section: str, files) -> None:
    """A manifest holding just the one section StoredFeatures reads."""
    from packer.shards import Accounting, Files, Manifest

    Manifest(config={}, tokenizer={}, files=Files(), accounting=Accounting(),
             sections={section: {"files": [f.__dict__ for f in files]}}).write(tmp_path)


def test_stored_audio_features_round_trip(clips, tmp_path):
    from packer.loader.stored import StoredFeatures
    from packer.media.features import FeatureSpec, WhisperFeatures
    from packer.shards.schema import AUDIO_FEATURE_SCHEMA
    from packer.stages.media_pass import _audio_item, _NoBar, run_pass

    extractor = WhisperFeatures(FeatureSpec())
    refs = {n: str(clips[n]) for n in ("1s_48k_stereo.wav", "3s_22k.ogg", "31s_24k.flac")}
    files = run_pass(tmp_path, "audio_features", refs, lambda ps: [_audio_item(extractor, p) for p in ps], 2,
                     128 * 3000 * 4 * 2, _NoBar(), AUDIO_FEATURE_SCHEMA)
    assert len(files) == 2  # two clips per shard
    fake_build(tmp_path, "audio_features", files)
    stored = pickle.loads(pickle.dumps(StoredFeatures(tmp_path, "audio_features")))
    assert len(stored) == 3 and "3s_22k.ogg" in stored and "nope.wav" not in stored
    for ref, path in refs.items():
        features, valid = extractor.features(path)
        assert stored[ref].dtype == np.float32 and stored[ref].shape == (128, 3000)
        np.testing.assert_array_equal(stored[ref], features)
        assert stored.valid_frames(ref) == valid and stored.attention_mask(ref).sum() == valid
    assert stored.valid_frames("31s_24k.flac") == 3000 and stored.valid_frames("1s_48k_stereo.wav") == 100
    with pytest.raises(KeyError, match="'nope.wav' has no stored audio_features"):
        stored["nope.wav"]


def test_stored_features_name_a_missing_section(tmp_path):
    from packer.loader.stored import StoredFeatures

    fake_build(tmp_path, "audio_features", [])
    with pytest.raises(KeyError, match="no 'embeddings' section; build it with --image-embeddings"):
        StoredFeatures(tmp_path, "embeddings")
    with pytest.raises(ValueError, match="section must be one of embeddings, audio_features, got 'pixels'"):
        StoredFeatures(tmp_path, "pixels")


# ------------------------------------------------------------------ image embeddings from a named layer


@pytest.fixture(scope="module")
def vit_b32():
    from packer.media.embed import EmbedSpec, ImageEmbedder

    embedders = {layer: ImageEmbedder(EmbedSpec("ViT-B-32", None, "tokens", "cpu", 4, layer)) for layer in (-2, -1, 0)}
    for e in embedders.values():  # random weights: make them the same ones
        e.visual.load_state_dict(embedders[-2].visual.state_dict())
    return embedders


def hooked_states(visual, pixels):
    """Every hidden state of an open_clip ViT, caught by our own hooks: [ln_pre, block 1, ..., block L]."""
    import torch

    states, handles = [], [visual.ln_pre.register_forward_hook(lambda m, i, o: states.append(o))]
    handles += [b.register_forward_hook(lambda m, i, o: states.append(o)) for b in visual.transformer.resblocks]
    with torch.inference_mode():
        pooled = visual(pixels)
    for h in handles:
        h.remove()
    return states, pooled


def test_embed_layer_is_the_hidden_state_llava_consumes(images, vit_b32):
    import torch

    paths = [str(images[n]) for n in ("exif6.jpg", "plain_300x200.jpg")]
    embedder = vit_b32[-2]
    pixels = torch.stack([embedder.preprocess(load_image(p)) for p in paths])
    states, _ = hooked_states(embedder.visual, pixels)
    assert len(states) == 13 and states[-2].shape == (2, 50, 768)  # ViT-B-32 at 224: CLS + 7 x 7 patches
    for layer, expected in ((-2, states[-2]), (-1, states[-1]), (0, states[0])):
        got = np.stack(vit_b32[layer].embed(paths))
        assert got.dtype == np.float16 and got.shape == (2, 50, 768)
        np.testing.assert_allclose(got.astype(np.float32), expected.float().numpy(), atol=2e-2, rtol=1e-2)
    with torch.inference_mode():
        final_norm = embedder.visual.ln_post(states[-1]).float().numpy()
    assert not np.allclose(np.stack(vit_b32[-1].embed(paths)).astype(np.float32), final_norm, atol=1e-1)
    assert vit_b32[-2].describe()["layer"] == -2 and "class token first" in vit_b32[-2].describe()["layout"]


def test_pooled_output_is_unchanged(images, vit_b32):
    import torch

    from packer.media.embed import EmbedSpec, ImageEmbedder

    pooled = ImageEmbedder(EmbedSpec("ViT-B-32", None, "pooled", "cpu", 4))
    pooled.visual.load_state_dict(vit_b32[-2].visual.state_dict())
    path = str(images["photo.webp"])
    with torch.inference_mode():
        expected = pooled.visual(pooled.preprocess(load_image(path))[None]).float().numpy()[0]
    got = pooled.embed([path])[0]
    assert got.shape == (512,) and "layer" not in pooled.describe()
    np.testing.assert_allclose(got.astype(np.float32), expected, atol=1e-2, rtol=1e-2)


def test_embed_layer_out_of_range(vit_b32):
    from packer.media.embed import EmbedSpec, ImageEmbedder

    with pytest.raises(ConfigError, match=r"--embed-layer 13 is out of range for ViT-B-32: it has 12 blocks, so hidden "
                                          r"states -13..12"):
        ImageEmbedder(EmbedSpec("ViT-B-32", None, "tokens", "cpu", 4, 13))
