"""Per-shard report accumulators: computed in parallel, merged by addition.

Everything a report needs from the rows is either a sum, a fixed-bin histogram, or a
short per-segment array (length, modality code) that merges by concatenation -- so a
shard's stats never need another shard, and stats of any split of the shards merge to
the same totals.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from packer.shards.io import read_shard
from packer.shards.schema import IGNORE, MEDIA_KINDS

# Per-row arrays (``ShardStats.array(f"row_{name}")``): a sampler's cost model inputs (packer.cost).
ROW_FIELDS = ("tokens", "attention", "media_items", "media_tokens", "image_items", "image_tokens", "image_square",
              "audio_items", "audio_tokens", "audio_square", "video_items", "video_tokens", "video_square", "trained")
KINDS = MEDIA_KINDS
PREFERENCE_FIELDS = ("preference_records", "responses", "tree_prompts", "tree_branches", "tokens_saved")
PROBED_REFS = 2000  # distinct files per kind a shard offers the report's size / duration histograms


def spread(items: list, n: int) -> list:
    """At most ``n`` of ``items``, evenly spaced (the first and the last kept)."""
    return items if len(items) <= n else [items[int(i)] for i in np.linspace(0, len(items) - 1, n)]


def length_edges(max_length: int) -> np.ndarray:
    """Power-of-two bin edges 1, 2, 4, ... up to and including max_length."""
    edges = [1]
    while edges[-1] < max_length:
        edges.append(min(edges[-1] * 2, max_length))
    return np.asarray(edges + [max_length + 1], dtype=np.int64)


@dataclass
class ModalityStats:
    samples: int = 0
    tokens: int = 0
    trained_tokens: int = 0
    media_items: int = 0
    media_tokens: int = 0

    def merge(self, other: ModalityStats) -> ModalityStats:
        return ModalityStats(*(a + b for a, b in zip(self.__dict__.values(), other.__dict__.values(), strict=True)))


@dataclass
class ShardStats:
    rows: int = 0
    tokens: int = 0
    segments: int = 0
    attention: float = 0.0  # sum over rows of sum(seg^2)
    per_modality: dict[str, ModalityStats] = field(default_factory=dict)
    segments_per_row: dict[int, int] = field(default_factory=dict)  # count -> rows
    row_tokens: list[np.ndarray] = field(default_factory=list)  # per row
    row_attention: list[np.ndarray] = field(default_factory=list)
    row_media_items: list[np.ndarray] = field(default_factory=list)
    row_media_tokens: list[np.ndarray] = field(default_factory=list)
    seg_lengths: list[np.ndarray] = field(default_factory=list)  # per segment (one per placed sample piece)
    # per segment, its tokens when its record's conversation runs alone: a tree's branch with its prompt, a tree's
    # prompt 0 (it is in each branch's); the segment's length for every other segment
    seg_alone: list[np.ndarray] = field(default_factory=list)
    seg_modality: list[np.ndarray] = field(default_factory=list)  # object arrays of names
    seg_identity: list[np.ndarray] = field(default_factory=list)  # int64 (input file << 40 | line) per segment
    sample_ids: list[np.ndarray] = field(default_factory=list)  # display id of each segment that starts a sample
    # per row and media kind: items, placeholder tokens, Σ tokens² over items (a tower's cost: packer.cost);
    # a video's square is tokens² / t: Qwen2-VL's tower attends within each temporal step
    row_image_items: list[np.ndarray] = field(default_factory=list)
    row_image_tokens: list[np.ndarray] = field(default_factory=list)
    row_image_square: list[np.ndarray] = field(default_factory=list)
    row_audio_items: list[np.ndarray] = field(default_factory=list)
    row_audio_tokens: list[np.ndarray] = field(default_factory=list)
    row_audio_square: list[np.ndarray] = field(default_factory=list)
    row_video_items: list[np.ndarray] = field(default_factory=list)
    row_video_tokens: list[np.ndarray] = field(default_factory=list)
    row_video_square: list[np.ndarray] = field(default_factory=list)
    row_trained: list[np.ndarray] = field(default_factory=list)  # supervised tokens (a segment's first never)
    # preference records (--preference): records and their responses; a tree's prompts, branches and the tokens
    # it saves against the pairs layout (each branch would repeat its prompt there)
    preference_records: int = 0
    responses: int = 0
    tree_prompts: int = 0
    tree_branches: int = 0
    tokens_saved: int = 0
    # the report's media section: each span's kind and placeholder tokens, and per kind (image, audio) up to
    # PROBED_REFS distinct files evenly spread over the shard's sorted refs (headers the report reads)
    span_kinds: list[np.ndarray] = field(default_factory=list)
    span_tokens: list[np.ndarray] = field(default_factory=list)
    media_refs: dict[str, list[str]] = field(default_factory=dict)
    # per row, the input file of its first segment: its source's capacity is the row's (Manifest.file_capacities)
    row_file: list[np.ndarray] = field(default_factory=list)

    def merge(self, other: ShardStats) -> ShardStats:
        per_modality = dict(self.per_modality)
        for k, v in other.per_modality.items():
            per_modality[k] = per_modality[k].merge(v) if k in per_modality else v
        spr = dict(self.segments_per_row)
        for k, v in other.segments_per_row.items():
            spr[k] = spr.get(k, 0) + v
        return ShardStats(
            self.rows + other.rows, self.tokens + other.tokens, self.segments + other.segments,
            self.attention + other.attention, per_modality, spr,
            self.row_tokens + other.row_tokens, self.row_attention + other.row_attention,
            self.row_media_items + other.row_media_items, self.row_media_tokens + other.row_media_tokens,
            self.seg_lengths + other.seg_lengths, self.seg_alone + other.seg_alone, self.seg_modality + other.seg_modality,
            self.seg_identity + other.seg_identity, self.sample_ids + other.sample_ids,
            *(getattr(self, f"row_{n}") + getattr(other, f"row_{n}") for n in ROW_FIELDS[4:]),
            **{k: getattr(self, k) + getattr(other, k) for k in PREFERENCE_FIELDS},
            span_kinds=self.span_kinds + other.span_kinds, span_tokens=self.span_tokens + other.span_tokens,
            media_refs={k: self.media_refs.get(k, []) + other.media_refs.get(k, [])
                        for k in sorted({*self.media_refs, *other.media_refs})},
            row_file=self.row_file + other.row_file,
        )

    def samples(self) -> int:
        """Distinct samples packed, by integer identity (pieces of a split sample counted once)."""
        return int(np.unique(self.array("seg_identity").astype(np.int64)).size)

    def duplicate_ids(self) -> int:
        """Samples whose display id another packed sample also has (harmless: identity is integer)."""
        ids = np.concatenate(self.sample_ids) if self.sample_ids else np.zeros(0, dtype=object)
        if not len(ids):
            return 0
        _, counts = np.unique(ids.astype(str), return_counts=True)
        return int(counts[counts > 1].sum())

    def array(self, name: str) -> np.ndarray:
        parts = getattr(self, name)
        return np.concatenate(parts) if parts else np.zeros(0)


def shard_stats(path: str | Path) -> ShardStats:
    """Stats of one packed shard, vectorised over its flattened columns (no per-token Python)."""
    return table_stats(read_shard(path))


def table_stats(table: pa.Table) -> ShardStats:
    """Stats of packed rows (a shard, or any run of its rows: they merge to the shard's)."""
    stats = ShardStats(rows=table.num_rows)
    if table.num_rows == 0:
        return stats
    n_tokens = table.column("n_tokens").to_numpy().astype(np.int64)
    stats.tokens = int(n_tokens.sum())
    cu = table.column("cu_seqlens").combine_chunks()
    cu_values = cu.values.to_numpy().astype(np.int64)
    cu_offsets = cu.offsets.to_numpy().astype(np.int64)
    n_seg = np.diff(cu_offsets) - 1  # segments per row
    row_of_seg = np.repeat(np.arange(table.num_rows), n_seg)
    first = np.delete(np.arange(len(cu_values)), cu_offsets[1:] - 1)  # each segment's start entry
    seg_len = cu_values[first + 1] - cu_values[first]
    token_base = np.concatenate([[0], np.cumsum(n_tokens)])[:-1]
    seg_start = token_base[row_of_seg] + cu_values[first]  # in the shard's flattened tokens
    # A byte per token, chunk by chunk: the labels themselves (4 bytes a token) are never copied whole
    mask = np.concatenate([np.asarray(c) != IGNORE for c in pc.list_flatten(table.column("labels")).chunks]
                          or [np.zeros(0, bool)]).view(np.int8)
    trained = np.add.reduceat(mask, seg_start, dtype=np.int64) if len(seg_start) else np.zeros(0, np.int64)
    modality = pc.list_flatten(table.column("segment_modality")).cast(pa.string()).to_numpy(zero_copy_only=False)
    media = table.column("media").combine_chunks()
    spans = media.flatten()
    span_row = pc.list_parent_indices(media).to_numpy()
    seg_index = np.concatenate([[0], np.cumsum(n_seg)])[:-1]  # global segment number of each row's segment 0
    media_items = np.zeros(len(seg_len), np.int64)
    media_tokens = np.zeros(len(seg_len), np.int64)
    if len(spans):
        span_seg = seg_index[span_row] + pc.struct_field(spans, "segment").to_numpy()
        np.add.at(media_items, span_seg, 1)
        np.add.at(media_tokens, span_seg, pc.struct_field(spans, "tokens").to_numpy())
    row_att_extra, leader, alone = _preference(stats, table, seg_index, row_of_seg, seg_len)
    for mod in sorted(set(modality.tolist())):
        m = modality == mod
        stats.per_modality[mod] = ModalityStats(int((m & leader).sum()), int(seg_len[m].sum()), int(trained[m].sum()),
                                                int(media_items[m].sum()), int(media_tokens[m].sum()))
    counts = np.bincount(n_seg)
    stats.segments_per_row = {int(k): int(v) for k, v in enumerate(counts) if v}
    stats.segments = int(len(seg_len))
    square = seg_len.astype(np.float64) ** 2
    row_att = np.bincount(row_of_seg, weights=square, minlength=table.num_rows) + row_att_extra
    stats.attention = float(row_att.sum())
    stats.row_tokens = [n_tokens.astype(np.float64)]
    stats.row_attention = [row_att]
    stats.row_media_items = [np.bincount(row_of_seg, weights=media_items, minlength=table.num_rows)]
    stats.row_media_tokens = [np.bincount(row_of_seg, weights=media_tokens, minlength=table.num_rows)]
    stats.row_trained = [np.bincount(row_of_seg, weights=trained, minlength=table.num_rows)]
    span_kind, span_len, span_steps = np.zeros(0, object), np.zeros(0), np.ones(0)
    if len(spans):
        span_kind = pc.struct_field(spans, "kind").cast(pa.string()).to_numpy(zero_copy_only=False)
        span_len = pc.struct_field(spans, "tokens").to_numpy().astype(np.float64)
        span_steps = np.ones(len(spans))  # a video's temporal grid steps (llm_grid[0]); 1 for the rest
        grid = pc.struct_field(spans, "llm_grid")
        timed = (span_kind == "video") & (pc.list_value_length(grid).fill_null(0).to_numpy(zero_copy_only=False) > 0)
        if timed.any():
            span_steps[timed] = np.maximum(pc.list_element(grid.filter(pa.array(timed)), 0).to_numpy(), 1)
    stats.span_kinds = [span_kind.astype(object)]
    stats.span_tokens = [span_len.astype(np.int64)]
    if len(spans):
        refs = pc.struct_field(spans, "ref").to_numpy(zero_copy_only=False)
        for kind in ("image", "audio"):
            distinct = sorted(set(refs[span_kind == kind].tolist()))
            if distinct:
                stats.media_refs[kind] = spread(distinct, PROBED_REFS)
    for kind in KINDS:
        k = span_kind == kind
        per_row = lambda w, k=k: [np.bincount(span_row[k], weights=w, minlength=table.num_rows)]  # noqa: E731
        setattr(stats, f"row_{kind}_items", per_row(np.ones(int(k.sum()))))
        setattr(stats, f"row_{kind}_tokens", per_row(span_len[k]))
        setattr(stats, f"row_{kind}_square", per_row(span_len[k] ** 2 / span_steps[k]))
    stats.seg_lengths = [seg_len]
    stats.seg_alone = [alone]
    stats.seg_modality = [modality.astype(object)]
    source = pc.list_flatten(table.column("segment_source")).to_numpy().astype(np.int64)
    stats.row_file = [source[seg_index]]
    line = pc.list_flatten(table.column("segment_line")).to_numpy().astype(np.int64)
    start = pc.list_flatten(table.column("segment_start")).to_numpy()
    stats.seg_identity = [(source << 40) | line]
    stats.sample_ids = [pc.list_flatten(table.column("segment_ids")).to_numpy(zero_copy_only=False)[start == 0].astype(object)]
    return stats


def _preference(stats: ShardStats, table: pa.Table, seg_index: np.ndarray, row_of_seg: np.ndarray,
                seg_len: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Fill the preference counts; returns each row's extra attention work (a branch's queries over its
    prompt's keys: ``2 x branch x prompt`` in the units of ``seg^2``, the whole square), per segment
    whether it is the first of its record (what a record is counted by), and its length alone."""
    n = len(seg_len)
    group = pc.list_flatten(table.column("segment_group")).to_numpy().astype(np.int64)
    parent = pc.list_flatten(table.column("segment_parent")).to_numpy().astype(np.int64)
    role = pc.list_flatten(table.column("segment_role")).cast(pa.string()).to_numpy(zero_copy_only=False)
    own = np.arange(n) - seg_index[row_of_seg]
    leader = group == own
    extra = np.zeros(table.num_rows)
    branch = np.flatnonzero(parent >= 0)
    alone = seg_len.copy()
    if not (role != "").any():
        return extra, leader, alone
    stats.preference_records = int((leader & (role != "")).sum())
    stats.responses = int(((role != "") & (role != "prompt")).sum())
    stats.tree_prompts = int((role == "prompt").sum())
    stats.tree_branches = int(len(branch))
    if len(branch):
        of = seg_index[row_of_seg[branch]] + parent[branch]  # the branch's prompt, as a global segment number
        children = np.bincount(of, minlength=n)
        prompts = np.flatnonzero(children)
        stats.tokens_saved = int(((children[prompts] - 1) * seg_len[prompts]).sum())
        np.add.at(extra, row_of_seg[branch], 2.0 * seg_len[branch] * seg_len[of])
        alone[branch] += seg_len[of]
    alone[role == "prompt"] = 0
    return extra, leader, alone


def sample_stats(samples: pa.Table) -> dict[str, np.ndarray]:
    """Per sample, the :data:`ROW_FIELDS` a packed row of that sample alone would have (``samples`` holds the samples
    schema's ``length``, ``n_trained`` and ``media``): what :meth:`packer.cost.CostModel.vector` turns into the
    sample's cost vector. ``attention`` is ``length²`` (a preference sample's responses whole: the ``pairs`` layout,
    an upper bound of its tree)."""
    n = samples.num_rows
    length = samples.column("length").to_numpy().astype(np.float64) if n else np.zeros(0)
    out = {"tokens": length, "attention": length**2,
           "trained": samples.column("n_trained").to_numpy().astype(np.float64) if n else np.zeros(0)}
    media = samples.column("media").combine_chunks() if n else None
    spans = media.flatten() if n else []
    kind, tokens, steps, parent = np.zeros(0, object), np.zeros(0), np.ones(0), np.zeros(0, np.int64)
    if len(spans):
        parent = pc.list_parent_indices(media).to_numpy()
        kind = pc.struct_field(spans, "kind").cast(pa.string()).to_numpy(zero_copy_only=False)
        tokens = pc.struct_field(spans, "tokens").to_numpy().astype(np.float64)
        steps = np.ones(len(spans))
        grid = pc.struct_field(spans, "llm_grid")
        timed = (kind == "video") & (pc.list_value_length(grid).fill_null(0).to_numpy(zero_copy_only=False) > 0)
        if timed.any():
            steps[timed] = np.maximum(pc.list_element(grid.filter(pa.array(timed)), 0).to_numpy(), 1)
    out["media_items"] = np.bincount(parent, minlength=n).astype(np.float64)
    out["media_tokens"] = np.bincount(parent, weights=tokens, minlength=n)
    for k in KINDS:
        m = kind == k
        out[f"{k}_items"] = np.bincount(parent[m], minlength=n).astype(np.float64)
        out[f"{k}_tokens"] = np.bincount(parent[m], weights=tokens[m], minlength=n)
        out[f"{k}_square"] = np.bincount(parent[m], weights=tokens[m] ** 2 / steps[m], minlength=n)
    return out
