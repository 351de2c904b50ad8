"""Every resolved processor setting is bounded: a value out of its bound, infinite or not a number,
from --processor-options, a checkpoint's processor config or a policy spec, is a configuration error (exit 2) naming
the value, the limit and the fix, before stage 1 -- never "a packer bug met this record" nor a traceback."""

from __future__ import annotations

import dataclasses
import importlib
import json
import re

import pytest
from click.testing import CliRunner

from conftest import ROOT, TOKENIZER
from packer.errors import ConfigError
from packer.media import bounds, policies

FAMILIES = {"gemma3": "Gemma3Settings", "gemma4": "Gemma4Settings", "internvl": "InternVLSettings",
            "llama4": "Llama4Settings", "llava_onevision": "LlavaOnevisionSettings", "qwen3omni": "Qwen3OmniSettings",
            "qwen3vl": "Qwen3VLSettings", "hf": "HFSettings"}
POLICIES = (policies.Fixed, policies.Dynamic, policies.AnyRes, policies.Whisper, policies.Qwen2Audio, policies.Rate,
            policies.Qwen2VLVideo)


def settings_classes():
    return [getattr(importlib.import_module(f"packer.families.{m}"), c) for m, c in FAMILIES.items()]


def numeric(cls) -> list[str]:
    return [f.name for f in dataclasses.fields(cls) if isinstance(f.default, (int, float)) and not isinstance(f.default, bool)]


@pytest.mark.parametrize("cls", [*settings_classes(), *POLICIES], ids=lambda c: c.__name__)
def test_every_numeric_setting_has_a_bound_its_default_keeps(cls):
    assert [n for n in numeric(cls) if bounds.rule(n) is None] == []
    cls()  # the defaults are within


SAMPLE_CHECKPOINT = {"internvl": "internvl3"}  # the sample checkpoints' folders, by family


def run(tmp_path, monkeypatch, *args):
    """``packer build`` of a one-document input with ``args``, in ``tmp_path`` (not the repo root, whose
    packer.toml names every modality)."""
    from packer.cli import main

    monkeypatch.chdir(tmp_path)

    src = tmp_path / "in.jsonl"
    src.write_text(json.dumps({"text": "a document"}) + "\n")
    out = tmp_path / "out"
    result = CliRunner().invoke(main, ["build", "-i", str(src), "-o", str(out), "--tokenizer", TOKENIZER, *args])
    assert result.exit_code == 2, (result.output, result.exception)
    assert "Traceback" not in result.output and "packer bug" not in result.output and not out.exists()
    return result.output


@pytest.mark.parametrize("family, option, words", [
    ("qwen3vl", "image_min_pixels=1000000000000", r"qwen3vl.image_min_pixels = 1,000,000,000,000 is out of bounds \(1 to "
                                                  r"89,478,485: pixels .*\); set it within: --processor-options "
                                                  r"image_min_pixels=VALUE"),
    ("qwen3vl", "image_patch_size=0", r"image_patch_size = 0 is out of bounds \(1 to 1,024: .*divides by zero"),
    ("qwen3vl", "video_fps=inf", r"video_fps = inf is not a finite number; .*--processor-options video_fps=VALUE"),
    ("qwen3vl", "video_fps=nan", r"video_fps = nan is not a finite number"),
    ("qwen3vl", "video_fps=-2", r"video_fps = -2 is out of bounds \(0.01 to 1,000"),
    ("qwen3vl", "image_patch_size=sixteen", r"image_patch_size = 'sixteen' is not a valid int; give a number "
                                            r"\(image_patch_size=16\)"),
    ("qwen3vl", "video_max_frames=10000000", r"video_max_frames = 10,000,000 is out of bounds \(1 to 8,192"),
    ("qwen3vl", "image_min_pixels=9000,image_max_pixels=4000", r"image_min_pixels = 9,000 is over image_max_pixels = 4,000"),
    ("qwen3vl", "video_min_frames=0,video_max_frames=0", r"qwen3vl.video_max_frames = 0 is under "
                                                         r"video_temporal_patch_size = 2 \(.*every video would sample "
                                                         r"none\); set max_frames >= 2: --processor-options "
                                                         r"video_max_frames=VALUE"),
    ("qwen3vl", "video_min_frames=10,video_max_frames=8", r"qwen3vl.video_min_frames = 10 is over video_max_frames = 8"),
    ("qwen3vl", "video_num_frames=1", r"qwen3vl.video_num_frames = 1 is under video_temporal_patch_size = 2"),
    ("qwen3omni", "video_max_frames=1", r"qwen3omni.video_max_frames = 1 is under video_temporal_patch_size = 2"),
    ("qwen3omni", "hop_length=0", r"qwen3omni.hop_length = 0 is out of bounds \(1 to 65,536"),
    ("qwen3omni", "max_video_tokens=1000000000", r"max_video_tokens = 1,000,000,000 is out of bounds"),
    ("gemma4", "audio_max_length=100000000000000", r"gemma4.audio_max_length = 100,000,000,000,000 is out of bounds"),
    ("gemma4", "image_pooling_kernel_size=0", r"image_pooling_kernel_size = 0 is out of bounds \(1 to 64"),
    ("internvl", "max_patches=100000", r"internvl.max_patches = 100,000 is out of bounds \(1 to 256: tiles"),
    ("llama4", "pixel_shuffle_ratio=0", r"llama4.pixel_shuffle_ratio = 0 is out of bounds \(0.01 to 1"),
    ("gemma3", "pan_and_scan_max_num_crops=1000000", r"pan_and_scan_max_num_crops = 1,000,000 is out of bounds"),
    ("llava_onevision", "video_fps=1e9", r"video_fps = 1,000,000,000 is out of bounds"),
])
def test_a_bad_processor_option_is_a_configuration_error(tmp_path, monkeypatch, family, option, words):
    checkpoint = ROOT / "sample_data" / "processors" / SAMPLE_CHECKPOINT.get(family, family)  # a named family needs one
    output = run(tmp_path, monkeypatch, "--family", family, "--processor", str(checkpoint), "--processor-options", option)
    assert re.search(words, " ".join(output.split())), output


@pytest.mark.parametrize("config, words", [
    ({"patch_size": "sixteen"}, r"ck: a processor setting of family qwen3vl is not a number \(ValueError: .*'sixteen'\); "
                                r"fix it in the checkpoint's processor config, or override it with --processor-options"),
    ({"size": {"shortest_edge": 10**12}}, r"image_min_pixels = 1,000,000,000,000 is out of bounds"),
    ({"patch_size": 0}, r"image_patch_size = 0 is out of bounds"),
])
def test_a_bad_checkpoint_setting_is_a_configuration_error(tmp_path, monkeypatch, config, words):
    ck = tmp_path / "ck"
    ck.mkdir()
    (ck / "preprocessor_config.json").write_text(json.dumps({"image_processor_type": "Qwen2VLImageProcessor", **config}))
    output = run(tmp_path, monkeypatch, "--family", "qwen3vl", "--processor", str(ck), "--modalities", "image")  # no video config
    assert re.search(words, " ".join(output.split())), output


def test_a_checkpoint_whose_video_sampling_keeps_no_frame_is_a_configuration_error(tmp_path, monkeypatch):
    """``max_frames = 0, min_frames = 0`` in a Qwen3-VL checkpoint's video processor: refused before any record is read
    (it was each video's "0 sampled frames", or a division by zero with cap_pixels_per_frame: a packer bug)."""
    import shutil

    ck = tmp_path / "ck"
    shutil.copytree(ROOT / "sample_data" / "processors" / "qwen3vl", ck)
    config = json.loads((ck / "processor_config.json").read_text())
    config["video_processor"].update(max_frames=0, min_frames=0, cap_pixels_per_frame=True)
    (ck / "processor_config.json").write_text(json.dumps(config))
    output = run(tmp_path, monkeypatch, "--family", "qwen3vl", "--processor", str(ck))
    assert re.search(r"qwen3vl.video_max_frames = 0 is under video_temporal_patch_size = 2 .* --processor-options "
                     r"video_max_frames=VALUE \(or the checkpoint's processor config\)", " ".join(output.split())), output


@pytest.mark.parametrize("flag, spec, words", [
    ("--image-tokens", "dynamic:min_pixels=1000000000000", r"dynamic.min_pixels = 1,000,000,000,000 is out of bounds .* "
                                                          r"--image-tokens / --audio-tokens / --video-tokens"),
    ("--image-tokens", "dynamic:patch_size=0", r"dynamic.patch_size = 0 is out of bounds"),
    ("--image-tokens", "fixed:patch_size=0", r"fixed.patch_size = 0 is out of bounds"),
    ("--audio-tokens", "rate:per_second=inf", r"rate.per_second = inf is not a finite number"),
    ("--audio-tokens", "whisper:window_seconds=0", r"whisper.window_seconds = 0 is out of bounds"),
    ("--video-tokens", "qwen2vl:min_frames=0,max_frames=0", r"qwen2vl.max_frames = 0 is under temporal_patch_size = 2"),
    ("--video-tokens", "qwen2vl:min_frames=9,max_frames=8", r"qwen2vl.min_frames = 9 is over max_frames = 8"),
])
def test_a_bad_policy_setting_is_a_configuration_error(tmp_path, monkeypatch, flag, spec, words):
    output = run(tmp_path, monkeypatch, "--image-token", "<|image_pad|>", flag, spec)
    assert re.search(words, " ".join(output.split())), output


def test_the_bound_table_is_in_the_docs():
    indented = "\n".join("  " + line for line in bounds.table().splitlines())  # inside a list item
    assert indented in (ROOT / "docs" / "reliability.md").read_text()


def test_a_bound_refuses_the_value_not_the_type():
    with pytest.raises(ConfigError, match=r"dynamic.max_pixels = '1e9' is not a number"):
        policies.Dynamic(max_pixels="1e9")


# ---------------------------------------------------------------- a row's memory at collate time


@pytest.mark.slow  # writes and probes hours of FLAC, loads the Qwen tokenizer (~1 min here)
@pytest.mark.parametrize("minutes, reason", [(120, "media_over_memory"), (90, None)])
def test_hours_of_audio_a_family_encodes_whole_are_refused_at_build_time(tmp_path, minutes, reason):
    """Qwen3-Omni encodes a clip whole: 5 h 50 min of FLAC (1 MB) packed as 273k tokens and collating its row needed
    over 12 GB. A record whose audio would need more than COLLATE_BYTES (4 GiB, ~1 h 52 min) is quarantined at build
    time naming the clip (media_over_memory); 90 minutes is packed."""
    from hostile_media import write_silent_flac

    from packer.encode import Encoder, EncoderSpec
    from packer.errors import BadRecord
    from packer.ingest.reader import RawLine

    flac = write_silent_flac(tmp_path / "long.flac", minutes * 60)
    assert flac.stat().st_size < 2 * 2**20
    from family_assets import TEMPLATES

    enc = Encoder(EncoderSpec.of(processor=str(ROOT / "sample_data" / "processors" / "qwen3omni"),
                                 chat_template=str(TEMPLATES / "qwen3omni.jinja"), family="qwen3omni", modalities=["audio"]))
    record = {"messages": [{"role": "user", "content": [{"type": "audio", "audio": "long.flac"}, {"type": "text", "text": "?"}]},
                           {"role": "assistant", "content": "Silence."}]}
    line = RawLine(1, json.dumps(record).encode())
    if reason is None:
        assert enc.encode_line(line, "t.jsonl", tmp_path).media[0].kind == "audio"
        return
    with pytest.raises(BadRecord, match=r"'long.flac' \(120.0 min of audio, all of it encoded by family qwen3omni\) brings "
                                        r"the record's media to about 4.3 GiB when its row is collated, over the 4 GiB a "
                                        r"row's media may need: cut it into shorter clips") as e:
        enc.encode_line(line, "t.jsonl", tmp_path)
    assert e.value.reason == reason
    from packer import reasons

    assert "collated" in reasons.fix(reason)
