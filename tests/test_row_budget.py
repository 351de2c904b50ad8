"""A per-row budget on a float resource (the encoder cost) besides the tokens: packer.pack.plan(resources=,
budgets=), the build's max_row_encoder, and the bound the rows are measured against."""

from __future__ import annotations

import sys

import numpy as np
import pytest

from conftest import ROOT
from packer.pack import plan
from packer.pack.plan import RESOURCE_UNITS, resource_bound

sys.path.insert(0, str(ROOT / "bench"))


def corpus(n: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Lengths and encoder costs: text (no encoder), images and videos whose cost grows with their tokens."""
    rng = np.random.default_rng(seed)
    kind = rng.choice(3, size=n, p=[0.4, 0.35, 0.25])
    media = np.where(kind == 0, 0, np.where(kind == 1, rng.integers(64, 2000, n), rng.integers(500, 5000, n)))
    lengths = (media + rng.integers(20, 1500, n)).astype(np.int64)
    cost = media * (1.0 + 0.0005 * media) * (kind > 0)
    return np.minimum(lengths, 8192), cost


def rows_of(p, values: np.ndarray) -> np.ndarray:
    return np.add.reduceat(values[p.indices], p.offsets[:-1])


@pytest.mark.parametrize("slack", [0.5, 0.2])
def test_no_row_goes_over_its_budget_and_every_sample_is_placed_once(slack):
    lengths, cost = corpus(4000)
    budget = (1 + slack) * cost.sum() / -(-lengths.sum() // 8192)
    p = plan(lengths, 8192, resources={"encoder": cost}, budgets={"encoder": budget}, seed=1)
    assert np.array_equal(np.sort(p.indices), np.arange(len(lengths)))
    over = set(p.over_budget.get("encoder", np.zeros(0)).tolist())
    assert over == set(np.flatnonzero(cost > budget).tolist())
    per_row = rows_of(p, cost)
    for b in range(p.n_bins):
        members = p.bin(b)
        if over & set(members.tolist()):  # a sample over the budget alone: it shares its row with no encoder cost
            assert (cost[members] > 0).sum() == 1
        else:
            assert per_row[b] <= budget * (1 + 1e-12)
    assert p.budgets == {"encoder": budget}
    assert p.resource_bound == resource_bound(cost, budget) and p.bound == max(p.lower_bound, p.resource_bound)


def test_rows_stay_within_one_percent_of_the_bound_at_the_auto_budget():
    """The default auto budget (1.5 x the mean row's encoder cost): rows within 1% of max(token bound, encoder
    bound) on the bench's generated video-heavy corpus, and the rows' encoder costs closer together."""
    from bench_steps import MIXES, generate

    from packer.cost import CostModel

    samples = generate(6000, MIXES["video-heavy"], 8192, seed=0)
    cost = CostModel.load(ROOT / "bench" / "calibrated_qwen3vl2b_h200.json").vector(samples)[:, 1]
    lengths = samples["tokens"].astype(np.int64)
    budget = 1.5 * cost.sum() / -(-lengths.sum() // 8192)
    free = plan(lengths, 8192, seed=0)
    p = plan(lengths, 8192, seed=0, resources={"encoder": cost}, budgets={"encoder": budget})
    assert p.n_bins <= 1.01 * p.bound, (p.n_bins, p.bound)
    spread = lambda q: rows_of(q, cost).max() / rows_of(q, cost).mean()  # noqa: E731
    assert spread(p) < 0.7 * spread(free)


def test_need_is_rounded_up_so_whole_multiples_fit_exactly():
    """Four samples of a quarter budget each fill one row; a fifth of any cost needs another."""
    lengths = np.full(5, 10, np.int64)
    cost = np.array([0.25, 0.25, 0.25, 0.25, 1e-9])
    p = plan(lengths, 1000, resources={"encoder": cost}, budgets={"encoder": 1.0}, order="planner")
    assert sorted(len(p.bin(b)) for b in range(p.n_bins)) == [1, 4]
    assert RESOURCE_UNITS >= 32


def test_off_gives_the_plan_of_no_budget_and_bad_budgets_are_refused():
    lengths, cost = corpus(500)
    a = plan(lengths, 8192, seed=2)
    b = plan(lengths, 8192, seed=2, resources={"encoder": cost}, budgets=None)
    assert a.offsets.tolist() == b.offsets.tolist() and a.indices.tolist() == b.indices.tolist()
    with pytest.raises(ValueError, match="positive number"):
        plan(lengths, 8192, resources={"encoder": cost}, budgets={"encoder": 0})
    with pytest.raises(ValueError, match="has no 'encoder' costs"):
        plan(lengths, 8192, budgets={"encoder": 1.0})
    with pytest.raises(ValueError, match="finite cost >= 0"):
        plan(lengths, 8192, resources={"encoder": -cost}, budgets={"encoder": 1.0})
    with pytest.raises(ValueError, match="does not support max_media"):
        plan(lengths, 8192, algorithm="ffd", resources={"encoder": cost}, budgets={"encoder": 1.0})


def test_a_budget_far_under_the_costs_puts_each_costly_sample_in_a_row_of_its_own():
    """cost / budget past float64's range (1e12 / 1e-300) overflowed the planner's integer units; each such sample
    is over the budget alone: it takes a row's whole budget, the samples of no encoder cost fill the rows around."""
    lengths = np.array([100, 100, 100, 100])
    cost = np.array([1e12, 1e12, 0.0, 0.0])
    p = plan(lengths, 8192, resources={"encoder": cost}, budgets={"encoder": 1e-300})
    assert p.over_budget["encoder"].tolist() == [0, 1] and p.n_bins == 2 and p.resource_bound == 2


def test_plans_with_a_budget_through_either_path_are_equal(monkeypatch):
    from packer.pack import _small

    lengths, cost = corpus(350, seed=4)  # 350 x 129 bin classes: under SMALL, the Python twin
    kwargs = dict(seed=3, resources={"encoder": cost}, budgets={"encoder": 2 * cost.mean() * 3})
    assert len(lengths) * (RESOURCE_UNITS + 1) < _small.SMALL
    small = plan(lengths, 8192, **kwargs)
    monkeypatch.setattr(_small, "SMALL", 0)
    large = plan(lengths, 8192, **kwargs)
    assert small.offsets.tolist() == large.offsets.tolist() and small.indices.tolist() == large.indices.tolist()


# ------------------------------------------------------------------ the build option


@pytest.mark.parametrize("value,match", [("often", "max_row_encoder"), ("auto:-1", r"auto:S \(S from 0 to 1000"),
                                         ("auto:1e308", r"max_row_encoder = 'auto:1e308': .*S from 0 to 1000"),
                                         ("auto:nan", "S from 0 to 1000"), ("0", "a finite number of at least 1e-12"),
                                         ("nan", "a finite number of at least 1e-12"), ("inf", "a finite number"),
                                         ("1e-300", "max_row_encoder = '1e-300': .*a finite number of at least 1e-12 in "
                                                    "the cost model's units"),
                                         ("5e-324", "a finite number of at least 1e-12")])
def test_malformed_max_row_encoder_is_refused_before_stage_one(value, match):
    from packer.config import BuildConfig
    from packer.errors import ConfigError

    with pytest.raises(ConfigError, match=match):
        BuildConfig(input=("x.jsonl",), max_row_encoder=value)


def test_a_build_with_a_row_budget_records_it_and_keeps_every_row_within_it(tmp_path):
    import json
    import os

    from packer.build import build
    from packer.config import resolve
    from packer.cost import CostModel
    from packer.loader import PackedDataset

    model = tmp_path / "cost.json"
    model.write_text(json.dumps({"image_token": 1.0, "image_square": 0.001, "audio_item": 300.0}))
    cwd = os.getcwd()
    os.chdir(ROOT)
    try:
        config = resolve(ROOT / "pipelines" / "sample.toml", output=str(tmp_path / "out"), cost_model=str(model),
                         max_row_encoder="auto:0.5")
        manifest = build(config, progress=False)
    finally:
        os.chdir(cwd)
    b = manifest.stats["row_budget"]
    assert b["setting"] == "auto:0.5" and b["budget"] > 0 and b["bound"] == max(b["token_bound"], b["encoder_bound"])
    ds = PackedDataset(tmp_path / "out")
    encoder = CostModel.of_build(ds.manifest).vector(ds.row_stats())[:, 1]
    assert len(encoder) == manifest.stats["rows"]
    assert (encoder <= b["budget"] * (1 + 1e-9)).all() or b["over_budget"] > 0
    from packer.report import report

    assert report(tmp_path / "out")["row_budget"] == b


def _auto(lengths: np.ndarray, cost: np.ndarray, capacity: int):
    import functools

    from packer.config import BuildConfig
    from packer.stages.planning import with_budget

    bound = -(-int(np.minimum(lengths, capacity).sum()) // capacity)
    budgets = BuildConfig(max_row_encoder="auto").encoder_budgets(float(cost.sum()), bound)
    return budgets, with_budget(functools.partial(plan, lengths, capacity, seed=0), cost, budgets)


def test_auto_is_the_default_and_keeps_the_tightest_budget_that_adds_no_row():
    """``auto`` plans under each of its budgets, tightest first, and keeps the first whose rows are no more than the
    plan's without a budget: on the bench's video-heavy corpus (H200-calibrated encoder costs) a budget applies, no
    row is added, every tighter budget would have added one, and the rows' encoder costs are closer together."""
    from bench_steps import MIXES, generate

    from packer.config import BuildConfig
    from packer.cost import CostModel

    assert BuildConfig().max_row_encoder == "auto"
    samples = generate(6000, MIXES["video-heavy"], 8192, seed=0)
    cost = CostModel.load(ROOT / "bench" / "calibrated_qwen3vl2b_h200.json").vector(samples)[:, 1]
    lengths = samples["tokens"].astype(np.int64)
    budgets, p = _auto(lengths, cost, 8192)
    free = plan(lengths, 8192, seed=0)
    assert len(budgets) == 8 and budgets == sorted(budgets) and p.n_bins <= free.n_bins
    chosen = budgets.index(p.budgets["encoder"])
    for tighter in budgets[:chosen]:
        assert plan(lengths, 8192, seed=0, resources={"encoder": cost}, budgets={"encoder": tighter}).n_bins > free.n_bins
    spread = lambda q: rows_of(q, cost).max() / rows_of(q, cost).mean()  # noqa: E731
    assert spread(p) < 0.7 * spread(free)


def test_auto_plans_without_a_budget_where_each_would_add_a_row_or_no_sample_has_an_encoder_cost():
    """Two rows of a whole capacity and two half rows holding all the encoder cost: three rows by tokens, but any
    budget up to 2 x the mean row's (2/3 of the cost each) keeps the two apart, a fourth row: ``auto`` applies none.
    Text only (no encoder cost): no budget is tried."""
    lengths = np.array([1000, 1000, 500, 500], np.int64)
    budgets, p = _auto(lengths, np.array([0.0, 0.0, 1.0, 1.0]), 1000)
    assert budgets and p.n_bins == 3 and p.budgets == {}
    budgets, p = _auto(lengths, np.zeros(4), 1000)
    assert budgets == [] and p.n_bins == 3 and p.budgets == {}


def test_the_summary_names_why_no_row_budget_applied_and_is_quiet_for_the_default_with_nothing_to_budget(tmp_path):
    """The default ``auto`` on a build no cost model charges an encoder: ``none`` says so and the summary has no row
    budget line. An explicit ``auto`` whose every budget would add a row: the line says that, not a bare "none"."""
    import os

    import pyarrow as pa

    from packer.build import build
    from packer.config import BuildConfig, resolve
    from packer.pack.plan import NO_ENCODER_COST
    from packer.pipeline.accounting import _budget_stats
    from packer.summary import summarize, summary_text

    cwd = os.getcwd()
    os.chdir(ROOT)
    try:
        config = resolve(ROOT / "pipelines" / "sample.toml", output=str(tmp_path / "out"))
        build(config, progress=False)
    finally:
        os.chdir(cwd)
    s = summarize(tmp_path / "out")
    assert s["row_budget"]["setting"] == "auto" and s["row_budget"]["none"] == NO_ENCODER_COST
    assert "row budget" not in summary_text(s)
    lengths, cost = np.array([1000, 1000, 500, 500], np.int64), [0.0, 0.0, 1.0, 1.0]  # as in the test above
    _, p = _auto(lengths, np.array(cost), 1000)
    s["row_budget"] = _budget_stats(BuildConfig(max_row_encoder="auto"), pa.table({"cost_encoder": cost}), p)
    assert s["row_budget"]["none"] == "each budget auto tried would add a row"
    assert "row budget   encoder none (each budget auto tried would add a row) a row (auto)" in summary_text(s)
