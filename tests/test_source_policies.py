"""Per-source packing policies in one build (issue 32): a source's own max_length, packing on / off, oversize
policy and media caps; its rows never mix with another policy's; accounting per group; the loader takes rows of
several capacities."""

from __future__ import annotations

import json

import numpy as np
import pytest

from conftest import SAMPLE, TOKENIZER
from packer.build import build
from packer.config import BuildConfig, resolve
from packer.errors import ConfigError
from packer.mix import Source


def pipeline(tmp_path, sources: str, **top) -> BuildConfig:
    path = tmp_path / "p.toml"
    top = {"modalities": ["image", "audio"], "max_length": 4096, **top}
    lines = [f'tokenizer = "{TOKENIZER}"', *(f"{k} = {json.dumps(v)}" for k, v in top.items()), sources]
    path.write_text("\n".join(lines))
    return resolve(path, output=str(tmp_path / "out"))


SOURCES = f"""
[[sources]]
input = "{SAMPLE / 'chat.jsonl'}"
max_length = 1024
[[sources]]
input = "{SAMPLE / 'llava.jsonl'}"
packing = false
[[sources]]
input = "{SAMPLE / 'docs.jsonl'}"
oversize = "split"
"""


@pytest.fixture(scope="module")
def grouped(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("sources")
    manifest = build(pipeline(tmp, SOURCES), progress=False)
    return tmp / "out", manifest


def rows_by_source(out):
    """Each packed row's input files (by name), tokens and segments."""
    from packer.shards.io import read_shard
    from packer.shards.manifest import Manifest

    manifest = Manifest.read(out)
    rows = []
    for entry in manifest.files.packed:
        for row in read_shard(out / entry.file).select(["segment_source", "n_tokens", "cu_seqlens"]).to_pylist():
            files = sorted({manifest.inputs[s].rsplit("/", 1)[-1] for s in row["segment_source"]})
            rows.append((files, row["n_tokens"], len(row["cu_seqlens"]) - 1))
    return rows


def test_rows_never_mix_policies_and_each_keeps_its_own_capacity_and_packing(grouped):
    out, manifest = grouped
    rows = rows_by_source(out)
    assert all(len(files) == 1 for files, _, _ in rows)
    chat = [(n, k) for files, n, k in rows if files == ["chat.jsonl"]]
    llava = [(n, k) for files, n, k in rows if files == ["llava.jsonl"]]
    docs = [(n, k) for files, n, k in rows if files == ["docs.jsonl"]]
    assert chat and max(n for n, _ in chat) <= 1024 and max(k for _, k in chat) > 1  # packed at 1,024
    assert llava and all(k == 1 for _, k in llava)  # packing = false: one sample a row
    assert docs and max(n for n, _ in docs) <= 4096
    groups = manifest.stats["policy_groups"]
    assert [g["policy"] for g in groups] == [{"max_length": 1024}, {"packing": False}, {"oversize": "split"}]
    assert sum(g["rows"] for g in groups) == manifest.stats["rows"] == len(rows)
    assert sum(g["tokens"] for g in groups) == manifest.stats["tokens"]
    assert manifest.stats["lower_bound"] == sum(g["lower_bound"] for g in groups)
    assert groups[1]["lower_bound"] == groups[1]["rows"]  # unpacked: a row a sample is the bound
    assert manifest.stats["split_samples"] >= 1  # docs' own oversize policy (the build's is truncate)


def test_accounting_adds_up_and_the_report_and_summary_show_each_group(grouped):
    from packer.report import report
    from packer.summary import summarize, summary_text

    out, manifest = grouped
    acc = manifest.accounting
    assert acc.records_read == acc.samples_packed + acc.quarantined + acc.dropped
    r = report(out)
    assert r["lower_bound"] == manifest.stats["lower_bound"] and len(r["policy_groups"]) == 3
    text = summary_text(summarize(out))
    assert "max_length=1024" in text and "packing=false" in text and "oversize=split" in text


def test_same_bytes_with_one_and_two_workers(tmp_path, grouped):
    out, _ = grouped
    config = pipeline(tmp_path, SOURCES, workers=2)
    build(config, progress=False)
    for name in ("plan.arrow",):
        assert (tmp_path / "out" / name).read_bytes() == (out / name).read_bytes()
    a = json.loads((out / "manifest.json").read_text())["files"]["packed"]
    b = json.loads((tmp_path / "out" / "manifest.json").read_text())["files"]["packed"]
    assert [e["sha256"] for e in a] == [e["sha256"] for e in b]


def test_a_batch_of_rows_of_several_capacities_collates(tmp_path):
    from packer.loader import PackedCollator, PackedDataset

    sources = (f'[[sources]]\ninput = "{SAMPLE / "chat.jsonl"}"\nmax_length = 512\n'
               f'[[sources]]\ninput = "{SAMPLE / "docs.jsonl"}"\n')
    build(pipeline(tmp_path, sources, modalities=[]), progress=False)
    ds = PackedDataset(tmp_path / "out")
    lengths = np.array([ds[i]["n_tokens"] for i in range(len(ds))])
    short, long = int(np.argmin(lengths)), int(np.argmax(lengths))
    assert lengths[short] <= 512 < lengths[long]
    batch = PackedCollator(attention="sdpa")([ds[short], ds[long]])
    assert tuple(batch["input_ids"].shape) == (2, int(lengths[long]))


@pytest.mark.parametrize("spec,match", [
    ("a.jsonl#max_length=0", r"input 'a.jsonl#max_length=0': max_length = 0 is not a whole number >= 1"),
    ("a.jsonl#max_length=4k", r"max_length = '4k' is not a whole number >= 1"),
    ("a.jsonl#packing=maybe", "input 'a.jsonl#packing=maybe': packing = 'maybe' is not true or false"),
    ("a.jsonl#oversize=chop", "oversize = 'chop' is not one of truncate, drop, split"),
    ("a.jsonl#max_images=-1", r"max_images = -1 is not a whole number >= 0 \(0: no limit\)"),
    ("a.jsonl#max_videos=1,max_videos=2", "max_videos is given twice"),
    ("a.jsonl#colour=red", "'colour=red' after '#' is not an option; give weight=W, cap=N and this source's own packing"),
])
def test_a_malformed_source_policy_is_refused_naming_the_input(spec, match):
    with pytest.raises(ConfigError, match=match):
        Source.parse(spec)


def test_a_source_longer_than_the_build_is_refused_with_the_fix(tmp_path):
    with pytest.raises(ConfigError, match="raise max_length to at least 16,384"):
        BuildConfig(input=("v.jsonl#max_length=16384",), max_length=4096)


def test_the_policy_reads_from_the_spec_and_a_sources_table_alike(tmp_path):
    s = Source.parse("v.jsonl#weight=2,max_length=16384,packing=false")
    assert s.weight == 2 and s.options() == {"max_length": 16384, "max_segments": 1}
    config = pipeline(tmp_path, '[[sources]]\ninput = "v.jsonl"\npacking = false\nmax_images = 3\n')
    assert Source.parse(config.input[-1]).options() == {"max_images": 3, "max_segments": 1}
