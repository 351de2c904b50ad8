"""Every named job in pipelines/ builds sample_data, with its media policy honoured."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from conftest import ROOT, SAMPLE
from packer.build import build
from packer.config import resolve
from packer.media.policies import parse_policy
from packer.media.probe import probe_image

PIPELINES = sorted(p.name for p in (ROOT / "pipelines").glob("*.toml"))


@pytest.mark.parametrize("name", PIPELINES)
def test_pipeline_builds(name, tmp_path, monkeypatch):
    monkeypatch.chdir(ROOT)
    config = resolve(ROOT / "pipelines" / name, output=str(tmp_path / "o"))
    m = build(config, progress=False)
    acc = m["accounting"]
    assert acc["records_read"] == acc["samples_packed"] + acc["quarantined"] + acc["dropped"]
    assert acc["quarantined"] <= 8, acc["quarantined_by_reason"]  # only the deliberately broken records
    policy = parse_policy(config.image_tokens, "image")
    pad = m["tokenizer"]["placeholders"][config.image_token]
    n_images = 0
    for e in m["files"]["packed"]:
        for row in pa.ipc.open_stream(pa.memory_map(str(tmp_path / "o" / e["file"]))).read_all().to_pylist():
            ids = np.array(row["input_ids"])
            for span in row["media"]:
                if span["kind"] != "image":
                    continue
                n_images += 1
                info = probe_image(str(SAMPLE / span["ref"]))
                assert span["length"] == policy.count(info.height, info.width).length
                assert np.all(ids[span["start"] : span["start"] + span["length"]] == pad)
                if config.image_begin:
                    assert ids[span["start"] - 1] == m["tokenizer"]["placeholders"][config.image_begin]
    assert n_images > 0
