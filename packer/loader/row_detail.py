"""``packer inspect OUT --row K``: one packed row, segment by segment, read as a trainer reads it.

The row comes through :class:`~packer.loader.dataset.PackedDataset` (media refs resolved and checked against the
build's media index, counts of older builds derived) and its previews through the build's own tokenizer, so this
view sits with the loader; the build-wide summary (:mod:`packer.summary`) reads the shards alone.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from packer.errors import ArgumentError
from packer.loader.dataset import PackedDataset


def row_detail(out: str | Path, index: int, *, preview_chars: int = 100) -> dict[str, Any]:
    """Row ``index`` of a build, segment by segment, with a decoded preview of each
    (when the build's tokenizer can be loaded here; media spans shown as ``<image x576>``)."""
    ds = PackedDataset(out)
    if not -len(ds) <= index < len(ds):
        raise ArgumentError(f"--row {index} is out of range: the build has {len(ds)} rows; give 0 to {len(ds) - 1} "
                            f"(or -1 for the last)")
    row = ds[index]
    tok, note = _tokenizer(ds)
    cu = row["cu_seqlens"].tolist()
    segments = []
    for k, key in enumerate(row["segment_ids"]):
        a, b = cu[k], cu[k + 1]
        spans = [m for m in row["media"] if m["segment"] == k]
        seg = {"segment": k, "id": key, "modality": row["segment_modality"][k], "tokens": b - a,
               "trained_tokens": int((row["labels"][a:b] != -100).sum()),
               "media": [{"kind": m["kind"], "start": m["start"] - a, "length": m["length"], "tokens": m["tokens"],
                          "ref": m["ref"], "llm_grid": m["llm_grid"]} for m in spans]}
        if row["segment_role"][k]:  # a preference record's segment: its role, and a tree branch's parent
            weight = row["segment_weight"][k]
            seg.update(role=row["segment_role"][k], parent=row["segment_parent"][k],
                       weight=None if weight is None or weight != weight else weight)  # NaN: none given
        if tok is not None:
            seg["preview"] = _preview(tok, row["input_ids"][a:b].tolist(), [(m["start"] - a, m["length"], m["kind"])
                                                                              for m in spans], preview_chars)
        segments.append(seg)
    return {"row": index if index >= 0 else len(ds) + index, "n_tokens": int(row["n_tokens"]),
            "max_length": ds.max_length, "segments": segments, **({"note": note} if note else {})}


def _tokenizer(ds):
    """The build's own tokenizer (``OUT/tokenizer``), for previews."""
    try:
        return ds.tokenizer(), None
    except Exception as e:  # a build without OUT/tokenizer, or a damaged one: the rest of the summary still stands
        return None, f"no preview: cannot load {ds.out / 'tokenizer'} ({str(e).splitlines()[0][:120]})"


def _preview(tok, ids: list[int], spans: list[tuple[int, int, str]], chars: int) -> str:
    pieces, cursor = [], 0
    for start, length, kind in sorted(spans):
        pieces += [tok.decode(ids[cursor:start]), f"<{kind} x{length}>"]
        cursor = start + length
    pieces.append(tok.decode(ids[cursor:]))
    text = "".join(pieces).replace("\n", "\\n")
    return text if len(text) <= chars else text[: chars - 1] + "…"


def row_text(detail: dict[str, Any]) -> str:
    lines = [f"row {detail['row']}: {detail['n_tokens']:,} of {detail['max_length']:,} tokens, "
             f"{len(detail['segments'])} segments"]
    for s in detail["segments"]:
        media = ", ".join(f"{m['kind']} {m['ref']} @{m['start']}+{m['length']}" for m in s["media"])
        role = ""
        if "role" in s:
            role = f"  {s['role']}" + (f" (branch of [{s['parent']}])" if s["parent"] >= 0 else "")
        lines.append(f"  [{s['segment']}] {s['id']}{role}  {s['modality']}  {s['tokens']:,} tokens, "
                     f"{s['trained_tokens']:,} trained{'  ' + media if media else ''}")
        if "preview" in s:
            lines.append(f"      {s['preview']}")
    if "note" in detail:
        lines.append(f"  ({detail['note']})")
    return "\n".join(lines)
