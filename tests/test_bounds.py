"""A stated bound on every per-record cost outside the chat labeller: media headers held to
packer.media.limits before anything is decoded, the loader bounded the same way, line memory
measured against line size, and limits that cannot fit refused before stage 1."""

from __future__ import annotations

import json
import math
import subprocess
import sys
import textwrap

import numpy as np
import pytest
from click.testing import CliRunner
from hostile_media import (
    frames_chat,
    long_line,
    media_chat,
    truncated_png,
    write_avi,
    write_png,
    write_silent_flac,
    write_wav,
    write_y4m,
)

from conftest import ROOT, TOKENIZER
from packer.errors import BadRecord
from packer.media import limits

av = pytest.importorskip("av")


def _reason(fn, *args) -> tuple[str, str]:
    with pytest.raises(BadRecord) as e:
        fn(*args)
    return e.value.reason, e.value.detail


# ---------------------------------------------------------------- video headers


@pytest.mark.parametrize("check", ["header", "decode"])
def test_video_header_claims_are_refused_before_decoding(tmp_path, check):
    from packer.media.video import probe_video

    cases = {
        write_y4m(tmp_path / "huge.y4m", 16000, 16000, frames=1, stored=(16, 16)): ("video_too_large", "16000x16000"),
        write_y4m(tmp_path / "fast.y4m", 64, 48, rate="2147483647:1"): ("bad_frame_rate", "2147483647"),
        write_y4m(tmp_path / "slow.y4m", 64, 48, rate="1:2147483647"): ("bad_frame_rate", "4.65"),
        write_y4m(tmp_path / "1000001.y4m", 64, 48, rate="1000001:1"): ("bad_frame_rate", "0.01-1000"),
        write_avi(tmp_path / "claims.avi", claim=10**9): ("corrupt_video", "1,000,000,000 frames in"),
    }
    for path, (reason, words) in cases.items():
        got, detail = _reason(probe_video, str(path), check)
        assert got == reason and words in detail and path.name in detail, (path.name, check, detail)
    assert probe_video(str(write_y4m(tmp_path / "ok.y4m", 64, 48, rate="1000:1")), check).fps == 1000.0  # the edge is in


def test_a_header_claiming_days_is_refused_from_the_header(tmp_path, monkeypatch):
    """Plausible bytes per frame but more time than the bound: media_too_long from the header's claim
    (checked before the decode loop), in either check mode."""
    from packer.media.video import probe_video

    path = write_avi(tmp_path / "long.avi", frames=10, claim=5_000)  # 5,000 frames in ~7 KB at 25 fps: 200 s
    monkeypatch.setattr(limits, "MAX_MEDIA_SECONDS", 100.0)
    for check in ("header", "decode"):
        reason, detail = _reason(probe_video, str(path), check)
        assert reason == "media_too_long" and "5,000 frames at 25 fps" in detail, detail


def test_video_check_decode_counts_the_frames_that_exist(tmp_path):
    """--video-check reaches the probe: a header that lists 100 frames of a 10-frame file is trusted by
    ``header`` (the header's count, the cheap check) and refused by ``decode``."""
    from packer.build import build
    from packer.config import BuildConfig

    write_avi(tmp_path / "over.avi", frames=10, claim=100)
    write_avi(tmp_path / "ok.avi", frames=10)
    src = tmp_path / "in.jsonl"
    src.write_text("".join(json.dumps(media_chat(n, "video", f"{n}.avi")) + "\n" for n in ("over", "ok")))
    outcomes = {}
    for check in ("header", "decode"):
        out = tmp_path / check
        build(BuildConfig(input=(str(src),), output=str(out), tokenizer=TOKENIZER, video_check=check,
                          max_bad_fraction=1.0, max_length=4096), progress=False)
        q = [json.loads(line) for line in (out / "quarantine.jsonl").read_text().splitlines()]
        outcomes[check] = {e["id"]: (e["reason"], e["detail"]) for e in q}
    assert outcomes["header"] == {}
    assert list(outcomes["decode"]) == ["over"]
    reason, detail = outcomes["decode"]["over"]
    assert reason == "corrupt_video" and "decodes 10 frames, its header lists 100" in detail


def test_video_check_choices_match_the_probe():
    from packer.config import FIELDS
    from packer.media.video import VIDEO_CHECKS

    assert FIELDS["video_check"].metadata["choices"] == VIDEO_CHECKS


# ---------------------------------------------------------------- rates stated in records


@pytest.mark.parametrize("fps", [1e308, 1e-308, float("inf"), float("nan"), -1.0, 1001.0, 0.001])
def test_a_frame_lists_stated_rate_is_bounded(tmp_path, fps):
    from packer.ingest.formats import parse_record

    write_png(tmp_path / "a.png")
    record = json.loads(json.dumps(frames_chat("r", ["a.png", "a.png"], fps)))  # Infinity / NaN: Python's JSON reads them
    reason, detail = _reason(parse_record, record, "auto", tmp_path, {"image": "<image>", "audio": "<audio>", "video": "<video>"})
    assert reason == "bad_frame_rate" and "frames per second" in detail


def test_no_infinite_rate_reaches_the_ref_or_second_per_grid_t(tmp_path):
    """Every packed video's ref is strict JSON (no Infinity / NaN) and its second_per_grid_t finite and positive."""
    from packer.build import build
    from packer.config import BuildConfig
    from packer.loader import PackedDataset

    for name in ("a", "b"):
        write_png(tmp_path / f"{name}.png")
    lines = [frames_chat(f"r{k}", ["a.png", "b.png", "a.png", "b.png"], fps) for k, fps in enumerate((0.01, 1000, 2, 0))]
    lines += [media_chat("v", "video", str(write_y4m(tmp_path / "v.y4m", 64, 48, rate="1000:1", frames=4).name))]
    src = tmp_path / "in.jsonl"
    src.write_text("".join(json.dumps(r) + "\n" for r in lines))
    build(BuildConfig(input=(str(src),), output=str(tmp_path / "out"), tokenizer=TOKENIZER, max_length=8192,
                      video_tokens="qwen2vl:min_frames=2", max_bad_fraction=1.0), progress=False)
    spans = [m for row in PackedDataset(tmp_path / "out", check_media=False) for m in row["media"]]
    assert len(spans) == 5  # a frame list without a rate is taken whole, timed at the policy's fps (qwen-vl-utils' way)
    assert not (tmp_path / "out" / "quarantine.jsonl").read_text().strip()

    def refuse(constant):
        raise ValueError(f"not JSON: {constant}")

    for m in spans:
        if m["ref"].startswith("{"):
            json.loads(m["ref"], parse_constant=refuse)
        assert math.isfinite(m["second_per_grid_t"]) and 0 < m["second_per_grid_t"] < 1e4, m


# ---------------------------------------------------------------- audio: build and loader


def test_absurd_audio_is_refused_at_build_and_at_load(tmp_path):
    from packer.media.load import load_audio
    from packer.media.probe import probe_audio

    one_hz = write_wav(tmp_path / "one_hz.wav", 1, 16_000)  # 32 KB, nine hours
    reason, detail = _reason(probe_audio, str(one_hz))
    assert reason == "bad_sample_rate" and "1 Hz" in detail
    with pytest.raises(ValueError, match=r"one_hz\.wav.*1 Hz.*packer verify --media"):
        load_audio(str(one_hz), 16000)
    long = write_silent_flac(tmp_path / "silence.flac", 6 * 3600 + 120, rate=1000)
    assert long.stat().st_size < 2**20  # hours of silence in under a megabyte
    reason, detail = _reason(probe_audio, str(long))
    assert reason == "media_too_long" and "6.0 h" in detail
    with pytest.raises(ValueError, match="silence.flac"):
        load_audio(str(long), 16000)


def test_load_audio_reads_only_what_it_keeps_and_equals_the_whole_file(tmp_path):
    """max_seconds decodes a prefix (plus a resampling margin) and gives exactly the whole file's first samples."""
    from packer.media.load import load_audio

    rng = np.random.default_rng(0)
    import soundfile as sf

    path = tmp_path / "long.wav"
    sf.write(str(path), rng.standard_normal((44100 * 40, 2)).astype(np.float32) * 0.1, 44100)
    whole = load_audio(str(path), 16000)
    head = load_audio(str(path), 16000, max_seconds=30)
    assert len(head) == 480000 and np.array_equal(head, whole[:480000])
    short = load_audio(str(path), 16000, max_seconds=100)
    assert np.array_equal(short, whole)


def test_collator_audio_memory_is_bounded_by_what_the_extractor_keeps(tmp_path):
    """The loader decodes at most 30 s (+1 s) of a clip for a Whisper extractor: a 1 MB FLAC of ~6 h of
    silence costs its 30 s, not 1.4 GB (measured in a subprocess)."""
    write_silent_flac(tmp_path / "long.flac", 5 * 3600, rate=8000)
    code = f"""
        import resource, sys
        sys.path.insert(0, {str(ROOT)!r})
        from packer.media.load import load_audio
        before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        wave = load_audio({str(tmp_path / 'long.flac')!r}, 16000, max_seconds=30)
        print(len(wave), (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) / 1024)
    """
    n, grown_mb = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True,
                                 check=True).stdout.split()
    assert int(n) == 480000 and float(grown_mb) < 50, grown_mb


# ---------------------------------------------------------------- loader errors name their file


def test_every_loader_error_names_its_file(tmp_path):
    from transformers import CLIPImageProcessor

    from packer.loader.media import MediaStep
    from packer.media.load import MediaLoadError

    cut = truncated_png(tmp_path / "cut.png")
    step = MediaStep(image_processor=CLIPImageProcessor(size={"shortest_edge": 28}, crop_size={"height": 28, "width": 28}))
    span = {"kind": "image", "ref": "cut.png", "path": str(cut), "start": 0, "length": 4, "grid": []}
    with pytest.raises(MediaLoadError, match=r"image file .*cut\.png \(ref 'cut\.png'\) cannot be loaded: OSError"):
        step([span])


# ---------------------------------------------------------------- limits that cannot fit: exit 2 before stage 1


@pytest.mark.parametrize("args, words", [
    (["--max-length", str(64 * 10**6)], "need"),
    (["--max-length", "8192", "--max-images", "100", "--max-audio", "100"], "10,201 bin classes"),
    (["--max-length", str(2**31)], "int32"),
])
def test_limits_that_cannot_fit_are_refused_before_stage_1(tmp_path, args, words):
    from packer.cli import main

    src = tmp_path / "in.jsonl"
    src.write_text(json.dumps({"text": "a document"}) + "\n")
    out = tmp_path / "out"
    result = CliRunner().invoke(main, ["build", "-i", str(src), "-o", str(out), "--tokenizer", TOKENIZER, *args])
    assert result.exit_code == 2, (result.output, result.exception)
    assert words in result.output and "Traceback" not in result.output
    assert not out.exists()  # refused before the output folder was touched


# ---------------------------------------------------------------- line memory and time (subprocess)


def _line_probe() -> str:
    """The child script bench/bench_line_memory.py measures a line with: the test bounds what the bench measures."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("bench_line_memory", ROOT / "bench" / "bench_line_memory.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    return bench.CHILD


def measure_line(tmp_path, line: bytes) -> dict:
    path = tmp_path / "line.jsonl"
    path.write_bytes(line + b"\n")
    code = _line_probe().format(root=str(ROOT), tok=TOKENIZER, path=str(path))
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout.strip().splitlines()[-1])


@pytest.mark.slow  # subprocesses, megabyte lines
@pytest.mark.parametrize("kind, size", [("text", 2**20), ("chat", 2**20), ("text", 256 * 2**10), ("chat", 64 * 2**10)])
def test_one_record_costs_time_and_memory_linear_in_its_size(tmp_path, kind, size):
    """The stated bound (docs/reliability.md): a record of B bytes costs about 140 B of peak memory per byte (the
    tokenizer's own) and well under 2 s of CPU per MB: a 1 MB line <= 200 MB and 2 s. CPU time, not wall time: the
    machine is shared, and a bound on the record's own work is what must hold."""
    m = measure_line(tmp_path, long_line(size, kind))
    assert m["bad"] is None
    mb = size / 2**20
    assert m["mb"] <= 200 * mb + 16, m
    assert m["cpu"] <= 2 * mb + 0.25, m


# ---------------------------------------------------------------- preference records (subprocess)


def _preference_bench():
    import importlib.util

    spec = importlib.util.spec_from_file_location("bench_preference_memory", ROOT / "bench" / "bench_preference_memory.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    return bench


@pytest.mark.slow  # subprocess builds of 10^4-response records
@pytest.mark.parametrize("strings", ["chat", "standard"])  # string records rendered, or tokenized as TRL's text
@pytest.mark.parametrize("case, outcome", [("responses:10000", []), ("prompt:100K:1000", ["preference_too_long"])])
def test_a_preference_record_costs_memory_linear_in_its_line(case, outcome, strings):
    """The stated bound (docs/reliability.md): one preference record, built whole (stages 1-4), grows peak memory by at
    most 250 bytes per byte of its line plus 64 MB (the renderings tokenized in one call: PREFERENCE_BATCH_BYTES) --
    10^4 responses in a 214 KB line took 6.5 GB (each segment copied the record's response list) -- and its samples
    hold its prompt once: at most 8 bytes per byte of the line. A record that cannot fit is dropped in stage 1."""
    m = _preference_bench().measure(case, TOKENIZER, strings)
    assert m["bad"] == outcome, m
    assert m["mb"] * 2**20 <= 250 * m["line"] + 64 * 2**20, m
    assert m["samples"] <= 8 * m["line"] + 64 * 2**10, m
