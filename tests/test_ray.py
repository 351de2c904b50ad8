"""--engine ray: the same stage functions on a local Ray (2 CPUs), the same bytes out;
fsspec URLs for inputs and outputs."""

from __future__ import annotations

import dataclasses
import json
import time

import pytest

from conftest import ROOT, SAMPLE, TOKENIZER
from packer.build import build
from packer.config import BuildConfig, resolve
from packer.errors import StrictModeError

pytestmark = pytest.mark.slow  # starts Ray: minutes on 2 cores


@pytest.fixture(scope="module")
def ray_session():
    ray = pytest.importorskip("ray")
    yield
    ray.shutdown()


def strip(m):
    return {k: v for k, v in m.items() if k not in ("created_at", "execution")}


def test_ray_engine_gives_the_local_engines_bytes(ray_session, tmp_path, monkeypatch):
    import ray.data

    monkeypatch.chdir(ROOT)
    common = dict(chunk_records=40, shard_rows=4)
    local = build(resolve(ROOT / "pipelines" / "sample.toml", output=str(tmp_path / "local"), **common), progress=False).to_dict()
    ctx = ray.data.DataContext.get_current()
    before = ctx.execution_options.preserve_order, ctx.enable_progress_bars
    ray = build(resolve(ROOT / "pipelines" / "sample.toml", output=str(tmp_path / "ray"), engine="ray", workers=2, **common),
                progress=False).to_dict()
    assert (ctx.execution_options.preserve_order, ctx.enable_progress_bars) == before  # the process's Ray context, put back
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
    """fsspec inputs (memory://); an fsspec output of a filesystem that keeps nothing is refused (a build to
    object storage, written directly or staged: tests/test_remote.py); a local-directory URL is a folder."""
    import fsspec

    from packer.errors import ConfigError

    mem = fsspec.filesystem("memory")
    mem.pipe("/data/docs.jsonl", (SAMPLE / "docs.jsonl").read_bytes())
    mem.pipe("/data/chat.jsonl", (SAMPLE / "chat.jsonl").read_bytes())
    for p in (SAMPLE / "audio").iterdir():
        mem.pipe(f"/data/audio/{p.name}", p.read_bytes())
    config = BuildConfig(input=("memory://data/*.jsonl",), output=str(tmp_path / "b1"), tokenizer=TOKENIZER, workers=1,
                         max_bad_fraction=1.0)  # the chat images were not copied: quarantined on purpose
    m = build(config, progress=False).to_dict()
    assert m["accounting"]["records_read"] == 50 + 81 and m["accounting"]["samples_packed"] == 48 + 65  # 13 chats with images
    assert "missing_image" in m["accounting"]["quarantined_by_reason"]  # the chat images were not copied
    assert m["media_root"] == "memory://data"  # the inputs' URL folder: refs relative to it
    with pytest.raises(ConfigError, match="memory:// keeps its files only while this process runs"):
        build(dataclasses.replace(config, output="memory://builds/b1"), progress=False)
    with pytest.raises(ConfigError, match="memory:// keeps its files only while this process runs"):
        build(dataclasses.replace(config, output="memory://builds/b2", staging_dir=str(tmp_path / "staging")),
              progress=False)
    # A local-directory URL works the same way.
    m2 = build(BuildConfig(input=(str(SAMPLE / "docs.jsonl"),), output=f"file://{tmp_path}/url-out", tokenizer=TOKENIZER),
               progress=False).to_dict()
    assert (tmp_path / "url-out" / "manifest.json").exists() and m2["stats"]["rows"] > 0


def test_ray_embedding_pass_runs_as_a_task(ray_session, tmp_path, monkeypatch):
    monkeypatch.chdir(ROOT)
    common = dict(input=(str(SAMPLE / "llava.jsonl"),), image_embeddings="ViT-S-32:random", embed_device="cpu")
    remote = build(resolve(ROOT / "pipelines" / "sample.toml", output=str(tmp_path / "r"), engine="ray", workers=2, **common),
                   progress=False).to_dict()
    assert remote["embeddings"]["images"] == 6  # the LLaVA records use 6 of the 8 images
    assert remote["embeddings"]["files"][0]["rows"] == 6 and remote["embeddings"]["model"] == "ViT-S-32"
    assert (tmp_path / "r" / remote["embeddings"]["files"][0]["file"]).exists()


def _generated(tmp_path, n=2000):
    path = tmp_path / "docs.jsonl"
    with path.open("w") as f:
        for i in range(n):
            f.write(json.dumps({"id": f"d{i}", "text": " ".join(["packing", "rows", "ray", "tokens"] * (5 + i % 40))}) + "\n")
    return path


def test_a_killed_ray_worker_is_retried_and_nothing_is_lost(ray_session, tmp_path):
    import threading

    import psutil

    data = _generated(tmp_path)
    common = dict(input=(str(data),), tokenizer=TOKENIZER, chunk_records=100, shard_rows=10)
    local = build(BuildConfig(output=str(tmp_path / "local"), **common), progress=False).to_dict()
    killed = []

    def kill_one_worker():
        state = tmp_path / "ray" / ".state"
        deadline = time.time() + 120
        while time.time() < deadline and len(list(state.glob("encode-*.json"))) < 3:
            time.sleep(0.05)
        for p in psutil.process_iter(["cmdline"]):
            if any("MapWorker" in part for part in (p.info["cmdline"] or [])):
                p.kill()
                killed.append(p.pid)
                return

    t = threading.Thread(target=kill_one_worker)
    t.start()
    ray = build(BuildConfig(output=str(tmp_path / "ray"), engine="ray", workers=2, **common), progress=False).to_dict()
    t.join()
    assert killed, "no Ray worker was found to kill"
    assert strip(ray) == strip(local)
    for e in local["files"]["packed"]:
        assert (tmp_path / "ray" / e["file"]).read_bytes() == (tmp_path / "local" / e["file"]).read_bytes()


def test_a_killed_ray_driver_resumes(tmp_path):
    import os
    import signal
    import subprocess
    import sys

    data = _generated(tmp_path)
    args = ["-i", str(data), "--tokenizer", TOKENIZER, "--chunk-records", "100", "--shard-rows", "10"]
    def cli(*extra):
        return subprocess.run([sys.executable, "-m", "packer", "build", *args, *extra], capture_output=True, text=True)

    assert cli("-o", str(tmp_path / "ref")).returncode == 0
    ref = json.loads((tmp_path / "ref" / "manifest.json").read_text())
    victim = subprocess.Popen([sys.executable, "-m", "packer", "build", *args, "-o", str(tmp_path / "k"), "--engine", "ray",
                               "--workers", "2"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    state = tmp_path / "k" / ".state"
    deadline = time.time() + 180
    while len(list(state.glob("encode-*.json"))) < 3 and time.time() < deadline and victim.poll() is None:
        time.sleep(0.05)
    os.killpg(victim.pid, signal.SIGKILL)  # the driver and the local Ray it started
    victim.wait()
    assert not (tmp_path / "k" / "manifest.json").exists()
    done = len(list(state.glob("encode-*.json")))
    rerun = cli("-o", str(tmp_path / "k"), "--engine", "local")  # resumed, here with the local engine
    assert rerun.returncode == 0, rerun.stderr[-2000:]
    m = json.loads((tmp_path / "k" / "manifest.json").read_text())
    assert 0 < done < 20 and strip(m) == strip(ref)
    for e in ref["files"]["packed"] + ref["files"]["samples"]:
        assert (tmp_path / "k" / e["file"]).read_bytes() == (tmp_path / "ref" / e["file"]).read_bytes()
