"""The command line: flags reach the config, errors become exit codes, stubs say so."""

from __future__ import annotations

import ast
import json
import re
import subprocess
import sys
import textwrap

import click
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
    assert manifest["config"]["tokenizer"] == str(TOKENIZER)  # kept from the pipeline, the folder recorded absolute
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
    r = run("build", "-i", f, "-o", tmp_path / "o", "--tokenizer", TOKENIZER, "--no-append-eos", "--order", "planner")
    assert r.exit_code == 0, r.output
    config = json.loads((tmp_path / "o" / "manifest.json").read_text())["config"]
    assert config["append_eos"] is False and config["order"] == "planner"



def test_an_empty_modalities_flag_builds_text_only(run, tmp_path, write_jsonl):
    """``--modalities ''`` is the empty list (``modalities = []`` in a pipeline file): over a pipeline of image and
    audio, the image record is quarantined (no_encoder) and the text one packed; a flag not given keeps the
    pipeline's kinds."""
    chat = {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]}
    (tmp_path / "square.png").write_bytes((SAMPLE / "images" / "square_336.png").read_bytes())
    image = {"image": "square.png",
             "conversations": [{"from": "human", "value": "<image>\nWhat is it?"}, {"from": "gpt", "value": "Shapes."}]}
    f = write_jsonl("in.jsonl", [chat, image])
    pipe = tmp_path / "p.toml"
    pipe.write_text(f'tokenizer = "{TOKENIZER}"\nmodalities = ["image", "audio"]\nmax_bad_fraction = 1.0\n')
    r = run("build", pipe, "-i", f, "-o", tmp_path / "text", "--modalities", "")
    assert r.exit_code == 0, r.output
    manifest = json.loads((tmp_path / "text" / "manifest.json").read_text())
    assert manifest["config"]["modalities"] == []
    assert manifest["accounting"]["samples_packed"] == 1 and manifest["accounting"]["quarantined_by_reason"] == {"no_encoder": 1}
    r = run("build", pipe, "-i", f, "-o", tmp_path / "media")
    assert r.exit_code == 0, r.output
    manifest = json.loads((tmp_path / "media" / "manifest.json").read_text())
    assert manifest["config"]["modalities"] == ["image", "audio"] and manifest["accounting"]["samples_packed"] == 2

@pytest.mark.parametrize(
    "args, code, message",
    [
        (["build", "-i", "missing.jsonl", "--tokenizer", TOKENIZER], 2, "input file 'missing.jsonl' does not exist"),
        (["build", "-i", SAMPLE / "docs.jsonl", "--tokenizer", TOKENIZER, "--algorithm", "ffd", "--max-images", "2"], 2,
         "algorithm 'ffd' does not support max_media; use bfd or next-fit"),
        (["build", "-i", SAMPLE / "docs.jsonl", "--tokenizer", TOKENIZER, "--algorithm", "nope"], 2, "unknown algorithm 'nope'"),
        (["build", "-i", SAMPLE / "docs.jsonl", "--tokenizer", "/no/such/tokenizer"], 2,
         "cannot load tokenizer '/no/such/tokenizer': no such folder, and not a hub id"),
        (["build", "-i", SAMPLE / "docs.jsonl", "--tokenizer", SAMPLE / "docs.jsonl"], 2,
         f"cannot load tokenizer '{SAMPLE / 'docs.jsonl'}': it is a file, not a folder"),
        (["build", "-i", SAMPLE / "docs.jsonl", "--family", "qwen3vl", "--processor", "/no/such/processor"], 2,
         "cannot load processor '/no/such/processor': no such folder, and not a hub id"),
        (["build", "-i", SAMPLE / "docs.jsonl", "--family", "qwen3vl", "--processor", "no/such/processor"], 2,
         "cannot load processor 'no/such/processor': no such folder under "),
        (["build", "-i", SAMPLE / "docs.jsonl", "--family", "qwen3vl", "--processor", SAMPLE / "docs.jsonl"], 2,
         f"cannot load processor '{SAMPLE / 'docs.jsonl'}': it is a file, not a folder"),
        (["build", "-i", SAMPLE / "llava.jsonl", "--tokenizer", TOKENIZER, "--strict"], 3, "llava.jsonl:98: missing_image"),
        (["repack", ".", "--max-length", "8192", "-o", "x"], 2, ". is not a finished packer build"),
        (["repack", ".", "--tokenizer", "t", "-o", "x"], 2, "No such option '--tokenizer'"),
        (["inspect", "nowhere"], 2, "nowhere is not a finished packer build"),
        (["report", "nowhere"], 2, "nowhere is not a finished packer build"),
        (["verify", "nowhere"], 6, "nowhere is not a finished packer build"),
    ],
)
def test_errors_and_exit_codes(args, code, message, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    r = CliRunner().invoke(main, [str(a) for a in args])
    assert r.exit_code == code, r.output
    assert message in r.output
    if message.startswith("cannot load"):  # a checkpoint that can be none is one line, never a traceback
        assert "Traceback" not in r.output and len(r.output.strip().splitlines()) == 1, r.output


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


# ---------------------------------------------------------------- every flag a message names is one the command accepts

FLAG = re.compile(r"(?<![\w-])(--[a-z][a-z0-9-]*[a-z0-9]|-[a-z])(?![\w-])")
PACKER = ROOT / "packer"


def flags_named(*sources: str) -> set[str]:
    """The flags (``--overwrite``, ``-o``) that the string literals of ``sources`` mention."""
    found: set[str] = set()
    for source in sources:
        for node in ast.walk(ast.parse(textwrap.dedent(source))):
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                found |= set(FLAG.findall(node.value))
    return found


def accepted(name: str) -> set[str]:
    command = main.commands[name]
    ctx = click.Context(command, info_name=name, help_option_names=["-h", "--help"])
    return {o for p in command.get_params(ctx) if isinstance(p, click.Option) for o in (*p.opts, *p.secondary_opts)}


def test_every_flag_named_anywhere_in_packer_is_a_build_flag():
    sources = [p.read_text() for p in sorted(PACKER.rglob("*.py")) if p.name != "cli.py"]
    named = flags_named(*sources)
    assert {"--overwrite", "--strict", "--max-bad-fraction", "-o", "-i", "--no-durable"} <= named  # the scan sees them
    others = set().union(*(accepted(c) for c in ("inspect", "report", "verify", "steps", "calibrate")))  # "packer inspect OUT --row N"
    assert named - accepted("build") - others == set()


def test_every_flag_named_on_the_repack_path_is_a_repack_flag():
    import inspect

    from packer import build

    functions = [build.repack, build._repack_into, build.plan_and_pack, build.check_plan_options, build._link_or_copy]
    modules = [PACKER / "stages" / n for n in ("state.py", "planning.py", "materialize.py", "manifest.py")]
    modules += sorted((PACKER / "shards").glob("*.py")) + sorted((PACKER / "pack").glob("*.py"))
    modules.remove(PACKER / "shards" / "step_plan.py")  # a step plan's file: packer steps' flags, not repack's
    named = flags_named(*(inspect.getsource(f) for f in functions), *(p.read_text() for p in modules))
    assert {"--overwrite", "-o"} <= named  # "pass --overwrite to replace it, or choose another -o"
    assert named - accepted("repack") == set()


def test_repack_accepts_plan_and_execution_flags_and_refuses_content_flags():
    flags = accepted("repack")
    assert {"--overwrite", "--workers", "--engine", "--durable", "--no-durable", "--max-length", "--shard-rows", "-o"} <= flags
    assert not {"--tokenizer", "--input", "--image-tokens", "--chunk-records", "--strict"} & flags


# ---------------------------------------------------------------- repack into a folder that holds a build


def test_repack_twice_into_one_folder_replaces_its_own_earlier_output(sample_build, tmp_path):
    src, m = sample_build
    out = tmp_path / "r"
    for extra in ([], [], ["--max-length", "2048", "--workers", "1"], ["--overwrite", "--engine", "local"]):
        r = CliRunner().invoke(main, ["repack", str(src), "-o", str(out), *extra])
        assert r.exit_code == 0, r.output
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["config"]["max_length"] == m["config"]["max_length"]  # the last run's (the source's) settings
    assert manifest["execution"]["overwrite"] is True
    r = CliRunner().invoke(main, ["verify", str(out)])
    assert r.exit_code == 0, r.output


def test_repack_over_another_build_says_pass_overwrite_and_then_takes_it(sample_build, tmp_path):
    src, _ = sample_build
    first, out = tmp_path / "first", tmp_path / "out"
    assert CliRunner().invoke(main, ["repack", str(src), "-o", str(first), "--seed", "1"]).exit_code == 0
    assert CliRunner().invoke(main, ["repack", str(first), "-o", str(out)]).exit_code == 0
    r = CliRunner().invoke(main, ["repack", str(src), "-o", str(out), "--seed", "2"])  # out holds a repack of another source
    assert r.exit_code == 2 and "pass --overwrite to replace it" in r.output, r.output
    r = CliRunner().invoke(main, ["repack", str(src), "-o", str(out), "--seed", "2", "--overwrite"])
    assert r.exit_code == 0, r.output
    assert json.loads((out / "manifest.json").read_text())["config"]["seed"] == 2


def test_build_help_has_one_section_per_group_with_defaults_and_choices():
    r = CliRunner().invoke(main, ["build", "--help"])
    assert r.exit_code == 0
    text = " ".join(r.output.split())
    sections = ["Input options:", "Tokenizer options:", "Media options:", "Packing options:", "Execution options:",
                "Output options:"]
    assert [text.index(s) for s in sections] == sorted(text.index(s) for s in sections)
    packing = text[text.index("Packing options:"):text.index("Execution options:")]
    assert "--max-length" in packing and "[default: 4096]" in packing and "[truncate|drop|split]" in packing
    assert "--tokenizer" not in packing
    r = CliRunner().invoke(main, ["repack", "--help"])
    text = " ".join(r.output.split())
    assert "--overwrite" in text and "--tokenizer" not in text and "[default: 4096]" not in text


def test_modalities_take_a_comma_separated_list(run, tmp_path, write_jsonl):
    """``--modalities image,video`` names two kinds (it was one unknown kind, 'image,video'), as the flag given twice
    does; an input's options after '#' keep their commas."""
    f = write_jsonl("in.jsonl", [{"text": "hello there"}])
    for args, kinds in ((["--modalities", "image,video"], ["image", "video"]),
                        (["--modalities", "image", "--modalities", "audio"], ["image", "audio"])):
        out = tmp_path / "-".join(kinds)
        r = run("build", "-i", f"{f}#weight=1,cap=5", "-o", out, "--tokenizer", TOKENIZER, *args)
        assert r.exit_code == 0, r.output
        manifest = json.loads((out / "manifest.json").read_text())
        assert manifest["config"]["modalities"] == kinds and manifest["config"]["input"] == [f"{f}#weight=1,cap=5"]
