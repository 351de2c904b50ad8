"""End to end: build sample_data, then read the output without packer's help."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from conftest import ROOT, SAMPLE, TOKENIZER
from packer.build import build
from packer.config import BuildConfig, resolve
from packer.errors import BuildFailedError, ConfigError, StrictModeError

COLUMNS = ["input_ids", "labels", "cu_seqlens", "segment_ids", "segment_source", "segment_line", "segment_start",
           "segment_modality", "segment_parent", "segment_group", "segment_role", "segment_weight", "media", "n_tokens",
           "segment_trained", "n_trained"]
IGNORE = -100


def packed_tables(out: Path, manifest: dict) -> list[pa.Table]:
    tables = []
    for entry in manifest["files"]["packed"]:
        with pa.OSFile(str(out / entry["file"]), "rb") as f:
            tables.append(pa.ipc.open_stream(f).read_all())
    return tables


def source_records() -> dict[str, dict]:
    records = {}
    for name in ("llava.jsonl", "chat.jsonl", "docs.jsonl"):
        for line in (SAMPLE / name).read_text().splitlines():
            try:
                obj = json.loads(line)
            except json.JSONDecodeError:
                continue
            if isinstance(obj, dict) and "id" in obj:
                records[str(obj["id"])] = obj
    return records


def test_layout_and_schema(sample_build):
    out, manifest = sample_build
    for name in ("manifest.json", "quarantine.jsonl", "plan.arrow", "samples", "packed"):
        assert (out / name).exists(), name
    assert not list(out.rglob("*.tmp-*"))
    for t in packed_tables(out, manifest):
        assert t.column_names == COLUMNS
        assert t.schema.metadata[b"packer.schema_version"] == b"5"
        assert t.schema.field("segment_modality").type == pa.list_(pa.dictionary(pa.int32(), pa.string()))
    assert manifest["schema_version"] == 5 and manifest["status"] == "complete"
    assert manifest["tokenizer"]["vocab_size"] > 1000 and len(manifest["tokenizer"]["sha256"]) == 64


def test_readable_with_hf_datasets(sample_build):
    import datasets

    out, manifest = sample_build
    files = [str(out / e["file"]) for e in manifest["files"]["packed"]]
    ds = datasets.Dataset.from_file(files[0])
    assert ds.column_names == COLUMNS
    dd = datasets.load_dataset("arrow", data_files={"train": files}, cache_dir=str(out.parent / "hf-cache"))
    assert dd["train"].num_rows == manifest["stats"]["rows"]
    row = ds[0]
    assert row["cu_seqlens"][-1] == row["n_tokens"] == len(row["input_ids"])


def test_row_invariants(sample_build, tok):
    from packer.media.policies import parse_policy
    from packer.media.probe import probe_audio, probe_image

    out, manifest = sample_build
    cap = manifest["config"]["max_length"]
    image_policy = parse_policy(manifest["config"]["image_tokens"], "image")
    audio_policy = parse_policy(manifest["config"]["audio_tokens"], "audio")
    placeholder = set(manifest["tokenizer"]["placeholders"].values())
    for row in (r for t in packed_tables(out, manifest) for r in t.to_pylist()):
        cu, ids, labels = row["cu_seqlens"], np.array(row["input_ids"]), np.array(row["labels"])
        assert cu[0] == 0 and np.all(np.diff(cu) > 0) and cu[-1] == row["n_tokens"] == len(ids) == len(labels)
        assert row["n_tokens"] <= cap
        assert len(cu) - 1 == len(row["segment_ids"]) == len(row["segment_modality"])
        assert np.all(labels[cu[:-1]] == IGNORE), "a segment's first token is a target"
        trained = labels != IGNORE
        assert np.array_equal(labels[trained], ids[trained])
        covered = np.zeros(len(ids), dtype=bool)
        for m in row["media"]:
            a, b = cu[m["segment"]], cu[m["segment"] + 1]
            assert a <= m["start"] and m["start"] + m["length"] <= b, "media span leaves its segment"
            span = ids[m["start"] : m["start"] + m["length"]]
            assert np.all(span == manifest["tokenizer"]["placeholders"]["<" + m["kind"] + ">"])
            covered[m["start"] : m["start"] + m["length"]] = True
            if m["kind"] == "image":
                info = probe_image(str(SAMPLE / m["ref"]))
                expected = image_policy.count(info.height, info.width)
            else:
                info = probe_audio(str(SAMPLE / m["ref"]))
                expected = audio_policy.count(info.frames, info.sample_rate)
            assert (m["length"], tuple(m["llm_grid"])) == (expected.length, expected.grid)
        assert np.array_equal(covered, np.isin(ids, list(placeholder))), "placeholder ids outside media spans"
        for k, modality in enumerate(row["segment_modality"]):
            kinds = {m["kind"] for m in row["media"] if m["segment"] == k}
            assert modality == ("+".join(x for x in ("image", "audio") if x in kinds) or "text")


def test_segments_decode_to_their_source(sample_build, tok):
    out, manifest = sample_build
    records = source_records()
    roles = {"human": "user", "gpt": "assistant", "system": "system"}
    seen = 0
    for row in (r for t in packed_tables(out, manifest) for r in t.to_pylist()):
        cu = row["cu_seqlens"]
        ids = list(row["input_ids"])
        for m in sorted(row["media"], key=lambda m: -m["start"]):  # each span back to its one tag
            del ids[m["start"] + 1 : m["start"] + m["length"]]
        shrink = [sum(m["length"] - 1 for m in row["media"] if m["start"] < c) for c in cu]
        for k, key in enumerate(row["segment_ids"]):
            text = tok.decode(ids[cu[k] - shrink[k] : cu[k + 1] - shrink[k + 1]])
            rec = records[key]
            if "text" in rec:
                expected = rec["text"] + tok.eos_token
            else:
                if "conversations" in rec:
                    msgs = [{"role": roles[t["from"]], "content": t["value"]} for t in rec["conversations"]]
                else:
                    msgs = [{"role": m["role"], "content": m["content"] if isinstance(m["content"], str) else "".join(
                        p["text"] if p.get("type", "text" if "text" in p else "") == "text" else
                        ("<audio>" if "audio" in p else "<image>") for p in m["content"])} for m in rec["messages"]]
                expected = tok.apply_chat_template(msgs, tokenize=False)
            if cu[k + 1] - cu[k] == manifest["config"]["max_length"]:  # the truncated document
                assert expected.startswith(text)
            else:
                assert text == expected, key
            seen += 1
    assert seen == manifest["accounting"]["samples_packed"]


def test_every_sample_packed_exactly_once(sample_build):
    out, manifest = sample_build
    keys = [k for t in packed_tables(out, manifest) for ks in t.column("segment_ids").to_pylist() for k in ks]
    sample_keys = []
    for e in manifest["files"]["samples"]:
        with pa.OSFile(str(out / e["file"]), "rb") as f:
            sample_keys += pa.ipc.open_stream(f).read_all().column("key").to_pylist()
    assert sorted(keys) == sorted(sample_keys)
    assert len(keys) == len(set(keys)) == manifest["accounting"]["samples_packed"]


def test_accounting_and_quarantine(sample_build):
    out, manifest = sample_build
    acc = manifest["accounting"]
    assert acc["records_read"] == acc["samples_packed"] + acc["quarantined"] + acc["dropped"]
    for name, f in acc["by_file"].items():
        assert f["records"] == f["packed"] + f["quarantined"] + f["dropped"], name
        lines = [l for l in (ROOT / name).read_text().splitlines() if l.strip()]
        assert f["records"] == len(lines)
    entries = [json.loads(l) for l in (out / "quarantine.jsonl").read_text().splitlines()]
    assert len(entries) == acc["quarantined"] == sum(acc["quarantined_by_reason"].values())
    assert {e["reason"] for e in entries} == set(acc["quarantined_by_reason"]) >= {
        "malformed_json", "missing_image", "image_count_mismatch", "unknown_role", "empty_conversation",
        "no_trainable_tokens", "wrong_type", "not_an_object"}
    for e in entries:
        assert set(e) == {"file", "line", "id", "reason", "detail", "raw"}
        assert (ROOT / e["file"]).read_text().splitlines()[e["line"] - 1] == e["raw"]
    assert acc["blank_lines"] == 1


def test_truncation_is_counted(sample_build):
    _, manifest = sample_build
    stats = manifest["stats"]
    assert stats["truncated_samples"] == 1 and stats["truncated_tokens"] > 0
    assert stats["rows"] >= stats["lower_bound"] == -(-stats["tokens"] // stats["max_length"])
    assert stats["fill"] == pytest.approx(stats["tokens"] / (stats["rows"] * stats["max_length"]))


def small_config(tmp_path, records_file, **kw) -> BuildConfig:
    kw.setdefault("max_bad_fraction", 1.0)  # these builds are about what becomes of bad or long records
    return BuildConfig(input=(str(records_file),), output=str(tmp_path / "out"), tokenizer=TOKENIZER, **kw)


def test_oversize_drop_and_truncated_to_nothing(tmp_path, write_jsonl):
    long_doc = {"id": "long", "text": "word " * 300}
    long_prompt = {"id": "prompt", "messages": [{"role": "user", "content": "why " * 300}, {"role": "assistant", "content": "ok"}]}
    f = write_jsonl("in.jsonl", [long_doc, long_prompt, {"id": "short", "text": "A short one."}])
    m = build(small_config(tmp_path, f, max_length=64, oversize="drop"), progress=False).to_dict()
    assert m["accounting"]["dropped_by_reason"] == {"oversize": 2} and m["accounting"]["samples_packed"] == 1
    m = build(small_config(tmp_path, f, max_length=64, oversize="truncate", overwrite=True), progress=False).to_dict()
    assert m["accounting"]["dropped_by_reason"] == {"nothing_trainable": 1}
    assert m["stats"]["truncated_samples"] == 1 and m["accounting"]["samples_packed"] == 2
    assert m["accounting"]["by_file"][str(f)] == {"records": 3, "packed": 2, "quarantined": 0, "dropped": 1, "skipped": 0, "repeated": 0}


def test_strict_stops_at_the_first_bad_record(tmp_path):
    config = resolve(ROOT / "pipelines" / "sample.toml", output=str(tmp_path / "o"), strict=True,
                     input=(str(SAMPLE / "llava.jsonl"),))
    with pytest.raises(StrictModeError, match=r"llava\.jsonl:98: missing_image: image file 'images/does_not_exist.png'"):
        build(config, progress=False)
    assert not (tmp_path / "o" / "manifest.json").exists()


@pytest.mark.slow
def test_same_bytes_for_any_worker_count_and_chunking_is_data_defined(tmp_path):
    def run(workers):
        out = tmp_path / f"w{workers}"
        c = resolve(ROOT / "pipelines" / "sample.toml", output=str(out), workers=workers, chunk_records=10, shard_rows=2)
        return out, build(c, progress=False).to_dict()

    (a, ma), (b, mb) = run(1), run(3)  # 3: stage 1 in this process and two workers, stage 3 in three workers
    assert len(ma["files"]["packed"]) > 1 and len(ma["files"]["samples"]) > 3
    assert {k: v for k, v in ma.items() if k not in ("created_at", "execution")} == \
        {k: v for k, v in mb.items() if k not in ("created_at", "execution")}
    for kind in ("samples", "packed"):
        assert ma["files"][kind] == mb["files"][kind]
        for e in ma["files"][kind]:
            assert (a / e["file"]).read_bytes() == (b / e["file"]).read_bytes()
    assert (a / "quarantine.jsonl").read_bytes() == (b / "quarantine.jsonl").read_bytes()
    assert ma["accounting"] == mb["accounting"] and ma["stats"] == mb["stats"]


def test_out_tokenizer_is_the_same_bytes_with_and_without_hf_hub_offline(tmp_path, write_jsonl, monkeypatch):
    """HF_HUB_OFFLINE=1 makes transformers load with local_files_only=True and keep that in the tokenizer's init
    kwargs: OUT/tokenizer (and the manifest's hashes of it) must not depend on how the tokenizer was loaded."""
    import huggingface_hub.constants

    f = write_jsonl("in.jsonl", [{"text": "hello world"}] * 3)

    def run(name: str, offline: bool):
        monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", offline)
        out = tmp_path / name
        return out, build(resolve(None, input=[str(f)], output=str(out), tokenizer=str(TOKENIZER), workers=1),
                          progress=False).to_dict()

    (a, ma), (b, mb) = run("online", False), run("offline", True)
    assert ma["files"]["tokenizer"] == mb["files"]["tokenizer"]
    for entry in ma["files"]["tokenizer"]:
        assert (a / entry["file"]).read_bytes() == (b / entry["file"]).read_bytes(), entry["file"]
    assert "local_files_only" not in json.loads((b / "tokenizer" / "tokenizer_config.json").read_text())


def test_refuses_a_folder_it_does_not_own(tmp_path, write_jsonl):
    f = write_jsonl("in.jsonl", [{"text": "hello world"}])
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "thesis.tex").write_text("precious")
    with pytest.raises(ConfigError, match="holds no packer build"):
        build(small_config(tmp_path, f), progress=False)
    assert (tmp_path / "out" / "thesis.tex").exists()


def test_rebuild_with_other_settings_needs_overwrite(tmp_path, write_jsonl):
    f = write_jsonl("in.jsonl", [{"text": "hello world"}] * 3)
    build(small_config(tmp_path, f, chunk_records=1), progress=False)
    assert len(list((tmp_path / "out" / "samples").iterdir())) == 3
    with pytest.raises(ConfigError, match=r"holds a build of other inputs or settings \(changed: config.chunk_records\); pass --overwrite"):
        build(small_config(tmp_path, f), progress=False)
    build(small_config(tmp_path, f, overwrite=True), progress=False)
    assert len(list((tmp_path / "out" / "samples").iterdir())) == 1


def test_all_bad_input_fails_and_says_so(tmp_path, write_jsonl):
    f = write_jsonl("in.jsonl", ["not json", '{"text": 1}'])
    with pytest.raises(BuildFailedError, match="the build packed nothing: 2 records read, 2 quarantined"):
        build(small_config(tmp_path, f), progress=False)
    m = json.loads((tmp_path / "out" / "manifest.json").read_text())
    assert m["status"] == "failed" and m["files"]["packed"] == [] and m["accounting"]["quarantined"] == 2


def test_row_constraints_end_to_end(tmp_path, monkeypatch):
    monkeypatch.chdir(ROOT)
    config = resolve(ROOT / "pipelines" / "sample.toml", output=str(tmp_path / "c"), max_images=2, max_segments=6,
                     group_by="modality", order="longest-first")
    m = build(config, progress=False).to_dict()
    tables = packed_tables(tmp_path / "c", m)
    all_rows = [r for t in tables for r in t.to_pylist()]
    for r in all_rows:
        assert len(r["segment_ids"]) <= 6
        assert sum(1 for x in r["media"] if x["kind"] == "image") <= 2
        assert len(set(r["segment_modality"])) == 1
    assert all_rows[0]["n_tokens"] == max(r["n_tokens"] for r in all_rows)
    assert m["accounting"]["samples_packed"] == 223 and m["config"]["max_images"] == 2


def test_a_build_leaves_the_cyclic_collector_as_it_found_it(tmp_path, write_jsonl):
    """The build freezes its process's objects out of the collector while it runs (stage 1's
    speed) and unfreezes them at the end, so a process that runs many builds collects them."""
    import gc

    f = write_jsonl("in.jsonl", [{"text": "hello world"}] * 3)
    assert gc.get_freeze_count() == 0
    build(small_config(tmp_path, f), progress=False)
    assert gc.get_freeze_count() == 0
