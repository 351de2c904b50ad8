"""What a build used to do without a word: audio cut to the encoder's window (now counted as
audio_truncated in the manifest, the summary and the report, or quarantined with
--long-audio drop), and a pipeline run on new data with the sample tokenizer (now a warning,
and --tokenizer at the top of `packer build --help`)."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner
from media_fixtures import write_audio

from conftest import ROOT, SAMPLE, TOKENIZER
from packer.build import build
from packer.config import resolve
from packer.summary import summarize, summary_text

CLIPS = ["1s_48k_stereo.wav", "31s_24k.flac", "45s_8k.flac", "29.99s_16k.flac"]  # two over Qwen2-Audio's 30 s


@pytest.fixture(scope="module")
def clips(tmp_path_factory):
    root = tmp_path_factory.mktemp("clips")
    files = write_audio(root / "audio")
    records = [{"id": f"clip-{k}", "messages": [
        {"role": "user", "content": [{"type": "audio", "audio": str(files[n].relative_to(root))}, {"type": "text", "text": "What?"}]},
        {"role": "assistant", "content": "A sound."}]} for k, n in enumerate(CLIPS)]
    (root / "clips.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    return root / "clips.jsonl"


@pytest.mark.parametrize("long_audio", ["truncate", "drop"])
def test_clips_over_the_window_are_counted_or_quarantined(clips, tmp_path, long_audio):
    out = tmp_path / "out"
    manifest = build(resolve(ROOT / "pipelines" / "qwen2audio.toml", input=[str(clips)], output=str(out), tokenizer=TOKENIZER,
                             long_audio=long_audio, max_bad_fraction=0.0), progress=False)
    report = json.loads((out / "report.json").read_text())
    text = summary_text(summarize(out))
    if long_audio == "truncate":
        assert manifest.stats["audio_truncated"] == 2 and manifest.accounting.quarantined == 0
        assert report["oversize"]["audio_truncated"] == 2 and "audio cut    2 clips" in text
        assert "2 audio clips longer than the encoder's window" in (out / "report.html").read_text()
    else:  # quarantined, named, and not held against --max-bad-fraction (a declared choice)
        assert manifest.stats["audio_truncated"] == 0
        assert manifest.accounting.quarantined_by_reason == {"audio_too_long": 2}
        lines = [json.loads(x) for x in (out / "quarantine.jsonl").read_text().splitlines()]
        assert sorted(x["id"] for x in lines) == ["clip-1", "clip-2"] and "sees 30 s" in lines[0]["detail"]
        assert "audio_too_long 2" in text


def test_repack_keeps_the_count_and_a_resumed_build_too(clips, tmp_path):
    from packer.build import repack

    out = tmp_path / "out"
    build(resolve(ROOT / "pipelines" / "qwen2audio.toml", input=[str(clips)], output=str(out), tokenizer=TOKENIZER),
          progress=False)
    again = build(resolve(ROOT / "pipelines" / "qwen2audio.toml", input=[str(clips)], output=str(out), tokenizer=TOKENIZER),
                  progress=False)  # every stage-1 task reused from the journal
    assert again.stats["audio_truncated"] == 2
    repacked = repack(str(out), output=str(tmp_path / "r"), max_length=8192, progress=False)
    assert repacked.stats["audio_truncated"] == 2


def test_new_data_with_the_sample_tokenizer_warns(tmp_path, write_jsonl, capsys):
    data = write_jsonl("mine.jsonl", [{"text": "Some text of mine."}] * 3)
    build(resolve(ROOT / "pipelines" / "sample.toml", input=[str(data)], output=str(tmp_path / "a")), progress=False)
    err = capsys.readouterr().err
    assert "mine.jsonl built with" in err and "a toy the pipelines ship with" in err and "--tokenizer" in err
    build(resolve(ROOT / "pipelines" / "sample.toml", input=[str(SAMPLE / "docs.jsonl")], output=str(tmp_path / "b")),
          progress=False)
    assert "a toy" not in capsys.readouterr().err  # sample_data itself: what the tokenizer is for
    build(resolve(ROOT / "pipelines" / "qwen3vl.toml", input=[str(data)], output=str(tmp_path / "c")), progress=False)
    err = capsys.readouterr().err  # a family pipeline's sample processor checkpoint: the same warning, naming --processor
    assert "sample_data/processors/qwen3vl, a toy the pipelines ship with" in err and "--processor" in err


def test_build_help_names_tokenizer_first():
    from packer.cli import main

    head = CliRunner().invoke(main, ["build", "--help"]).output.splitlines()[:8]
    assert any("--tokenizer" in line for line in head), head
