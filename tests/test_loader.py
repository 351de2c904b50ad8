"""The loader's pieces: golden masks and positions, collator forms, mRoPE, sequence
parallel slices, samplers and the dataset."""

from __future__ import annotations

import json
import pickle
import types

import numpy as np
import pytest
import torch

from conftest import ROOT
from packer.errors import SchemaVersionError
from packer.loader import (
    PackedCollator,
    PackedDataset,
    SampleDataset,
    SplitModalitySampler,
    TokenBalancedSampler,
    mrope_positions,
    shard_for_sequence_parallel,
)
from packer.modeling.masks import allowed, segments_and_positions
from packer.schedule.balance import imbalance

IGNORE = -100


def row(lengths, start_id=1, media=()):
    n = sum(lengths)
    ids = np.arange(start_id, start_id + n)
    labels = ids.copy()
    cu = np.concatenate([[0], np.cumsum(lengths)])
    labels[cu[:-1]] = IGNORE
    return {"input_ids": ids, "labels": labels, "cu_seqlens": cu, "n_tokens": n, "media": list(media),
            "segment_ids": [f"s{i}" for i in range(len(lengths))], "segment_modality": ["text"] * len(lengths)}


def test_golden_mask_and_positions_of_the_docstring_example():
    segment, position = segments_and_positions([[0, 3, 5]], 6)
    assert segment.tolist() == [[0, 0, 0, 1, 1, 2]]
    assert position.tolist() == [[0, 1, 2, 0, 1, 0]]
    expected = [[1, 0, 0, 0, 0, 0],
                [1, 1, 0, 0, 0, 0],
                [1, 1, 1, 0, 0, 0],
                [0, 0, 0, 1, 0, 0],
                [0, 0, 0, 1, 1, 0],
                [0, 0, 0, 0, 0, 1]]
    assert allowed(segment)[0, 0].int().tolist() == expected


def test_collator_forms():
    rows = [row([3, 2]), row([4], start_id=50)]
    b = PackedCollator(attention="sdpa", pad_to=6)(rows)
    assert b["input_ids"].tolist() == [[1, 2, 3, 4, 5, 0], [50, 51, 52, 53, 0, 0]]
    assert b["labels"].tolist() == [[IGNORE, 2, 3, IGNORE, 5, IGNORE], [IGNORE, 51, 52, 53, IGNORE, IGNORE]]
    assert b["position_ids"].tolist() == [[0, 1, 2, 0, 1, 0], [0, 1, 2, 3, 0, 1]]
    assert b["seq_idx"].tolist() == [[0, 0, 0, 1, 1, 2], [0, 0, 0, 0, 1, 1]]
    assert b["attention_mask"].dtype == torch.bool and b["attention_mask"].shape == (2, 1, 6, 6)
    e = PackedCollator(attention="eager", pad_to=6, mask_dtype=torch.bfloat16)(rows)["attention_mask"]
    assert e.dtype == torch.bfloat16 and e[0, 0, 3, 2] == torch.finfo(torch.bfloat16).min and e[0, 0, 3, 3] == 0
    v = PackedCollator(attention="varlen")(rows)
    assert v["input_ids"].shape == (1, 9) and v["cu_seqlens"].tolist() == [0, 3, 5, 9]
    assert v["cu_seqlens"].dtype == torch.int32 and v["max_seqlen"] == 4
    assert v["cu_seq_lens_q"] is v["cu_seqlens"] and v["max_length_k"] == 4
    assert v["position_ids"].tolist() == [[0, 1, 2, 0, 1, 0, 1, 2, 3]]
    assert v["labels"][0, [0, 3, 5]].tolist() == [IGNORE] * 3
    m = PackedCollator(attention="varlen", pad_to_multiple_of=4)(rows)
    assert m["input_ids"].shape == (1, 12) and m["cu_seqlens"].tolist() == [0, 3, 5, 9, 12]
    f = PackedCollator(attention="flex", pad_to=6, device="cpu")(rows)["attention_mask"]
    assert type(f).__name__ == "BlockMask" and f.shape[-2:] == (6, 6)


def test_collator_errors_and_media():
    with pytest.raises(ValueError, match="needs 5 positions but pad_to is 4; raise pad_to"):
        PackedCollator(pad_to=4)([row([3, 2])])
    with pytest.raises(ValueError, match="attention must be one of"):
        PackedCollator(attention="flash")
    span = {"segment": 1, "kind": "image", "start": 4, "length": 2, "ref": "a.png", "llm_grid": [1, 1, 2]}
    b = PackedCollator(attention="varlen")([row([3, 2]), row([4, 3], media=[span])])
    (m,) = b["media"]
    assert m["start"] == 5 + 4 and m["segment"] == 2 + 1 and m["row"] == 1 and m["batch"] == 0


def test_loss_weights():
    rows = [row([3, 2]), row([4])]
    w = PackedCollator(loss="sample", pad_to=6)(rows)["loss_weights"]
    assert w[0].tolist() == pytest.approx([0, 0.5, 0.5, 0, 1, 0]) and w[1, 1:4].tolist() == pytest.approx([1 / 3] * 3)
    w = PackedCollator(loss="sqrt", pad_to=6)(rows)["loss_weights"]
    assert w[0, 1].item() == pytest.approx(2 ** -0.5)
    assert PackedCollator(loss="token", pad_to=6)(rows)["loss_weights"].sum() == 2 + 1 + 3


def test_mrope_equals_hf_get_rope_index():
    from transformers.models.qwen2_vl.modeling_qwen2_vl import Qwen2VLModel

    image = 151655
    # segment: 3 text, image grid (1, 2, 3) -> 6 pads, 2 text, image (1, 3, 2), 1 text
    ids = [5, 6, 7] + [image] * 6 + [8, 9] + [image] * 6 + [10]
    spans = [{"segment": 0, "kind": "image", "start": 3, "length": 6, "llm_grid": [1, 2, 3]},
             {"segment": 0, "kind": "image", "start": 11, "length": 6, "llm_grid": [1, 3, 2]}]
    ours = mrope_positions(len(ids), [(0, len(ids))], spans)
    fake = types.SimpleNamespace(config=types.SimpleNamespace(vision_config=types.SimpleNamespace(spatial_merge_size=2)),
                                 get_vision_position_ids=lambda *a, **k: Qwen2VLModel.get_vision_position_ids(None, *a, **k))
    input_ids = torch.tensor([ids])
    types_ = (input_ids == image).int()
    hf, _ = Qwen2VLModel.get_rope_index(fake, input_ids, types_, image_grid_thw=torch.tensor([[1, 4, 6], [1, 6, 4]]))
    assert ours.tolist() == hf[:, 0].tolist()
    # A second segment starts again at 0.
    two = mrope_positions(2 * len(ids), [(0, len(ids)), (len(ids), 2 * len(ids))],
                          spans + [{**s, "segment": 1, "start": s["start"] + len(ids)} for s in spans])
    assert two[:, len(ids):].tolist() == ours.tolist()
    batch = PackedCollator(rope="mrope", pad_to=len(ids) + 2)([{**row([len(ids)]), "media": spans}])
    assert batch["position_ids"].shape == (3, 1, len(ids) + 2)
    assert batch["position_ids"][:, 0, : len(ids)].tolist() == ours.tolist()


def flat_batch():
    return PackedCollator(attention="varlen", pad_to_multiple_of=2)([row([7, 3]), row([12])])


@pytest.mark.parametrize("size", [1, 2, 4])
def test_ulysses_slices_reassemble_and_keep_every_target(size):
    b = flat_batch()
    parts = [shard_for_sequence_parallel(b, r, size, mode="ulysses") for r in range(size)]
    ids = torch.cat([p["input_ids"] for p in parts], dim=-1)
    n = b["input_ids"].shape[-1]
    assert ids[..., :n].tolist() == b["input_ids"].tolist() and ids.shape[-1] % size == 0
    shift = torch.cat([p["shift_labels"] for p in parts], dim=-1)[..., :n]
    assert shift[0, :-1].tolist() == b["labels"][0, 1:].tolist()  # every target kept, including slice borders
    assert all(p["input_ids"].shape == parts[0]["input_ids"].shape for p in parts)
    assert parts[0]["cu_seqlens"].tolist() == b["cu_seqlens"].tolist()


def test_ulysses_pads_a_dense_mask():
    b = PackedCollator(attention="sdpa")([row([3, 2])])
    p = shard_for_sequence_parallel(b, 1, 2, mode="ulysses")
    assert p["attention_mask"].shape == (1, 1, 6, 6) and p["attention_mask"][0, 0, 5].tolist() == [False] * 5 + [True]
    assert p["input_ids"].tolist() == [[4, 5, 0]]


@pytest.mark.parametrize("size", [1, 2, 3])
def test_ring_zigzag_reassembles_balances_and_keeps_targets(size):
    b = flat_batch()
    parts = [shard_for_sequence_parallel(b, r, size, mode="ring") for r in range(size)]
    total = int(parts[0]["cu_seqlens_padded"][-1])
    ids = torch.zeros(total, dtype=torch.long)
    shift = torch.full((total,), IGNORE)
    seen = torch.zeros(total, dtype=torch.int)
    for p in parts:
        ids[p["global_index"]] = p["input_ids"][0]
        shift[p["global_index"]] = p["shift_labels"][0]
        seen[p["global_index"]] += 1
        assert p["cu_seqlens_local"][-1] == p["input_ids"].shape[-1]
    assert seen.eq(1).all()
    padded, cu = parts[0]["cu_seqlens_padded"].tolist(), b["cu_seqlens"].tolist()
    for (a, e), (pa, _) in zip(zip(cu[:-1], cu[1:]), zip(padded[:-1], padded[1:])):
        assert ids[pa : pa + e - a].tolist() == b["input_ids"][0, a:e].tolist()
        assert shift[pa : pa + e - a - 1].tolist() == b["labels"][0, a + 1 : e].tolist()
    # Causal work per rank: sum over local tokens of (position in segment + 1): equal for every rank.
    work = [int((p["position_ids"][0] + 1).sum()) for p in parts]
    assert max(work) == min(work)
    assert sum(int((p["shift_labels"] != IGNORE).sum()) for p in parts) == int((b["labels"][0, 1:] != IGNORE).sum())


def test_ring_needs_a_flat_batch():
    with pytest.raises(ValueError, match="attention='varlen'"):
        shard_for_sequence_parallel(PackedCollator(attention="sdpa")([row([3])]), 0, 2, mode="ring")


class FakeRows:
    """A dataset stand-in with per-row stats: a few expensive rows among cheap ones."""

    def __init__(self, n=96, seed=0):
        rng = np.random.default_rng(seed)
        self.tokens = rng.integers(3000, 4096, n).astype(float)
        self.attention = np.where(rng.random(n) < 0.2, self.tokens**2, self.tokens * 200)  # some rows: one long segment
        self.items = rng.integers(0, 8, n).astype(float)

    def __len__(self):
        return len(self.tokens)

    def row_stats(self):
        return {"tokens": self.tokens, "attention": self.attention, "media_items": self.items, "media_tokens": self.items * 576}


@pytest.mark.parametrize("drop_last", [True, False])
def test_token_balanced_sampler_steps_coverage_and_balance(drop_last):
    ds = FakeRows(n=100)
    world, bs = 4, 3
    samplers = [TokenBalancedSampler(ds, num_replicas=world, rank=r, batch_size=bs, seed=1, drop_last=drop_last) for r in range(world)]
    lists = [list(s) for s in samplers]
    assert len({len(x) for x in lists}) == 1 and len(lists[0]) == len(samplers[0])
    flat = [i for x in lists for i in x]
    if drop_last:
        assert len(flat) == len(set(flat)) == 96
    else:
        assert set(flat) == set(range(100)) and len(flat) == 108
    costs = samplers[0].costs
    plan = samplers[0].assignment()
    balanced = costs[plan].sum(-1)  # [steps, ranks]
    order = np.resize(np.random.default_rng(1).permutation(100), plan.size)
    round_robin = costs[order.reshape(plan.shape[0], bs, world).transpose(0, 2, 1)].sum(-1)
    spread = lambda x: (x.max(1) / x.mean(1)).mean()  # noqa: E731
    assert spread(balanced) < spread(round_robin)
    samplers[0].set_epoch(1)
    assert list(samplers[0]) != lists[0]


@pytest.mark.parametrize(("batch_size", "window"), [(4, 64), (1, 4), (4, 1)])
def test_token_balanced_sampler_resumes_exactly(batch_size, window):
    ds = FakeRows()
    s = TokenBalancedSampler(ds, num_replicas=2, rank=1, batch_size=batch_size, seed=3, window=window)
    s.set_epoch(2)
    full = list(s)
    it = iter(s)
    head = [next(it) for _ in range(9)]
    state = s.state_dict()
    resumed = TokenBalancedSampler(ds, num_replicas=2, rank=1, batch_size=batch_size, seed=3, window=window)
    resumed.load_state_dict(state)
    assert len(resumed) == len(full) - 9
    assert head + list(resumed) == full
    with pytest.raises(ValueError, match="saved with seed 3"):
        TokenBalancedSampler(ds, num_replicas=2, rank=1, batch_size=4, seed=4).load_state_dict(state)


def test_token_balanced_sampler_balances_one_row_per_rank():
    """Batch 1: balancing within a random step can do nothing (window=1 is random order);
    grouping rows of like cost into a step does, the more the wider the window."""
    ds = FakeRows(n=400)
    spread = {w: TokenBalancedSampler(ds, num_replicas=8, rank=0, seed=0, drop_last=True, window=w) for w in (1, 4, 64)}
    costs = spread[1].costs
    random = np.random.default_rng(0).permutation(400).reshape(50, 8, 1)
    imb = {w: imbalance(costs, s.assignment()) for w, s in spread.items()}
    assert imb[1] == imbalance(costs, random) > imb[4] > imb[64]
    plans = [TokenBalancedSampler(ds, num_replicas=8, rank=r, seed=0, drop_last=True).assignment() for r in range(8)]
    assert all((p == plans[0]).all() for p in plans)  # every rank computes the same plan
    assert sorted(plans[0].ravel().tolist()) == list(range(400))
    with pytest.raises(ValueError, match="window must be at least one step"):
        TokenBalancedSampler(ds, num_replicas=8, rank=0, window=0)


@pytest.mark.parametrize("modalities", [["text", "image", "audio"], ["text"]])
def test_split_modality_sampler(modalities):
    rng = np.random.default_rng(0)
    n = 90
    lengths = rng.integers(10, 2000, n)
    mods = np.array(modalities)[np.arange(n) % len(modalities)]
    world, bs = 3, 2
    samplers = [SplitModalitySampler(lengths=lengths, modalities=mods, num_replicas=world, rank=r, batch_size=bs, seed=5)
                for r in range(world)]
    plan = samplers[0].assignment()
    assert plan.shape[1:] == (world, bs)
    for step in plan:
        assert len(set(mods[step.ravel()])) == 1  # one modality per global batch
    assert lengths[plan[0]].max() == lengths.max()  # longest first
    lists = [list(s) for s in samplers]
    assert len({len(x) for x in lists}) == 1
    assert set(i for x in lists for i in x) == set(range(n))


def test_packed_dataset_reads_checks_versions_and_pickles_small(sample_build, tmp_path):
    out, manifest = sample_build
    ds = PackedDataset(out)
    assert len(ds) == manifest["stats"]["rows"] and ds.max_length == 4096
    r = ds[0]
    assert r["cu_seqlens"][-1] == r["n_tokens"] == len(r["input_ids"]) and r["input_ids"].dtype == np.int32
    assert isinstance(PackedDataset(out, format="torch")[-1]["labels"], torch.Tensor)
    with pytest.raises(IndexError):
        ds[len(ds)]
    assert len(pickle.dumps(ds)) < 20_000
    stats = ds.row_stats()
    assert stats["tokens"].sum() == manifest["stats"]["tokens"] and (stats["attention"] <= stats["tokens"] ** 2).all()
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "manifest.json").write_text(json.dumps({**manifest, "schema_version": 99}))
    with pytest.raises(SchemaVersionError, match="schema_version 99 is not supported"):
        PackedDataset(bad)
    samples = SampleDataset(out)
    assert len(samples) == sum(e["rows"] for e in manifest["files"]["samples"])
    assert samples[0]["cu_seqlens"].tolist() == [0, samples[0]["n_tokens"]]


def test_dataloader_with_workers(sample_build):
    out, _ = sample_build
    ds = PackedDataset(out)
    sampler = TokenBalancedSampler(ds, num_replicas=2, rank=0, batch_size=2, seed=0)
    loader = torch.utils.data.DataLoader(ds, batch_size=2, sampler=sampler, num_workers=2,
                                         collate_fn=PackedCollator(attention="sdpa", pad_to=ds.max_length))
    batches = list(loader)
    assert len(batches) == len(sampler) // 2
    assert all(b["input_ids"].shape == (2, 4096) for b in batches)


@pytest.mark.parametrize("seed", range(6))
def test_block_mask_equals_create_block_mask(seed):
    from torch.nn.attention.flex_attention import create_block_mask

    from packer.modeling.masks import block_mask

    rng = np.random.default_rng(seed)
    cus = []
    for _ in range(3):
        lengths = rng.integers(1, 300, rng.integers(1, 12))
        cus.append(np.concatenate([[0], np.cumsum(lengths)]))
    length = int(max(c[-1] for c in cus)) + int(rng.integers(0, 200))
    segment, _ = segments_and_positions(cus, length)
    ours = block_mask(segment, "cpu")
    seg = segment

    def mask_mod(b, h, q, kv):
        return (seg[b, q] == seg[b, kv]) & (q >= kv)

    ref = create_block_mask(mask_mod, segment.shape[0], None, length, length, device="cpu")
    assert torch.equal(ours.to_dense(), ref.to_dense())
    assert torch.equal(ours.full_kv_num_blocks, ref.full_kv_num_blocks)


def test_stored_supervised_counts_equal_the_labels_and_give_the_same_weights(sample_build, tmp_path):
    """segment_trained / n_trained (stage 3) are what the labels say, split pieces included, and the
    collator's sample / sqrt weights from them equal the weights counted from the labels."""
    from packer.build import build
    from packer.config import resolve
    from packer.loader.dataset import supervised_counts

    out, _ = sample_build
    split = tmp_path / "split"
    build(resolve(ROOT / "pipelines" / "sample.toml", output=str(split), max_length=512, oversize="split",
                  max_bad_fraction=1.0), progress=False)
    for folder in (out, split):
        ds = PackedDataset(folder)
        rows = [ds[i] for i in range(len(ds))]
        for r in rows:
            counted = supervised_counts(r["labels"], r["cu_seqlens"])
            assert list(r["segment_trained"]) == counted.tolist() and r["n_trained"] == counted.sum() > 0
        for kind in ("sample", "sqrt"):
            collate = PackedCollator(loss=kind, pad_to_multiple_of=64)
            stored = collate(rows[:4])["loss_weights"]
            recounted = collate([{k: v for k, v in r.items() if k not in ("segment_trained", "n_trained")} for r in rows[:4]])
            assert torch.equal(stored, recounted["loss_weights"])
            flat = PackedCollator(loss=kind, attention="varlen")
            assert torch.equal(flat(rows[:4])["loss_weights"],
                               flat([{k: v for k, v in r.items() if k != "segment_trained"} for r in rows[:4]])["loss_weights"])
