"""The file-level checks of ``packer verify``: every file the manifest lists (present, same size and sha256, a sound
Arrow file of its row count), every other file of the folder (the lock, resume state that agrees with the manifest,
step plans of this build's rows), every media file against the media index, and the manifest's accounting against
the packed rows' counts and the quarantine / ``dropped.jsonl`` lines."""

from __future__ import annotations

import json
import re
from pathlib import Path

from packer.errors import DamagedShardError, PackerError
from packer.io.files import sha256_file
from packer.io.fs import is_remote
from packer.shards.io import read_shard
from packer.shards.manifest import MANIFEST, REPORT_FILES, Accounting, Manifest
from packer.shards.schema import ShardEntry
from packer.stages.state import LOCK_FILE, STATE_DIR
from packer.verify.problem import Problem

STEPS_DIR = "steps"  # packer.shards.step_plan.FOLDER: step plans written after the build
JOURNAL_NAME = re.compile(r"(encode|pack)-\d{5}\.json")


def check_folder(out: Path, manifest: Manifest) -> list[Problem]:
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


def check_media(out: Path, manifest: Manifest, mode: str, media_root: str | None) -> tuple[list[Problem], int]:
    """Every file of the media index against what the build recorded: ``(problems, files checked)``."""
    from packer.io import fs
    from packer.media.refs import resolve_ref
    from packer.shards.media_index import MediaIndex
    from packer.stages.media_files import file_row

    entry = manifest.files.media
    embedded: tuple[list[Problem], int] = ([], 0)
    if manifest.files.blob_store:  # blobs: checked against their names
        from packer.verify.blobs import blob_problems

        embedded = blob_problems(out, manifest)
        if entry is None:
            return embedded
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
    return problems + embedded[0], checked + embedded[1]


def local(path):
    """``path``, or for a remote build a local copy of it (downloaded once; checked like a local file)."""
    if not is_remote(path):
        return path
    from packer.io.cache import local_copy

    return local_copy(path)


def check_file(out: Path, entry: ShardEntry, vocab: int | None, rows: bool) -> list[Problem]:
    """Present, same size and sha256; an Arrow file also sound (:mod:`packer.shards.integrity`: every value
    of its rows with ``rows``; a packed shard's rows are checked one by one, each problem named) with the
    manifest's row count."""
    path = out / entry.file
    if not path.is_file():
        return [Problem(entry.file, None, "missing")]
    if path.stat().st_size != entry.bytes:
        return [Problem(entry.file, None, f"size {path.stat().st_size} differs from the manifest's {entry.bytes}")]
    path = local(path)
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


def check_accounting(out: Path, manifest: Manifest, counted: tuple[int, int, int], n_samples: int,
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
