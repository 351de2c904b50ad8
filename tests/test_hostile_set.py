"""The hostile set: every case of ``hostile_media.CASES`` (decompression-bomb
videos, absurd rates, lying headers, a FIFO, lines over and under the limit, ...) beside normal
records, built through the command line with ``--max-bad-fraction 1``: exit 0, every line
accounted for with the reason it must have, ``packer verify --media`` passing, and the build's
peak memory within the stated bound of a build of the normal records alone."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest
from hostile_media import CASES, hostile_set

from conftest import ROOT, TOKENIZER

pytest.importorskip("av")

MAX_LINE = 2 * 2**20  # the set's --max-line-bytes: one case is over it, one (1 MiB) under
RUN = """
import json, resource, sys
sys.path.insert(0, {root!r})
from packer.cli import main
try:
    main({args!r}, standalone_mode=False)
    code = 0
except SystemExit as e:
    code = e.code
print(json.dumps({{"exit": code, "peak_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}}))
"""


def run_build(args: list[str], cwd) -> dict:
    r = subprocess.run([sys.executable, "-c", textwrap.dedent(RUN.format(root=str(ROOT), args=args))], capture_output=True,
                       text=True, timeout=600, cwd=cwd)  # outside the repository: no default pipeline under the flags
    assert r.returncode == 0, r.stderr[-3000:]
    return {**json.loads(r.stdout.strip().splitlines()[-1]), "stderr": r.stderr}


@pytest.mark.slow  # two subprocess builds, megabyte lines, generated media
def test_the_hostile_set_builds_accounts_for_every_line_and_verifies(tmp_path):
    src, expected = hostile_set(tmp_path)
    common = ["--tokenizer", TOKENIZER, "--max-bad-fraction", "1", "--max-line-bytes", str(MAX_LINE), "--workers", "1",
              "--max-length", str(2**20), "--image-tokens", "dynamic"]
    hostile = run_build(["build", "-i", str(src), "-o", str(tmp_path / "out"), *common], tmp_path)
    assert hostile["exit"] == 0, hostile["stderr"][-3000:]
    assert "Traceback" not in hostile["stderr"]

    manifest = json.loads((tmp_path / "out" / "manifest.json").read_text())
    acc = manifest["accounting"]
    assert acc["records_read"] == len(expected) == acc["samples_packed"] + acc["quarantined"] + acc["dropped"]
    quarantined = {q["line"]: q for q in map(json.loads, (tmp_path / "out" / "quarantine.jsonl").read_text().splitlines())}
    for line, (name, reason) in enumerate(expected, start=1):
        got = quarantined.pop(line, None)
        assert (got or {}).get("reason") == reason, (name, got)
    assert quarantined == {}
    assert acc["samples_packed"] == sum(reason is None for _, reason in expected)

    from packer.verify import verify

    assert [str(p) for p in verify(tmp_path / "out", media="stat")[0]] == []

    normal = tmp_path / "normal.jsonl"  # the baseline: the same command over the normal records only
    lines = src.read_bytes().splitlines(keepends=True)
    normal.write_bytes(b"".join(line for line, (_, reason) in zip(lines, expected, strict=True)
                                if reason is None and b"long_" not in line))
    base = run_build(["build", "-i", str(normal), "-o", str(tmp_path / "base"), *common], tmp_path)
    assert base["exit"] == 0
    largest_packed = max(len(line) for line, (_, reason) in zip(lines, expected, strict=True) if reason is None) / 2**20
    bound = 200 * largest_packed + 64  # MB: a record's stated bound (docs/reliability.md) plus slack for the media libraries
    assert hostile["peak_mb"] - base["peak_mb"] <= bound, (hostile["peak_mb"], base["peak_mb"], bound)


def test_the_hook_names_each_case_once():
    names = [c.name for c in CASES]
    assert len(names) == len(set(names)) and len(names) >= 12
