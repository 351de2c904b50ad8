"""A build's numbers: what became of each input file's records and the statistics of the plan.

Every record read is packed, quarantined, dropped, or skipped by the mix; :func:`plan_stats` is what the manifest's
``stats`` holds of the plan (also re-derived by the deep verify).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.compute as pc

from packer import reasons
from packer.config.fields import BuildConfig
from packer.errors import BuildFailedError
from packer.pack import Plan
from packer.pack.plan import NO_ENCODER_COST
from packer.pipeline.encoded import Encoded
from packer.shards.manifest import Files, Manifest
from packer.stages.manifest import FileAccount, accounting
from packer.stages.planning import modality_codes, preference_responses


def _count_outcomes(by_file: dict[str, FileAccount], inputs: list[str], samples, p: Plan, m) -> None:
    """Packed, dropped, skipped (by the mix) and repeated per input file, from each sample's
    source_index."""
    file_of_sample = _file_of_sample(samples)
    dropped = np.concatenate(list(p.dropped.values())) if p.dropped else np.zeros(0, np.int64)
    extra = np.maximum(m.copies - 1, 0)
    extra[dropped] = 0
    n_dropped = np.bincount(file_of_sample[dropped], minlength=len(inputs))
    n_skipped = np.bincount(file_of_sample[m.skipped], minlength=len(inputs))
    n_samples = np.bincount(file_of_sample, minlength=len(inputs))
    n_repeated = np.bincount(file_of_sample, weights=extra, minlength=len(inputs)) if len(extra) else np.zeros(len(inputs))
    for k, name in enumerate(inputs):
        acc = by_file[name]
        acc.dropped, acc.skipped, acc.repeated = int(n_dropped[k]), int(n_skipped[k]), int(n_repeated[k])
        acc.packed = int(n_samples[k] - n_dropped[k] - n_skipped[k])


def _file_of_sample(samples) -> np.ndarray:
    """Each sample's input file (its number in ``inputs``)."""
    return samples.column("source_index").to_numpy().astype(np.int64) if samples.num_rows else np.zeros(0, np.int64)


def _preference_stats(config: BuildConfig, samples, p: Plan) -> dict[str, Any] | None:
    """The packed preference records (each copy an item) and their tokens in both layouts."""
    responses = preference_responses(samples)
    if not len(responses.sample):
        return None
    items = p.indices[p.starts == 0]  # one segment of each item starts at its sample's token 0
    at = np.searchsorted(responses.sample, items)
    at = at[(at < len(responses.sample)) & (responses.sample[np.minimum(at, len(responses.sample) - 1)] == items)]
    return {"layout": config.preference, "records": int(len(at)), "responses": int(responses.n[at].sum()),
            **{f"{layout}_tokens": int(responses.item_lengths(layout)[at].sum()) for layout in ("pairs", "tree")}}


def _budget_stats(config: BuildConfig, samples, p: Plan) -> dict[str, Any]:
    """``max_row_encoder``'s effect: the bound the rows are measured against (``token_bound``: the plan's lower bound
    of tokens, ``max_segments`` and media caps; the encoder's), samples over it; where no budget applied, why
    (``none``: no sample has an encoder cost, or each budget ``auto`` tried would have added a row)."""
    groups = {", ".join(g["sources"]): g["budgets"]["encoder"] for g in p.groups if "encoder" in g.get("budgets", {})}
    budget = p.budgets.get("encoder")
    none = None
    if budget is None and not groups:
        costly = bool(pc.any(pc.greater(samples.column("cost_encoder"), 0)).as_py())
        none = "each budget auto tried would add a row" if costly else NO_ENCODER_COST
    return {"setting": config.max_row_encoder, "budget": budget, "token_bound": p.lower_bound,
            "encoder_bound": p.resource_bound, "bound": p.bound, "gap_to_bound": p.n_bins - p.bound,
            "over_budget": int(sum(len(v) for v in p.over_budget.values())),
            **({"group_budgets": groups} if groups and budget is None else {}), **({"none": none} if none else {})}


def plan_stats(config: BuildConfig, samples, p: Plan) -> dict[str, Any]:
    """The manifest's ``stats`` that the plan ``p`` of ``samples`` (:func:`plan_columns`) under ``config`` decides: rows,
    tokens, fill, the lower bound ..., the row lengths. ``packer verify --deep`` re-derives them."""
    return {**_stats(config, samples, p), **_row_lengths(config, p)}


def _stats(config: BuildConfig, samples, p: Plan) -> dict[str, Any]:
    codes, names = modality_codes(samples)
    placed = np.zeros(len(codes), bool)  # a byte a sample, no sort: split pieces count their sample once
    placed[p.indices] = True
    counts = np.bincount(codes[placed], minlength=len(names)) if len(p.indices) else np.zeros(len(names))
    preference = _preference_stats(config, samples, p)
    return {
        **({"preference": preference} if preference else {}),
        "max_length": config.max_length,
        "rows": p.n_bins,
        "segments": int(len(p.indices)),
        "tokens": p.tokens,
        "fill": p.efficiency,
        "lower_bound": p.lower_bound,
        "gap_to_lower_bound": p.n_bins - p.lower_bound,
        **({"row_budget": _budget_stats(config, samples, p)} if config.max_row_encoder.strip() != "off" else {}),
        **({"policy_groups": list(p.groups)} if p.groups else {}),
        "truncated_samples": int(len(p.truncated)),
        "truncated_tokens": int(p.truncated_tokens),
        "split_samples": int(len(p.split)),
        "split_pieces": int(np.isin(p.indices, p.split).sum()) if len(p.split) else 0,
        "split_pieces_dropped": int(p.pieces_dropped),
        "split_lost_media": int(p.pieces_lost_media),
        "samples_by_modality": {n: int(c) for n, c in sorted(zip(names, counts, strict=True)) if c},
    }


def _row_lengths(config: BuildConfig, p: Plan) -> dict[str, Any]:
    """``--row-lengths``: the lengths (chosen from the planned rows for ``auto``), rows per length and the padding."""
    from packer.pack import buckets

    k, given = buckets.parse(config.row_lengths, config.max_length)
    if k is None and given is None:
        return {}
    tokens = p.bin_tokens()
    lengths = given if given is not None else buckets.choose_lengths(tokens, k, config.max_length)
    rows = np.bincount(buckets.bucket_of(tokens, lengths), minlength=len(lengths))
    return {"row_lengths": [int(x) for x in lengths], "rows_by_length": [int(x) for x in rows],
            "row_length_padding": buckets.padding(tokens, lengths)}


def check_bad_fraction(out: Path, config: BuildConfig, encoded: Encoded, tokenizer: dict[str, Any],
                       dropped: dict[str, int] | None = None, packed: int | None = None) -> None:
    """Fail the build, loudly, when too much of the input was lost: more than
    ``--max-bad-fraction`` of the records quarantined or dropped (``no_encoder`` aside: a
    declared choice, warned about), or nothing packed at all. Checked after stage 1
    (quarantine only: no time spent planning a lost cause) and after the plan."""
    records = sum(a.records for a in encoded.by_file.values())
    lost = {r: n for r, n in encoded.quarantined.items() if r not in reasons.NOT_BAD and r != "internal_error"}
    lost.update({r: lost.get(r, 0) + n for r, n in (dropped or {}).items()})
    bad = sum(lost.values())
    if records and bad / records > config.max_bad_fraction:
        message = (f"{bad:,} of {records:,} records ({100 * bad / records:.1f}%) were quarantined or dropped, over "
                   f"--max-bad-fraction {config.max_bad_fraction}: {reasons.top(lost)}. Each one is listed in "
                   f"{out / 'quarantine.jsonl'}{' and ' + str(out / 'dropped.jsonl') if dropped else ''}; fix the "
                   f"input, or pass --max-bad-fraction 1.0 to pack what is left")
    elif packed == 0 or (records and not encoded.sample_shards):
        message = (f"the build packed nothing: {records:,} records read, "
                   f"{sum(encoded.quarantined.values()):,} quarantined, {sum((dropped or {}).values()):,} dropped"
                   + (f" ({reasons.top({**encoded.quarantined, **(dropped or {})})})" if records else "")
                   + f"; see {out / 'quarantine.jsonl'}")
    else:
        return
    Manifest(config=config.content_dict(), tokenizer=tokenizer, inputs=encoded.inputs,
             files=Files(samples=encoded.sample_shards, quarantine=encoded.quarantine),
             accounting=accounting(encoded.by_file, encoded.quarantined, dict(dropped or {}), encoded.blank_lines,
                                   check=False),
             status="failed", failure=message, execution=config.execution_dict()).write(out)
    raise BuildFailedError(message)
