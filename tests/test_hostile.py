"""No record can crash a build: hostile media, paths, text and JSON, each beside a normal
record through a real build, then fuzzed (mutated real images / audio and JSON lines).

Every case must end as a quarantine entry with file, line, id (where the line is readable)
and its reason code; the accounting must add up, ``packer verify`` must pass, and
``--strict`` must exit 3 on it (not 1 with a traceback)."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

import pytest
from click.testing import CliRunner
from hostile_media import IMAGE_FORMATS, claim_size, flip_header, image_bytes, mp3_bytes, xing_frames
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from media_fixtures import write_audio, write_images

from conftest import TOKENIZER
from packer.build import build
from packer.config import BuildConfig
from packer.errors import BadRecord, PackerError
from packer.verify import verify

BEGIN, END = "<|vision_start|>", "<|vision_end|>"
GOOD = {"id": "good", "text": "A normal record that packs."}


# -- hostile media, made at test time (hostile_media's writers) ---------------------------------


@pytest.fixture(scope="module")
def media(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("media")
    for fmt in IMAGE_FORMATS:
        good = image_bytes(fmt, mode="P" if fmt == "GIF" else "RGB")
        (d / f"ok.{fmt.lower()}").write_bytes(good)
        (d / f"bomb.{fmt.lower()}").write_bytes(claim_size(fmt, good, 100_000, 100_000))
        for seed in range(4):
            (d / f"flip{seed}.{fmt.lower()}").write_bytes(flip_header(good, seed))
    mp3 = mp3_bytes()
    (d / "ok.mp3").write_bytes(mp3)
    (d / "truncated.mp3").write_bytes(mp3[: len(mp3) // 3])
    (d / "damaged.mp3").write_bytes(xing_frames(mp3, 1))  # libmpg123 then reports 2**63 - 1 frames
    (d / "overlong.mp3").write_bytes(xing_frames(mp3, 1_000_000))  # frames the file does not hold
    (d / "headless.mp3").write_bytes(b"\0" * 64 + mp3[64:])
    os.symlink("loop_b.png", d / "loop_a.png")
    os.symlink("loop_a.png", d / "loop_b.png")
    return d


def image_record(rid: str, path: str) -> dict:
    return {"id": rid, "image": path, "conversations": [{"from": "human", "value": "<image>\nWhat is it?"},
                                                        {"from": "gpt", "value": "A picture."}]}


def audio_record(rid: str, path: str) -> dict:
    return {"id": rid, "messages": [{"role": "user", "content": [{"type": "audio", "audio": path}, {"type": "text", "text": "?"}]},
                                    {"role": "assistant", "content": "A sound."}]}


def chat(rid, user: str, assistant: str) -> dict:
    return {"id": rid, "conversations": [{"from": "human", "value": user}, {"from": "gpt", "value": assistant}]}


# id (None: the line is unreadable) -> (line, reason); one line each, beside normal records
HOSTILE: dict[str, tuple[str | dict, str | None, str]] = {
    "bomb_png": (image_record("bomb_png", "bomb.png"), "bomb_png", "corrupt_image"),
    "bomb_bmp": (image_record("bomb_bmp", "bomb.bmp"), "bomb_bmp", "corrupt_image"),
    "bomb_jpeg": (image_record("bomb_jpeg", "bomb.jpeg"), "bomb_jpeg", "corrupt_image"),
    "bomb_gif": (image_record("bomb_gif", "bomb.gif"), "bomb_gif", "corrupt_image"),
    "bomb_tiff": (image_record("bomb_tiff", "bomb.tiff"), "bomb_tiff", "corrupt_image"),
    "bomb_tga": (image_record("bomb_tga", "bomb.tga"), "bomb_tga", "corrupt_image"),
    "truncated_mp3": (audio_record("truncated_mp3", "truncated.mp3"), "truncated_mp3", "corrupt_audio"),
    "damaged_mp3": (audio_record("damaged_mp3", "damaged.mp3"), "damaged_mp3", "corrupt_audio"),
    "overlong_mp3": (audio_record("overlong_mp3", "overlong.mp3"), "overlong_mp3", "corrupt_audio"),
    "headless_mp3": (audio_record("headless_mp3", "headless.mp3"), "headless_mp3", "corrupt_audio"),
    "nul_path": (image_record("nul_path", "ok\0.png"), "nul_path", "bad_media_path"),
    "long_name": (image_record("long_name", "x" * 300 + ".png"), "long_name", "bad_media_path"),
    "symlink_loop": (image_record("symlink_loop", "loop_a.png"), "symlink_loop", "bad_media_path"),
    "surrogate_text": ('{"id": "surrogate_text", "text": "an emoji cut in half: \\ud83d"}', "surrogate_text", "invalid_text"),
    "surrogate_turn": ('{"id": "surrogate_turn", "conversations": [{"from": "human", "value": "hi"}, '
                       '{"from": "gpt", "value": "\\ude00 half"}]}', "surrogate_turn", "invalid_text"),
    "surrogate_path": ('{"id": "surrogate_path", "image": "a\\ud83d.png", "conversations": [{"from": "human", "value": '
                       '"<image>"}, {"from": "gpt", "value": "ok"}]}', "surrogate_path", "invalid_text"),
    "surrogate_key": ('{"id": "surrogate_key", "text": "fine", "\\ud83d": 1}', "surrogate_key", "invalid_text"),
    "surrogate_id": ('{"id": "\\ud83d", "text": "the id is not valid Unicode"}', "\\ud83d", "invalid_id"),
    "big_int": ('{"id": "big_int", "text": "fine", "n": ' + "7" * 5000 + "}", None, "number_too_large"),
    "big_int_nested": ('{"id": "big_int_nested", "text": "fine", "meta": {"a": [1, -' + "9" * 5000 + "]}}", None,
                       "number_too_large"),
    "deep": ('{"id": "deep", "text": "fine", "n": ' + "[" * 10_000 + "]" * 10_000 + "}", None, "nesting_too_deep"),
    "deep_objects": ('{"id": "deep_objects", "text": "fine", "n": ' + '{"a": ' * 10_000 + "1" + "}" * 10_000 + "}", None,
                     "nesting_too_deep"),
}
NORMAL = [GOOD, image_record("good_image", "ok.png"), audio_record("good_audio", "ok.mp3")]


def config(out: Path, inputs: list[Path], **kw) -> BuildConfig:
    base = {"input": tuple(map(str, inputs)), "output": str(out), "tokenizer": TOKENIZER, "max_length": 1024,
            "image_begin": BEGIN, "image_end": END, "max_bad_fraction": 1.0}  # hostile records beside a few normal ones
    return BuildConfig(**{**base, **kw})


def write_lines(path: Path, records: list) -> Path:
    path.write_bytes(b"".join((r if isinstance(r, bytes) else (r if isinstance(r, str) else json.dumps(r)).encode())
                              + b"\n" for r in records))
    return path


def built(out: Path) -> tuple[dict, list[dict]]:
    """The build's accounting (checked exact) and quarantine, after ``packer verify`` passes."""
    manifest = json.loads((out / "manifest.json").read_text())
    acc = manifest["accounting"]
    assert acc["records_read"] == acc["samples_packed"] + acc["quarantined"] + acc["dropped"]
    problems = verify(out)[0]
    assert problems == [], [str(p) for p in problems]
    lines = (out / "quarantine.jsonl").read_text(encoding="utf-8").splitlines()
    assert len(lines) == acc["quarantined"]
    return acc, [json.loads(line) for line in lines]


def test_every_hostile_record_is_quarantined_beside_normal_ones(media, tmp_path):
    src = write_lines(media / "hostile.jsonl", [*NORMAL, *(line for line, _, _ in HOSTILE.values()), GOOD])
    build(config(tmp_path / "out", [src]), progress=False)
    acc, entries = built(tmp_path / "out")
    assert acc["samples_packed"] == len(NORMAL) + 1 and acc["dropped"] == 0
    got = {e["line"]: e for e in entries}
    for line, (name, (_, rid, reason)) in enumerate(HOSTILE.items(), start=len(NORMAL) + 1):
        entry = got.pop(line)
        assert (entry["id"], entry["reason"]) == (rid, reason), name
        assert entry["file"] == str(src) and entry["detail"] and entry["raw"], name
    assert got == {}
    assert acc["quarantined_by_reason"] == {r: sum(reason == r for _, _, reason in HOSTILE.values())
                                            for r in {reason for _, _, reason in HOSTILE.values()}}


def test_details_name_the_value_and_the_fix(media, tmp_path):
    src = write_lines(media / "details.jsonl", [GOOD, *(HOSTILE[k][0] for k in (
        "bomb_png", "damaged_mp3", "long_name", "symlink_loop", "surrogate_turn", "big_int", "deep"))])
    build(config(tmp_path / "out", [src]), progress=False)
    details = [e["detail"] for e in built(tmp_path / "out")[1]]
    assert "implausibly large" in details[0] and "MAX_IMAGE_PIXELS" in details[0]
    assert "damaged.mp3" in details[1] and "soundfile" in details[1]
    assert "File name too long" in details[2]
    assert "ymlink loop" in details[3] or "Too many levels of symbolic links" in details[3]
    assert "conversations[1].value" in details[4] and "U+DE00" in details[4]
    assert "4300 digits" in details[5]
    assert "recursion limit" in details[6] and "flatten" in details[6]


@pytest.mark.parametrize("name", list(HOSTILE))
def test_strict_exits_3_naming_file_and_line(media, tmp_path, name):
    from packer.cli import main

    src = write_lines(media / f"strict_{name}.jsonl", [GOOD, HOSTILE[name][0]])
    args = ["build", "--input", str(src), "--output", str(tmp_path / "out"), "--tokenizer", TOKENIZER, "--strict",
            "--image-begin", BEGIN, "--image-end", END]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 3, (result.output, result.exception)
    assert f"{src}:2: {HOSTILE[name][2]}:" in result.output
    assert "Traceback" not in result.output


def test_corrupted_image_headers_are_quarantined_or_packed_never_fatal(media, tmp_path):
    names = [f"flip{seed}.{fmt.lower()}" for fmt in IMAGE_FORMATS for seed in range(4)]
    src = write_lines(media / "flips.jsonl", [GOOD, *(image_record(n, n) for n in names)])
    for check in ("header", "verify", "decode"):
        build(config(tmp_path / check, [src], image_check=check), progress=False)
        acc, entries = built(tmp_path / check)
        assert acc["records_read"] == len(names) + 1
        assert {e["reason"] for e in entries} <= {"corrupt_image", "unsupported_image"}, check
        assert acc["quarantined"] >= len(IMAGE_FORMATS), check  # most flips break the header


@pytest.mark.parametrize("error", [ValueError("negative dimensions are not allowed"), TypeError("bad"), SystemError("x")])
def test_any_soundfile_failure_is_corrupt_audio(media, monkeypatch, error):
    import soundfile as sf

    from packer.media.probe import probe_audio

    def broken(*args, **kwargs):
        raise error

    monkeypatch.setattr(sf, "SoundFile", broken)
    with pytest.raises(BadRecord, match=type(error).__name__) as e:
        probe_audio(str(media / "ok.mp3"))
    assert e.value.reason == "corrupt_audio"


def _plant_bug(monkeypatch):
    from packer.encode import encoder as encoder_module

    real = encoder_module.Encoder._encode_document

    def planted(self, doc):
        if "boom" in doc.text:
            raise ZeroDivisionError("planted")
        return real(self, doc)

    monkeypatch.setattr(encoder_module.Encoder, "_encode_document", planted)


def test_an_unforeseen_exception_stops_the_build_with_the_record_and_its_traceback(tmp_path, monkeypatch):
    """The per-record catch-all: a bug (here a planted ZeroDivisionError) is a packer bug, not bad data.
    By default it stops the build (exit 1, even with --max-bad-fraction 1 or --strict), naming the file and
    line, with the record and the traceback in OUT/internal_error.json."""
    from packer.cli import main

    _plant_bug(monkeypatch)
    src = write_lines(tmp_path / "in.jsonl", [GOOD, {"id": "bug", "text": "boom"}])
    for extra in ([], ["--strict"], ["--max-bad-fraction", "1"]):
        out = tmp_path / f"out{len(extra)}"
        args = ["build", "--input", str(src), "--output", str(out), "--tokenizer", TOKENIZER, *extra]
        result = CliRunner().invoke(main, args)
        assert result.exit_code == 1, (extra, result.output, result.exception)
        assert f"packer: error: {src}:2: a packer bug met this record (ZeroDivisionError: planted" in result.output
        assert "--on-internal-error quarantine" in result.output and "Traceback" not in result.output
        report = json.loads((out / "internal_error.json").read_text())
        assert (report["file"], report["line"], report["id"], report["reason"]) == (str(src), 2, "bug", "internal_error")
        assert "boom" in report["raw"] and "ZeroDivisionError: planted" in report["traceback"]
        assert "in planted" in report["traceback"] and not (out / "manifest.json").exists()


def test_quarantined_internal_errors_are_warned_and_not_bad_data(tmp_path, monkeypatch, capsys):
    """``--on-internal-error quarantine``: the record is an internal_error entry with its type, message and
    place; a warning says so; --max-bad-fraction (data problems) does not count it. A resume in the default
    mode does not reuse the task that quarantined it. PackerError and MemoryError still stop the build."""
    from packer.stages.encode import encode_record

    _plant_bug(monkeypatch)
    src = write_lines(tmp_path / "in.jsonl", [GOOD, {"id": "bug", "text": "boom"}])
    build(config(tmp_path / "out", [src], on_internal_error="quarantine", max_bad_fraction=0.0), progress=False)
    _, (entry,) = built(tmp_path / "out")
    assert (entry["id"], entry["line"], entry["reason"]) == ("bug", 2, "internal_error")
    assert "ZeroDivisionError: planted" in entry["detail"] and "in planted" in entry["detail"]
    assert "1 record(s) met a packer bug and were quarantined as internal_error" in capsys.readouterr().err
    with pytest.raises(PackerError, match="a packer bug met this record"):
        build(config(tmp_path / "out", [src], max_bad_fraction=0.0), progress=False)  # a resume: it must not reuse that task

    from packer.ingest.reader import RawLine

    class Raises:
        def __init__(self, error):
            self.error = error

        def encode_line(self, *args):
            raise self.error

    for error in (PackerError("the tokenizer has no chat template"), MemoryError()):
        with pytest.raises(type(error)):
            encode_record(Raises(error), RawLine(1, b"{}"), "f.jsonl", tmp_path)


def test_a_document_never_trains_a_reserved_token(tmp_path):
    """In a ``text`` document a typed begin / placeholder string is plain text (split_special_tokens):
    the record packs, and verify finds no reserved id trained."""
    src = write_lines(tmp_path / "in.jsonl", [{"id": "doc", "text": f"tokens {BEGIN} <image> {END} <audio> as text"}])
    build(config(tmp_path / "out", [src]), progress=False)
    acc, entries = built(tmp_path / "out")
    assert acc["samples_packed"] == 1 and entries == []


# -- fuzz -------------------------------------------------------------------------------------------

HOSTILE_VALUES = ['"\\ud83d"', '"\\udfff x"', "9" * 5000, "[" * 10_000 + "]" * 10_000, f'"{BEGIN}"', f'"{END}"', '"<image>"',
                  '"x\\u0000.png"', '"' + "y" * 300 + '.png"', '"loop_a.png"', "1e999", "-0", "null", "{}", '""']
FIELDS = ("id", "text", "image", "value")


@pytest.fixture(scope="module")
def real_media(tmp_path_factory) -> dict[str, bytes]:
    d = tmp_path_factory.mktemp("real")
    images = write_images(d / "img")
    audio = write_audio(d / "aud")
    keep = ("exif6.jpg", "one_1x1.png", "cmyk.jpg", "gray16.png", "palette_alpha.png", "animated.gif", "photo.webp",
            "plain_300x200.jpg", "20ms_8k.wav", "1s_48k_stereo.wav", "2s_44k.mp3", "3s_22k.ogg")
    return {n: p.read_bytes() for n, p in {**images, **audio}.items() if n in keep}


def mutate(data: bytes, edits: list[tuple[int, int]], cut: float | None) -> bytes:
    b = bytearray(data)
    for pos, value in edits:
        b[pos % len(b)] = value
    return bytes(b[: max(1, int(len(b) * cut))] if cut is not None else b)


edits = st.lists(st.tuples(st.integers(0, 1 << 16), st.integers(0, 255)), max_size=8)
media_case = st.tuples(st.integers(0, 11), edits, st.one_of(st.none(), st.floats(0.0, 1.0)), st.booleans())
json_case = st.tuples(st.integers(0, 2), st.one_of(
    st.tuples(st.just("flip"), edits),
    st.tuples(st.just("cut"), st.floats(0.0, 1.0)),
    st.tuples(st.just("insert"), st.integers(0, 400), st.sampled_from(HOSTILE_VALUES)),
    st.tuples(st.just("replace"), st.sampled_from(FIELDS), st.sampled_from(HOSTILE_VALUES)),
))
KNOWN_REASONS = {
    "invalid_utf8", "malformed_json", "not_an_object", "unknown_format", "wrong_type", "empty_text", "empty_conversation",
    "unknown_role", "image_count_mismatch", "audio_count_mismatch", "media_placeholder_mismatch", "missing_image",
    "corrupt_image", "unsupported_image", "missing_audio", "corrupt_audio", "audio_too_short", "media_outside_root",
    "no_trainable_tokens", "bad_media_path", "invalid_text", "invalid_id", "number_too_large", "nesting_too_deep",
    "reserved_token_in_text", "template_error", "special_token_in_text", "bad_sample_rate", "bad_frame_rate",
    "video_too_large", "media_too_long",
}  # not internal_error: the fuzz must find no unforeseen failure


def json_line(kind: int, op: tuple, image: str) -> bytes:
    rec = [{"id": "t", "text": "plain words"}, image_record("i", image), chat("c", "hello", "world")][kind]
    line = json.dumps(rec).encode()
    if op[0] == "flip":
        return mutate(line, op[1], None)
    if op[0] == "cut":
        return mutate(line, [], op[1])
    if op[0] == "insert":
        at = op[1] % (len(line) + 1)
        return line[:at] + op[2].encode() + line[at:]
    field, value = op[1], op[2]  # replace a field's value by a hostile one, keeping the JSON well-formed
    text = json.dumps(rec)
    if field == "value" and "conversations" in rec:
        return text.replace('"world"', value, 1).encode()
    key = f'"{field}": '
    if key not in text:
        return text.replace("{", "{" + key + value + ", ", 1).encode()
    start = text.index(key) + len(key)
    end = start + len(json.dumps(rec[field]))
    return (text[:start] + value + text[end:]).encode()


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(media_cases=st.lists(media_case, min_size=1, max_size=6), json_cases=st.lists(json_case, min_size=1, max_size=10),
       check=st.sampled_from(["header", "verify"]))
def test_fuzzed_media_and_json_never_escape(real_media, media_cases, json_cases, check):
    names = sorted(real_media)
    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp)
        (d / "ok.png").write_bytes(real_media["one_1x1.png"])
        os.symlink("loop_b.png", d / "loop_a.png")
        os.symlink("loop_a.png", d / "loop_b.png")
        lines: list = [GOOD]
        for i, (which, flips, cut, as_audio) in enumerate(media_cases):
            name = names[which]
            path = d / f"m{i}{Path(name).suffix}"
            path.write_bytes(mutate(real_media[name], flips, cut))
            is_audio = Path(name).suffix in (".wav", ".mp3", ".ogg")
            lines.append(audio_record(f"m{i}", path.name) if is_audio or as_audio and i % 2 else image_record(f"m{i}", path.name))
        lines += [json_line(kind, op, "ok.png") for kind, op in json_cases]
        src = write_lines(d / "fuzz.jsonl", lines)
        build(config(d / "out", [src], image_check=check), progress=False)
        acc, entries = built(d / "out")
        assert acc["records_read"] == sum(1 for line in src.read_bytes().split(b"\n") if line.strip())  # a flip may add a newline
        assert acc["samples_packed"] >= 1
        unknown = [(e["reason"], e["detail"]) for e in entries if e["reason"] not in KNOWN_REASONS]
        assert unknown == []


def test_output_io_failure_stops_the_build_with_the_path(tmp_path, monkeypatch):
    """Outside a record: a full disk is not quarantined; the CLI says ``packer: error:`` and exits 1."""
    from packer.cli import main
    from packer.stages import encode

    def full(path, *args, **kwargs):
        raise OSError(28, "No space left on device", str(path))

    monkeypatch.setattr(encode, "write_shard", full)
    src = write_lines(tmp_path / "in.jsonl", [GOOD])
    result = CliRunner().invoke(main, ["build", "--input", str(src), "--output", str(tmp_path / "out"), "--tokenizer", TOKENIZER])
    assert result.exit_code == 1, (result.output, result.exception)
    assert "packer: error: cannot write stage-1 output" in result.output and "No space left on device" in result.output
    assert "part-00000.arrow" in result.output
