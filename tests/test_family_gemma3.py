"""Gemma 3, token for token with ``Gemma3Processor`` and logit for logit with ``Gemma3ForConditionalGeneration``.

The processor is built in code (16 px images, 4 soft tokens an image) and saved into a checkpoint folder that the
builds read with ``--processor``; the chat template is a Gemma-3-style fixture. Two builds of the harness's
awkward records: the processor's defaults, and pan and scan on (crops of 8 px and more, as training would call
``processor(..., do_pan_and_scan=True, pan_and_scan_min_crop_size=8)``). The model's sliding window (3) is
shorter than an image, so the masks' window and bidirectional blocks both matter.
"""

from __future__ import annotations

import pytest

pytest.importorskip("torchvision")

from assets_gemma3 import IMAGE_SEQ_LENGTH, SCAN_CALL, gemma3_config  # noqa: E402
from family_harness import check_flex_forward, check_ids, conformance, hf_inputs, segments  # noqa: E402

from packer.families.checkpoint import read_checkpoint  # noqa: E402
from packer.families.gemma3 import Gemma3Settings  # noqa: E402
from packer.loader import PackedCollator, PackedDataset  # noqa: E402
from packer.loader.media import MediaMismatchError  # noqa: E402

FAMILY = "gemma3"
TestConformance = conformance(FAMILY)  # the packed == alone check on the pan and scan build


@pytest.fixture
def scan(alone):
    """The same records built with pan and scan on (the family's declared packed == alone build)."""
    return alone


def test_a_checkpoints_pan_and_scan_never_reaches_the_processor(tmp_path):
    """An image processor saved with do_pan_and_scan=True: Gemma3Processor still passes its own default (off)."""
    from assets_gemma3 import gemma3_tokenizer
    from family_assets import _save_and_load
    from PIL import Image
    from transformers import Gemma3ImageProcessor, Gemma3Processor

    ip = Gemma3ImageProcessor(size={"height": 16, "width": 16}, do_pan_and_scan=True, pan_and_scan_min_crop_size=8)
    processor = _save_and_load(Gemma3Processor(image_processor=ip, tokenizer=gemma3_tokenizer(), image_seq_length=4),
                               tmp_path)
    assert read_checkpoint(str(tmp_path)).image_processor["do_pan_and_scan"] is True
    assert not Gemma3Settings.resolve(read_checkpoint(str(tmp_path))).do_pan_and_scan
    wide = Image.new("RGB", (120, 30))
    assert len(processor(text=["<start_of_image>"], images=[wide])["pixel_values"]) == 1  # no crop
    assert len(processor(text=["<start_of_image>"], images=[wide], **SCAN_CALL)["pixel_values"]) == 5


def test_pan_and_scan_ids_equal_the_hf_processor(scan):
    ds = PackedDataset(scan.out)
    check_ids(ds, scan.processor, scan.records, scan.root, call=scan.call)
    spans = [m for i in range(len(ds)) for m in ds[i]["media"]]
    cropped = [m for m in spans if m["tokens"] > IMAGE_SEQ_LENGTH]
    assert cropped and all(m["length"] > m["tokens"] for m in cropped)  # crops, with the text between them
    assert {m["tokens"] // IMAGE_SEQ_LENGTH for m in spans} >= {1, 3, 5}  # no crop, 2 crops, 4 crops


def test_token_type_ids_equal_the_processors(scan):
    by_id = {r["id"]: r for r in scan.records}
    ds = PackedDataset(scan.out)
    rows = [ds[i] for i in range(len(ds))]
    batch = PackedCollator(family=ds.family, model_config=gemma3_config(scan.processor))(rows)
    for r, row in enumerate(rows):
        for a, b, rid in segments(row):
            expected = hf_inputs(scan.processor, by_id[rid], scan.root, call=scan.call)["token_type_ids"][0].tolist()
            assert batch["token_type_ids"][r, a:b].tolist() == expected, rid


def test_loader_names_a_file_whose_crops_changed(scan):
    root, processor = scan.root, scan.processor
    ds = PackedDataset(scan.out)
    row = next(ds[i] for i in range(len(ds)) if any(m["tokens"] > IMAGE_SEQ_LENGTH for m in ds[i]["media"]))
    span = next(m for m in row["media"] if m["tokens"] > IMAGE_SEQ_LENGTH)
    span["path"] = str(root / "img" / "one_1x1.png")  # a square image now: no crop
    collate = PackedCollator(processor=processor, family=ds.family, model_config=gemma3_config(processor))
    with pytest.raises(MediaMismatchError, match=r"one_1x1.png: the build gave this image \d+ placeholder positions but "
                                                 r"Gemma3ImageProcessor \(pan and scan on"):
        collate([row])


@pytest.mark.slow  # FlexAttention compiles its kernel on the CPU (forward only there)
def test_flex_rows_equal_each_record_alone(scan):
    ds = PackedDataset(scan.out)
    flex = scan.model("flex_attention")
    check_flex_forward(flex, scan.model("sdpa"), ds, scan.processor, scan.records, scan.root, rows=list(range(len(ds))),
                       call=scan.call, model_config=flex.config)


def test_crop_counts_equal_transformers():
    """packer's crop count = Gemma3ImageProcessor.pan_and_scan_batched's, over many sizes and settings."""
    import numpy as np
    import torch
    from transformers import Gemma3ImageProcessor

    from packer.families.gemma3 import pan_and_scan_crops

    rng = np.random.default_rng(0)
    sizes = [(1, 1), (10, 2000), (2000, 10), (300, 200), (256, 512), (100, 120), (120, 100), (513, 256)]
    sizes += [tuple(int(x) for x in rng.integers(1, 3000, 2)) for _ in range(300)]
    ip = Gemma3ImageProcessor()
    for min_crop, max_crops, ratio in ((256, 4, 1.2), (8, 4, 1.2), (64, 3, 2.0), (300, 8, 1.0)):
        s = Gemma3Settings(do_pan_and_scan=True, pan_and_scan_min_crop_size=min_crop, pan_and_scan_max_num_crops=max_crops,
                           pan_and_scan_min_ratio_to_activate=ratio)
        for h, w in sizes:
            crops = ip.pan_and_scan_batched(torch.empty(1, 3, h, w, dtype=torch.uint8), min_crop, max_crops, ratio)
            assert pan_and_scan_crops(h, w, s) == len(crops), (h, w, min_crop, max_crops, ratio)


