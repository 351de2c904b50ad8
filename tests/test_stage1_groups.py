"""Stage 1 holds one group of a task's records and their embedded media at a time, never the whole task.

A WebDataset shard is one task (gigabytes in practice): its samples are read, encoded and their media appended to the
task's media shard a group at a time (``GROUP_RECORDS`` records, fewer once their media reach ``GROUP_BLOB_BYTES``),
then forgotten. With the bound set small, the most bytes the process ever holds stays within a group, and the build is
the one an unbounded worker makes: the same packed rows, every blob once in the task's media shard.
"""

from __future__ import annotations

import io
import json
import tarfile
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from packer.build import build
from packer.config import resolve
from packer.io import blobs
from packer.stages import encode

ROOT = Path(__file__).resolve().parents[1]
SAMPLES = 40


def png(k: int) -> bytes:
    from PIL import Image

    pixels = np.random.default_rng(k).integers(0, 255, (96, 96, 3), dtype=np.uint8)  # noise: ~27 KB, each its own
    buf = io.BytesIO()
    Image.fromarray(pixels).save(buf, "PNG")
    return buf.getvalue()


@pytest.fixture(scope="module")
def shard(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("groups") / "data.tar"
    with tarfile.open(path, "w") as tar:
        for k in range(SAMPLES):
            record = {"id": f"s{k}", "conversations": [{"from": "human", "value": f"<image>\nWhat is {k}?"},
                                                       {"from": "gpt", "value": f"Noise number {k}."}]}
            for ext, data in (("json", json.dumps(record).encode()), ("png", png(k % 30))):
                info = tarfile.TarInfo(f"{k:05d}.{ext}")
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
    return path


def run(shard: Path, out: Path):
    config = resolve(ROOT / "pipelines" / "qwen3vl.toml", input=[str(shard)], output=str(out), max_length=2048,
                     modalities=["image"])
    return build(config, progress=False)


def test_a_worker_holds_one_group_of_media_and_builds_what_an_unbounded_one_does(shard, tmp_path, monkeypatch):
    whole = run(shard, tmp_path / "whole")
    held: list[int] = []
    put = blobs.Store.put

    def watched(self, data):
        key = put(self, data)
        held.append(self.nbytes())
        return key

    one = len(png(0))
    monkeypatch.setattr(encode, "GROUP_BLOB_BYTES", 4 * one)
    monkeypatch.setattr(blobs.Store, "put", watched)
    stage1: list[list[str]] = []  # the task's media shard as written (deleted once the build holds each blob once)
    write = encode.write_task_blobs

    def kept(target, tables, root):
        entry = write(target, tables, root)
        stage1.append(pa.ipc.open_stream(pa.memory_map(str(target))).read_all().column("name").to_pylist())
        return entry

    monkeypatch.setattr(encode, "write_task_blobs", kept)
    grouped = run(shard, tmp_path / "grouped")
    assert len(held) == SAMPLES and max(held) <= 5 * one + 4096  # a group closes once it holds 4 images' bytes
    assert [e.sha256 for e in grouped.files.packed] == [e.sha256 for e in whole.files.packed]
    [names] = stage1
    assert len(names) == len(set(names)) == 30  # 40 samples, 30 distinct images: each once, across the groups
