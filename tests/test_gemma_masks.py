"""Masks per layer type with bidirectional media blocks and sliding windows (Gemma 3 / 4): the worked examples,
the three forms (bool, additive, BlockMask) equal element for element, the collator's choices and refusals, and
Ulysses sequence parallelism carrying them."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from transformers import Gemma3TextConfig, Gemma4TextConfig

from packer.families.gemma3 import Gemma3, Gemma3Settings
from packer.families.gemma4 import Gemma4, Gemma4Settings
from packer.loader import PackedCollator
from packer.loader.sequence_parallel import shard_for_sequence_parallel
from packer.modeling.masks import allowed, block_mask, media_blocks, segments_and_positions

IMG = 7  # the image placeholder id of the rows below


def dense(mask, length: int) -> torch.Tensor:
    """A ``BlockMask`` element by element: full blocks True, partial blocks through its mask_mod, others False."""
    q_block, kv_block = mask.BLOCK_SIZE
    batch = mask.kv_num_blocks.shape[0]
    out = torch.zeros(batch, length, length, dtype=torch.bool)
    q = torch.arange(length)[:, None]
    kv = torch.arange(length)[None, :]
    for b in range(batch):
        for qb in range(mask.kv_num_blocks.shape[-1]):
            rows = slice(qb * q_block, min((qb + 1) * q_block, length))
            for n, idx, full in ((mask.kv_num_blocks, mask.kv_indices, False),
                                 (mask.full_kv_num_blocks, mask.full_kv_indices, True)):
                for j in range(int(n[b, 0, qb])):
                    kb = int(idx[b, 0, qb, j])
                    cols = slice(kb * kv_block, min((kb + 1) * kv_block, length))
                    if full:
                        out[b, rows, cols] = True
                    else:
                        qq, kk = torch.broadcast_tensors(q[rows], kv[:, cols])
                        out[b, rows, cols] = mask.mask_mod(torch.tensor(b), torch.tensor(0), qq, kk)
    return out


def test_worked_example():
    """Two segments; the first holds an image of 3 tokens; window 2 in the sliding layer."""
    ids = torch.tensor([[1, IMG, IMG, IMG, 2, 3, IMG, 4]])
    segment, _ = segments_and_positions([[0, 5, 8]], 8)
    blocks = media_blocks(ids, [IMG])
    assert blocks.tolist() == [[-1, 0, 0, 0, -1, -1, 1, -1]]
    full = allowed(segment, blocks)[0, 0].int().tolist()
    assert full == [[1, 0, 0, 0, 0, 0, 0, 0],
                    [1, 1, 1, 1, 0, 0, 0, 0],   # an image token sees its whole image
                    [1, 1, 1, 1, 0, 0, 0, 0],
                    [1, 1, 1, 1, 0, 0, 0, 0],
                    [1, 1, 1, 1, 1, 0, 0, 0],
                    [0, 0, 0, 0, 0, 1, 0, 0],   # the next segment sees nothing before it
                    [0, 0, 0, 0, 0, 1, 1, 0],
                    [0, 0, 0, 0, 0, 1, 1, 1]]
    sliding = allowed(segment, blocks, window=2)[0, 0].int().tolist()
    assert sliding[3] == [0, 0, 1, 1, 0, 0, 0, 0]  # two back at most, the window cuts into the image
    assert sliding[1] == [1, 1, 1, 1, 0, 0, 0, 0]  # forward within the image: the window bounds looking back only
    assert allowed(segment)[0, 0, 1].int().tolist() == [1, 1, 0, 0, 0, 0, 0, 0]


@pytest.mark.parametrize("seed", range(4))
def test_block_mask_equals_the_bool_mask(seed):
    rng = np.random.default_rng(seed)
    cus, rows = [], []
    length = 200
    for _ in range(2):
        lengths = rng.integers(1, 60, rng.integers(1, 6))
        cu = np.concatenate([[0], np.cumsum(lengths)])
        cu = cu[cu <= length - int(rng.integers(0, 20))]
        cus.append(cu)
        ids = np.zeros(length, dtype=np.int64)
        for a, b in zip(cu[:-1], cu[1:], strict=True):  # an image run inside some segments
            if b - a > 4 and rng.random() < 0.7:
                s = int(rng.integers(a + 1, b - 2))
                ids[s : s + int(rng.integers(1, b - s))] = IMG
        rows.append(ids)
    segment, _ = segments_and_positions(cus, length)
    ids = torch.as_tensor(np.stack(rows))
    blocks = media_blocks(ids, [IMG])
    for window in (None, 5, 40):
        for own in (None, blocks):
            ours = block_mask(segment, "cpu", block_size=16, blocks=own, window=window)
            assert torch.equal(dense(ours, length), allowed(segment, own, window)[:, 0]), (window, own is None)


def rows_with_an_image():
    """Two packed rows: a text segment and a segment holding an image of 4 placeholders."""
    ids = [5, 6, 8, IMG, IMG, IMG, IMG, 9, 10]
    return [{"input_ids": np.array(ids), "labels": np.array(ids), "cu_seqlens": np.array([0, 2, 9]), "n_tokens": 9,
             "media": [{"segment": 1, "kind": "image", "start": 3, "length": 4, "tokens": 4, "ref": "x.png"}]},
            {"input_ids": np.array([5, 6, 8]), "labels": np.array([5, 6, 8]), "cu_seqlens": np.array([0, 3]),
             "n_tokens": 3, "media": []}]


def gemma(name: str, bidirectional=None):
    if name == "gemma3":
        family = Gemma3(("image",), Gemma3Settings()).describe()
        config = Gemma3TextConfig(sliding_window=3, layer_types=["sliding_attention", "full_attention"], num_hidden_layers=2)
    else:
        family = Gemma4(("image", "video", "audio"), Gemma4Settings()).describe()
        config = Gemma4TextConfig(sliding_window=3, layer_types=["sliding_attention", "full_attention"], num_hidden_layers=2,
                                  use_bidirectional_attention=bidirectional)
    return {**family, "run_ids": {"image": IMG, "video": 11, "audio": 12}}, config


@pytest.mark.parametrize("name,bidirectional", [("gemma3", None), ("gemma4", "vision"), ("gemma4", None)])
def test_collator_masks_per_layer_type(name, bidirectional):
    family, config = gemma(name, bidirectional)
    rows = rows_with_an_image()
    sdpa = PackedCollator(attention="sdpa", pad_to=12, family=family, model_config=config)(rows)
    masks = sdpa["attention_mask"]
    assert set(masks) == {"full_attention", "sliding_attention"}
    segment = sdpa["seq_idx"].long()
    blocks = media_blocks(sdpa["input_ids"], [IMG])
    # Gemma 3: the image block in every layer; Gemma 4 ("vision"): in the sliding layers only; else in none
    full_blocks = name == "gemma3"
    sliding_blocks = name == "gemma3" or bidirectional == "vision"
    assert torch.equal(masks["full_attention"], allowed(segment, blocks if full_blocks else None))
    assert torch.equal(masks["sliding_attention"], allowed(segment, blocks if sliding_blocks else None, window=3))
    assert bool(masks["sliding_attention"][0, 0, 3, 6]) == sliding_blocks  # first image token sees the last one
    eager = PackedCollator(attention="eager", pad_to=12, family=family, model_config=config)(rows)["attention_mask"]
    for key, mask in eager.items():
        assert torch.equal(mask == 0, masks[key]) and mask.dtype == torch.float32
    flex = PackedCollator(attention="flex", pad_to=12, family=family, model_config=config)(rows)["attention_mask"]
    for key, mask in flex.items():
        assert torch.equal(dense(mask, 12), masks[key][:, 0])
    if name == "gemma3":
        assert sdpa["token_type_ids"][0].tolist() == [0, 0, 0, 1, 1, 1, 1, 0, 0, 0, 0, 0]
    else:
        assert sdpa["mm_token_type_ids"][0].tolist() == [0, 0, 0, 1, 1, 1, 1, 0, 0, 0, 0, 0]


@pytest.mark.filterwarnings("ignore:attention=.position_ids. isolates")
def test_collator_refusals():
    family, config = gemma("gemma3")
    rows = rows_with_an_image()
    for form in ("varlen", "position_ids"):
        with pytest.raises(ValueError, match="cannot express family gemma3's masks: its image tokens attend to later"):
            PackedCollator(attention=form, family=family, model_config=config)(rows)
    with pytest.raises(ValueError, match=r"pass PackedCollator\(model_config=model.config"):
        PackedCollator(attention="sdpa", family=family)(rows)
    family, config = gemma("gemma4", "all")
    with pytest.raises(ValueError, match="use_bidirectional_attention='all'"):
        PackedCollator(attention="sdpa", family=family, model_config=config)(rows)


def test_ulysses_carries_the_masks_per_layer_type():
    family, config = gemma("gemma3")
    batch = PackedCollator(attention="sdpa", family=family, model_config=config)(rows_with_an_image())  # length 9
    parts = [shard_for_sequence_parallel(batch, rank, 2) for rank in range(2)]
    for part in parts:
        assert set(part["attention_mask"]) == {"full_attention", "sliding_attention"}
        for key, mask in part["attention_mask"].items():
            assert mask.shape == (2, 1, 10, 10) and torch.equal(mask[..., :9, :9], batch["attention_mask"][key])
            assert mask[..., 9, 9].all() and not mask[..., 9, :9].any()
    assert torch.equal(torch.cat([p["token_type_ids"] for p in parts], dim=1)[:, :9], batch["token_type_ids"])
