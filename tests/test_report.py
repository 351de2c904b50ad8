"""report.json against an independent recomputation from the shards; the HTML page; inspect."""

from __future__ import annotations

import json
import math
import re

import numpy as np
import pyarrow as pa
import pytest
from click.testing import CliRunner

from packer.cli import main
from packer.report.compute import _pad_cost, report

IGNORE = -100


def all_rows(out, manifest):
    return [r for e in manifest["files"]["packed"]
            for r in pa.ipc.open_stream(pa.memory_map(str(out / e["file"]))).read_all().to_pylist()]


def test_report_equals_an_independent_recomputation(sample_build):
    out, manifest = sample_build
    r = json.loads((out / "report.json").read_text())  # written by the build itself
    rows = all_rows(out, manifest)
    cap = manifest["config"]["max_length"]
    tokens = sum(x["n_tokens"] for x in rows)
    assert r["rows"] == len(rows) and r["tokens"] == tokens and r["max_length"] == cap
    assert r["fill"] == pytest.approx(tokens / (len(rows) * cap))
    assert r["lower_bound"] == math.ceil(tokens / cap) and r["gap_to_lower_bound"] == len(rows) - math.ceil(tokens / cap)
    per = {}
    seg_lengths, squares, segs_per_row = [], 0.0, {}
    for x in rows:
        cu = x["cu_seqlens"]
        segs_per_row[str(len(cu) - 1)] = segs_per_row.get(str(len(cu) - 1), 0) + 1
        for k, mod in enumerate(x["segment_modality"]):
            a, b = cu[k], cu[k + 1]
            m = per.setdefault(mod, {"samples": 0, "tokens": 0, "trained_tokens": 0, "media_items": 0, "media_tokens": 0})
            m["samples"] += 1
            m["tokens"] += b - a
            m["trained_tokens"] += sum(1 for v in x["labels"][a:b] if v != IGNORE)
            spans = [s for s in x["media"] if s["segment"] == k]
            m["media_items"] += len(spans)
            m["media_tokens"] += sum(s["length"] for s in spans)
            seg_lengths.append(b - a)
            squares += (b - a) ** 2
    assert r["per_modality"] == per
    assert r["histograms"]["segments_per_row"] == segs_per_row
    assert sum(sum(v) for v in r["histograms"]["sample_lengths"].values()) == len(seg_lengths)
    assert r["attention"]["block_diagonal"] == squares and r["attention"]["dense"] == len(rows) * cap * cap
    b = r["batching"]
    assert b["real_tokens"] == tokens and b["packed"]["computed"] == len(rows) * cap
    assert b["padded_random"]["computed"] >= b["length_grouped"]["computed"] >= tokens
    assert b["speedup_vs_padded_random"] == pytest.approx(b["padded_random"]["computed"] / (len(rows) * cap))
    acc = manifest["accounting"]
    assert r["accounting"]["records_read"] == acc["records_read"] and r["accounting"]["quarantined_by_reason"] == acc["quarantined_by_reason"]
    assert [q["reason"] for q in r["quarantine_top"]] and all(re.fullmatch(r".+:\d+", e) for q in r["quarantine_top"] for e in q["examples"])
    assert r["rank_imbalance"] == {"8": None, "64": None}  # 26 rows: fewer than one step of 8 ranks x 4 rows


def test_rank_imbalance_is_reported_when_there_are_enough_rows(sample_build, tmp_path):
    from packer.build import repack

    src, _ = sample_build
    repack(src, output=str(tmp_path / "short"), max_length=512, oversize="split", progress=False)
    r = report(tmp_path / "short")
    eight = r["rank_imbalance"]["8"]
    assert r["rows"] >= 32 and eight["steps"] == r["rows"] // 32 and r["rank_imbalance"]["64"] is None
    assert 1.0 <= eight["balanced"] < eight["round_robin"]


def test_pad_cost():
    assert _pad_cost(np.array([5, 1, 3, 3, 2]), 2) == 2 * 5 + 2 * 3 + 1 * 2


def test_report_is_mergeable_across_shards(sample_build, tmp_path):
    from packer.build import repack

    src, _ = sample_build
    m = repack(src, output=str(tmp_path / "many"), shard_rows=3, progress=False).to_dict()
    one, many = report(src), report(tmp_path / "many")
    assert len(m["files"]["packed"]) > 3
    for key in ("rows", "tokens", "fill", "per_modality", "histograms", "attention", "batching", "rank_imbalance"):
        assert one[key] == many[key], key


def test_html_has_every_section_embeds_its_plots_and_no_url(sample_build):
    out, _ = sample_build
    page = (out / "report.html").read_text()
    for section in ("Accounting", "Modalities", "Sample length distribution", "Fill per row", "Segments per row", "imbalance",
                    "Tokens computed for the same samples", "Top quarantine reasons",
                    "Resolved config", "speed-up vs padding", "lower bound"):
        assert section in page, section
    assert page.count("<svg") >= 4  # the imbalance panel says "too few rows" on a 26-row build
    assert not re.search(r"(https?:)?//[a-z0-9.-]+\.[a-z]{2,}/", page.replace('xmlns="http://www.w3.org/2000/svg"', ""))
    assert "<script" not in page and "src=" not in page and "<link" not in page


def test_report_command_and_inspect(sample_build, tmp_path, monkeypatch):
    out, manifest = sample_build
    monkeypatch.chdir(out.parents[1] if False else __import__("conftest").ROOT)
    r = CliRunner().invoke(main, ["report", str(out), "--html", str(tmp_path / "r.html")])
    assert r.exit_code == 0 and "fewer tokens computed than padding" in r.output and (tmp_path / "r.html").exists()
    r = CliRunner().invoke(main, ["inspect", str(out)])
    assert "fill" in r.output and "lower bound" in r.output and "quarantined" in r.output
    rows = all_rows(out, manifest)
    k = next(i for i, x in enumerate(rows) if x["media"])
    r = CliRunner().invoke(main, ["inspect", str(out), "--row", str(k)])
    assert r.exit_code == 0, r.output
    for key in rows[k]["segment_ids"]:
        assert key in r.output
    assert "<image x576>" in r.output and "trained" in r.output
    d = json.loads(CliRunner().invoke(main, ["inspect", str(out), "--row", str(k), "--json"]).output)
    assert [s["id"] for s in d["segments"]] == rows[k]["segment_ids"]
    assert [s["tokens"] for s in d["segments"]] == np.diff(rows[k]["cu_seqlens"]).tolist()
    assert all("preview" in s for s in d["segments"])
    r = CliRunner().invoke(main, ["inspect", str(out), "--row", "9999"])
    assert r.exit_code == 1 and "out of range" in r.output
