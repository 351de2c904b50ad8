"""--engine ray: the same stage functions on a local Ray (2 CPUs), the same bytes out;
fsspec URLs for inputs and outputs."""

from __future__ import annotations

import json

import pytest

from conftest import ROOT, SAMPLE, TOKENIZER
from packer.build import build
from packer.config import BuildConfig, resolve
from packer.errors import StrictModeError


@pytest.fixture(scope="module")
def ray_session():
    ray = pytest.importorskip("ray")
    yield
    ray.shutdown()


def strip(m):
    return {k: v for k, v in m.items() if k not in ("created_at", "execution")}


def test_ray_engine_gives_the_local_engines_bytes(ray_session, tmp_path, monkeypatch):
    monkeypatch.chdir(ROOT)
    common = dict(chunk_records=40, shard_rows=4)
    local = build(resolve(ROOT / "pipelines" / "sample.toml", output=str(tmp_path / "local"), **common), progress=False)
    ray = build(resolve(ROOT / "pipelines" / "sample.toml", output=str(tmp_path / "ray"), engine="ray", workers=2, **common),
                progress=False)
    assert ray["execution"]["engine"] == "ray" and strip(ray) == strip(local)
    assert len(local["files"]["samples"]) > 3 and len(local["files"]["packed"]) > 3
    for e in [*local["files"]["samples"], *local["files"]["packed"], local["files"]["plan"], local["files"]["quarantine"]]:
        assert (tmp_path / "ray" / e["file"]).read_bytes() == (tmp_path / "local" / e["file"]).read_bytes(), e["file"]
    assert ray["accounting"] == local["accounting"]


def test_ray_engine_strict_error_reaches_the_driver(ray_session, tmp_path):
    config = BuildConfig(input=(str(SAMPLE / "llava.jsonl"),), output=str(tmp_path / "s"), tokenizer=TOKENIZER,
                         engine="ray", workers=2, strict=True, chunk_records=30)
    with pytest.raises(StrictModeError, match=r"llava\.jsonl:98: missing_image"):
        build(config, progress=False)


def test_fsspec_input_and_output(tmp_path):
    import fsspec

    mem = fsspec.filesystem("memory")
    mem.pipe("/data/docs.jsonl", (SAMPLE / "docs.jsonl").read_bytes())
    mem.pipe("/data/chat.jsonl", (SAMPLE / "chat.jsonl").read_bytes())
    for p in (SAMPLE / "audio").iterdir():
        mem.pipe(f"/data/audio/{p.name}", p.read_bytes())
    config = BuildConfig(input=("memory://data/*.jsonl",), output="memory://builds/b1", tokenizer=TOKENIZER, workers=1)
    m = build(config, progress=False)
    assert m["execution"]["output"] == "memory://builds/b1"
    assert m["accounting"]["records_read"] == 50 + 81 and m["accounting"]["samples_packed"] == 48 + 65  # 13 chats with images
    assert "missing_image" in m["accounting"]["quarantined_by_reason"]  # the chat images were not copied
    names = set(mem.find("/builds/b1"))
    for e in [*m["files"]["packed"], *m["files"]["samples"]]:
        assert f"/builds/b1/{e['file']}" in names
    assert json.loads(mem.cat("/builds/b1/manifest.json"))["stats"] == m["stats"]
    assert "/builds/b1/report.html" in names and not any("/.state/" in n for n in names)
    # A local-directory URL works the same way.
    m2 = build(BuildConfig(input=(str(SAMPLE / "docs.jsonl"),), output=f"file://{tmp_path}/url-out", tokenizer=TOKENIZER),
               progress=False)
    assert (tmp_path / "url-out" / "manifest.json").exists() and m2["stats"]["rows"] > 0


def test_ray_embedding_pass_runs_as_a_task(ray_session, tmp_path, monkeypatch):
    monkeypatch.chdir(ROOT)
    common = dict(input=(str(SAMPLE / "llava.jsonl"),), image_embeddings="ViT-S-32:random", embed_device="cpu")
    remote = build(resolve(ROOT / "pipelines" / "sample.toml", output=str(tmp_path / "r"), engine="ray", workers=2, **common),
                   progress=False)
    assert remote["embeddings"]["images"] == 6  # the LLaVA records use 6 of the 8 images
    assert remote["embeddings"]["files"][0]["rows"] == 6 and remote["embeddings"]["model"] == "ViT-S-32"
    assert (tmp_path / "r" / remote["embeddings"]["files"][0]["file"]).exists()
