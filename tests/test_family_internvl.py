"""InternVL3 / 3.5, token for token with ``InternVLProcessor`` and logit for logit with
``InternVLForConditionalGeneration``.

The processor (``assets_internvl``: 56-px tiles of 4 features, at most 6 tiles an image, videos sampled to 3
frames) is saved into a checkpoint folder the build reads with ``--processor``; records hold the awkward media
of the family harness. The tile arithmetic and the frame sampling are also compared with the classes' own over
grids of sizes, and the per-record tile cap (``total_max_patches``) with the processor given that cap.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

pytest.importorskip("av")
pytest.importorskip("torchvision")

from assets_internvl import SEQ, internvl_processor  # noqa: E402
from family_harness import build_family, check_ids, conformance  # noqa: E402

from packer.families.checkpoint import read_checkpoint  # noqa: E402
from packer.families.internvl import InternVLSettings, number_of_tiles, record_max_patches, video_indices  # noqa: E402
from packer.loader import MediaMismatchError, PackedCollator, PackedDataset  # noqa: E402

FAMILY = "internvl"
TestConformance = conformance(FAMILY)  # without the 30-image row; tiles and frames share <IMG_CONTEXT>


def test_processor_options_override(tmp_path):
    from packer.errors import ConfigError

    internvl_processor(tmp_path / "ck")
    s = InternVLSettings.resolve(read_checkpoint(str(tmp_path / "ck")), "max_patches=2,total_max_patches=8")
    assert (s.max_patches, s.total_max_patches, s.tile_height) == (2, 8, 56)
    with pytest.raises(ConfigError, match="video_initial_shift"):
        InternVLSettings.resolve(read_checkpoint(""), "video_initial_shift=middle")


@pytest.mark.parametrize("tile, low, high", [(448, 1, 12), (56, 1, 6), (384, 2, 9), (100, 3, 3)])
def test_tiles_equal_the_image_processor(tile, low, high):
    from transformers import GotOcr2ImageProcessor

    ip = GotOcr2ImageProcessor(size={"height": tile, "width": tile}, min_patches=low, max_patches=high, crop_to_patches=True)
    s = InternVLSettings(tile_height=tile, tile_width=tile, min_patches=low, max_patches=high)
    sizes = [(h, w) for h in (1, 2, 13, 55, 56, 57, 200, 448, 449, 896, 1000, 2600) for w in (1, 10, 56, 300, 447, 900, 4000)]
    for h, w in sizes:
        assert number_of_tiles(h, w, s, high) == ip.get_number_of_image_patches(h, w, {}), (h, w)
    import torch  # the tiles the processor really cuts, for a few sizes

    for h, w in [(30, 100), (100, 30), (7, 700), (56, 56), (120, 61)]:
        out = ip(images=[torch.zeros(3, h, w, dtype=torch.uint8)], return_tensors="pt")
        assert int(out["num_patches"][0]) == number_of_tiles(h, w, s, high)


def test_frame_sampling_equals_the_video_processor():
    from transformers import InternVLVideoProcessor
    from transformers.video_utils import VideoMetadata

    checked = 0
    for settings in ({"num_frames": 3}, {"num_frames": 8, "initial_shift": False}, {"fps": 2.0}, {"num_frames": 5, "initial_shift": 1.5},
                     {"fps": 1.0, "initial_shift": 0}):
        vp = InternVLVideoProcessor(do_sample_frames=True, **settings)
        shift = settings.get("initial_shift", True)
        s = InternVLSettings(video_sample=True, video_num_frames=settings.get("num_frames", 0),
                             video_fps=settings.get("fps", 0.0),
                             video_initial_shift=str(shift).lower() if isinstance(shift, bool) else str(shift))
        for frames in (1, 2, 3, 5, 8, 17, 24, 80, 301):
            for rate in (4.0, 24.0, 29.97, 30.0):
                meta = VideoMetadata(total_num_frames=frames, fps=rate)
                try:
                    expected = vp.sample_frames(meta, num_frames=vp.num_frames, fps=vp.fps, initial_shift=vp.initial_shift).tolist()
                except (ValueError, ZeroDivisionError):
                    with pytest.raises(ValueError):
                        video_indices(frames, rate, s)
                    continue
                assert video_indices(frames, rate, s) == expected, (settings, frames, rate)
                checked += 1
    assert checked > 100
    assert video_indices(7, 30.0, InternVLSettings()) == list(range(7))  # do_sample_frames=False: every frame
    # where the processor raises, the family raises ValueError: the encoder quarantines the record (unsupported_video)
    with pytest.raises(ValueError, match="num_frames=4 exceeds the video's 3 frames"):
        video_indices(3, 30.0, InternVLSettings(video_sample=True, video_num_frames=4))
    with pytest.raises(ValueError, match="states none"):
        video_indices(5, 0.0, InternVLSettings(video_sample=True, video_fps=2.0))  # a frame list without a rate


class CappedProcessor:
    """The HF processor called as InternVL's fine-tuning code tiles: ``max_patches`` capped by the record's images."""

    def __init__(self, processor, total: int):
        self.processor, self.total = processor, total

    def __getattr__(self, name):
        return getattr(self.processor, name)

    def __call__(self, *args, images=None, **kwargs):
        if images:
            kwargs["max_patches"] = max(1, min(self.processor.image_processor.max_patches, self.total // len(images)))
        return self.processor(*args, images=images, **kwargs)


def test_tiles_capped_by_the_record_images(built, tmp_path):
    """``total_max_patches``: the ids equal the processor's given the capped ``max_patches`` (lmms-eval #1069,
    InternVL's fine-tuning rule); the 30-image record gets one tile an image, a single image all 6; the
    loader tiles each image with its record's cap, and the counts agree."""
    root, records, processor = built.root, built.records, built.processor
    out = tmp_path / "out"
    build_family("internvl", root / "checkpoint", root / "records.jsonl", out, max_segments=4,
                 processor_options="total_max_patches=6")
    ds = PackedDataset(out)
    check_ids(ds, CappedProcessor(processor, 6), records, root)
    s = InternVLSettings(max_patches=6, total_max_patches=6)
    assert [record_max_patches(s, n) for n in (1, 2, 3, 4, 7, 30)] == [6, 3, 2, 1, 1, 1]
    spans = [m for i in range(len(ds)) for m in ds[i]["media"] if m["kind"] == "image"]
    assert max(m["tokens"] for m in spans) > SEQ  # some image is tiled
    batch = PackedCollator(processor=processor, family=ds.family)([ds[i] for i in range(len(ds))])
    assert batch["pixel_values"].shape[0] * SEQ == int(sum(m["tokens"] for m in batch["media"]))
    uncapped = PackedCollator(processor=processor, family=PackedDataset(root / "out").family)
    with pytest.raises(MediaMismatchError, match=r"img/\S+: the build gave this image \d+ placeholder positions"):
        uncapped([ds[i] for i in range(len(ds))])


def test_every_frame_when_the_processor_does_not_sample(built, tmp_path):
    """The class default (``do_sample_frames=False``): every decoded frame is a ``Frame{i}:`` tile. Records with
    two videos are left out: the processor cannot stack videos of different frame counts (it raises)."""
    root, records = built.root, built.records
    processor = internvl_processor(tmp_path / "ck", video={"do_sample_frames": False, "num_frames": None})
    kept = [r for r in records if sum(p.get("type") == "video" for m in r["messages"] if isinstance(m["content"], list)
                                      for p in m["content"]) <= 1]
    source = root / "one_video.jsonl"
    source.write_text("".join(json.dumps(r) + "\n" for r in kept))
    build_family("internvl", tmp_path / "ck", source, tmp_path / "out", max_segments=4)
    ds = PackedDataset(tmp_path / "out")
    check_ids(ds, processor, kept, root)
    frames = [m["tokens"] // SEQ for i in range(len(ds)) for m in ds[i]["media"] if m["kind"] == "video"]
    assert max(frames) == 80  # the 20 s clip, whole


def test_loader_merges_tiles_and_frames_in_placeholder_order(built):
    """The record holding a video then an image: ``pixel_values`` = the video's frames, then the image's tiles, as
    InternVLProcessor merges them (the model scatters both into ``<IMG_CONTEXT>``)."""
    root, records, processor = built.root, built.records, built.processor
    ds = PackedDataset(built.out)
    rid = next(r["id"] for r in records if '"video"' in json.dumps(r) and '"image"' in json.dumps(r))
    row = next(ds[i] for i in range(len(ds)) if rid in ds[i]["segment_ids"])
    batch = PackedCollator(processor=processor, family=ds.family)([row])
    from family_harness import hf_inputs

    expected = hf_inputs(processor, next(r for r in records if r["id"] == rid), root)["pixel_values"]
    k = row["segment_ids"].index(rid)
    before = sum(m["tokens"] for m in batch["media"] if m["segment"] < k) // SEQ
    got = batch["pixel_values"][before : before + expected.shape[0]]
    assert got.shape == expected.shape and np.allclose(got.numpy(), expected.numpy(), atol=1e-6)


