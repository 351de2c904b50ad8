"""Step plans balanced on the llm, encoder and supervised cost at once (packer.steps), the sampler that follows
them (StepPlanSampler: determinism, resume, every row once per epoch over the ranks) and the plan file."""

from __future__ import annotations

import shutil
import sys

import numpy as np
import pytest

from conftest import ROOT

sys.path.insert(0, str(ROOT / "bench"))

from packer.cost import CostModel  # noqa: E402
from packer.steps import Stage, check_stages, deal, measure, normalized, plan_stages, plan_steps, token_only  # noqa: E402


def generated(samples: int, mix: str = "video-heavy", seed: int = 0) -> np.ndarray:
    """Rows of the bench's generated corpus, packed at 8,192 tokens, as cost vectors of a Qwen3-VL-2B shape."""
    from bench_steps import MIXES, QWEN3_VL_2B, generate, rows_of

    rows, _ = rows_of(generate(samples, MIXES[mix], 8192, seed), 8192, seed)
    return CostModel.for_model(QWEN3_VL_2B).vector(rows)


@pytest.fixture(scope="module")
def costs():
    return generated(8000)


@pytest.mark.parametrize("ranks,per_rank", [(8, 1), (8, 4), (3, 2)])
def test_every_row_once_an_epoch_and_the_plan_is_a_function_of_seed_and_epoch(costs, ranks, per_rank):
    n = len(costs) - len(costs) % (ranks * per_rank)  # whole steps: no row repeated to pad
    a = plan_steps(costs[:n], ranks, per_rank, seed=3, epoch=1)
    assert a.shape == (n // (ranks * per_rank), ranks, per_rank)
    assert np.array_equal(np.sort(a.reshape(-1)), np.arange(n))
    assert np.array_equal(a, plan_steps(costs[:n], ranks, per_rank, seed=3, epoch=1))
    assert not np.array_equal(a, plan_steps(costs[:n], ranks, per_rank, seed=3, epoch=2))


def test_a_partial_last_step_is_completed_from_the_epoch_start_or_dropped(costs):
    n = 8 * 10 + 3
    full = plan_steps(costs[:n], 8, 1)
    assert full.shape == (11, 8, 1) and set(full.reshape(-1).tolist()) == set(range(n))
    assert plan_steps(costs[:n], 8, 1, drop_last=True).shape == (10, 8, 1)


def test_at_eight_ranks_every_cost_is_within_five_percent_and_beats_token_only(costs):
    """The issue's goal at 8 ranks (Σ slowest rank / Σ mean rank per cost), batch 1 and 4, on the generated
    video-heavy corpus; token-only balance (TokenBalancedSampler's plan) leaves the encoder and the supervised
    tokens far apart."""
    for per_rank in (1, 4):
        plan = measure(costs, plan_steps(costs, 8, per_rank))
        assert max(plan["llm"], plan["encoder"], plan["supervised"]) <= 1.05, plan
        tokens = token_only(costs, costs[:, 0], 8, per_rank)
        assert measure(costs, tokens)["encoder"] > plan["encoder"] + 0.05
        assert measure(costs, tokens)["supervised"] > plan["supervised"] + 0.05


def test_deal_balances_every_cost_of_a_step_where_one_cost_alone_cannot():
    """Two ranks x two rows: a video row and a text row each (encoder and supervised), never both videos."""
    c = np.array([[1.0, 4.0, 0.0], [1.0, 4.0, 0.0], [1.0, 0.0, 4.0], [1.0, 0.0, 4.0]])
    out = deal(np.arange(4), normalized(c), 2, 2)
    assert all(sorted(r) in ([0, 2], [0, 3], [1, 2], [1, 3]) for r in out.tolist())
    assert measure(c, out[None]) == {"llm": 1.0, "encoder": 1.0, "supervised": 1.0, "time": 6.0}


def test_measure_is_slowest_over_mean_per_cost_and_the_simulated_time():
    c = np.array([[2.0, 1.0, 3.0], [1.0, 0.0, 1.0]])
    m = measure(c, np.array([[[0], [1]]]))
    assert m == {"llm": 2 / 1.5, "encoder": 2.0, "supervised": 3 / 2, "time": 3.0}


def test_stages_draw_each_source_by_its_weights_and_cycle_a_source_that_runs_out():
    rng = np.random.default_rng(0)
    costs = rng.random((100, 3))
    source = np.repeat([0, 1], [80, 20])
    stages = [Stage(0, 10, {"text": 1.0}), Stage(10, 30, {"text": 1.0, "video": 3.0})]
    a = plan_stages(costs, source, ["text", "video"], stages, ranks=4, per_rank=1, seed=0, window=8)
    assert a.shape == (30, 4, 1)
    first, second = a[:10].reshape(-1), a[10:].reshape(-1)
    assert (source[first] == 0).all()
    assert (source[second] == 1).sum() == 60 and (source[second] == 0).sum() == 20  # 3:1 of 80 rows
    video = second[source[second] == 1]
    assert set(video.tolist()) == set(range(80, 100)) and np.bincount(video - 80).tolist() == [3] * 20  # each 3 times
    assert np.array_equal(a, plan_stages(costs, source, ["text", "video"], stages, ranks=4, seed=0, window=8))


@pytest.mark.parametrize("stages,match", [
    ([Stage(1, 5, {"a": 1})], "consecutively from step 0"),
    ([Stage(0, 5, {"a": 1}), Stage(6, 8, {"a": 1})], "consecutively"),
    ([Stage(0, 5, {"z": 1})], "not sources of this build"),
    ([Stage(0, 5, {"a": -1})], ">= 0"),
])
def test_stages_are_refused_with_the_fix(stages, match):
    with pytest.raises(ValueError, match=match):
        check_stages(stages, ["a", "b"])


# ------------------------------------------------------------------ the sampler and the written plan


@pytest.fixture(scope="module")
def build(sample_build, tmp_path_factory):
    out = tmp_path_factory.mktemp("steps") / "out"
    shutil.copytree(sample_build[0], out)
    return out


def sampler(build, **kw):
    from packer.loader import PackedDataset
    from packer.loader.samplers.step_plan import StepPlanSampler

    return StepPlanSampler(PackedDataset(build), **kw)


def test_the_ranks_together_train_every_row_once_an_epoch(build):
    ranks = 4
    n = len(sampler(build, num_replicas=ranks, rank=0).costs)
    got = [list(sampler(build, num_replicas=ranks, rank=r, batch_size=2)) for r in range(ranks)]
    assert len({len(g) for g in got}) == 1  # every rank the same number of steps
    rows = [i for g in got for i in g]
    assert set(rows) == set(range(n)) and len(rows) - n < ranks * 2  # padding repeats less than a step


def test_resume_mid_epoch_continues_exactly(build):
    s = sampler(build, num_replicas=2, rank=1, seed=5)
    s.set_epoch(1)
    whole = list(s)
    s.set_epoch(1)
    it = iter(s)
    head = [next(it) for _ in range(5)]
    state = s.state_dict()
    t = sampler(build, num_replicas=2, rank=1, seed=5)
    t.load_state_dict(state)
    assert head + list(t) == whole


def test_a_written_plan_is_what_the_sampler_computes_and_verify_accepts_it(build):
    from packer.loader.samplers.step_plan import plan_command
    from packer.verify import verify

    meta = plan_command(str(build), ranks=2, batch_size=2, epochs=2, seed=7)
    for epoch in (0, 1):
        planned = sampler(build, num_replicas=2, rank=1, batch_size=2, seed=7, plan=meta["path"])
        computed = sampler(build, num_replicas=2, rank=1, batch_size=2, seed=7)
        planned.set_epoch(epoch), computed.set_epoch(epoch)
        assert list(planned) == list(computed)
    assert meta["balance"]["plan"]["llm"] < meta["balance"]["random"]["llm"]
    assert verify(build)[0] == []
    other = build / "steps" / "stale.arrow"
    shutil.copy(meta["path"], other)
    from packer.shards.step_plan import read_plan, write

    stale = read_plan(other)
    write(other, [stale.epoch(0)], {**stale.meta, "build": "0" * 64, "epochs": 1})
    problems = verify(build)[0]
    assert len(problems) == 1 and "a step plan of other rows" in str(problems[0]), problems
    other.unlink()
    with pytest.raises(ValueError, match="made for ranks = 2, this run has 4"):
        sampler(build, num_replicas=4, rank=0, batch_size=2, plan=meta["path"])
    planned.set_epoch(2)
    with pytest.raises(ValueError, match="holds 2 epoch"):
        list(planned)


def test_the_report_shows_each_cost_for_random_steps_token_only_and_the_plan(build):
    from packer.report import report

    by_ranks = report(build)["rank_imbalance"]["by_ranks"]
    shown = [v for v in by_ranks.values() if v]
    assert shown
    for v in shown:
        assert set(v["costs"]) == {"random", "sampler", "plan"}
        assert all(set(c) == {"llm", "encoder", "supervised", "time"} for c in v["costs"].values())
        assert v["costs"]["plan"]["supervised"] < v["costs"]["random"]["supervised"]
        assert v["costs"]["plan"]["llm"] < v["costs"]["random"]["llm"]


def test_a_staged_plan_accounts_each_stage_by_source_and_the_sampler_follows_it(build, tmp_path):
    from packer.loader.samplers.step_plan import plan_command

    stages = tmp_path / "stages.toml"
    stages.write_text('[[stages]]\nstart = 0\nend = 4\nweights = { "sample_data/chat.jsonl" = 1.0 }\n'
                      '[[stages]]\nstart = 4\nend = 10\n'
                      'weights = { "sample_data/chat.jsonl" = 1.0, "sample_data/llava.jsonl" = 2.0 }\n')
    meta = plan_command(str(build), ranks=2, batch_size=2, stages=str(stages))
    assert meta["path"].endswith("-stages.arrow") and meta["steps_per_epoch"] == 10
    first, second = (s["drawn"] for s in meta["stages"])
    assert set(first) == {"sample_data/chat.jsonl"} and first["sample_data/chat.jsonl"]["rows"] == 16
    assert {k: v["rows"] for k, v in second.items()} == {"sample_data/chat.jsonl": 8, "sample_data/llava.jsonl": 16}
    planned = sampler(build, num_replicas=2, rank=0, batch_size=2, plan=meta["path"])
    assert len(list(planned)) == 10 * 2
    stages.write_text('[[stages]]\nstart = 0\nend = 4\nweights = { "nope.jsonl" = 1.0 }\n')
    with pytest.raises(ValueError, match="not sources of this build"):
        plan_command(str(build), ranks=2, stages=str(stages))


def test_accumulation_balances_a_ranks_rows_of_an_optimizer_step_together(costs):
    """Under DDP's no_sync the ranks wait only at the optimizer step: a rank's 4 micro-steps x 1 row are dealt as
    one, which evens them better than 4 balanced micro-steps do, and every row still comes once."""
    n = len(costs) - len(costs) % 32
    a = plan_steps(costs[:n], 8, 1, accumulation=4)
    assert a.shape == (n // 8, 8, 1) and np.array_equal(np.sort(a.reshape(-1)), np.arange(n))
    together, apart = measure(costs, a, accumulation=4), measure(costs, plan_steps(costs[:n], 8, 1), accumulation=4)
    assert max(together["encoder"], together["supervised"]) <= 1.02, together
    assert together["supervised"] < apart["supervised"]


def test_the_sampler_with_accumulation_follows_the_written_plan(build):
    from packer.loader.samplers.step_plan import plan_command

    meta = plan_command(str(build), ranks=2, batch_size=1, accumulation=3)
    assert "accumulation3" in meta["path"]
    for rank in (0, 1):
        planned = sampler(build, num_replicas=2, rank=rank, plan=meta["path"], accumulation=3)
        assert list(planned) == list(sampler(build, num_replicas=2, rank=rank, accumulation=3))
    with pytest.raises(ValueError, match="made for accumulation = 3, this run has 1"):
        sampler(build, num_replicas=2, rank=0, plan=meta["path"])


@pytest.mark.parametrize("text, match", [
    ("x\n", r"stages.toml: not valid TOML: Expected '='"),
    ("title = 1\n", r"stages.toml holds no \[\[stages\]\] table"),
    ('[[stages]]\nstart = 0\nend = -1\nweights = { "a" = 1 }\n',
     r"stages.toml: stage start = 0, end = -1, weights = \{'a': 1.0\}: each: start, end \(steps, 0 <= start < end\)"),
    ('[[stages]]\nstart = 0\nend = 4\nweights = { "a" = nan }\n', r"stage start = 0, end = 4, weights = \{'a': nan\}"),
    ('[[stages]]\nstart = 0\nend = 4\n', r"each \[\[stages\]\] table needs start, end and weights"),
    ('[[stages]]\nstart = 0\nend = 4\nweights = { "nope.jsonl" = 1.0 }\n', "which are not sources of this build"),
])
def test_a_stages_file_packer_steps_cannot_use_is_one_line_exit_2(build, tmp_path, text, match):
    """A configuration error of `packer steps`, never a traceback: the library's checks raise ArgumentError, a
    ValueError to a caller of the library and a one-line error (exit 2) to the command line."""
    import re

    from click.testing import CliRunner

    from packer.cli import main
    from packer.errors import ArgumentError

    stages = tmp_path / "stages.toml"
    stages.write_text(text)
    r = CliRunner().invoke(main, ["steps", str(build), "--ranks", "2", "--stages", str(stages), "-o",
                                  str(tmp_path / "plan.arrow")])
    assert r.exit_code == 2 and r.stderr.count("\n") == 1 and re.search(match, r.stderr), r.output
    assert issubclass(ArgumentError, ValueError) and not (tmp_path / "plan.arrow").exists()
