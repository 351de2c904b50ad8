"""Every named job in pipelines/ builds sample_data, with its media policies honoured and
only the modalities its model encodes packed (the rest quarantined as ``no_encoder``)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from conftest import ROOT, SAMPLE
from packer.build import build
from packer.config import resolve
from packer.errors import ConfigError, StrictModeError
from packer.media.policies import parse_policy
from packer.media.probe import probe_audio, probe_image

PIPELINES = sorted(p.name for p in (ROOT / "pipelines").glob("*.toml"))
FAMILIES = {"llava15.toml": ("image",), "llava_next.toml": ("image",), "qwen2vl.toml": ("image",),
            "qwen2audio.toml": ("audio",), "qwen25omni.toml": ("image", "audio"), "sample.toml": ("image", "audio"),
            "qwen2vl_video.toml": ("image", "video"), "qwen3vl.toml": ("image", "video"), "qwen35.toml": ("image", "video"),
            "internvl3.toml": ("image", "video"), "llama4.toml": ("image",),
            "llava_onevision.toml": ("image", "video"), "qwen3omni.toml": ("image", "audio", "video"),
            "gemma3.toml": ("image",), "gemma4.toml": ("image", "audio", "video")}
OTHER_BAD = 8  # the deliberately broken records of sample_data


def media_kinds(obj) -> set[str]:
    """Media kinds a raw record mentions, read straight from its JSON (not through packer's parser)."""
    if isinstance(obj, list):
        return set().union(*map(media_kinds, obj)) if obj else set()
    if not isinstance(obj, dict):
        return set()
    found = {k for k in ("image", "audio", "video") if k in obj or obj.get("type") == k}
    return found.union(*map(media_kinds, obj.values()))


def undeclared_records(files: list, modalities: tuple[str, ...]) -> set[tuple[str, int]]:
    """(file name, line) of every input record holding a media kind outside ``modalities``."""
    found = set()
    for f in files:
        for line, text in enumerate(Path(f).read_text(encoding="utf-8").splitlines(), 1):
            try:
                obj = json.loads(text)
            except ValueError:
                continue
            if media_kinds(obj) - set(modalities):
                found.add((Path(f).name, line))
    return found


def test_every_family_has_a_pipeline():
    assert set(PIPELINES) == set(FAMILIES)


@pytest.mark.parametrize("name", PIPELINES)
def test_pipeline_builds(name, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(ROOT)
    config = resolve(ROOT / "pipelines" / name, output=str(tmp_path / "o"))
    assert config.modalities == FAMILIES[name]
    m = build(config, progress=False).to_dict()
    acc = m["accounting"]
    assert acc["records_read"] == acc["samples_packed"] + acc["quarantined"] + acc["dropped"]

    # Records of a modality the model cannot encode: all quarantined as no_encoder, one warning line.
    undeclared = undeclared_records(config.input_files(), config.modalities)
    quarantine = [json.loads(line) for line in (tmp_path / "o" / "quarantine.jsonl").read_text().splitlines()]
    no_encoder = {(Path(q["file"]).name, q["line"]) for q in quarantine if q["reason"] == "no_encoder"}
    assert no_encoder == undeclared
    assert acc["quarantined_by_reason"].get("no_encoder", 0) == len(undeclared)
    assert acc["quarantined"] - len(undeclared) <= OTHER_BAD, acc["quarantined_by_reason"]
    warnings = [line for line in capsys.readouterr().err.splitlines() if "no encoder" in line]
    assert len(warnings) == (1 if undeclared else 0)
    if undeclared:
        assert f"{len(undeclared):,} record(s)" in warnings[0]
        assert all("no " in q["detail"] and "modalities" in q["detail"] for q in quarantine if q["reason"] == "no_encoder")

    # No packed sample came from such a record, and no span or segment is of an undeclared kind.
    out = tmp_path / "o"
    for e in m["files"]["samples"]:
        t = pa.ipc.open_stream(pa.memory_map(str(out / e["file"]))).read_all()
        sources = zip(t.column("source_file").to_pylist(), t.column("source_line").to_pylist(), strict=True)
        assert not {(Path(f).name, line) for f, line in sources} & undeclared
    if config.family != "generic":  # a model family: its ids are checked against its processor on a sample
        from packer.verify.against_processor import verify_against_processor

        spans = [s for e in m["files"]["packed"]
                 for row in pa.ipc.open_stream(pa.memory_map(str(out / e["file"]))).read_all().to_pylist()
                 for s in row["media"]]
        assert {s["kind"] for s in spans} == set(config.modalities)
        pytest.importorskip("torchvision")
        mismatches, checked = verify_against_processor(out, config.processor, sample=6)
        assert checked == 6 and mismatches == [], [str(x) for x in mismatches]
        return
    policies = {k: parse_policy(getattr(config, f"{k}_tokens"), k) for k in ("image", "audio", "video")}
    ids_of = m["tokenizer"]["placeholders"]
    pads = {k: ids_of.get(getattr(config, f"{k}_token")) for k in ("image", "audio", "video")}
    begins = {k: getattr(config, f"{k}_begin") for k in ("image", "audio", "video")}
    n_spans = {"image": 0, "audio": 0, "video": 0}
    for e in m["files"]["packed"]:
        for row in pa.ipc.open_stream(pa.memory_map(str(out / e["file"]))).read_all().to_pylist():
            assert {k for mod in row["segment_modality"] for k in mod.split("+")} <= {"text", *config.modalities}
            ids = np.array(row["input_ids"])
            for span in row["media"]:
                kind = span["kind"]
                assert kind in config.modalities
                n_spans[kind] += 1
                path = str(SAMPLE / span["ref"])
                if kind == "image":
                    info = probe_image(path)
                    assert span["length"] == policies[kind].count(info.height, info.width).length
                elif kind == "video":
                    from packer.media.video import count_frames, count_video

                    if span["ref"].startswith("{"):
                        listed = json.loads(span["ref"])
                        count = count_frames([str(SAMPLE / f) for f in listed["frames"]], policies[kind], listed["fps"])[1]
                    else:
                        count = count_video(path, policies[kind])[1]
                    assert (span["length"], tuple(span["llm_grid"])) == (count.length, count.grid)
                else:
                    info = probe_audio(path)
                    assert span["length"] == policies[kind].count(info.frames, info.sample_rate).length
                assert np.all(ids[span["start"] : span["start"] + span["length"]] == pads[kind])
                if begins[kind]:
                    assert ids[span["start"] - 1] == ids_of[begins[kind]]
    assert all(n_spans[k] > 0 for k in config.modalities), n_spans  # every pipeline has data of its modalities


@pytest.fixture
def mixed_jsonl(tmp_path):
    """One text record and one audio record, the clip beside the file."""
    (tmp_path / "audio").mkdir()
    shutil.copy(SAMPLE / "audio" / "tone_a4_1s.wav", tmp_path / "audio")
    records = [
        {"id": "t", "messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello."}]},
        {"id": "a", "messages": [{"role": "user", "content": [{"type": "audio", "audio": "audio/tone_a4_1s.wav"},
                                                              {"type": "text", "text": "What is it?"}]},
                                 {"role": "assistant", "content": "A tone."}]},
    ]
    path = tmp_path / "mixed.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def test_no_encoder_quarantines_or_refuses_under_strict(mixed_jsonl, tmp_path, monkeypatch):
    monkeypatch.chdir(ROOT)
    config = resolve(ROOT / "pipelines" / "qwen2vl.toml", input=[str(mixed_jsonl)], output=str(tmp_path / "o"))
    m = build(config, progress=False).to_dict()
    assert m["accounting"]["quarantined_by_reason"] == {"no_encoder": 1} and m["accounting"]["samples_packed"] == 1
    entry = json.loads((tmp_path / "o" / "quarantine.jsonl").read_text())
    assert (entry["line"], entry["id"]) == (2, "a")
    assert "1 audio item(s)" in entry["detail"] and "['image']" in entry["detail"] and "add 'audio'" in entry["detail"]

    strict = resolve(ROOT / "pipelines" / "qwen2vl.toml", input=[str(mixed_jsonl)], output=str(tmp_path / "s"), strict=True)
    with pytest.raises(StrictModeError, match=r"mixed.jsonl:2: no_encoder: the record holds 1 audio item"):
        build(strict, progress=False)

    from click.testing import CliRunner

    from packer.cli import main

    r = CliRunner().invoke(main, ["build", "pipelines/qwen2vl.toml", "-i", str(mixed_jsonl), "-o", str(tmp_path / "c"),
                                  "--strict"])
    assert r.exit_code == 3 and "no_encoder" in r.output


def test_modalities_are_checked():
    assert resolve(modalities=[]).modalities == ()  # a text-only model
    assert resolve(modalities="audio").modalities == ("audio",)
    with pytest.raises(ConfigError, match=r"modalities = \['smell'\]: name each of image, audio, video at most once"):
        resolve(modalities=["smell"])
    with pytest.raises(ConfigError, match=r"modalities = \['image', 'image'\]"):
        resolve(modalities=["image", "image"])


@pytest.mark.parametrize("seconds, rate", [(1.0, 16000), (7.3, 44100), (45.0, 16000), (301.0, 16000)])
def test_qwen25omni_audio_policy_equals_hf(seconds, rate):
    """The omni pipeline's audio policy against Qwen2.5-Omni's own formula and feature extractor
    (chunk_length 300 as in Qwen/Qwen2.5-Omni-7B's preprocessor_config.json): clips between 30 s
    and 300 s are counted whole, unlike Qwen2-Audio."""
    import torch
    import torchaudio.functional as F
    from transformers import WhisperFeatureExtractor
    from transformers.models.qwen2_5_omni.modeling_qwen2_5_omni import Qwen2_5OmniAudioEncoder
    from transformers.models.qwen2_5_omni.processing_qwen2_5_omni import _get_feat_extract_output_lengths

    config = resolve(ROOT / "pipelines" / "qwen25omni.toml")
    policy = parse_policy(config.audio_tokens, "audio")
    n = int(seconds * rate)
    wave = torch.zeros(n)
    resampled = F.resample(wave, rate, 16000) if rate != 16000 else wave
    fe = WhisperFeatureExtractor(feature_size=128, chunk_length=300)
    mask = fe(resampled.numpy(), sampling_rate=16000, return_attention_mask=True, padding="max_length")["attention_mask"]
    frames = int(np.asarray(mask).sum())
    expected = int(_get_feat_extract_output_lengths(torch.tensor(frames)))
    assert int(Qwen2_5OmniAudioEncoder._get_feat_extract_output_lengths(None, torch.tensor(frames))[1]) == expected
    assert policy.count(n, rate).length == expected
    if 30 < seconds < 300:
        assert parse_policy("qwen2-audio", "audio").count(n, rate).length < expected  # Qwen2-Audio keeps 30 s only
