"""The loader in real trainers: HF Trainer, and FSDP over two processes (gloo, CPU)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from conftest import ROOT

pytestmark = pytest.mark.slow  # HF Trainer and FSDP over two processes

sys.path.insert(0, str(ROOT / "docs" / "examples"))


@pytest.fixture(scope="module")
def short_rows(tmp_path_factory):
    """sample_data built with the sample pipeline text only (the examples train a text model: a build holding media
    is refused for it) at 1,024-token rows: a CPU step over rows of 4,096 (sdpa with a block-diagonal mask, quadratic
    in the row) costs a test ten seconds; the trainers' steps do not depend on it."""
    from packer.build import build
    from packer.config import resolve

    out = tmp_path_factory.mktemp("short") / "out"
    build(resolve(ROOT / "pipelines" / "sample.toml", output=str(out), max_length=1024, modalities=(),
                  max_bad_fraction=1.0), progress=False)
    return out


def test_hf_trainer_steps_on_the_sample_build(short_rows, tmp_path):
    from hf_trainer import train

    out = short_rows
    losses = train(str(out), steps=8, output_dir=str(tmp_path / "trainer"), accumulation=1)
    assert len(losses) == 8 and all(x == x for x in losses)  # finite, no NaN
    assert sum(losses[-3:]) / 3 < sum(losses[:3]) / 3, losses


def test_fsdp_two_ranks_same_steps_no_hang_loss_falls(short_rows, tmp_path):
    out = short_rows
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2"]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    run = subprocess.run([*torchrun, str(ROOT / "docs" / "examples" / "fsdp_train.py"), str(out), "--steps", "6",
                          "--report-dir", str(tmp_path)], capture_output=True, text=True, timeout=300, env=env)
    assert run.returncode == 0, run.stderr[-3000:]
    reports = [json.loads((tmp_path / f"rank-{r}.json").read_text()) for r in (0, 1)]
    assert sorted(r["rank"] for r in reports) == [0, 1]
    assert reports[0]["steps"] == reports[1]["steps"] == 6
    assert reports[0]["batches_per_epoch"] == reports[1]["batches_per_epoch"]
    losses = reports[0]["losses"]
    assert losses == reports[1]["losses"]  # the reported loss is the global one
    assert all(x == x for x in losses) and losses[-1] < losses[0]
