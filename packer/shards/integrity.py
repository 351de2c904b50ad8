"""Is a shard's content what a packer shard can hold? Checked on every read, before any row is used.

A shard whose bytes were damaged (a flipped block on disk, a bad copy) can still parse: Arrow reads the
buffers it is told to, and a list offset past its buffer makes a later row access read outside the
mapped file (a segfault, not an error). :func:`check_table` refuses such a table with
:class:`~packer.errors.DamagedShardError` naming the file, the row and what is wrong, in one line:

- Arrow's full validation: every list offset inside its values, in order; every dictionary index
  inside its dictionary; every string valid UTF-8;
- per kind (``packer.kind`` in the schema metadata), the values a build writes, vectorised over the
  whole table (a pass over the tokens, ~0.2 s per GB of ids and labels; the rules are the format's own,
  :mod:`packer.shards.invariants`, which ``packer verify`` asks row by row too):

  - ``packed``: ``len(input_ids) == len(labels) == n_tokens``; ``cu_seqlens`` from 0, increasing, to
    ``n_tokens``; one entry per segment in each ``segment_*`` list; ids in ``[0, vocab_size)`` (where
    given), labels -100 or such an id; ``segment_trained`` / ``n_trained`` the labels' own counts;
    parents and groups earlier segments of the row; media spans inside the row and their segment list;
  - ``samples``: ``len(input_ids) == len(labels) == length`` (a preference sample: ``length`` less the shared
    prompt stored once, ``prefix x (responses - 1)``), ids and labels as above, ``n_trained``
    the labels' count, media and response spans inside the sample, ``prefix <= length``, costs non-negative;
  - ``plan``: one sample, start and length per segment, none negative.

What this cannot see is a damaged value that is still a valid one (a token id replaced by another):
``packer verify`` compares each file's sha256, and its deep mode re-derives the packed rows (:mod:`packer.verify.deep`).
"""

from __future__ import annotations

import pyarrow as pa

from packer.errors import DamagedShardError
from packer.shards.invariants import RULES, batch_problem
from packer.shards.schema import KIND_KEY


def check_table(table: pa.Table, where: str, vocab_size: int | None = None, *, rows: bool = True) -> None:
    """Raise :class:`DamagedShardError` if ``table`` (read from ``where``) is not a sound packer shard;
    ``rows=False``: Arrow's validation only (the caller checks each row itself, as ``packer verify`` does)."""
    try:
        table.validate(full=True)
    except (pa.ArrowInvalid, pa.ArrowException) as e:
        raise damaged(where, None, f"Arrow validation: {e}") from None
    if not rows:
        return
    kind = (table.schema.metadata or {}).get(KIND_KEY, b"").decode(errors="replace")
    if kind not in RULES:
        return
    first = 0
    for batch in table.to_batches():
        try:
            problem = batch_problem(batch, kind, vocab_size)
        except (IndexError, ValueError, TypeError, KeyError, pa.ArrowException) as e:  # shapes no build writes
            problem = None, f"{type(e).__name__}: {e}"
        if problem is not None:
            row, what = problem
            raise damaged(where, None if row is None else first + row, what)
        first += batch.num_rows


def damaged(where: str, row: int | None, what: object) -> DamagedShardError:
    """The error for a damaged shard: its file, the row where known, what is wrong, on one line."""
    what = " ".join(str(what).split())  # one line, whatever Arrow's message held
    reason = f"{'' if row is None else f'row {row}: '}damaged ({what})"
    return DamagedShardError(f"{where} {reason}: packer verify lists every problem, a rebuild (or a fresh copy) "
                             f"replaces it", reason)
