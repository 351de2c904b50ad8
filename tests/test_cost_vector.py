"""Each sample's stored cost vector, the build's cost model (cost_model: auto, default, a path) and ``packer
calibrate``'s fit."""

from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from packer.cost import COSTS, CostModel, resolve_cost_model
from packer.errors import ConfigError, SchemaVersionError

ROOT = Path(__file__).resolve().parents[1]
SAMPLE = ROOT / "sample_data"
COEFFICIENTS = {"token": 1.0, "attention": 1e-4, "image_item": 50.0, "image_token": 2.0, "image_square": 1e-3,
                "audio_item": 300.0}  # a hand-written cost model JSON: a subset of the coefficients
TINY_TEXT = dict(hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                 max_position_embeddings=4096, rms_norm_eps=1e-6, tie_word_embeddings=False, vocab_size=300)


def build_at(out: Path, pipeline: Path | None = None, **settings):
    from packer.build import build
    from packer.config import resolve

    cwd = os.getcwd()
    os.chdir(ROOT)
    try:
        return build(resolve(pipeline, output=str(out), **settings), progress=False)
    finally:
        os.chdir(cwd)


def samples_of(out: Path, manifest) -> pa.Table:
    from packer.shards.io import read_shards
    from packer.shards.schema import SAMPLE_SCHEMA

    return read_shards([out / e.file for e in manifest.files.samples], SAMPLE_SCHEMA)


@pytest.fixture(scope="module")
def one_per_row(tmp_path_factory):
    """sample_data (images, audio, text) with one sample a row, under a hand-written cost model JSON."""
    folder = tmp_path_factory.mktemp("cost")
    path = folder / "cost.json"
    path.write_text(json.dumps(COEFFICIENTS))
    out = folder / "out"
    manifest = build_at(out, ROOT / "pipelines" / "sample.toml", max_segments=1, cost_model=str(path))
    return out, manifest, path


def test_a_samples_stored_cost_is_the_cost_of_a_row_holding_it_alone(one_per_row):
    from packer.shards.io import read_shard
    from packer.shards.stats import ROW_FIELDS, table_stats

    out, manifest, _ = one_per_row
    samples = samples_of(out, manifest)
    stored = np.stack([samples.column(f"cost_{k}").to_numpy() for k in COSTS], axis=-1)
    at = {(s, line): i for i, (s, line) in enumerate(zip(samples.column("source_index").to_pylist(),
                                                      samples.column("source_line").to_pylist(), strict=True))}
    model = CostModel(**COEFFICIENTS)
    compared = with_media = 0
    for entry in manifest.files.packed:
        table = read_shard(out / entry.file)
        stats = table_stats(table)
        rows = model.vector({n: getattr(stats, f"row_{n}")[0] for n in ROW_FIELDS})
        for r, (source, line, n_tokens) in enumerate(zip(table.column("segment_source").to_pylist(),
                                                         table.column("segment_line").to_pylist(),
                                                         table.column("n_tokens").to_pylist(), strict=True)):
            assert len(source) == 1  # --max-segments 1
            i = at[(source[0], line[0])]
            if samples.column("length")[i].as_py() != n_tokens:
                continue  # truncated to max_length: its row costs less than the sample stored whole
            np.testing.assert_allclose(rows[r], stored[i], rtol=1e-12)
            compared += 1
            with_media += bool(stored[i, 1])
    assert compared == samples.num_rows - manifest.to_dict()["stats"]["truncated_samples"]
    assert with_media >= 4 and (stored >= 0).all()


def test_the_manifest_records_the_cost_model_a_path_gave(one_per_row):
    out, manifest, path = one_per_row
    recorded = manifest.stats["cost_model"]
    assert recorded["source"] == "file" and recorded["path"] == str(path) and recorded["setting"] == str(path)
    assert recorded["coefficients"] == CostModel(**COEFFICIENTS).coefficients()
    assert json.loads((out / "manifest.json").read_text())["stats"]["cost_model"] == recorded
    assert CostModel.of_build(manifest) == CostModel(**COEFFICIENTS)  # the samplers and packer steps take it


def test_repack_keeps_the_samples_cost_model(one_per_row, tmp_path):
    from packer.build import repack

    out, manifest, _ = one_per_row
    again = repack(out, output=str(tmp_path / "re"), max_length=8192, max_segments=0, progress=False)
    assert again.stats["cost_model"] == manifest.stats["cost_model"]


def test_plan_columns_carry_the_cost_vector(one_per_row):
    from packer.stages.planning import plan_columns

    out, manifest, _ = one_per_row
    samples = samples_of(out, manifest)
    columns = plan_columns(samples)
    for k in COSTS:
        assert columns.schema.field(f"cost_{k}").type == pa.float64()
        assert columns.column(f"cost_{k}").equals(samples.column(f"cost_{k}"))


def text_build(out: Path, tokenizer: Path, **settings):
    return build_at(out, input=(str(SAMPLE / "docs.jsonl"),), tokenizer=str(tokenizer), max_bad_fraction=1.0, **settings)


def test_auto_takes_the_model_config_beside_the_checkpoint(tmp_path):
    from transformers import AutoConfig

    tokenizer = tmp_path / "model"
    shutil.copytree(SAMPLE / "tokenizer", tokenizer)
    config = AutoConfig.for_model("qwen2", **TINY_TEXT)
    config.save_pretrained(tokenizer)
    manifest = text_build(tmp_path / "out", tokenizer)
    recorded = manifest.stats["cost_model"]
    want = CostModel.for_model(AutoConfig.from_pretrained(tokenizer))
    assert recorded["source"] == "model_config" and recorded["path"] == str(tokenizer / "config.json")
    assert recorded["coefficients"] == want.coefficients()
    samples = samples_of(tmp_path / "out", manifest)
    length = samples.column("length").to_numpy().astype(np.float64)
    np.testing.assert_allclose(samples.column("cost_llm").to_numpy(), want.token * length + want.attention * length**2,
                               rtol=1e-12)
    assert not samples.column("cost_encoder").to_numpy().any()


def test_auto_without_a_model_config_is_the_default_model_and_says_why(tmp_path):
    manifest = text_build(tmp_path / "out", SAMPLE / "tokenizer")
    recorded = manifest.stats["cost_model"]
    assert recorded["source"] == "default" and recorded["coefficients"] == CostModel().coefficients()
    assert "no model config.json" in recorded["note"]
    assert resolve_cost_model("default") == {"setting": "default", "source": "default",
                                             "coefficients": CostModel().coefficients()}


def test_a_worker_is_handed_the_cost_model_and_never_resolves_it(tmp_path, monkeypatch):
    """The driver resolves the cost model once (EncoderSpec.from_config) and ships it in the spec: a stage-1 worker's
    setup (local or Ray) builds its CostModel from the spec's record, never from the setting; a spec without one is
    refused, not resolved on the worker."""
    import dataclasses

    import packer.cost
    import packer.cost.model
    from packer.config import resolve
    from packer.encode import EncoderSpec
    from packer.stages import encode

    path = tmp_path / "cost.json"
    path.write_text(json.dumps({"token": 3.0}))
    spec = EncoderSpec.from_config(resolve(None, tokenizer=str(SAMPLE / "tokenizer"), cost_model=str(path)))
    assert spec.cost_model["coefficients"]["token"] == 3.0

    def resolved(*args, **kwargs):
        raise AssertionError("a worker resolved the cost model")

    monkeypatch.setattr(packer.cost, "resolve_cost_model", resolved)
    monkeypatch.setattr(packer.cost.model, "resolve_cost_model", resolved)
    path.unlink()  # the file the setting names is not on the worker's machine
    state = encode.setup(spec, str(tmp_path / "out"), False, durable=False)
    assert state.cost == CostModel(**spec.cost_model["coefficients"]) and state.cost.token == 3.0
    with pytest.raises(ValueError, match="resolved on the driver"):
        encode.setup(dataclasses.replace(spec, cost_model=None), str(tmp_path / "out"), False, durable=False)


def test_a_changed_cost_model_changes_the_fingerprint(tmp_path):
    path = tmp_path / "cost.json"
    path.write_text(json.dumps({"token": 1.0}))
    text_build(tmp_path / "out", SAMPLE / "tokenizer", cost_model=str(path))
    text_build(tmp_path / "out", SAMPLE / "tokenizer", cost_model=str(path))  # unchanged: resumed, not refused
    path.write_text(json.dumps({"token": 2.0}))
    with pytest.raises(ConfigError, match=r"changed: cost_model\)"):
        text_build(tmp_path / "out", SAMPLE / "tokenizer", cost_model=str(path))


def test_a_cost_model_path_is_a_model_config_or_coefficients_else_refused(tmp_path):
    from transformers import Qwen2VLConfig

    folder = tmp_path / "vlm"
    Qwen2VLConfig(text_config=TINY_TEXT, vision_config=dict(depth=2, embed_dim=32, mlp_ratio=2, num_heads=4,
                                                            hidden_size=64, patch_size=14, spatial_merge_size=2)
                  ).save_pretrained(folder)
    recorded = resolve_cost_model(str(folder))
    assert recorded["source"] == "model_config"
    assert recorded["coefficients"] == CostModel.for_model(Qwen2VLConfig.from_pretrained(folder)).coefficients()
    assert recorded["coefficients"]["image_token"] > 0
    assert resolve_cost_model("auto", ("", str(folder)))["coefficients"] == recorded["coefficients"]
    calibrated = tmp_path / "calibrated.json"
    calibrated.write_text(json.dumps({"coefficients": {"token": 3.0}, "device": "cuda", "dtype": "bfloat16", "model": "x"}))
    assert resolve_cost_model(str(calibrated))["calibrated"] == {"device": "cuda", "dtype": "bfloat16", "model": "x"}
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"tokens": 1.0}))
    with pytest.raises(ConfigError, match=r"\['tokens'\] are not cost model coefficients"):
        resolve_cost_model(str(bad))
    bad.write_text(json.dumps({"token": -1.0}))
    with pytest.raises(ConfigError, match="non-negative"):
        resolve_cost_model(str(bad))
    with pytest.raises(ConfigError, match="cannot read .*missing.json as JSON"):
        resolve_cost_model(str(tmp_path / "missing.json"))


def test_a_schema_4_build_and_samples_shard_are_refused_saying_why_and_how_to_rebuild(one_per_row, tmp_path):
    from packer.build import repack
    from packer.shards.io import read_shard
    from packer.shards.schema import VERSION_KEY

    out, manifest, _ = one_per_row
    old = tmp_path / "old"
    shutil.copytree(out, old)
    (old / "manifest.json").write_text(json.dumps({**json.loads((old / "manifest.json").read_text()),
                                                   "schema_version": 4}))
    with pytest.raises(SchemaVersionError, match="schema_version 4 .*before per-sample cost vectors.* rebuild it"):
        repack(old, output=str(tmp_path / "re"), max_length=8192, progress=False)
    table = samples_of(out, manifest)
    table = table.drop_columns([f"cost_{k}" for k in COSTS])
    table = table.replace_schema_metadata({**table.schema.metadata, VERSION_KEY: b"4"})
    path = tmp_path / "part-00000.arrow"
    with pa.ipc.new_stream(str(path), table.schema) as writer:
        writer.write_table(table)
    with pytest.raises(SchemaVersionError, match="schema_version 4 .*before per-sample cost vectors"):
        read_shard(path)


def test_a_negative_or_nan_cost_is_a_damaged_shard(one_per_row):
    from packer.errors import DamagedShardError
    from packer.shards.integrity import check_table

    out, manifest, _ = one_per_row
    table = samples_of(out, manifest).combine_chunks()
    for bad in (-1.0, float("nan")):
        costs = table.column("cost_encoder").to_numpy().copy()
        costs[3] = bad
        damaged = table.set_column(table.schema.get_field_index("cost_encoder"), "cost_encoder", pa.array(costs))
        damaged = damaged.replace_schema_metadata(table.schema.metadata)
        with pytest.raises(DamagedShardError, match="row 3.*a negative or NaN cost_encoder"):
            check_table(damaged, "samples/part-00000.arrow")


# ------------------------------------------------------------------ packer calibrate


def test_nnls_recovers_exact_coefficients_and_keeps_them_non_negative():
    from packer.cost.calibrate import nnls

    rng = np.random.default_rng(0)
    a = rng.uniform(0, 1, (40, 5)) * np.array([1.0, 1e3, 1e6, 1.0, 1e4])  # columns of very different sizes
    x = np.array([2e-3, 0.0, 3e-9, 0.5, 1e-5])
    np.testing.assert_allclose(nnls(a, a @ x), x, rtol=1e-9, atol=1e-15)
    b = a @ np.array([1.0, -1e-3, 0.0, 0.0, 0.0]) + rng.normal(0, 1e-3, 40)  # least squares would go negative
    got = nnls(a, b)
    gradient = a.T @ (b - a @ got)  # Karush-Kuhn-Tucker: 0 where positive, <= 0 where held at 0
    assert (got >= 0).all() and got[1] == 0
    scale = np.linalg.norm(a, axis=0) * np.linalg.norm(b)
    assert (np.abs(gradient[got > 0]) <= 1e-9 * scale[got > 0]).all() and (gradient[got == 0] <= 1e-9 * scale[got == 0]).all()


@pytest.mark.parametrize("max_tokens,max_image_tokens", [(64, 16), (4096, 1024)])
def test_the_calibration_shapes_separate_every_term(max_tokens, max_image_tokens):
    """Times made exactly by known coefficients are fitted back exactly: the shapes vary tokens, attention pairs,
    images, image tokens and Σ image tokens² independently (the design matrix has full rank)."""
    from packer.cost.calibrate import FEATURES, fit, image_shapes, text_shapes

    truth = dict(zip(FEATURES, (8e-3, 3e-6, 2e-9, 7e-4, 5e-5, 4e-8), strict=True))
    points = [s.stats(2) for s in text_shapes(max_tokens) + image_shapes(max_image_tokens, 2)]
    seconds = [sum(truth[f] * p[f] for f in FEATURES) for p in points]
    got = fit(points, seconds)
    assert got == pytest.approx(truth, rel=1e-6)


def test_a_calibration_shape_has_the_stats_of_the_packed_row_it_times():
    from packer.cost.calibrate import Shape

    assert Shape(4, 32).stats() == {"call": 1.0, "token": 128.0, "attention": 4 * 32.0**2, "image_item": 0.0,
                                    "image_token": 0.0, "image_square": 0.0}
    image = Shape(1, 16, images=2, grid=(8, 16)).stats(merge=2)  # 32 placeholders an image, between begin and end
    assert image == {"call": 1.0, "token": 16 + 2 * 34.0, "attention": (16 + 2 * 34.0) ** 2, "image_item": 2.0,
                     "image_token": 64.0, "image_square": 2 * 32.0**2}


@pytest.mark.parametrize("family", ["qwen2_vl", "qwen3_vl"])
def test_calibrate_times_a_tiny_vlm_and_writes_a_cost_model_the_build_reads(tmp_path, family):
    from click.testing import CliRunner
    from transformers import Qwen2VLConfig, Qwen3VLConfig

    from packer.cli import main

    ids = dict(image_token_id=297, video_token_id=296, vision_start_token_id=298, vision_end_token_id=299)
    rope = {"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [2, 3, 3]}
    if family == "qwen2_vl":
        config = Qwen2VLConfig(text_config=dict(TINY_TEXT, rope_parameters=rope), **ids,
                               vision_config=dict(depth=2, embed_dim=32, mlp_ratio=2, num_heads=4, hidden_size=64,
                                                  patch_size=14, spatial_merge_size=2, temporal_patch_size=2))
    else:
        config = Qwen3VLConfig(text_config=dict(TINY_TEXT, head_dim=16, rope_parameters=rope | {"mrope_interleaved": True}),
                               vision_config=dict(depth=2, hidden_size=32, intermediate_size=64, num_heads=4, patch_size=16,
                                                  spatial_merge_size=2, temporal_patch_size=2, out_hidden_size=64,
                                                  num_position_embeddings=64, deepstack_visual_indexes=[0]), **ids)
    config.save_pretrained(tmp_path / "model")
    path = tmp_path / "cost.json"
    result = CliRunner().invoke(main, ["calibrate", str(tmp_path / "model"), "--max-tokens", "64", "--max-image-tokens",
                                       "16", "--repeats", "1", "--warmup", "0", "-o", str(path)])
    assert result.exit_code == 0, result.output
    assert f"use it: packer build ... --cost-model {path}" in result.output
    written = json.loads(path.read_text())
    model = CostModel.load(path)
    assert all(v >= 0 for v in model.coefficients().values())
    assert written["fitted"] == ["token", "attention", "image_item", "image_token", "image_square"]
    assert (written["device"], written["dtype"], written["model_type"]) == ("cpu", "float32", family)
    assert {p["kind"] for p in written["points"]} == {"text", "image"} and len(written["points"]) >= 8
    for p in written["points"]:  # each point's fitted time and residual are the coefficients' own
        fitted = written["overhead_s"] + sum(written["coefficients"][f] * p[f] for f in written["fitted"])
        assert p["fitted"] == pytest.approx(fitted, rel=1e-9) and p["seconds"] > 0
        assert p["residual"] == pytest.approx((fitted - p["seconds"]) / p["seconds"], rel=1e-9, abs=1e-12)
    assert written["residuals"]["text_max"] == max(abs(p["residual"]) for p in written["points"] if p["kind"] == "text")
    for t in ("item", "token", "square"):  # videos go through the image tower
        assert written["coefficients"][f"video_{t}"] == written["coefficients"][f"image_{t}"]
    assert resolve_cost_model(str(path))["calibrated"] == {"device": "cpu", "dtype": "float32",
                                                           "model": str(tmp_path / "model")}


def test_a_pipelines_cost_model_path_is_relative_to_the_pipeline(tmp_path, monkeypatch):
    from packer.config import load_pipeline

    (tmp_path / "jobs").mkdir()
    (tmp_path / "jobs" / "cost.json").write_text(json.dumps({"token": 1.0}))
    (tmp_path / "jobs" / "a.toml").write_text('cost_model = "cost.json"\n')
    (tmp_path / "jobs" / "b.toml").write_text('cost_model = "default"\n')
    monkeypatch.chdir(tmp_path)
    assert load_pipeline(tmp_path / "jobs" / "a.toml")["cost_model"] == str(Path("jobs") / "cost.json")
    assert load_pipeline(tmp_path / "jobs" / "b.toml")["cost_model"] == "default"


@pytest.mark.parametrize("text, match", [
    ('{"token": Infinity}', r"coefficients must be finite non-negative numbers \(at most 1e\+200\), got \{'token': inf\}"),
    ('{"coefficients": {"image_token": 1e309}}', r"got \{'image_token': inf\}"),
    ('{"token": NaN}', r"got \{'token': nan\}"),
    ('{"token": -1}', r"got \{'token': -1\}"),
    ('{"token": 1e300, "attention": 1e-4}', r"at most 1e\+200\), got \{'token': 1e\+300\}"),
    ('{"token": "1"}', r"got \{'token': '1'\}"),
    ('{"tokn": 1}', r"\['tokn'\] are not cost model coefficients"),
    ("[1, 2]", "a cost model JSON is an object of coefficients, got list"),
    ("nope", r"not JSON \(Expecting value"),
])
def test_a_cost_model_json_of_unusable_coefficients_is_a_configuration_error(tmp_path, text, match):
    """Before any record is read: the build (exit 2, one line, no output folder) and `packer steps` alike; no
    coefficient that makes a stored cost inf, NaN or negative gets through."""
    from click.testing import CliRunner

    from packer.cli import main

    path = tmp_path / "cost.json"
    path.write_text(text)
    with pytest.raises(ConfigError, match=match):
        CostModel.load(path)
    if text != "nope":  # resolve_cost_model reads an unreadable file as no JSON: its own message
        with pytest.raises(ConfigError, match=rf"cost_model = '{path}': .*{match}"):
            resolve_cost_model(str(path))
    r = CliRunner().invoke(main, ["build", "-i", str(SAMPLE / "docs.jsonl"), "-o", str(tmp_path / "out"), "--tokenizer",
                                  str(SAMPLE / "tokenizer"), "--cost-model", str(path)])
    assert r.exit_code == 2 and r.stderr.count("\n") == 1 and not (tmp_path / "out").exists(), r.output


def test_a_cost_models_coefficients_are_checked_where_it_is_made():
    from packer.cost import CostModelError

    assert CostModel(token=1e200, attention=0).token == 1e200 and CostModel(token=np.float32(2)).token == 2.0
    for bad in (float("inf"), float("nan"), -1e-9, 1.1e200, True, "1"):
        with pytest.raises(CostModelError, match=rf"cost model coefficient image_token = {re.escape(repr(bad))} is not a "
                                                 r"number from 0 to 1e\+200: give finite, non-negative coefficients"):
            CostModel(image_token=bad)
    assert issubclass(CostModelError, ValueError)  # what callers of the library caught before


@pytest.mark.parametrize("size, shown", [(1e308, "1e+308"), (-64, "-64"), (0, "0"), (2**40, f"{2**40}")])
def test_a_model_config_of_impossible_sizes_is_refused_naming_the_size(tmp_path, size, shown):
    """hidden_size 1e308 stored inf costs, a negative one negative costs: for_model checks each size it reads."""
    config = dict(TINY_TEXT, model_type="llama", hidden_size=size)
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    with pytest.raises(ConfigError, match=rf"cost_model = '{path}': no FLOP model for this config \(ValueError: "
                                          rf"hidden_size = {re.escape(shown)} is not a size from 1 to 2,147,483,647\)"):
        resolve_cost_model(str(path))
    vision = dict(depth=2, embed_dim=32, mlp_ratio=2, num_heads=4, hidden_size=64, patch_size=-14, spatial_merge_size=2)
    with pytest.raises(ValueError, match="patch_size = -14 is not a size"):
        CostModel.for_model({"text_config": TINY_TEXT, "vision_config": vision})


def test_steps_refuses_an_unusable_cost_model_in_one_line(one_per_row, tmp_path):
    from click.testing import CliRunner

    from packer.cli import main

    out, _, _ = one_per_row
    for name, text, match in (("inf.json", '{"token": Infinity}', "coefficients must be finite non-negative numbers"),
                              ("bad.json", "nope", "not JSON"),
                              ("config.json", json.dumps(dict(TINY_TEXT, model_type="llama")),
                               "a model's config, not a cost model JSON")):
        (tmp_path / name).write_text(text)
        r = CliRunner().invoke(main, ["steps", str(out), "--ranks", "2", "--cost-model", str(tmp_path / name), "-o",
                                      str(tmp_path / "plan.arrow")])
        assert r.exit_code == 2 and r.stderr.count("\n") == 1 and match in r.stderr, r.output


@pytest.mark.parametrize("args, match", [
    (["--device", "bogus"], "calibrate: --device 'bogus' is not a device: cpu, cuda, cuda:1, mps, ..."),
    (["--device", "cuda"], "calibrate: --device 'cuda': this machine has no CUDA device torch can use; time on one it "
                           "has, or on cpu"),
    (["--dtype", "int8"], "calibrate: --dtype 'int8' is not one of auto, float32, bfloat16, float16"),
    (["--attention", "bogus"], "calibrate: --attention 'bogus' is no attention implementation transformers knows: give "
                               "one of eager, "),
    (["--vocab", "0"], "calibrate: '{model}': the config cannot be costed (ValueError: vocab_size = 0 is not a size"),
    (["--vocab", "1"], "calibrate: '{model}': vocab_size = 1; timing feeds random token ids, which needs a vocabulary "
                       "of at least 2 tokens"),
])
def test_calibrates_configuration_errors_are_one_line_exit_2_before_the_model_is_built(tmp_path, monkeypatch, args, match):
    import torch
    from click.testing import CliRunner

    from packer.cli import main

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)  # the same on a machine with a GPU
    vocab = int(args[1]) if args[0] == "--vocab" else 300
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text(json.dumps(dict(TINY_TEXT, model_type="llama", vocab_size=vocab)))
    options = args if args[0] != "--vocab" else []
    r = CliRunner().invoke(main, ["calibrate", str(model), *options, "-o", str(tmp_path / "cost.json")])
    error = [line for line in r.stderr.splitlines() if not line.startswith("[transformers]")]  # its own config warnings
    assert r.exit_code == 2 and len(error) == 1 and error[0].startswith(f"packer: error: {match.format(model=model)}"), \
        r.output
    assert not (tmp_path / "cost.json").exists()


def test_a_poor_fit_is_said_plainly_with_what_it_means():
    from packer.cost.calibrate import POOR_FIT, fit_warnings, summary_text

    assert POOR_FIT == 0.25 and fit_warnings({"text_max": 0.25, "image_max": None}) == []  # at the threshold: fine
    warnings = fit_warnings({"text_max": 0.803, "image_max": 0.54})
    assert [w.split(":")[0] for w in warnings] == ["poor fit", "poor fit"]
    assert warnings[0].startswith("poor fit: a text shape's time is 80.3% off the fitted one (over 25%), so rows balanced "
                                  "by this cost model may differ by as much in step time")
    result = {"path": "cost.json", "model": "m", "model_type": "llama", "device": "cpu", "dtype": "float32",
              "points": [], "fitted": ["token"], "coefficients": {"token": 1.0}, "flops": {"token": 0.0},
              "overhead_s": 0.0, "residuals": {"text_max": 0.803, "image_max": 0.54}, "warnings": warnings, "notes": []}
    lines = summary_text(result).splitlines()
    assert lines[lines.index("  largest |residual|: text 80.3%, image 54.0%") + 1].startswith(
        "  warning: poor fit: a text shape's time is 80.3% off")
    assert sum(line.startswith("  warning: poor fit") for line in lines) == 2
