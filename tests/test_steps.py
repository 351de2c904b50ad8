"""Step plans balanced on the llm, encoder and supervised cost at once (packer.schedule.steps), the sampler that follows
them (StepPlanSampler: determinism, resume, every row once per epoch over the ranks) and the plan file."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import numpy as np
import pytest

from conftest import ROOT

sys.path.insert(0, str(ROOT / "bench"))

from packer.cost import CostModel  # noqa: E402
from packer.schedule.grouping import group, regroup  # noqa: E402
from packer.schedule.steps import Stage, check_stages, deal, measure, normalized, plan_stages, plan_steps, token_only  # noqa: E402


def generated(samples: int, mix: str = "video-heavy", seed: int = 0, model: CostModel | None = None) -> np.ndarray:
    """Rows of the bench's generated corpus, packed at 8,192 tokens, as cost vectors of a Qwen3-VL-2B shape (or of
    ``model``)."""
    from bench_steps import MIXES, QWEN3_VL_2B, generate, rows_of

    rows, _ = rows_of(generate(samples, MIXES[mix], 8192, seed), 8192, seed)
    return (model or CostModel.for_model(QWEN3_VL_2B)).vector(rows)


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


def test_at_one_row_a_rank_the_plan_regroups_rows_of_several_steps_toward_its_worst_cost(costs):
    """At 8 ranks x 1 row only which rows share a step counts. The k-d split and the swaps of two rows between
    neighbouring steps left the worst cost at 1.0446 on the FLOP model's rows and 1.0545 under the H200-calibrated
    model (the goal: 1.05); splitting each step with its nearest steps again, toward the worst cost, brings them to
    1.0368 and 1.0465 (8,000 samples of the bench's video-heavy mix; docs/BENCHMARKS.md, "Step plans")."""
    calibrated = generated(8000, model=CostModel.load(ROOT / "bench" / "calibrated_qwen3vl2b_h200.json"))
    for rows, most in ((costs, 1.04), (calibrated, 1.05)):
        plan = measure(rows, plan_steps(rows, 8, 1))
        assert max(plan["llm"], plan["encoder"], plan["supervised"]) <= most, plan


def test_regroup_keeps_every_row_and_never_raises_the_worst_figure(costs):
    c = normalized(costs[:800])
    before = group(np.arange(800), c, 8)
    after = regroup(before, c)
    assert len(after) == len(before) and np.array_equal(np.sort(np.concatenate(after)), np.arange(800))
    worst = [np.stack([c[s].max(0) for s in p]).sum(0).max() for p in (before, after)]
    assert worst[1] < worst[0]


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
    with pytest.raises(ValueError, match="holds 2 epoch"):  # refused when the epoch is set, before any row
        planned.set_epoch(2)


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


# ------------------------------------------------------------------ refusals: one line, exit 2, value and fix

C, L = '"sample_data/chat.jsonl"', '"sample_data/llava.jsonl"'


def stage(start, end, weights=f"{{ {C} = 1.0 }}"):
    return f"[[stages]]\nstart = {start}\nend = {end}\nweights = {weights}\n"


def steps_cli(build, *args):
    from click.testing import CliRunner

    from packer.cli import main

    return CliRunner().invoke(main, ["steps", str(build), *map(str, args)])


def files_of(build):
    return {p.relative_to(build).as_posix(): p.read_bytes() for p in sorted(build.rglob("*")) if p.is_file()}


@pytest.mark.parametrize("args,stages,match", [
    (["--ranks", 500], None, r"26 rows make no whole step of 500 ranks x 1 rows \(500 rows a step\): use at most 26 ranks"),
    (["--ranks", 1_000_000_000], None, "no whole step of 1,000,000,000 ranks"),
    (["--ranks", 1, "--batch-size", 1_000_000_000], None, "no whole step .* use batch size 1"),
    (["--ranks", 2, "--seed", -5], None, "-5 is not in the range x>=0"),
    (["--ranks", 2, "--epochs", 100_000], None, "more than 26,000 .*plan fewer epochs"),
    (["--ranks", 2], "", "holds no \\[\\[stages\\]\\] table"),
    (["--ranks", 2], "stages = [", "is not TOML"),
    (["--ranks", 2], stage(0, 4) + stage(3, 6), "stage 3-6 starts at step 3, it overlaps the stage before, which ends at "
                                                "step 4; start it at step 4"),
    (["--ranks", 2], stage(0, 4) + stage(5, 6), "steps 4-5 belong to no stage \\(a gap\\); start it at step 4"),
    (["--ranks", 2], stage(-2, 4), "stage -2-4 is negative"),
    (["--ranks", 2], stage(0, 0), "stage 0-0 is empty"),
    (["--ranks", 2], stage(0, 4, f"{{ {C} = 0 }}"), "every weight is 0"),
    (["--ranks", 2], stage(0, 4, f"{{ {C} = -1 }}"), ">= 0 and finite, got .*-1"),
    (["--ranks", 2], stage(0, 4, f"{{ {C} = nan }}"), ">= 0 and finite, got .*nan"),
    (["--ranks", 2], stage(0, 4, '{ "sample_data/chatt.jsonl" = 1 }'), "did you mean 'sample_data/chat.jsonl'"),
    (["--ranks", 2], stage(0, 4, '{ "sample_data/*.jsonl" = 1 }'), "is a glob over the sources .*weigh each by its name"),
    (["--ranks", 2], "[[stages]]\nstart = 0\nend = 4\n", "table 1 lacks \\['weights'\\]"),
    (["--ranks", 2, "--accumulation", 2], stage(0, 4), "stages with accumulation 2: .*--accumulation 1"),
    (["--ranks", 2], stage(0, 10**10), "the stages end at step 10,000,000,000: .*end the last stage by step 13,000"),
    (["--ranks", 2], stage(0, "1e30"), "end = 1e\\+30 is not a whole number of steps"),
])
def test_packer_steps_refuses_each_bad_setting_in_one_line_with_exit_2(build, tmp_path, args, stages, match):
    """Every setting no plan of the build can have: one line naming the value and the fix, exit 2, no traceback,
    nothing written (a stage to step 1e10 was killed for memory, one to 1e30 accepted)."""
    import re

    before = files_of(build)
    if stages is not None:
        (tmp_path / "stages.toml").write_text(stages)
        args = [*args, "--stages", tmp_path / "stages.toml"]
    result = steps_cli(build, *args)
    assert result.exit_code == 2, result.output
    lines = result.output.strip().splitlines()
    assert re.search(match, lines[-1]) and "Traceback" not in result.output, result.output
    assert len(lines) == 1 or lines[-1].startswith("Error: Invalid value"), result.output  # click's own: usage first
    assert files_of(build) == before


def test_the_planner_and_the_sampler_refuse_settings_they_would_misread(build, costs):
    """window=0 was read as the whole epoch, accumulation=0 divided by zero, a negative seed failed inside numpy."""
    from packer.errors import ArgumentError

    with pytest.raises(ArgumentError, match="window must be at least one step, got 0"):
        plan_steps(costs[:64], 8, window=0)
    with pytest.raises(ArgumentError, match="seed = -5 is below 0"):
        plan_steps(costs[:64], 8, seed=-5)
    for kw, match in (({"accumulation": 0}, "accumulation = 0 is below 1"), ({"window": 0}, "window = 0 is below 1"),
                      ({"seed": -5}, "seed = -5 is below 0"), ({"num_replicas": 64, "rank": 0}, "26 rows make no whole step"),
                      ({"batch_size": 9, "num_replicas": 3, "rank": 0}, "use at most 2 ranks at batch size 9")):
        with pytest.raises(ValueError, match=match):
            sampler(build, **kw)


def test_the_sampler_refuses_a_seed_window_or_epochs_its_plan_file_does_not_have(build):
    from packer.loader.samplers.step_plan import plan_command

    meta = plan_command(str(build), ranks=2, seed=7)
    assert sampler(build, num_replicas=2, rank=0, plan=meta["path"]).seed == 7  # no seed given: the plan's
    with pytest.raises(ValueError, match="seed = 3, but the step plan was made with seed = 7: .*leave seed out"):
        sampler(build, num_replicas=2, rank=0, seed=3, plan=meta["path"])
    with pytest.raises(ValueError, match="window = 2, but the step plan was made with window = 13"):
        sampler(build, num_replicas=2, rank=0, window=2, plan=meta["path"])
    with pytest.raises(ValueError, match=r"holds 1 epoch\(s\), this run trains 3: .*--epochs 3"):
        sampler(build, num_replicas=2, rank=0, plan=meta["path"], epochs=3)
    sampler(build, num_replicas=2, rank=0, plan=meta["path"], epochs=1)


def test_the_sampler_refuses_a_shuffle_or_drop_last_its_plan_file_does_not_have(build):
    """A plan's order (shuffled over each epoch) and last step (completed from the epoch's start) are fixed when it is
    written: shuffle=False or drop_last=True beside a plan file were silently ignored, the plan's rows dealt anyway."""
    from packer.loader.samplers.step_plan import plan_command

    meta = plan_command(str(build), ranks=4, seed=7)  # 26 rows: 7 steps of 4, the last completed from the start
    with pytest.raises(ValueError, match=r"shuffle = False, but the step plan was made with shuffle = True \(its steps "
                                         r"are shuffled over each epoch\): .*leave shuffle out .*or pass plan=None"):
        sampler(build, num_replicas=4, rank=0, shuffle=False, plan=meta["path"])
    with pytest.raises(ValueError, match=r"drop_last = True, but the step plan was made with drop_last = False \(it "
                                         r"trains every row each epoch.*leave drop_last out .*or pass plan=None"):
        sampler(build, num_replicas=4, rank=0, drop_last=True, plan=meta["path"])
    follow = sampler(build, num_replicas=4, rank=0, shuffle=True, drop_last=False, plan=meta["path"])  # the plan's own
    assert list(follow) == list(sampler(build, num_replicas=4, rank=0, seed=7))


def test_a_plan_naming_rows_outside_the_build_is_refused_by_verify_and_the_sampler(build):
    from packer.loader.samplers.step_plan import plan_command
    from packer.shards.step_plan import read_plan, write
    from packer.verify import verify

    meta = plan_command(str(build), ranks=2, seed=11)
    good = read_plan(meta["path"])
    try:
        for bad_row in (10**9, -1):
            rows = good.epoch(0).copy()
            rows[3, 1, 0] = bad_row
            write(meta["path"], [rows], good.meta)
            problems = verify(build)[0]
            assert len(problems) == 1 and f"names row {bad_row}, outside the build's rows 0-25" in str(problems[0])
            with pytest.raises(ValueError, match=f"names row {bad_row}, outside the build's rows 0-25"):
                sampler(build, num_replicas=2, rank=0, plan=meta["path"])
    finally:
        Path(meta["path"]).unlink()


def test_packer_steps_writes_over_no_file_of_the_build_and_nothing_but_a_plan(build, tmp_path):
    before = files_of(build)
    shard = next(p for p in before if p.startswith("packed/"))
    for target in ("manifest.json", "plan.arrow", shard, "steps/notes.txt"):
        result = steps_cli(build, "--ranks", 2, "-o", build / target)
        assert result.exit_code == 2 and "is inside the build" in result.output and "steps/NAME.arrow" in result.output
    mine = tmp_path / "notes.txt"
    mine.write_text("mine")
    result = steps_cli(build, "--ranks", 2, "-o", mine)
    assert result.exit_code == 2 and "exists and is not a step plan" in result.output and mine.read_text() == "mine"
    assert files_of(build) == before
    assert steps_cli(build, "--ranks", 2, "-o", tmp_path / "plan.arrow").exit_code == 0
    assert steps_cli(build, "--ranks", 2, "-o", tmp_path / "plan.arrow").exit_code == 0  # over its own plan: fine


def test_a_rerun_removes_what_an_interrupted_plan_write_left(build, tmp_path):
    """kill -9 leaves ``NAME.arrow.tmp-*`` (the atomic write's temporary): verify names it and the fix, and the next
    packer steps removes it (it holds the build's lock, so no other writer's file is taken), as a build does its own."""
    from packer.verify import verify

    stale = [build / "steps" / "ranks2-batch1-seed0.arrow.tmp-abc123", build / "steps" / "ranks4-batch1-seed0.arrow.tmp-x"]
    for p in stale:
        p.parent.mkdir(exist_ok=True)
        p.write_bytes(b"ARROW1 half")
    problems = verify(build)[0]
    assert len(problems) == 2 and all("unfinished write (packer steps was killed): run packer steps again" in str(p)
                                      for p in problems), problems
    result = steps_cli(build, "--ranks", 2)
    assert result.exit_code == 0, result.output
    assert not any(p.exists() for p in stale) and verify(build)[0] == []
    elsewhere = tmp_path / "plan.arrow"
    left = tmp_path / "plan.arrow.tmp-q1w2", tmp_path / "other.arrow.tmp-q1w2"
    for p in left:
        p.write_bytes(b"half")
    assert steps_cli(build, "--ranks", 2, "-o", elsewhere).exit_code == 0
    assert not left[0].exists() and left[1].exists()  # outside the build: its own target's leftovers only


def test_the_encoder_figure_is_absent_with_its_reason_where_the_cost_model_charges_no_media(build, tmp_path):
    """sample_data's processor folder has no config.json: CostModel() charges no media, so every step's encoder cost
    is 0 and its balance would print as a perfect 1.000."""
    from packer.loader.samplers.step_plan import plan_command, summary_text

    meta = plan_command(str(build), ranks=2)
    assert meta["balance"]["plan"]["encoder"] is None and meta["balance"]["random"]["encoder"] is None
    assert "charges no media (no model config.json" in meta["absent"]["encoder"]
    text = summary_text(meta)
    assert "encoder: no figure: the cost model charges no media" in text and "1.000" not in text.split("\n")[3]
    model = tmp_path / "cost.json"
    model.write_text('{"image_token": 2.0, "audio_token": 1.0}')
    charged = plan_command(str(build), ranks=2, cost_model=str(model), output=str(tmp_path / "p.arrow"))
    assert charged["absent"] == {} and charged["balance"]["plan"]["encoder"] > 1.0


@pytest.mark.parametrize("text, match", [
    ("x\n", r"stages.toml is not TOML \(Expected '='"),
    ("title = 1\n", r"stages.toml holds \['title'\], not only \[\[stages\]\]"),
    ('[[stages]]\nstart = 0\nend = -1\nweights = { "a" = 1 }\n', r"stage 0--1 is negative; give end > start >= 0"),
    ('[[stages]]\nstart = 0\nend = 4\nweights = { "sample_data/chat.jsonl" = nan }\n', r"weights must be >= 0 and finite, got \{'sample_data/chat.jsonl': nan\}"),
    ('[[stages]]\nstart = 0\nend = 4\n', r"\[\[stages\]\] table 1 lacks \['weights'\]"),
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


def test_the_report_prints_no_encoder_figure_where_the_cost_model_charges_no_media(build):
    """The report's per-cost rows (random order, TokenBalancedSampler, the step plan) printed encoder 1.000 -- a perfect
    balance -- where the build's cost model charges no media (sample_data's processor folder has no config.json)."""
    import copy

    from packer.loader import PackedDataset
    from packer.report import report
    from packer.report.compute import step_balance
    from packer.report.html import render
    from packer.shards.manifest import Manifest

    r = report(build)
    b = r["rank_imbalance"]
    assert "the cost model charges no media (no model config.json" in b["absent"]["encoder"]
    assert "build with --cost-model" in b["absent"]["encoder"] and set(b["absent"]) == {"encoder"}
    shown = [v for v in b["by_ranks"].values() if v]
    assert shown and all(c["encoder"] is None and c["llm"] > 1.0 for v in shown for c in v["costs"].values())
    page = render(r)
    table = page[page.index("step plan (packer steps, StepPlanSampler)"):]
    assert "<td class=\"n\">&ndash;</td>" in table.split("</tr>")[0] and "encoder: no figure (&ndash;): the cost model " \
        "charges no media" in page
    assert "media towers)" not in page  # the token-only table's CostModel() charges none

    manifest = Manifest.read(build)  # a cost model that charges images: every order has its encoder figure
    charged = copy.deepcopy(manifest)
    charged.stats["cost_model"] = {"coefficients": {"image_token": 2.0}, "note": "given"}
    stats = PackedDataset(build, check_media=False).row_stats()
    b = step_balance(stats, charged, seed=0)
    assert b["absent"] == {} and all(c["encoder"] >= 1.0 for v in b["by_ranks"].values() if v
                                     for c in v["costs"].values())
    assert step_balance(stats, manifest, seed=0)["absent"].keys() == {"encoder"}
