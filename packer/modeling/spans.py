"""A stored media span at train time: its file, its header, its planned frames, and the check that the
features the model will get equal the placeholders the build wrote.

A span (a ``media`` entry of a packed row, resolved by :class:`~packer.loader.PackedDataset`) carries
``kind``, ``start``, ``length``, ``tokens``, ``ref`` and ``path`` (``frames`` / ``fps`` for a video
given as frame images). The generic media step (:mod:`packer.loader.media`) and every family's loading
hooks (:mod:`packer.families`) load through these helpers, so a missing or broken file names itself the
same way everywhere, and every count mismatch is a :class:`MediaMismatchError` naming the file.
"""

from __future__ import annotations

from typing import Any

from packer.errors import BadRecord, PackerError
from packer.media.load import MediaLoadError


class MediaMismatchError(ValueError):
    """A media item would give the model another number of features than its span holds."""


def span_runs(span: dict[str, Any]) -> list[tuple[int, int]]:
    """A span's runs of placeholders as (offset in the span, length); one run covering the span unless the
    row says otherwise (:class:`~packer.loader.PackedDataset` adds ``runs`` where the family writes text
    between a media item's runs)."""
    runs = span.get("runs")
    return [(int(o), int(n)) for o, n in runs] if runs else [(0, int(span["length"]))]


def by_record(spans: list[dict[str, Any]]) -> list[list[int]]:
    """The positions in ``spans`` (scatter order) of each record's items, record by record: a row's segment is one
    record, so consecutive spans of one (batch row, segment) belong together (what a processor takes as one call)."""
    groups: list[list[int]] = []
    last = None
    for i, m in enumerate(spans):
        key = (m.get("batch", 0), m["segment"])
        if key != last:
            groups.append([])
            last = key
        groups[-1].append(i)
    return groups


def span_path(span: dict[str, Any]) -> str:
    return span.get("path") or span["ref"]


def missing(span: dict[str, Any], path: str):
    raise FileNotFoundError(f"{span['kind']} file {path} (ref {span['ref']!r}) not found; if the media moved, "
                            f"open the build with PackedDataset(out, media_root=NEW_ROOT)") from None


def probe_span(span: dict[str, Any]) -> Any:
    """A video span's header (:class:`packer.media.video.VideoInfo`): its frame images (``frames``, at the span's
    ``fps``) or its file; a file that is gone raises :func:`missing`'s error."""
    from packer.media.video import probe_frames, probe_video

    path, listed = span_path(span), span.get("frames")
    try:
        return probe_frames(listed, span.get("fps") or 0.0) if listed else probe_video(path)
    except BadRecord as e:
        if e.reason == "missing_video":
            missing(span, path)
        raise


def open_media(load, span: dict[str, Any], *args):
    """``load(path, *args)`` for the span's file; a missing file or a load error names the file and its ref."""
    path = span_path(span)
    try:
        return load(path, *args)
    except FileNotFoundError:
        missing(span, path)
    except (MemoryError, PackerError):  # PackerError: a missing optional package (PyAV, soxr), not the file
        raise
    except Exception as e:  # noqa: BLE001 -- every load error names its file (PIL's truncated-image error names none)
        raise MediaLoadError(span["kind"], path, span["ref"], e) from e


def load_planned_frames(span: dict[str, Any], indices: list[int]) -> Any:
    """The frames ``indices`` of a video span (decoded upright, :mod:`packer.media.video`): from its frame
    images or its file, an error naming the file."""
    from packer.media.video import load_frames, load_video

    listed = span.get("frames")
    if listed:
        return open_media(lambda _, i: load_frames(listed, i), span, indices)
    return open_media(load_video, span, indices)


def check(span: dict[str, Any], produced: int, by: str, stored_grid: tuple[int, ...] | None = None) -> None:
    """Raise :class:`MediaMismatchError` naming the file unless ``produced`` (the features the model will get for
    ``span``) equals the placeholders the build stored, and ``stored_grid`` (the processor's grid after the
    spatial merge) its ``llm_grid``. Family hooks call it for every item they load."""
    path = span_path(span)
    stored = int(span.get("tokens", span["length"]))
    if produced != stored:
        raise MediaMismatchError(
            f"{path}: the build gave this {span['kind']} {stored} placeholder positions but {by} produces "
            f"{produced} features from it. The build's settings and this processor disagree: give the collator the "
            f"processor the build was made for (PackedCollator.for_build(ds, model=model) loads a family build's), or "
            f"rebuild for this processor (--processor for a family build, --{span['kind']}-tokens for a generic one).")
    grid = tuple(int(g) for g in span.get("llm_grid") or ())
    if stored_grid is not None and grid and grid != tuple(stored_grid):
        raise MediaMismatchError(f"{path}: the build stored llm_grid {grid} (after the spatial merge) but {by} makes "
                                 f"{tuple(stored_grid)}; mRoPE positions would be wrong: give the collator the build's "
                                 f"processor, or rebuild with this one (--processor)")
