"""Stage 4: the accounting and the manifest, written last: its presence means "done".

The accounting identity ``records_read = samples_packed + quarantined + dropped`` is
checked here, per input file and in total, before the manifest is written. The manifest
itself is the typed :class:`packer.shards.Manifest`.
"""

from __future__ import annotations

from packer.errors import PackerError
from packer.shards.manifest import Accounting, FileAccount

__all__ = ["FileAccount", "accounting"]


def accounting(by_file: dict[str, FileAccount], quarantined: dict[str, int], dropped: dict[str, int],
               blank_lines: int, *, check: bool = True) -> Accounting:
    acc = Accounting(
        records_read=sum(a.records for a in by_file.values()),
        samples_packed=sum(a.packed for a in by_file.values()),
        quarantined=sum(quarantined.values()),
        dropped=sum(dropped.values()),
        skipped=sum(a.skipped for a in by_file.values()),
        repeated=sum(a.repeated for a in by_file.values()),
        quarantined_by_reason=dict(sorted(quarantined.items())),
        dropped_by_reason=dict(sorted(dropped.items())),
        blank_lines=blank_lines,
        by_file=dict(sorted(by_file.items())),
    )
    if check and (wrong := acc.balanced()):
        raise PackerError(f"internal accounting error: {'; '.join(wrong)}")
    return acc
