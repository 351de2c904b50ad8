"""The step under sequence parallelism: targets shifted once, the step's sum of weights all-reduced once over the
data-parallel replicas, the reported loss the unsliced one; 2 DP x 2 SP (ring and Ulysses) in a plain loop, under
FSDP2 and through ``PackedTrainer(sequence_parallel=2)`` equal the one-process packed step within 1e-5 relative;
the trainer's refusals. Ranks run in ``tests/sp_step_ranks.py`` (torchrun, 4 processes, gloo, CPU, float32), one
start under a timeout; the rest in this process."""

from __future__ import annotations

import json
import sys
from types import SimpleNamespace

import pytest
import torch

from conftest import ROOT
from packer.build import build
from packer.config import resolve
from packer.loader import PackedCollator, PackedDataset, StepNorm, loss_norm, packed_loss, shard_for_sequence_parallel
from packer.loader.sp_attention import SequenceParallel

sys.path.insert(0, str(ROOT / "tests"))
import sp_step_ranks  # noqa: E402
from ranks import launch  # noqa: E402

TIMEOUT = 400  # seconds for the torchrun: a mismatched collective hangs, and fails here
LOOP_ROWS = [[0, 3], [1, 2]]  # replica 0's two micro-batches, replica 1's
CASES = [{"name": "misuse", "kind": "misuse"},
         {"name": "loop-ring", "kind": "loop", "mode": "ring", "rows": LOOP_ROWS},
         {"name": "loop-ulysses", "kind": "loop", "mode": "ulysses", "rows": LOOP_ROWS},
         {"name": "fsdp-ring", "kind": "fsdp", "mode": "ring", "rows": LOOP_ROWS},
         {"name": "trainer-ring", "kind": "trainer", "mode": "ring"}]


@pytest.fixture(scope="module")
def text_build(tmp_path_factory):
    """sample_data's text records at 512-token rows."""
    out = tmp_path_factory.mktemp("sp_step") / "out"
    build(resolve(ROOT / "pipelines" / "sample.toml", output=str(out), max_length=512, max_bad_fraction=1.0,
                  modalities=[]), progress=False)
    return out


@pytest.fixture(scope="module")
def ranks(text_build, tmp_path_factory):
    folder = tmp_path_factory.mktemp("sp_step_ranks")
    (folder / "cases.json").write_text(json.dumps(CASES))
    done = launch([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "4",
                   str(ROOT / "tests" / "sp_step_ranks.py"), str(text_build), str(folder / "cases.json"), str(folder)],
                  TIMEOUT)
    return folder, done.returncode, done.stderr


def results(ranks, name: str) -> tuple[list[dict], dict]:
    folder, code, err = ranks
    for rank in range(4):
        error = folder / f"{name}-rank-{rank}.error"
        assert not error.exists(), error.read_text()
    assert (folder / f"{name}.pt").exists(), f"torchrun ended {code}: {err[-4000:]}"
    return [json.loads((folder / f"{name}-rank-{r}.json").read_text()) for r in range(4)], torch.load(folder / f"{name}.pt")


def check_step(reports, grads, build, rows):
    loss, expected = sp_step_ranks.reference(str(build), rows)
    for r in reports:  # every rank reports the step's loss: the one-process loss of the same rows
        assert r["loss"] == pytest.approx(loss, rel=1e-5)
    assert set(grads) == set(expected)
    for name, g in expected.items():
        assert (grads[name] - g).abs().max() <= 1e-5 * g.abs().max(), f"gradient of {name}"


@pytest.mark.slow
@pytest.mark.parametrize("name", ["loop-ring", "loop-ulysses", "fsdp-ring"])
def test_two_replicas_of_an_sp_group_of_two_equal_one_process(ranks, text_build, name):
    reports, grads = results(ranks, name)
    assert [r["rows"] for r in reports] == [LOOP_ROWS[0], LOOP_ROWS[0], LOOP_ROWS[1], LOOP_ROWS[1]]
    check_step(reports, grads, text_build, [i for rows in LOOP_ROWS for i in rows])


@pytest.mark.slow
def test_packed_trainer_with_sequence_parallel_equals_one_process(ranks, text_build):
    reports, grads = results(ranks, "trainer-ring")
    rows = [r["rows"] for r in reports]
    assert rows[0] == rows[1] and rows[2] == rows[3]  # the ranks of an SP group train the same rows
    assert len(rows[0]) == 2 and not set(rows[0]) & set(rows[2])  # 2 micro-batches each, the replicas their own
    check_step(reports, grads, text_build, rows[0] + rows[2])


@pytest.mark.slow
def test_the_trainer_refuses_what_would_not_train_the_unsliced_step(ranks):
    folder, code, err = ranks
    assert (folder / "misuse-0.json").exists(), f"torchrun ended {code}: {err[-4000:]}"
    found = [json.loads((folder / f"misuse-{r}.json").read_text()) for r in (0, 1)]
    assert "the sequence-parallel size 3 does not divide the world size 4" in found[0]["size"]
    assert "num_replicas 4 (this run: 2)" in found[0]["sampler"] and "rank=args.process_index // 2" in found[0]["sampler"]
    assert "rank 1 (this run: 0)" in found[1]["sampler"]  # SP rank 1 of group 0 reads replica 0's rows
    assert "takes a batch of PackedCollator(attention='varlen'), got attention='sdpa'" in found[0]["collator"]
    assert "runs attention 'sdpa', not one of packer's sequence-parallel attentions" in found[0]["model"]
    assert "dp_shard_size=2 beside an SP size 2" in found[0]["config"]
    assert "evaluates without sequence parallelism only" in found[0]["eval"] and "StepNorm" in found[0]["eval"]
    assert found[0]["read"] == [2, "ring", True, 2, 0] and found[1]["read"] == [2, "ring", True, 2, 0]


# ---------------------------------------------------------------- one process


def test_targets_are_shifted_once_before_slicing(text_build):
    """The slices' shifted targets, put back by global_index, are the unsliced batch's shifted once: the target of a
    slice's last token (on the next rank) is kept, and no slice shifts again; the sums of their losses are the
    unsliced loss's (the logits here: any function of the token, as each rank's are of its tokens)."""
    ds = PackedDataset(text_build)
    batch = PackedCollator(attention="varlen", loss="sample")([ds[0], ds[1]])
    shifted = torch.nn.functional.pad(batch["labels"][..., 1:], (0, 1), value=-100)[0]
    vocab = int(max(batch["input_ids"].max(), batch["labels"].max())) + 1

    def logits(ids):  # [1, T, vocab]
        return 3.0 * torch.nn.functional.one_hot(ids * 7 % vocab, vocab).float()

    whole, norm = packed_loss(logits(batch["input_ids"]), batch, reduce=False)
    for mode, size in (("ring", 2), ("ring", 4), ("ulysses", 3)):
        got = torch.full((batch["input_ids"].shape[-1] * 3,), -7)
        total, weights = torch.zeros(()), torch.zeros(())
        for rank in range(size):
            local = shard_for_sequence_parallel(batch, rank, size, mode=mode)
            got[local["global_index"]] = local["shift_labels"][0]
            t, w = packed_loss(logits(local["input_ids"]), local, reduce=False)
            total, weights = total + t, weights + w
        if mode == "ring":  # the padded layout: back to the unpadded places
            cu, padded = batch["cu_seqlens"].tolist(), local["cu_seqlens_padded"].tolist()
            back = torch.cat([got[p : p + (b - a)] for a, b, p in zip(cu[:-1], cu[1:], padded[:-1], strict=True)])
        else:
            back = got[: shifted.numel()]
        assert torch.equal(back, shifted), (mode, size)
        assert torch.isclose(weights, norm, rtol=1e-6) and torch.isclose(total, whole, rtol=1e-5), (mode, size)


def test_step_norm_in_one_process_is_the_micro_batches_sum(text_build):
    ds = PackedDataset(text_build)
    collate = PackedCollator(attention="sdpa", loss="sample")
    batches = [collate([ds[i]]) for i in (0, 1, 2)]
    step = StepNorm(batches)
    assert step.value.item() == pytest.approx(sum(loss_norm(b).item() for b in batches), rel=1e-12)
    torch.manual_seed(0)
    logits = [torch.randn(*b["input_ids"].shape, 13) for b in batches]
    for b, x in zip(batches, logits, strict=True):
        b["labels"] = b["labels"] % 13 * (b["labels"] >= 0) + b["labels"] * (b["labels"] < 0)
        step.loss(x, b)
    expected = sum(packed_loss(x, b, reduce=False)[0] for b, x in zip(batches, logits, strict=True)) / step.value
    assert step.reported() == pytest.approx(expected.item(), rel=1e-6)


def fake_sp(mode: str, size: int) -> SequenceParallel:
    """The SP object without a process group: only what check_collator reads."""
    sp = object.__new__(SequenceParallel)
    sp.mode, sp.size = mode, size
    return sp


def test_a_collator_whose_batches_the_mode_cannot_slice_is_refused(text_build):
    ds = PackedDataset(text_build)
    ulysses = fake_sp("ulysses", 4)
    ulysses.check_collator(PackedCollator(attention="flex", pad_to_multiple_of=8))
    ulysses.check_collator(PackedCollator(attention="sdpa"))  # any length: the slicer pads the bool mask
    with pytest.raises(ValueError, match=r"multiple of the SP size 4, but the collator gives rows padded to their own "
                                         r"length: pass PackedCollator\(\.\.\., pad_to_multiple_of=4\)"):
        ulysses.check_collator(PackedCollator(attention="flex"))
    with pytest.raises(ValueError, match=r"row lengths \[510\] \(the build's --row-lengths or pad_to\)"):
        ulysses.check_collator(PackedCollator(attention="flex", pad_to=510))
    with pytest.raises(ValueError, match=r"rows padded to multiples of 6"):
        ulysses.check_collator(PackedCollator(attention="flex", pad_to_multiple_of=6))
    with pytest.raises(ValueError, match=r"ring attention takes a batch of PackedCollator\(attention='varlen'\), the "
                                         r"collator gives attention='sdpa'"):
        fake_sp("ring", 2).check_collator(PackedCollator(attention="sdpa"), ds)
    tree = SimpleNamespace(manifest=SimpleNamespace(config={"preference": "tree"}), out="out/prefs")
    with pytest.raises(ValueError, match=r"out/prefs holds preference trees.*--preference pairs"):
        fake_sp("ring", 2).check_collator(PackedCollator(attention="varlen"), tree)
    fake_sp("ulysses", 2).check_collator(PackedCollator(attention="sdpa"), tree)  # Ulysses keeps the tree's mask
