"""Qwen3-VL, token for token with ``Qwen3VLProcessor`` and logit for logit with ``Qwen3VLForConditionalGeneration``.

The processor is built in code (patch 16, merge 2, small budgets, 4 fps video sampling, at most 12 frames)
and saved into a checkpoint folder that the build reads with ``--processor``; the chat template is a
Qwen3-VL-style fixture. Records hold the awkward media of the family harness.
"""

from __future__ import annotations

import pytest

pytest.importorskip("av")
pytest.importorskip("torchvision")

from family_assets import FAMILY_ASSETS  # noqa: E402
from family_harness import build_family, check_equivalence, check_ids, write_media, write_records  # noqa: E402

from packer.loader import PackedDataset  # noqa: E402

ASSETS = FAMILY_ASSETS["qwen3vl"]


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    root = tmp_path_factory.mktemp("qwen3vl")
    files = write_media(root, ASSETS.kinds)
    source, records = write_records(root, ASSETS.kinds, files)
    processor = ASSETS.processor(root / "checkpoint")
    manifest = build_family("qwen3vl", root / "checkpoint", source, root / "out", max_segments=4)
    return root, records, processor, manifest


def test_manifest_records_the_family_and_its_settings(built):
    _, _, processor, manifest = built
    family = manifest["tokenizer"]["family"]
    assert family["name"] == "qwen3vl" and family["processor_class"] == "Qwen3VLProcessor"
    settings = family["settings"]
    assert settings["image_patch_size"] == processor.image_processor.patch_size == 16
    assert settings["video_max_pixels"] == processor.video_processor.size.longest_edge
    assert settings["video_fps"] == processor.video_processor.fps and settings["video_max_frames"] == 12


def test_ids_equal_the_hf_processor(built):
    root, records, processor, _ = built
    check_ids(PackedDataset(root / "out"), processor, records, root)


@pytest.mark.slow  # a real forward and backward of every packed row
@pytest.mark.parametrize("impl", ["sdpa", "eager"])
def test_packed_rows_equal_each_record_alone(built, impl):
    root, records, processor, _ = built
    ds = PackedDataset(root / "out")
    model = ASSETS.model(processor, impl)
    check_equivalence(model, ds, processor, records, root, impl)
