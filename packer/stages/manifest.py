"""Stage 4: accounting and ``manifest.json``, written last: its presence means "done".

The accounting identity ``records_read = samples_packed + quarantined + dropped`` is
checked here, per input file and in total, before the manifest is written.
"""

from __future__ import annotations

import dataclasses
import datetime
import json
from pathlib import Path
from typing import Any

from packer import __version__
from packer.errors import PackerError, SchemaVersionError
from packer.io.files import write_text_atomic
from packer.schema import SCHEMA_VERSION, ShardEntry


@dataclasses.dataclass
class FileAccount:
    records: int = 0
    packed: int = 0
    quarantined: int = 0
    dropped: int = 0


def check_accounting(by_file: dict[str, FileAccount]) -> None:
    for name, acc in by_file.items():
        if acc.records != acc.packed + acc.quarantined + acc.dropped:
            raise PackerError(
                f"internal accounting error for {name}: {acc.records} records read but "
                f"{acc.packed} packed + {acc.quarantined} quarantined + {acc.dropped} dropped"
            )


def accounting(by_file: dict[str, FileAccount], quarantined: dict[str, int], dropped: dict[str, int],
               blank_lines: int, *, check: bool = True) -> dict[str, Any]:
    if check:
        check_accounting(by_file)
    return {
        "records_read": sum(a.records for a in by_file.values()),
        "samples_packed": sum(a.packed for a in by_file.values()),
        "quarantined": sum(quarantined.values()),
        "dropped": sum(dropped.values()),
        "quarantined_by_reason": dict(sorted(quarantined.items())),
        "dropped_by_reason": dict(sorted(dropped.items())),
        "blank_lines": blank_lines,
        "by_file": {name: dataclasses.asdict(a) for name, a in sorted(by_file.items())},
    }


def make_manifest(*, config: dict[str, Any], tokenizer: dict[str, Any], samples: list[ShardEntry],
                   packed: list[ShardEntry], plan: ShardEntry | None, quarantine: ShardEntry,
                   accounts: dict[str, Any], stats: dict[str, Any], extra: dict[str, Any] | None = None,
                   status: str = "complete") -> dict[str, Any]:
    manifest = {
        "schema_version": SCHEMA_VERSION,
        "packer_version": __version__,
        "status": status,
        # The only field that differs between two identical builds; keep it out of any hash.
        "created_at": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "config": config,
        "tokenizer": tokenizer,
        "files": {
            "samples": [dataclasses.asdict(e) for e in samples],
            "packed": [dataclasses.asdict(e) for e in packed],
            "plan": dataclasses.asdict(plan) if plan is not None else None,
            "quarantine": dataclasses.asdict(quarantine),
        },
        "accounting": accounts,
        "stats": stats,
        **(extra or {}),
    }
    return manifest


def write_manifest(out: Path, manifest: dict[str, Any]) -> dict[str, Any]:
    write_text_atomic(out / "manifest.json", json.dumps(manifest, indent=2, sort_keys=True) + "\n")
    return manifest


def read_manifest(out: str | Path, *, allow_failed: bool = False) -> dict[str, Any]:
    """The manifest of a finished build (a failed one raises unless ``allow_failed``)."""
    path = Path(out) / "manifest.json"
    if not path.is_file():
        raise PackerError(f"{out} is not a finished packer build: {path} is missing")
    manifest = json.loads(path.read_text(encoding="utf-8"))
    if manifest.get("schema_version") != SCHEMA_VERSION:
        raise SchemaVersionError(
            f"{path}: schema_version {manifest.get('schema_version')!r} is not supported (reads {SCHEMA_VERSION})"
        )
    if manifest.get("status") != "complete" and not allow_failed:
        raise PackerError(f"the build in {out} failed: {manifest.get('failure', 'status ' + str(manifest.get('status')))}")
    return manifest
