"""``packer inspect`` (this module is ``packer.summary``: ``inspect`` would shadow the standard library
when a script in this folder runs): what a build holds, recomputed from its packed shards.

Rows and tokens are read from the shards themselves (the ``n_tokens`` column, memory-
mapped), not copied from the manifest, so the summary also checks that they agree. One row
(``packer inspect OUT --row K``) is read as a trainer reads it: :mod:`packer.loader.row_detail`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow.compute as pc

from packer import reasons
from packer.config.sources import capacity_text, policy_text
from packer.io.fs import is_remote, location
from packer.pack.plan import NO_ENCODER_COST, groups_bound_and_fill
from packer.report.family import GENERIC, family_line, family_section, media_counts, settings_line
from packer.shards.io import read_shard
from packer.shards.manifest import Manifest

NOUNS = {"image": ("image", "images"), "video": ("video", "videos"), "audio": ("audio clip", "audio clips")}


def summarize(out: str | Path) -> dict[str, Any]:
    """A build in object storage is summarized from its manifest (reading the shards back would
    download the whole build; ``packer verify`` does that, checking every row)."""
    out = location(out)
    manifest = Manifest.read(out)
    rows = tokens = segments = 0
    kinds, lengths = [], []  # every media span's kind and placeholder tokens
    if is_remote(out):
        rows, tokens, segments = (int(manifest.stats.get(k, 0)) for k in ("rows", "tokens", "segments"))
    for entry in [] if is_remote(out) else manifest.files.packed:
        table = read_shard(out / entry.file)
        rows += table.num_rows
        tokens += int(pc.sum(table.column("n_tokens")).as_py() or 0)
        segments += int(pc.sum(pc.list_value_length(table.column("segment_ids"))).as_py() or 0)
        spans = pc.list_flatten(table.column("media"))
        kinds += pc.struct_field(spans, "kind").cast("string").to_pylist()
        lengths += pc.struct_field(spans, "tokens").to_pylist()
    max_length = manifest.max_length
    acc, stats = manifest.accounting, manifest.stats
    groups = stats.get("policy_groups") or []  # sources planned apart, each group at its own capacity
    lower_bound = manifest.lower_bound(tokens)
    fill = groups_bound_and_fill(groups, tokens)[1] if groups else tokens / max(1, rows * max_length)
    return {
        "output": str(out),
        "rows": rows,
        "segments": segments,
        "tokens": tokens,
        "max_length": max_length,
        "fill": fill,
        "policy_groups": groups,
        "sources": stats.get("sources") or [],
        "lower_bound": lower_bound,
        "gap_to_lower_bound": rows - lower_bound,
        "records_read": acc.records_read,
        "samples_packed": acc.samples_packed,
        "quarantined": acc.quarantined,
        "dropped": acc.dropped,
        "skipped": acc.skipped,
        "repeated": acc.repeated,
        "quarantined_by_reason": acc.quarantined_by_reason,
        "dropped_by_reason": acc.dropped_by_reason,
        "truncated_samples": stats.get("truncated_samples", 0),
        "truncated_tokens": stats.get("truncated_tokens", 0),
        "split_samples": stats.get("split_samples", 0),
        "split_pieces": stats.get("split_pieces", 0),
        "audio_truncated": stats.get("audio_truncated", 0),
        "row_budget": stats.get("row_budget"),
        "long_audio": manifest.config.get("long_audio", "truncate"),
        "shards": len(manifest.files.packed),
        "family": family_section(manifest),
        # a remote build's shards are not read: the counts its build recorded (None for a build made before)
        "media": manifest.stats.get("media") if is_remote(out) else media_counts(kinds, lengths),
    }


def source_line(a: dict[str, Any]) -> str:
    """One source's line: its records and what became of them, its rows against its own bound and capacity. A
    source whose rows also hold another source's (one policy, planned together) has no bound or fill of its own:
    its rows are counted with the others' on its group's line."""
    own = policy_text(a["policy"]) or "the build's packing"
    skipped = f", {a['skipped']:,} skipped" if a["skipped"] else ""
    head = (f"  {'source':<12} {a['input']} ({own}): {a['records']:,} records = {a['packed']:,} packed + "
            f"{a['quarantined']:,} quarantined + {a['dropped']:,} dropped{skipped}; ")
    if a["shared_rows"]:
        return (head + f"{a['tokens']:,} tokens in {a['rows']:,} rows of {a['capacity']:,}, {a['shared_rows']:,} of them "
                f"shared with other sources of its policy (their rows, bound and fill: the group line)")
    return (head + f"{a['rows']:,} rows of {a['capacity']:,}, lower bound {a['lower_bound']:,} "
            f"(+{a['gap_to_lower_bound']:,}), {a['tokens']:,} tokens, fill {100 * a['fill']:.2f}%")


def summary_text(s: dict[str, Any]) -> str:
    lines = [
        f"{s['output']}",
        f"  records      {s['records_read']:,} read = {s['samples_packed']:,} packed + "
        f"{s['quarantined']:,} quarantined + {s['dropped']:,} dropped"
        + (f" + {s['skipped']:,} skipped by the mix" if s.get("skipped") else ""),
        f"  rows         {s['rows']:,} in {s['shards']} shard(s); lower bound {s['lower_bound']:,} "
        f"(+{s['gap_to_lower_bound']:,})",
        f"  fill         {100 * s['fill']:.2f}% of {capacity_text(s['max_length'], s.get('policy_groups') or [])}",
        f"  tokens       {s['tokens']:,} in {s['segments']:,} segments",
    ]
    if s.get("family"):
        lines.append(f"  family       {family_line(s['family'])}")
        if s["family"]["name"] != GENERIC and settings_line(s["family"]):
            lines.append(f"  settings     {settings_line(s['family'])}")
    if s.get("media") and any(v["items"] for v in s["media"].values()):
        counted = [f"{v['items']:,} {NOUNS.get(k, (k, k))[v['items'] != 1]} ({v['tokens']:,} tokens)"
                   for k, v in s["media"].items() if v["items"]]
        lines.append("  media        " + ", ".join(counted))
    sources = s.get("sources") or []
    if any(a["policy"] for a in sources):  # without a source's own packing, the build's lines say it all
        lines += [source_line(a) for a in sources]
    for g in s.get("policy_groups") or []:  # sources of one policy share rows: the group's rows add up
        if len(g["sources"]) > 1:
            own = policy_text(g["policy"]) or "the build's packing"
            lines.append(f"  {'group':<12} {', '.join(g['sources'])} ({own}): {g['rows']:,} rows of {g['capacity']:,}, "
                         f"lower bound {g['lower_bound']:,}, fill {100 * g['fill']:.2f}%")
    b = s.get("row_budget") or {}
    if b and not (b["setting"] == "auto" and b.get("none") == NO_ENCODER_COST):  # the default with nothing to budget: quiet
        budget = f"{b['budget']:.4g}" if b.get("budget") else \
            ("each source group its own" if b.get("group_budgets") else f"none ({b.get('none', 'no encoder cost')})")
        lines.append(f"  row budget   encoder {budget} a row ({b['setting']}): rows against max(lower bound "
                     f"{b['token_bound']:,}, encoder bound {b['encoder_bound']:,}) +{b['gap_to_bound']:,}; "
                     f"{b['over_budget']:,} samples over it alone")
    if s.get("repeated"):
        lines.append(f"  repeated     {s['repeated']:,} extra copies (source weights over 1)")
    if s["truncated_samples"]:
        lines.append(f"  truncated    {s['truncated_samples']:,} samples ({s['truncated_tokens']:,} tokens cut)")
    if s["split_samples"]:
        lines.append(f"  split        {s['split_samples']:,} samples into {s['split_pieces']:,} pieces")
    if s.get("audio_truncated"):
        lines.append(f"  audio cut    {s['audio_truncated']:,} clips longer than the audio encoder's window: the model sees "
                     f"their first window (--long-audio drop quarantines them instead)")
    for title, counts in (("quarantined", s["quarantined_by_reason"]), ("dropped", s["dropped_by_reason"])):
        if counts:
            lines.append(f"  {title:<12} " + ", ".join(f"{r} {n:,}" for r, n in sorted(counts.items(), key=lambda kv: -kv[1])))
    lost = {**s["quarantined_by_reason"], **s["dropped_by_reason"]}
    for k, (reason, _) in enumerate(sorted(lost.items(), key=lambda kv: (-kv[1], kv[0]))[:3]):
        lines.append(f"  {'' if k else 'fix':<12} {reason}: {reasons.fix(reason)}")
    out = location(s["output"])
    details = [str(out / n) for n, k in (("quarantine.jsonl", "quarantined"), ("dropped.jsonl", "dropped")) if s[k]]
    if details:
        lines.append(f"  {'details':<12} {', '.join(details)} (file, line, id, reason of each)")
    lines.append(f"  {'report':<12} {out / 'report.html'}")
    return "\n".join(lines)
