"""Video end to end: pipelines/qwen2vl_video.toml builds sample_data's clips (a rotated one
and a video given as frame images included), every count the build wrote agrees with the
HF video processor at load time, and packed rows through tiny Qwen2-VL / Qwen2.5-VL give
each segment the logits it gets alone. (tests/test_video_loader.py compares the media
step against each record run the plain HF way.)"""

from __future__ import annotations

import json

import pytest
import torch
from mm_models import QWEN_IMAGE, qwen2vl_model, qwen2vl_processor

from conftest import ROOT
from packer.build import build
from packer.config import resolve
from packer.loader import PackedCollator, PackedDataset, model_inputs
from packer.verify import verify

pytestmark = pytest.mark.slow  # two tiny VLMs over every video of sample_data


@pytest.fixture(scope="module")
def video_build(tmp_path_factory):
    out = tmp_path_factory.mktemp("video") / "out"
    config = resolve(ROOT / "pipelines" / "qwen2vl_video.toml", input=[str(ROOT / "sample_data" / "video.jsonl")],
                     output=str(out), image_tokens=QWEN_IMAGE["image_tokens"], max_length=2048, order="planner")
    manifest = build(config, progress=False)
    assert manifest.accounting.quarantined == 0 and manifest.accounting.samples_packed == 4
    return out


def test_the_build_stores_video_spans_with_grids_and_time_steps(video_build):
    ds = PackedDataset(video_build)
    spans = [m for i in range(len(ds)) for m in ds[i]["media"] if m["kind"] == "video"]
    assert len(spans) == 4 and all(len(m["llm_grid"]) == 3 and m["second_per_grid_t"] > 0 for m in spans)
    listed = [m for m in spans if m["ref"].startswith("{")]
    assert len(listed) == 1 and len(listed[0]["frames"]) == 4 and json.loads(listed[0]["ref"])["fps"] == 2
    rotated = next(m for m in spans if "rotated" in m["ref"])
    assert rotated["llm_grid"][1] > rotated["llm_grid"][2]  # stored 64x48, shown upright 48x64: taller than wide
    assert not verify(video_build)[0]  # video spans cover only <|video_pad|>, and nothing else does


@pytest.mark.parametrize("version", ["2", "2.5"])
def test_packed_video_rows_equal_each_segment_alone(video_build, version):
    ds = PackedDataset(video_build)
    tok = ds.tokenizer()
    ids = {**ds.placeholder_ids}
    model = qwen2vl_model(ids, len(tok) + 1, "sdpa", version=version)
    processor = qwen2vl_processor(tok, version=version)
    extra = {"tokens_per_second": model.config.vision_config.tokens_per_second} if version == "2.5" else {}
    collate = PackedCollator(attention="sdpa", rope="mrope", processor=processor, **extra)
    rows = [ds[i] for i in range(len(ds))]
    with torch.no_grad():
        logits = model(**model_inputs(collate(rows))).logits
        for r, row in enumerate(rows):
            cu = row["cu_seqlens"].tolist()
            for k, (a, b) in enumerate(zip(cu[:-1], cu[1:], strict=True)):
                alone = {**row, "input_ids": row["input_ids"][a:b], "labels": row["labels"][a:b],
                         "cu_seqlens": [0, b - a], "n_tokens": b - a, "segment_ids": [row["segment_ids"][k]],
                         "segment_trained": [row["segment_trained"][k]], "n_trained": int(row["segment_trained"][k]),
                         "media": [{**m, "segment": 0, "start": m["start"] - a} for m in row["media"] if m["segment"] == k]}
                ref = model(**model_inputs(collate([alone]))).logits[0]
                diff = (logits[r, a:b] - ref).abs().max() / ref.abs().max()
                assert diff <= 1e-4, f"row {r} segment {k}: {diff:.2e}"
