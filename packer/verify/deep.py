"""``packer verify OUT --deep``: is the build what its samples, its plan and its manifest's settings make?

The file check trusts the manifest's sha256: a shard edited and its hash updated with it (a chosen and a
rejected response swapped, a label flipped with its counts fixed, an id, a plan entry) passes it, and
every row invariant too; so does a manifest field edited (nothing hashes the manifest, and ``.state/``,
whose fingerprint would disagree, may be gone). ``--deep`` re-derives what the build's own files determine:

- the plan (:func:`plan_problems`): stage 2 again (:func:`packer.stages.planning.plan_build`, the build's own
  function) over the samples' lengths under the manifest's plan settings (``max_length``, ``seed``,
  ``algorithm``, ``order``, the sources' weights ...), compared with ``plan.arrow``, and the packed shards' row
  counts with the cut ``shard_rows`` / ``shard_bytes`` make. An edited ``max_length`` or ``seed`` plans other rows;
- the packed rows (:func:`packed_problems`): each shard again from ``samples/`` + ``plan.arrow`` with stage 3's
  own function (:func:`packer.stages.materialize.pack_rows`, in the batches stage 3 writes), the bytes compared;
  where they differ, the rows, to name the first row and column that differ. So ``packed/`` is proven to be a
  function of ``samples/`` + ``plan.arrow``;
- an embedded build's media shards (:func:`packer.verify.blobs.order_problems`): each holds exactly the blobs its
  packed shard's rows name, in first-use order;
- the tokenizer record (:func:`tokenizer_problems`): ``OUT/tokenizer`` loaded and fingerprinted as the build
  fingerprinted it (:func:`packer.encode.tokenizer.fingerprint`): its sha256, vocabulary size, bos / eos ids,
  placeholder ids and template hash against the manifest's.

The samples' own values are checked against their labels by every read (:mod:`packer.shards.integrity`:
``n_trained``, spans), and against the inputs and the processor by ``--against-processor`` (sampled
records). What the build's files cannot re-derive is said, never claimed verified (:func:`not_checkable`):
the code version that made it, where its tokenizer was read from, stage 1's settings (only re-encoding the
inputs re-derives the samples). Nor can any check see the same consistent edit made to the samples, the
plan and the packed rows: a rebuild from the inputs is the reference then.

Cost: one more stage 2 (lengths only: 1.3 s for 10 million samples) and stage 3 (a few seconds per GB of
packed rows), one tokenizer load; no media.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import pyarrow as pa

from packer.errors import PackerError
from packer.io.files import HashingWriter
from packer.io.fs import is_remote
from packer.shards.io import read_shard
from packer.shards.manifest import MANIFEST, Manifest
from packer.shards.schema import PACKED_SCHEMA, PLAN_SCHEMA, SAMPLE_SCHEMA
from packer.verify.problem import Problem

# the manifest's tokenizer fields OUT/tokenizer re-derives (the others: not_checkable)
TOKENIZER_FIELDS = ("sha256", "vocab_size", "bos_token_id", "eos_token_id", "placeholders", "chat_template_sha256",
                    "tool_template_sha256")


class _Null:
    """A sink that keeps nothing: :class:`HashingWriter` hashes what would be written."""

    closed = False

    def write(self, data) -> int:
        return memoryview(data).nbytes

    def flush(self) -> None:
        pass


def deep_problems(out: Path, manifest: Manifest) -> list[Problem]:
    """The plan, the packed rows and the tokenizer record, each against what the build's files make (see above)."""
    if manifest.files.plan is None:
        return [Problem("plan.arrow", None, "the manifest lists no plan: --deep cannot re-derive the packed rows")]
    from packer.verify.blobs import order_problems

    problems = [*plan_problems(out, manifest), *packed_problems(out, manifest), *tokenizer_problems(out, manifest),
                *order_problems(out, manifest)]
    other = other_code(manifest) if problems else None  # hashes packer's sources: only where there is a difference
    return [dataclasses.replace(p, message=f"{p.message} ({other})") for p in problems] if other else problems


def other_code(manifest: Manifest) -> str | None:
    """Where the build was made by other packer code than this one: a sentence saying so (what --deep re-derives with
    this code's rules may differ for that reason alone, not an edit), else None."""
    from packer.stages.state import code_identity

    recorded = (manifest.code or {}).get("packer_code")
    current = code_identity()["packer_code"]
    if not recorded or recorded == current:
        return None
    return (f"the build was made by other packer code ({manifest.packer_version}, packer_code {recorded[:12]}; this is "
            f"{current[:12]}): a figure derived otherwise since then differs too; rebuild with this version to check it")


def plan_problems(out: Path, manifest: Manifest) -> list[Problem]:
    """``plan.arrow`` against the plan stage 2 makes of the samples' lengths under the manifest's plan settings, and
    the packed shards' row counts against stage 3's cut of it (``shard_rows``, ``shard_bytes``)."""
    from packer.stages.materialize import shard_tasks
    from packer.stages.planning import SampleRows, plan_build, plan_columns, plan_table

    files = manifest.files
    settings = ", ".join(f"{k} {manifest.config.get(k)!r}" for k in ("max_length", "seed", "algorithm", "order", "oversize"))
    paths, shas = [out / e.file for e in files.samples], [e.sha256 for e in files.samples]
    try:
        config = manifest.build_config()
        tables = [read_shard(path, sha, rows=False) for path, sha in zip(paths, shas, strict=True)]  # values: checked
        samples = plan_columns(pa.concat_tables(tables) if tables else SAMPLE_SCHEMA.empty_table())
        rows = SampleRows(paths, [e.rows for e in files.samples], shas)
        p = plan_build(samples, config, manifest.tokenizer, list(manifest.input_sources) or None, rows)[0]
    except Exception as e:  # noqa: BLE001 -- settings or samples no build writes: a problem, not a traceback
        return [Problem(MANIFEST, None, f"its plan settings ({settings}, ...) cannot re-plan the samples "
                                        f"({type(e).__name__}: {' '.join(str(e).split())}): the manifest was edited")]
    derived = plan_table(p)
    if _sha256([derived], PLAN_SCHEMA) != files.plan.sha256:
        stored = read_shard(out / files.plan.file, files.plan.sha256, rows=False)
        names = PLAN_SCHEMA.names
        mine, theirs = stored.select(names).to_pylist(), derived.select(names).to_pylist()
        row = next((k for k, (a, b) in enumerate(zip(mine, theirs, strict=False)) if a != b), min(len(mine), len(theirs)))
        return [Problem(files.plan.file, row, f"differs from the plan stage 2 derives from the samples' lengths under the "
                                              f"manifest's plan settings ({settings}, ...): {derived.num_rows} rows, "
                                              f"plan.arrow holds {stored.num_rows} (the settings or the plan were edited "
                                              f"after the build)")]
    from packer.build import plan_stats

    recorded = manifest.stats
    derived_stats = json.loads(json.dumps(plan_stats(config, samples, p)))  # as the manifest holds them
    differ = [k for k, v in derived_stats.items() if k in recorded and recorded[k] != v]
    if differ:
        return [Problem(MANIFEST, None, f"its stats {', '.join(f'{k} {recorded[k]!r}' for k in differ[:4])} differ from "
                                        f"{', '.join(repr(derived_stats[k]) for k in differ[:4])}, what the plan gives "
                                        f"under its plan settings ({settings}, ...): the settings or the stats were "
                                        f"edited after the build")]
    cut = [t.row_stop - t.row_start for t in shard_tasks(p.bin_tokens(), np.diff(p.offsets), config.shard_rows,
                                                          config.shard_bytes)]
    if cut != [e.rows for e in files.packed]:
        return [Problem(MANIFEST, None, f"shard_rows {config.shard_rows} / shard_bytes {config.shard_bytes} cut the plan "
                                        f"into shards of {cut[:8]} rows, the packed shards hold "
                                        f"{[e.rows for e in files.packed][:8]}: its settings were edited after the build")]
    return []


def packed_problems(out: Path, manifest: Manifest) -> list[Problem]:
    """Each packed shard against the one stage 3 derives from ``samples/`` + ``plan.arrow`` (see above)."""
    from packer.stages.materialize import ROWS_PER_BATCH, pack_rows, setup

    files = manifest.files
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


def tokenizer_problems(out: Path, manifest: Manifest) -> list[Problem]:
    """The manifest's tokenizer record (:data:`TOKENIZER_FIELDS`) against ``OUT/tokenizer``'s, fingerprinted as the
    build fingerprinted the tokenizer it shipped there (:meth:`packer.encode.encoder.Encoder.fingerprint`)."""
    import hashlib
    import tempfile

    from packer.encode.tokenizer import fingerprint, open_tokenizer

    entries = manifest.files.tokenizer
    if not entries:  # a build by a packer that shipped no tokenizer: said by not_checkable
        return []
    recorded = manifest.tokenizer
    with tempfile.TemporaryDirectory(prefix="packer-verify-") as tmp:
        folder = out / "tokenizer"
        if is_remote(folder):  # loaded from local copies, each checked against its sha256
            import shutil

            from packer.io.cache import local_copy

            folder = Path(tmp)
            for e in entries:  # tokenizer/NAME, or tokenizer/additional_chat_templates/NAME
                (folder / e.file).parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(local_copy(out / e.file, e.sha256), folder / e.file)
            folder = folder / "tokenizer"
        try:
            tok = open_tokenizer(str(folder))
        except Exception as e:  # noqa: BLE001 -- files no build ships: a problem, not a traceback
            return [Problem("tokenizer", None, f"cannot be loaded ({type(e).__name__}: {' '.join(str(e).split())}): "
                                               f"--deep cannot re-derive the manifest's tokenizer record")]
    derived = fingerprint(tok, recorded.get("name", ""), list(manifest.placeholders))
    templates = tok.chat_template if isinstance(tok.chat_template, dict) else {"default": tok.chat_template}
    for key, name in (("chat_template_sha256", "default"), ("tool_template_sha256", "tool_use")):
        if isinstance(templates.get(name), str):  # the build ships both only where records with tools used tool_use
            derived[key] = hashlib.sha256(templates[name].encode()).hexdigest()
    return [Problem(MANIFEST, None, f"tokenizer.{k} {recorded[k]!r} differs from {derived.get(k)!r}, derived from "
                                    f"tokenizer/ (the manifest or the tokenizer files were edited after the build)")
            for k in TOKENIZER_FIELDS if k in recorded and recorded[k] != derived.get(k)]


def not_checkable(manifest: Manifest) -> list[str]:
    """What the manifest records that no file of the build re-derives, each on one line: ``--deep`` says so rather
    than claim it verified."""
    from packer.config import CONTENT_KEYS

    code = manifest.code or {}
    libraries = len([v for v in (code.get("libraries") or {}).values() if v])
    lines = [f"the code version that made the build (packer {manifest.packer_version}, packer_code "
             f"{str(code.get('packer_code', 'not recorded'))[:12]}, {libraries} library versions): no file of the build "
             f"re-derives it"]
    unchecked = [k for k in manifest.tokenizer if k not in TOKENIZER_FIELDS]
    if not manifest.files.tokenizer:
        lines.append("the tokenizer record: the build ships no tokenizer/ (made by an older packer); rebuild to check it")
    elif unchecked:
        lines.append(f"tokenizer.{', tokenizer.'.join(sorted(unchecked))} (where the tokenizer was read from, the "
                     f"family and template settings): tokenizer/ re-derives only {', '.join(TOKENIZER_FIELDS)}")
    content = [k for k in CONTENT_KEYS if k in manifest.config]
    if content:
        lines.append(f"stage 1's settings (config.{', config.'.join(content[:4])} and {len(content) - 4} more) and the "
                     f"samples they made: only re-encoding the inputs re-derives them (--against-processor re-runs a "
                     f"sample of records, a rebuild all)" if len(content) > 4 else
                     f"stage 1's settings (config.{', config.'.join(content)}) and the samples they made: only "
                     f"re-encoding the inputs re-derives them")
    return lines


def _sha256(tables: list[pa.Table], schema: pa.Schema = PACKED_SCHEMA) -> str:
    """The sha256 of the shard :func:`packer.shards.io.write_shard_batches` would write from ``tables``."""
    from packer.shards.io import BATCH_ROWS

    hashed = HashingWriter(_Null())
    with pa.ipc.new_stream(hashed, schema) as writer:
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
