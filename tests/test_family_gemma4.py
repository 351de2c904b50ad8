"""Gemma 4, token for token with ``Gemma4Processor`` and logit for logit with ``Gemma4ForConditionalGeneration``.

The processor is built in code (4 px patches, the 70-token budget, 3 frames a video, 16 mel bins) and saved into
a checkpoint folder that the build reads with ``--processor``; the chat template is a Gemma-4-style fixture.
Records hold the harness's awkward images, videos (0.1-20 s, VFR, rotated, frame lists with and without a rate)
and audio (5 ms to 45 s at 8-48 kHz). The 5 ms clip gives the audio encoder no position (the processor writes
``<|audio><audio|>`` around nothing): packer quarantines it (``audio_too_short``), the counted policy for
media that would reach the model as nothing.

The equivalence runs on a second build of the records without the two longest (30 images, 2 of the 3 clips over
29 s: each row's logits are vocabulary-wide) in rows of at most 1,024 tokens.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

pytest.importorskip("av")
pytest.importorskip("torchvision")

from assets_gemma4 import ASSETS, covering, gemma4_config  # noqa: E402
from assets_gemma4 import media_parts as _media  # noqa: E402
from family_harness import build_family, check_flex_forward, check_ids, conformance, hf_inputs, segments  # noqa: E402

from packer.families.gemma4 import Gemma4, Gemma4Settings  # noqa: E402
from packer.loader import PackedCollator, PackedDataset  # noqa: E402
from packer.media.video import probe_video  # noqa: E402

FAMILY = "gemma4"
TestConformance = conformance(FAMILY)  # packed == alone on the records without the longest; rows of every kind with eager


@pytest.fixture
def small(alone):
    """The records without the longest ones, in rows of at most 1,024 tokens (see the module docstring)."""
    return alone


def test_long_clips_are_capped_and_videos_counted(built):
    ds = PackedDataset(built.out)
    audio = sorted(m["tokens"] for i in range(len(ds)) for m in ds[i]["media"] if m["kind"] == "audio")
    assert audio[-3:] == [750, 750, 750] and audio[0] < 10  # the 31 s and 45 s clips capped at 30 s; 20 ms
    videos = [m for i in range(len(ds)) for m in ds[i]["media"] if m["kind"] == "video"]
    assert videos and all(m["length"] > m["tokens"] for m in videos)  # timestamps between the frames


def test_mm_token_type_ids_equal_the_processors(built):
    root, processor = built.root, built.processor
    by_id = {r["id"]: r for r in built.records}
    ds = PackedDataset(built.out)
    rows = [ds[i] for i in range(len(ds))]
    batch = PackedCollator(family=ds.family, model_config=gemma4_config(processor))(rows)
    for r, row in enumerate(rows):
        for a, b, rid in segments(row):
            expected = hf_inputs(processor, by_id[rid], root)["mm_token_type_ids"][0].tolist()
            assert batch["mm_token_type_ids"][r, a:b].tolist() == expected, rid


@pytest.mark.parametrize("kind,other,by", [("image", "img/thin_10x2000.png", "Gemma4ImageProcessor"),
                                           ("audio", "aud/1s_48k_stereo.wav", "Gemma4AudioFeatureExtractor")])
def test_loader_names_a_file_that_changed(built, kind, other, by):
    """A span whose file now gives another count: the collator raises naming it, before the model's own error."""
    from packer.loader.media import MediaMismatchError

    root, processor = built.root, built.processor
    ds = PackedDataset(built.out)
    row = next(ds[i] for i in range(len(ds)) if any(m["kind"] == kind for m in ds[i]["media"]))
    span = next(m for m in row["media"] if m["kind"] == kind and not m["path"].endswith(other))
    row["media"] = [{**span, "path": str(root / other)}]  # only this span is loaded
    collate = PackedCollator(processor=processor, family=ds.family, model_config=gemma4_config(processor))
    with pytest.raises(MediaMismatchError, match=rf"{other}: the build gave this {kind} \d+ placeholder positions but {by}"):
        collate([row])


def test_a_clip_shorter_than_the_frames_asked_is_refused_as_the_processor_refuses_it(built):
    """The class default samples 32 frames; a 17-frame clip: the video processor raises, packer refuses the item."""
    from transformers.video_utils import load_video

    processor = built.processor
    path = built.root / "vid" / "odd_17f.mp4"
    frames, metadata = load_video(str(path), backend="pyav")
    with pytest.raises(ValueError, match="exceeds total_num_frames=17"):
        processor.video_processor(videos=[frames], video_metadata=[metadata], num_frames=32)
    with pytest.raises(ValueError, match="samples 32 frames and the clip has 17"):
        Gemma4(("video",), Gemma4Settings()).expand("video", probe_video(str(path)), None, None)


@pytest.mark.slow  # a second processor checkpoint and build
def test_fps_sampling_ids_equal_the_hf_processor(tmp_path, built):
    """A checkpoint that samples 2 frames a second: ids equal; frames without a rate are refused, as there."""
    root = built.root
    processor = ASSETS.processor(tmp_path / "checkpoint", num_frames=None, fps=2)
    videos = [r for r in built.records if any(p["type"] == "video" for p in _media(r))]
    source = root / "videos_fps.jsonl"  # media refs are relative to the records' folder
    source.write_text("".join(json.dumps(r) + "\n" for r in videos))
    no_rate = [r["id"] for r in videos if any(isinstance(p["video"], list) and not p.get("fps") for p in _media(r)
                                              if p["type"] == "video")]
    manifest = build_family("gemma4", tmp_path / "checkpoint", source, tmp_path / "out", max_segments=4,
                            quarantined={i: "unsupported_video" for i in no_rate})
    assert manifest["tokenizer"]["family"]["settings"]["video_fps"] == 2.0
    with pytest.raises(ValueError, match="no original FPS"):
        hf_inputs(processor, next(r for r in videos if r["id"] in no_rate), root)
    check_ids(PackedDataset(tmp_path / "out"), processor, [r for r in videos if r["id"] not in no_rate], root)


@pytest.mark.slow  # FlexAttention compiles its kernel on the CPU (forward only there)
def test_flex_rows_equal_each_record_alone(small):
    ds = PackedDataset(small.out)
    flex = small.model("flex_attention")
    check_flex_forward(flex, small.model("sdpa"), ds, small.processor, small.records, small.root, rows=covering(ds)[:2],
                       model_config=flex.config)


# ---------------------------------------------------------------- the arithmetic, swept against transformers


def test_image_sizes_equal_transformers():
    from transformers.models.gemma4.image_processing_gemma4 import get_aspect_ratio_preserving_size

    from packer.families.gemma4 import soft_tokens

    rng = np.random.default_rng(0)
    sizes = [(1, 1), (1, 5000), (5000, 1), (13, 2600), (2000, 10), (48, 48), (47, 49)]
    sizes += [tuple(int(x) for x in rng.integers(1, 4000, 2)) for _ in range(300)]
    for budget in (70, 280, 1120):
        for h, w in sizes:
            try:
                th, tw = get_aspect_ratio_preserving_size(h, w, 16, budget * 9, 3)
                expected = (th // 16) * (tw // 16) // 9
            except ValueError:
                expected = None
            try:
                got = soft_tokens(h, w, 16, budget, 3)
            except ValueError:
                got = None
            assert got == expected, (h, w, budget)


def test_video_sampling_equals_transformers():
    from types import SimpleNamespace

    from transformers.video_utils import VideoMetadata, default_sample_indices_fn

    for frames in (1, 2, 3, 5, 17, 24, 80):
        for rate in (4.0, 24.0, 29.97):
            for num_frames, fps in ((3, 0.0), (32, 0.0), (1, 0.0), (0, 2.0), (0, 0.5), (0, 0.0)):
                family = Gemma4(("video",), Gemma4Settings(video_num_frames=num_frames, video_fps=fps))
                meta = VideoMetadata(total_num_frames=frames, fps=rate)
                try:
                    expected = default_sample_indices_fn(meta, num_frames=num_frames or None, fps=fps or None).tolist()
                except ValueError:
                    expected = None
                try:
                    got = family.video_plan(SimpleNamespace(frames=frames, fps=rate))[0]
                except ValueError:
                    got = None
                assert got == expected, (frames, rate, num_frames, fps)


def test_audio_counts_equal_the_processors():
    """packer's count from a clip's length = Gemma4Processor.replace_audio_token on the extractor's mask."""
    from transformers import Gemma4AudioFeatureExtractor

    from packer.families.gemma4 import audio_tokens

    fe, settings = Gemma4AudioFeatureExtractor(), Gemma4Settings()
    for n in (1, 160, 161, 162, 320, 321, 481, 641, 801, 16000, 479_999, 480_000, 480_001, 720_000):
        mask = np.asarray(fe([np.zeros(n, dtype=np.float32)])["input_features_mask"][0])
        assert audio_tokens(n, settings) == int(mask[::2][::2].sum()), n
    assert audio_tokens(720_000, settings) == 750


