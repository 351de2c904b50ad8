"""``manifest.json``, typed: what a finished build holds and how it was made.

Written last by the build (its presence means "done"), read by the loader, report,
inspect, verify and repack -- all through :class:`Manifest`, never through string keys.
The JSON is written with sorted keys; ``created_at`` is the only field that differs
between two builds of the same inputs and settings.

    m = Manifest.read("out/sample")           # SchemaVersionError / PackerError with the fix
    m.files.packed[0].file, m.accounting.records_read, m.max_length, m.placeholders
"""

from __future__ import annotations

import dataclasses
import datetime
import functools
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from packer import __version__
from packer.errors import NotABuildError, PackerError, SchemaVersionError
from packer.io.files import write_text_atomic
from packer.io.fs import check_reachable, is_remote, location
from packer.shards.schema import SCHEMA_VERSION, ShardEntry, version_message

SECTIONS = ("embeddings", "audio_features")  # optional media passes, each {..., "files": [ShardEntry]}
MANIFEST = "manifest.json"
# Written before the manifest and listed in it under execution["report_files"]: the report shows
# created_at, the output's name and the execution-only report settings, so, like them, its files
# differ between two builds of the same inputs and settings.
REPORT_FILES = ("report.json", "report.html")


@dataclass
class FileAccount:
    """One input file's records and what became of them."""

    records: int = 0
    packed: int = 0
    quarantined: int = 0
    dropped: int = 0
    skipped: int = 0  # weighted mixing gave the record no copy
    repeated: int = 0  # extra copies packed (weights over 1); not records


@dataclass
class Accounting:
    """``records_read = samples_packed + quarantined + dropped + skipped``, in total and per
    input file (``skipped``: left out by a source weight or cap; ``repeated``: extra copies)."""

    records_read: int = 0
    samples_packed: int = 0
    quarantined: int = 0
    dropped: int = 0
    skipped: int = 0
    repeated: int = 0
    quarantined_by_reason: dict[str, int] = field(default_factory=dict)
    dropped_by_reason: dict[str, int] = field(default_factory=dict)
    blank_lines: int = 0
    by_file: dict[str, FileAccount] = field(default_factory=dict)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Accounting:
        return cls(**{**d, "by_file": {k: FileAccount(**v) for k, v in d.get("by_file", {}).items()}})

    def balanced(self) -> list[str]:
        """What does not add up (empty: the identity holds everywhere)."""
        out = []
        if self.records_read != self.samples_packed + self.quarantined + self.dropped + self.skipped:
            out.append(f"records_read {self.records_read} != samples_packed {self.samples_packed} + quarantined "
                       f"{self.quarantined} + dropped {self.dropped} + skipped {self.skipped}")
        for name, a in self.by_file.items():
            if a.records != a.packed + a.quarantined + a.dropped + a.skipped:
                out.append(f"{name}: {a.records} records read but {a.packed} packed + {a.quarantined} quarantined + "
                           f"{a.dropped} dropped + {a.skipped} skipped")
        for key, total in (("records", "records_read"), ("packed", "samples_packed"), ("quarantined", "quarantined"),
                           ("dropped", "dropped"), ("skipped", "skipped"), ("repeated", "repeated")):
            if self.by_file and sum(getattr(a, key) for a in self.by_file.values()) != getattr(self, total):
                out.append(f"by_file {key} do not sum to {total}")
        return out


@dataclass
class Files:
    samples: list[ShardEntry] = field(default_factory=list)
    packed: list[ShardEntry] = field(default_factory=list)
    plan: ShardEntry | None = None
    quarantine: ShardEntry | None = None
    dropped: ShardEntry | None = None  # dropped.jsonl: every dropped sample, like the quarantine
    tokenizer: list[ShardEntry] = field(default_factory=list)  # OUT/tokenizer/*, placeholder tokens included
    media: ShardEntry | None = None  # media.arrow: every media file's size, mtime (and sha256) at build time
    sample_media: list[ShardEntry] = field(default_factory=list)  # samples/media-part-*: a stage-1 task's blobs (gone
    # once the build is finished: an embedded build keeps each blob once, in media_shards or unpacked_media)
    media_shards: list[ShardEntry] = field(default_factory=list)  # media/part-*: a packed shard's blobs (media = "embed")
    unpacked_media: ShardEntry | None = None  # samples/media-unpacked.arrow: the blobs no packed row uses (for repack)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Files:
        one = lambda e: ShardEntry(**e) if e else None  # noqa: E731
        many = lambda key: [ShardEntry(**e) for e in d.get(key, [])]  # noqa: E731
        return cls(many("samples"), many("packed"), one(d.get("plan")), one(d.get("quarantine")), one(d.get("dropped")),
                   many("tokenizer"), one(d.get("media")), many("sample_media"), many("media_shards"),
                   one(d.get("unpacked_media")))

    def listed(self) -> list[ShardEntry]:
        singles = (self.plan, self.quarantine, self.dropped, self.media, self.unpacked_media)
        return [*self.samples, *self.sample_media, *self.packed, *self.media_shards, *(e for e in singles if e is not None),
                *self.tokenizer]

    @property
    def embedded(self) -> bool:
        """The build carries its media (``media = "embed"``): each packed shard has a media shard beside it."""
        return bool(self.media_shards)

    @property
    def blob_store(self) -> list[ShardEntry]:
        """Every media shard that holds blobs, the packed rows' first: each blob the samples name is in one of them."""
        return [*self.media_shards, *([self.unpacked_media] if self.unpacked_media else []), *self.sample_media]


@dataclass
class Manifest:
    config: dict[str, Any]  # the content settings (BuildConfig.content_dict())
    tokenizer: dict[str, Any]  # name, class, vocab_size, sha256, bos/eos ids, placeholders (token -> id)
    files: Files
    accounting: Accounting
    stats: dict[str, Any] = field(default_factory=dict)
    inputs: list[str] = field(default_factory=list)  # input files; segment_source indexes this list
    input_sources: list[int] = field(default_factory=list)  # the `input` entry (source) each input file came from
    media_root: str = ""  # stored media refs are relative to it
    status: str = "complete"
    failure: str | None = None
    execution: dict[str, Any] = field(default_factory=dict)  # how the build ran (engine, workers, output)
    sections: dict[str, dict[str, Any]] = field(default_factory=dict)  # embeddings / audio_features
    repacked_from: dict[str, Any] | None = None
    code: dict[str, Any] = field(default_factory=dict)  # packer_code (sha256 of its source), libraries (versions)
    schema_version: int = SCHEMA_VERSION
    packer_version: str = __version__
    created_at: str = field(default_factory=lambda: datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"))

    # ---------------------------------------------------------------- derived

    @property
    def max_length(self) -> int:
        return int(self.config["max_length"])

    def lower_bound(self, tokens: int) -> int:
        """Rows no packing of the build's ``tokens`` goes below: the plan's bound (``stats.lower_bound``: its tokens,
        ``max_segments`` and media caps, summed over the ``policy_groups``), at least ``ceil(tokens / max_length)``
        (a build whose stats lack it). The summary and report state the rows against it."""
        groups = self.stats.get("policy_groups") or []  # sources planned apart, each group at its own capacity
        if groups:
            from packer.pack.plan import groups_bound_and_fill

            return groups_bound_and_fill(groups, tokens)[0]
        return max(int(self.stats.get("lower_bound", 0)), -(-int(tokens) // self.max_length))

    def build_config(self, **overrides: Any):
        """The :class:`packer.config.BuildConfig` the build was made with (its content and plan settings; execution
        settings at their defaults), ``overrides`` applied: what ``packer repack`` re-plans with and
        :mod:`packer.verify.deep` re-derives the plan from. Keys of a build made before they existed take their old
        behaviour."""
        from packer.config import BuildConfig

        legacy = {"preference_strings": "chat"}  # how builds made before the key existed rendered string preference records
        values = {**legacy, **self.config, **overrides}
        return BuildConfig(**{k: tuple(v) if isinstance(v, list) else v for k, v in values.items()})

    def sources(self) -> list:
        """One :class:`packer.config.sources.Source` per ``input`` entry of the build (its weight, cap and own packing)."""
        from packer.config.sources import Source

        return [Source.parse(spec) for spec in self.config.get("input", [])]

    def file_capacities(self) -> list[int]:
        """Per input file (``inputs``), the capacity of the rows holding its samples: its source's own
        ``max_length``, else the build's. Rows never mix sources of two policies, so a row's capacity is that of
        its first segment's file."""
        own = [int(dict(s.policy).get("max_length", self.max_length)) for s in self.sources()]
        if not self.input_sources or not own:
            return [self.max_length] * len(self.inputs)
        return [own[k] for k in self.input_sources]

    def file_unpacked(self) -> list[bool]:
        """Per input file (``inputs``), whether its rows hold one sample each (its source's ``packing = false``, or
        the build's ``max_segments = 1``): such a row is as long as its sample, not filled to its capacity."""
        build = int(self.config.get("max_segments", 0) or 0) == 1
        own = [int(s.options().get("max_segments", 1 if build else 0)) == 1 for s in self.sources()]
        if not self.input_sources or not own:
            return [build] * len(self.inputs)
        return [own[k] for k in self.input_sources]

    @functools.cached_property
    def family(self):
        """The build's family (:class:`packer.families.Family`), read back from its record once per manifest
        (:meth:`~packer.families.Family.from_record`, which refuses a record no build writes); None for a build that
        records none. Every reader of a build (verify, the loader) takes it from here."""
        from packer.families import Family

        record = self.tokenizer.get("family")
        return Family.from_record(record) if record else None

    @property
    def placeholders(self) -> dict[str, int]:
        """Token string -> id of every placeholder / begin / end token the build added."""
        return dict(self.tokenizer.get("placeholders", {}))

    def placeholder_id(self, kind: str) -> int | None:
        """The id ``kind`` (``image`` / ``audio`` / ``video``) expands to: the family's placeholder run token."""
        runs = (self.tokenizer.get("family") or {}).get("runs") or {}
        return self.placeholders.get(runs.get(kind) or self.config.get(f"{kind}_token", ""))

    def section_files(self, section: str) -> list[ShardEntry]:
        return [ShardEntry(**e) for e in self.sections.get(section, {}).get("files", [])]

    @property
    def report_files(self) -> list[ShardEntry]:
        """``report.json`` / ``report.html`` as the build (or ``packer report``) wrote them."""
        return [ShardEntry(**e) for e in self.execution.get("report_files", [])]

    def all_files(self) -> list[ShardEntry]:
        return [*self.files.listed(), *(e for s in SECTIONS for e in self.section_files(s)), *self.report_files]

    # ---------------------------------------------------------------- JSON

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        sections = d.pop("sections")
        for key in ("failure", "repacked_from"):
            if d[key] is None:
                d.pop(key)
        return {**d, **sections}

    @classmethod
    def from_dict(cls, d: dict[str, Any], where: str = MANIFEST) -> Manifest:
        if not isinstance(d, dict):
            raise PackerError(f"{where} is not a packer manifest (a JSON object expected)")
        version = d.get("schema_version")
        if version != SCHEMA_VERSION:
            raise SchemaVersionError(version_message(where, version))
        known = {f.name for f in dataclasses.fields(cls)} - {"sections"}
        tokenizer = d.get("tokenizer", {})
        family = tokenizer.get("family") if isinstance(tokenizer, dict) else None
        if not isinstance(tokenizer, dict) or not isinstance(family, (dict, type(None))):  # read by every reader
            field, value = ("tokenizer", tokenizer) if not isinstance(tokenizer, dict) else ("tokenizer.family", family)
            raise PackerError(f"{where} is damaged or not a packer manifest ({field} = {value!r}, not an object); rebuild")
        try:
            return cls(**{k: v for k, v in d.items() if k in known and k not in ("files", "accounting")},
                       files=Files.from_dict(d["files"]), accounting=Accounting.from_dict(d["accounting"]),
                       sections={s: d[s] for s in SECTIONS if s in d})
        except (KeyError, TypeError, AttributeError) as e:
            raise PackerError(f"{where} is damaged or not a packer manifest ({type(e).__name__}: {e}); rebuild") from None

    def write(self, out: str | Path) -> Manifest:
        write_text_atomic(location(out) / MANIFEST, json.dumps(self.to_dict(), indent=2, sort_keys=True) + "\n")
        return self

    @classmethod
    def read(cls, out: str | Path, *, allow_failed: bool = False) -> Manifest:
        """The manifest of a finished build (a failed one raises unless ``allow_failed``)."""
        path = location(out) / MANIFEST
        if not path.is_file():
            if is_remote(path):  # a store that cannot be asked answers "no file": name the credentials instead
                check_reachable(str(path), what="build")
            raise NotABuildError(f"{out} is not a finished packer build: {path} is missing")
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except (ValueError, UnicodeDecodeError) as e:
            raise PackerError(f"{path} is damaged (not valid JSON: {e}); rebuild, or restore it from a copy") from None
        manifest = cls.from_dict(data, str(path))
        if manifest.status != "complete" and not allow_failed:
            raise PackerError(f"the build in {out} failed: {manifest.failure or 'status ' + manifest.status}")
        return manifest
