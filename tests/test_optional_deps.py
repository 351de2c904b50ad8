"""A missing optional package (PyAV for video files, soxr for resampling audio) is a configuration error naming its
install line, exit 2 -- never a quarantine that blames the files ("damaged video files: re-encode or remove them",
every video of a build without PyAV, exit 0). Simulated by ``sys.modules[name] = None`` (``import`` then raises
ImportError), as a build layer without the package has it."""

from __future__ import annotations

import json
import sys

import pytest
from click.testing import CliRunner

from conftest import ROOT, SAMPLE, TOKENIZER
from packer.cli import main
from packer.errors import ConfigError


def cli(*args):
    return CliRunner().invoke(main, [str(a) for a in args])


def test_a_build_without_pyav_stops_at_its_first_video_naming_the_install_line(tmp_path, monkeypatch):
    pytest.importorskip("av")  # the records' videos must be real ones: only the import is taken away
    monkeypatch.setitem(sys.modules, "av", None)
    out = tmp_path / "out"
    r = cli("build", ROOT / "pipelines" / "qwen2vl_video.toml", "-i", SAMPLE / "video.jsonl", "-o", out, "--workers", 1)
    assert r.exit_code == 2, r.output
    line = r.output.strip().splitlines()[-1]
    assert line.startswith("packer: error: reading video files") and "needs the package 'av', which is not installed" \
        in line and "pip install 'packer-multimodal[video]'" in line, r.output
    assert "corrupt_video" not in r.output and "Traceback" not in r.output
    assert not (out / "manifest.json").exists()
    quarantined = (out / "quarantine.jsonl").read_text() if (out / "quarantine.jsonl").exists() else ""
    assert "corrupt_video" not in quarantined


def test_a_build_without_pyav_and_without_video_files_runs(tmp_path, monkeypatch, write_jsonl):
    """'Needs' is decided by the records: the default modalities name video, but a text build reads no video file.
    (A frame list is images: PIL reads it.)"""
    monkeypatch.setitem(sys.modules, "av", None)
    frames = [str(SAMPLE / "videos" / "frames" / f"f{k}.png") for k in range(4)]
    src = write_jsonl("in.jsonl", [{"text": "a document"}, {"id": "frames", "messages": [
        {"role": "user", "content": [{"type": "video", "video": frames}, {"type": "text", "text": "What moves?"}]},
        {"role": "assistant", "content": "A gradient."}]}])
    r = cli("build", ROOT / "pipelines" / "qwen2vl_video.toml", "-i", src, "-o", tmp_path / "out", "--workers", 1,
            "--allow-outside-media-root")
    assert r.exit_code == 0, r.output
    manifest = json.loads((tmp_path / "out" / "manifest.json").read_text())
    assert manifest["accounting"]["quarantined"] == 0 and manifest["accounting"]["samples_packed"] == 2


def test_audio_features_without_soxr_are_refused_before_any_record(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "soxr", None)
    out = tmp_path / "out"
    r = cli("build", "-i", SAMPLE / "chat.jsonl", "-o", out, "--tokenizer", TOKENIZER, "--audio-features", "whisper")
    assert r.exit_code == 2, r.output
    assert "resampling audio" in r.output and "pip install 'packer-multimodal[audio]'" in r.output, r.output
    assert not (out / "quarantine.jsonl").exists()  # nothing read


def test_the_loader_names_the_missing_package(monkeypatch):
    """At train time too: a video span's frames, an audio clip to resample (not "the file may have changed")."""
    import soundfile as sf

    from packer.media.load import load_audio
    from packer.media.video import load_video

    monkeypatch.setitem(sys.modules, "av", None)
    with pytest.raises(ConfigError, match=r"needs the package 'av'.*pip install 'packer-multimodal\[video\]'"):
        load_video(str(SAMPLE / "videos" / "orbit_96x64_2s.mp4"))
    monkeypatch.setitem(sys.modules, "soxr", None)
    clip = SAMPLE / "audio"
    wav = next(p for p in sorted(clip.iterdir()) if sf.info(str(p)).samplerate != 16000)
    with pytest.raises(ConfigError, match=r"needs the package 'soxr'.*pip install 'packer-multimodal\[audio\]'"):
        load_audio(str(wav), 16000)
