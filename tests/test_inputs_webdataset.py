"""WebDataset tar shards as input: members grouped by key as WebDataset cuts them, media named by the json or by
extension, the same packed rows as the same records in JSONL + files (Qwen3-VL images and videos, Qwen2.5-Omni
audio), brace patterns locally and over S3, gzip tars, every bad input one quarantined sample naming its key (or one
error for a file that is not a tar), and the same bytes for any worker count."""

from __future__ import annotations

import copy
import gzip
import hashlib
import io
import json
import os
import tarfile
from pathlib import Path

import pyarrow as pa
import pytest

from conftest import ROOT, SAMPLE
from packer.errors import BadRecord, ConfigError
from packer.ingest import webdataset
from packer.ingest.webdataset import read_samples, split_name

MEDIA_KEYS = ("image", "images", "video", "videos", "audio", "audios")


def write_tar(path: Path, members: list, *, mode: str = "w") -> Path:
    """``members``: ``(name, bytes)`` regular files, or TarInfo objects as they are (folders, links)."""
    with tarfile.open(path, mode) as tar:
        for m in members:
            if isinstance(m, tarfile.TarInfo):
                tar.addfile(m)
                continue
            name, data = m
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return path


def as_sample(key: str, record: dict, by_extension: bool) -> list[tuple[str, bytes]]:
    """A sample_data record (media paths relative to sample_data) as tar members: each medium a member
    ``KEY.<n>.<ext>``; the json names it (``"0.png"``, its full name for the second, ``"png"`` for a lone one) or,
    with ``by_extension``, a top-level list is left out for the members' extensions to fill."""
    record = copy.deepcopy(record)
    members: list[tuple[str, bytes]] = []

    def member(path: str) -> str:
        ext = f"{len(members)}{Path(path).suffix}"
        members.append((f"{key}.{ext}", (SAMPLE / path).read_bytes()))
        return ext if len(members) != 2 else f"{key.rsplit('/', 1)[-1]}.{ext}"

    def named(value):
        return [named(v) for v in value] if isinstance(value, list) else member(value)

    for field in MEDIA_KEYS:
        if field in record:
            value = named(record[field])
            if by_extension:
                del record[field]
            else:
                record[field] = value
    for message in record.get("messages") or []:
        for part in message["content"] if isinstance(message["content"], list) else []:
            for kind in ("image", "video", "audio"):
                if kind in part:
                    part[kind] = named(part[kind])
    return [(f"{key}.json", json.dumps(record).encode()), *members]


def sample_records(name: str, keep) -> list[dict]:
    out = []
    for line in (SAMPLE / name).read_text().splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if isinstance(record, dict) and keep(record):
            out.append(record)
    return out


def media_paths(record: dict) -> list[str]:
    found = []

    def walk(value, media: bool):
        if isinstance(value, dict):
            for k, v in value.items():
                walk(v, k in MEDIA_KEYS)
        elif isinstance(value, list):
            for v in value:
                walk(v, media)
        elif media and isinstance(value, str):
            found.append(value)

    walk(record, False)
    return found


def whole(record: dict) -> bool:
    """A record that builds: its media exist, its tags match (sample_data holds bad records on purpose)."""
    return (all((SAMPLE / p).is_file() for p in media_paths(record)) and "mismatch" not in str(record.get("id"))
            and "bad" not in str(record.get("id")))


# ---------------------------------------------------------------- members, keys, samples


def test_keys_and_extensions_are_cut_as_webdataset_cuts_them():
    assert split_name("a/b/00042.0.jpg") == ("a/b/00042", "0.jpg")
    assert split_name("shard.v2/part.1/00042.JPG") == ("shard.v2/part.1/00042", "jpg")  # dots in folders
    assert split_name("00042.json") == ("00042", "json")
    assert split_name("README") is None and split_name("a/.hidden.jpg") is None and split_name("__index__") is None


def test_samples_group_members_by_key_and_order_media_by_name(tmp_path):
    record = {"id": "r", "conversations": [{"from": "human", "value": "<image><image><image>\nWhich?"},
                                           {"from": "gpt", "value": "The third."}]}
    pixels = {n: f"image {n}".encode() for n in (0, 1, 2, 10)}
    tar = write_tar(tmp_path / "x.tar", [
        ("a.b/00001.json", json.dumps(record).encode()),
        *[(f"a.b/00001.{n}.jpg", pixels[n]) for n in (10, 2, 0, 1)],  # stored out of order
        ("a.b/00001.txt", b"a caption nobody asked for"),
        ("a.b/00002.json", json.dumps({**record, "id": "s", "image": "2.jpg"}).encode()),
        ("a.b/00002.1.jpg", b"one"), ("a.b/00002.2.jpg", b"two")])
    samples = list(read_samples(tar))
    assert [(n, key) for n, key, _, _ in samples] == [(0, "a.b/00001"), (1, "a.b/00002")]
    assert samples[0][2]["images"] == [pixels[0], pixels[1], pixels[2], pixels[10]]  # 0, 1, 2, 10: numbers in order
    # the json names one of two images: the other is never dropped without a word
    assert samples[1][2].reason == "unused_member" and "1.jpg" in samples[1][2].detail


def test_the_json_names_members_by_extension_full_name_or_in_message_parts(tmp_path):
    messages = [{"role": "user", "content": [{"type": "video", "video": "mp4"}, {"type": "audio", "audio": "k7.flac"},
                                             {"type": "video", "video": ["0.png", "1.png"]}, {"type": "text", "text": "?"}]},
                {"role": "assistant", "content": "!"}]
    tar = write_tar(tmp_path / "x.tar", [
        ("k7.json", json.dumps({"messages": messages, "images": ["K7.2.PNG", "videos/elsewhere.png"]}).encode()),
        ("k7.mp4", b"clip"), ("k7.flac", b"sound"), ("k7.0.png", b"f0"), ("k7.1.png", b"f1"), ("k7.2.png", b"f2")])
    [(_, _, record, _)] = read_samples(tar)
    content = record["messages"][0]["content"]
    assert content[0]["video"] == b"clip" and content[1]["audio"] == b"sound" and content[2]["video"] == [b"f0", b"f1"]
    assert record["images"] == [b"f2", "videos/elsewhere.png"]  # a path with a folder stays a path
    assert "audios" not in record and "videos" not in record  # every member named: none left to fill a list


def test_folders_links_and_meta_entries_are_ignored(tmp_path):
    folder = tarfile.TarInfo("d/00001")
    folder.type = tarfile.DIRTYPE
    link = tarfile.TarInfo("d/00001.jpg")
    link.type, link.linkname = tarfile.SYMTYPE, "/etc/passwd"
    tar = write_tar(tmp_path / "x.tar", [("__meta__", b"{}"), folder, ("d/00001.json", b'{"text": "hi"}'), link,
                                         ("d/README", b"notes")])
    assert [(key, record) for _, key, record, _ in read_samples(tar)] == [("d/00001", {"text": "hi"})]


def test_gzip_tars_are_read_and_detected(tmp_path):
    from packer.ingest.units import detect

    for name in ("x.tar.gz", "x.tgz"):
        tar = write_tar(tmp_path / name, [("k.json", b'{"text": "zipped"}')], mode="w:gz")
        assert detect(tar) == "webdataset"
        assert [r for _, _, r, _ in read_samples(tar)] == [{"text": "zipped"}]


# ---------------------------------------------------------------- bad input: one sample, named by its key


def reasons(tar: Path) -> list:
    return [(key, r.reason if isinstance(r, BadRecord) else "ok") for _, key, r, _ in read_samples(tar)]


def test_bad_samples_are_each_their_own_bad_record(tmp_path):
    tar = write_tar(tmp_path / "x.tar", [
        ("0.json", b'{"text": "fine"}'),
        ("1.jpg", b"no json"),
        ("2.json", b'{"text": '),
        ("3.json", b'{"images": ["0.jpg"], "text": "x"}'), ("3.1.jpg", b"not the one named"),
        ("4.json", b'["an", "array"]'),
        ("5.json", b'{"text": "once"}'), ("5.json", b'{"text": "twice"}'),
        ("6.json", b'{"text": "fine"}'),
        ("0.jpg", b"the first key again, after others"),
        ("7.json", b'{"text": "fine"}'),
        ("8.json", b'{"images": ["0.jpg"], "text": "x"}'), ("8.0.jpg", b"named"), ("8.1.jpg", b"not named")])
    assert reasons(tar) == [("0", "ok"), ("1", "missing_json"), ("2", "invalid_json"), ("3", "missing_member"),
                            ("4", "wrong_type"), ("5", "duplicate_member"), ("6", "ok"), ("0", "duplicate_key"),
                            ("7", "ok"), ("8", "unused_member")]
    [invalid] = [(r, text) for _, key, r, text in read_samples(tar) if key == "2"]
    assert invalid[1] == b'{"text": '  # the json as it is, for the quarantine
    assert "'0.jpg'" in [r for _, k, r, _ in read_samples(tar) if k == "3"][0].detail


def test_a_member_over_the_limit_is_skipped_without_being_held(tmp_path, monkeypatch):
    import tracemalloc

    big = os.urandom(1024) * (24 * 1024)  # 24 MiB
    tar = write_tar(tmp_path / "x.tar", [("0.json", b'{"text": "a"}'), ("0.mp4", big),
                                         ("1.json", b'{"text": "b"}'), ("1.mp4", b"small")])
    del big
    monkeypatch.setattr(webdataset, "MAX_MEMBER_BYTES", 2**20)
    tracemalloc.start()
    try:
        samples = list(read_samples(tar))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 4 * 2**20, peak  # read through in blocks, never held
    bad = samples[0][2]
    assert isinstance(bad, BadRecord) and bad.reason == "media_too_large" and "0.mp4" in bad.detail
    assert samples[1][2] == {"text": "b", "videos": [b"small"]}


def good_tar(tmp_path, n: int = 4, name: str = "x.tar") -> Path:
    return write_tar(tmp_path / name, [m for k in range(n) for m in
                                       [(f"{k}.json", json.dumps({"text": f"sample {k}"}).encode()),
                                        (f"{k}.png", bytes(3000))]])


def test_a_tar_cut_mid_member_keeps_the_samples_before_it(tmp_path):
    data = good_tar(tmp_path).read_bytes()
    cut = tmp_path / "cut.tar"
    for at, lost in ((data.index(b"sample 2") + 4000, "2"), (len(data) - 6000, "3")):
        cut.write_bytes(data[:at])
        got = reasons(cut)
        assert got[-1] == (lost, "truncated_tar") and all(r == "ok" for _, r in got[:-1]), got
        assert len(got) == int(lost) + 1


def test_a_tar_cut_between_members_or_damaged_inside_is_named(tmp_path):
    data = good_tar(tmp_path).read_bytes()
    boundary = tmp_path / "boundary.tar"  # cut at a 512-byte block between members: no end-of-archive blocks
    boundary.write_bytes(data[:data.index(b"2.json") ])  # the header of 2.json is the first block lost
    assert reasons(boundary) == [("0", "ok"), ("1", "truncated_tar")]
    header = data.index(b"1.png")  # the header block of member 1.png, overwritten
    damaged = tmp_path / "damaged.tar"
    damaged.write_bytes(data[:header] + b"\x7f" * 512 + data[header + 512:])
    got = reasons(damaged)
    assert ("1", "truncated_tar") in got and got[0] == ("0", "ok") and got[-1] == ("3", "ok"), got


def test_a_file_that_is_not_a_tar_is_one_error_for_the_input(tmp_path):
    for name, data in (("text.tar", b"hello, not a tar\n" * 100), ("empty.tar", b""),
                       ("zip.tar.gz", gzip.compress(b"not a tar either" * 100))):
        path = tmp_path / name
        path.write_bytes(data)
        with pytest.raises(ConfigError, match=rf"input {path} is not a (readable )?tar .*set format= to what"):
            list(read_samples(path))
    assert list(read_samples(write_tar(tmp_path / "none.tar", []))) == []  # an empty tar: whole, no samples


# ---------------------------------------------------------------- builds: the same rows as JSONL + files

QWEN3VL = {"family": "qwen3vl", "processor": str(SAMPLE / "processors" / "qwen3vl"), "modalities": ["image", "video"]}
SHARDS = 3


def build_of(inputs: list[str], out: Path, pipeline: Path | None = None, **settings) -> Path:
    from packer.build import build
    from packer.config import resolve

    settings = {"media_root": str(SAMPLE), "max_bad_fraction": 1.0, **settings}
    build(resolve(pipeline, input=inputs, output=str(out), **settings), progress=False)
    return out


def packed(out: Path) -> dict:
    """The packed rows, every span's ``ref`` aside (a path in one build, a blob's name in the other)."""
    table = pa.concat_tables([pa.ipc.open_stream(pa.memory_map(str(p))).read_all()
                              for p in sorted((out / "packed").glob("*.arrow"))])
    rows = table.select(["input_ids", "labels", "cu_seqlens", "segment_ids", "media"]).to_pylist()
    for row in rows:
        for span in row["media"]:
            span.pop("ref")
    return {"rows": rows}


def as_jsonl_and_tars(tmp_path: Path, records: list[dict]) -> tuple[list[str], list[str]]:
    """``records`` cut into SHARDS JSONL files and SHARDS tars of the same records (keys with dots in folders, half
    the top-level media filled by extension): the inputs of both builds."""
    for s in range(SHARDS):
        part = records[s::SHARDS]
        (tmp_path / f"j-{s:03d}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in part))
        write_tar(tmp_path / f"x-{s:03d}.tar", [m for k, r in enumerate(part)
                                                for m in as_sample(f"v1.0/s{s}/{k:05d}", r, by_extension=k % 2 == 0)])
    return [str(tmp_path / f"j-{{000..{SHARDS - 1:03d}}}.jsonl")], [str(tmp_path / f"x-{{000..{SHARDS - 1:03d}}}.tar")]


def quarantined(out: Path) -> list[dict]:
    path = out / "quarantine.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def test_images_and_videos_pack_as_their_jsonl_records_do(tmp_path):
    llava = sample_records("llava.jsonl", whole)
    records = llava[:24] + [r for r in llava[24:] if isinstance(r.get("image"), list)] + sample_records("video.jsonl", whole)
    assert any(isinstance(r.get("image"), list) for r in records) and len(records) > 20
    jsonl, tars = as_jsonl_and_tars(tmp_path, records)
    a = build_of(jsonl, tmp_path / "from-jsonl", **QWEN3VL)
    b = build_of(tars, tmp_path / "from-tars", **QWEN3VL)
    assert quarantined(a) == [] and quarantined(b) == []
    assert packed(b) == packed(a)
    spans = [s for row in packed(b)["rows"] for s in row["media"]]
    assert {s["kind"] for s in spans} == {"image", "video"}


def test_audio_packs_as_its_jsonl_records_do(tmp_path):
    records = sample_records("chat.jsonl", lambda r: whole(r) and "audio" in json.dumps(r))[:8]
    records += sample_records("llava.jsonl", whole)[:4]
    jsonl, tars = as_jsonl_and_tars(tmp_path, records)
    pipeline = ROOT / "pipelines" / "qwen25omni.toml"
    a = build_of(jsonl, tmp_path / "from-jsonl", pipeline)
    b = build_of(tars, tmp_path / "from-tars", pipeline)
    assert quarantined(a) == [] and quarantined(b) == []
    assert packed(b) == packed(a)
    assert {s["kind"] for row in packed(b)["rows"] for s in row["media"]} == {"image", "audio"}


def test_bad_samples_are_quarantined_by_tar_and_key_and_the_build_goes_on(tmp_path):
    png = (SAMPLE / "images" / "small_224.png").read_bytes()
    question = {"conversations": [{"from": "human", "value": "<image>\nWhat is it?"}, {"from": "gpt", "value": "Shapes."}]}
    data = write_tar(tmp_path / "x.tar", [
        ("k/0.json", json.dumps({"id": "first", **question}).encode()), ("k/0.png", png),
        ("k/1.json", json.dumps(question).encode()), ("k/1.png", png),  # no id: the tar and key name it
        ("k/1a.json", json.dumps({"text": "long " * 3000}).encode()),  # dropped: over max_length
        ("k/2.png", png),
        ("k/3.json", b"{not json"),
        ("k/4.json", json.dumps({**question, "image": "1.png"}).encode()), ("k/4.png", png),
        ("k/5.json", json.dumps(question).encode()), ("k/5.png", png)]).read_bytes()
    tar = tmp_path / "x.tar"
    tar.write_bytes(data[: data.index(png, data.index(b"k/5.png")) + 100])  # cut inside k/5.png
    out = build_of([str(tar)], tmp_path / "out", max_length=2048, oversize="drop", **QWEN3VL)
    entries = {q["member"]: q for q in quarantined(out)}
    assert {k: q["reason"] for k, q in entries.items()} == {"k/2": "missing_json", "k/3": "invalid_json",
                                                            "k/4": "missing_member", "k/5": "truncated_tar"}
    assert all(q["where"] == "member" and q["file"] == str(tar) for q in entries.values())
    assert entries["k/3"]["raw"] == "{not json" and entries["k/3"]["line"] == 4  # the sample's number in the tar
    ids = [s for row in packed(out)["rows"] for s in row["segment_ids"]]
    assert sorted(ids) == sorted(["first", f"{tar} member k/1"])
    [dropped] = [json.loads(line) for line in (out / "dropped.jsonl").read_text().splitlines()]
    assert dropped["id"] == f"{tar} member k/1a" and dropped["line"] == 2
    accounting = json.loads((out / "manifest.json").read_text())["accounting"]
    assert (accounting["records_read"], accounting["quarantined"], accounting["dropped"]) == (7, 4, 1)


def test_a_file_that_is_not_a_tar_stops_the_build_naming_it(tmp_path):
    from click.testing import CliRunner

    from packer.cli import main

    bad = tmp_path / "bad.tar"
    bad.write_bytes(b"plain text, named .tar\n" * 50)
    args = ["build", "-i", str(bad), "-o", str(tmp_path / "out"), "--tokenizer", str(SAMPLE / "tokenizer")]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 2 and f"input {bad} is not a tar" in result.output and "format=" in result.output


# ---------------------------------------------------------------- brace patterns, remote tars, workers


def manifest_files(out: Path) -> dict:
    """sha256 of every file a build wrote, the manifest's timestamps and run details aside."""
    files = {str(p.relative_to(out)): hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(out.rglob("*"))
             if p.is_file() and p.name not in ("manifest.json", "report.html", "report.json") and "journal" not in p.parts
             and not p.name.endswith(".lock")}
    return files


def test_one_task_per_shard_and_the_same_bytes_for_one_or_two_workers(tmp_path):
    records = sample_records("llava.jsonl", whole)[:18]
    _, tars = as_jsonl_and_tars(tmp_path, records)
    one = build_of(tars, tmp_path / "one", workers=1, **QWEN3VL)
    two = build_of(tars, tmp_path / "two", workers=2, **QWEN3VL)
    assert sorted(p.name for p in (one / "samples").glob("part-*.arrow")) == [f"part-{k:05d}.arrow" for k in range(SHARDS)]
    assert manifest_files(one) == manifest_files(two)
    assert json.loads((one / "manifest.json").read_text())["files"] == json.loads((two / "manifest.json").read_text())["files"]


def test_brace_patterns_over_s3_read_the_same_tars(tmp_path):
    import s3fs
    from s3_server import S3Server

    records = sample_records("llava.jsonl", whole)[:9]
    _, tars = as_jsonl_and_tars(tmp_path, records)
    local = build_of(tars, tmp_path / "local", **QWEN3VL)
    saved = dict(os.environ)
    try:
        with S3Server() as server:
            os.environ.update(server.env)
            s3fs.S3FileSystem.clear_instance_cache()
            fs = server.filesystem()
            fs.mkdir("shards")
            for s in range(SHARDS):
                fs.pipe(f"shards/v1/x-{s:03d}.tar", (tmp_path / f"x-{s:03d}.tar").read_bytes())
            remote = build_of([f"s3://shards/v1/x-{{000..{SHARDS - 1:03d}}}.tar"], tmp_path / "remote", **QWEN3VL)
    finally:
        os.environ.clear()
        os.environ.update(saved)
        s3fs.S3FileSystem.clear_instance_cache()
    assert packed(remote) == packed(local)
    inputs = json.loads((remote / "manifest.json").read_text())["inputs"]
    assert inputs == [f"s3://shards/v1/x-{s:03d}.tar" for s in range(SHARDS)]
