"""packer's SP attention trains as one process does: Ulysses, zigzag ring and the 2 x 2 hybrid, on 2 and 4 processes.

A tiny Llama (4 heads, 2 key / value heads, or 1) takes one packed row of six segments through
``SequenceParallel``: each rank's slice, the model under ``packer_ulysses`` (over a masked batch or a flattened
``varlen`` one) / ``packer_ring`` / ``packer_hybrid``, the loss over the group's sum of weights; the per-segment loss
sums and every parameter's gradient (summed over the SP group) equal the one-process packed step (SDPA, the
packed mask) within 1e-5 relative. Ranks run in ``tests/sp_ranks.py`` (spawned, gloo, CPU, float32);
one start per world size, each under a timeout. The refusals are checked here and in the ranks.
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
import sp_ranks  # noqa: E402
from ranks import launch  # noqa: E402

from packer.loader.ring_attention import ring_layout  # noqa: E402
from packer.loader.sp_attention import check_heads, plan_groups, register  # noqa: E402

pytestmark = pytest.mark.slow  # each world starts 2 or 4 Python processes with torch and transformers

TIMEOUT = 300  # seconds for one world: a mismatched collective hangs, and fails here
CASES = {
    2: [{"name": "misuse", "mode": "misuse"},
        {"name": "ulysses", "mode": "ulysses", "kv_heads": 2},
        {"name": "ring", "mode": "ring", "kv_heads": 2},
        {"name": "ulysses-kv1", "mode": "ulysses", "kv_heads": 1},  # 1 key / value head replicated on 2 ranks
        {"name": "ring-kv1", "mode": "ring", "kv_heads": 1},
        {"name": "ulysses-eager", "mode": "ulysses", "kv_heads": 2, "collator": "eager"},
        {"name": "ulysses-flex", "mode": "ulysses", "kv_heads": 2, "collator": "flex", "backward": False},
        {"name": "ulysses-varlen", "mode": "ulysses", "kv_heads": 2, "collator": "varlen"},  # one flattened row
        {"name": "ulysses-varlen-kv1", "mode": "ulysses", "kv_heads": 1, "collator": "varlen"}],
    4: [{"name": "ulysses", "mode": "ulysses", "kv_heads": 2},  # 2 key / value heads replicated on 4 ranks
        {"name": "ring", "mode": "ring", "kv_heads": 2},
        {"name": "hybrid", "mode": "hybrid", "kv_heads": 2},  # Ulysses over gcd(2, 4) = 2, ring over 2
        {"name": "ulysses-varlen", "mode": "ulysses", "kv_heads": 2, "collator": "varlen"},
        {"name": "ulysses-kv1", "mode": "ulysses", "kv_heads": 1},
        {"name": "ring-kv1", "mode": "ring", "kv_heads": 1},
        {"name": "dp2-ring2", "mode": "ring", "kv_heads": 2, "size": 2},  # 2 replicas of an SP group of 2
        {"name": "dp2-ulysses2", "mode": "ulysses", "kv_heads": 2, "size": 2}],
}


def spawn(world: int, folder: Path) -> subprocess.CompletedProcess:
    (folder / "cases.json").write_text(json.dumps(CASES[world]))
    return launch([sys.executable, str(ROOT / "tests" / "sp_ranks.py"), str(world), str(folder / "cases.json"),
                   str(folder)], TIMEOUT)


@pytest.fixture(scope="module")
def worlds(tmp_path_factory):
    out = {}
    for world in CASES:
        folder = tmp_path_factory.mktemp(f"world{world}")
        out[world] = (folder, spawn(world, folder))
    return out


@pytest.fixture(scope="module")
def references():
    return {kv: sp_ranks.reference(kv) for kv in (2, 1)}


def result(worlds, world: int, name: str, replica: int = 0) -> dict:
    folder, proc = worlds[world]
    error = folder / f"{name}.error"
    assert not error.exists(), error.read_text()
    path = folder / f"{name}-dp{replica}.pt"
    assert path.exists(), f"world {world} ended {proc.returncode}: {proc.stderr[-3000:]}"
    return torch.load(path)


@pytest.mark.parametrize(("world", "case"), [(w, c) for w, cases in CASES.items() for c in cases if c["mode"] != "misuse"],
                         ids=lambda x: str(x) if isinstance(x, int) else x["name"])
def test_sp_step_equals_one_process(worlds, references, world, case):
    segments, loss, grads = references[case["kv_heads"]]
    size = case.get("size", world)
    for replica in range(world // size):
        got = result(worlds, world, case["name"], replica)
        assert ((got["segments"] - segments).abs() / segments.abs()).max() <= 1e-5  # each segment's loss sum
        assert got["loss"] == pytest.approx(loss, rel=1e-5)
        if case.get("backward", True):
            assert set(got["grads"]) == set(grads)
            for name, g in grads.items():
                assert (got["grads"][name] - g).abs().max() <= 1e-5 * g.abs().max(), f"gradient of {name}"


def test_slices_are_what_each_mode_says(worlds):
    """73 tokens: Ulysses pads to 74 (2 ranks: 37) or 76 (4: 19); ring pads each segment to a multiple of 2 x size
    (88 at 2 ranks: 44 each; 96 at 4: 24); the hybrid cuts a ring slice over 2 (44) in 2 Ulysses pieces (22)."""
    tokens = {(w, c["name"]): result(worlds, w, c["name"])["tokens"] for w, cases in CASES.items() for c in cases
              if c["mode"] != "misuse"}
    assert tokens[(2, "ulysses")] == 37 and tokens[(4, "ulysses")] == 19
    assert tokens[(2, "ring")] == 44 and tokens[(4, "ring")] == 24
    assert tokens[(4, "hybrid")] == 22
    assert tokens[(2, "ulysses-varlen")] == 37 and tokens[(4, "ulysses-varlen")] == 19  # one flattened row, the same cut


def test_misuse_is_refused_with_the_value_and_the_fix(worlds):
    folder, proc = worlds[2]
    assert (folder / "misuse.json").exists(), proc.stderr[-3000:]
    found = json.loads((folder / "misuse.json").read_text())
    assert "runs attention 'sdpa', not the sequence-parallel 'packer_ring': load it with attn_implementation=" \
           "'packer_ring'" in found["model"]
    assert "PackedCollator(attention='varlen'), got one of attention='sdpa'" in found["collator"]
    assert "not rank 0's of a ring slice over 2 ranks" in found["slice"] and "sp.slice(batch)" in found["slice"]
    assert "expected [0, 1, 2, 3, 12, 13" in found["rank"]  # a ring slice of the other rank
    assert "linear-attention layers (Qwen3_5GatedDeltaNet)" in found["linear"] and "without sequence" in found["linear"]
    assert "the model runs 'packer_ulysses' but the batch was sliced for 'packer_ring'" in found["mode"]


def test_group_layout_and_a_size_that_does_not_divide_the_world():
    assert plan_groups(4, 4, "hybrid", 2) == {"sp": [[0, 1, 2, 3]], "ulysses": [[0, 1], [2, 3]], "ring": [[0, 2], [1, 3]]}
    assert plan_groups(4, 2, "ring") == {"sp": [[0, 1], [2, 3]], "ulysses": [[0], [1], [2], [3]], "ring": [[0, 1], [2, 3]]}
    with pytest.raises(ValueError, match=r"size 4 does not divide the world size 6.*among \[1, 2, 3, 6\]"):
        plan_groups(6, 4, "ulysses")
    with pytest.raises(ValueError, match=r"Ulysses size dividing the SP size 4, got 3; pass ulysses=math.gcd"):
        plan_groups(4, 4, "hybrid", 3)


def test_heads_the_ulysses_ranks_cannot_take_are_refused():
    check_heads(4, 2, 4)  # 2 key / value heads replicated onto 4 ranks
    check_heads(4, 1, 2)
    with pytest.raises(ValueError, match=r"6 attention heads do not split over 4 Ulysses ranks.*mode='hybrid'"):
        check_heads(6, 2, 4)
    with pytest.raises(ValueError, match=r"3 key / value heads neither split over 2 Ulysses ranks.*gcd\(3, size\)"):
        check_heads(6, 3, 2)


def test_ring_layout_is_the_zigzag():
    """The module docstring's example: one segment of 8, size 2."""
    cu = torch.tensor([0, 8])
    assert ring_layout(cu, 0, 2)[0].tolist() == [0, 1, 6, 7]
    assert ring_layout(cu, 1, 2)[0].tolist() == [2, 3, 4, 5]
    assert ring_layout(torch.tensor([0, 4, 12]), 1, 2)[1].tolist() == [0, 0, 1, 1, 1, 1]
    with pytest.raises(ValueError, match="segment 1 of the batch has 6 padded tokens, not a multiple of 2 \\* 2"):
        ring_layout(torch.tensor([0, 4, 10]), 0, 2)


def test_sp_attention_without_its_step_is_refused():
    register()
    model = sp_ranks.model("packer_ring")
    with pytest.raises(ValueError, match=r"'packer_ring' was called without packer_sp: run the model on "
                                         r"model\(\*\*sp.model_inputs\(sp.slice\(batch\)\)\)"):
        model(input_ids=torch.tensor([[1, 2, 3]]), use_cache=False)


def test_sp_attention_in_an_encoder_is_refused():
    """A VLM given one implementation for all its sub-models would run the vision tower's (non-causal) attention
    under SP: refused, naming the per-sub-config setting."""
    from transformers import AttentionInterface

    register()
    encoder_layer = torch.nn.Module()
    encoder_layer.is_causal = False
    q = torch.zeros(1, 2, 3, 4)
    with pytest.raises(ValueError, match=r"not causal: an encoder's attention.*'text_config': 'packer_ulysses'"):
        AttentionInterface()["packer_ulysses"](encoder_layer, q, q, q, None)
