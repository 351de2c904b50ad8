"""The loader on preference rows: tree masks in every form that can express them, positions per
branch (1-D and mRoPE), the refusals (varlen, position_ids, ring SP), Ulysses slices, and the per-response
log-probabilities and DPO loss, against their definitions."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from packer.loader import (
    PackedCollator,
    all_reduce_logps,
    dpo_loss,
    mrope_positions,
    packed_logps,
    shard_for_sequence_parallel,
    token_logps,
)
from packer.loader.trees import VARLEN_REFUSAL

IGNORE = -100


def make_row(rng: np.random.Generator, records: list[tuple[str, list[int]]]) -> dict:
    """A row from records: ("sft", [n]) one plain segment; ("tree", [p, b1, b2, ...]) a prompt and branches;
    ("pairs", [n1, n2]) a chosen / rejected pair."""
    sizes, parent, group, role, ids = [], [], [], [], []
    for kind, lengths in records:
        first = len(sizes)
        for k, n in enumerate(lengths):
            sizes.append(n)
            group.append(first if kind != "sft" else len(sizes) - 1)
            if kind == "tree":
                parent.append(-1 if k == 0 else first)
                role.append("prompt" if k == 0 else ("chosen", "rejected", "2", "3")[k - 1])
            else:
                parent.append(-1)
                role.append("" if kind == "sft" else ("chosen", "rejected")[k])
            ids.append(f"r{first}")
    n = int(sum(sizes))
    tokens = rng.integers(1, 50, n)
    labels = tokens.copy()
    cu = np.concatenate([[0], np.cumsum(sizes)])
    for k in range(len(sizes)):
        labels[cu[k]] = IGNORE
        if role[k] == "prompt":
            labels[cu[k] : cu[k + 1]] = IGNORE
    return {"input_ids": tokens, "labels": labels, "cu_seqlens": cu, "n_tokens": n, "media": [], "segment_ids": ids,
            "segment_modality": ["text"] * len(sizes), "segment_parent": parent, "segment_group": group,
            "segment_role": role, "segment_weight": [math.nan] * len(sizes)}


ROWS = [[("tree", [5, 3, 4]), ("sft", [4]), ("pairs", [6, 7])], [("sft", [3]), ("tree", [7, 2, 2, 5])], [("sft", [9])]]


def definition(row: dict, length: int) -> tuple[np.ndarray, np.ndarray]:
    """Brute force: allowed[q, k] and positions of one row, from the segments' parents."""
    cu, parent = row["cu_seqlens"], row["segment_parent"]
    seg = np.full(length, len(parent))
    for k in range(len(parent)):
        seg[cu[k] : cu[k + 1]] = k
    allowed = np.zeros((length, length), bool)
    pos = np.zeros(length, np.int64)
    for q in range(length):
        s = seg[q]
        for k in range(q + 1):
            allowed[q, k] = seg[k] == s or (s < len(parent) and seg[k] == parent[s])
        start = cu[s] if s < len(parent) else row["n_tokens"]
        pos[q] = q - start + ((cu[parent[s] + 1] - cu[parent[s]]) if s < len(parent) and parent[s] >= 0 else 0)
    return allowed, pos


@pytest.fixture
def rows():
    rng = np.random.default_rng(0)
    return [make_row(rng, r) for r in ROWS]


def test_sdpa_and_eager_masks_and_positions_are_the_definition(rows):
    batch = PackedCollator(attention="sdpa", pad_to=40)(rows)
    eager = PackedCollator(attention="eager", pad_to=40)(rows)
    for b, row in enumerate(rows):
        allowed, pos = definition(row, 40)
        assert torch.equal(batch["attention_mask"][b, 0], torch.as_tensor(allowed))
        assert torch.equal(eager["attention_mask"][b, 0] == 0, torch.as_tensor(allowed))
        assert batch["position_ids"][b].tolist() == pos.tolist()
    assert batch["segment_parent"] == [r["segment_parent"] for r in rows]
    assert [(r["batch"], r["role"], r["group"]) for r in batch["responses"]] == [
        (0, "chosen", 0), (0, "rejected", 0), (0, "chosen", 4), (0, "rejected", 4),
        (1, "chosen", 1), (1, "rejected", 1), (1, "2", 1)]


@pytest.mark.parametrize("seed", range(3))
def test_flex_block_mask_of_trees_equals_create_block_mask(seed):
    from torch.nn.attention.flex_attention import create_block_mask

    from packer.loader.trees import block_mask
    from packer.modeling.masks import segments_and_positions

    rng = np.random.default_rng(seed)
    rows = []
    for _ in range(2):
        records = [("tree", rng.integers(1, 90, rng.integers(2, 5)).tolist()) if rng.random() < 0.6
                   else ("sft", [int(rng.integers(1, 150))]) for _ in range(rng.integers(1, 5))]
        rows.append(make_row(rng, records))
    length = max(r["n_tokens"] for r in rows) + int(rng.integers(0, 130))
    segment, _ = segments_and_positions([r["cu_seqlens"] for r in rows], length)
    parents = [np.asarray(r["segment_parent"]) for r in rows]
    ours = block_mask(segment, parents, "cpu")
    dense = torch.stack([torch.as_tensor(definition(r, length)[0]) for r in rows])

    def mask_mod(b, h, q, kv):
        return dense[b, q, kv]

    ref = create_block_mask(mask_mod, len(rows), None, length, length, device="cpu")
    assert torch.equal(ours.to_dense(), ref.to_dense())
    assert torch.equal(ours.full_kv_num_blocks, ref.full_kv_num_blocks)
    q, kv = torch.meshgrid(torch.arange(length), torch.arange(length), indexing="ij")
    for b in range(len(rows)):
        assert torch.equal(ours.mask_mod(b, 0, q, kv), dense[b])  # the mask_mod the kernel evaluates


def test_forms_that_cannot_express_a_tree_are_refused(rows):
    for attention in ("varlen", "position_ids"):
        with pytest.warns(UserWarning) if attention == "position_ids" else _nothing():
            collate = PackedCollator(attention=attention)
        with pytest.raises(ValueError, match="cannot be expressed as varlen"):
            collate(rows)
    assert VARLEN_REFUSAL.startswith("rows holding preference trees")
    pairs = [make_row(np.random.default_rng(1), [("pairs", [4, 5]), ("sft", [3])])]
    flat = PackedCollator(attention="varlen")(pairs)  # pairs rows flatten: their responses are renumbered
    assert [(r["role"], r["group"], r["start"], r["end"]) for r in flat["responses"]] == [("chosen", 0, 0, 4),
                                                                                         ("rejected", 0, 4, 9)]
    batch = PackedCollator(attention="sdpa", pad_to_multiple_of=4)(rows)
    with pytest.raises(ValueError, match="ring attention .* preference trees"):
        shard_for_sequence_parallel(batch, 0, 2, mode="ring")


class _nothing:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def test_ulysses_slices_of_tree_rows_keep_the_mask_and_the_positions(rows):
    batch = PackedCollator(attention="sdpa", pad_to=40)(rows)
    parts = [shard_for_sequence_parallel(batch, r, 4, mode="ulysses") for r in range(4)]
    assert torch.equal(torch.cat([p["position_ids"] for p in parts], -1), batch["position_ids"])
    assert all(p["attention_mask"] is batch["attention_mask"] for p in parts)
    shifted = torch.cat([p["shift_labels"] for p in parts], -1)
    assert torch.equal(shifted[:, :-1], batch["labels"][:, 1:])


def test_ulysses_ranks_logps_sum_to_the_whole_rows(rows, tmp_path):
    """Each rank's packed_logps of its slice (local logits, local batch) summed over the SP group = the whole
    batch's, as all_reduce_logps sums them (a one-rank gloo group runs the call here; the sum is checked by hand)."""
    batch = PackedCollator(attention="sdpa", pad_to=40)(rows)
    torch.manual_seed(1)
    logits = torch.randn(3, 40, 50, dtype=torch.float64)
    whole = packed_logps(logits, batch)
    parts = [shard_for_sequence_parallel(batch, r, 4, mode="ulysses") for r in range(4)]
    local = [packed_logps(logits[:, p["global_index"]], p) for p in parts]
    assert torch.allclose(sum(x.sum for x in local), whole.sum) and torch.equal(sum(x.tokens for x in local), whole.tokens)
    assert all(x.role == whole.role and x.key == whole.key for x in local)
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        reduced = all_reduce_logps(local[1])
    finally:
        dist.destroy_process_group()
    assert torch.equal(reduced.sum, local[1].sum) and torch.equal(reduced.tokens, local[1].tokens)
    assert torch.allclose(reduced.mean, local[1].sum / local[1].tokens.clamp(min=1))


def test_mrope_branches_continue_where_the_prompt_leaves_off():
    image = {"segment": 0, "kind": "image", "start": 2, "length": 12, "tokens": 12, "llm_grid": [1, 3, 4]}
    prompt, branches = 20, [5, 8]
    tree = mrope_positions(prompt + sum(branches), [(0, 20), (20, 25), (25, 33)], [image], parents=[-1, 0, 0])
    for k, (a, n) in enumerate(((20, 5), (25, 8))):
        alone = mrope_positions(prompt + n, [(0, prompt + n)], [image])  # the prompt + this response, one segment
        assert torch.equal(tree[:, a : a + n], alone[:, prompt:]), k
    assert torch.equal(tree[:, :20], mrope_positions(20, [(0, 20)], [image]))


def test_packed_logps_sums_each_responses_own_targets_and_dpo_loss_is_the_sigmoid_loss(rows):
    batch = PackedCollator(attention="sdpa", pad_to=40)(rows)
    torch.manual_seed(0)
    logits = torch.randn(3, 40, 50, dtype=torch.float64, requires_grad=True)
    out = packed_logps(logits, batch)
    lp = torch.log_softmax(logits, -1)
    labels = batch["labels"]
    for i, r in enumerate(batch["responses"]):
        b, a, e = r["batch"], r["start"], r["end"]
        want = sum(lp[b, t, labels[b, t + 1]] for t in range(a, e - 1) if labels[b, t + 1] != IGNORE)
        n = int((labels[b, a + 1 : e] != IGNORE).sum())
        assert torch.allclose(out.sum[i], want) and int(out.tokens[i]) == n and torch.allclose(out.mean[i], want / n)
    assert out.record == [r["id"] for r in batch["responses"]] and out.role[2] == "chosen"
    assert float(token_logps(logits, batch).detach()[labels.roll(-1, 1) == IGNORE].abs().sum()) == 0
    chosen, rejected = out.pairs()
    assert chosen.tolist() == [0, 2, 4] and rejected.tolist() == [1, 3, 5]
    ref = out.sum.detach() + torch.linspace(-1, 1, len(out))
    margin = (out.sum[chosen] - ref[chosen]) - (out.sum[rejected] - ref[rejected])
    want = -torch.nn.functional.logsigmoid(0.1 * margin).mean()
    assert torch.allclose(dpo_loss(out, ref, beta=0.1), want)
    total, count = dpo_loss(out, ref, beta=0.1, reduce=False)
    assert count == 3 and torch.allclose(total / count, want)
    dpo_loss(out, ref).backward()
    assert logits.grad is not None and logits.grad.abs().sum() > 0
    lonely = [make_row(np.random.default_rng(2), [("pairs", [4, 5])])]
    lonely[0]["segment_role"][1] = "3"
    alone = packed_logps(torch.zeros(1, 9, 50), PackedCollator()(lonely))
    with pytest.raises(ValueError, match="chosen response without a rejected"):
        alone.pairs()
    with pytest.raises(ValueError, match="lists no responses"):
        packed_logps(logits, {k: v for k, v in batch.items() if k != "responses"})


def test_families_whose_own_masks_or_positions_cannot_hold_a_tree_refuse_tree_rows(rows):
    from packer.families import Family
    from packer.loader.collate import PackedCollator as Collator

    def declared(name: str, **hooks):  # a family declaring just the hooks under test
        return type(name, (Family,), {"name": name, "run_tokens": lambda self: {}, "expand": lambda self, *a: None,
                                      **hooks})(())

    collate = Collator(attention="sdpa")
    collate.family = declared("gemma3", layer_masks=True)
    with pytest.raises(ValueError, match="family gemma3: its masks per layer type"):
        collate(rows)
    collate.family = declared("qwen3omni", own_positions=True, rope="mrope")
    collate.rope = "mrope"
    with pytest.raises(ValueError, match="family qwen3omni: its own positions"):
        collate(rows)
    collate.family = declared("qwen35", linear_attention=True)
    with pytest.raises(ValueError, match="linear-attention layers carry one state"):
        collate(rows)


@pytest.mark.parametrize("layout", ["pairs", "tree"])
def test_a_batch_of_sft_samples_of_a_preference_build_has_no_response_from_either_dataset(tmp_path, layout):
    """Before: a SampleDataset batch of only SFT samples raised 'lists no responses' (its rows carried no roles) where
    the same samples packed (PackedDataset, roles "") gave an empty result, and a flattened (varlen) SampleDataset
    batch mixing SFT and preference samples dropped every response. Now an SFT sample is a row of one segment with
    role "", as packed: both give no response, and the mixed batch keeps them."""
    import json

    from conftest import TOKENIZER
    from packer.build import build
    from packer.config import resolve
    from packer.loader import PackedDataset, SampleDataset

    sft = [{"messages": [{"role": "user", "content": f"q{i}"}, {"role": "assistant", "content": f"a{i}"}]} for i in range(3)]
    source = tmp_path / "sft.jsonl"
    source.write_text("".join(json.dumps(r) + "\n" for r in [*sft, {"text": "a document"}]))
    out = tmp_path / "sft"
    build(resolve(None, input=[str(source)], output=str(out), tokenizer=TOKENIZER, preference=layout), progress=False)
    for ds in (PackedDataset(out), SampleDataset(out)):
        batch = PackedCollator()([ds[i] for i in range(len(ds))])
        assert batch["responses"] == []
        assert len(packed_logps(torch.zeros(*batch["input_ids"].shape, len(ds.tokenizer())), batch)) == 0
    mixed = tmp_path / "mixed.jsonl"
    mixed.write_text(source.read_text() + json.dumps({"prompt": "2+2?", "chosen": "4", "rejected": "5"}) + "\n")
    build(resolve(None, input=[str(mixed)], output=str(tmp_path / "mixed"), tokenizer=TOKENIZER, preference=layout),
          progress=False)
    ds = SampleDataset(tmp_path / "mixed")
    rows = [ds[i] for i in range(len(ds))]
    for attention in ("sdpa", "varlen"):
        batch = PackedCollator(attention=attention)(rows)
        assert sorted(r["role"] for r in batch["responses"]) == ["chosen", "rejected"]
