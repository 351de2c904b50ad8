"""``packer verify OUT --deep``: are the packed rows what ``samples/`` and ``plan.arrow`` make?

The file check trusts the manifest's sha256: a shard edited and its hash updated with it (a chosen and a
rejected response swapped, a label flipped with its counts fixed, an id, a plan entry) passes it, and
every row invariant too. ``--deep`` re-derives each packed shard from the samples and the plan with
stage 3's own function (:func:`packer.stages.materialize.pack_rows`, in the batches stage 3 writes) and
compares the bytes; where they differ, the rows, to name the first row and column that differ. So
``packed/`` is proven to be a function of ``samples/`` + ``plan.arrow``; the samples' own values are
checked against their labels by every read (:mod:`packer.shards.integrity`: ``n_trained``, spans), and
against the inputs and the processor by ``--against-processor`` (sampled records). What no check can see
is the same consistent edit made to the samples, the plan and the packed rows: a rebuild from the inputs
is the reference then.

Cost: one more stage 3 (a few seconds per GB of packed rows), no tokenizer, no media.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa

from packer.errors import PackerError
from packer.io.files import HashingWriter
from packer.shards.io import read_shard
from packer.shards.manifest import Manifest
from packer.shards.schema import PACKED_SCHEMA
from packer.verify import Problem


class _Null:
    """A sink that keeps nothing: :class:`HashingWriter` hashes what would be written."""

    closed = False

    def write(self, data) -> int:
        return memoryview(data).nbytes

    def flush(self) -> None:
        pass


def deep_problems(out: Path, manifest: Manifest) -> list[Problem]:
    """Each packed shard against the one stage 3 derives from ``samples/`` + ``plan.arrow`` (see above)."""
    from packer.stages.materialize import ROWS_PER_BATCH, pack_rows, setup

    files = manifest.files
    if files.plan is None:
        return [Problem("plan.arrow", None, "the manifest lists no plan: --deep cannot re-derive the packed rows")]
    try:
        state = setup(str(out), [e.file for e in files.samples], files.plan.sha256, durable=False,
                      sample_sha256=[e.sha256 for e in files.samples])
    except PackerError as e:  # damaged samples or plan: named by the file check already
        return [Problem("plan.arrow", None, f"--deep cannot read the samples and the plan: {e}")]
    plan_rows = state.plan.num_rows
    if plan_rows != sum(e.rows for e in files.packed):
        return [Problem("plan.arrow", None, f"{plan_rows} bins, the packed shards hold {sum(e.rows for e in files.packed)} "
                                            f"rows: the plan is not the one the packed rows were made from")]
    problems, start = [], 0
    for entry in files.packed:
        stop = start + entry.rows
        try:
            derived = [pack_rows(state.samples, state.plan.slice(s, min(ROWS_PER_BATCH, stop - s)))
                       for s in range(start, stop, ROWS_PER_BATCH)]
        except Exception as e:  # noqa: BLE001 -- a plan that points outside the samples: a problem, not a traceback
            problems.append(Problem(entry.file, None, f"cannot be re-derived from samples/ + plan.arrow "
                                                      f"({type(e).__name__}: {' '.join(str(e).split())})"))
            start = stop
            continue
        if _sha256(derived) != entry.sha256:
            found = _first_difference(read_shard(out / entry.file, entry.sha256, rows=False), derived)  # rows: verify's
            if found is not None:
                row, column = found
                problems.append(Problem(entry.file, row, f"{column} differs from the row stage 3 derives from "
                                                         f"samples/ + plan.arrow (the shard, the samples or the plan "
                                                         f"was edited after the build)"))
        start = stop
    return problems


def _sha256(tables: list[pa.Table]) -> str:
    """The sha256 of the shard :func:`packer.shards.io.write_shard_batches` would write from ``tables``."""
    from packer.shards.io import BATCH_ROWS

    hashed = HashingWriter(_Null())
    with pa.ipc.new_stream(hashed, PACKED_SCHEMA) as writer:
        for table in tables:
            writer.write_table(table, max_chunksize=BATCH_ROWS)
    return hashed.sha256()


def _first_difference(stored: pa.Table, derived: list[pa.Table]) -> tuple[int, str] | None:
    """``(row, column)`` of the first value that differs, or None when only the bytes' layout does."""
    first = 0
    for table in derived:
        mine = stored.slice(first, table.num_rows)
        for name in PACKED_SCHEMA.names:
            a, b = mine.column(name), table.column(name)
            if a.type != b.type or a.to_pylist() != b.to_pylist():
                if a.type == b.type and name == "segment_weight":  # NaN != NaN: compare their bits
                    same = [np.array_equal(np.asarray(x, np.float32).view(np.int32), np.asarray(y, np.float32).view(np.int32))
                            for x, y in zip(a.to_pylist(), b.to_pylist(), strict=True)]
                    if all(same):
                        continue
                    return first + same.index(False), name
                rows_a, rows_b = a.to_pylist(), b.to_pylist()
                k = next((k for k, (x, y) in enumerate(zip(rows_a, rows_b, strict=True)) if x != y), 0)
                return first + k, name
        first += table.num_rows
    if first != stored.num_rows:
        return first, "the row count"
    return None
