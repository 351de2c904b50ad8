"""LLaVA-OneVision, token for token with ``LlavaOnevisionProcessor`` and logit for logit with
``LlavaOnevisionForConditionalGeneration``.

The processor is built in code (``tests/assets_llava_onevision.py``: 32 px tiles, 16 features a tile, pinpoints up
to 3 x 3 tiles, ``anyres_max_4``, videos sampled to 3 frames) and saved into a checkpoint folder that the build reads
with ``--processor``; the chat template is a LLaVA-OneVision-style fixture. Records hold the awkward media of the family
harness; a record's images reach the processor as one list (``apply_chat_template``'s way), so a record of several
images takes each image's base features and a newline, a record of one image the anyres tiles.
"""

from __future__ import annotations

import pytest

pytest.importorskip("av")
pytest.importorskip("torchvision")

import json  # noqa: E402
import re  # noqa: E402
from functools import partial  # noqa: E402

from assets_llava_onevision import ASSETS  # noqa: E402
from family_harness import (  # noqa: E402
    Built,
    build_family,
    check_equivalence,
    check_ids,
    check_rows_collate,
    check_settings,
    conformance,
    write_media,
    write_records,
)

from packer.loader import PackedCollator, PackedDataset, TokenBalancedSampler  # noqa: E402

FAMILY = "llava_onevision"
TestConformance = conformance(FAMILY)  # packed == alone on the row of r0


def test_the_sample_checkpoint_is_the_processors():
    """sample_data/processors/llava_onevision (written by make_sample_data.py): loads as the real processor, and the
    family reads the same settings from it."""
    from transformers import AutoProcessor

    from conftest import SAMPLE
    from packer.families.checkpoint import read_checkpoint
    from packer.families.llava_onevision import LlavaOnevisionSettings

    folder = SAMPLE / "processors" / "llava_onevision"
    processor = AutoProcessor.from_pretrained(str(folder))
    settings = LlavaOnevisionSettings.resolve(read_checkpoint(str(folder)))
    check_settings(ASSETS.settings, settings, processor, fixed=False)
    assert settings.num_image_tokens == 729 and settings.vision_aspect_ratio == "anyres_max_9"


SIZES = [(1, 1), (2000, 10), (13, 2600), (200, 300), (384, 384), (385, 383), (720, 1280), (1080, 1920), (4000, 3000),
         (2304, 2304), (5000, 200), (97, 5003), (768, 1153), (1, 700)]


@pytest.mark.parametrize("strategy, tokens", [("full", 729), ("default", 577)])
def test_image_counts_equal_the_processor_at_its_defaults(strategy, tokens):
    """The real geometry (384 px tiles, 36 pinpoints, anyres_max_9) over many sizes: the family's count of a
    record's one image = ``LlavaOnevisionProcessor._get_num_multimodal_tokens``."""
    import random

    from assets_llava_onevision import tokenizer
    from transformers import LlavaOnevisionImageProcessor, LlavaOnevisionProcessor, LlavaOnevisionVideoProcessor

    from packer.families.llava_onevision import LlavaOnevisionSettings, image_tokens

    proc = LlavaOnevisionProcessor(image_processor=LlavaOnevisionImageProcessor(), tokenizer=tokenizer(),
                                   video_processor=LlavaOnevisionVideoProcessor(), num_image_tokens=tokens, vision_feature_select_strategy=strategy)
    rng = random.Random(0)
    sizes = SIZES + [(rng.randint(1, 4000), rng.randint(1, 4000)) for _ in range(300)]
    expected = proc._get_num_multimodal_tokens(image_sizes=sizes)["num_image_tokens"]
    s = LlavaOnevisionSettings(num_image_tokens=tokens, vision_feature_select_strategy=strategy)
    assert [image_tokens(h, w, 1, s) for h, w in sizes] == expected


def test_frame_sampling_equals_the_processor():
    from transformers.video_utils import VideoMetadata, default_sample_indices_fn

    from packer.families.llava_onevision import LlavaOnevisionSettings, video_frames

    for frames in (1, 2, 3, 7, 17, 80, 301):
        for fps in (0.0, 4.0, 23.976, 30.0):
            meta = VideoMetadata(total_num_frames=frames, fps=fps or None)
            for setting in ({"video_num_frames": 3}, {"video_num_frames": 8}, {"video_fps": 1.0}, {"video_fps": 2.5}, {}):
                s = LlavaOnevisionSettings(video_sample=True, **setting)
                kwargs = {"num_frames": s.video_num_frames or None, "fps": s.video_fps or None}
                try:
                    expected = default_sample_indices_fn(meta, **kwargs).tolist()
                except ValueError:
                    expected = None
                try:
                    got = video_frames(frames, fps, s)
                except ValueError:
                    got = None
                assert got == expected, (frames, fps, setting)


def test_refusals(built, tmp_path):
    """A checkpoint without num_image_tokens; more sampled frames than a clip holds (quarantined, as the processor
    raises); a batch whose videos keep different frame counts (the model takes one tensor)."""
    import json

    from transformers.video_utils import VideoMetadata

    from packer.build import build
    from packer.config import resolve
    from packer.errors import ConfigError
    from packer.families import make_family
    from packer.loader import PackedCollator

    root, records, processor = built.root, built.records, built.processor
    folder = tmp_path / "ckpt"
    folder.mkdir()
    config = json.loads((root / "checkpoint" / "processor_config.json").read_text())
    del config["num_image_tokens"]
    (folder / "processor_config.json").write_text(json.dumps(config))
    with pytest.raises(ConfigError, match="no num_image_tokens.*num_image_tokens=729"):
        make_family(resolve(None, family="llava_onevision", processor=str(folder)))

    clip = [r for r in records if "tenth_s.mp4" in json.dumps(r)]  # 3 frames
    (tmp_path / "clip.jsonl").write_text(json.dumps(clip[0]) + "\n" + json.dumps(records[-1]) + "\n")  # + text only
    m = build(resolve(None, input=[str(tmp_path / "clip.jsonl")], output=str(tmp_path / "o"), family="llava_onevision",
                      processor=str(root / "checkpoint"), processor_options="video_num_frames=4", media_root=str(root),
                      max_bad_fraction=1.0),
              progress=False).to_dict()
    assert m["accounting"]["quarantined_by_reason"] == {"unsupported_video": 1}
    assert "3 frame(s) cannot give the 4" in (tmp_path / "o" / "quarantine.jsonl").read_text()
    with pytest.raises(ValueError, match="exceeds total_num_frames=3"):  # what the processor does with that clip
        processor.video_processor.sample_frames(VideoMetadata(total_num_frames=3, fps=30.0), num_frames=4)

    ds = PackedDataset(root / "out")
    row = next(ds[i] for i in range(len(ds)) if sum(m["kind"] == "video" for m in ds[i]["media"]) > 1)
    family = {**ds.family, "settings": {**ds.family["settings"], "video_sample": False}}  # every frame: counts differ
    with pytest.raises(ValueError, match="must keep the same number of frames.*The row itself mixes them") as e:
        PackedCollator(processor=processor, family=family)([row])
    assert "video_num_frames" not in str(e.value)  # no advice that moves the counts away from the checkpoint's


@pytest.mark.parametrize("oversize", ["truncate", "split"])
def test_a_cut_never_keeps_some_of_a_records_images(built, tmp_path, oversize):
    """One image is tiled (anyres) and two are not: a truncated or split record that kept one of its two images
    would be counted for two by the build and tiled by the processor (found in review). The images are cut all or
    none: here the sample cannot fit its images in a row, so it is dropped, never packed half."""
    import json

    from packer.build import build
    from packer.config import resolve

    root = built.root
    long = " ".join(["word"] * 60)
    image = lambda name: {"type": "image", "image": str(next(root.rglob(name)).relative_to(root))}  # noqa: E731
    rec = {"id": "two", "messages": [
        {"role": "user", "content": [image("plain_300x200.jpg"), {"type": "text", "text": "q"}]},
        {"role": "assistant", "content": "first answer " + long},
        {"role": "user", "content": [{"type": "text", "text": long}, image("photo.webp")]},
        {"role": "assistant", "content": "second answer"}]}
    text = {"id": "text", "messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]}
    (root / "two.jsonl").write_text(json.dumps(rec) + "\n" + json.dumps(text) + "\n")
    m = build(resolve(None, input=[str(root / "two.jsonl")], output=str(tmp_path / "o"), family="llava_onevision",
                      processor=str(root / "checkpoint"), max_length=90, oversize=oversize, max_bad_fraction=1.0),
              progress=False).to_dict()
    assert m["accounting"]["dropped_by_reason"] == {"media_over_capacity": 1}
    whole = build(resolve(None, input=[str(root / "two.jsonl")], output=str(tmp_path / "w"), family="llava_onevision",
                          processor=str(root / "checkpoint"), max_length=4096), progress=False).to_dict()
    assert whole["tokenizer"]["family"]["joined_kinds"] == ["image"] and whole["accounting"]["samples_packed"] == 2


# ---------------------------------------------------------------- every frame, as the public checkpoints


@pytest.fixture(scope="module")
def every_frame(tmp_path_factory):
    """The awkward records under a checkpoint that keeps every frame (``do_sample_frames=False``: the
    llava-onevision-qwen2-*-ov-hf processors): the clips keep 2 to 200 frames, so frame counts differ across rows."""
    root = tmp_path_factory.mktemp("llava_onevision_every_frame")
    files = write_media(root, ASSETS.kinds)
    source, records = write_records(root, ASSETS.kinds, files)
    processor = ASSETS.processor(root / "checkpoint", do_sample_frames=False, num_frames=None)
    both = next(r["id"] for r in records if "tenth_s.mp4" in json.dumps(r) and "rot90_2s.mp4" in json.dumps(r))
    manifest = build_family("llava_onevision", root / "checkpoint", source, root / "out", max_segments=4,
                            quarantined={both: "incompatible_media"})  # its processor cannot stack the two either
    return Built("llava_onevision", root / "out", root, [r for r in records if r["id"] != both], processor,
                 partial(ASSETS.model, processor), manifest, nest_images=True)


def frame_counts(row: dict, per_frame: int) -> set[int]:
    return {(m["tokens"] - 1) // per_frame for m in row["media"] if m["kind"] == "video"}


def test_rows_keep_one_frame_count_and_the_records_ids_equal_the_processor(every_frame):
    manifest = every_frame.manifest
    ds = PackedDataset(every_frame.out)
    assert ds.family["settings"]["video_sample"] is False
    counts = [frame_counts(ds[i], 4) for i in range(len(ds))]
    assert all(len(c) <= 1 for c in counts), counts
    assert len(set().union(*counts)) >= 3  # the clips do differ: several rows of several frame counts
    keys, samples = set().union(*counts), manifest["accounting"]["samples_packed"]
    assert manifest["stats"]["rows"] <= max(manifest["stats"]["lower_bound"], len(keys), -(-samples // 4)) + 1
    check_ids(ds, every_frame.processor, every_frame.records, every_frame.root, nest_images=every_frame.nest_images)


@pytest.mark.slow  # every row through the tiny model, then the rows of videos each against its records alone
def test_a_build_of_clips_of_different_frame_counts_trains_end_to_end(every_frame):
    root, records, processor = every_frame.root, every_frame.records, every_frame.processor
    ds = PackedDataset(every_frame.out)
    model = every_frame.model("sdpa")
    assert check_rows_collate(ds, processor, model) > 0
    videos = [i for i in range(len(ds)) if frame_counts(ds[i], 4)]
    for i in videos[:2]:
        check_equivalence(model, ds, processor, records, root, "sdpa", rows=[i], nest_images=True)
    two = [ds[i] for i in videos[:2]]  # rows of two frame counts in one batch: refused, naming the fix
    assert frame_counts(two[0], 4) != frame_counts(two[1], 4)
    with pytest.raises(ValueError, match=r"videos of \d+ and \d+ frames.*Batch one row at a time"):
        PackedCollator.for_build(ds, model, processor=processor)(two)
    with pytest.raises(ValueError, match="batch_size=2: the build's rows hold videos of .* use batch_size=1"):
        TokenBalancedSampler(ds, num_replicas=1, rank=0, batch_size=2)
    assert len(list(TokenBalancedSampler(ds, num_replicas=1, rank=0, batch_size=1))) == len(ds)


def test_packer_steps_refuses_a_batch_the_familys_rows_cannot_share(every_frame, tmp_path):
    """A step plan of 2 rows a rank would name rows of two frame counts in one batch, which StepPlanSampler (and the
    model) refuse: packer steps refuses it up front, one line, exit 2, with the fix; batch size 1 plans."""
    from click.testing import CliRunner

    from packer.cli import main

    result = CliRunner().invoke(main, ["steps", str(every_frame.out), "--ranks", "1", "--batch-size", "2",
                                       "-o", str(tmp_path / "plan.arrow")])
    assert result.exit_code == 2 and not (tmp_path / "plan.arrow").exists(), result.output
    assert re.fullmatch(r"packer: error: batch_size=2: the build's rows hold videos of .* use --batch-size 1 .*\n",
                        result.output), result.output
    ok = CliRunner().invoke(main, ["steps", str(every_frame.out), "--ranks", "1", "-o", str(tmp_path / "plan.arrow")])
    assert ok.exit_code == 0, ok.output


def test_verify_collate_proves_the_rows_and_catches_a_build_planned_without_the_constraint(every_frame, tmp_path,
                                                                                            monkeypatch):
    from click.testing import CliRunner

    from packer.cli import main
    from packer.families.llava_onevision import LlavaOnevision

    root = every_frame.root
    ok = CliRunner().invoke(main, ["verify", str(root / "out"), "--collate"])
    assert ok.exit_code == 0 and "every row collatable for its family" in ok.output, ok.output
    with monkeypatch.context() as m:  # a build from before row constraints: videos of any frame counts in a row
        m.setattr(LlavaOnevision, "row_key", lambda self, span: None)
        build_family("llava_onevision", root / "checkpoint", root / "records.jsonl", tmp_path / "old", max_segments=4)
    bad = CliRunner().invoke(main, ["verify", str(tmp_path / "old"), "--collate"])
    assert bad.exit_code == 6 and "cannot be collated for its family: videos of" in bad.output, bad.output
    assert CliRunner().invoke(main, ["verify", str(tmp_path / "old")]).exit_code == 0  # sound, just not collatable


def test_a_plan_whose_row_mixes_keys_is_refused_at_build_time():
    import numpy as np

    from packer.build import check_row_keys
    from packer.pack import plan

    keys = np.array([0, 1, -1, -1])
    check_row_keys(plan([3, 3, 2, 2], 8, row_key=keys), keys)
    with pytest.raises(AssertionError, match="row 0 holds samples of row keys 0 and 1"):
        check_row_keys(plan([3, 3, 2, 2], 8, order="planner"), keys)


