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
    assert c.tokenizer == str(ROOT / "sample_data" / "tokenizer")  # kept from the pipeline, the folder recorded absolute


def test_report_ranks_from_a_pipeline_file(tmp_path):
    p = tmp_path / "p.toml"
    p.write_text("report_ranks = [16, 128]\nreport_batch = 2\n")
    c = resolve(p)
    assert (c.report_ranks, c.report_batch, c.report_window) == ((16, 128), 2, 64)
    assert BuildConfig().report_ranks == (8, 64)


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
        ("format = 'csv'", "format = 'csv' is not one of auto, llava, sharegpt, messages, prompt_completion, alpaca, text"),
        ("strict = 1", "strict must be true or false"),
        ("input = [1]", "input must be a list of strings"),
        ("workers = -1", "workers must be 0"),
        ("max_length = [", "not valid TOML"),
        ("report_ranks = [8, 'x']", "report_ranks must be a list of integers, got \\[8, 'x'\\]"),
        ("report_ranks = 8", "report_ranks must be a list of integers, got 8"),
        ("report_ranks = []", "report_ranks must be one or more positive rank counts, got \\[\\]"),
        ("report_ranks = [8, 0]", "report_ranks must be one or more positive rank counts"),
        ("report_batch = 0", "report_batch must be at least 1, got 0"),
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


# ---------------------------------------------------------------- stage / group tags and the key sets derived from them


def test_every_field_is_tagged_with_a_stage_and_a_group():
    from packer.config import FIELDS, GROUPS, STAGES

    for name, f in FIELDS.items():
        assert f.metadata["stage"] in STAGES, name
        assert f.metadata["group"] in GROUPS, name
        assert f.metadata["help"], name


def test_key_sets_are_derived_from_the_tags_and_partition_the_fields():
    from packer.config import CONTENT_KEYS, EXECUTION_KEYS, FIELDS, PLAN_KEYS, REPACK_KEYS

    content, plan, execution = set(CONTENT_KEYS), set(PLAN_KEYS), set(EXECUTION_KEYS)
    assert content | plan | execution == set(FIELDS)
    assert not content & plan and not content & execution and not plan & execution
    assert set(REPACK_KEYS) == plan | execution and "output" in REPACK_KEYS
    for keys, stage in ((CONTENT_KEYS, "content"), (PLAN_KEYS, "plan"), (EXECUTION_KEYS, "execution")):
        assert keys == tuple(n for n, f in FIELDS.items() if f.metadata["stage"] == stage)
    # what a repack may change: the plan, how it runs, where it goes; nothing stage 1 decided
    assert {"max_length", "algorithm", "oversize", "seed", "shard_rows", "group_by"} <= plan
    assert {"overwrite", "workers", "engine", "durable"} <= execution
    assert {"tokenizer", "input", "image_tokens", "audio_tokens", "chunk_records", "image_embeddings"} <= content


def test_execution_keys_stay_out_of_the_manifest_config_and_the_fingerprint():
    from packer.config import EXECUTION_KEYS, PLAN_KEYS

    # Pinned: moving a key in or out of execution changes every build's fingerprint (a resume would be refused).
    assert set(EXECUTION_KEYS) == {"output", "engine", "workers", "overwrite", "durable", "staging_dir", "ray_address",
                                   "cpus_per_task", "embed_gpus", "report_ranks", "report_batch", "report_window",
                                   "on_internal_error"}
    c = BuildConfig(workers=3, overwrite=True)
    assert not set(c.content_dict()) & set(EXECUTION_KEYS)
    assert set(PLAN_KEYS) <= set(c.content_dict())  # the plan decides the packed rows: it is content of the build
    assert c.execution_dict()["workers"] == 3 and set(c.execution_dict()) == set(EXECUTION_KEYS)
    # the report's sampler settings change no shard: the same content, so the same fingerprint
    assert BuildConfig(report_ranks=(16,), report_batch=4, report_window=1).content_dict() == BuildConfig().content_dict()


def test_an_untagged_or_mistagged_field_fails_at_definition():
    from packer.config import _opt

    with pytest.raises(TypeError):
        _opt(1, "no tags")
    with pytest.raises(ValueError, match="stage must be one of content, plan, execution"):
        _opt(1, "bad stage", stage="packing", group="packing")
    with pytest.raises(ValueError, match="group one of input, tokenizer"):
        _opt(1, "bad group", stage="plan", group="plan")


# ---------------------------------------------------------------- spec strings: one parser, one error style


@pytest.mark.parametrize(
    "key, spec, match",
    [
        ("image_tokens", "square", "unknown image token policy 'square'; known: anyres, dynamic, fixed"),
        ("image_tokens", "dynamic:max_pix=5", "image token policy dynamic: unknown parameter 'max_pix'; known: patch_size, "
                                              "merge_size, min_pixels, max_pixels, rounding"),
        ("image_tokens", "dynamic:max_pixels=lots", "dynamic.max_pixels = 'lots' is not a valid int"),
        ("image_tokens", "dynamic:max_pixels", "image token policy dynamic: parameter 'max_pixels' has no value; "
                                               "write dynamic:max_pixels=VALUE"),
        ("image_tokens", "dynamic:max_pixels=1,max_pixels=2", "parameter 'max_pixels' is given twice"),
        ("image_tokens", "fixed:cls_token=maybe", "fixed.cls_token = 'maybe' is not a valid bool; use true or false"),
        ("audio_tokens", "mp3", "unknown audio token policy 'mp3'; known: qwen2-audio, rate, whisper"),
        ("audio_tokens", "rate:per_second=fast", "rate.per_second = 'fast' is not a valid float"),
        ("audio_tokens", "whisper:window=one", "audio token policy whisper: unknown parameter 'window'; known: "
                                               "window_seconds, positions, windows"),
        ("audio_features", "mfcc", "unknown audio features 'mfcc'; known: whisper"),
        ("audio_features", "whisper:n_mels=80", "audio features whisper: unknown parameter 'n_mels'; known: feature_size"),
        ("audio_features", "whisper:kind=x", "audio features whisper: unknown parameter 'kind'; known: feature_size"),
        ("audio_features", "whisper:feature_size=many", "whisper.feature_size = 'many' is not a valid int"),
        ("audio_features", "whisper:feature_size=0", "whisper.feature_size = 0 must be at least 1: 128 for Qwen2-Audio"),
        ("image_embeddings", ":openai", "image embeddings ':openai': no MODEL; write MODEL\\[:PRETRAINED\\]"),
        ("image_embeddings", "ViT-B-32:pretrained=openai", "image embeddings ViT-B-32: 'pretrained=openai' is neither a "
                                                           "checkpoint file nor a tag.*write ViT-B-32:PRETRAINED, e.g. "
                                                           "ViT-B-32:openai"),
    ],
)
def test_spec_strings_fail_in_one_style_when_the_config_is_made(key, spec, match):
    with pytest.raises(ConfigError, match=match):
        BuildConfig(**{key: spec})


def test_spec_values_are_converted_to_the_field_types():
    from packer.media.features import FeatureSpec
    from packer.media.policies import parse_policy

    p = parse_policy(" dynamic : max_pixels = 1003520 , rounding=qwen-vl-utils ", "image")
    assert p.max_pixels == 1003520 and p.rounding == "qwen-vl-utils"
    assert parse_policy("fixed:cls_token=true", "image").cls_token is True
    assert parse_policy("fixed:cls_token=0", "image").cls_token is False
    assert parse_policy("rate:per_second=12", "audio").per_second == 12.0
    assert parse_policy("whisper:windows=one,", "audio").windows == "one"  # a trailing comma is harmless
    assert FeatureSpec.parse("whisper:feature_size=80") == FeatureSpec("whisper", 80)
    assert FeatureSpec.parse("whisper") == FeatureSpec()


def test_embed_spec_keeps_its_model_pretrained_shape():
    from packer.media.embed import EmbedSpec

    s = EmbedSpec.parse("ViT-B-32:laion2b_s34b_b79k", output="tokens", device="cpu", batch_size=4)
    assert (s.model, s.pretrained, s.output) == ("ViT-B-32", "laion2b_s34b_b79k", "tokens")
    assert EmbedSpec.parse("ViT-B-32", output="pooled", device="cpu", batch_size=4).pretrained is None
    assert EmbedSpec.parse("ViT-B-32:random", output="pooled", device="cpu", batch_size=4).pretrained is None
    assert BuildConfig(image_embeddings="ViT-B-32:random").image_embeddings == "ViT-B-32:random"


@pytest.mark.parametrize("key, value, match", [
    ("cpus_per_task", -1.0, r"cpus_per_task must be a positive number \(CPUs a Ray task reserves, e.g. 1 or 0.5\), got -1.0"),
    ("cpus_per_task", 0.0, "cpus_per_task must be a positive number"),
    ("cpus_per_task", float("nan"), "cpus_per_task must be a positive number"),
    ("embed_gpus", -1.0, r"embed_gpus must be 0 \(none\) or a positive number of GPUs, got -1.0"),
    ("embed_gpus", float("inf"), "embed_gpus must be 0"),
])
def test_ray_resources_are_checked_before_ray_sees_them(key, value, match):
    """Ray raised its own ValueError traceback at cpus_per_task = -1, and nan passed: one line, exit 2, up front."""
    with pytest.raises(ConfigError, match=match):
        BuildConfig(input=("x.jsonl",), **{key: value})
    assert BuildConfig(input=("x.jsonl",), cpus_per_task=0.5, embed_gpus=0.0).cpus_per_task == 0.5
