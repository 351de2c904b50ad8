"""Per-source packing policies in one build: a source's own max_length, packing on / off, oversize
policy and media caps; its rows never mix with another policy's; accounting per group; the loader takes rows of
several capacities."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest

from conftest import SAMPLE, TOKENIZER
from packer.build import build
from packer.config import BuildConfig, resolve
from packer.config.sources import Source
from packer.errors import ConfigError


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
max_length = 2048
oversize = "split"
[[sources]]
input = "{{extra}}"
max_length = 1024
"""


def extra_source(tmp) -> str:
    """A small source of chat's policy (so the two share rows): one record packed, two quarantined."""
    path = tmp / "extra.jsonl"
    path.write_text('{"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]}\n'
                    'not json\n{"nothing": 1}\n')
    return SOURCES.replace("{extra}", str(path))


@pytest.fixture(scope="module")
def grouped(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("sources")
    manifest = build(pipeline(tmp, extra_source(tmp)), progress=False)
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
    assert all(len(files) == 1 or set(files) == {"chat.jsonl", "extra.jsonl"} for files, _, _ in rows)
    chat = [(n, k) for files, n, k in rows if "chat.jsonl" in files or "extra.jsonl" in files]
    llava = [(n, k) for files, n, k in rows if files == ["llava.jsonl"]]
    docs = [(n, k) for files, n, k in rows if files == ["docs.jsonl"]]
    assert chat and max(n for n, _ in chat) <= 1024 and max(k for _, k in chat) > 1  # packed at 1,024
    assert llava and all(k == 1 for _, k in llava)  # packing = false: one sample a row
    assert docs and max(n for n, _ in docs) <= 2048  # two sources of their own max_length in one build
    groups = manifest.stats["policy_groups"]
    assert [g["policy"] for g in groups] == [{"max_length": 1024}, {"packing": False},
                                             {"max_length": 2048, "oversize": "split"}]
    assert [len(g["sources"]) for g in groups] == [2, 1, 1]
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
    assert sum(line.lstrip().startswith("source ") for line in text.splitlines()) == 4
    assert sum(line.lstrip().startswith("group ") for line in text.splitlines()) == 1  # chat and extra share rows


def test_accounting_per_source_adds_up_to_the_totals(grouped):
    from packer.report import report

    out, manifest = grouped
    acc, stats, sources = manifest.accounting, manifest.stats, manifest.stats["sources"]
    assert [a["input"].rsplit("/", 1)[-1] for a in sources] == ["chat.jsonl", "llava.jsonl", "docs.jsonl", "extra.jsonl"]
    for key, total in (("records", acc.records_read), ("packed", acc.samples_packed), ("quarantined", acc.quarantined),
                       ("dropped", acc.dropped), ("skipped", acc.skipped), ("tokens", stats["tokens"]),
                       ("segments", stats["segments"])):
        assert sum(a[key] for a in sources) == total, key
    for a in sources:
        assert a["records"] == a["packed"] + a["quarantined"] + a["dropped"] + a["skipped"]
        assert sum(a["quarantined_by_reason"].values()) == a["quarantined"]
        assert sum(a["dropped_by_reason"].values()) == a["dropped"]
        assert a["fill"] == a["tokens"] / (a["rows"] * a["capacity"]) and a["gap_to_lower_bound"] >= 0
    chat, llava, docs, extra = sources
    assert (chat["capacity"], llava["capacity"], docs["capacity"], extra["capacity"]) == (1024, 4096, 2048, 1024)
    assert llava["rows"] == llava["segments"] == llava["lower_bound"]  # a row a sample
    assert extra == {**extra, "records": 3, "packed": 1, "quarantined": 2, "rows": 1, "shared_rows": 1}
    assert chat["shared_rows"] == 1 and llava["shared_rows"] == docs["shared_rows"] == 0
    # rows add up: sources of their own group alone, sources sharing rows through their group
    groups = stats["policy_groups"]
    assert llava["rows"] + docs["rows"] + groups[0]["rows"] == stats["rows"]
    assert groups[0]["rows"] == chat["rows"] + extra["rows"] - extra["shared_rows"]
    r = report(out)
    assert r["sources"] == sources
    assert r["fill"] == stats["tokens"] / sum(g["rows"] * g["capacity"] for g in groups)
    html = (out / "report.html").read_text()
    assert "sources sharing rows" in html and "extra.jsonl" in html and "malformed_json 1" in html


def test_the_report_counts_an_unpacked_row_as_the_collator_pads_it_not_as_a_full_row(grouped):
    """A row of one sample by policy (packing = false) is computed at its batch's longest, as the collator pads it,
    never at its capacity (which showed packing slower than padding); a packed row at its capacity."""
    from packer.report import report

    out, _ = grouped
    rows = rows_by_source(out)
    capacity = {"chat.jsonl": 1024, "extra.jsonl": 1024, "docs.jsonl": 2048}
    unpacked = [n for files, n, _ in rows if files == ["llava.jsonl"]]
    packed = sum(capacity[files[0]] for files, _, _ in rows if files != ["llava.jsonl"])
    r = report(out)
    computed = r["batching"]["packed"]["computed"] - packed  # the unpacked rows' share
    assert sum(unpacked) <= computed <= len(unpacked) * max(unpacked) < len(unpacked) * 4096
    assert r["fill"] == r["tokens"] / (packed + len(unpacked) * 4096)  # fill stays against each row's capacity


def test_a_build_that_packs_nothing_shows_no_speed_up_and_no_padding_saved(tmp_path):
    """Every source packing = false: each row is a sample, batches padded to their longest exactly as the
    padded baseline's (same seed, same order), so packing's speed-up is 1.00x and it saves nothing."""
    from packer.report import report
    from packer.report.html import headline

    chat = SAMPLE / "chat.jsonl"
    config = pipeline(tmp_path, f'[[sources]]\ninput = "{chat}"\npacking = false\n', max_bad_fraction=1.0)
    build(config, progress=False)
    r = report(tmp_path / "out")
    b, saved = r["batching"], r["padding"]["saved_by_packing"]["padded_random"]
    assert b["packed"]["computed"] == b["padded_random"]["computed"] < r["rows"] * 4096
    assert b["speedup_vs_padded_random"] == 1.0 and saved["tokens"] == 0
    cards = {key: value for key, _, value, _ in headline(r)}
    assert cards["speedup"] == "1.00x"


def test_verify_holds_each_row_to_its_sources_policy(grouped, tmp_path):
    import shutil

    from packer.verify import verify

    out, _ = grouped
    problems, _ = verify(out)
    assert problems == []
    copy = tmp_path / "copy"
    shutil.copytree(out, copy)
    m = json.loads((copy / "manifest.json").read_text())
    own = {"chat.jsonl": "max_length=64", "extra.jsonl": "max_length=1000", "docs.jsonl": "packing=false"}
    m["config"]["input"] = [s.split("#")[0] + "#" + own.get(s.split("#")[0].rsplit("/", 1)[-1], s.split("#")[1])
                            for s in m["config"]["input"]]
    (copy / "manifest.json").write_text(json.dumps(m))
    messages = [p.message for p in verify(copy)[0]]
    assert any("> max_length 64 of its source" in x and "chat.jsonl" in x for x in messages)
    assert any("segments of sources packed by different policies in one row" in x and "extra.jsonl" in x
               for x in messages)
    assert any("samples in a row of source" in x and "docs.jsonl" in x and "packing = false" in x for x in messages)


def test_the_unpacked_samples_keep_their_sources_max_length(grouped):
    from packer.loader import SampleDataset

    out, manifest = grouped
    ds = SampleDataset(out)
    docs = manifest.inputs.index(next(f for f in manifest.inputs if f.endswith("docs.jsonl")))
    of_file = ds.column("source_index").to_numpy()
    long = [i for i in np.flatnonzero(of_file == docs) if ds.column("length")[int(i)].as_py() > 2048]
    assert long and all(ds[int(i)]["n_tokens"] == 2048 for i in long)
    assert ds.lengths.max() <= 4096 and ds.lengths[of_file == docs].max() == 2048


def test_same_bytes_with_one_and_two_workers(tmp_path, grouped):
    out, _ = grouped
    (tmp_path / "extra.jsonl").write_bytes((out.parent / "extra.jsonl").read_bytes())  # same bytes, another place
    config = pipeline(tmp_path, extra_source(out.parent), workers=2)
    build(config, progress=False)
    for name in ("plan.arrow",):
        assert (tmp_path / "out" / name).read_bytes() == (out / name).read_bytes()
    a = json.loads((out / "manifest.json").read_text())
    b = json.loads((tmp_path / "out" / "manifest.json").read_text())
    assert [e["sha256"] for e in a["files"]["packed"]] == [e["sha256"] for e in b["files"]["packed"]]
    assert a["stats"]["sources"] == b["stats"]["sources"] and a["stats"]["policy_groups"] == b["stats"]["policy_groups"]


def test_a_batch_of_rows_of_several_capacities_collates(tmp_path):
    from packer.loader import PackedCollator, PackedDataset

    sources = (f'[[sources]]\ninput = "{SAMPLE / "chat.jsonl"}"\nmax_length = 512\n'
               f'[[sources]]\ninput = "{SAMPLE / "docs.jsonl"}"\n')
    build(pipeline(tmp_path, sources, modalities=[], row_lengths="auto:2"), progress=False)
    ds = PackedDataset(tmp_path / "out")
    lengths = np.array([ds[i]["n_tokens"] for i in range(len(ds))])
    short, long = int(np.argmin(lengths)), int(np.argmax(lengths))
    assert lengths[short] <= 512 < lengths[long]
    batch = PackedCollator(attention="sdpa")([ds[short], ds[long]])
    assert tuple(batch["input_ids"].shape) == (2, int(lengths[long]))
    # the build's row lengths (chosen over rows of both capacities) hold either row
    assert ds.row_lengths and ds.row_lengths[-1] >= lengths.max()
    for i in (short, long):
        assert PackedCollator(attention="sdpa", row_lengths=ds.row_lengths)([ds[i]])["input_ids"].shape[1] in ds.row_lengths


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


def test_a_sources_own_caps_the_algorithm_cannot_honour_are_refused_naming_it():
    from packer.build import check_plan_options

    with pytest.raises(ConfigError, match=r"input 'img.jsonl' \(its own packing max_images=2\): algorithm 'ffd' "
                                          r"does not support max_media; use bfd or next-fit"):
        check_plan_options(BuildConfig(input=("chat.jsonl", "img.jsonl#max_images=2"), algorithm="ffd"))
    check_plan_options(BuildConfig(input=("chat.jsonl", "v.jsonl#packing=false"), algorithm="ffd"))  # max_segments: ffd's


def test_a_source_longer_than_the_build_is_refused_with_the_fix(tmp_path):
    with pytest.raises(ConfigError, match="raise max_length to at least 16,384"):
        BuildConfig(input=("v.jsonl#max_length=16384",), max_length=4096)


def test_the_policy_reads_from_the_spec_and_a_sources_table_alike(tmp_path):
    s = Source.parse("v.jsonl#weight=2,max_length=16384,packing=false")
    assert s.weight == 2 and s.options() == {"max_length": 16384, "max_segments": 1}
    config = pipeline(tmp_path, '[[sources]]\ninput = "v.jsonl"\npacking = false\nmax_images = 3\n')
    assert Source.parse(config.input[-1]).options() == {"max_images": 3, "max_segments": 1}


def test_repack_keeps_each_sources_own_packing(grouped, tmp_path):
    from packer.build import repack

    out, manifest = grouped
    m = repack(out, output=str(tmp_path / "r"), max_length=3000, progress=False)
    assert [a["capacity"] for a in m.stats["sources"]] == [1024, 3000, 2048, 1024]  # the unpacked one: the build's
    assert [a["records"] for a in m.stats["sources"]] == [a["records"] for a in manifest.stats["sources"]]
    rows = rows_by_source(tmp_path / "r")
    assert max(n for files, n, _ in rows if files == ["docs.jsonl"]) <= 2048
    assert all(k == 1 for files, _, k in rows if files == ["llava.jsonl"])
    with pytest.raises(ConfigError, match="raise max_length to at least 2,048"):
        repack(out, output=str(tmp_path / "x"), max_length=1500, progress=False)


def test_each_source_group_keeps_its_own_row_encoder_budget(tmp_path):
    """max_row_encoder = auto over groups of their own policy: each group's budget from its own rows, each named."""
    cost = tmp_path / "cost.json"
    cost.write_text(json.dumps({"image_token": 1.0, "audio_item": 300.0}))
    sources = (f'[[sources]]\ninput = "{SAMPLE / "llava.jsonl"}"\nmax_length = 2048\n'
               f'[[sources]]\ninput = "{SAMPLE / "chat.jsonl"}"\n')
    manifest = build(pipeline(tmp_path, sources, cost_model=str(cost), max_row_encoder="auto"), progress=False)
    b = manifest.stats["row_budget"]
    budgets = [g.get("budgets", {}).get("encoder") for g in manifest.stats["policy_groups"]]
    assert budgets[0] > 0 and budgets[1] > 0 and budgets[0] != budgets[1]  # images at 2,048; chat's audio clips
    assert b["budget"] is None and list(b["group_budgets"].values()) == budgets
    assert b["bound"] == max(b["token_bound"], b["encoder_bound"])


def test_the_summary_shows_source_lines_only_with_a_sources_own_packing(sample_build, grouped):
    """Without a source's own packing the build's lines say it all (per-source rows shared with the others gave a
    bound and fill that meant nothing); with one, a source sharing rows gives its tokens and rows, no bound or fill
    of its own, and the fill is stated against each row's own capacity."""
    from packer.summary import summarize, summary_text

    text = summary_text(summarize(sample_build[0]))
    assert not [line for line in text.splitlines() if line.lstrip().startswith("source ")]
    assert "fill         96.76% of 4,096 tokens per row\n" in text
    out, manifest = grouped
    lines = {line.split()[1].rsplit("/", 1)[-1]: line for line in summary_text(summarize(out)).splitlines()
             if line.lstrip().startswith("source ")}
    figures = re.compile(r"lower bound \d.*fill \d")
    for name in ("chat.jsonl", "extra.jsonl"):  # they share a row
        assert not figures.search(lines[name]) and "(their rows, bound and fill: the group line)" in lines[name]
    for name in ("llava.jsonl", "docs.jsonl"):
        assert figures.search(lines[name])
    rows = {g["capacity"]: g["rows"] for g in manifest.stats["policy_groups"]}
    fill = 100 * manifest.stats["tokens"] / sum(c * n for c, n in rows.items())
    assert (f"fill         {fill:.2f}% of each row's own max_length ({rows[1024]:,} rows of 1,024, {rows[2048]:,} of 2,048, "
            f"{rows[4096]:,} of 4,096)") in summary_text(summarize(out))
    from packer.report import report
    from packer.report.html import headline

    card = next(sub for key, _, _, sub in headline(report(out)) if key == "fill")
    assert card == f"of each row's own max_length ({rows[1024]:,} rows of 1,024, {rows[2048]:,} of 2,048, {rows[4096]:,} of 4,096)"


def test_a_sources_bound_honours_its_media_cap_and_a_drop_names_the_cap(tmp_path):
    """llava.jsonl at max_images = 1: each row holds one image at most, so its bound is its images (not its tokens
    over 4,096); the record of two images is dropped, its detail giving its images against the cap."""
    from packer.shards.io import read_shard

    llava = SAMPLE / "llava.jsonl"
    config = pipeline(tmp_path, f'[[sources]]\ninput = "{llava}"\nmax_images = 1\n', max_bad_fraction=1.0)
    manifest = build(config, progress=False)
    images = sum(m["kind"] == "image" for e in manifest.files.packed
                 for row in read_shard(tmp_path / "out" / e.file).column("media").to_pylist() for m in row)
    (source,) = manifest.stats["sources"]
    assert images > -(-source["tokens"] // 4096) and source["lower_bound"] == images == source["rows"]
    assert manifest.stats["policy_groups"][0]["lower_bound"] == manifest.stats["lower_bound"] == images
    dropped = [json.loads(line) for line in (tmp_path / "out" / "dropped.jsonl").read_text().splitlines()]
    assert [d["reason"] for d in dropped] == ["over_media_cap"]
    assert dropped[0]["detail"].startswith("2 images > max_images 1; ") and dropped[0]["detail"].endswith(" tokens")


def test_a_file_whose_name_holds_a_hash_is_an_input(tmp_path, monkeypatch):
    """``a#b.jsonl`` names the file when that whole path exists; ``a#b.jsonl#`` names it whatever exists; options follow
    the last '#'. The build records the escaped form, so its manifest reads the same once the file is gone."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "a#b.jsonl").write_text('{"text": "one"}\n')
    for spec in ("a#b.jsonl", str(tmp_path / "a#b.jsonl")):
        config = BuildConfig(input=(spec,))
        assert config.input == (spec + "#",) and [str(f) for f in config.input_files()] == [spec]
    assert Source.parse("a#b.jsonl#") == Source("a#b.jsonl")
    assert Source.parse("a#b.jsonl#weight=2") == Source("a#b.jsonl", 2.0)
    assert BuildConfig(input=("a#b.jsonl#weight=2",)).input == ("a#b.jsonl#weight=2",)
    with pytest.raises(ConfigError, match=r"input 'c#d.jsonl': 'd.jsonl' after '#' is not an option; .* a file whose "
                                          r"name holds a '#' is written with one more '#' at its end \('c#d.jsonl#'\)"):
        BuildConfig(input=("c#d.jsonl",))
    config = pipeline(tmp_path, '[[sources]]\ninput = "a#b.jsonl"\n[[sources]]\ninput = "a#b.jsonl"\nweight = 1\n')
    assert [Source.parse(s).pattern for s in config.input] == ["a#b.jsonl"] * 2  # relative to the folder packer runs in


def test_a_sources_table_value_sets_its_own_option_only(tmp_path):
    with pytest.raises(ConfigError, match=r"\[\[sources\]\] input 'v.jsonl': oversize = 'split,packing=false' is not one "
                                          r"value of oversize \(',', '=' and '#' separate options\); give each option "
                                          r"its own key in the table"):
        pipeline(tmp_path, '[[sources]]\ninput = "v.jsonl"\noversize = "split,packing=false"\n')
    with pytest.raises(ConfigError, match="max_length = '4096#' is not one value"):
        pipeline(tmp_path, '[[sources]]\ninput = "v.jsonl"\nmax_length = "4096#"\n')


def test_one_file_named_by_two_sources_of_different_settings_is_refused(tmp_path):
    """Read once, under the first source: the second's policy would be lost. Named twice alike: read once, warned."""
    from click.testing import CliRunner

    from packer.cli import main

    data = tmp_path / "a.jsonl"
    data.write_text('{"text": "one"}\n')
    with pytest.raises(ConfigError, match=rf"input {data} is named by two sources of different settings, the build's "
                                          rf"\(input '{data}'\) and packing=false \(input '{tmp_path}/\*.jsonl'\); "
                                          r"a file is read once, under one source's: name it in one source"):
        BuildConfig(input=(str(data), f"{tmp_path}/*.jsonl#packing=false")).input_files()
    with pytest.raises(ConfigError, match=r"weight=2, cap=0 \(input .*\) and weight=3, cap=0"):
        BuildConfig(input=(f"{data}#weight=2", f"{data}#weight=3")).input_files()
    assert len(BuildConfig(input=(f"{data}#max_images=2", f"{tmp_path}/*#max_images=2")).input_files()) == 1
    r = CliRunner().invoke(main, ["build", "-i", str(data), "-i", f"{data}#max_length=64", "-o", str(tmp_path / "o"),
                                  "--tokenizer", TOKENIZER])
    assert r.exit_code == 2 and r.stderr.count("\n") == 1 and "named by two sources" in r.stderr, r.output
    assert not (tmp_path / "o").exists()


def test_a_builds_own_media_cap_sets_its_lower_bound_without_source_policies(tmp_path):
    """A build-wide max_images = 1 and no source of its own packing: the build's lower bound is its images (each
    row holds one), not its tokens over 4,096, in the manifest, the summary, the report and the row budget's bound."""
    from packer.report import report
    from packer.shards.io import read_shard
    from packer.summary import summarize, summary_text

    config = pipeline(tmp_path, f'input = ["{SAMPLE / "llava.jsonl"}"]', max_images=1, max_bad_fraction=1.0,
                      max_row_encoder="auto")
    manifest = build(config, progress=False)
    out = tmp_path / "out"
    images = sum(m["kind"] == "image" for e in manifest.files.packed
                 for row in read_shard(out / e.file).column("media").to_pylist() for m in row)
    stats = manifest.stats
    assert "policy_groups" not in stats and images > -(-stats["tokens"] // 4096)
    assert stats["lower_bound"] == images == stats["rows"] and stats["gap_to_lower_bound"] == 0
    assert stats["row_budget"]["token_bound"] == images and stats["row_budget"]["bound"] >= images
    assert f"  rows         {images:,} in 1 shard(s); lower bound {images:,} (+0)\n" in summary_text(summarize(out))
    r = report(out)
    assert (r["lower_bound"], r["gap_to_lower_bound"]) == (images, 0)
