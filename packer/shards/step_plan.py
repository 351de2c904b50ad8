"""A step plan on disk (``OUT/steps/*.arrow``, written by ``packer steps``): one row per step -- ``epoch``, ``step``,
``rows`` (``ranks x batch_size`` packed row numbers, rank-major) -- and, in the schema metadata under
``packer.step_plan``, the settings it was made with (ranks, batch_size, epochs, seed, window, cost model, stages),
the identity of the rows it names (:func:`rows_identity`) and its balance figures. Torch-free: ``packer verify``
reads it."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import pyarrow as pa

PLAN_KEY = b"packer.step_plan"
FOLDER = "steps"


class PlanFile:
    def __init__(self, table: pa.Table, meta: dict):
        self.table, self.meta = table, meta

    @property
    def epochs(self) -> int:
        return int(self.meta["epochs"])

    def epoch(self, epoch: int) -> np.ndarray:
        if not 0 <= epoch < self.epochs:
            raise ValueError(f"the step plan holds {self.epochs} epoch(s), epoch {epoch} was asked for: write more with "
                             f"`packer steps OUT --epochs {epoch + 1}`, or let the sampler plan (plan=None)")
        mask = (self.table.column("epoch").to_numpy() == epoch)
        rows = self.table.filter(pa.array(mask)).column("rows").combine_chunks()
        shape = (int(mask.sum()), int(self.meta["ranks"]), int(self.meta["batch_size"]))
        return rows.values.to_numpy().astype(np.int64).reshape(shape)

    def problem(self, rows: int) -> str | None:
        """What makes this plan unusable on a build of ``rows`` packed rows, in one line (None: nothing): columns,
        a step's width (``ranks x batch_size``), the epochs and steps its metadata promises, and every row number
        in ``[0, rows)`` -- a row outside would be read as another row, or fail mid-epoch."""
        m, t = self.meta, self.table
        try:
            width = int(m["ranks"]) * int(m["batch_size"])
            epochs, steps = int(m["epochs"]), int(m["steps_per_epoch"])
        except (KeyError, TypeError, ValueError) as e:
            return f"its metadata lacks the plan's shape ({type(e).__name__}: {e})"
        if not {"epoch", "step", "rows"} <= set(t.column_names):
            return f"columns {t.column_names}, not epoch, step, rows"
        kind = t.schema.field("rows").type
        if not pa.types.is_fixed_size_list(kind) or kind.list_size != width:
            return f"a step holds {kind}, not {width} rows (ranks x batch_size of its metadata)"
        epoch = t.column("epoch").to_numpy()
        if (len(t) != epochs * steps or (len(t) and (epoch.min() < 0 or epoch.max() >= epochs))
                or not np.array_equal(np.bincount(epoch, minlength=epochs), np.full(epochs, steps))):
            return f"its steps are not the {epochs} epoch(s) x {steps} steps its metadata says ({len(t)} steps)"
        values = t.column("rows").combine_chunks().values
        if t.column("rows").null_count or values.null_count:
            return "a step holds no row (a null)"
        if len(values):
            import pyarrow.compute as pc

            low, high = pc.min_max(values).values()
            if low.as_py() < 0 or high.as_py() >= rows:
                return (f"it names row {low.as_py() if low.as_py() < 0 else high.as_py()}, outside the build's rows "
                        f"0-{rows - 1}")
        return None


def rows_identity(entries) -> str:
    """A sha256 over the packed shards' own sha256s: the rows a plan names."""
    return hashlib.sha256("".join(e.sha256 or e.file for e in entries).encode()).hexdigest()


def read_plan(path: str | Path) -> PlanFile:
    with pa.memory_map(str(path)) as f:
        table = pa.ipc.open_file(f).read_all()
    raw = (table.schema.metadata or {}).get(PLAN_KEY)
    if raw is None:
        raise ValueError(f"{path} is not a step plan (no {PLAN_KEY.decode()} metadata): write one with `packer steps`")
    return PlanFile(table, json.loads(raw))




def write(path: str | Path, plans: list[np.ndarray], meta: dict) -> None:
    """Write ``plans`` (one ``[steps, ranks, batch_size]`` array per epoch) and ``meta`` to ``path``, atomically."""
    from packer.io.files import atomic_open

    epoch = np.concatenate([np.full(len(p), e, np.int32) for e, p in enumerate(plans)])
    step = np.concatenate([np.arange(len(p), dtype=np.int32) for p in plans])
    flat = np.concatenate([p.reshape(len(p), -1) for p in plans])
    rows = pa.FixedSizeListArray.from_arrays(pa.array(flat.reshape(-1), pa.int64()), flat.shape[1])
    table = pa.table({"epoch": epoch, "step": step, "rows": rows}).replace_schema_metadata({PLAN_KEY: json.dumps(meta)})
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    with atomic_open(Path(path), "wb") as f, pa.ipc.new_file(f, table.schema) as w:
        w.write_table(table)
