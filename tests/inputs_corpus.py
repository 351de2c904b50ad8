"""One corpus of mixed records written in every input format packer reads, for the cross-format equivalence tests.

:func:`records` makes ``n`` records (text only, one image, several images, a video, an image with a video, audio;
the media kinds a family reads) from ``sample_data``'s media, in one canonical shape: ``messages`` whose content is a
list of parts (media parts without a path) and the record's media in top-level ``images`` / ``videos`` / ``audios``
lists, in the order the parts use them. :func:`write_formats` writes them as

- ``jsonl``: JSONL + the media files (copied beside it);
- ``parquet``: parquet with ``datasets`` ``List(Image())`` / ``List(Video())`` / ``List(Audio())`` columns holding the
  bytes (two row groups at least);
- ``disk``: a ``datasets.save_to_disk`` folder (two Arrow files);
- ``tar``: WebDataset tars (the record's ``json`` member, media members ``0.png``, ``1.jpg``, ``0.mp4``, ...);
- ``dataurl``: JSONL whose media are ``data:`` base64 URLs.

Every format holds the same records in the same order with the same ids, so builds of them must give the same packed
ids, labels, positions and spans.
"""

from __future__ import annotations

import base64
import io
import json
import mimetypes
import shutil
import tarfile
from pathlib import Path

SAMPLE = Path(__file__).resolve().parents[1] / "sample_data"
IMAGES = ["images/small_224.png", "images/square_336.png", "images/landscape_640x480.jpg", "images/portrait_480x640.png",
          "images/tall_300x900.png", "images/wide_1280x720.jpg"]
VIDEOS = ["videos/orbit_96x64_2s.mp4", "videos/rotated_64x48_1s.mp4", "videos/slow_80x60_3s.mp4"]
AUDIO = ["audio/tone_a4_1s.wav", "audio/tone_c5_2s.flac", "audio/chord_a_minor_4s.wav", "audio/chord_c_major_3s.flac"]
LISTS = {"image": "images", "video": "videos", "audio": "audios"}
WORDS = ("the picture shows shapes colours a clip tone motion frame light dark corner edge square circle sound "
         "pitch loud soft long short").split()


def _text(k: int, n: int) -> str:
    return " ".join(WORDS[(k * 7 + j * 3) % len(WORDS)] for j in range(n))


def records(n: int, kinds: tuple[str, ...]) -> list[dict]:
    """``n`` records cycling through the shapes the ``kinds`` allow (text only always)."""
    shapes = ["text"]
    if "image" in kinds:
        shapes += ["image", "images"]
    if "video" in kinds:
        shapes += ["video", "video+image"] if "image" in kinds else ["video"]
    if "audio" in kinds:
        shapes += ["audio", "audios"]
    out = []
    for k in range(n):
        shape = shapes[k % len(shapes)]
        media: list[tuple[str, str]] = []
        if shape == "image":
            media = [("image", IMAGES[k % len(IMAGES)])]
        elif shape == "images":
            media = [("image", IMAGES[k % len(IMAGES)]), ("image", IMAGES[(k + 1) % len(IMAGES)])]
        elif shape == "video":
            media = [("video", VIDEOS[k % len(VIDEOS)])]
        elif shape == "video+image":
            media = [("video", VIDEOS[k % len(VIDEOS)]), ("image", IMAGES[k % len(IMAGES)])]
        elif shape == "audio":
            media = [("audio", AUDIO[k % len(AUDIO)])]
        elif shape == "audios":
            media = [("audio", AUDIO[k % len(AUDIO)]), ("audio", AUDIO[(k + 2) % len(AUDIO)])]
        user = [{"type": kind, "text": None} for kind, _ in media] + [{"type": "text", "text": _text(k, 5 + k % 9)}]
        record = {"id": f"r{k:04d}", "messages": [
            {"role": "user", "content": user},
            {"role": "assistant", "content": [{"type": "text", "text": _text(k + 1, 4 + k % 13)}]}]}
        for kind, key in LISTS.items():
            if kind in kinds:
                record[key] = [path for m, path in media if m == kind]
        out.append(record)
    return out


def _jsonl(path: Path, rows: list[dict]) -> None:
    with path.open("w") as f:
        for r in rows:
            f.write(json.dumps(r) + "\n")


def _bytes(rel: str, root: Path = SAMPLE) -> bytes:
    return (root / rel).read_bytes()


def write_formats(folder: Path, rows: list[dict], kinds: tuple[str, ...], formats: tuple[str, ...] = (
        "jsonl", "parquet", "disk", "tar", "dataurl"), root: Path = SAMPLE) -> dict[str, Path]:
    """The input of each format (a file, a folder or a brace pattern), written under ``folder``; the records' media
    paths are relative to ``root``."""
    folder.mkdir(parents=True, exist_ok=True)
    out: dict[str, Path] = {}
    lists = [LISTS[k] for k in kinds]
    if "jsonl" in formats:
        base = folder / "jsonl"
        for r in rows:
            for key in lists:
                for rel in r[key]:
                    (base / rel).parent.mkdir(parents=True, exist_ok=True)
                    shutil.copyfile(root / rel, base / rel)
        base.mkdir(exist_ok=True)
        _jsonl(base / "data.jsonl", rows)
        out["jsonl"] = base / "data.jsonl"
    if "dataurl" in formats:
        def inline(rel: str) -> str:
            kind = mimetypes.guess_type(rel)[0] or "application/octet-stream"
            return f"data:{kind};base64," + base64.b64encode(_bytes(rel, root)).decode()
        (folder / "dataurl").mkdir(exist_ok=True)
        _jsonl(folder / "dataurl" / "data.jsonl", [{**r, **{key: [inline(p) for p in r[key]] for key in lists}} for r in rows])
        out["dataurl"] = folder / "dataurl" / "data.jsonl"
    if "parquet" in formats or "disk" in formats:
        dataset = _dataset(rows, kinds, root)
        if "parquet" in formats:
            (folder / "parquet").mkdir(exist_ok=True)
            dataset.to_parquet(str(folder / "parquet" / "data.parquet"), batch_size=max(1, len(rows) // 3))
            out["parquet"] = folder / "parquet" / "data.parquet"
        if "disk" in formats:
            dataset.save_to_disk(str(folder / "disk"), num_shards=2)
            out["disk"] = folder / "disk"
    if "tar" in formats:
        (folder / "tar").mkdir(exist_ok=True)
        per = -(-len(rows) // 3)
        for t in range(3):
            with tarfile.open(folder / "tar" / f"data-{t:03d}.tar", "w") as tar:
                for r in rows[t * per : (t + 1) * per]:
                    members = {"json": json.dumps({k: v for k, v in r.items() if k not in lists}).encode()}
                    for key in lists:
                        for j, rel in enumerate(r[key]):
                            members[f"{j}{Path(rel).suffix}"] = _bytes(rel, root)
                    for ext, data in members.items():
                        info = tarfile.TarInfo(f"{r['id']}.{ext}")
                        info.size, info.mtime = len(data), 0
                        tar.addfile(info, io.BytesIO(data))
        out["tar"] = folder / "tar" / "data-{000..002}.tar"
    return out


def _dataset(rows: list[dict], kinds: tuple[str, ...], root: Path = SAMPLE):
    """The rows as a ``datasets.Dataset`` with the media as ``List(Image())`` / ``List(Video())`` / ``List(Audio())``
    columns holding the files' bytes (as the hub's parquet holds them)."""
    from datasets import Audio, Dataset, Features, Image, List, Value, Video

    feature = {"image": Image(), "video": Video(), "audio": Audio()}
    part = {"type": Value("string"), "text": Value("string")}
    features = Features({"id": Value("string"),
                         "messages": List({"role": Value("string"), "content": List(part)}),
                         **{LISTS[k]: List(feature[k]) for k in kinds}})
    table = {"id": [r["id"] for r in rows], "messages": [r["messages"] for r in rows]}
    for k in kinds:
        table[LISTS[k]] = [[{"bytes": _bytes(rel, root), "path": Path(rel).name} for rel in r[LISTS[k]]] for r in rows]
    # the cells as the hub's parquet stores them ({bytes, path} structs), the features in the schema's metadata:
    # no encoding by datasets (its Audio() / Video() encoders want torchcodec)
    import pyarrow as pa

    return Dataset(pa.table(table, schema=features.arrow_schema))
