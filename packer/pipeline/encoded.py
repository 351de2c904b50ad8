"""What stage 1 of a build leaves for the later stages: :class:`Encoded` (the build and repack make it; accounting
and packing read it)."""

from __future__ import annotations

from dataclasses import dataclass, field

import pyarrow as pa

from packer.shards.schema import ShardEntry
from packer.stages.manifest import FileAccount


@dataclass
class Encoded:
    """What stage 1 leaves for the later stages (also rebuilt from a manifest by repack)."""

    inputs: list[str]  # the input files in order: a sample's source_index points into it
    sample_shards: list[ShardEntry]
    by_file: dict[str, FileAccount]  # records and quarantined filled in
    quarantined: dict[str, int]
    quarantine: ShardEntry
    blank_lines: int
    input_sources: list[int] = field(default_factory=list)  # the `input` entry each input file came from
    audio_truncated: int = 0  # clips of the samples cut to the audio encoder's window (--long-audio truncate)
    content_changed: dict = field(default_factory=dict)  # Encoder.content_changed, summed over the tasks
    columns: pa.Table | None = None  # planning.plan_columns of every sample, from the stage-1 results (None: read the shards)
    media: list = field(default_factory=list)  # the media index's rows, one per file, from the stage-1 results
    cost_model: dict = field(default_factory=dict)  # the samples' cost model (packer.cost.resolve_cost_model's record)
    blob_shards: list[ShardEntry] = field(default_factory=list)  # samples/media-part-*.arrow: the tasks' embedded media
    blob_inputs: list[str] = field(default_factory=list)  # the input files whose samples name embedded media
