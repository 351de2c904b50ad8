"""``packer verify``'s whole run: the manifest read, then the file checks (:mod:`packer.verify.files`), the row
checks (:mod:`packer.verify.rows`), ``--deep``'s re-derivations (:mod:`packer.verify.deep`) and the accounting, in
that order; :func:`verify_or_raise` words the outcome for the command line."""

from __future__ import annotations

from pathlib import Path

from packer.errors import ConfigError, NotABuildError, PackerError
from packer.io.fs import location
from packer.shards.manifest import Manifest
from packer.verify.files import check_accounting, check_file, check_folder, check_media
from packer.verify.problem import Problem
from packer.verify.rows import check_pieces, check_rows, family_row_problem


def verify(out: str | Path, *, media: str | None = None, media_root: str | None = None,
           collate: bool = False, deep: bool = False) -> tuple[list[Problem], dict[str, int]]:
    """Problems found (empty: the build is sound) and what was checked. ``media``: also check
    every media file (``"stat"`` or ``"hash"``), found under ``media_root`` (default: the build's).
    ``collate``: also prove every row can be collated for the build's family from its stored spans, no pixel
    loaded (:meth:`packer.families.Family.row_problem`: LLaVA-OneVision's videos of one frame count a row).
    ``deep``: also re-derive the plan (from the samples' lengths and the manifest's plan settings), every packed row
    (from the samples and the plan) and the tokenizer record (from ``tokenizer/``): :mod:`packer.verify.deep`.
    ``out`` may be a URL (a build in object storage): its shards are checked through local copies."""
    if media not in (None, "stat", "hash"):
        raise ValueError(f"media must be None, 'stat' or 'hash', got {media!r}")
    out = location(out)
    try:
        manifest = Manifest.read(out)
    except NotABuildError as e:  # a folder without a manifest: the build's one problem
        return [Problem("manifest.json", None, str(e))], {"files": 0, "rows": 0, "tokens": 0, "media": 0}
    except ConfigError:  # a store that cannot be asked (no credentials, unreachable): the one line naming the cause,
        raise  # exit 2, as inspect / report say it -- nothing was checked, so no "1 problem(s)" about the build
    except PackerError as e:  # missing, truncated, malformed, another schema version, a failed build
        return [Problem("manifest.json", None, str(e))], {"files": 0, "rows": 0, "tokens": 0, "media": 0}
    problems: list[Problem] = []
    listed = manifest.all_files()
    vocab = manifest.tokenizer.get("vocab_size")
    for entry in listed:
        problems += check_file(out, entry, vocab, rows=entry not in manifest.files.packed)
    unsound = {p.file for p in problems}  # missing, changed or damaged: its rows are not the build's
    problems += check_folder(out, manifest)
    media_checked = 0
    if media:
        found, media_checked = check_media(out, manifest, media, media_root)
        problems += found
    row_problem = None
    if collate:
        from packer.families import FamilyStateError

        try:
            row_problem = family_row_problem(manifest)
        except (FamilyStateError, ConfigError) as e:  # a recorded family no build writes: named, never a traceback
            what = f"tokenizer.{e}" if isinstance(e, FamilyStateError) else f"tokenizer.family: {e}"
            problems.append(Problem("manifest.json", None, f"{what}; --collate cannot judge the rows"))
    found, counted, samples, spans = check_rows(out, manifest, unsound, vocab, row_problem)
    problems += found
    if deep:
        from packer.verify.deep import deep_problems

        inputs = {e.file for e in [*manifest.files.samples, *manifest.files.packed, manifest.files.plan] if e is not None}
        if not unsound & inputs:  # a damaged or changed file is named once, not re-derived
            problems += deep_problems(out, manifest)
    problems += check_pieces(spans)
    problems += check_accounting(out, manifest, counted, len(samples),
                                 rows_read=not unsound & {e.file for e in manifest.files.packed})
    return problems, {"files": len(listed), "rows": counted[0], "tokens": counted[1], "media": media_checked}


def verify_or_raise(out: str | Path, limit: int = 50, *, media: str | None = None, media_root: str | None = None,
                    collate: bool = False, deep: bool = False) -> str:
    """The one line ``packer verify`` prints for a sound build (with ``deep``, what no file re-derives), or
    :class:`~packer.errors.VerifyError` listing the first ``limit`` problems."""
    from packer.errors import VerifyError

    problems, checked = verify(out, media=media, media_root=media_root, collate=collate, deep=deep)
    unchecked = ""
    if deep:  # what --deep cannot re-derive is said, never claimed verified
        from packer.verify.deep import not_checkable

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

