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
from family_harness import Built, FamilyConformance, build_family, check_equivalence, write_media, write_records  # noqa: E402

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


@pytest.mark.slow  # a real forward and backward of every packed row
@pytest.mark.parametrize("impl", ["sdpa", "eager"])
def test_packed_rows_equal_each_record_alone(built, impl):
    root, records, processor, _ = built
    ds = PackedDataset(root / "out")
    model = ASSETS.model(processor, impl)
    check_equivalence(model, ds, processor, records, root, impl)


@pytest.mark.parametrize("mode", ["ulysses", "ring"])
def test_sequence_parallel_slices_carry_the_family_columns_and_feature_rows(built, mode):
    """Each rank's placeholders take exactly the encoder rows the model would scatter there (timestamp text
    between a video's runs takes none), and mm_token_type_ids / visual_pos_masks (DeepStack) follow the slice."""
    import torch

    from packer.loader import PackedCollator
    from packer.loader.sequence_parallel import local_media_rows, shard_for_sequence_parallel

    root, _, _, _ = built
    ds = PackedDataset(root / "out")
    ids = ds.family["run_ids"]
    collate = PackedCollator(attention="varlen" if mode == "ring" else "sdpa", family=ds.family, pad_to_multiple_of=8)
    rows = [i for i in range(len(ds)) if any(len(m.get("runs") or []) > 1 for m in ds[i]["media"])]
    assert rows  # rows holding a video with timestamps between its runs
    for index in rows[:2]:
        batch = collate([ds[index]])
        flat_ids = batch["input_ids"][0]
        for kind in ("image", "video"):
            is_pad = flat_ids == ids[kind]
            feature = torch.cumsum(is_pad.long(), 0) - 1  # the model's scatter order: the k-th placeholder gets row k
            for rank in range(2):
                local = shard_for_sequence_parallel(batch, rank, 2, mode=mode)
                local_ids = local["input_ids"][0]
                assert torch.equal(local["visual_pos_masks"][0], (local_ids == ids["image"]) | (local_ids == ids["video"]))
                assert torch.equal(local["mm_token_type_ids"][0] == (1 if kind == "image" else 2), local_ids == ids[kind])
                here = local["global_index"][local_ids == ids[kind]] if mode == "ring" else \
                    torch.nonzero(local_ids == ids[kind]).flatten() + local["global_index"][0]
                rows = local_media_rows(local["media"], batch["media"], kind=kind)
                assert torch.equal(rows, feature[_unpadded(here, batch, mode)]), (index, kind, rank)


def _unpadded(global_index, batch, mode):
    """Positions in the padded global sequence (ring pads each segment) -> positions in the batch."""
    import torch

    if mode == "ulysses":
        return global_index
    cu = batch["cu_seqlens"].tolist()
    padded, out, start = [], [], 0
    for a, b in zip(cu[:-1], cu[1:]):
        n_pad = -(-(b - a) // 4) * 4
        padded.append((start, a))
        start += n_pad
    for g in global_index.tolist():
        base, a = max(p for p in padded if p[0] <= g)
        out.append(a + g - base)
    return torch.tensor(out, dtype=torch.long)


@pytest.mark.slow  # the real processor on ~20 records, videos decoded
def test_verify_against_processor_passes_on_the_build_and_names_a_changed_setting(built, tmp_path):
    from click.testing import CliRunner

    from packer.against_processor import verify_against_processor
    from packer.cli import main

    root, _, _, _ = built
    mismatches, checked = verify_against_processor(root / "out", str(root / "checkpoint"), sample=6)
    assert checked == 6 and mismatches == [], [str(m) for m in mismatches]
    ok = CliRunner().invoke(main, ["verify", str(root / "out"), "--against-processor", str(root / "checkpoint"),
                                   "--sample", "3"])
    assert ok.exit_code == 0 and "ids equal" in ok.output, ok.output

    other = ASSETS.processor(tmp_path / "other", fps=2)  # another sampling rate: other frames, other timestamps
    other.image_processor.size = {"shortest_edge": 32 * 32 * 4, "longest_edge": 32 * 32 * 24}  # another max_pixels
    other.save_pretrained(str(tmp_path / "other"))
    mismatches, checked = verify_against_processor(root / "out", str(tmp_path / "other"), sample=12)
    assert mismatches and all(m.packer_tokens != m.processor_tokens or m.first_difference >= 0 for m in mismatches)
    assert {"image", "video"} <= {k for m in mismatches for k in ("image", "video") if k in m.detail}
    bad = CliRunner().invoke(main, ["verify", str(root / "out"), "--against-processor", str(tmp_path / "other"),
                                    "--sample", "12"])
    assert bad.exit_code == 6 and "differ from" in bad.output and "first difference at token" in bad.output, bad.output


def test_video_defaults_are_the_video_processors_and_image_defaults_the_published_checkpoints():
    """Without --processor the family counts with Qwen3VLVideoProcessor's own defaults; the image processor class
    is Qwen2-VL's (patch 14), so the family's image defaults are Qwen3-VL's published 16 x 2 instead."""
    from transformers import Qwen3VLVideoProcessor

    from packer.families.checkpoint import Checkpoint
    from packer.families.qwen3vl import Qwen3VLSettings

    s, vp = Qwen3VLSettings.resolve(Checkpoint()), Qwen3VLVideoProcessor()
    assert (s.video_patch_size, s.video_merge_size, s.video_temporal_patch_size) == (vp.patch_size, vp.merge_size,
                                                                                     vp.temporal_patch_size)
    assert (s.video_min_pixels, s.video_max_pixels) == (vp.size.shortest_edge, vp.size.longest_edge)
    assert (s.video_fps, s.video_min_frames, s.video_max_frames, s.max_video_tokens) == (vp.fps, vp.min_frames,
                                                                                         vp.max_frames, vp.max_video_tokens)
    assert s.video_sample == vp.do_sample_frames and s.cap_pixels_per_frame == bool(vp.cap_pixels_per_frame)
    assert (s.image_patch_size, s.image_merge_size) == (16, 2)


class TestConformance(FamilyConformance):
    family = "qwen3vl"

    @pytest.fixture
    def case(self, built):
        root, records, processor, _ = built
        return Built(self.family, root / "out", root, records, processor, lambda: ASSETS.model(processor, "sdpa"))
