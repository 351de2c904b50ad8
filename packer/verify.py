"""``packer verify OUT``: is this build intact and internally consistent?

Checks, naming the file (and row) of every problem found:

- the manifest: a finished build of a known schema version;
- every file it lists (samples, plan, packed, quarantine, dropped, tokenizer, report,
  media index, embeddings, features): present, same size and sha256, the Arrow schema
  version, the row count;
- every other file of the folder: none but ``manifest.json``, the lock and ``.state/`` (an
  extra shard, a stray file, a left-over ``internal_error.json`` is a problem); ``.state/``
  may be absent (a finished build needs no resume journal), and where present holds only
  the fingerprint and journal entries, with a fingerprint that agrees with the manifest
  (config, tokenizer, media root);
- with ``--media`` (``stat``, the default, or ``hash``): every media file of the media
  index (``media.arrow``) against what the build recorded -- present, same size and
  modification time (``stat``; size only under another ``--media-root``, since a copy
  changes the time), or same sha256 (``hash``, for a build made with ``--media-hash``);
- every packed row: ``cu_seqlens`` starts at 0, increases, ends at ``n_tokens`` = the
  number of ids and labels; ``n_tokens <= max_length`` (a source's own where it has one, the row of one
  policy's sources only, one sample a row of a source with ``packing = false``); one id, modality, parent, group, role
  and weight per segment; labels -100 at every segment start and on every placeholder / begin /
  end token; media spans inside their segment, starting and ending with their kind's
  placeholder id and holding ``tokens`` of them, and no placeholder id outside a span;
- preference records in a row: a record's segments consecutive (its group), of one input
  line; a parent an earlier segment of the group, a tree's ``prompt`` (untrained, holding the
  record's media: no media in a branch), its branches starting with one same token; a
  ``chosen`` with exactly one ``rejected`` in its group;
- with ``--collate``: every row can be collated for the build's family, judged from its stored spans without
  loading a pixel (:meth:`packer.families.Family.row_problem`: LLaVA-OneVision's videos of one frame count);
- the accounting: records read = packed + quarantined + dropped, per file and in total;
  the quarantine and ``dropped.jsonl`` have one line per record they count; the packed
  rows hold every packed sample, counted by integer identity (input file, line; pieces
  of a split sample once, duplicate ids harmless) and the manifest's rows and tokens.

A manifest that is missing, damaged or of another schema version is a problem like any
other (exit code 6), never a traceback; so is a damaged shard: every Arrow file is validated
before a row is read (:mod:`packer.shards.integrity`) and named on one line, and the rows of a
file whose sha256 differs are not checked one by one. ``--deep`` (:mod:`packer.verify_deep`)
re-derives the plan from the samples' lengths and the manifest's plan settings, the packed rows from the
samples and the plan, and the manifest's tokenizer record from ``tokenizer/``, and compares them; what no
file of the build re-derives (the code version, stage 1's settings) it names as not checkable.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from packer.errors import ConfigError, DamagedShardError, PackerError
from packer.io.files import sha256_file
from packer.io.fs import is_remote, location
from packer.shards.io import read_shard
from packer.shards.manifest import MANIFEST, REPORT_FILES, Accounting, Manifest
from packer.shards.schema import IGNORE, MEDIA_KINDS, ShardEntry
from packer.stages.state import LOCK_FILE, STATE_DIR


@dataclass(frozen=True)
class Problem:
    file: str
    row: int | None
    message: str

    def __str__(self) -> str:
        return f"{self.file}{'' if self.row is None else f' row {self.row}'}: {self.message}"


def verify(out: str | Path, *, media: str | None = None, media_root: str | None = None,
           collate: bool = False, deep: bool = False) -> tuple[list[Problem], dict[str, int]]:
    """Problems found (empty: the build is sound) and what was checked. ``media``: also check
    every media file (``"stat"`` or ``"hash"``), found under ``media_root`` (default: the build's).
    ``collate``: also prove every row can be collated for the build's family from its stored spans, no pixel
    loaded (:meth:`packer.families.Family.row_problem`: LLaVA-OneVision's videos of one frame count a row).
    ``deep``: also re-derive the plan (from the samples' lengths and the manifest's plan settings), every packed row
    (from the samples and the plan) and the tokenizer record (from ``tokenizer/``): :mod:`packer.verify_deep`.
    ``out`` may be a URL (a build in object storage): its shards are checked through local copies."""
    if media not in (None, "stat", "hash"):
        raise ValueError(f"media must be None, 'stat' or 'hash', got {media!r}")
    out = location(out)
    try:
        manifest = Manifest.read(out)
    except ConfigError:  # a store that cannot be asked (no credentials, unreachable): the one line naming the cause,
        raise  # exit 2, as inspect / report say it -- nothing was checked, so no "1 problem(s)" about the build
    except PackerError as e:  # missing, truncated, malformed, another schema version, a failed build
        return [Problem("manifest.json", None, str(e))], {"files": 0, "rows": 0, "tokens": 0, "media": 0}
    problems: list[Problem] = []
    listed = manifest.all_files()
    vocab = manifest.tokenizer.get("vocab_size")
    for entry in listed:
        problems += _check_file(out, entry, vocab, rows=entry not in manifest.files.packed)
    unsound = {p.file for p in problems}  # missing, changed or damaged: its rows are not the build's
    problems += _check_folder(out, manifest)
    media_checked = 0
    if media:
        found, media_checked = _check_media(out, manifest, media, media_root)
        problems += found
    row_problem = None
    if collate:
        from packer.families import FamilyStateError

        try:
            row_problem = _row_problem(manifest)
        except (FamilyStateError, ConfigError) as e:  # a recorded family no build writes: named, never a traceback
            what = f"tokenizer.{e}" if isinstance(e, FamilyStateError) else f"tokenizer.family: {e}"
            problems.append(Problem("manifest.json", None, f"{what}; --collate cannot judge the rows"))
    rules = _source_rules(manifest)
    placeholders = set(manifest.placeholders.values())
    kind_ids = {k: manifest.placeholder_id(k) for k in MEDIA_KINDS}
    rows = tokens = segments = 0
    samples: set[tuple[int, int]] = set()
    spans: dict[tuple[int, int], set[tuple[int, int]]] = {}  # a sample's token ranges, over its segments
    for entry in manifest.files.packed:
        path = out / entry.file
        if entry.file in unsound:  # named once by the file check; rows of another file are no evidence
            continue
        try:  # Arrow's full validation (offsets inside their buffers, UTF-8): every row below is safe to read
            table = read_shard(_local(path), rows=False)
        except PackerError as e:  # changed since the file check
            problems.append(Problem(entry.file, None, str(e)))
            continue
        for k, row in ((k, r) for s in range(0, table.num_rows, 64) for k, r in
                       enumerate(table.slice(s, 64).to_pylist(), start=s)):
            try:
                problems += [Problem(entry.file, k, m) for m in
                             _check_row(row, manifest.max_length, placeholders, kind_ids, vocab)]
                if rules is not None:
                    problems += [Problem(entry.file, k, m) for m in _check_sources(row, *rules)]
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
    if deep:
        from packer.verify_deep import deep_problems

        inputs = {e.file for e in [*manifest.files.samples, *manifest.files.packed, manifest.files.plan] if e is not None}
        if not unsound & inputs:  # a damaged or changed file is named once, not re-derived
            problems += deep_problems(out, manifest)
    problems += _check_pieces(spans)
    problems += _check_accounting(out, manifest, (rows, tokens, segments), len(samples),
                                  rows_read=not unsound & {e.file for e in manifest.files.packed})
    return problems, {"files": len(listed), "rows": rows, "tokens": tokens, "media": media_checked}


def _row_problem(manifest: Manifest):
    """The build family's :meth:`~packer.families.Family.row_problem`; None where its rows all collate (a family
    without a row key, the generic one among them)."""
    from packer.families import Family

    record = manifest.tokenizer.get("family")
    family = Family.from_record(record) if record else None
    return family.row_problem if family is not None and family.keys_rows else None


STEPS_DIR = "steps"  # packer.shards.step_plan.FOLDER: step plans written after the build
JOURNAL_NAME = re.compile(r"(encode|pack)-\d{5}\.json")


def _check_folder(out: Path, manifest: Manifest) -> list[Problem]:
    """Every file of ``out`` is the manifest's, the lock, or resume state that agrees with the manifest."""
    known = {e.file for e in manifest.all_files()} | {MANIFEST, LOCK_FILE}
    if not manifest.report_files:  # a build by a packer that did not list its report files
        known |= set(REPORT_FILES)
    problems = []
    for path in sorted(p for p in out.rglob("*") if not p.is_dir()):
        rel = path.relative_to(out).as_posix()
        if rel in known:
            continue
        if rel.startswith(STATE_DIR + "/"):
            name = rel[len(STATE_DIR) + 1:]
            if name == "fingerprint.json":
                problems += _check_fingerprint(path, manifest)
            elif not JOURNAL_NAME.fullmatch(name):
                problems.append(Problem(rel, None, "not resume state a build writes (extra file)"))
            continue
        if rel.startswith(STEPS_DIR + "/") and rel.endswith(".arrow"):
            problems += _check_step_plan(path, rel, manifest)
            continue
        if rel.startswith(STEPS_DIR + "/") and ".arrow.tmp-" in rel:
            problems.append(Problem(rel, None, "a step plan's unfinished write (packer steps was killed): run packer steps "
                                               "again, which removes it, or delete it"))
            continue
        problems.append(Problem(rel, None, "not part of the build: the manifest does not list it (an extra or stray file; "
                                           "remove it, or rebuild)"))
    return problems


def _check_step_plan(path: Path, rel: str, manifest: Manifest) -> list[Problem]:
    """A step plan (``packer steps``) names rows of this build, or it is a problem."""
    from packer.shards.step_plan import read_plan, rows_identity

    try:
        plan = read_plan(path)
    except Exception as e:  # noqa: BLE001 - any unreadable file is one problem, named
        return [Problem(rel, None, f"not a step plan packer steps writes ({e})")]
    if plan.meta.get("build") != rows_identity(manifest.files.packed):
        return [Problem(rel, None, "a step plan of other rows (the build changed since it was written): write it again "
                                   "with `packer steps`")]
    wrong = plan.problem(sum(e.rows for e in manifest.files.packed))
    if wrong:
        return [Problem(rel, None, f"a damaged step plan: {wrong}; write it again with `packer steps`")]
    return []


def _check_fingerprint(path: Path, manifest: Manifest) -> list[Problem]:
    """The resume fingerprint records what the build was made of: it must agree with the manifest."""
    where = f"{STATE_DIR}/{path.name}"
    try:
        fp = json.loads(path.read_text(encoding="utf-8"))
        assert isinstance(fp, dict)
    except (ValueError, UnicodeDecodeError, AssertionError):
        return [Problem(where, None, "not a JSON object: damaged resume state")]
    problems = []
    for key, value in (("config", manifest.config), ("tokenizer", manifest.tokenizer), ("media_root", manifest.media_root)):
        if key in fp and fp[key] != value:
            problems.append(Problem(MANIFEST, None, f"its {key} differs from the one the build recorded in {where} "
                                                    f"(the manifest was edited, or belongs to another build)"))
    return problems


def _check_media(out: Path, manifest: Manifest, mode: str, media_root: str | None) -> tuple[list[Problem], int]:
    """Every file of the media index against what the build recorded: ``(problems, files checked)``."""
    from packer.io import fs
    from packer.media.load import resolve_ref
    from packer.shards.media_index import MediaIndex
    from packer.stages.media_files import file_row

    entry = manifest.files.media
    if entry is None:
        with_media = [m for m in manifest.stats.get("samples_by_modality", {}) if m != "text"]
        if with_media:
            return [Problem(MANIFEST, None, f"lists no media index, but the build packed {', '.join(with_media)} samples "
                                            f"(made by an older packer?): rebuild to check its media")], 0
        return [], 0
    root = media_root if media_root is not None else manifest.media_root
    moved = media_root is not None and media_root != manifest.media_root
    problems, checked = [], 0
    try:
        index = list(MediaIndex(out / entry.file))
    except PackerError as e:
        return [Problem(entry.file, None, str(e))], 0
    if mode == "hash" and any(not f.sha256 for f in index if f.bytes >= 0):
        return [Problem(entry.file, None, "records no sha256 (the build ran without --media-hash): use --media stat, or "
                                          "rebuild with --media-hash")], 0
    for f in index:
        path = resolve_ref(f.ref, root)
        checked += 1
        if f.bytes < 0:
            problems.append(Problem(f.ref, None, "could not be read when the build recorded it"))
            continue
        try:
            size, mtime = fs.stat(path)
        except OSError as e:
            problems.append(Problem(f.ref, None, f"missing: {path} ({e.strerror or e}); if the media moved, give "
                                                 f"--media-root NEW_ROOT"))
            continue
        if size != f.bytes:
            problems.append(Problem(f.ref, None, f"{path} has {size:,} bytes, the build read {f.bytes:,}: it changed"))
        elif mode == "hash":
            if file_row(f.ref, root, True).sha256 != f.sha256:
                problems.append(Problem(f.ref, None, f"{path}: sha256 differs from the build's (same size, other content)"))
        elif not moved and mtime != f.mtime_ns:
            problems.append(Problem(f.ref, None, f"{path} was modified after the build read it (same size, another "
                                                 f"modification time): its content may differ; --media hash compares it"))
    return problems, checked


def _local(path):
    """``path``, or for a remote build a local copy of it (downloaded once; checked like a local file)."""
    if not is_remote(path):
        return path
    from packer.io.cache import local_copy

    return local_copy(path)


def _check_file(out: Path, entry: ShardEntry, vocab: int | None, rows: bool) -> list[Problem]:
    """Present, same size and sha256; an Arrow file also sound (:mod:`packer.shards.integrity`: every value
    of its rows with ``rows``; a packed shard's rows are checked one by one, each problem named) with the
    manifest's row count."""
    path = out / entry.file
    if not path.is_file():
        return [Problem(entry.file, None, "missing")]
    if path.stat().st_size != entry.bytes:
        return [Problem(entry.file, None, f"size {path.stat().st_size} differs from the manifest's {entry.bytes}")]
    path = _local(path)
    if sha256_file(path) != entry.sha256:
        damage = ""
        if path.suffix == ".arrow":
            try:
                read_shard(path, vocab_size=vocab)
            except DamagedShardError as e:
                damage = f"; {e.reason}"
            except PackerError as e:
                damage = f"; {e}"
        return [Problem(entry.file, None, f"sha256 differs from the manifest (the file changed or is damaged){damage}")]
    if path.suffix == ".arrow":
        try:
            n = read_shard(path, rows=rows, vocab_size=vocab).num_rows
        except DamagedShardError as e:  # one line naming the first thing wrong
            return [Problem(entry.file, None, e.reason)]
        except PackerError as e:  # another schema version
            return [Problem(entry.file, None, str(e))]
        if n != entry.rows:
            return [Problem(entry.file, None, f"{n} rows, the manifest says {entry.rows}")]
    return []


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


def _check_sources(row: dict, inputs: list[str], group: list[int], capacity: list[int], unpacked: list[bool]) -> list[str]:
    """A row of sources with their own packing: one policy's sources only, within its capacity, one sample when
    unpacked (a preference record's segments or a split sample's piece are one)."""
    out = []
    files = row["segment_source"]
    if len({group[f] for f in files}) > 1:
        named = sorted({inputs[f] for f in files})
        out.append(f"segments of sources packed by different policies in one row ({', '.join(named)})")
    first = files[0]
    if row["n_tokens"] > capacity[first]:
        out.append(f"n_tokens {row['n_tokens']} > max_length {capacity[first]} of its source {inputs[first]!r}")
    samples = len(set(zip(files, row["segment_line"], strict=True)))
    if unpacked[first] and samples > 1:
        out.append(f"{samples} samples in a row of source {inputs[first]!r}, whose packing = false")
    return out


def _check_row(row: dict, max_length: int, placeholders: set[int], kind_ids: dict[str, int | None],
               vocab: int | None = None) -> list[str]:
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
    top = vocab if vocab is not None else np.iinfo(np.int64).max
    if np.any((ids < 0) | (ids >= top)) or np.any((labels != IGNORE) & ((labels < 0) | (labels >= top))):
        out.append(f"a token id or label outside [0, {top}) (labels: or {IGNORE})")
    if "segment_trained" in row:  # the loss denominators the collator reads: they must be the labels' own counts
        counts = np.add.reduceat((labels != IGNORE).astype(np.int64), cu[:-1]).tolist()
        if list(row["segment_trained"]) != counts or row.get("n_trained") != sum(counts):
            out.append(f"segment_trained {list(row['segment_trained'])[:8]} / n_trained {row.get('n_trained')} differ from "
                       f"the labels' supervised tokens {counts[:8]} / {sum(counts)} (the loss would be normalised wrong)")
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
    return out + _check_trees(row, cu, ids, labels)


def _check_trees(row: dict, cu: np.ndarray, ids: np.ndarray, labels: np.ndarray) -> list[str]:
    """The preference structure of a row (see the module docstring)."""
    n = len(cu) - 1
    parent, group, role, weight = (row.get(k) for k in ("segment_parent", "segment_group", "segment_role", "segment_weight"))
    if any(v is None or len(v) != n for v in (parent, group, role, weight)):
        return ["segment_parent / segment_group / segment_role / segment_weight do not have one entry per segment"]
    out = []
    identity = list(zip(row["segment_source"], row["segment_line"], strict=True))
    media_segments = {m["segment"] for m in row["media"]}
    for j in range(n):
        g, p = group[j], parent[j]
        if not 0 <= g <= j or group[g] != g or (g < j and (group[j - 1] != g or identity[j] != identity[g])):
            out.append(f"segment {j}'s group {g} is not a run of consecutive segments of one record")
        if role[j] == "" and (g != j or p != -1):
            out.append(f"segment {j} belongs to no preference record but has a group or a parent")
        if p == -1:
            continue
        if not g <= p < j or role[p] != "prompt" or role[j] in ("", "prompt"):
            out.append(f"segment {j} ({role[j]!r}) has parent {p}, which is not an earlier prompt of its record")
            continue
        first = next(k for k in range(p + 1, j + 1) if parent[k] == p)
        if ids[cu[j]] != ids[cu[first]]:
            out.append(f"segment {j}: a tree's branches do not start with the same (last shared) token")
        if j in media_segments:
            out.append(f"segment {j} is a tree's branch holding media (a prompt's media belong to the prompt, once)")
    for j in range(n):
        if role[j] == "prompt" and np.any(labels[cu[j] : cu[j + 1]] != IGNORE):
            out.append(f"segment {j} is a tree's prompt with trained tokens")
        if role[j] == "prompt" and j + 1 < n and parent[j + 1] != j:
            out.append(f"segment {j} is a tree's prompt that no branch follows")
    for g in sorted(set(group)):
        members = [role[j] for j in range(n) if group[j] == g]
        if ("chosen" in members or "rejected" in members) and (members.count("chosen"), members.count("rejected")) != (1, 1):
            out.append(f"the record at segment {g} holds {members.count('chosen')} chosen and "
                       f"{members.count('rejected')} rejected responses (1 and 1 expected)")
    return out


def _check_pieces(spans: dict[tuple[int, int], set[tuple[int, int]]]) -> list[Problem]:
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


def _check_accounting(out: Path, manifest: Manifest, counted: tuple[int, int, int], n_samples: int,
                      rows_read: bool = True) -> list[Problem]:
    """The manifest's accounting; against the packed rows' counts (rows, tokens, segments) when every packed
    shard was read."""
    rows, tokens, segments = counted
    acc: Accounting = manifest.accounting
    problems = [Problem("manifest.json", None, m) for m in acc.balanced()]
    for entry, count in ((manifest.files.quarantine, acc.quarantined), (manifest.files.dropped, acc.dropped)):
        if entry is not None:
            problems += _check_jsonl(out / entry.file, count)
    if not rows_read:
        return problems
    if n_samples != acc.samples_packed:
        problems.append(Problem("manifest.json", None, f"packed rows hold {n_samples} samples, the accounting says "
                                                       f"{acc.samples_packed}"))
    stats = manifest.stats
    if rows != stats.get("rows") or tokens != stats.get("tokens"):
        problems.append(Problem("manifest.json", None, f"shards hold {rows} rows / {tokens} tokens, the manifest says "
                                                       f"{stats.get('rows')} / {stats.get('tokens')}"))
    if "segments" in stats and segments != stats["segments"]:
        problems.append(Problem("manifest.json", None, f"shards hold {segments} segments, the manifest says "
                                                       f"{stats['segments']}"))
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


def verify_or_raise(out: str | Path, limit: int = 50, *, media: str | None = None, media_root: str | None = None,
                    collate: bool = False, deep: bool = False) -> str:
    from packer.errors import VerifyError

    problems, checked = verify(out, media=media, media_root=media_root, collate=collate, deep=deep)
    unchecked = ""
    if deep:  # what --deep cannot re-derive is said, never claimed verified
        from packer.shards.manifest import Manifest
        from packer.verify_deep import not_checkable

        try:
            unchecked = "".join(f"\nnot checkable: {line}" for line in not_checkable(Manifest.read(out)))
        except PackerError:  # no manifest to read: the one problem named
            pass
    if problems:
        shown = "\n".join(f"  {p}" for p in problems[:limit])
        more = f"\n  ... and {len(problems) - limit} more" if len(problems) > limit else ""
        raise VerifyError(f"{out}: {len(problems)} problem(s)\n{shown}{more}{unchecked}")
    media_text = f", {checked['media']:,} media files ({media})" if media else ""
    done = (", every row collatable for its family" if collate else "") + \
        ("; the plan re-derived from the samples' lengths and the manifest's plan settings, every packed row re-derived from "
         "samples/ + plan.arrow, the tokenizer record from tokenizer/" if deep else "")
    return (f"{out}: ok ({checked['files']} files, {checked['rows']:,} rows, {checked['tokens']:,} tokens{media_text} "
            f"checked{done}){unchecked}")

