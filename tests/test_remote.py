"""Builds in object storage: inputs, media and the output on an S3 API (moto's server, started
here), written directly by the workers with the local engine's bytes; atomic writes, resume
from remote shards, the loader and verify on a remote build. (The same with Ray on a
multi-node cluster: tests/test_cluster.py.)"""

from __future__ import annotations

import os

import pytest

from conftest import ROOT, SAMPLE
from packer.build import build
from packer.config import resolve

pytest.importorskip("s3fs")
pytest.importorskip("moto")

from s3_server import S3Server  # noqa: E402

INPUTS = ("llava.jsonl", "chat.jsonl", "docs.jsonl")


@pytest.fixture(scope="module")
def s3(tmp_path_factory):
    """An S3 server with sample_data (JSONL, images, audio) in s3://data/, its variables in os.environ."""
    import s3fs

    saved = dict(os.environ)
    with S3Server() as server:
        os.environ.update(server.env)
        os.environ["PACKER_CACHE"] = str(tmp_path_factory.mktemp("packer-cache"))
        s3fs.S3FileSystem.clear_instance_cache()  # instances made for another server keep its address
        fs = server.filesystem()
        fs.mkdir("data")
        fs.mkdir("builds")
        for name in INPUTS:
            fs.pipe(f"data/{name}", (SAMPLE / name).read_bytes())
        for folder in ("images", "audio"):
            for p in (SAMPLE / folder).iterdir():
                fs.pipe(f"data/{folder}/{p.name}", p.read_bytes())
        try:
            yield fs
        finally:
            s3fs.S3FileSystem.clear_instance_cache()
            os.environ.clear()
            os.environ.update(saved)


def config(output: str, **kw):
    os.chdir(ROOT)
    return resolve(ROOT / "pipelines" / "sample.toml", input=tuple(f"s3://data/{n}" for n in INPUTS), output=output,
                   chunk_records=40, shard_rows=4, **kw)


def strip(m: dict) -> dict:
    return {k: v for k, v in m.items() if k not in ("created_at", "execution")}


def listed(m: dict) -> list[str]:
    f = m["files"]
    return [e["file"] for e in [*f["samples"], *f["packed"], *f["tokenizer"], f["plan"], f["quarantine"], f["dropped"]]]


@pytest.fixture(scope="module")
def reference(s3, tmp_path_factory):
    """The same s3:// inputs built by the local engine into a local folder."""
    out = tmp_path_factory.mktemp("ref") / "out"
    return out, build(config(str(out)), progress=False).to_dict()


@pytest.mark.slow  # builds: ~8 s each on 2 cores
def test_an_s3_build_has_the_local_builds_bytes(s3, reference, monkeypatch):
    ref_out, ref = reference
    m = build(config("s3://builds/b1", workers=2), progress=False).to_dict()
    assert strip(m) == strip(ref) and m["execution"]["output"] == "s3://builds/b1"
    assert len(ref["files"]["samples"]) > 3 and len(ref["files"]["packed"]) > 3 and ref["accounting"]["records_read"] == 231
    for name in listed(ref):
        assert s3.cat(f"builds/b1/{name}") == (ref_out / name).read_bytes(), name
    assert s3.exists("builds/b1/report.html") and s3.exists("builds/b1/manifest.json")
    assert s3.exists("builds/b1/.state/fingerprint.json")  # the resume state lives with the build
    assert not [p for p in s3.find("builds/b1") if ".tmp-" in p]


@pytest.mark.slow  # builds: ~8 s each on 2 cores
def test_a_rerun_reuses_the_finished_remote_shards(s3, reference, monkeypatch):
    from packer.stages import encode, materialize

    ref_out, ref = reference
    build(config("s3://builds/b2"), progress=False)
    # As after a crash in stage 3: no manifest, two stage-1 tasks and one stage-3 task not recorded.
    for name in ("manifest.json", ".state/encode-00001.json", ".state/encode-00004.json", ".state/pack-00002.json"):
        s3.rm(f"builds/b2/{name}")
    s3.pipe("builds/b2/samples/part-00002.arrow", b"damaged")  # recorded, but no longer what was recorded: redone
    written = []
    for module in (encode, materialize):
        original = module.write_shard if module is encode else module.write_shard_batches
        spy = (lambda f: lambda path, *a, **k: (written.append(str(path)), f(path, *a, **k))[1])(original)
        monkeypatch.setattr(module, "write_shard" if module is encode else "write_shard_batches", spy)
    m = build(config("s3://builds/b2"), progress=False).to_dict()
    assert strip(m) == strip(ref)
    assert sorted(w.split("b2/")[1] for w in written) == [
        "packed/part-00002.arrow", "samples/part-00001.arrow", "samples/part-00002.arrow", "samples/part-00004.arrow"]
    for name in listed(ref):
        assert s3.cat(f"builds/b2/{name}") == (ref_out / name).read_bytes(), name


def test_a_failed_remote_write_leaves_nothing_under_the_final_name(s3):
    from packer.io.remote import RemotePath, atomic_write

    for url in ("s3://builds/atomic/part.arrow", "memory://atomic/part.arrow"):
        target = RemotePath(url)
        with pytest.raises(RuntimeError, match="killed"):
            with atomic_write(target) as f:
                f.write(b"x" * (6 * 2**20))  # past s3fs's first part: an upload in progress
                raise RuntimeError("killed mid-write")
        assert not target.exists() and not [p for p in target.parent.iterdir() if ".tmp-" in p.name]
        with atomic_write(target) as f:
            f.write(b"whole")
        assert target.read_bytes() == b"whole"


@pytest.mark.slow  # builds: ~8 s each on 2 cores
def test_loader_and_verify_read_a_remote_build(s3, reference):
    from packer.loader import PackedDataset
    from packer.verify import verify

    ref_out, ref = reference
    build(config("s3://builds/b3"), progress=False)
    remote, local = PackedDataset("s3://builds/b3"), PackedDataset(ref_out)
    assert len(remote) == len(local) > 10
    for k in (0, len(local) // 2, len(local) - 1):
        a, b = remote[k], local[k]
        assert a["input_ids"].tolist() == b["input_ids"].tolist() and a["segment_ids"] == b["segment_ids"]
    assert remote.tokenizer().convert_tokens_to_ids("<image>") == local.tokenizer().convert_tokens_to_ids("<image>")
    assert {k: v.tolist() for k, v in remote.row_stats().items()} == {k: v.tolist() for k, v in local.row_stats().items()}
    problems, checked = verify("s3://builds/b3")
    assert problems == [] and checked["rows"] == len(local)
    packed = ref["files"]["packed"][1]["file"]
    s3.pipe(f"builds/b3/{packed}", b"not a shard")
    problems, _ = verify("s3://builds/b3")
    assert problems[0].file == packed and "size" in problems[0].message  # then the rows it held are missed


def test_a_url_build_is_locked_on_this_machine_and_a_damaged_remote_shard_is_named(tmp_path, monkeypatch):
    """No flock in a bucket: a second build of one URL from this machine is refused all the same;
    a remote shard whose bytes differ from the manifest's sha256 is refused when read, naming it."""
    import fsspec

    from packer.errors import PackerError
    from packer.io.cache import local_copy
    from packer.io.remote import RemotePath
    from packer.stages.state import BuildLock

    monkeypatch.setenv("PACKER_CACHE", str(tmp_path / "cache"))
    out = RemotePath("memory://locked/build")
    first = BuildLock(out)
    with pytest.raises(PackerError, match="is being built by pid"):
        BuildLock(RemotePath("memory://locked/build/"))  # the same URL, spelled with a slash
    first.release()
    BuildLock(out).release()
    fsspec.filesystem("memory").pipe("/locked/build/samples/part-00000.arrow", b"not what was written")
    with pytest.raises(PackerError, match=r"memory://locked/build/samples/part-00000.arrow does not match"):
        local_copy(out / "samples" / "part-00000.arrow", "0" * 64)
    assert not list((tmp_path / "cache").rglob("*.arrow*"))  # nothing half-kept
