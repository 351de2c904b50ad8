"""The command line: flags reach the config, errors become exit codes, stubs say so."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from click.testing import CliRunner

from conftest import ROOT, SAMPLE, TOKENIZER
from packer.cli import main


@pytest.fixture
def run():
    def invoke(*args):
        return CliRunner().invoke(main, [str(a) for a in args], catch_exceptions=False)

    return invoke


def test_build_then_inspect(run, tmp_path, monkeypatch):
    monkeypatch.chdir(ROOT)
    out = tmp_path / "o"
    r = run("build", "pipelines/sample.toml", "-i", SAMPLE / "docs.jsonl", "-o", out, "--max-length", 2048)
    assert r.exit_code == 0, r.output
    assert "records      50 read = 48 packed + 2 quarantined + 0 dropped" in r.output
    assert "of 2,048 tokens per row" in r.output
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["config"]["input"] == [str(SAMPLE / "docs.jsonl")]
    assert manifest["config"]["tokenizer"] == "sample_data/tokenizer"  # kept from the pipeline
    r = run("inspect", out, "--json")
    s = json.loads(r.output)
    assert s["rows"] == manifest["stats"]["rows"] and s["tokens"] == manifest["stats"]["tokens"]
    assert s["quarantined_by_reason"] == {"not_an_object": 1, "wrong_type": 1}
    r = run("inspect", out)
    assert "fill" in r.output and "lower bound" in r.output and "quarantined  " in r.output


def test_build_without_pipeline_runs_the_sample_job(run, tmp_path, monkeypatch):
    monkeypatch.chdir(ROOT)
    r = run("build", "-o", tmp_path / "o")
    assert r.exit_code == 0, r.output
    assert "231 read = 223 packed + 8 quarantined + 0 dropped" in r.output


def test_boolean_flags(run, tmp_path, write_jsonl):
    f = write_jsonl("in.jsonl", [{"text": "a b c d e"}] * 2)
    r = run("build", "-i", f, "-o", tmp_path / "o", "--tokenizer", TOKENIZER, "--no-append-eos", "--no-shuffle-rows")
    assert r.exit_code == 0, r.output
    config = json.loads((tmp_path / "o" / "manifest.json").read_text())["config"]
    assert config["append_eos"] is False and config["shuffle_rows"] is False


@pytest.mark.parametrize(
    "args, code, message",
    [
        (["build", "-i", "missing.jsonl", "--tokenizer", TOKENIZER], 2, "input file 'missing.jsonl' does not exist"),
        (["build", "-i", SAMPLE / "docs.jsonl", "--tokenizer", TOKENIZER, "--algorithm", "ffd", "--max-images", "2"], 2,
         "algorithm 'ffd' does not support max_media; use bfd or next-fit"),
        (["build", "-i", SAMPLE / "docs.jsonl", "--tokenizer", TOKENIZER, "--algorithm", "nope"], 2, "unknown algorithm 'nope'"),
        (["build", "-i", SAMPLE / "docs.jsonl", "--tokenizer", "/no/such/tokenizer"], 1, "cannot load tokenizer '/no/such/tokenizer'"),
        (["build", "-i", SAMPLE / "llava.jsonl", "--tokenizer", TOKENIZER, "--strict"], 3, "llava.jsonl:98: missing_image"),
        (["repack", ".", "--max-length", "8192", "-o", "x"], 1, ". is not a finished packer build"),
        (["repack", ".", "--tokenizer", "t", "-o", "x"], 2, "No such option '--tokenizer'"),
        (["inspect", "nowhere"], 1, "nowhere is not a finished packer build"),
        (["report", "nowhere"], 1, "nowhere is not a finished packer build"),
        (["verify", "nowhere"], 6, "nowhere is not a finished packer build"),
    ],
)
def test_errors_and_exit_codes(args, code, message, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    r = CliRunner().invoke(main, [str(a) for a in args])
    assert r.exit_code == code, r.output
    assert message in r.output


def test_help_is_fast_and_imports_nothing_heavy():
    code = (
        "import sys; from packer.cli import main; import packer; "
        "heavy = [m for m in ('torch', 'transformers', 'pyarrow', 'numpy', 'open_clip', 'ray') if m in sys.modules]; "
        "print(heavy)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
    r = subprocess.run([sys.executable, "-m", "packer", "--help"], capture_output=True, text=True, check=True)
    for command in ("build", "inspect", "repack", "report", "verify"):
        assert command in r.stdout
