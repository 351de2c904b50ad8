"""The build folder as a whole: verify covers every file in it and, with --media, every
media file against the media index the build wrote; the loader refuses a changed media file; the
fingerprint knows the code that made the build; an output folder inside an input pattern, a file
given twice and a refused build are handled before anything is written or deleted."""

from __future__ import annotations

import json
import os
import shutil

import pytest
from click.testing import CliRunner
from hostile_media import media_chat, write_png

from conftest import TOKENIZER
from packer.build import build
from packer.cli import main
from packer.config import BuildConfig
from packer.verify import verify


@pytest.fixture
def media_build(tmp_path):
    """A small build with two images (one referenced twice) and a text record."""
    data = tmp_path / "data"
    data.mkdir()
    write_png(data / "a.png", (40, 30))
    write_png(data / "b.png", (30, 40))
    records = [media_chat("r1", "image", "a.png"), media_chat("r2", "image", "b.png"), media_chat("r3", "image", "a.png"),
               {"id": "d", "text": "a document"}]
    src = data / "in.jsonl"
    src.write_text("".join(json.dumps(r) + "\n" for r in records))
    out = tmp_path / "out"
    return data, src, out


def built(src, out, **kw):
    return build(BuildConfig(input=(str(src),), output=str(out), tokenizer=TOKENIZER, max_length=2048, **kw), progress=False)


def problems(out, **kw) -> list[str]:
    return [str(p) for p in verify(out, **kw)[0]]


def test_verify_covers_every_file_of_the_folder(media_build):
    data, src, out = media_build
    m = built(src, out)
    assert {e.file for e in m.report_files} == {"report.json", "report.html"} and m.files.media.file == "media.arrow"
    assert problems(out) == [] and problems(out, media="stat") == []
    for name in ("report.json", "report.html"):  # tampered report files
        saved = (out / name).read_bytes()
        (out / name).write_bytes(saved.replace(b"fill", b"FILL", 1))
        assert problems(out) == [f"{name}: sha256 differs from the manifest (the file changed or is damaged)"]
        (out / name).write_bytes(saved)
    extras = {"packed/part-00001.arrow": (out / "packed" / "part-00000.arrow").read_bytes(),  # an extra shard
              "tokenizer/added.txt": b"x", "internal_error.json": b"{}", "notes.txt": b"mine", ".state/other.json": b"{}"}
    for name, content in extras.items():
        (out / name).write_bytes(content)
        (found,) = problems(out)
        assert found.startswith(f"{name}: ") and ("not part of the build" in found or "not resume state" in found), found
        (out / name).unlink()
    (out / "media.arrow").unlink()  # a missing listed file
    assert problems(out) == ["media.arrow: missing"]


def test_state_is_optional_after_a_finished_build_and_must_agree_with_the_manifest(media_build, tmp_path):
    data, src, out = media_build
    built(src, out)
    manifest = json.loads((out / "manifest.json").read_text())
    edited = {**manifest, "media_root": str(tmp_path / "elsewhere")}  # a changed media_root
    (out / "manifest.json").write_text(json.dumps(edited))
    assert problems(out) == ["manifest.json: its media_root differs from the one the build recorded in "
                             ".state/fingerprint.json (the manifest was edited, or belongs to another build)"]
    shutil.rmtree(out / ".state")  # a finished build needs no resume journal ...
    assert problems(out) == []
    found = problems(out, media="stat")  # ... but its media are not where the manifest now says
    assert len(found) == 2 and all("missing" in p and "elsewhere" in p for p in found)
    (out / "manifest.json").write_text(json.dumps(manifest))
    assert problems(out, media="stat") == []


def test_verify_media_catches_deleted_and_replaced_files(media_build):
    data, src, out = media_build
    built(src, out, media_hash=True)
    assert problems(out, media="hash") == []
    a, b = data / "a.png", data / "b.png"
    stat_a = a.stat()
    original = a.read_bytes()
    replacement = bytearray(original)
    replacement[-20] ^= 0xFF  # same size, other content
    a.write_bytes(bytes(replacement))
    (found,) = problems(out, media="stat")
    assert found.startswith("a.png: ") and "modified after the build" in found
    os.utime(a, ns=(stat_a.st_atime_ns, stat_a.st_mtime_ns))  # the time put back: only the content tells
    assert problems(out, media="stat") == []
    (found,) = problems(out, media="hash")
    assert found.startswith("a.png: ") and "sha256 differs" in found
    b.unlink()
    assert any(p.startswith("b.png: missing") for p in problems(out, media="stat"))
    a.write_bytes(original)
    moved = data.parent / "moved"
    shutil.copytree(data, moved)  # another root: a copy changes the times, so stat checks sizes there
    write_png(moved / "b.png", (30, 40))
    assert problems(out, media="stat", media_root=str(moved)) == []


def test_verify_media_hash_needs_a_hashed_build(media_build):
    data, src, out = media_build
    built(src, out)
    result = CliRunner().invoke(main, ["verify", str(out), "--media", "hash"])
    assert result.exit_code == 6 and "records no sha256 (the build ran without --media-hash)" in result.output
    result = CliRunner().invoke(main, ["verify", str(out), "--media"])
    assert result.exit_code == 0 and "3 media files (stat) checked" not in result.output and "2 media files" in result.output


def test_the_loader_refuses_a_media_file_replaced_since_the_build(media_build):
    from packer.loader import MediaChangedError, PackedDataset

    data, src, out = media_build
    built(src, out)
    rows = range(len(PackedDataset(out)))
    for k in rows:
        PackedDataset(out)[k]  # unchanged: fine
    a = data / "a.png"
    content = bytearray(a.read_bytes())
    content[-20] ^= 0xFF
    stat = a.stat()
    a.write_bytes(bytes(content))
    os.utime(a, ns=(stat.st_atime_ns, stat.st_mtime_ns + 10**9))
    ds = PackedDataset(out)
    with pytest.raises(MediaChangedError, match=r"a\.png \(ref 'a\.png'\) changed since the build \(the same size but a "
                                                r"later modification time"):
        for k in rows:
            ds[k]
    for k in rows:
        PackedDataset(out, check_media=False)[k]  # the user's choice
    write_png(a, (41, 30))  # another size: refused even under another media root
    moved = data.parent / "moved"
    shutil.copytree(data, moved)
    with pytest.raises(MediaChangedError, match="bytes, the build read"):
        ds = PackedDataset(out, media_root=moved)
        for k in rows:
            ds[k]


def test_packer_report_takes_the_report_settings_and_keeps_verify_passing(media_build):
    data, src, out = media_build
    built(src, out)
    result = CliRunner().invoke(main, ["report", str(out), "--report-ranks", "2,4", "--report-batch", "2",
                                       "--report-window", "8"])
    assert result.exit_code == 0, result.output
    report = json.loads((out / "report.json").read_text())["rank_imbalance"]
    assert (report["ranks"], report["rows_per_rank"], report["window"]) == ([2, 4], 2, 8)
    execution = json.loads((out / "manifest.json").read_text())["execution"]
    assert (execution["report_ranks"], execution["report_batch"], execution["report_window"]) == ([2, 4], 2, 8)
    assert problems(out) == []
    assert CliRunner().invoke(main, ["report", str(out)]).exit_code == 0  # settings not given: the recorded ones
    assert json.loads((out / "report.json").read_text())["rank_imbalance"]["ranks"] == [2, 4]
    bad = CliRunner().invoke(main, ["report", str(out), "--report-batch", "0"])
    assert bad.exit_code == 2 and "report_batch must be at least 1" in bad.output


# ---------------------------------------------------------------- code identity


def test_the_fingerprint_and_manifest_hold_the_code_that_made_the_build(media_build):
    from packer.stages.state import LIBRARIES, code_identity

    data, src, out = media_build
    m = built(src, out)
    fp = json.loads((out / ".state" / "fingerprint.json").read_text())
    identity = code_identity()
    assert len(identity["packer_code"]) == 64 and set(identity["libraries"]) == set(LIBRARIES)
    assert identity["libraries"]["tokenizers"] and identity["libraries"]["transformers"]
    assert fp["packer_code"] == m.code["packer_code"] == identity["packer_code"] and fp["libraries"] == m.code["libraries"]


def test_a_resume_after_a_code_change_encodes_again(media_build, monkeypatch, capsys):
    import packer.pipeline.packing as build_module
    import packer.stages.state as state

    data, src, out = media_build
    config = BuildConfig(input=(str(src),), output=str(out), tokenizer=TOKENIZER, max_length=2048)
    build(config, progress=True)
    (out / "manifest.json").unlink()  # interrupted after stage 1: its journal is there to reuse
    capsys.readouterr()
    build(config, progress=True)
    assert "1 of 1 tasks reused from the interrupted run" in capsys.readouterr().err
    (out / "manifest.json").unlink()
    changed = {**state.code_identity(), "packer_code": "0" * 64}
    monkeypatch.setattr(state, "code_identity", lambda: changed)
    monkeypatch.setattr(build_module, "code_identity", lambda: changed)
    m = build(config, progress=True)
    err = capsys.readouterr().err
    assert f"packer: note: {out} was built by other code (packer_code changed): nothing of it is reused" in err
    assert "tasks reused" not in err and m.code["packer_code"] == "0" * 64
    assert problems(out) == []


# ---------------------------------------------------------------- outputs and inputs


def test_an_output_inside_an_input_pattern_is_refused_before_anything_is_deleted(tmp_path):
    data = tmp_path / "data"
    (data / "sub").mkdir(parents=True)
    (data / "sub" / "a.jsonl").write_text(json.dumps({"text": "one"}) + "\n")
    args = ["build", "-i", str(data / "**" / "*.jsonl"), "--tokenizer", TOKENIZER]
    result = CliRunner().invoke(main, [*args, "-o", str(data / "out")])
    assert result.exit_code == 2, result.output
    assert "matches" in result.output and "quarantine.jsonl" in result.output and "choose an -o outside" in result.output
    assert not (data / "out").exists()
    ok = CliRunner().invoke(main, [*args, "-o", str(tmp_path / "out")])  # outside the inputs: fine
    assert ok.exit_code == 0, ok.output
    shutil.copytree(tmp_path / "out", data / "sub" / "out")  # a finished build inside the inputs, then --overwrite
    before = sorted(p.name for p in (data / "sub" / "out").iterdir())
    again = CliRunner().invoke(main, [*args, "-o", str(data / "sub" / "out"), "--overwrite"])
    assert again.exit_code == 2 and sorted(p.name for p in (data / "sub" / "out").iterdir()) == before  # nothing deleted


def test_a_file_given_twice_is_warned(tmp_path):
    src = tmp_path / "a.jsonl"
    src.write_text(json.dumps({"text": "one"}) + "\n")
    os.symlink(src, tmp_path / "link.jsonl")
    result = CliRunner().invoke(main, ["build", "-i", str(src), "-i", str(tmp_path / "link.jsonl"), "-o",
                                                       str(tmp_path / "out"), "--tokenizer", TOKENIZER])
    assert result.exit_code == 0, result.output
    assert f"packer: warning: input {tmp_path / 'link.jsonl'} is the same file as {src}; it is read once" in result.stderr
    assert json.loads((tmp_path / "out" / "manifest.json").read_text())["accounting"]["records_read"] == 1


def test_a_refused_build_leaves_no_lock_behind(tmp_path):
    data = tmp_path / "sample_data"
    data.mkdir()
    (data / "in.jsonl").write_text(json.dumps({"text": "one"}) + "\n")
    result = CliRunner().invoke(main, ["build", "-i", str(data / "in.jsonl"), "-o", str(data), "--tokenizer", TOKENIZER])
    assert result.exit_code == 2, result.output
    assert sorted(p.name for p in data.iterdir()) == ["in.jsonl"]
    other = tmp_path / "other"
    other.mkdir()
    (other / "mine.txt").write_text("a user's folder")
    result = CliRunner().invoke(main, ["build", "-i", str(data / "in.jsonl"), "-o", str(other), "--tokenizer", TOKENIZER])
    assert result.exit_code == 2 and "holds no packer build" in result.output
    assert sorted(p.name for p in other.iterdir()) == ["mine.txt"]
