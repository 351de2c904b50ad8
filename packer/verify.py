"""``packer verify OUT``: is this build intact and internally consistent?

Checks, naming the file (and row) of every problem found:

- the manifest: a finished build of a known schema version;
- every file it lists (samples, plan, packed, quarantine, embeddings, features): present,
  same size and sha256, the Arrow schema version, the row count;
- every packed row: ``cu_seqlens`` starts at 0, increases, ends at ``n_tokens`` = the
  number of ids and labels; ``n_tokens <= max_length``; one id and modality per segment;
  labels -100 at every segment start and on every placeholder / begin / end token; media
  spans inside their segment, starting and ending with their kind's placeholder id and
  holding ``tokens`` of them, and no placeholder id outside a span;
- the accounting: records read = packed + quarantined + dropped, per file and in total;
  the quarantine and ``dropped.jsonl`` have one line per record they count; the packed
  rows hold every packed sample, counted by integer identity (input file, line; pieces
  of a split sample once, duplicate ids harmless) and the manifest's rows and tokens.

A manifest that is missing, damaged or of another schema version is a problem like any
other (exit code 6), never a traceback.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from packer.errors import PackerError
from packer.io.files import sha256_file
from packer.io.fs import is_remote, location
from packer.shards.io import read_shard
from packer.shards.manifest import Accounting, Manifest
from packer.shards.schema import IGNORE, MEDIA_KINDS, ShardEntry


@dataclass(frozen=True)
class Problem:
    file: str
    row: int | None
    message: str

    def __str__(self) -> str:
        return f"{self.file}{'' if self.row is None else f' row {self.row}'}: {self.message}"


def verify(out: str | Path) -> tuple[list[Problem], dict[str, int]]:
    """Problems found (empty: the build is sound) and what was checked."""
    out = location(out)
    try:
        manifest = Manifest.read(out)
    except PackerError as e:  # missing, truncated, malformed, another schema version, a failed build
        return [Problem("manifest.json", None, str(e))], {"files": 0, "rows": 0, "tokens": 0}
    problems: list[Problem] = []
    listed = manifest.all_files()
    for entry in listed:
        problems += _check_file(out, entry)
    placeholders = set(manifest.placeholders.values())
    kind_ids = {k: manifest.placeholder_id(k) for k in MEDIA_KINDS}
    rows = tokens = 0
    samples: set[tuple[int, int]] = set()
    for entry in manifest.files.packed:
        path = out / entry.file
        if not path.is_file():
            continue
        try:
            table = read_shard(_local(path))
        except Exception as e:  # damaged beyond reading: already reported by the file check
            problems.append(Problem(entry.file, None, f"cannot be read: {e}"))
            continue
        for k, row in ((k, r) for s in range(0, table.num_rows, 64) for k, r in
                       enumerate(table.slice(s, 64).to_pylist(), start=s)):
            problems += [Problem(entry.file, k, m) for m in _check_row(row, manifest.max_length, placeholders, kind_ids)]
            samples.update(zip(row["segment_source"], row["segment_line"], strict=True))  # pieces count once
            tokens += row["n_tokens"]
        rows += table.num_rows
    problems += _check_accounting(out, manifest, rows, tokens, len(samples))
    return problems, {"files": len(listed), "rows": rows, "tokens": tokens}


def _local(path):
    """``path``, or for a remote build a local copy of it (downloaded once; checked like a local file)."""
    if not is_remote(path):
        return path
    from packer.io.cache import local_copy

    return local_copy(path)


def _check_file(out: Path, entry: ShardEntry) -> list[Problem]:
    path = out / entry.file
    if not path.is_file():
        return [Problem(entry.file, None, "missing")]
    if path.stat().st_size != entry.bytes:
        return [Problem(entry.file, None, f"size {path.stat().st_size} differs from the manifest's {entry.bytes}")]
    path = _local(path)
    if sha256_file(path) != entry.sha256:
        return [Problem(entry.file, None, "sha256 differs from the manifest (the file changed or is damaged)")]
    if path.suffix == ".arrow":
        try:
            n = read_shard(path).num_rows
        except Exception as e:
            return [Problem(entry.file, None, f"cannot be read as a packer shard: {e}")]
        if n != entry.rows:
            return [Problem(entry.file, None, f"{n} rows, the manifest says {entry.rows}")]
    return []


def _check_row(row: dict, max_length: int, placeholders: set[int], kind_ids: dict[str, int | None]) -> list[str]:
    out = []
    cu = np.asarray(row["cu_seqlens"], dtype=np.int64)
    ids = np.asarray(row["input_ids"], dtype=np.int64)
    labels = np.asarray(row["labels"], dtype=np.int64)
    n = row["n_tokens"]
    if len(cu) < 2 or cu[0] != 0 or np.any(np.diff(cu) <= 0) or cu[-1] != n:
        return [f"cu_seqlens {cu.tolist()[:8]}... must start at 0, increase and end at n_tokens {n}"]
    if len(ids) != n or len(labels) != n:
        out.append(f"{len(ids)} ids and {len(labels)} labels for n_tokens {n}")
        return out
    if n > max_length:
        out.append(f"n_tokens {n} > max_length {max_length}")
    if not len(row["segment_ids"]) == len(row["segment_modality"]) == len(cu) - 1:
        out.append("segment_ids / segment_modality do not have one entry per segment")
    if np.any(labels[cu[:-1]] != IGNORE):
        out.append("a segment's first token has a label (it would be trained on the previous segment)")
    special = np.isin(ids, list(placeholders))
    if np.any(labels[special] != IGNORE):
        out.append("a placeholder / begin / end token is trained")
    covered = np.zeros(n, dtype=bool)
    for m in row["media"]:
        seg = m["segment"]
        if not 0 <= seg < len(cu) - 1 or m["start"] < cu[seg] or m["start"] + m["length"] > cu[seg + 1]:
            out.append(f"media span {m['ref']} at {m['start']}+{m['length']} lies outside segment {seg}")
            continue
        span = ids[m["start"] : m["start"] + m["length"]]
        pad = kind_ids.get(m["kind"])
        if pad is None or not len(span) or span[0] != pad or span[-1] != pad or int((span == pad).sum()) != m["tokens"]:
            out.append(f"media span {m['ref']} does not start and end with the {m['kind']} placeholder or does not hold "
                       f"its {m['tokens']} placeholders")
        covered[m["start"] : m["start"] + m["length"]] = True
    pads = np.isin(ids, [v for v in kind_ids.values() if v is not None])
    if np.any(pads & ~covered):
        out.append("a placeholder id lies outside every media span")
    return out


def _check_accounting(out: Path, manifest: Manifest, rows: int, tokens: int, n_samples: int) -> list[Problem]:
    acc: Accounting = manifest.accounting
    problems = [Problem("manifest.json", None, m) for m in acc.balanced()]
    for entry, count in ((manifest.files.quarantine, acc.quarantined), (manifest.files.dropped, acc.dropped)):
        if entry is not None:
            problems += _check_jsonl(out / entry.file, count)
    if n_samples != acc.samples_packed:
        problems.append(Problem("manifest.json", None, f"packed rows hold {n_samples} samples, the accounting says "
                                                       f"{acc.samples_packed}"))
    stats = manifest.stats
    if rows != stats.get("rows") or tokens != stats.get("tokens"):
        problems.append(Problem("manifest.json", None, f"shards hold {rows} rows / {tokens} tokens, the manifest says "
                                                       f"{stats.get('rows')} / {stats.get('tokens')}"))
    return problems


def _check_jsonl(path: Path, count: int) -> list[Problem]:
    """``quarantine.jsonl`` / ``dropped.jsonl``: one entry (file, line, reason) per record counted."""
    if not path.is_file():
        return []  # reported missing by the file check
    try:
        lines = [line for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    except UnicodeDecodeError:
        return [Problem(path.name, None, "not UTF-8 text")]
    problems = []
    if len(lines) != count:
        problems.append(Problem(path.name, None, f"{len(lines)} entries, the accounting says {count}"))
    for k, line in enumerate(lines):
        try:
            entry = json.loads(line)
            assert isinstance(entry, dict) and {"file", "line", "reason"} <= set(entry)
        except (ValueError, AssertionError):
            problems.append(Problem(path.name, k, "not an entry with file, line and reason"))
            break
    return problems


def verify_or_raise(out: str | Path, limit: int = 50) -> str:
    from packer.errors import VerifyError

    problems, checked = verify(out)
    if problems:
        shown = "\n".join(f"  {p}" for p in problems[:limit])
        more = f"\n  ... and {len(problems) - limit} more" if len(problems) > limit else ""
        raise VerifyError(f"{out}: {len(problems)} problem(s)\n{shown}{more}")
    return f"{out}: ok ({checked['files']} files, {checked['rows']:,} rows, {checked['tokens']:,} tokens checked)"

