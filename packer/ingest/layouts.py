"""A table row or a tar sample made into a record of the shapes :mod:`packer.ingest.formats` reads.

1. The source's column mapping (``columns=messages=conversations,images=image_list``) renames columns to the record
   fields (:func:`mapped`).
2. Published layouts that differ from those shapes are rewritten (:func:`published_layout`); read with no mapping:
   - TRL's VLM SFT sets: ``messages`` whose user content holds ``{"type": "image"}`` parts (``text`` null in them,
     as a parquet struct stores every key) and an ``images`` column: read as they are;
   - LLaVA-OneVision-Data: ``conversations`` (from / value, ``<image>`` tags) and one ``image`` column: as they are;
   - The Cauldron: ``images`` and ``texts``, a list of ``{"user", "assistant"}`` turns: a ``messages`` record whose
     first user turn holds the images (before its text, as HF's Idefics2 / SmolVLM recipes place them).
3. Media cells become refs the record shapes read (:func:`media_ref`): embedded bytes (``datasets`` ``Image()`` /
   ``Audio()`` / ``Video()`` cells, ``{"bytes", "path"}`` structs, raw bytes) are held as blobs
   (:mod:`packer.io.blobs`) and named by their content; a cell with only a ``path`` names a file (resolved like a
   JSONL record's path); a string is a path or URL as written.
4. Which columns hold media is read from the schema's ``datasets`` features where it records them
   (:func:`media_columns`): a dataset whose one ``Image()`` (``Audio()``, ``Video()``; or a list of them) column has
   another name than the record field (``picture``) is read as the record's ``image`` / ``images`` with no mapping
   (:func:`feature_mapping`). Without features a column is media by its name alone (``images``: ``{"bytes", "path"}``
   structs, bytes or paths).
"""

from __future__ import annotations

from typing import Any

from packer.errors import BadRecord
from packer.io import blobs

MEDIA_FIELDS = {"images": "image", "image": "image", "audios": "audio", "audio": "audio", "videos": "video",
                "video": "video"}
MAX_CELL_BYTES = 256 * 2**20  # one embedded medium's bytes at most (a cell, a tar member)
FEATURE_KINDS = {"Image": "image", "Audio": "audio", "Video": "video"}  # the datasets features packer decodes
LISTS = ("List", "Sequence", "LargeList")  # datasets' list features ({"feature": ..., "_type": "List"}; [f] in old ones)


def feature_type(feature: Any) -> tuple[str, bool]:
    """``(the feature's _type, whether it is a list of it)``: ``List(Image())`` is ``("Image", True)``; a struct of
    fields (a dict without ``_type``) is ``("", False)``."""
    listed = False
    while True:
        if isinstance(feature, list) and len(feature) == 1:
            feature, listed = feature[0], True
        elif isinstance(feature, dict) and feature.get("_type") in LISTS:
            feature, listed = feature.get("feature"), True
        else:
            break
    return (str(feature.get("_type") or "") if isinstance(feature, dict) else ""), listed


def media_columns(features: dict[str, Any]) -> dict[str, tuple[str, bool]]:
    """``column -> (media kind, list?)`` for each top-level column the features declare an Image / Audio / Video
    (or a list of them)."""
    out = {}
    for column, feature in features.items():
        kind, listed = feature_type(feature)
        if kind in FEATURE_KINDS:
            out[column] = (FEATURE_KINDS[kind], listed)
    return out


def feature_mapping(features: dict[str, Any], names: list[str],
                    columns: tuple[tuple[str, str], ...]) -> tuple[tuple[str, str], ...]:
    """The column mapping with, for each media kind the rows do not already hold under a record field (nor the
    mapping names), the one column of that kind the features declare: ``picture`` (``Image()``) read as ``image``,
    a ``List(Image())`` as ``images``. Two columns of one kind are left alone (which is meant is the user's to say,
    with ``columns=``)."""
    fields = {f for f, _ in columns} | set(names) - {c for _, c in columns}
    found: dict[str, list[tuple[str, bool]]] = {}
    for column, (kind, listed) in media_columns(features).items():
        if column not in MEDIA_FIELDS and column not in {c for _, c in columns}:
            found.setdefault(kind, []).append((column, listed))
    extra = []
    for kind, cols in found.items():
        if len(cols) == 1 and not fields & {f for f, k in MEDIA_FIELDS.items() if k == kind}:
            column, listed = cols[0]
            extra.append((kind + "s" if listed else kind, column))
    return (*columns, *extra)


def check_media_features(features: dict[str, Any], names: list[str], columns: tuple[tuple[str, str], ...]) -> str:
    """Why a column read as media can never be (a ``Pdf`` feature read as ``images``, an ``Audio()`` one as
    ``images``), or ``""``. Checked once per input from its schema: the feature is the column's, so every row would
    fail alike (a ConfigError for the whole input, not a quarantine of each row)."""
    source = {f: c for f, c in columns}
    for field, kind in MEDIA_FIELDS.items():
        column = source.get(field, field if field not in {c for _, c in columns} else None)
        if column is None or column not in names or column not in features:
            continue
        ftype, _ = feature_type(features[column])
        if ftype in ("", "Value") or FEATURE_KINDS.get(ftype) == kind:
            continue
        what = f"an {ftype}()" if ftype in FEATURE_KINDS else f"a {ftype!r} feature, which packer does not decode"
        return (f"column {column!r}, read as the record's {field}, is {what}; packer reads {kind} columns that are "
                f"{kind.capitalize()}() features, {{bytes, path}} structs, bytes or paths")
    return ""


def mapped(row: dict[str, Any], columns: tuple[tuple[str, str], ...]) -> dict[str, Any]:
    """``row`` with each mapped column under its record field's name (the column's own name dropped); a mapped
    column the row does not have is a bad record naming it."""
    if not columns:
        return row
    out = dict(row)
    for field, column in columns:
        if column not in row:
            raise BadRecord("missing_column", f"the column mapping reads {field} from column {column!r}, which this "
                                              f"input does not have (its columns: {', '.join(sorted(row))})")
        out.pop(column, None)
    for field, column in columns:
        out[field] = row[column]
    return out


def published_layout(row: dict[str, Any]) -> dict[str, Any]:
    """The Cauldron's ``texts`` turns as ``messages`` (see the module docstring); other rows as they are."""
    texts = row.get("texts")
    if "messages" not in row and "conversations" not in row and isinstance(texts, list) and texts and all(
            isinstance(t, dict) and ("user" in t or "assistant" in t) for t in texts):
        images = row.get("images")
        n = len(images) if isinstance(images, list) else int(images is not None)
        messages: list[dict[str, Any]] = []
        for k, turn in enumerate(texts):
            user, assistant = turn.get("user"), turn.get("assistant")
            if not isinstance(user, str) or not isinstance(assistant, str):
                raise BadRecord("wrong_type", f"texts[{k}] must hold a user and an assistant string")
            content = [{"type": "image"} for _ in range(n if k == 0 else 0)] + [{"type": "text", "text": user}]
            messages += [{"role": "user", "content": content}, {"role": "assistant", "content": assistant}]
        out = {key: value for key, value in row.items() if key != "texts"}
        out["messages"] = messages
        return out
    return row


def media_ref(cell: Any, kind: str, where: str, max_bytes: int | None = None) -> Any:
    """A media cell as the record shapes take it: a blob name for embedded bytes, a path / URL string as it is,
    None for a null cell; a list of cells, each. ``max_bytes``: :data:`MAX_CELL_BYTES` unless given."""
    max_bytes = MAX_CELL_BYTES if max_bytes is None else max_bytes
    if cell is None or isinstance(cell, str):
        return cell
    if isinstance(cell, list):
        return [media_ref(c, kind, f"{where}[{k}]", max_bytes) for k, c in enumerate(cell)]
    if isinstance(cell, (bytes, bytearray, memoryview)):
        data = bytes(cell)
    elif isinstance(cell, dict) and ("bytes" in cell or "path" in cell):
        data = cell.get("bytes")
        if data is None:
            path = cell.get("path")
            if isinstance(path, str) and path:
                return path
            raise BadRecord(f"missing_{kind}", f"{where}: the {kind} cell holds neither bytes nor a path")
    else:
        raise BadRecord("wrong_type", f"{where}: a {kind} cell must be bytes, a {{bytes, path}} struct or a path, got "
                                      f"{type(cell).__name__}")
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise BadRecord("wrong_type", f"{where}: the {kind} cell's bytes are a {type(data).__name__}")
    if len(data) > max_bytes:
        raise BadRecord("media_too_large", f"{where}: the {kind} cell holds {len(data):,} bytes, over the "
                                           f"{max_bytes:,}-byte limit of one medium")
    if not data:
        raise BadRecord(f"missing_{kind}", f"{where}: the {kind} cell's bytes are empty")
    return blobs.STORE.put(bytes(data))


def to_record(row: dict[str, Any], columns: tuple[tuple[str, str], ...] = ()) -> dict[str, Any]:
    """A table row as a record (see the module docstring)."""
    record = published_layout(mapped(row, columns))
    for field, kind in MEDIA_FIELDS.items():
        if field in record:
            record[field] = media_ref(record[field], kind, field)
    for message in record.get("messages") or [] if isinstance(record.get("messages"), list) else []:
        content = message.get("content") if isinstance(message, dict) else None
        if isinstance(content, list):
            for part in content:
                if isinstance(part, dict):
                    for kind in ("image", "audio", "video"):
                        if part.get(kind) is not None:
                            part[kind] = media_ref(part[kind], kind, f"a {kind} part")
    return record
