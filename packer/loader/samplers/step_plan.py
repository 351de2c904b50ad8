"""StepPlanSampler: each rank's rows at every step from a step plan balanced on the llm, encoder and supervised
cost of the rows at once (:mod:`packer.steps`), written offline (``packer steps OUT``) or computed the same way.

    sampler = StepPlanSampler(ds, batch_size=1)                     # plans each epoch itself (seed + epoch)
    sampler = StepPlanSampler(ds, plan="OUT/steps/ranks8-batch1-seed0.arrow")   # follows a written plan

A written plan holds its epochs (or its stages' steps), the ranks and rows per rank it was made for, the seed,
window and cost model; the sampler refuses one made for another world size, batch size or build, with the fix.
Without a file, the plan of an epoch is :func:`packer.steps.plan_steps` of the rows' cost vectors under the
build's cost model, a pure function of (seed, epoch): every rank computes the same plan, and a resumed run
(``state_dict`` / ``load_state_dict``, as every packer sampler) continues exactly where it stopped.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from packer.cost import COSTS, CostModel
from packer.errors import ArgumentError
from packer.loader.samplers._dist import ResumableMixin, world
from packer.shards.step_plan import PlanFile, read_plan, rows_identity, write
from packer.steps import Stage, measure, plan_stages, plan_steps, random_steps


class StepPlanSampler(ResumableMixin, torch.utils.data.Sampler):
    def __init__(self, dataset, *, num_replicas: int | None = None, rank: int | None = None, batch_size: int = 1,
                 seed: int = 0, shuffle: bool = True, drop_last: bool = False, cost: CostModel | None = None,
                 window: int | None = None, accumulation: int = 1, plan: str | Path | None = None):
        self.num_replicas, self.rank = world(num_replicas, rank)
        if batch_size < 1:
            raise ValueError(f"batch_size must be positive, got {batch_size}")
        if hasattr(dataset, "family"):  # a family whose model takes a batch's items in one call (issue 33)
            from packer.loader.derive import check_batches

            check_batches(dataset, batch_size)
        self.batch_size, self.seed, self.shuffle, self.drop_last = batch_size, seed, shuffle, drop_last
        self.accumulation = accumulation
        self.rows = len(dataset)
        self.window = window  # None: the whole epoch (packer.steps)
        self.file = None
        if plan is not None:
            self.file = read_plan(plan)
            check_plan(self.file, dataset, self.num_replicas, batch_size, accumulation)
            self.seed = int(self.file.meta["seed"])
            self.steps = int(self.file.meta["steps_per_epoch"])
            return
        self.costs = row_costs(dataset, cost)
        per_step = self.num_replicas * batch_size * accumulation
        steps = self.rows // per_step if drop_last else -(-self.rows // per_step)
        if steps == 0:
            raise ValueError(f"{self.rows} rows cannot fill one step of {self.num_replicas} x {batch_size} x "
                             f"{accumulation} with drop_last=True")
        self.steps = steps * accumulation  # micro-steps

    def assignment(self, epoch: int | None = None) -> np.ndarray:
        """``[steps, num_replicas, batch_size]`` row numbers for an epoch (every rank's view)."""
        epoch = self.epoch if epoch is None else epoch
        if self.file is not None:
            return self.file.epoch(epoch)
        return plan_steps(self.costs, self.num_replicas, self.batch_size, seed=self.seed, epoch=epoch,
                          window=self.window, shuffle=self.shuffle, drop_last=self.drop_last,
                          accumulation=self.accumulation)


def row_costs(dataset, cost: CostModel | None = None) -> np.ndarray:
    """``float64 [rows, 3]``: each row's llm, encoder and supervised cost under ``cost`` (by default the build's
    cost model, as its manifest records it, else ``CostModel()``)."""
    return (cost or CostModel.of_build(dataset.manifest)).vector(dataset.row_stats())


def row_sources(dataset) -> np.ndarray:
    """Each row's source: the ``input`` entry its first segment's file came from (``manifest.input_sources``)."""
    import pyarrow.compute as pc

    first = np.concatenate([pc.list_element(dataset._table(k).column("segment_source"), 0).to_numpy()
                            for k in range(len(dataset.entries))] or [np.zeros(0, np.int64)]).astype(np.int64)
    of_file = np.asarray(dataset.manifest.input_sources or range(len(dataset.manifest.inputs)), np.int64)
    return of_file[first] if len(first) else first


def source_names(manifest) -> list[str]:
    """The build's sources by number: each ``input`` entry's pattern (the part before any ``#weight=...``)."""
    from packer.mix import Source

    return [Source.parse(spec).pattern for spec in manifest.config.get("input", [])]


def write_plan(out: str | Path, path: str | Path, *, ranks: int, batch_size: int = 1, epochs: int = 1, seed: int = 0,
               window: int | None = None, cost: CostModel | None = None, stages: list[Stage] | None = None,
               accumulation: int = 1) -> dict:
    """Plan ``epochs`` epochs (or the ``stages``' steps: one "epoch" of them) of the build at ``out`` for ``ranks``
    x ``batch_size`` rows a step and write them to ``path`` (Arrow: epoch, step, rows; the settings and the
    balance figures in its metadata). Returns the metadata."""
    from packer.loader.dataset import PackedDataset

    ds = PackedDataset(out, check_media=False)
    model = cost or CostModel.of_build(ds.manifest)
    stats = ds.row_stats()
    costs = model.vector(stats)
    accounting = []
    if stages and accumulation > 1:
        raise ArgumentError("a staged plan is made in micro-steps of their own: plan stages with accumulation 1")
    if stages:
        names, source = source_names(ds.manifest), row_sources(ds)
        plans = [plan_stages(costs, source, names, stages, ranks, batch_size, seed=seed, window=window)]
        accounting = stage_accounting(plans[0], stages, source, names, stats["tokens"], costs)
    else:
        window = window or -(-len(costs) // (ranks * batch_size))
        plans = [plan_steps(costs, ranks, batch_size, seed=seed, epoch=e, window=window, accumulation=accumulation)
                 for e in range(epochs)]
    meta = {"ranks": ranks, "batch_size": batch_size, "accumulation": accumulation, "epochs": len(plans),
            "steps_per_epoch": len(plans[0]),
            "seed": seed, "window": window, "rows": len(costs), "build": rows_identity(ds.entries),
            "cost_model": {f: getattr(model, f) for f in model.__dataclass_fields__},
            "stages": [{"start": s.start, "end": s.end, "weights": s.weights, "drawn": a}
                       for s, a in zip(stages or [], accounting, strict=False)],
            "balance": {"random": measure(costs, random_steps(len(costs), ranks, batch_size * accumulation, seed), COSTS),
                        "plan": measure(costs, plans[0], COSTS, accumulation)}}
    write(path, plans, meta)
    return meta


def stage_accounting(plan: np.ndarray, stages: list[Stage], source: np.ndarray, names: list[str], tokens: np.ndarray,
                     costs: np.ndarray) -> list[dict]:
    """Per stage, per source: rows drawn (repeats counted), distinct rows, tokens and supervised tokens."""
    out = []
    for stage in stages:
        rows = plan[stage.start : stage.end].reshape(-1)
        by = {}
        for s, name in enumerate(names):
            mine = rows[source[rows] == s]
            if len(mine):
                by[name] = {"rows": int(len(mine)), "distinct_rows": int(len(np.unique(mine))),
                            "tokens": int(tokens[mine].sum()), "supervised": int(costs[mine, 2].sum())}
        out.append(by)
    return out


def check_plan(plan: PlanFile, dataset, ranks: int, batch_size: int, accumulation: int = 1) -> None:
    m = plan.meta
    for name, have, want in (("ranks", ranks, m["ranks"]), ("batch_size", batch_size, m["batch_size"]),
                             ("accumulation", accumulation, m.get("accumulation", 1)),
                             ("rows", len(dataset), m["rows"]), ("build", rows_identity(dataset.entries), m["build"])):
        if have != want:
            raise ValueError(f"the step plan was made for {name} = {want!r}, this run has {have!r}: write a plan for "
                             f"this set-up (`packer steps OUT --ranks {ranks} --batch-size {batch_size} --accumulation "
                             f"{accumulation}`) or pass "
                             f"plan=None to plan each epoch here")


def plan_command(out: str, *, ranks: int, batch_size: int = 1, epochs: int = 1, seed: int = 0, window: int | None = None,
                 cost_model: str | None = None, stages: str | None = None, output: str | None = None,
                 accumulation: int = 1) -> dict:
    """``packer steps``: :func:`write_plan` with a cost model file and a stages file read; the metadata and path."""
    from packer.shards.step_plan import FOLDER

    accumulated = f"-accumulation{accumulation}" if accumulation > 1 else ""
    name = f"ranks{ranks}-batch{batch_size}{accumulated}-seed{seed}{'-stages' if stages else ''}.arrow"
    path = Path(output) if output else Path(out) / FOLDER / name
    meta = write_plan(out, path, ranks=ranks, batch_size=batch_size, epochs=epochs, seed=seed, window=window,
                      cost=CostModel.load(cost_model) if cost_model else None,
                      stages=read_stages(stages) if stages else None, accumulation=accumulation)
    return {**meta, "path": str(path)}


def read_stages(path: str | Path) -> list[Stage]:
    """``[[stages]]`` tables of a TOML file: ``start``, ``end`` (steps), ``weights`` (source pattern -> weight)."""
    import math
    import tomllib

    shape = "each: start, end (steps, 0 <= start < end), weights = {source = weight >= 0}"
    try:
        tables = tomllib.loads(Path(path).read_text(encoding="utf-8")).get("stages") or []
    except tomllib.TOMLDecodeError as e:
        raise ArgumentError(f"{path}: not valid TOML: {e}") from None
    if not tables or not isinstance(tables, list):
        raise ArgumentError(f"{path} holds no [[stages]] table ({shape})")
    try:
        stages = [Stage(int(t["start"]), int(t["end"]), {str(k): float(v) for k, v in t["weights"].items()})
                  for t in tables]
    except (KeyError, TypeError, ValueError, AttributeError, OverflowError) as e:
        raise ArgumentError(f"{path}: each [[stages]] table needs start, end and weights = {{source = weight}} "
                          f"({type(e).__name__}: {e})") from None
    for s in stages:  # an end before its start made a negative window deep in the planner
        if not 0 <= s.start < s.end or not all(0 <= w < math.inf for w in s.weights.values()):
            raise ArgumentError(f"{path}: stage start = {s.start}, end = {s.end}, weights = {s.weights}: {shape}")
    return stages


def summary_text(meta: dict) -> str:
    b = meta["balance"]
    lines = [f"{meta['path']}: {meta['epochs']} epoch(s) x {meta['steps_per_epoch']:,} steps of {meta['ranks']} ranks x "
             f"{meta['batch_size']} rows ({meta['rows']:,} rows)",
             "  Σ slowest rank / Σ mean rank    " + "  ".join(f"{c:>10}" for c in COSTS)]
    for name in ("random", "plan"):
        lines.append(f"  {name:<30} " + "  ".join(f"{b[name][c]:10.3f}" for c in COSTS))
    for stage in meta["stages"]:
        lines.append(f"  stage {stage['start']}-{stage['end']}: " + ", ".join(
            f"{src} {d['rows']:,} rows ({d['distinct_rows']:,} distinct), {d['tokens']:,} tokens"
            for src, d in stage["drawn"].items()))
    return "\n".join(lines)
