"""Builds in object storage: inputs, media and the output on an S3 API (moto's server, started
here), written directly by the workers with the local engine's bytes; atomic writes, resume
from remote shards, the loader and verify on a remote build. (The same with Ray on a
multi-node cluster: tests/test_cluster.py.)"""

from __future__ import annotations

import os
import re

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
    from packer.summary import summarize  # from the manifest: the media counts its build recorded
    assert summarize("s3://builds/b3")["media"] == summarize(ref_out)["media"] == ref["stats"]["media"]
    assert ref["stats"]["media"]["image"]["items"] > 0
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


# ---------------------------------------------------------------- what the store refuses, and moving a URL build's media


@pytest.fixture
def no_credentials(s3, monkeypatch):
    """The S3 server's address without its credentials (and no instance metadata to ask)."""
    import s3fs

    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", "/nonexistent")
    monkeypatch.setenv("AWS_CONFIG_FILE", "/nonexistent")
    s3fs.S3FileSystem.clear_instance_cache()
    yield
    s3fs.S3FileSystem.clear_instance_cache()


def cli(*args):
    from click.testing import CliRunner

    from packer.cli import main

    return CliRunner().invoke(main, [str(a) for a in args])


def test_a_store_without_credentials_is_one_line_naming_the_url_and_the_fix(no_credentials, tmp_path):
    from packer.errors import ConfigError

    tokenizer = ROOT / "sample_data" / "tokenizer"
    with pytest.raises(ConfigError, match=r"output s3://builds/nocred: cannot reach it \(NoCredentialsError.*"
                                          r"AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY"):
        build(resolve(None, input=[str(SAMPLE / "docs.jsonl")], output="s3://builds/nocred", tokenizer=str(tokenizer)),
              progress=False)
    for inputs in ("s3://data/docs.jsonl", "s3://data/*.jsonl"):  # never "matches no file"
        with pytest.raises(ConfigError, match=rf"input {re.escape(inputs)}: cannot reach it \(NoCredentialsError"):
            resolve(None, input=[inputs], output=str(tmp_path / "o")).input_files()
    for args, url in ((["-i", SAMPLE / "docs.jsonl", "-o", "s3://builds/nocred"], "output s3://builds/nocred"),
                      (["-i", "s3://data/docs.jsonl", "-o", tmp_path / "o"], "input s3://data/docs.jsonl"),
                      (["-i", SAMPLE / "docs.jsonl", "-o", "gs://bucket/b"], "gs://bucket/b"),
                      (["-i", SAMPLE / "docs.jsonl", "-o", "az://container/b"], "az://container/b"),
                      (["-i", SAMPLE / "docs.jsonl", "-o", "nosuch://x/b"], "nosuch://x/b: Protocol not known")):
        r = cli("build", *args, "--tokenizer", tokenizer)
        assert r.exit_code == 2, r.output
        assert r.output.startswith(f"packer: error: {url}") and len(r.output.strip().splitlines()) == 1, r.output
        assert "Traceback" not in r.output and "matches no file" not in r.output
    # gs:// and az:// name their package where it is missing, else their credentials
    r = cli("build", "-i", SAMPLE / "docs.jsonl", "-o", "gs://bucket/b", "--tokenizer", tokenizer)
    assert "gcsfs" in r.output or "GOOGLE_APPLICATION_CREDENTIALS" in r.output
    r = cli("inspect", "s3://builds/nocred")  # reading a build: the same line, not "is not a finished packer build"
    assert r.exit_code == 2 and "build s3://builds/nocred/manifest.json: cannot reach it (NoCredentialsError" in r.output
    r = cli("verify", "s3://builds/nocred")  # the same one line naming the cause, not "1 problem(s)" about the build
    assert r.exit_code == 2, r.output
    assert r.output.startswith("packer: error: build s3://builds/nocred/manifest.json: cannot reach it "
                               "(NoCredentialsError") and len(r.output.strip().splitlines()) == 1, r.output


def test_a_memory_output_is_refused_it_would_be_gone_when_packer_exits(tmp_path):
    from packer.errors import ConfigError

    config = resolve(None, input=[str(SAMPLE / "docs.jsonl")], output="memory://builds/gone",
                     tokenizer=str(ROOT / "sample_data" / "tokenizer"))
    with pytest.raises(ConfigError, match=r"output memory://builds/gone: memory:// keeps its files only while this "
                                          r"process runs.*write it to a folder or to durable storage"):
        build(config, progress=False)
    r = cli("build", "-i", SAMPLE / "docs.jsonl", "-o", "memory://builds/gone", "--tokenizer", ROOT / "sample_data/tokenizer")
    assert r.exit_code == 2 and "memory:// keeps its files only while this process runs" in r.output


@pytest.mark.slow  # the reference build
def test_a_url_builds_media_refs_are_relative_to_its_url_root_so_its_media_can_move(s3, reference):
    """Built from s3://data/*.jsonl, the media root is s3://data and each ref is relative to it: the loader reads
    s3://data/images/... by default and the same files from a copy elsewhere with ``media_root=``."""
    from packer.loader import PackedDataset
    from packer.media.load import load_image

    out, manifest = reference
    assert manifest["media_root"] == "s3://data"
    ds = PackedDataset(out)
    spans = [(k, m) for k in range(len(ds)) for m in ds[k]["media"]]
    assert spans and all("://" not in m["ref"] and not m["ref"].startswith("/") for _, m in spans)
    k, span = next((k, m) for k, m in spans if m["kind"] == "image")
    assert span["path"] == f"s3://data/{span['ref']}"
    moved = PackedDataset(out, media_root=str(SAMPLE))  # the same files, elsewhere
    image = next(m for m in moved[k]["media"] if m["ref"] == span["ref"])
    assert image["path"] == f"{SAMPLE}/{span['ref']}"
    assert load_image(image["path"]).size == load_image(span["path"]).size


@pytest.mark.slow  # builds: ~8 s each on 2 cores
def test_a_staged_build_is_uploaded_whole_without_its_resume_state(s3, reference, tmp_path):
    """--staging-dir: built in a local folder, then uploaded (manifest last), the resume state left out."""
    staged = build(config("s3://builds/staged", staging_dir=str(tmp_path / "staging")), progress=False).to_dict()
    assert strip(staged) == strip(reference[1]) and staged["execution"]["output"] == "s3://builds/staged"
    names = s3.find("builds/staged")
    assert "builds/staged/manifest.json" in names and not any("/.state/" in n for n in names)
    assert (tmp_path / "staging" / ".state").is_dir()


def test_an_unreachable_endpoint_is_one_line_too(s3, monkeypatch, tmp_path):
    """Credentials but no server at the endpoint: the connection error, the URL and the fix, exit 2."""
    import s3fs
    from s3_server import free_port

    monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://127.0.0.1:{free_port()}")  # nothing listens there
    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", os.environ["AWS_ENDPOINT_URL"])
    monkeypatch.setenv("AWS_MAX_ATTEMPTS", "1")
    s3fs.S3FileSystem.clear_instance_cache()
    try:
        r = cli("build", "-i", SAMPLE / "docs.jsonl", "-o", "s3://builds/nowhere", "--tokenizer", ROOT / "sample_data/tokenizer")
    finally:
        s3fs.S3FileSystem.clear_instance_cache()
    assert r.exit_code == 2 and len(r.output.strip().splitlines()) == 1, r.output
    assert r.output.startswith("packer: error: output s3://builds/nowhere: cannot reach it (EndpointConnectionError")
    assert "check the URL's endpoint" in r.output and "AWS_ENDPOINT_URL" in r.output


@pytest.mark.slow  # two builds: ~10 s on 2 cores
def test_a_header_check_reads_the_first_bytes_of_s3_images_and_packs_what_a_whole_read_does(s3, monkeypatch, tmp_path):
    """``--image-check header`` over s3:// reads each image's first ``HEAD_BYTES`` (a ranged GET, the whole object only
    where the header needs more): the same packed rows as the default whole-file check, and fewer bytes read."""
    import s3fs

    from packer.io import fs

    read: list[int] = []
    original = s3fs.core.S3File._fetch_range

    def counted(self, start, end):
        data = original(self, start, end)
        if "/images/" in self.path:
            read.append(len(data))
        return data

    monkeypatch.setattr(s3fs.core.S3File, "_fetch_range", counted)
    monkeypatch.setattr(fs, "HEAD_BYTES", 1024)
    whole = build(config(str(tmp_path / "whole"), image_check="verify"), progress=False)
    whole_bytes, read[:] = sum(read), []
    header = build(config(str(tmp_path / "header"), image_check="header"), progress=False)
    assert [e.sha256 for e in header.files.packed] == [e.sha256 for e in whole.files.packed]
    assert read and 0 < sum(read) < whole_bytes  # first bytes only, where they told the size
