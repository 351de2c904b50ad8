"""`packer repack`: a new plan from an existing build's samples, nothing re-encoded."""

from __future__ import annotations

import json

import pyarrow as pa
import pytest
from click.testing import CliRunner

from packer.build import repack
from packer.cli import main
from packer.errors import ConfigError


def rows(out, manifest):
    tables = [pa.ipc.open_stream(pa.memory_map(str(out / e["file"]))).read_all() for e in manifest["files"]["packed"]]
    return [r for t in tables for r in t.to_pylist()]


def test_repack_to_a_longer_context_keeps_every_sample(sample_build, tmp_path, monkeypatch):
    src, m = sample_build
    # Make a re-encode impossible: repack must not need the tokenizer or the media.
    for where in ("packer.encode.tokenizer.load_tokenizer", "packer.encode.tokenizer.open_tokenizer",
                  "packer.encode.encoder.open_tokenizer"):
        monkeypatch.setattr(where, lambda *a, **k: pytest.fail("repack loaded a tokenizer"))
    m2 = repack(src, output=str(tmp_path / "r8k"), max_length=8192, progress=False).to_dict()
    out = tmp_path / "r8k"
    assert m2["config"]["max_length"] == 8192 and m2["repacked_from"]["path"] == str(src)
    assert m2["tokenizer"] == m["tokenizer"] and m2["files"]["samples"] == m["files"]["samples"]
    for e in m2["files"]["samples"]:
        assert (out / e["file"]).read_bytes() == (src / e["file"]).read_bytes()
    assert m2["accounting"]["records_read"] == m["accounting"]["records_read"]
    assert m2["accounting"]["quarantined_by_reason"] == m["accounting"]["quarantined_by_reason"]
    # The document truncated at 4096 is whole at 8192.
    assert m["stats"]["truncated_samples"] == 1 and m2["stats"]["truncated_samples"] == 0
    assert m2["stats"]["tokens"] == m["stats"]["tokens"] + m["stats"]["truncated_tokens"]
    assert m2["stats"]["rows"] < m["stats"]["rows"]
    keys = sorted(k for r in rows(out, m2) for k in r["segment_ids"])
    assert keys == sorted(k for r in rows(src, m) for k in r["segment_ids"])


def test_repack_split_names_pieces_and_masks_their_first_label(sample_build, tmp_path):
    src, _ = sample_build
    m = repack(src, output=str(tmp_path / "s"), max_length=1024, oversize="split", progress=False).to_dict()
    assert m["stats"]["split_samples"] > 0 and m["stats"]["split_lost_media"] > 0
    # only a sample whose trainable text all lies in pieces after an image they lack is dropped
    assert set(m["accounting"]["dropped_by_reason"]) <= {"split_lost_media"}
    pieces = {}
    for r in rows(tmp_path / "s", m):
        for k, key in enumerate(r["segment_ids"]):
            assert r["labels"][r["cu_seqlens"][k]] == -100
            base, _, at = key.partition("@")
            pieces.setdefault(base, []).append(int(at or 0))
    cut = {k: v for k, v in pieces.items() if len(v) > 1 or v[0] > 0}  # pieces left out are not visible
    assert 1 <= len(cut) <= m["stats"]["split_samples"]
    assert sum(len(v) for v in cut.values()) <= m["stats"]["split_pieces"]


def test_repack_refuses_what_needs_reencoding_and_damaged_sources(sample_build, tmp_path):
    src, m = sample_build
    with pytest.raises(ConfigError, match="repack cannot change tokenizer"):
        repack(src, output=str(tmp_path / "x"), tokenizer="other")
    with pytest.raises(ConfigError, match="-o must differ from the source"):
        repack(src, output=str(src))
    with pytest.raises(ConfigError, match="needs an output folder"):
        repack(src)
    broken = tmp_path / "broken"
    repack(src, output=str(broken), progress=False)
    shard = broken / m["files"]["samples"][0]["file"]
    data = bytearray(shard.read_bytes())
    shard.unlink()  # a hard link: write a new file, do not damage the source
    data[-10] ^= 0xFF
    shard.write_bytes(bytes(data))
    with pytest.raises(ConfigError, match="does not match its manifest"):
        repack(broken, output=str(tmp_path / "y"))


def test_repack_cli(sample_build, tmp_path):
    src, _ = sample_build
    r = CliRunner().invoke(main, ["repack", str(src), "-o", str(tmp_path / "c"), "--max-length", "2048",
                                  "--algorithm", "ffd", "--seed", "3"])
    assert r.exit_code == 0, r.output
    assert "of 2,048 tokens per row" in r.output
    config = json.loads((tmp_path / "c" / "manifest.json").read_text())["config"]
    assert config["algorithm"] == "ffd" and config["seed"] == 3 and config["max_length"] == 2048


def test_a_repack_run_again_on_its_finished_output_says_it_reused_that_build(sample_build, tmp_path, capsys):
    """The same repack twice: the second reuses the finished output's shards and says so (it was not interrupted);
    a run stopped before its manifest is the interrupted one."""
    src, _ = sample_build
    out = tmp_path / "again"
    repack(src, output=str(out), max_length=2048, progress=True)
    capsys.readouterr()
    repack(src, output=str(out), max_length=2048, progress=True)
    err = capsys.readouterr().err
    assert "1 of 1 shards reused from the finished build already in the output (same inputs and settings)" in err
    assert "interrupted" not in err
    (out / "manifest.json").unlink()  # as if the run stopped before its last step
    repack(src, output=str(out), max_length=2048, progress=True)
    assert "1 of 1 shards reused from the interrupted run" in capsys.readouterr().err
