"""The on-disk format of a build: Arrow schemas, shard reader and writer, the typed
manifest, and row statistics. The loader, report, inspect and verify read a build
through this package only; the build stages write it.

- :mod:`packer.shards.schema` -- record dataclasses and the Arrow schemas derived from
  them (``schema_version`` 2), the version check.
- :mod:`packer.shards.io` -- Arrow IPC stream shards, written atomically, read
  memory-mapped.
- :mod:`packer.shards.manifest` -- :class:`Manifest`, ``manifest.json`` typed.
- :mod:`packer.shards.stats` -- per-shard row statistics (tokens, attention work, media),
  mergeable by addition: the report and the samplers' cost model share them.
- :mod:`packer.shards.invariants` -- what every packed row, sample and plan entry must hold: asked
  vectorised on every read (:mod:`packer.shards.integrity`) and row by row by ``packer verify``.
"""

from packer.shards.io import read_shard, read_shards, write_shard, write_shard_batches
from packer.shards.manifest import Accounting, FileAccount, Files, Manifest
from packer.shards.schema import (
    FEATURE_SCHEMA,
    IGNORE,
    PACKED_SCHEMA,
    PLAN_SCHEMA,
    SAMPLE_SCHEMA,
    SCHEMA_VERSION,
    MediaSpan,
    PackedRow,
    QuarantineEntry,
    ResponseSpan,
    Sample,
    ShardEntry,
)

__all__ = ["FEATURE_SCHEMA", "IGNORE", "PACKED_SCHEMA", "PLAN_SCHEMA", "SAMPLE_SCHEMA", "SCHEMA_VERSION", "Accounting",
           "FileAccount", "Files", "Manifest", "MediaSpan", "PackedRow", "QuarantineEntry", "ResponseSpan", "Sample",
           "ShardEntry", "read_shard", "read_shards", "write_shard", "write_shard_batches"]
