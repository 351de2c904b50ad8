"""Damaged builds and hostile output folders: a clear ``packer: error:`` and the documented
exit code, never a traceback; ``--overwrite`` removes only what a build wrote; identity
survives duplicate and odd ids."""

from __future__ import annotations

import json
import os
import shutil

import pytest
from click.testing import CliRunner

from conftest import SAMPLE, TOKENIZER
from packer.cli import main
from packer.verify import verify


def run(*args):
    return CliRunner().invoke(main, [str(a) for a in args], catch_exceptions=False)


def chat(k: int, id_=None) -> dict:
    rec = {"messages": [{"role": "user", "content": f"question {k}"}, {"role": "assistant", "content": f"answer {k}"}]}
    return rec if id_ is None else {"id": id_, **rec}


@pytest.fixture
def small(tmp_path):
    data = tmp_path / "data.jsonl"
    data.write_text("".join(json.dumps(chat(k)) + "\n" for k in range(20)))
    out = tmp_path / "out"
    r = run("build", "-i", data, "-o", out, "--tokenizer", TOKENIZER, "--max-length", 64, "--shard-rows", 2)
    assert r.exit_code == 0, r.output
    return data, out


def test_overwrite_removes_only_what_the_build_wrote(small, tmp_path):
    data, out = small
    (out / "samples" / "photo.jpg").write_bytes(b"a user's file")
    (out / "notes.txt").write_text("mine")
    r = run("build", "-i", data, "-o", out, "--tokenizer", TOKENIZER, "--max-length", 128, "--overwrite")
    assert r.exit_code == 0, r.output
    assert (out / "samples" / "photo.jpg").read_bytes() == b"a user's file" and (out / "notes.txt").read_text() == "mine"
    problems = verify(out)[0]  # the build is sound; verify names the two files that are not the build's
    assert sorted((p.file, "not part of the build" in p.message) for p in problems) == [("notes.txt", True),
                                                                                       ("samples/photo.jpg", True)]


def test_a_folder_that_is_no_build_is_never_cleared(tmp_path):
    data = tmp_path / "data.jsonl"
    data.write_text(json.dumps(chat(0)) + "\n")
    out = tmp_path / "mine"
    (out / "samples").mkdir(parents=True)
    (out / "samples" / "photo.jpg").write_bytes(b"x")
    (out / "report.html").write_text("my report")
    r = run("build", "-i", data, "-o", out, "--tokenizer", TOKENIZER, "--overwrite")
    assert r.exit_code == 2 and "holds no packer build" in r.output and "never deletes files it did not write" in r.output
    assert (out / "samples" / "photo.jpg").exists() and (out / "report.html").read_text() == "my report"


@pytest.mark.parametrize("damage", ["truncated", "not_json", "not_an_object", "no_files"])
def test_verify_on_a_damaged_manifest_exits_6(small, damage):
    _, out = small
    path = out / "manifest.json"
    text = path.read_text()
    path.write_text({"truncated": text[: len(text) // 2], "not_json": "\x00\x01", "not_an_object": "[1, 2]",
                     "no_files": json.dumps({**json.loads(text), "files": None})}[damage])
    r = run("verify", out)
    assert r.exit_code == 6 and "manifest.json" in r.output and "Traceback" not in r.output
    for command in ("report", "inspect"):
        r = run(command, out)
        assert r.exit_code == 1 and r.output.startswith("packer: error:"), r.output


def test_truncated_shard_is_a_clear_error_for_report_inspect_and_verify(small):
    _, out = small
    shard = out / "packed" / "part-00000.arrow"
    shard.write_bytes(shard.read_bytes()[:100])
    for command, code in (("report", 1), ("inspect", 1), ("verify", 6)):
        r = run(command, out)
        assert r.exit_code == code and "part-" in r.output and "Traceback" not in r.output, (command, r.output)
    r = run("inspect", out, "--row", 0)
    assert r.exit_code == 1 and "cannot be read as a packer shard" in r.output


def test_repack_from_a_source_missing_a_shard(small, tmp_path):
    _, out = small
    next((out / "samples").glob("part-*.arrow")).unlink()
    r = run("repack", out, "-o", tmp_path / "r", "--max-length", 128)
    assert r.exit_code == 2 and "is missing: the source build is damaged" in r.output


def test_output_that_is_a_file_or_cannot_be_written(tmp_path):
    data = tmp_path / "data.jsonl"
    data.write_text(json.dumps(chat(0)) + "\n")
    (tmp_path / "README.md").write_text("x")
    r = run("build", "-i", data, "-o", tmp_path / "README.md", "--tokenizer", TOKENIZER)
    assert r.exit_code == 2 and "is a file, not a folder" in r.output
    r = run("build", "-i", data, "-o", "/sys/packer-cannot-write-here", "--tokenizer", TOKENIZER)
    assert r.exit_code == 1 and r.output.startswith("packer: error: cannot write to the output folder")


def test_disk_full_is_a_clear_error(tmp_path, monkeypatch):
    import errno

    import packer.pipeline.packing

    data = tmp_path / "data.jsonl"
    data.write_text(json.dumps(chat(0)) + "\n")
    real = packer.pipeline.packing.atomic_open

    def full(path, mode="wb"):
        if str(path).endswith("dropped.jsonl"):
            raise OSError(errno.ENOSPC, "No space left on device", str(path))
        return real(path, mode)

    monkeypatch.setattr(packer.pipeline.packing, "atomic_open", full)
    r = run("build", "-i", data, "-o", tmp_path / "o", "--tokenizer", TOKENIZER)
    assert r.exit_code == 1 and "dropped.jsonl: No space left on device" in r.output


def test_duplicate_and_odd_ids_and_one_file_twice_verify_clean(tmp_path):
    data = tmp_path / "d@ta.jsonl"
    records = [chat(0, "a"), chat(1, "a"), chat(2, 5), chat(3, "5"), chat(4, "x@3"), chat(5)]
    data.write_text("".join(json.dumps(r) + "\n" for r in records))
    out = tmp_path / "out"
    (tmp_path / "link.jsonl").symlink_to(data)
    r = run("build", "-i", data, "-i", os.path.relpath(data), "-i", tmp_path / "link.jsonl", "-o", out, "--tokenizer", TOKENIZER)
    assert r.exit_code == 0, r.output
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["accounting"]["records_read"] == 6 and manifest["accounting"]["samples_packed"] == 6  # read once
    assert not verify(out)[0]
    report = json.loads((out / "report.json").read_text())
    assert report["samples"] == 6 and report["duplicate_ids"] == 4  # "a" twice, 5 and "5"


def test_dropped_samples_are_listed_like_quarantined_ones(tmp_path):
    data = tmp_path / "data.jsonl"
    data.write_text(json.dumps(chat(0, "short")) + "\n" + json.dumps(chat(1, "long") | {
        "messages": [{"role": "user", "content": "word " * 300}, {"role": "assistant", "content": "ok"}]}) + "\n")
    out = tmp_path / "out"
    r = run("build", "-i", data, "-o", out, "--tokenizer", TOKENIZER, "--max-length", 64, "--oversize", "drop",
            "--max-bad-fraction", 1.0)
    assert r.exit_code == 0, r.output
    (entry,) = [json.loads(line) for line in (out / "dropped.jsonl").read_text().splitlines()]
    assert entry["file"] == str(data) and entry["line"] == 2 and entry["id"] == "long" and entry["reason"] == "oversize"
    assert not verify(out)[0]


def test_a_schema_1_build_fails_with_a_named_error_saying_how_to_rebuild(small):
    from packer.errors import SchemaVersionError
    from packer.loader import PackedDataset

    _, out = small
    path = out / "manifest.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), "schema_version": 1}))
    with pytest.raises(SchemaVersionError, match="schema_version 1 .* rebuild it: packer build ... --overwrite"):
        PackedDataset(out)
    shutil.rmtree(out)
    assert SAMPLE.is_dir()


def test_what_each_image_check_catches_in_a_cut_gif(tmp_path):
    """docs/media.md's table: verify does not see a truncated GIF; decode does when the
    first frame (the one loaders use) is damaged."""
    from media_fixtures import write_images

    from packer.errors import BadRecord
    from packer.media.probe import probe_image

    gif = write_images(tmp_path)["animated.gif"]
    cut = tmp_path / "cut.gif"
    cut.write_bytes(gif.read_bytes()[: int(gif.stat().st_size * 0.3)])
    probe_image(str(cut), "verify")
    with pytest.raises(BadRecord, match="corrupt_image"):
        probe_image(str(cut), "decode")
