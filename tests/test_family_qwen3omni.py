"""Qwen3-Omni (thinker), token for token with ``Qwen3OmniMoeProcessor``, position for position with the thinker's
``get_rope_index`` (TMRoPE) and logit for logit with ``Qwen3OmniMoeThinkerForConditionalGeneration``.

The processor is built in code (``tests/assets_qwen3omni.py``: patch 16 x merge 2, small image budgets, videos
sampled at 2 fps and at most 8 frames, 128 mel bins) and saved into a checkpoint folder that the build reads with
``--processor``; the chat template is a Qwen3-Omni-style fixture. Records hold the awkward media of the family harness
and a few more: a clip of 1,300 samples alone and beside a longer one (its count depends on the record's longest
clip), and a record holding an image, a video and two clips. Two harness records are refused, as the processor refuses
them: a 5 ms clip (0 mel frames: no position) and a frame list without a rate (the checkpoint samples by fps).
"""

from __future__ import annotations

import json

import pytest

pytest.importorskip("av")
pytest.importorskip("torchvision")

from assets_qwen3omni import ASSETS  # noqa: E402
from assets_qwen3omni import refused_for as _refused  # noqa: E402
from family_harness import check_settings, conformance, hf_inputs, segments  # noqa: E402

from packer.loader import PackedCollator, PackedDataset  # noqa: E402

FAMILY = "qwen3omni"
TestConformance = conformance(FAMILY)  # packed == alone on a few records, each alone given the processor's mask


def test_a_clips_count_depends_on_the_records_longest(built):
    """1,300 samples: 8 mel frames alone (1 position), 9 beside a longer clip (2): the feature extractor pads the
    record's clips to the longest and the mask counts ceil(1300 / 160)."""
    ds = PackedDataset(built.out)
    short = {}
    for row in (ds[i] for i in range(len(ds))):
        for m in row["media"]:
            if m["kind"] == "audio" and m["ref"].endswith("short_1300.wav"):
                short[row["segment_ids"][m["segment"]]] = m["tokens"]
    assert short == {"x0": 1, "x1": 2, "x2": 2}  # and test_ids_equal_the_hf_processor: the processor's ids


def _rope_reference(model, processor, record: dict, root, **overrides) -> torch.Tensor:
    """The thinker's own positions of a record run alone: ``get_rope_index`` on the processor's outputs."""
    enc = hf_inputs(processor, record, root)
    seconds = enc.get("video_second_per_grid")
    if seconds is not None and "second_per_grid" in overrides:
        seconds = torch.full_like(seconds, overrides["second_per_grid"])
    mask = enc.get("feature_attention_mask")
    positions, _ = model.model.get_rope_index(enc["input_ids"], enc.get("image_grid_thw"), enc.get("video_grid_thw"),
                                              enc["attention_mask"], False, None if mask is None else mask.sum(-1),
                                              seconds)
    return positions[:, 0]


import torch  # noqa: E402


@pytest.mark.parametrize("case", ["defaults", "fractional", "model_rate"])
def test_positions_equal_get_rope_index(built, case):
    """Every segment of every packed row gets exactly the positions the thinker computes for its record alone:
    at the settings' 2 s a temporal grid (26 ids a step); with a call fps of 3 (0.667 s a grid: fractional
    positions); with a model whose position_id_per_seconds is 25, given to the collator."""
    root, records, processor = built.root, built.records, built.processor
    ds = PackedDataset(built.out)
    family, collator, overrides = ds.family, {}, {}
    if case == "fractional":
        family = {**family, "settings": {**family["settings"], "call_fps": 3.0}}
        overrides["second_per_grid"] = 2 / 3
    model = ASSETS.model(processor, "sdpa", position_id_per_seconds=25 if case == "model_rate" else 13)
    if case == "model_rate":
        collator["tokens_per_second"] = 25
    by_id = {r["id"]: r for r in records}
    rows = [ds[i] for i in range(len(ds))]
    batch = PackedCollator(family=family, **collator)(rows)
    assert batch["position_ids"].dtype == torch.float32
    videos = 0
    for r, row in enumerate(rows):
        for a, b, rid in segments(row):
            expected = _rope_reference(model, processor, by_id[rid], root, **overrides)
            assert torch.equal(batch["position_ids"][:, r, a:b], expected), rid
            videos += sum(m["kind"] == "video" for m in row["media"] if a <= m["start"] < b)
    assert videos >= 5
    if case == "fractional":
        assert (batch["position_ids"] % 1 != 0).any()


def test_the_sample_checkpoint_is_the_processors():
    """sample_data/processors/qwen3omni (written by make_sample_data.py): loads as the real processor, and the family
    reads the same settings from it."""
    from transformers import AutoProcessor

    from conftest import SAMPLE
    from packer.families.checkpoint import read_checkpoint
    from packer.families.qwen3omni import Qwen3OmniSettings

    folder = SAMPLE / "processors" / "qwen3omni"
    processor = AutoProcessor.from_pretrained(str(folder))
    settings = Qwen3OmniSettings.resolve(read_checkpoint(str(folder)))
    check_settings(ASSETS.settings, settings, processor, fixed=False)
    assert settings.image_patch_size == 16 and not settings.video_sample


def test_audio_counts_equal_the_processor():
    """One clip of L samples: the family's count = ``Qwen3OmniMoeProcessor._get_num_audio_tokens`` (L // hop mel
    frames, 100-frame blocks) for every L up to 3 s and a sweep to 10 minutes."""
    from types import SimpleNamespace

    from transformers.models.qwen3_omni_moe.processing_qwen3_omni_moe import Qwen3OmniMoeProcessor

    from packer.families.qwen3omni import audio_output_length, mel_frames

    proc = SimpleNamespace(n_window=50, feature_extractor=SimpleNamespace(hop_length=160))
    lengths = list(range(0, 48000)) + list(range(48000, 16000 * 600, 997))
    expected = [Qwen3OmniMoeProcessor._get_num_audio_tokens(proc, n) for n in lengths]
    assert [audio_output_length(mel_frames(n, n, 160)) for n in lengths] == expected
    assert audio_output_length(100) == 13 and audio_output_length(6000) == 780  # 13 a second, 60 s -> 780


def test_refusals(built, tmp_path):
    """Audio inside a video is refused at start-up; the two harness records the processor cannot take are quarantined:
    the 5 ms clip (0 mel frames, no position; the feature extractor's STFT raises on it) and the frame list without a
    rate (the video processor samples by fps and raises)."""
    from packer.build import build
    from packer.config import resolve
    from packer.errors import ConfigError
    from packer.families import make_family

    root, records, refused, processor = built.root, built.records, built.refused, built.processor
    with pytest.raises(ConfigError, match="use_audio_in_video .* is not reproduced"):
        make_family(resolve(None, family="qwen3omni", processor=str(root / "checkpoint"),
                            processor_options="use_audio_in_video=true"))

    source = tmp_path / "refused.jsonl"
    source.write_text("".join(json.dumps(r) + "\n" for r in [*refused, records[-1]]))
    m = build(resolve(None, input=[str(source)], output=str(tmp_path / "o"), family="qwen3omni",
                      processor=str(root / "checkpoint"), media_root=str(root), max_bad_fraction=1.0),
              progress=False).to_dict()
    assert m["accounting"]["quarantined_by_reason"] == {"audio_too_short": 1, "unsupported_video": 1}
    for record in refused:  # the processor raises on both
        video = _refused(record) == "unsupported_video"
        with pytest.raises(ValueError if video else RuntimeError, match="fps" if video else "Padding size"):
            hf_inputs(processor, record, root)


