import pytest

from conftest import ROOT
from packer.config import BuildConfig, load_pipeline, resolve
from packer.errors import ConfigError


def test_sample_pipeline_resolves():
    c = resolve(ROOT / "pipelines" / "sample.toml")
    assert c.max_length == 4096 and c.output == "out/sample" and c.algorithm == "bfd"
    assert c.input == ("sample_data/llava.jsonl", "sample_data/chat.jsonl", "sample_data/docs.jsonl")


def test_flags_override_the_pipeline_and_replace_inputs():
    c = resolve(ROOT / "pipelines" / "sample.toml", input=("x.jsonl",), output="o", max_length=8192)
    assert c.input == ("x.jsonl",) and c.output == "o" and c.max_length == 8192
    assert c.tokenizer == "sample_data/tokenizer"  # kept from the pipeline


def test_none_overrides_are_ignored():
    assert resolve(ROOT / "pipelines" / "sample.toml", max_length=None).max_length == 4096


def test_unknown_pipeline_key(tmp_path):
    p = tmp_path / "p.toml"
    p.write_text('max_lenght = 10\n')
    with pytest.raises(ConfigError, match="unknown key\\(s\\) max_lenght; known keys: name, input"):
        load_pipeline(p)


@pytest.mark.parametrize(
    "text, match",
    [
        ("max_length = 'big'", "max_length must be an integer, got 'big'"),
        ("max_length = 0", "max_length must be at least 1, got 0"),
        ("format = 'csv'", "format = 'csv' is not one of auto, llava, messages, text"),
        ("strict = 1", "strict must be true or false"),
        ("input = [1]", "input must be a list of strings"),
        ("workers = -1", "workers must be 0"),
        ("max_length = [", "not valid TOML"),
    ],
)
def test_bad_values(tmp_path, text, match):
    p = tmp_path / "p.toml"
    p.write_text(text + "\n")
    with pytest.raises(ConfigError, match=match):
        resolve(p)


def test_missing_pipeline_file(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        resolve(tmp_path / "nope.toml")


def test_input_globs_are_sorted_and_must_match(tmp_path):
    for name in ("b.jsonl", "a.jsonl"):
        (tmp_path / name).write_text("{}\n")
    c = BuildConfig(input=(str(tmp_path / "*.jsonl"),))
    assert [p.name for p in c.input_files()] == ["a.jsonl", "b.jsonl"]
    with pytest.raises(ConfigError, match="matches no file"):
        BuildConfig(input=(str(tmp_path / "*.txt"),)).input_files()
    with pytest.raises(ConfigError, match="no input given"):
        BuildConfig().input_files()
    with pytest.raises(ConfigError, match="does not exist"):
        BuildConfig(input=("missing.jsonl",)).input_files()
