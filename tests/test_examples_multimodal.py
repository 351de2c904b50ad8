"""The multimodal training examples run as a user runs them: docs/examples/train_qwen2vl.py
and train_qwen2audio.py, each a subprocess on a build of its own pipeline
(pipelines/qwen2vl.toml, pipelines/qwen2audio.toml: their media policies unchanged, so
the examples' processors must match them), train a tiny random model for a few steps
with the media going through the HF processor in the collator. Each exits 0, its
batches hold media, and the loss is finite and falls.

Kept fast: the input is the JSONL holding that pipeline's media (llava.jsonl: images,
chat.jsonl: audio), and rows are short (512 tokens for images: larger images are left
out by the build; 1024 for audio: chat.jsonl's 4 rows, seen 3 times in 12 steps).
"""

from __future__ import annotations

import math
import os
import re
import subprocess
import sys

import pytest

from conftest import ROOT, SAMPLE, TOKENIZER
from packer.build import build
from packer.config import resolve
from packer.loader import PackedDataset

pytestmark = pytest.mark.slow  # trains two tiny models in subprocesses

STEP = re.compile(r"^step\s+(\d+)\s+loss\s+(\S+)\s+tokens\s+(\d+) trained of\s+(\d+)\s+(images|clips)\s+(\d+)$", re.M)
CASES = {  # example, pipeline, input, row length, steps, learning rate
    "qwen2vl": ("train_qwen2vl.py", "qwen2vl.toml", "llava.jsonl", 512, 12, 5e-3),
    "qwen2audio": ("train_qwen2audio.py", "qwen2audio.toml", "chat.jsonl", 1024, 12, 5e-3),
}


@pytest.mark.parametrize("name", list(CASES))
def test_example_trains_a_tiny_model_and_the_loss_falls(name, tmp_path):
    script, pipeline, source, max_length, steps, lr = CASES[name]
    out = tmp_path / "out"
    config = resolve(ROOT / "pipelines" / pipeline, input=[str(SAMPLE / source)], tokenizer=TOKENIZER, output=str(out),
                     max_bad_fraction=1.0,  # at this short max_length the large images do not fit (media_over_capacity)
                     max_length=max_length)
    build(config, progress=False)
    assert len(PackedDataset(out)) > 0

    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false",
           "PYTHONPATH": os.pathsep.join([str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])}
    run = subprocess.run([sys.executable, str(ROOT / "docs" / "examples" / script), str(out), "--steps", str(steps),
                          "--lr", str(lr)], capture_output=True, text=True, timeout=300, env=env, cwd=ROOT)
    assert run.returncode == 0, run.stderr[-4000:]
    rows = STEP.findall(run.stdout)
    assert [int(r[0]) for r in rows] == list(range(steps)), run.stdout
    losses = [float(r[1]) for r in rows]
    assert all(math.isfinite(x) for x in losses), losses
    assert sum(int(r[5]) for r in rows) > 0, "no batch held media: the processor path did not run"
    first, last = sum(losses[:4]) / 4, sum(losses[-4:]) / 4
    assert last < first - 1.0, losses  # a random model overfits fast: from ~ln(vocab) = 7.3 down by well over 1
