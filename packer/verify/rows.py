"""The row checks of ``packer verify``: every packed row against the format's invariants
(:mod:`packer.shards.invariants`: the row's own structure, and its source's packing where sources have their own),
with ``--collate`` against the build family's :meth:`~packer.families.Family.row_problem`; and, over all rows, a
split sample's pieces never overlapping."""

from __future__ import annotations

from pathlib import Path

from packer.errors import PackerError
from packer.shards.invariants import packed_row_problems, source_problems
from packer.shards.io import read_shard
from packer.shards.manifest import Manifest
from packer.shards.schema import MEDIA_KINDS
from packer.verify.files import local
from packer.verify.problem import Problem


def family_row_problem(manifest: Manifest):
    """The build family's :meth:`~packer.families.Family.row_problem`; None where its rows all collate (a family
    without a row key, the generic one among them)."""
    family = manifest.family
    return family.row_problem if family is not None and family.keys_rows else None


def _source_rules(manifest: Manifest) -> tuple[list[str], list[int], list[int], list[bool]] | None:
    """Per input file: its source's entry, policy group, rows' capacity and whether it is unpacked; None for a
    build without a source of its own packing (the build's max_length is every row's)."""
    sources = manifest.sources()
    if not any(s.policy for s in sources) or not manifest.input_sources:
        return None
    groups = {policy: g for g, policy in enumerate(dict.fromkeys(s.policy for s in sources))}
    build_segments = int(manifest.config.get("max_segments", 0))
    of_file = manifest.input_sources
    return ([sources[k].pattern for k in of_file], [groups[sources[k].policy] for k in of_file],
            manifest.file_capacities(), [sources[k].options().get("max_segments", build_segments) == 1 for k in of_file])


def check_pieces(spans: dict[tuple[int, int], set[tuple[int, int]]]) -> list[Problem]:
    """A sample's segments (a split sample's pieces, a preference record's responses or tree prompt and branches)
    hold distinct tokens of it: two different ranges of one sample never overlap (copies of a sample, mix
    weights over 1, repeat the same ranges)."""
    problems = []
    for (source, line), ranges in spans.items():
        if len(ranges) < 2:
            continue
        ordered = sorted(ranges)
        for (s0, n0), (s1, n1) in zip(ordered[:-1], ordered[1:], strict=True):
            if s1 < s0 + n0:
                problems.append(Problem("packed", None, f"the sample of input file {source} line {line} has segments "
                                                        f"over tokens {s0}:{s0 + n0} and {s1}:{s1 + n1}: a split "
                                                        f"sample's pieces overlap (its tokens trained twice, others "
                                                        f"lost)"))
                break
    return problems[:20]


def check_rows(out: Path, manifest: Manifest, unsound: set[str], vocab: int | None, row_problem=None
               ) -> tuple[list[Problem], tuple[int, int, int], set[tuple[int, int]], dict[tuple[int, int], set[tuple[int, int]]]]:
    """Every row of every sound packed shard (``unsound``: the files the file check named, whose rows are no evidence):
    ``(problems, (rows, tokens, segments), the samples the rows hold, each sample's token ranges)``. ``row_problem``:
    the family's collation check (``--collate``), or None."""
    rules = _source_rules(manifest)
    placeholders = set(manifest.placeholders.values())
    kind_ids = {k: manifest.placeholder_id(k) for k in MEDIA_KINDS}
    problems: list[Problem] = []
    rows = tokens = segments = 0
    samples: set[tuple[int, int]] = set()
    spans: dict[tuple[int, int], set[tuple[int, int]]] = {}  # a sample's token ranges, over its segments
    for entry in manifest.files.packed:
        path = out / entry.file
        if entry.file in unsound:  # named once by the file check; rows of another file are no evidence
            continue
        try:  # Arrow's full validation (offsets inside their buffers, UTF-8): every row below is safe to read
            table = read_shard(local(path), rows=False)
        except PackerError as e:  # changed since the file check
            problems.append(Problem(entry.file, None, str(e)))
            continue
        for k, row in ((k, r) for s in range(0, table.num_rows, 64) for k, r in
                       enumerate(table.slice(s, 64).to_pylist(), start=s)):
            try:
                problems += [Problem(entry.file, k, m) for m in
                             packed_row_problems(row, manifest.max_length, placeholders, kind_ids, vocab)]
                if rules is not None:
                    problems += [Problem(entry.file, k, m) for m in source_problems(row, *rules)]
                if row_problem is not None and (why := row_problem(row["media"])):
                    problems.append(Problem(entry.file, k, f"cannot be collated for its family: {why}"))
                samples.update(zip(row["segment_source"], row["segment_line"], strict=True))  # pieces count once
                cu = row["cu_seqlens"]
                for source, line, start, a, b in zip(row["segment_source"], row["segment_line"], row["segment_start"],
                                                     cu[:-1], cu[1:], strict=False):
                    spans.setdefault((source, line), set()).add((start, b - a))
            except Exception as e:  # noqa: BLE001 -- values no build writes: a problem to name, never a traceback
                problems.append(Problem(entry.file, k, f"values no build writes ({type(e).__name__}: "
                                                       f"{' '.join(str(e).split())})"))
            tokens += row["n_tokens"]
            segments += len(row["cu_seqlens"]) - 1
        rows += table.num_rows
    return problems, (rows, tokens, segments), samples, spans
