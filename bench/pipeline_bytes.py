"""The bytes every named job in pipelines/ packs: each pipeline built on sample_data into a temporary folder, and the
sha256 of each file it writes that the build's inputs and settings decide (samples/, plan.arrow, packed/,
quarantine.jsonl, dropped.jsonl, tokenizer/), one line each. A change that should leave behaviour alone (a
refactor) leaves this output the same: run it before and after and diff the two.

    python bench/pipeline_bytes.py > before.txt      # on the old code
    python bench/pipeline_bytes.py > after.txt       # on the new code
    diff before.txt after.txt                        # nothing: the same bytes

The manifest is left out (it records times, the code version and paths); its shard hashes are the files' above.
"""

from __future__ import annotations

import hashlib
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from packer.build import build  # noqa: E402
from packer.config import resolve  # noqa: E402

DECIDED = ("samples", "plan.arrow", "packed", "quarantine.jsonl", "dropped.jsonl", "tokenizer")


def digests(out: Path) -> list[tuple[str, str]]:
    files = [p for name in DECIDED for p in ([out / name] if (out / name).is_file() else sorted((out / name).rglob("*")))
             if p.is_file()]
    return [(p.relative_to(out).as_posix(), hashlib.sha256(p.read_bytes()).hexdigest()) for p in files]


def main(names: list[str]) -> None:
    pipelines = sorted((ROOT / "pipelines").glob("*.toml"))
    for path in pipelines:
        if names and path.stem not in names:
            continue
        with tempfile.TemporaryDirectory(prefix="packer-bytes-") as tmp:
            build(resolve(path, output=str(Path(tmp) / "out"), workers=1), progress=False)
            for name, sha in digests(Path(tmp) / "out"):
                print(f"{path.stem}  {name}  {sha}", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
