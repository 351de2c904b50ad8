"""report.json against an independent recomputation from the shards; the HTML page; inspect."""

from __future__ import annotations

import contextlib
import io
import json
import math
import re
import shutil
from functools import reduce

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
    balance = r["rank_imbalance"]  # the defaults: 8 and 64 ranks x 1 row, window 64
    assert (balance["ranks"], balance["rows_per_rank"], balance["window"], balance["best_is_bound"]) == ([8, 64], 1, 64, False)
    eight = balance["by_ranks"]["8"]  # 26 rows: 3 steps of 8 ranks x 1 row; 64 ranks: none
    assert eight["steps"] == 3 and balance["by_ranks"]["64"] is None
    # one row per rank, a window over the whole epoch: the sampler is at the optimum
    assert eight["sampler_weighted"] == pytest.approx(eight["best_weighted"]) and eight["best_weighted"] >= 1.0


def test_rank_imbalance_is_reported_when_there_are_enough_rows(sample_build, tmp_path):
    from packer.build import repack

    src, _ = sample_build
    repack(src, output=str(tmp_path / "short"), max_length=512, oversize="split", max_bad_fraction=1.0, progress=False)
    r = report(tmp_path / "short")
    eight = r["rank_imbalance"]["by_ranks"]["8"]
    assert r["rows"] >= 64 and eight["steps"] == r["rows"] // 8
    assert 1.0 <= eight["sampler"] < eight["random"]
    assert 1.0 <= eight["best_weighted"] <= eight["sampler_weighted"] * (1 + 1e-12) < eight["random_weighted"]


def test_step_balance_follows_the_recorded_sampler_settings(sample_build, tmp_path):
    """--report-ranks / --report-batch / --report-window are recorded with how the build ran
    (not in its config: no shard changes), and `packer report` regenerates with them."""
    from packer.config import FIELDS
    from packer.loader.samplers.token_balanced import WINDOW

    src, _ = sample_build
    out = tmp_path / "ranks"
    r = CliRunner().invoke(main, ["repack", str(src), "-o", str(out), "--report-ranks", "2,3", "--report-ranks", "30",
                                  "--report-batch", "2", "--report-window", "1"])
    assert r.exit_code == 0, r.output
    manifest = json.loads((out / "manifest.json").read_text())
    assert (manifest["execution"]["report_ranks"], manifest["execution"]["report_batch"]) == ([2, 3, 30], 2)
    assert not {"report_ranks", "report_batch", "report_window"} & set(manifest["config"])
    balance = json.loads((out / "report.json").read_text())["rank_imbalance"]
    assert (balance["ranks"], balance["rows_per_rank"], balance["window"], balance["best_is_bound"]) == ([2, 3, 30], 2, 1, True)
    two, three = balance["by_ranks"]["2"], balance["by_ranks"]["3"]
    assert (two["steps"], three["steps"], balance["by_ranks"]["30"]) == (6, 4, None)  # 26 rows in steps of 4 and 6
    assert 1.0 <= two["best_weighted"] <= two["sampler_weighted"] * (1 + 1e-12)  # a bound at 2 rows per rank
    (out / "report.json").unlink()
    assert CliRunner().invoke(main, ["report", str(out)]).exit_code == 0
    assert json.loads((out / "report.json").read_text())["rank_imbalance"] == balance
    page = (out / "report.html").read_text()
    assert "2 x 2" in page and "too few rows for one step" in page and "&ge; " in page
    r = CliRunner().invoke(main, ["repack", str(src), "-o", str(tmp_path / "bad"), "--report-ranks", "2,x"])
    assert r.exit_code == 2 and "write integers separated by commas" in r.output
    assert FIELDS["report_window"].default == WINDOW  # the report's default is the sampler's


def test_pad_cost():
    assert _pad_cost(np.array([5, 1, 3, 3, 2]), 2) == 2 * 5 + 2 * 3 + 1 * 2


def test_report_is_mergeable_across_shards(sample_build, tmp_path):
    from packer.build import repack

    src, _ = sample_build
    m = repack(src, output=str(tmp_path / "many"), shard_rows=3, progress=False).to_dict()
    one, many = report(src), report(tmp_path / "many")
    assert len(m["files"]["packed"]) > 3
    for key in ("rows", "tokens", "fill", "per_modality", "histograms", "attention", "batching", "rank_imbalance", "padding",
                "truncated", "dropped", "title"):
        assert one[key] == many[key], key


def test_html_has_every_section_embeds_its_plots_and_no_url(sample_build):
    out, _ = sample_build
    page = (out / "report.html").read_text()
    for section in ("Accounting", "Modalities", "Sample length distribution", "Fill per row", "Segments per row", "imbalance",
                    "Tokens computed for the same samples", "Top quarantine reasons",
                    "Resolved config", "speed-up vs padding", "lower bound", "Padding saved by packing", "padding saved",
                    "Truncated samples", "Dropped samples", "No sample was dropped", "<h1>sample</h1>",
                    "Step balance across data-parallel ranks", "best possible", "8 x 1 rows"):
        assert section in page, section
    assert page.count("<svg") >= 5  # 26 rows: 3 steps of 8 ranks x 1 row, charted
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
    r = CliRunner().invoke(main, ["inspect", str(out), "--row", "9999"])  # a configuration error: one line, exit 2
    assert r.exit_code == 2 and f"--row 9999 is out of range: the build has {len(rows)} rows; give 0 to {len(rows) - 1}" in r.output


# ---------------------------------------------------------------- axes, labels, the new sections

TICK = re.compile(r'<text class="tick"[^>]*>([^<]*)</text>')
VALUE = re.compile(r'<text class="value"[^>]*>([^<]*)</text>')


def count_value(text):
    """A count label back to a number: 950, 1.2k, 3M."""
    units = {"k": 1e3, "M": 1e6, "G": 1e9}
    return float(text[:-1]) * units[text[-1]] if text[-1] in units else float(text.replace(",", ""))


def svgs(page):
    return re.findall(r"<svg .*?</svg>", page, flags=re.S)


def test_count_axes_get_integer_ticks_and_percent_axes_nice_ones():
    from packer.report.svg import bar_chart

    for peak in (1, 2, 3, 5, 7, 10, 13, 55, 99):  # 5 rows used to give 0, 1.25, 2.50, 3.75, 5
        svg = bar_chart(["a", "b"], {"rows": [1, peak]}, log=False)
        ticks = [count_value(t) for t in TICK.findall(svg)]
        assert all(t.is_integer() for t in ticks) and "." not in "".join(TICK.findall(svg)), (peak, ticks)
        assert ticks[0] == 0 and ticks[-1] >= peak and len(set(np.diff(ticks))) == 1
    svg = bar_chart(["x"], {"share": [0.034]}, percent=True)
    assert TICK.findall(svg) == ["0%", "1%", "2%", "3%", "4%"] and 'data-kind="percent"' in svg


def test_log_axis_when_counts_span_decades_and_value_labels_on_bars():
    from packer.report.svg import bar_chart

    svg = bar_chart(["a", "b", "c"], {"samples": [2, 0, 3400]}, y_label="samples")
    assert 'data-scale="log"' in svg and "samples (log scale)" in svg
    assert TICK.findall(svg) == ["0", "1", "10", "100", "1k", "10k"]
    assert VALUE.findall(svg) == ["2", "3.4k"]  # every non-zero bar labelled, zero bars not
    flat = bar_chart(["a", "b"], {"samples": [2, 50]}, y_label="samples")
    assert 'data-scale="linear"' in flat and "log scale" not in flat and VALUE.findall(flat) == ["2", "50"]
    pct = bar_chart(["a", "b"], {"real share": [0.363, 0.968]}, percent=True)
    assert 'data-scale="linear"' in pct and VALUE.findall(pct) == ["36.3%", "96.8%"]


def test_built_page_axes_and_labels(sample_build):
    from packer.report.svg import log_axis

    out, _ = sample_build
    r = json.loads((out / "report.json").read_text())
    charts = svgs((out / "report.html").read_text())
    for svg in charts:
        if 'data-kind="count"' in svg:
            assert all(count_value(t).is_integer() for t in TICK.findall(svg)), TICK.findall(svg)
    lengths = [v for vals in r["histograms"]["sample_lengths"].values() for v in vals]
    assert max(lengths) / min(v for v in lengths if v) > 30 and log_axis(lengths)  # 84 image samples in a bin, 1 audio
    first = charts[0]  # the sample length histogram
    assert 'data-scale="log"' in first and "(log scale)" in first
    assert sorted(count_value(v) for v in VALUE.findall(first)) == sorted(v for v in lengths if v)
    fill = r["histograms"]["fill_per_row"]
    assert sorted(count_value(v) for v in VALUE.findall(charts[1])) == sorted(v for v in fill if v)


def test_padding_saved_in_tokens_and_gpu_hours(sample_build):
    from packer.report.compute import TOKENS_PER_GPU_SECOND

    out, _ = sample_build
    for throughput in (TOKENS_PER_GPU_SECOND, 2_500):
        r = report(out, tokens_per_gpu_second=throughput)
        b, pad = r["batching"], r["padding"]
        assert pad["tokens_per_gpu_second"] == throughput
        for k in ("padded_random", "length_grouped", "packed"):
            assert pad["padding_tokens"][k] == b[k]["computed"] - b["real_tokens"]
            assert pad["padding_gpu_hours"][k] == pytest.approx(pad["padding_tokens"][k] / throughput / 3600)
        for k in ("padded_random", "length_grouped"):
            saved = pad["saved_by_packing"][k]
            assert saved["tokens"] == b[k]["computed"] - b["packed"]["computed"] > 0
            assert saved["gpu_hours"] == pytest.approx(saved["tokens"] / throughput / 3600)
    page = (out / "report.html").read_text()
    assert "Padding saved by packing" in page and f"{TOKENS_PER_GPU_SECOND:,} tokens/s per GPU" in page


def test_title_is_the_name_when_set_else_the_output_folder(sample_build):
    import dataclasses

    from packer.report.html import render
    from packer.shards import Manifest

    out, _ = sample_build
    assert json.loads((out / "report.json").read_text())["title"] == "sample"  # pipelines/sample.toml sets name
    m = Manifest.read(out)
    unnamed = report(out, dataclasses.replace(m, config={**m.config, "name": ""}))
    assert unnamed["title"] == out.name == "out"
    assert "<h1>out</h1>" in render(unnamed)
    odd = report(out, dataclasses.replace(m, config={**m.config, "name": "a <b> & c"}))
    assert odd["title"] == "a <b> & c" and "<h1>a &lt;b&gt; &amp; c</h1>" in render(odd)


def samples_by_identity(out, manifest):
    t = pa.concat_tables([pa.ipc.open_stream(pa.memory_map(str(out / e["file"]))).read_all()
                          for e in manifest["files"]["samples"]]).select(["source_index", "source_line", "key", "length"])
    return {(x["source_index"], x["source_line"]): x for x in t.to_pylist()}


def test_truncated_samples_are_listed(sample_build, tmp_path):
    from packer.build import repack
    from packer.report.compute import truncated_samples
    from packer.shards import Manifest
    from packer.shards.stats import ShardStats, shard_stats

    src, _ = sample_build
    out = tmp_path / "cut"
    manifest = repack(src, output=str(out), max_length=512, oversize="truncate", max_bad_fraction=1.0, progress=False).to_dict()
    r = json.loads((out / "report.json").read_text())
    samples = samples_by_identity(out, manifest)
    expected = []  # independently: every packed segment shorter than its sample
    for row in all_rows(out, manifest):
        for k, (source, line) in enumerate(zip(row["segment_source"], row["segment_line"], strict=True)):
            kept = row["cu_seqlens"][k + 1] - row["cu_seqlens"][k]
            sample = samples[source, line]
            assert row["segment_start"][k] == 0
            if kept < sample["length"]:
                expected.append({"file": manifest["inputs"][source], "line": line, "id": sample["key"], "kept_tokens": kept,
                                 "cut_tokens": sample["length"] - kept})
    t = r["truncated"]
    assert t["count"] == manifest["stats"]["truncated_samples"] == len(expected) == t["found"] > 1
    assert sorted(t["listed"], key=lambda e: (e["file"], e["line"])) == sorted(expected, key=lambda e: (e["file"], e["line"]))
    assert sum(e["cut_tokens"] for e in t["listed"]) == t["tokens_cut"] == manifest["stats"]["truncated_tokens"]
    assert all(e["kept_tokens"] <= 512 for e in t["listed"]) and not t["capped"]
    stats = reduce(ShardStats.merge, [shard_stats(out / e["file"]) for e in manifest["files"]["packed"]], ShardStats())
    few = truncated_samples(out, Manifest.read(out), stats, cap=3)
    assert few["count"] == t["count"] and few["listed"] == t["listed"][:3] and few["capped"]
    page = (out / "report.html").read_text()
    assert "Truncated samples" in page and f"{t['count']:,} sample(s) longer than 512 tokens were truncated" in page
    for e in t["listed"]:
        assert f"{e['file']}:{e['line']}</code>" in page and f"<code>{e['id']}</code>" in page
    (one,) = json.loads((src / "report.json").read_text())["truncated"]["listed"]  # the sample build cuts one document
    assert one["file"].endswith("docs.jsonl") and one | {"file": ""} == {"file": "", "line": 14, "id": "doc-013",
                                                                        "kept_tokens": 4096, "cut_tokens": 927}


def test_dropped_samples_are_listed(sample_build, tmp_path):
    from packer.build import repack
    from packer.report.compute import dropped_samples
    from packer.shards import Manifest

    src, _ = sample_build
    out = tmp_path / "drop"
    manifest = repack(src, output=str(out), max_length=512, oversize="drop", max_bad_fraction=1.0, progress=False).to_dict()
    r = json.loads((out / "report.json").read_text())
    lines = [json.loads(x) for x in (out / "dropped.jsonl").read_text().splitlines()]
    d = r["dropped"]
    assert d["count"] == len(lines) == manifest["accounting"]["dropped"] > 100  # more than the list holds
    assert d["by_reason"] == manifest["accounting"]["dropped_by_reason"] == {"oversize": len(lines)}
    assert d["capped"] and d["listed"] == [{k: e[k] for k in ("file", "line", "id", "reason", "detail")} for e in lines[:100]]
    samples = {(manifest["inputs"].index(e["file"]), e["line"]) for e in lines}
    assert not samples & {(s, n) for row in all_rows(out, manifest)
                          for s, n in zip(row["segment_source"], row["segment_line"], strict=True)}
    few = dropped_samples(out, Manifest.read(out), cap=2)
    assert few["count"] == d["count"] and few["listed"] == d["listed"][:2]
    page = (out / "report.html").read_text()
    assert f"{d['count']:,} sample(s) dropped (oversize {d['count']:,})" in page and "The first 100 of" in page
    assert f"<code>{d['listed'][-1]['id']}</code>" in page and d["listed"][0]["detail"] in page
    assert json.loads((src / "report.json").read_text())["dropped"] == {"count": 0, "by_reason": {}, "listed": [], "capped": False}


def test_quarantine_detail_is_shown(sample_build):
    import html

    out, manifest = sample_build
    r = json.loads((out / "report.json").read_text())
    lines = [json.loads(x) for x in (out / "quarantine.jsonl").read_text().splitlines()]
    assert {q["reason"]: q["count"] for q in r["quarantine_top"]} == manifest["accounting"]["quarantined_by_reason"]
    page = (out / "report.html").read_text()
    for q in r["quarantine_top"]:
        first = [e for e in lines if e["reason"] == q["reason"]][:3]
        assert q["entries"] == [{"file": e["file"], "line": e["line"], "id": e["id"], "detail": e["detail"]} for e in first]
        assert q["examples"] == [f"{e['file']}:{e['line']}" for e in first]
        for e in first:
            assert html.escape(e["detail"]) in page and f"{e['file']}:{e['line']}</code>" in page
            if e["id"] is not None:
                assert f"<code>{html.escape(e['id'])}</code>" in page
    assert "&lt;image&gt;" in page  # a detail that names the tag is escaped, not markup


def test_the_builds_report_from_its_workers_stats_equals_one_recomputed_from_the_shards(tmp_path, monkeypatch):
    """Stage-3 workers hand the driver each shard's stats, merged over the batches they wrote (a remote
    build is never read back for its report); ``packer report`` recomputes them from the shards: the
    same report.json, byte for byte."""
    from conftest import ROOT
    from packer.build import build
    from packer.config import resolve
    from packer.report import write_report
    from packer.stages import materialize

    monkeypatch.setattr(materialize, "ROWS_PER_BATCH", 3)  # many batches per shard
    monkeypatch.chdir(ROOT)
    out = tmp_path / "out"
    build(resolve(ROOT / "pipelines" / "sample.toml", output=str(out), shard_rows=10), progress=False)
    built = (out / "report.json").read_bytes()
    (out / "report.json").unlink()
    write_report(out)
    assert (out / "report.json").read_bytes() == built


# ---------------------------------------------------------------- the family the build was made for


def test_a_generic_build_reports_its_policies_and_media_counts(sample_build):
    out, manifest = sample_build
    r = json.loads((out / "report.json").read_text())
    family = r["family"]
    assert (family["name"], family["processor_class"], family["processor"]) == ("generic", "", "")
    assert family["settings"]["policies"]["image"] == "fixed:image_size=336,patch_size=14"
    assert r["config"]["image_tokens"] == "fixed:image_size=336,patch_size=14" and r["config"]["image_token"] == "<image>"
    spans = [s for x in all_rows(out, manifest) for s in x["media"]]
    assert r["media_counts"] == {k: {"items": sum(s["kind"] == k for s in spans),
                                     "tokens": sum(s["tokens"] for s in spans if s["kind"] == k)}
                                 for k in ("image", "audio", "video")}
    assert r["media_counts"]["image"]["items"] > 0 and r["media_counts"]["audio"]["items"] > 0
    page = (out / "report.html").read_text()
    assert "<h2>Model family</h2>" in page and "fixed:image_size=336" in page
    assert "<code>image_token</code></td><td class=\"\"><code>&quot;&lt;image&gt;&quot;" in page
    text = CliRunner().invoke(main, ["inspect", str(out)]).output
    assert "family       generic (token-count policies: image fixed:image_size=336,patch_size=14, audio " in text
    images = r["media_counts"]["image"]
    assert f"{images['items']:,} images ({images['tokens']:,} tokens)" in text and "audio clips (" in text


@pytest.fixture(scope="module")
def family_build(tmp_path_factory):
    """A Qwen3-VL build of two image records, one video record and one audio record (which the family has no
    encoder for): what ``packer build`` prints (its warnings and the summary) and the folder."""
    pytest.importorskip("av")
    pytest.importorskip("torchvision")
    from family_assets import FAMILY_ASSETS
    from media_fixtures import write_images

    from conftest import ROOT
    from packer.build import build
    from packer.config import resolve
    from packer.summary import summarize, summary_text

    root = tmp_path_factory.mktemp("family")
    write_images(root / "img")
    FAMILY_ASSETS["qwen3vl"].processor(root / "checkpoint")
    frames = ["img/plain_300x200.jpg"] * 4
    shutil.copy(ROOT / "sample_data/audio/tone_a4_1s.wav", root / "tone.wav")
    user = lambda *parts: {"role": "user", "content": [*parts, {"type": "text", "text": "What is it?"}]}  # noqa: E731
    answer = {"role": "assistant", "content": "Something."}
    records = [{"id": "i1", "messages": [user({"type": "image", "image": "img/plain_300x200.jpg"}), answer]},
               {"id": "i2", "messages": [user({"type": "image", "image": "img/photo.webp"},
                                              {"type": "image", "image": "img/exif6.jpg"}), answer]},
               {"id": "v1", "messages": [user({"type": "video", "video": frames, "fps": 2}), answer]},
               {"id": "a1", "messages": [user({"type": "audio", "audio": "tone.wav"}),
                                         answer]}]
    data = root / "d.jsonl"
    data.write_text("".join(json.dumps(x) + "\n" for x in records))
    out = root / "out"
    warnings = io.StringIO()
    with contextlib.redirect_stderr(warnings):
        manifest = build(resolve(None, input=[str(data)], output=str(out), family="qwen3vl", max_length=2048,
                                 processor=str(root / "checkpoint"), max_bad_fraction=0.0), progress=False)
    return warnings.getvalue() + summary_text(summarize(manifest.execution["output"])), out  # what `packer build` prints


def test_a_family_build_reports_the_family_not_the_generic_policy(family_build):
    output, out = family_build
    manifest = json.loads((out / "manifest.json").read_text())
    r = json.loads((out / "report.json").read_text())
    family = r["family"]
    assert (family["name"], family["processor_class"]) == ("qwen3vl", "Qwen3VLProcessor")
    assert family["processor"] == str(out.parent / "checkpoint") and family["modalities"] == ["image", "video"]
    assert family["settings"] == manifest["tokenizer"]["family"]["settings"] and family["settings"]["image_patch_size"] == 16
    assert family["runs"] == {"image": "<|image_pad|>", "video": "<|video_pad|>"}
    spans = [s for x in all_rows(out, manifest) for s in x["media"]]
    counts = r["media_counts"]
    assert (counts["image"]["items"], counts["video"]["items"], counts["audio"]["items"]) == (3, 1, 0)
    assert manifest["stats"]["media"] == counts  # recorded for a summary that reads no shard (a remote build)
    assert counts["image"]["tokens"] == sum(s["tokens"] for s in spans if s["kind"] == "image") > 0
    assert counts["video"]["tokens"] == sum(s["tokens"] for s in spans if s["kind"] == "video") > 0
    # the generic policy played no part: neither report.json's config nor the page shows it (the manifest keeps it)
    assert not {"image_tokens", "image_token", "video_tokens", "audio_tokens"} & set(r["config"])
    assert r["config"]["modalities"] == ["image", "video"] and manifest["config"]["image_tokens"].startswith("fixed:")
    page = (out / "report.html").read_text()
    assert "fixed:image_size=336" not in page and "<code>image_tokens</code>" not in page
    assert "<code>image_token</code></td><td class=\"\"><code>&quot;&lt;image&gt;&quot;" not in page  # the family's is shown
    assert "<code>image_token</code></td><td class=\"\"><code>&quot;&lt;|image_pad|&gt;&quot;" in page
    assert "<code>image_tag</code>" in page  # the input text's marker stays: records are parsed with it
    assert "Qwen3VLProcessor" in page and "image_patch_size" in page
    # the CLI summary, after the build and from inspect
    text = CliRunner().invoke(main, ["inspect", str(out)]).output
    for shown in (output, text):
        assert f"family       qwen3vl (Qwen3VLProcessor from {out.parent / 'checkpoint'})" in shown
        assert "settings     " in shown and "image_patch_size=16" in shown
        assert f"media        3 images ({counts['image']['tokens']:,} tokens), 1 video (" in shown
        assert "fixed:image_size" not in shown
    s = json.loads(CliRunner().invoke(main, ["inspect", str(out), "--json"]).output)
    assert s["family"] == family and s["media"] == counts


def test_the_no_encoder_warning_names_the_kinds_quarantined(family_build):
    output, out = family_build
    warning = next(line for line in output.splitlines() if "no encoder" in line)
    assert "1 record(s) hold media of a kind this pipeline declares no encoder for: audio in 1 record(s)" in warning
    assert "(modalities: image, video)" in warning  # the family's kinds, not the config's default three
    entry = json.loads((out / "quarantine.jsonl").read_text())
    assert entry["reason"] == "no_encoder" and "1 audio item(s)" in entry["detail"]
