"""StepPlanSampler: each rank's rows at every step from a step plan balanced on the llm, encoder and supervised
cost of the rows at once (:mod:`packer.schedule.steps`), written offline (``packer steps OUT``) or computed the same way.

    sampler = StepPlanSampler(ds, batch_size=1)                     # plans each epoch itself (seed + epoch)
    sampler = StepPlanSampler(ds, plan="OUT/steps/ranks8-batch1-seed0.arrow")   # follows a written plan

A written plan holds its epochs (or its stages' steps), the ranks and rows per rank it was made for, the seed,
window and cost model; the sampler refuses one made for another world size, batch size or build, with the fix.
Without a file, the plan of an epoch is :func:`packer.schedule.steps.plan_steps` of the rows' cost vectors under the
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
from packer.schedule.steps import (
    Stage,
    absent_costs,
    check_settings,
    check_stages,
    cost_note,
    measure,
    plan_stages,
    plan_steps,
    random_steps,
)
from packer.shards.step_plan import PlanFile, read_plan, rows_identity, write


class StepPlanSampler(ResumableMixin, torch.utils.data.Sampler):
    """``plan``: a plan file to follow; its seed, window and cost model are the plan's own, so ``seed`` / ``window`` /
    ``cost`` given beside it must be the same (else refused: they would change nothing); so are its order and its
    last step (shuffled over each epoch, the last step completed from the epoch's start), so ``shuffle=False`` or
    ``drop_last=True`` beside it is refused too. ``epochs``: the epochs the run will train, when known: a plan file
    holding fewer is refused here, not when the missing epoch starts (``set_epoch`` past a plan's last epoch is
    refused at once, too). Without a plan, ``seed`` defaults to 0."""

    def __init__(self, dataset, *, num_replicas: int | None = None, rank: int | None = None, batch_size: int = 1,
                 seed: int | None = None, shuffle: bool = True, drop_last: bool = False, cost: CostModel | None = None,
                 window: int | None = None, accumulation: int = 1, plan: str | Path | None = None,
                 epochs: int | None = None):
        self.num_replicas, self.rank = world(num_replicas, rank)
        self.rows = len(dataset)
        check_settings(self.rows, self.num_replicas, batch_size, accumulation=accumulation,
                       seed=0 if seed is None else seed, window=window)
        if hasattr(dataset, "family"):  # a family whose model takes a batch's items in one call
            from packer.loader.derive import check_batches

            check_batches(dataset, batch_size)
        self.batch_size, self.shuffle, self.drop_last = batch_size, shuffle, drop_last
        self.accumulation = accumulation
        self.window = window  # None: the whole epoch (packer.schedule.steps)
        self.file = None
        if plan is not None:
            self.file = read_plan(plan)
            check_plan(self.file, dataset, self.num_replicas, batch_size, accumulation, seed=seed, window=window,
                       cost=cost, epochs=epochs, shuffle=shuffle, drop_last=drop_last)
            self.seed = int(self.file.meta["seed"])
            self.window = self.file.meta.get("window")
            self.steps = int(self.file.meta["steps_per_epoch"])
            return
        self.seed = 0 if seed is None else seed
        self.costs = row_costs(dataset, cost)
        per_step = self.num_replicas * batch_size * accumulation
        self.steps = (self.rows // per_step if drop_last else -(-self.rows // per_step)) * accumulation  # micro-steps

    def set_epoch(self, epoch: int) -> None:
        if self.file is not None and not 0 <= epoch < self.file.epochs:
            self.file.epoch(epoch)  # raises: the plan holds no such epoch (value, epochs held, fix)
        super().set_epoch(epoch)

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
    from packer.config.sources import Source

    return [Source.parse(spec).pattern for spec in manifest.config.get("input", [])]


def write_plan(out: str | Path, path: str | Path, *, ranks: int, batch_size: int = 1, epochs: int = 1, seed: int = 0,
               window: int | None = None, cost: CostModel | None = None, stages: list[Stage] | None = None,
               accumulation: int = 1) -> dict:
    """Plan ``epochs`` epochs (or the ``stages``' steps: one "epoch" of them) of the build at ``out`` for ``ranks``
    x ``batch_size`` rows a step and write them to ``path`` (Arrow: epoch, step, rows; the settings and the
    balance figures in its metadata). Returns the metadata. Settings no plan of this build can have (no whole
    step, a seed below 0, stages with a gap or an unknown source, a batch the build's family cannot take, ...)
    raise :class:`~packer.errors.ArgumentError` before anything is planned."""
    from packer.loader.dataset import PackedDataset

    ds = PackedDataset(out, check_media=False)
    check_request(ds, ranks=ranks, batch_size=batch_size, epochs=epochs, seed=seed, window=window, stages=stages,
                  accumulation=accumulation)
    model = cost or CostModel.of_build(ds.manifest)
    stats = ds.row_stats()
    costs = model.vector(stats)
    accounting = []
    if stages:
        names, source = source_names(ds.manifest), row_sources(ds)
        plans = [plan_stages(costs, source, names, stages, ranks, batch_size, seed=seed, window=window)]
        accounting = stage_accounting(plans[0], stages, source, names, stats["tokens"], costs)
    else:
        window = window if window is not None else -(-len(costs) // (ranks * batch_size))
        plans = [plan_steps(costs, ranks, batch_size, seed=seed, epoch=e, window=window, accumulation=accumulation)
                 for e in range(epochs)]
    absent = absent_costs(costs, stats, note=cost_note(ds.manifest) if cost is None else "the cost model given",
                          fix="give --cost-model (packer calibrate writes one, or the model's config.json)")
    balance = {"random": measure(costs, random_steps(len(costs), ranks, batch_size * accumulation, seed), COSTS),
               "plan": measure(costs, plans[0], COSTS, accumulation)}
    for figures in balance.values():
        figures.update(dict.fromkeys(absent))  # no figure, not a perfect 1.000: the reason is in "absent"
    meta = {"ranks": ranks, "batch_size": batch_size, "accumulation": accumulation, "epochs": len(plans),
            "steps_per_epoch": len(plans[0]),
            "seed": seed, "window": window, "rows": len(costs), "build": rows_identity(ds.entries),
            "cost_model": {f: getattr(model, f) for f in model.__dataclass_fields__},
            "stages": [{"start": s.start, "end": s.end, "weights": s.weights, "drawn": a}
                       for s, a in zip(stages or [], accounting, strict=False)],
            "balance": balance, "absent": absent}
    write(path, plans, meta)
    return meta


def check_request(ds, *, ranks: int, batch_size: int, epochs: int, seed: int, window: int | None,
                  stages: list[Stage] | None, accumulation: int) -> None:
    """Refuse (:class:`ArgumentError`: value, expected, fix) what :func:`write_plan` cannot plan for the build ``ds``."""
    if stages and accumulation > 1:
        raise ArgumentError(f"stages with accumulation {accumulation}: a staged plan's steps are the stages' own; plan "
                           f"stages with accumulation 1 (--accumulation 1), or plan epochs (no --stages) to accumulate")
    check_settings(len(ds), ranks, batch_size, accumulation=accumulation, seed=seed, window=window,
                   epochs=1 if stages else epochs)
    if stages:
        check_stages(stages, source_names(ds.manifest), rows=len(ds), per_step=ranks * batch_size)
    from packer.loader.derive import check_batches

    try:
        check_batches(ds, batch_size, fix="use --batch-size 1 (each packed row is already full)")
    except ValueError as e:
        raise ArgumentError(str(e)) from None


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


FLAGS = {"seed": "--seed", "window": "--window", "cost": "--cost-model"}
# How packer steps plans every epoch (plan_steps' defaults; a staged plan's steps are shuffled and whole too): what a
# sampler's shuffle / drop_last must say to follow a plan file, and why a plan differs from the sampler's own otherwise.
WRITTEN = {"shuffle": (True, "its steps are shuffled over each epoch"),
           "drop_last": (False, "it trains every row each epoch, its last step completed from the epoch's start")}


def check_plan(plan: PlanFile, dataset, ranks: int, batch_size: int, accumulation: int = 1, *, seed: int | None = None,
               window: int | None = None, cost: CostModel | None = None, epochs: int | None = None,
               shuffle: bool = True, drop_last: bool = False) -> None:
    """Refuse a plan file made for another set-up or build, one whose rows are not this build's (a damaged or edited
    file), a ``seed`` / ``window`` / ``cost`` other than the plan's own, a ``shuffle`` / ``drop_last`` other than how
    its epochs were planned (the sampler would follow the plan's order and last step regardless), or fewer epochs
    than ``epochs``."""
    m = plan.meta
    for name, have, want in (("ranks", ranks, m["ranks"]), ("batch_size", batch_size, m["batch_size"]),
                             ("accumulation", accumulation, m.get("accumulation", 1)),
                             ("rows", len(dataset), m["rows"]), ("build", rows_identity(dataset.entries), m["build"])):
        if have != want:
            raise ValueError(f"the step plan was made for {name} = {want!r}, this run has {have!r}: write a plan for "
                             f"this set-up (`packer steps OUT --ranks {ranks} --batch-size {batch_size} --accumulation "
                             f"{accumulation}`) or pass "
                             f"plan=None to plan each epoch here")
    wrong = plan.problem(len(dataset))
    if wrong:
        raise ValueError(f"the step plan cannot be followed: {wrong}; write it again with `packer steps`")
    recorded = m.get("cost_model")
    given = {f: getattr(cost, f) for f in cost.__dataclass_fields__} if cost is not None else None
    for name, have, want in (("seed", seed, m["seed"]), ("window", window, m.get("window")), ("cost", given, recorded)):
        if have is not None and have != want:
            raise ArgumentError(f"{name} = {have!r}, but the step plan was made with {name} = {want!r}: a plan's rows are "
                               f"fixed when it is written; leave {name} out (the plan's own is used), or write a plan "
                               f"with it (`packer steps OUT {FLAGS[name]} ...`)")
    for name, have in (("shuffle", shuffle), ("drop_last", drop_last)):
        want, why = WRITTEN[name]
        if have != want:
            raise ArgumentError(f"{name} = {have!r}, but the step plan was made with {name} = {want!r} ({why}): a plan's "
                               f"rows are fixed when it is written; leave {name} out to follow it, or pass plan=None "
                               f"to plan each epoch here with {name} = {have!r}")
    if epochs is not None:
        if isinstance(epochs, bool) or not isinstance(epochs, int) or epochs < 1:
            raise ArgumentError(f"epochs = {epochs!r}: give the number of epochs the run trains, >= 1")
        if epochs > plan.epochs:
            raise ArgumentError(f"the step plan holds {plan.epochs} epoch(s), this run trains {epochs}: write them all "
                               f"(`packer steps OUT --epochs {epochs}`), or let the sampler plan each epoch (plan=None)")


def plan_command(out: str, *, ranks: int, batch_size: int = 1, epochs: int = 1, seed: int = 0, window: int | None = None,
                 cost_model: str | None = None, stages: str | None = None, output: str | None = None,
                 accumulation: int = 1) -> dict:
    """``packer steps``: :func:`write_plan` with a cost model file and a stages file read; the metadata and path.

    Writing in OUT, it holds the build's lock (no build or other ``packer steps`` writes there meanwhile), so it can
    remove what an interrupted plan write left in OUT/steps (``*.tmp-*``) before it writes; elsewhere it removes the
    leftovers of its own target only (``NAME.tmp-*``) and needs no write access to OUT. SIGTERM or Ctrl-C removes its
    own temporary file."""
    from packer.engine.local import stop_on_signals
    from packer.shards.step_plan import FOLDER
    from packer.stages.state import BuildLock

    accumulated = f"-accumulation{accumulation}" if accumulation > 1 else ""
    name = f"ranks{ranks}-batch{batch_size}{accumulated}-seed{seed}{'-stages' if stages else ''}.arrow"
    path = Path(output) if output else Path(out) / FOLDER / name
    check_output(Path(out), path)
    read = read_stages(stages) if stages else None
    model = CostModel.load(cost_model) if cost_model else None  # a bad file: CostModelError, one line, exit 2
    inside = path.resolve().is_relative_to(Path(out).resolve())
    lock = BuildLock(Path(out)) if inside else None  # a plan written elsewhere needs no write access to OUT
    try:
        with stop_on_signals():
            stale = {*path.parent.glob(path.name + ".tmp-*"), *((Path(out) / FOLDER).glob("*.tmp-*") if inside else ())}
            for leftover in stale:
                leftover.unlink(missing_ok=True)  # an interrupted write's (kill -9): nobody else writes here now
            meta = write_plan(out, path, ranks=ranks, batch_size=batch_size, epochs=epochs, seed=seed, window=window,
                              cost=model, stages=read, accumulation=accumulation)
    finally:
        if lock is not None:
            lock.release()
    return {**meta, "path": str(path)}


def check_output(out: Path, path: Path) -> None:
    """Refuse to write a plan over the build: inside OUT only ``OUT/steps/*.arrow`` (where ``packer verify`` looks
    for plans; every other file there is the build's, or a stray to verify); outside, only over a step plan."""
    from packer.shards.step_plan import FOLDER

    target, build = path.resolve(), out.resolve()
    if target.is_relative_to(build):
        if target.parent != build / FOLDER or target.suffix != ".arrow":
            raise ArgumentError(f"-o {path} is inside the build {out} but not a {FOLDER}/*.arrow file there: packer steps "
                               f"writes no file of the build's; give -o {out / FOLDER}/NAME.arrow, a path outside the "
                               f"build, or no -o")
    if target.is_dir():
        raise ArgumentError(f"-o {path} is a folder: give a file name (e.g. {path}/plan.arrow)")
    if target.exists():
        try:
            read_plan(target)
        except Exception:  # noqa: BLE001 - not a plan, whatever the reason: not ours to overwrite
            raise ArgumentError(f"-o {path} exists and is not a step plan: packer steps overwrites only a plan it "
                               f"wrote; give another -o, or remove the file") from None


def read_stages(path: str | Path) -> list[Stage]:
    """``[[stages]]`` tables of a TOML file: ``start``, ``end`` (steps), ``weights`` (source pattern -> weight); a file
    that is not that raises :class:`ArgumentError` (the values themselves: :func:`packer.schedule.steps.check_stages`)."""
    import tomllib

    form = "[[stages]] tables of start = STEP, end = STEP, weights = {source = weight}"
    try:
        doc = tomllib.loads(Path(path).read_text(encoding="utf-8"))
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as e:
        raise ArgumentError(f"{path} is not TOML ({e}): give {form}") from None
    tables = doc.get("stages")
    other = sorted(set(doc) - {"stages"})
    if not tables or other or not isinstance(tables, list) or not all(isinstance(t, dict) for t in tables):
        held = f"holds {other}, not only [[stages]]" if other else "holds no [[stages]] table"
        raise ArgumentError(f"{path} {held}: give {form}")
    out = []
    for k, t in enumerate(tables, 1):
        missing, unknown = [x for x in ("start", "end", "weights") if x not in t], sorted(set(t) - {"start", "end", "weights"})
        if missing or unknown or not isinstance(t["weights"], dict):
            what = (f"lacks {missing}" if missing else f"has {unknown}, which are no stage keys" if unknown
                    else f"has weights = {t['weights']!r}, not a table")
            raise ArgumentError(f"{path}: [[stages]] table {k} {what}: give {form}")
        out.append(Stage(t["start"], t["end"], dict(t["weights"])))
    return out


def summary_text(meta: dict) -> str:
    b, absent = meta["balance"], meta.get("absent") or {}
    lines = [f"{meta['path']}: {meta['epochs']} epoch(s) x {meta['steps_per_epoch']:,} steps of {meta['ranks']} ranks x "
             f"{meta['batch_size']} rows ({meta['rows']:,} rows)",
             "  Σ slowest rank / Σ mean rank    " + "  ".join(f"{c:>10}" for c in COSTS)]
    for name in ("random", "plan"):
        lines.append(f"  {name:<30} " + "  ".join(f"{'-':>10}" if b[name][c] is None else f"{b[name][c]:10.3f}"
                                                  for c in COSTS))
    lines += [f"  {c}: no figure: {why}" for c, why in absent.items()]
    for stage in meta["stages"]:
        lines.append(f"  stage {stage['start']}-{stage['end']}: " + ", ".join(
            f"{src} {d['rows']:,} rows ({d['distinct_rows']:,} distinct), {d['tokens']:,} tokens"
            for src, d in stage["drawn"].items()))
    return "\n".join(lines)
