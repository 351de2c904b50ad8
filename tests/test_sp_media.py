"""VLMs and audio LMs under sequence parallelism, the encoders' work shared across the SP group.

A tiny Qwen3-VL (mRoPE, four images and two videos, DeepStack) and a tiny Qwen3-Omni thinker (three audio clips,
two images, DeepStack, a mixture of experts) take one packed row of five records through ``SequenceParallel``:
packer's SP attention on the language model, SDPA in the towers, each media unit (an image, a video's frame
group, a clip) encoded on one rank (:func:`packer.loader.sp_media.shared_encoders`), videos whole
(``frames=False``), or all on every rank (``split=False``). Per-segment loss sums and every parameter's gradient
(summed over the SP group) equal the one-process packed step (SDPA, the packed mask, the model's own forward)
within 1e-5 relative; so do ``PackedTrainer(sequence_parallel=2)`` and ``=4`` (hybrid) on Qwen3-VL. At SP 4 some
ranks hold no whole video (Qwen3-VL) or no image (Qwen3-Omni) and run the tower on its dummy item. Ranks run in
``tests/sp_media_ranks.py`` (spawned, gloo, CPU, float32).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
import sp_media_ranks  # noqa: E402
from ranks import launch  # noqa: E402

from packer.loader.sp_media import assign, item_cost, loads  # noqa: E402

pytestmark = pytest.mark.slow  # each world starts 2 or 4 Python processes with torch and transformers

pytest.importorskip("av")
pytest.importorskip("torchvision")

TIMEOUT = 300
CASES = {
    ("qwen3vl", 2): [{"name": "ulysses", "mode": "ulysses"},
                     {"name": "ulysses-replicated", "mode": "ulysses", "split": False},
                     {"name": "ring", "mode": "ring"},
                     {"name": "ring-replicated", "mode": "ring", "split": False},
                     {"name": "trainer-ring", "mode": "ring", "kind": "trainer"}],  # PackedTrainer(sequence_parallel=2)
    ("qwen3vl", 4): [{"name": "ulysses", "mode": "ulysses"},
                     {"name": "ring", "mode": "ring"},
                     {"name": "hybrid", "mode": "hybrid"},  # Ulysses over gcd(2 kv heads, 4) = 2, ring over 2
                     {"name": "dp2-ring2", "mode": "ring", "size": 2},  # 2 replicas of an SP group of 2
                     {"name": "ring-whole-videos", "mode": "ring", "frames": False},  # each video one unit
                     {"name": "trainer-hybrid", "mode": "hybrid", "kind": "trainer"}],
    ("qwen3omni", 2): [{"name": "ulysses", "mode": "ulysses"}, {"name": "ring", "mode": "ring"}],
    ("qwen3omni", 4): [{"name": "ring", "mode": "ring"}, {"name": "dp2-ulysses2", "mode": "ulysses", "size": 2}],
}
STEPS = [(f, w, c) for (f, w), cases in CASES.items() for c in cases if c.get("kind") != "trainer"]
# softmax ignores a constant added to every score of a query: a key projection's bias has gradient 0, in float32
# rounding noise (about 1e-14 here) that no relative comparison can hold
ANALYTIC_ZERO = ("k_proj.bias",)


def spawn(family: str, world: int, build: Path, folder: Path) -> subprocess.CompletedProcess:
    (folder / "cases.json").write_text(json.dumps(CASES[(family, world)]))
    return launch([sys.executable, str(ROOT / "tests" / "sp_media_ranks.py"), str(world), family, str(build),
                   str(folder / "cases.json"), str(folder)], TIMEOUT)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    out = {}
    for family in ("qwen3vl", "qwen3omni"):
        build = sp_media_ranks.make_build(family, tmp_path_factory.mktemp(family))
        reference = sp_media_ranks.reference(family, build)
        for world in (2, 4):
            folder = tmp_path_factory.mktemp(f"{family}-world{world}")
            out[(family, world)] = (folder, spawn(family, world, build, folder), reference)
    return out


def result(runs, family: str, world: int, name: str, replica: int = 0) -> dict:
    folder, proc, _ = runs[(family, world)]
    error = folder / f"{name}.error"
    assert not error.exists(), error.read_text()
    path = folder / f"{name}-dp{replica}.pt"
    assert path.exists(), f"{family} world {world} ended {proc.returncode}: {proc.stderr[-3000:]}"
    return torch.load(path)


@pytest.mark.parametrize(("family", "world", "case"), STEPS,
                         ids=lambda x: x if isinstance(x, str) else str(x) if isinstance(x, int) else x["name"])
def test_sp_step_with_shared_encoders_equals_one_process(runs, family, world, case):
    reference = runs[(family, world)][2]
    size = case.get("size", world)
    for replica in range(world // size):
        got = result(runs, family, world, case["name"], replica)
        segments = reference["segments"]
        assert ((got["segments"] - segments).abs() / segments.abs()).max() <= 1e-5
        assert got["loss"] == pytest.approx(reference["loss"], rel=1e-5)
        assert set(got["grads"]) == set(reference["grads"])  # every tower's parameters, on every rank
        for name, g in reference["grads"].items():
            if name.endswith(ANALYTIC_ZERO):
                assert g.abs().max() <= 1e-12 and got["grads"][name].abs().max() <= 1e-12, name
            else:
                assert (got["grads"][name] - g).abs().max() <= 1e-5 * g.abs().max(), f"gradient of {name}"


@pytest.mark.parametrize(("family", "world", "case"), STEPS,
                         ids=lambda x: x if isinstance(x, str) else str(x) if isinstance(x, int) else x["name"])
def test_each_row_is_encoded_once_in_the_group_unless_replicated(runs, family, world, case):
    """The units the group's ranks encoded, ``(item, first row, rows)``, tile every item's rows once (split) or
    each rank holds every item whole (replicated)."""
    media = runs[(family, world)][2]["media"]
    size = case.get("size", world)
    encoded = result(runs, family, world, case["name"])["encoded"]
    assert len(encoded) == size
    for kind in {k for k, _ in media}:
        whole = [(j, 0, tokens) for j, (k, tokens) in enumerate(m for m in media if m[0] == kind)]
        units = sorted(u for rank in encoded for u in rank.get(kind, []))
        if case.get("split") is False:
            assert units == sorted(whole * size), (kind, encoded)
            continue
        for j, _, tokens in whole:
            rows = [(first, n) for item, first, n in units if item == j]
            assert [f for f, _ in rows] == [sum(n for _, n in rows[:k]) for k in range(len(rows))], (kind, j, rows)
            assert sum(n for _, n in rows) == tokens, (kind, j, rows)


@pytest.mark.parametrize(("world", "name"), [(2, "trainer-ring"), (4, "trainer-hybrid")])
def test_packed_trainer_with_sequence_parallel_and_media_equals_one_process(runs, world, name):
    """PackedTrainer(sequence_parallel=world) on the tiny Qwen3-VL (the mode read from the model's attention, the
    collator the build implies, shared_encoders inside compute_loss, DDP's average of loss x world): the reported
    loss and every gradient equal the one-process step."""
    reference = runs[("qwen3vl", world)][2]
    got = result(runs, "qwen3vl", world, name)
    assert (got["mode"], got["collator"]) == (name.split("-")[1], "varlen")
    assert got["loss"] == pytest.approx(reference["loss"], rel=1e-5)
    assert set(got["grads"]) == set(reference["grads"])
    for n, g in reference["grads"].items():
        if n.endswith(ANALYTIC_ZERO):
            assert got["grads"][n].abs().max() <= 1e-12, n
        else:
            assert (got["grads"][n] - g).abs().max() <= 1e-5 * g.abs().max(), f"gradient of {n}"


def test_videos_are_split_into_frame_groups_unless_kept_whole(runs):
    """Qwen3-VL's tower attends within a frame group: at SP 4 the two videos' frame groups are units of their own,
    spread over the ranks; frames=False keeps each video one unit (and two ranks then encode no video)."""
    media = runs[("qwen3vl", 4)][2]["media"]
    videos = sum(kind == "video" for kind, _ in media)
    split = [u for rank in result(runs, "qwen3vl", 4, "ring")["encoded"] for u in rank["video"]]
    whole = result(runs, "qwen3vl", 4, "ring-whole-videos")["encoded"]
    assert len(split) > videos and any(first > 0 for _, first, _ in split)
    assert sum(len(rank["video"]) > 0 for rank in result(runs, "qwen3vl", 4, "ring")["encoded"]) == 4
    assert sorted(u for rank in whole for u in rank["video"]) == [(j, 0, n) for j, (_, n) in
                                                                  enumerate(m for m in media if m[0] == "video")]


def test_some_rank_runs_a_tower_on_its_dummy_item(runs):
    """Two videos kept whole over four ranks, two images over four ranks: two ranks encode none of the kind and still
    run its tower (their gradients reached every parameter above)."""
    assert sum(not rank["video"] for rank in result(runs, "qwen3vl", 4, "ring-whole-videos")["encoded"]) == 2
    assert sum(not rank["image"] for rank in result(runs, "qwen3omni", 4, "ring")["encoded"]) == 2


def test_a_video_encodes_as_its_frame_groups():
    """The fact the frame-group split rests on, in a tiny Qwen3-VL tower (DeepStack at layer 0, learned position
    embeddings interpolated to (h, w)): a video of grid (t, h, w) gives the rows of t frame groups of grid (1, h, w),
    encoded together or one by one, concatenated."""
    from transformers import Qwen3VLConfig, Qwen3VLForConditionalGeneration

    vision = dict(depth=2, hidden_size=32, intermediate_size=64, num_heads=4, patch_size=16, spatial_merge_size=2,
                  temporal_patch_size=2, out_hidden_size=64, num_position_embeddings=64, deepstack_visual_indexes=[0])
    text = dict(vocab_size=100, hidden_size=64, intermediate_size=96, num_hidden_layers=1, num_attention_heads=4,
                num_key_value_heads=2, head_dim=16,
                rope_parameters={"rope_type": "default", "rope_theta": 1e4, "mrope_section": [2, 3, 3]})
    config = Qwen3VLConfig(text_config=text, vision_config=vision, image_token_id=90, video_token_id=91)
    config._attn_implementation = "sdpa"
    torch.manual_seed(0)
    model = Qwen3VLForConditionalGeneration(config).float()
    t, h, w = 3, 6, 4
    pixels = torch.randn(t * h * w, 3 * 2 * 16 * 16)

    def rows(out):
        return [torch.cat(out.pooler_output), *(torch.cat(f) for f in out.deepstack_features)]

    video = rows(model.get_video_features(pixels, torch.tensor([[t, h, w]])))
    together = rows(model.get_video_features(pixels, torch.tensor([[1, h, w]] * t)))
    alone = [rows(model.get_video_features(pixels[f * h * w : (f + 1) * h * w], torch.tensor([[1, h, w]])))
             for f in range(t)]
    for k, whole in enumerate(video):  # the merger's rows, then DeepStack's
        assert whole.shape[0] == t * h * w // 4
        assert (together[k] - whole).abs().max() <= 1e-6 * whole.abs().max()
        assert (torch.cat([a[k] for a in alone]) - whole).abs().max() <= 1e-6 * whole.abs().max()


def test_assignment_is_largest_first_onto_the_least_loaded_rank():
    assert assign([9, 4, 4, 1], 2) == [0, 1, 1, 1]  # 9 against 4 + 4 + 1
    assert assign([1, 1, 1], 4) == [0, 1, 2]  # a rank without an item: it runs the dummy
    assert assign([], 2) == []
    spans = [{"kind": "video", "start": 0, "length": 100, "tokens": 100}, {"kind": "image", "start": 100, "length": 10},
             {"kind": "video", "start": 110, "length": 60, "tokens": 60}, {"kind": "video", "start": 170, "length": 40}]
    assert loads(spans, 2) == [100 + 10, 60 + 40]  # the default cost model charges media nothing: tokens
    assert loads(spans, 2, split=False) == [210, 210]
    spans[0]["runs"] = [(0, 50), (60, 50)]  # two frame groups, a timestamp between (Qwen3-VL)
    assert loads(spans, 2, frames=True) == [60 + 40 + 10, 50 + 50]  # video units 60, 50, 50, 40; the image 10


def test_item_cost_reads_the_cost_model():
    from packer.cost import CostModel

    cost = CostModel(video_item=5.0, video_token=2.0, video_square=0.5, media_token=1.0)
    assert item_cost(cost, "video", 4) == 5 + 2 * 4 + 0.5 * 16 + 4
    assert item_cost(cost, "image", 4) == 4  # media_token only


def test_a_collator_form_the_sp_attention_does_not_take_is_refused():
    """packer_ring / packer_hybrid take varlen batches, packer_ulysses masks or varlen: the collator a build implies follows."""
    import sp_ranks

    from packer.loader.checks import check_attention, default_attention
    from packer.loader.sp_attention import register

    register()
    ring, ulysses = sp_ranks.model("packer_ring"), sp_ranks.model("packer_ulysses")
    check_attention(ring, "varlen")
    check_attention(ulysses, "eager")
    assert (default_attention(ring), default_attention(ulysses)) == ("varlen", "sdpa")
    with pytest.raises(ValueError, match=r"'packer_ring', which takes a batch of PackedCollator\(attention='varlen'\), "
                                         r"got attention='sdpa': build the collator with attention='varlen'"):
        check_attention(ring, "sdpa")
    check_attention(ulysses, "varlen")  # a flattened batch: the varlen kernel over the global boundaries
    with pytest.raises(ValueError, match=r"attention='sdpa' or 'eager' or 'flex' or 'varlen'\), got attention='position_ids'"):
        check_attention(ulysses, "position_ids")
