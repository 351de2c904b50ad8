"""Weighted mixing of sources and the sequential row order: deterministic in the seed,
accounting exact (read = packed + quarantined + dropped + skipped), copies where asked."""

from __future__ import annotations

import json
from collections import Counter

import numpy as np
import pytest
from click.testing import CliRunner

from conftest import TOKENIZER
from packer.cli import main
from packer.config.sources import Source
from packer.errors import ConfigError
from packer.stages.mix import mix
from packer.verify import verify


def chat(src: str, k: int) -> dict:
    return {"id": f"{src}-{k}", "messages": [{"role": "user", "content": f"{src} question {k}"},
                                             {"role": "assistant", "content": f"answer {k}"}]}


def write(path, src, n):
    path.write_text("".join(json.dumps(chat(src, k)) + "\n" for k in range(n)))
    return path


def build(*args):
    r = CliRunner().invoke(main, ["build", *map(str, args), "--tokenizer", TOKENIZER], catch_exceptions=False)
    assert r.exit_code == 0, r.output
    return r


def packed_ids(out) -> Counter:
    import pyarrow as pa

    ids: Counter = Counter()
    for f in sorted((out / "packed").glob("part-*.arrow")):
        for row in pa.ipc.open_stream(pa.memory_map(str(f))).read_all().column("segment_ids").to_pylist():
            ids.update(row)
    return ids


def test_weights_caps_and_accounting(tmp_path):
    a, b, c = write(tmp_path / "a.jsonl", "a", 40), write(tmp_path / "b.jsonl", "b", 100), write(tmp_path / "c.jsonl", "c", 30)
    out = tmp_path / "o"
    build("-i", f"{a}#weight=3", "-i", f"{b}#weight=0.2", "-i", f"{c}#weight=2,cap=25", "-o", out)
    m = json.loads((out / "manifest.json").read_text())
    acc = m["accounting"]
    fa, fb, fc = (acc["by_file"][str(p)] for p in (a, b, c))
    assert fa == {"records": 40, "packed": 40, "quarantined": 0, "dropped": 0, "skipped": 0, "repeated": 80}
    assert fb["records"] == 100 and fb["packed"] + fb["skipped"] == 100 and 8 <= fb["packed"] <= 35 and fb["repeated"] == 0
    assert fc["packed"] + fc["skipped"] == 30 and fc["packed"] + fc["repeated"] == 25  # 25 copies in all
    assert acc["records_read"] == acc["samples_packed"] + acc["quarantined"] + acc["dropped"] + acc["skipped"]
    ids = packed_ids(out)
    assert all(ids[f"a-{k}"] == 3 for k in range(40)) and sum(v for k, v in ids.items() if k.startswith("c-")) == 25
    assert sum(1 for k in ids if k.startswith("b-")) == fb["packed"]
    assert not verify(out)[0]
    again = tmp_path / "o2"
    build("-i", f"{a}#weight=3", "-i", f"{b}#weight=0.2", "-i", f"{c}#weight=2,cap=25", "-o", again)
    assert (out / "packed" / "part-00000.arrow").read_bytes() == (again / "packed" / "part-00000.arrow").read_bytes()


def test_pipeline_sources_tables(tmp_path):
    write(tmp_path / "a.jsonl", "a", 10)
    write(tmp_path / "b.jsonl", "b", 10)
    (tmp_path / "p.toml").write_text(f'output = "out"\ntokenizer = "{TOKENIZER}"\n'
                                     '[[sources]]\ninput = "a.jsonl"\nweight = 2\n[[sources]]\ninput = "b.jsonl"\ncap = 4\n')
    build(tmp_path / "p.toml")
    ids = packed_ids(tmp_path / "out")
    assert sum(ids[f"a-{k}"] for k in range(10)) == 20 and sum(1 for k in ids if k.startswith("b-")) == 4


@pytest.mark.parametrize("spec, match", [("a.jsonl#w=3", "weight=W, cap=N and this source.s own packing"),
                                         ("a.jsonl#weight=x", "weight = 'x' is not a number from 0 to 1000"),
                                         ("a.jsonl#weight=-1", "weight = -1.0 is not a number from 0 to 1000"),
                                         ("a.jsonl#weight=1e300", r"weight = 1e\+300 is not a number from 0 to 1000 \(only "
                                                                  r"the ratios between sources matter: lower the other"),
                                         ("a.jsonl#weight=1e7", "weight = 10000000.0 is not a number from 0 to 1000"),
                                         ("a.jsonl#weight=1001", "weight = 1001.0 is not a number from 0 to 1000"),
                                         ("a.jsonl#weight=nan", "weight = nan is not"),
                                         ("a.jsonl#weight=inf", "weight = inf is not"),
                                         ("a.jsonl#cap=" + "9" * 5000, "cap = '9999.*' is not a whole number")])
def test_bad_source_specs(spec, match):
    with pytest.raises(ConfigError, match=match):
        Source.parse(spec)


def test_the_largest_weight_is_taken():
    assert Source.parse("a.jsonl#weight=1000").weight == 1000.0


def test_a_mix_over_what_a_plan_holds_is_refused_before_it_is_made(monkeypatch):
    """The copies are counted before they are laid out: a mix over the bound names its count, the bound and the fix."""
    import packer.stages.mix

    monkeypatch.setattr(packer.stages.mix, "MAX_COPIES", 999)
    owner = np.repeat(np.arange(2), [10, 100])
    assert mix(owner, [Source("x", 1.0), Source("y", 9.0)], seed=0).copies.sum() == 910  # at the bound: taken
    with pytest.raises(ConfigError, match=r"the mix plans 1,010 samples \(110 records read\), over the 999 a plan can "
                                          r"hold: lower the weights \(input 'y' has weight=10"):
        mix(owner, [Source("x", 1.0), Source("y", 10.0)], seed=0)


def test_mix_is_deterministic_and_respects_the_weights():
    sources = [Source("x", 1.5), Source("y", 0.25, cap=0), Source("z", 4.0, cap=10)]
    owner = np.repeat(np.arange(3), [1000, 1000, 50])
    m1, m2 = mix(owner, sources, seed=7), mix(owner, sources, seed=7)
    assert np.array_equal(m1.selection, m2.selection)
    assert 1400 < m1.copies[:1000].sum() < 1600 and 180 < m1.copies[1000:2000].sum() < 320
    assert m1.copies[2000:].sum() == 10 and set(np.unique(m1.copies[:1000])) == {1, 2}
    assert not np.array_equal(mix(owner, sources, seed=8).selection, m1.selection)


def test_sequential_order_keeps_source_order(tmp_path):
    a = write(tmp_path / "a.jsonl", "a", 30)
    out = tmp_path / "o"
    build("-i", a, "-o", out, "--order", "sequential", "--algorithm", "next-fit", "--max-length", 64)
    import pyarrow as pa

    rows = pa.ipc.open_stream(pa.memory_map(str(out / "packed" / "part-00000.arrow"))).read_all().column("segment_line")
    lines = [line for row in rows.to_pylist() for line in row]
    assert lines == sorted(lines) == list(range(1, 31))
