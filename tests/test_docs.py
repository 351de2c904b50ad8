"""What the docs and code say a reader can follow: every tracker number names the public project it is from (a
bare ``#123`` points at nothing a reader can look up), and two statements the docs once got wrong stay right."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PROJECTS = ("transformers", "lmms-eval", "ms-swift", "axolotl", "Megatron-LM", "verl", "trl", "datasets", "accelerate",
            "pytorch", "flash-attention", "vllm", "DeepSpeed", "lhotse", "torchtune")  # public trackers we cite
REFERENCE = re.compile(r"(?<![0-9A-Za-z#&:\"'])#([0-9]{2,})\b")  # #46711, not a colour (fill="#33404f", color:#114)
OURS = re.compile(r"\b(issue|ticket)s? #?[0-9]+\b", re.I)


def texts():
    for folder in ("packer", "docs", "bench", "pipelines", "tests"):
        for path in sorted((ROOT / folder).rglob("*")):
            if path.suffix in (".py", ".md", ".toml") and "__pycache__" not in path.parts and path.name != "test_docs.py":
                yield path, path.read_text(encoding="utf-8")
    yield ROOT / "README.md", (ROOT / "README.md").read_text(encoding="utf-8")


def test_every_tracker_number_names_its_public_project():
    bare, ours = [], []
    for path, text in texts():
        for n, line in enumerate(text.splitlines(), 1):
            for m in REFERENCE.finditer(line):
                if not any(p in line[: m.start()] for p in PROJECTS):
                    bare.append(f"{path.relative_to(ROOT)}:{n}: {line.strip()}")
            ours += [f"{path.relative_to(ROOT)}:{n}: {line.strip()}" for _ in OURS.finditer(line)]
    assert not bare, "a tracker number without its project (write e.g. 'transformers #46711'):\n" + "\n".join(bare)
    assert not ours, "a tracker number of ours, which a reader cannot look up:\n" + "\n".join(ours)


def test_the_docs_say_how_videos_are_given_and_what_a_media_item_costs():
    inputs = (ROOT / "docs" / "inputs.md").read_text()
    assert '{"video": "clip.mp4"' in inputs and "a list of frame images" in inputs
    pipeline = (ROOT / "docs" / "pipeline.md").read_text()
    assert "currently takes one placeholder position" not in pipeline
    assert "the exact number of" in pipeline or "encoder outputs" in pipeline
