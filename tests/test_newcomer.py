"""The first hour: exit codes that never hide bad data, a summary that says where to look
and what to fix, progress in a log, resumes that say what they reused, pipeline paths
relative to their file."""

from __future__ import annotations

import io
import json
import os
import shutil
import subprocess
import sys

import pytest
from click.testing import CliRunner

from conftest import ROOT, TOKENIZER
from packer.cli import main
from packer.progress import Stage


def run(*args):
    return CliRunner().invoke(main, [str(a) for a in args], catch_exceptions=False)


def chat(k: int, **extra) -> dict:
    return {"id": f"r{k}", "messages": [{"role": "user", "content": f"question {k} " * (1 + k % 5)},
                                        {"role": "assistant", "content": f"answer {k}"}], **extra}


def write(path, records) -> str:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in records))
    return str(path)


def test_a_build_that_packs_nothing_fails(tmp_path):
    data = write(tmp_path / "d.jsonl", ["not json", "[1]"])
    r = run("build", "-i", data, "-o", tmp_path / "o", "--tokenizer", TOKENIZER, "--max-bad-fraction", 1.0)
    assert r.exit_code == 5 and "the build packed nothing: 2 records read, 2 quarantined" in r.output


def test_over_ten_percent_quarantined_fails_by_default_with_reasons_and_fixes(tmp_path):
    (tmp_path / "images").mkdir()
    records = [chat(k) for k in range(8)] + [{"image": "images/nope.png", **chat(9)}, "oops"]
    data = write(tmp_path / "d.jsonl", records)
    r = run("build", "-i", data, "-o", tmp_path / "o", "--tokenizer", TOKENIZER)
    assert r.exit_code == 5, r.output
    assert "2 of 10 records (20.0%) were quarantined or dropped, over --max-bad-fraction 0.1" in r.output
    assert "malformed_json 1 (lines that are not JSON" in r.output
    assert "--max-bad-fraction 1.0 to pack what is left" in r.output and "quarantine.jsonl" in r.output
    r = run("build", "-i", data, "-o", tmp_path / "o", "--tokenizer", TOKENIZER, "--max-bad-fraction", 1.0, "--overwrite")
    assert r.exit_code == 0, r.output


def test_drops_count_against_the_threshold(tmp_path):
    data = write(tmp_path / "d.jsonl", [chat(k) for k in range(10)])
    r = run("build", "-i", data, "-o", tmp_path / "o", "--tokenizer", TOKENIZER, "--max-length", 8, "--oversize", "drop")
    assert r.exit_code == 5 and "oversize 10 (samples longer than --max-length: raise it" in r.output
    assert "dropped.jsonl" in r.output


def test_no_encoder_is_a_declared_choice_not_bad_data(tmp_path):
    from media_fixtures import write_images

    write_images(tmp_path / "img")
    records = [chat(k) for k in range(5)] + [{"image": "img/one_1x1.png", **chat(k)} for k in range(5, 10)]
    records = [{**r, "messages": [{**r["messages"][0], "content": "<image> " + r["messages"][0]["content"]},
                                  r["messages"][1]]} if "image" in r else r for r in records]
    data = write(tmp_path / "d.jsonl", records)
    r = run("build", "-i", data, "-o", tmp_path / "o", "--tokenizer", TOKENIZER, "--modalities", "audio")
    assert r.exit_code == 0, r.output
    assert "5 record(s) hold media of a kind this pipeline declares no encoder for" in r.output


def test_the_summary_names_the_files_and_the_fix(tmp_path):
    data = write(tmp_path / "d.jsonl", [chat(k) for k in range(20)] + ["oops"])
    out = tmp_path / "o"
    r = run("build", "-i", data, "-o", out, "--tokenizer", TOKENIZER)
    assert r.exit_code == 0, r.output
    assert f"details      {out / 'quarantine.jsonl'}" in r.output and f"report       {out / 'report.html'}" in r.output
    assert "fix          malformed_json: lines that are not JSON" in r.output


def test_progress_lines_in_a_log_and_a_resume_that_says_what_it_reused(tmp_path):
    data = write(tmp_path / "d.jsonl", [chat(k) for k in range(60)])
    out = tmp_path / "o"
    cmd = [sys.executable, "-m", "packer", "build", "-i", data, "-o", str(out), "--tokenizer", TOKENIZER,
           "--chunk-records", "20", "--shard-rows", "2"]
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    first = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=120)
    assert first.returncode == 0, first.stderr
    for stage in ("encode", "plan", "pack", "report"):
        assert f"packer: {stage:<9} done:" in first.stderr, first.stderr
    assert "60 records (0 quarantined)" in first.stderr and "\r" not in first.stderr  # plain lines, no bar
    (out / "manifest.json").unlink()  # as if the build died before its last step
    again = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=120)
    assert again.returncode == 0, again.stderr
    assert "3 of 3 tasks reused from the interrupted run" in again.stderr
    assert "shards reused from the interrupted run" in again.stderr


def test_stage_lines_carry_counts_rates_and_an_eta():
    stream = io.StringIO()
    stage = Stage("encode", "records", bytes_total=4_000_000, stream=stream, interval=0.0)
    stage.advance(1000, 1_000_000)
    stage.done("1,000 records")
    lines = stream.getvalue().splitlines()
    assert lines[0].startswith("packer: encode    1,000 records, 1.00 MB of 4.00 MB (25%),") and "ETA 0:" in lines[0]
    assert lines[1].startswith("packer: encode    done: 1,000 records in ")


def test_pipeline_paths_are_relative_to_the_pipeline_file(tmp_path, monkeypatch):
    job = tmp_path / "job"
    (job / "data").mkdir(parents=True)
    write(job / "data" / "d.jsonl", [chat(k) for k in range(5)])
    shutil.copytree(TOKENIZER, job / "tok")
    (job / "p.toml").write_text('input = ["data/d.jsonl"]\noutput = "out"\ntokenizer = "tok"\n')
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    r = run("build", job / "p.toml")
    assert r.exit_code == 0, r.output
    assert (job / "out" / "manifest.json").is_file() and not (elsewhere / "out").exists()


def test_outside_the_repository_without_input_says_no_pipeline_was_found(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    r = run("build")
    assert r.exit_code == 2 and "no pipeline and no input: pipelines/sample.toml is not here" in r.output
    assert "packer build -i data.jsonl -o out/data --tokenizer" in r.output  # what to run instead
    assert not list(tmp_path.iterdir())


@pytest.mark.parametrize("flag", ["-i", "-o"])
def test_a_build_with_other_inputs_or_output_drops_the_pipelines_name(tmp_path, monkeypatch, flag):
    monkeypatch.chdir(ROOT)
    args = ["-i", ROOT / "sample_data" / "docs.jsonl"] if flag == "-i" else []
    r = run("build", "pipelines/sample.toml", *args, "-o", tmp_path / "mine", "--max-bad-fraction", 1.0)
    assert r.exit_code == 0, r.output
    assert json.loads((tmp_path / "mine" / "manifest.json").read_text())["config"]["name"] == ""
