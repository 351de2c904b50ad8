"""Nothing lost, nothing silent: every bad-input kind, fuzzed input, kill -9 and resume,
locks, fingerprints, byte-identical reruns and `packer verify`."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conftest import ROOT, TOKENIZER
from packer.build import build
from packer.config import BuildConfig
from packer.errors import BuildFailedError, ConfigError, PackerError
from packer.stages.state import BuildLock
from packer.verify import verify

FIXTURES = ROOT / "tests" / "fixtures" / "data" / "bad.jsonl"
EXPECTED = {  # record id (or line) -> reason
    "malformed_json": "malformed_json", "invalid_utf8": "invalid_utf8", 7: "not_an_object", "wrong_type": "wrong_type",
    "unknown_role": "unknown_role", "empty_conversation": "empty_conversation",
    "image_count_mismatch": "image_count_mismatch", "missing_image": "missing_image", "corrupt_image": "corrupt_image",
    "truncated_image": "corrupt_image", "missing_audio": "missing_audio", "corrupt_audio": "corrupt_audio",
    "truncated_audio": "corrupt_audio", "media_outside_root": "media_outside_root",
    "no_trainable_tokens": "no_trainable_tokens",
}


def config(tmp_path, name="out", **kw) -> BuildConfig:
    base = {"input": (str(FIXTURES),), "output": str(tmp_path / name), "tokenizer": TOKENIZER, "max_length": 1024,
            "oversize": "drop", "max_bad_fraction": 1.0}  # the fixture holds one bad record of every kind
    return BuildConfig(**{**base, **kw})


def quarantine(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "quarantine.jsonl").read_text().splitlines()]


def test_every_bad_input_kind_is_quarantined_with_its_reason(tmp_path):
    m = build(config(tmp_path), progress=False).to_dict()
    entries = quarantine(tmp_path / "out")
    got = {(e["id"] if e["id"] is not None else e["line"]): e["reason"] for e in entries}
    assert got.pop(5) == "malformed_json" and got.pop(6) == "invalid_utf8"  # ids unreadable: keyed by line
    expected = {k: v for k, v in EXPECTED.items() if k not in ("malformed_json", "invalid_utf8")}
    assert got == expected
    for e in entries:
        assert e["file"] == str(FIXTURES) and e["line"] >= 1 and e["reason"] and e["detail"]
    acc = m["accounting"]
    assert acc["dropped_by_reason"] == {"oversize": 1}  # over capacity under --oversize drop: dropped, not quarantined
    assert acc["samples_packed"] == 3 and acc["blank_lines"] == 2  # BOM, CRLF and blank lines are fine
    assert acc["records_read"] == 3 + len(EXPECTED) + 1 == acc["samples_packed"] + acc["quarantined"] + acc["dropped"]
    assert verify(tmp_path / "out")[0] == []


def test_outside_media_root_can_be_allowed(tmp_path):
    m = build(config(tmp_path, allow_outside_media_root=True), progress=False).to_dict()
    assert "media_outside_root" not in m["accounting"]["quarantined_by_reason"]
    assert m["accounting"]["samples_packed"] == 4


def test_a_huge_line_is_quarantined_without_being_held(tmp_path, write_jsonl):
    f = write_jsonl("in.jsonl", [{"text": "fine"}, {"text": "x" * 5000}, {"text": "also fine"}])
    m = build(config(tmp_path, input=(str(f),), max_line_bytes=1000), progress=False).to_dict()
    (entry,) = quarantine(tmp_path / "out")
    assert entry["reason"] == "line_too_long" and entry["line"] == 2 and "5,013 bytes" in entry["detail"]
    assert m["accounting"]["samples_packed"] == 2


def test_max_bad_fraction_fails_the_build_and_marks_the_manifest(tmp_path):
    with pytest.raises(BuildFailedError, match=r"15 of 19 records \(78.9%\) were quarantined or dropped, over --max-bad-fraction 0.5"):
        build(config(tmp_path, max_bad_fraction=0.5), progress=False)
    manifest = json.loads((tmp_path / "out" / "manifest.json").read_text())
    assert manifest["status"] == "failed" and "78.9%" in manifest["failure"]
    problems, _ = verify(tmp_path / "out")
    assert [str(p) for p in problems] == [f"manifest.json: the build in {tmp_path / 'out'} failed: {manifest['failure']}"]


@pytest.fixture(scope="module")
def encoder_state(tmp_path_factory):
    from packer.encode import EncoderSpec
    from packer.stages import encode

    out = tmp_path_factory.mktemp("fuzz")
    return encode.setup(EncoderSpec.of(tokenizer=TOKENIZER), str(out), False)


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4), max_leaves=12)
shaped = st.fixed_dictionaries({}, optional={
    "id": json_values, "text": json_values | st.text(max_size=40), "image": json_values,
    "messages": st.lists(st.fixed_dictionaries({}, optional={"role": st.sampled_from(["user", "assistant", "system", "x"]) | json_values,
                                                              "content": st.text(max_size=30) | json_values}), max_size=3),
    "conversations": st.lists(st.fixed_dictionaries({}, optional={"from": st.sampled_from(["human", "gpt"]) | json_values,
                                                                   "value": st.text(max_size=30) | json_values}), max_size=3)})
lines = st.lists(st.binary(max_size=60) | shaped.map(lambda o: json.dumps(o).encode()) | json_values.map(lambda o: json.dumps(o).encode()),
                 min_size=1, max_size=25)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(lines)
def test_fuzzed_input_never_crashes_and_every_line_is_accounted_for(encoder_state, tmp_path, data):
    from packer.stages import encode

    path = tmp_path / "fuzz.jsonl"
    path.write_bytes(b"\n".join(d.replace(b"\n", b" ").replace(b"\r", b" ") for d in data) + b"\n")
    counts: dict[str, int] = {}
    results = [encode.encode_task(encoder_state, t) for t in encode.make_tasks([path], 7, counts)]
    records = sum(r.records for r in results)
    samples = sum(r.shard.rows for r in results if r.shard)
    bad = sum(len(r.quarantine) for r in results)
    assert records == samples + bad == len(data) - counts.get("blank_lines", 0)
    for r in results:
        for q in r.quarantine:
            assert q.reason and q.line >= 1
        (encoder_state.out / ".state" / f"encode-{r.index:05d}.json").unlink(missing_ok=True)  # no resume across examples


def generated(tmp_path, n=3000) -> Path:
    path = tmp_path / "docs.jsonl"
    words = "packing rows tokens segments masks positions shards samples media audio image".split()
    with path.open("w") as f:
        for i in range(n):
            f.write(json.dumps({"id": f"d{i}", "text": " ".join(words[(i + k) % len(words)] for k in range(20 + i % 90))}) + "\n")
        f.write("not json\n")
    return path


def run_build(args: list[str]) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "packer", "build", *args], stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, env={**os.environ, "TOKENIZERS_PARALLELISM": "false"})


def same_build(a: Path, b: Path) -> None:
    ma, mb = (json.loads((p / "manifest.json").read_text()) for p in (a, b))
    strip = lambda m: {k: v for k, v in m.items() if k not in ("created_at", "execution")}  # noqa: E731
    assert strip(ma) == strip(mb)
    for entry in [*ma["files"]["samples"], *ma["files"]["packed"], ma["files"]["plan"], ma["files"]["quarantine"]]:
        assert (a / entry["file"]).read_bytes() == (b / entry["file"]).read_bytes(), entry["file"]


@pytest.mark.slow
def test_kill_9_then_rerun_gives_the_same_bytes(tmp_path):
    data = generated(tmp_path)
    args = ["-i", str(data), "--tokenizer", TOKENIZER, "--chunk-records", "100", "--shard-rows", "20", "--workers", "1"]
    reference = run_build([*args, "-o", str(tmp_path / "ref")])
    assert reference.wait(timeout=300) == 0, reference.stderr.read().decode()
    victim = run_build([*args, "-o", str(tmp_path / "killed")])
    state = tmp_path / "killed" / ".state"
    deadline = time.time() + 120
    while len(list(state.glob("encode-*.json"))) < 4 and time.time() < deadline and victim.poll() is None:
        time.sleep(0.02)
    victim.send_signal(signal.SIGKILL)
    victim.wait()
    done_before = len(list(state.glob("encode-*.json")))
    assert 0 < done_before < 31 and not (tmp_path / "killed" / "manifest.json").exists()
    (tmp_path / "killed" / "samples" / "part-00000.arrow.tmp-junk").write_bytes(b"half a shard")
    first = (tmp_path / "killed" / "samples" / "part-00000.arrow").stat().st_mtime_ns
    rerun = run_build([*args, "-o", str(tmp_path / "killed")])
    assert rerun.wait(timeout=300) == 0, rerun.stderr.read().decode()
    assert (tmp_path / "killed" / "samples" / "part-00000.arrow").stat().st_mtime_ns == first  # reused, not redone
    assert not list((tmp_path / "killed").rglob("*.tmp-*"))
    same_build(tmp_path / "ref", tmp_path / "killed")


def test_stage_3_resumes_per_shard(tmp_path):
    data = generated(tmp_path, 800)
    c = config(tmp_path, input=(str(data),), max_length=512, shard_rows=10, oversize="truncate")
    m = build(c, progress=False).to_dict()
    packed = [tmp_path / "out" / e["file"] for e in m["files"]["packed"]]
    times = [p.stat().st_mtime_ns for p in packed]
    packed[2].unlink()
    (tmp_path / "out" / "manifest.json").unlink()
    m2 = build(c, progress=False).to_dict()
    assert m2["files"] == m["files"]
    assert [p.stat().st_mtime_ns for p in packed][:2] == times[:2] and packed[2].exists()


def test_two_builds_cannot_share_a_folder(tmp_path):
    lock = BuildLock(tmp_path / "out")
    try:
        with pytest.raises(PackerError, match=rf"is being built by pid {os.getpid()}"):
            build(config(tmp_path), progress=False)
    finally:
        lock.release()
    build(config(tmp_path), progress=False)  # free again


def test_changed_input_is_refused_without_overwrite(tmp_path, write_jsonl):
    f = write_jsonl("in.jsonl", [{"text": "one"}, {"text": "two"}])
    build(config(tmp_path, input=(str(f),)), progress=False)
    f.write_text(json.dumps({"text": "changed"}) + "\n")
    with pytest.raises(ConfigError, match=r"changed: input files\); pass --overwrite"):
        build(config(tmp_path, input=(str(f),)), progress=False)
    m = build(config(tmp_path, input=(str(f),), overwrite=True), progress=False).to_dict()
    assert m["accounting"]["records_read"] == 1


@pytest.mark.slow
def test_two_runs_and_worker_counts_are_byte_identical(tmp_path):
    data = generated(tmp_path, 600)
    for name, workers in (("a", 1), ("b", 1), ("c", 2)):
        build(config(tmp_path, name, input=(str(data),), chunk_records=50, shard_rows=8, workers=workers, max_length=512,
                     oversize="truncate"), progress=False)
    same_build(tmp_path / "a", tmp_path / "b")
    same_build(tmp_path / "a", tmp_path / "c")


@pytest.fixture
def clean_build(tmp_path):
    data = generated(tmp_path, 300)
    build(config(tmp_path, input=(str(data),), max_length=512, shard_rows=5, oversize="truncate"), progress=False)
    return tmp_path / "out"


def test_verify_passes_a_clean_build_and_names_what_is_broken(clean_build):
    from click.testing import CliRunner

    from packer.cli import main

    r = CliRunner().invoke(main, ["verify", str(clean_build)])
    assert r.exit_code == 0 and "ok (" in r.output
    manifest = json.loads((clean_build / "manifest.json").read_text())
    first, second, third = (clean_build / e["file"] for e in manifest["files"]["packed"][:3])
    data = bytearray(first.read_bytes())
    data[len(data) // 2] ^= 0x01
    first.write_bytes(bytes(data))
    second.unlink()
    # A row with broken cu_seqlens, in a shard whose hash is updated so only the row check can catch it.
    table = pa.ipc.open_stream(pa.memory_map(str(third))).read_all()
    rows = table.to_pylist()
    rows[1]["cu_seqlens"] = [0, 5, 3, rows[1]["n_tokens"]]
    rows[2]["segment_trained"] = [c + 1 for c in rows[2]["segment_trained"]]  # a loss denominator off by one
    from packer.shards.io import write_shard

    entry = write_shard(third, pa.Table.from_pylist(rows, schema=table.schema), clean_build)
    manifest["files"]["packed"][2] = {**manifest["files"]["packed"][2], "sha256": entry.sha256, "bytes": entry.bytes}
    (clean_build / "manifest.json").write_text(json.dumps(manifest))
    problems, _ = verify(clean_build)
    text = "\n".join(map(str, problems))
    assert f"{first.relative_to(clean_build)}: sha256 differs" in text
    assert f"{second.relative_to(clean_build)}: missing" in text
    assert f"{third.relative_to(clean_build)} row 1: cu_seqlens" in text
    assert f"{third.relative_to(clean_build)} row 2: segment_trained" in text
    r = CliRunner().invoke(main, ["verify", str(clean_build)])
    assert r.exit_code == 6 and "problem(s)" in r.output
