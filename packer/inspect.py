"""``packer inspect``: what a build holds, recomputed from its packed shards.

Rows and tokens are read from the shards themselves (the ``n_tokens`` column, memory-
mapped), not copied from the manifest, so the summary also checks that they agree.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow.compute as pc

from packer.io.arrow import read_shard
from packer.stages.manifest import read_manifest


def summarize(out: str | Path) -> dict[str, Any]:
    out = Path(out)
    manifest = read_manifest(out)
    rows = tokens = segments = 0
    for entry in manifest["files"]["packed"]:
        table = read_shard(out / entry["file"])
        rows += table.num_rows
        tokens += int(pc.sum(table.column("n_tokens")).as_py() or 0)
        segments += int(pc.sum(pc.list_value_length(table.column("segment_ids"))).as_py() or 0)
    max_length = manifest["config"]["max_length"]
    lower_bound = -(-tokens // max_length)
    acc = manifest["accounting"]
    return {
        "output": str(out),
        "rows": rows,
        "segments": segments,
        "tokens": tokens,
        "max_length": max_length,
        "fill": tokens / max(1, rows * max_length),
        "lower_bound": lower_bound,
        "gap_to_lower_bound": rows - lower_bound,
        "records_read": acc["records_read"],
        "samples_packed": acc["samples_packed"],
        "quarantined": acc["quarantined"],
        "dropped": acc["dropped"],
        "quarantined_by_reason": acc["quarantined_by_reason"],
        "dropped_by_reason": acc["dropped_by_reason"],
        "truncated_samples": manifest["stats"]["truncated_samples"],
        "truncated_tokens": manifest["stats"]["truncated_tokens"],
        "split_samples": manifest["stats"].get("split_samples", 0),
        "split_pieces": manifest["stats"].get("split_pieces", 0),
        "shards": len(manifest["files"]["packed"]),
    }


def summary_text(s: dict[str, Any]) -> str:
    lines = [
        f"{s['output']}",
        f"  records      {s['records_read']:,} read = {s['samples_packed']:,} packed + "
        f"{s['quarantined']:,} quarantined + {s['dropped']:,} dropped",
        f"  rows         {s['rows']:,} in {s['shards']} shard(s); lower bound {s['lower_bound']:,} "
        f"(+{s['gap_to_lower_bound']:,})",
        f"  fill         {100 * s['fill']:.2f}% of {s['max_length']:,} tokens per row",
        f"  tokens       {s['tokens']:,} in {s['segments']:,} segments",
    ]
    if s["truncated_samples"]:
        lines.append(f"  truncated    {s['truncated_samples']:,} samples ({s['truncated_tokens']:,} tokens cut)")
    if s["split_samples"]:
        lines.append(f"  split        {s['split_samples']:,} samples into {s['split_pieces']:,} pieces")
    for title, reasons in (("quarantined", s["quarantined_by_reason"]), ("dropped", s["dropped_by_reason"])):
        if reasons:
            lines.append(f"  {title:<12} " + ", ".join(f"{r} {n:,}" for r, n in sorted(reasons.items(), key=lambda kv: -kv[1])))
    return "\n".join(lines)
