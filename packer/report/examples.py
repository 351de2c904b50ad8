"""The parts of the report a newcomer asked for: one packed row as the model will see it, with
the trained tokens marked, and what the media cost (tokens per image / clip, image sizes, clip
durations).

- ``sample_row``: a row holding several segments (and media, when the build has any), each
  segment decoded with the build's own tokenizer (``OUT/tokenizer``) into runs of trained and
  untrained text, its media placeholders collapsed to one ``[image x256]`` mark; at most
  :data:`SHOWN_TOKENS` tokens a segment and :data:`SHOWN_SEGMENTS` segments are shown.
- ``media``: the placeholder tokens of every image / clip / video (histograms, every item);
  the longest side of the images and the duration of the clips, read from the files' headers
  (:mod:`packer.media.probe`, nothing decoded) for at most :data:`PROBED` distinct files per kind,
  spread evenly over the refs the shards' stats offer (each shard up to
  :data:`packer.shards.stats.PROBED_REFS` a kind, spread over its sorted refs; the count probed is stated).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.compute as pc

from packer.shards.io import read_shard
from packer.shards.manifest import Manifest
from packer.shards.schema import IGNORE
from packer.shards.stats import ShardStats, spread

SHOWN_TOKENS = 400  # tokens of a segment shown in the rendered row
SHOWN_SEGMENTS = 4
ROWS_SEARCHED = 200  # rows looked at for an example with several segments (and media)
PROBED = 2000  # distinct files per kind whose header is read for the size / duration histograms
PREFETCHED = 256  # of them read ahead together where they are remote (packer.io.fs.prefetch)
SIDE_EDGES = [0, 64, 128, 256, 512, 1024, 2048, 4096, 8192]  # px, the last bin open
SECOND_EDGES = [0, 1, 2, 5, 10, 20, 30, 60, 120, 300]  # s, the last bin open


def sample_row(out: Path, manifest: Manifest) -> dict[str, Any] | None:
    """One row, segment by segment, as runs of ``{"text", "trained"}`` and ``{"media", "count"}``."""
    if not manifest.files.packed:
        return None
    table = read_shard(out / manifest.files.packed[0].file)
    if table.num_rows == 0:
        return None
    head = table.slice(0, ROWS_SEARCHED)
    segments = pc.list_value_length(head.column("cu_seqlens")).to_numpy() - 1
    media = pc.list_value_length(head.column("media")).to_numpy()
    score = (segments >= 2).astype(int) * 2 + (media > 0)  # several segments, then media: the most to see
    index = int(np.argmax(score))
    row = head.slice(index, 1).to_pylist()[0]
    try:
        tok = _decoder(out / "tokenizer")
    except Exception as e:  # noqa: BLE001 -- no tokenizer here: the report stands without the example
        return {"row": index, "error": f"cannot load {out / 'tokenizer'}: {str(e).splitlines()[0][:160]}"}
    cu, ids, labels = row["cu_seqlens"], row["input_ids"], row["labels"]
    shown = []
    for k in range(min(len(cu) - 1, SHOWN_SEGMENTS)):
        a, b = cu[k], cu[k + 1]
        spans = sorted((m["start"], m["length"], m["kind"]) for m in row["media"] if m["segment"] == k)
        pieces, hidden = _pieces(tok, ids, labels, a, b, spans)
        shown.append({"id": row["segment_ids"][k], "modality": row["segment_modality"][k], "tokens": b - a,
                      "trained": sum(v != IGNORE for v in labels[a:b]), "pieces": pieces, "hidden": hidden,
                      "role": row["segment_role"][k], "parent": row["segment_parent"][k]})  # a preference tree's
    return {"row": index, "tokens": row["n_tokens"], "segments": len(cu) - 1, "shown": shown}


def _decoder(folder: Path) -> Any:
    """Something with ``decode(ids)`` for the build's tokenizer: its ``tokenizer.json`` through the
    ``tokenizers`` library (light; transformers' tokenizer import pulls in torch), else transformers."""
    if (folder / "tokenizer.json").is_file():
        from tokenizers import Tokenizer

        return Tokenizer.from_file(str(folder / "tokenizer.json"))
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(folder), trust_remote_code=False)  # OUT/tokenizer: saved by packer


def _pieces(tok, ids: list[int], labels: list[int], a: int, b: int,
            spans: list[tuple[int, int, str]]) -> tuple[list[dict], int]:
    """Tokens ``a:b`` as runs of equal trained-ness, each decoded at once (byte-level BPE splits characters
    across tokens), and each media span as one mark; text stops after :data:`SHOWN_TOKENS` tokens (media
    marks are free). Returns the pieces and the tokens left unshown."""
    pieces: list[dict[str, Any]] = []
    t, budget = a, SHOWN_TOKENS
    while t < b and budget > 0:
        span = next((s for s in spans if s[0] <= t < s[0] + s[1]), None)
        if span is not None:
            pieces.append({"media": span[2], "count": span[1]})
            t = span[0] + span[1]
            continue
        trained = labels[t] != IGNORE
        end = t + 1
        while end < b and end - t < budget and (labels[end] != IGNORE) == trained and not any(s[0] == end for s in spans):
            end += 1
        pieces.append({"text": tok.decode(ids[t:end], skip_special_tokens=False), "trained": bool(trained)})
        budget -= end - t
        t = end
    return pieces, b - t


def media_section(manifest: Manifest, stats: ShardStats) -> dict[str, Any]:
    """Per kind: placeholder tokens per item (histogram), and sizes / durations from a sample of the files
    (the shards' stats carry both: no packed shard is read again)."""
    kind = stats.array("span_kinds").astype(object) if stats.span_kinds else np.zeros(0, object)
    length = stats.array("span_tokens").astype(np.int64)
    tokens = {}
    for k in sorted(set(kind.tolist())):
        n = length[kind == k]
        edges = [2**e for e in range(int(np.ceil(np.log2(max(2, int(n.max()))))) + 1)]  # 1, 2, 4, ...: the last bin open
        tokens[k] = {"edges": edges, "counts": _hist(n, edges), "items": int(len(n)), "mean": float(n.mean())}
    out_section: dict[str, Any] = {"tokens_per_item": tokens}
    root = manifest.media_root
    images = sorted(set(stats.media_refs.get("image", [])))
    clips = sorted(set(stats.media_refs.get("audio", [])))
    if images:
        out_section["image_sides"] = _probed(images, root, _image_side, SIDE_EDGES, "px")
    if clips:
        out_section["audio_seconds"] = _probed(clips, root, _clip_seconds, SECOND_EDGES, "s")
    return out_section


def _hist(values: np.ndarray, edges: list[float]) -> list[int]:
    """Counts per bin ``[edges[i], edges[i+1])``, the last bin ``[edges[-1], inf)``."""
    bins = np.clip(np.searchsorted(edges, values, side="right") - 1, 0, None)
    return np.bincount(bins, minlength=len(edges))[: len(edges)].tolist()


def _probed(refs: list[str], root: str, measure, edges: list[float], unit: str) -> dict[str, Any]:
    from packer.io import blobs, fs
    from packer.media.refs import resolve_ref

    picked = spread(refs, PROBED)
    values, unreadable = [], 0
    for at in range(0, len(picked), PREFETCHED):  # remote files read many at once (round trips overlap), then measured
        window = picked[at : at + PREFETCHED]
        held = fs.prefetch([resolve_ref(r, root) for r in window])
        try:
            for ref in window:
                try:
                    values.append(measure(ref, root))
                except Exception:  # noqa: BLE001 -- a file moved or damaged since the build: counted, not fatal
                    unreadable += 1
        finally:
            blobs.STORE.release_urls(held)
    return {"edges": edges, "counts": _hist(np.asarray(values, dtype=float), edges), "unit": unit,
            "distinct": len(refs), "probed": len(picked), "unreadable": unreadable}


def _image_side(ref: str, root: str) -> float:
    from packer.media.probe import probe_image
    from packer.media.refs import resolve_ref

    info = probe_image(resolve_ref(ref, root), "header")
    return float(max(info.width, info.height))


def _clip_seconds(ref: str, root: str) -> float:
    from packer.media.probe import probe_audio
    from packer.media.refs import resolve_ref

    return float(probe_audio(resolve_ref(ref, root)).seconds)
