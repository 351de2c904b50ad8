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
