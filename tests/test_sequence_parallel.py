"""Sequence-parallel slices keep everything: (m)RoPE positions and media spans, in both modes.

Every test slices a collated batch for every rank, puts the slices back together through
``global_index`` (ring) or the contiguous chunk layout (Ulysses), and compares with the
unsliced batch: positions on every token, and media pieces that cover each
placeholder exactly once at the right offset within its span.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from packer.loader import PackedCollator
from packer.loader.sequence_parallel import local_media_rows, shard_for_sequence_parallel

IGNORE = -100
IMAGE, AUDIO = 10**6, 10**6 + 1  # placeholder ids, above every text id
SPAN_KEYS = ("segment", "kind", "ref", "llm_grid", "batch")


def make_row(segments, start_id=1):
    """A packed row from segments given as lists of items: ``n`` (text tokens), ``("image", (t, h, w))``
    or ``("audio", n)``."""
    ids, media, cu = [], [], [0]
    for k, items in enumerate(segments):
        for item in items:
            if isinstance(item, int):
                ids += list(range(start_id + len(ids), start_id + len(ids) + item))
                continue
            kind, shape = item
            n = int(np.prod(shape)) if kind == "image" else shape
            media.append({"segment": k, "kind": kind, "start": len(ids), "length": n, "ref": f"{kind}{len(media)}.bin",
                          "llm_grid": list(shape) if kind == "image" else []})
            ids += [IMAGE if kind == "image" else AUDIO] * n
        cu.append(len(ids))
    ids = np.asarray(ids)
    labels = np.where(ids >= IMAGE, IGNORE, ids)
    labels[np.asarray(cu[:-1])] = IGNORE
    return {"input_ids": ids, "labels": labels, "cu_seqlens": np.asarray(cu), "n_tokens": len(ids), "media": media,
            "segment_ids": [f"s{i}" for i in range(len(segments))], "segment_modality": ["image"] * len(segments)}


ROWS = [
    make_row([[3, ("image", (1, 2, 3)), 2, ("image", (2, 2, 2)), 1], [2, ("audio", 5), 4], [("image", (1, 3, 3))]]),
    make_row([[1, ("image", (1, 4, 4)), 3], [5]], start_id=200),
]


def reassemble(batch, parts, mode):
    """Positions ``[..., B, L]`` and, per piece, its placeholders' (batch, position) in the unsliced batch."""
    positions = torch.full_like(batch["position_ids"], -1)
    length = batch["input_ids"].shape[-1]
    covered = []
    if mode == "ulysses":
        chunk = parts[0]["input_ids"].shape[-1]
        full = torch.cat([p["position_ids"] for p in parts], dim=-1)
        positions = full[..., :length]
        extra = full.shape[-1] - length
        assert full[..., length:].tolist() == torch.arange(extra).expand(*full.shape[:-1], extra).tolist()
        for rank, p in enumerate(parts):
            for m in p["media"]:
                covered.append((m, m["batch"], rank * chunk + m["start"] + torch.arange(m["length"])))
        return positions, covered
    cu, padded = batch["cu_seqlens"].tolist(), parts[0]["cu_seqlens_padded"].tolist()
    total = padded[-1]
    flat = torch.full((*batch["position_ids"].shape[:-2], total), -1, dtype=batch["position_ids"].dtype)
    unpad = torch.full((total,), -1)  # padded global position -> unsliced position (-1 on SP padding)
    for a, b, pa in zip(cu[:-1], cu[1:], padded[:-1]):
        unpad[pa : pa + b - a] = torch.arange(a, b)
    for p in parts:
        flat[..., p["global_index"]] = p["position_ids"][..., 0, :]
        for m in p["media"]:
            covered.append((m, 0, unpad[p["global_index"][m["start"] : m["start"] + m["length"]]]))
    for a, b, pa, pb in zip(cu[:-1], cu[1:], padded[:-1], padded[1:]):
        positions[..., 0, a:b] = flat[..., pa : pa + b - a]
        pad = flat[..., pa + b - a : pb]
        if pad.shape[-1]:  # SP padding: after every real position of the segment, increasing
            assert (pad[..., :1] > flat[..., pa : pa + b - a].amax(-1, keepdim=True)).all()
            assert (pad.diff(dim=-1) == 1).all()
    return positions, covered


def check(batch, size, mode):
    parts = [shard_for_sequence_parallel(batch, r, size, mode=mode) for r in range(size)]
    for p in parts:
        assert p["position_ids"].dim() == batch["position_ids"].dim()
        assert p["position_ids"].shape[-1] == p["input_ids"].shape[-1]
        order = [(m["batch"], m["start"]) for m in p["media"]]
        assert order == sorted(order)  # local token order, as the model scatters
    positions, covered = reassemble(batch, parts, mode)
    assert positions.tolist() == batch["position_ids"].tolist()  # collator padding included
    seen = torch.zeros_like(batch["input_ids"])
    spans = {(m["batch"], m["start"]): m for m in batch["media"]}
    for piece, b, where in covered:
        span = spans[(piece["batch"], piece["span_start"])]
        assert all(piece[k] == span[k] for k in SPAN_KEYS) and piece["span_length"] == span["length"]
        assert where.tolist() == list(range(span["start"] + piece["offset"], span["start"] + piece["offset"] + piece["length"]))
        seen[b, where] += 1
    placeholder = batch["input_ids"] >= IMAGE
    assert seen[placeholder].eq(1).all() and seen[~placeholder].eq(0).all()
    check_scatter(batch, parts, mode)
    return parts


def check_scatter(batch, parts, mode):
    """What each rank scatters from the encoder output equals what the unsliced batch holds at those places."""
    images = sorted((m for m in batch["media"] if m["kind"] == "image"), key=lambda m: (m["batch"], m["start"]))
    # A stand-in encoder output: one row per placeholder, holding its (batch, position) code.
    embeds = encoder_rows([(m["batch"], m["start"], m["length"]) for m in images])
    for p in parts:
        pieces = p["media"]
        where = torch.nonzero(p["input_ids"] == IMAGE)  # row-major: the order masked_scatter fills
        codes = [int(b) * 100_000 + global_position(p, mode, int(t)) for b, t in where]
        assert embeds[local_media_rows(pieces, batch["media"], kind="image")].tolist() == codes
        held = sorted({(m["batch"], m["span_start"], m["span_length"]) for m in pieces if m["kind"] == "image"})
        assert encoder_rows(held)[local_media_rows(pieces, kind="image")].tolist() == codes  # default: only the spans held


def encoder_rows(spans):
    return torch.cat([b * 100_000 + s + torch.arange(n) for b, s, n in spans] + [torch.zeros(0, dtype=torch.long)])


def global_position(part, mode, t):
    """A local position's place in the unsliced row; -1 on SP padding."""
    g = int(part["global_index"][t])
    padded, cu = part["cu_seqlens_padded"].tolist(), part["cu_seqlens"].tolist()
    if mode == "ulysses":  # padding only at the end
        return g if g < cu[-1] else -1
    k = int(np.searchsorted(padded, g, side="right")) - 1
    return cu[k] + g - padded[k] if g - padded[k] < cu[k + 1] - cu[k] else -1


@pytest.mark.parametrize("size", [1, 2, 3, 4])
@pytest.mark.parametrize("mode", ["ring", "ulysses"])
@pytest.mark.parametrize("rope", ["mrope", "default"])
def test_varlen_slices_reassemble_to_positions_and_spans(size, mode, rope):
    batch = PackedCollator(attention="varlen", rope=rope)(ROWS)
    assert batch["position_ids"].dim() == (3 if rope == "mrope" else 2)
    check(batch, size, mode)


@pytest.mark.parametrize("size", [1, 2, 3, 4])
@pytest.mark.parametrize("rope", ["mrope", "default"])
def test_ulysses_padded_batch_reassembles_per_row(size, rope):
    batch = PackedCollator(attention="sdpa", rope=rope)(ROWS)  # [3, 2, L]: row 0 padded by the collator
    parts = check(batch, size, "ulysses")
    assert {m["batch"] for p in parts for m in p["media"]} == {0, 1}


def test_ring_golden_docstring_example():
    batch = PackedCollator(attention="varlen", rope="mrope")([make_row([[1, ("image", (1, 2, 3)), 1]])])
    assert batch["position_ids"][:, 0].tolist() == [[0, 1, 1, 1, 1, 1, 1, 4], [0, 1, 1, 1, 2, 2, 2, 4], [0, 1, 2, 3, 1, 2, 3, 4]]
    r0, r1 = (shard_for_sequence_parallel(batch, r, 2, mode="ring") for r in range(2))
    assert r0["position_ids"][:, 0].tolist() == [[0, 1, 1, 4], [0, 1, 2, 4], [0, 1, 3, 4]]
    assert [(m["start"], m["length"], m["offset"]) for m in r0["media"]] == [(1, 1, 0), (2, 1, 5)]
    assert [(m["start"], m["length"], m["offset"]) for m in r1["media"]] == [(0, 4, 1)]
    encoded = [batch["media"][0], {"batch": 0, "start": -4, "length": 4, "kind": "image"}]  # after a 4-row span
    assert local_media_rows(r0["media"], encoded, kind="image").tolist() == [4, 9]
    assert local_media_rows(r0["media"]).tolist() == [0, 5] and local_media_rows(r0["media"], kind="audio").tolist() == []


def test_ring_pads_mrope_positions_after_the_segment():
    batch = PackedCollator(attention="varlen", rope="mrope")([make_row([[1, ("image", (1, 3, 3))]])])  # 10 tokens
    p = shard_for_sequence_parallel(batch, 0, 4, mode="ring")  # padded to 16, chunks 0 and 7
    assert p["global_index"].tolist() == [0, 1, 14, 15]
    # The largest real position is 3 (text 0, image 1..3), so padding 10..15 takes 4..9 on every axis.
    assert p["position_ids"][:, 0, 2:].tolist() == [[8, 9]] * 3


def test_errors():
    batch = PackedCollator(attention="varlen", rope="mrope")(ROWS)
    with pytest.raises(ValueError, match=r"position_ids of shape \(3, 65\) do not match input_ids \(1, 65\): expected \[B, L\]"):
        shard_for_sequence_parallel({**batch, "position_ids": batch["position_ids"][:, 0]}, 0, 2)
    pieces = shard_for_sequence_parallel(batch, 0, 2, mode="ring")["media"]
    audio = [m for m in batch["media"] if m["kind"] == "audio"]
    with pytest.raises(ValueError, match=r"image span at batch 0, start 3 is not among the 1 encoded spans; pass every span"):
        local_media_rows(pieces, audio)  # image pieces among the pieces: kind="audio" was meant


item = st.one_of(st.integers(1, 7),
                 st.tuples(st.just("image"), st.tuples(st.integers(1, 2), st.integers(1, 4), st.integers(1, 4))),
                 st.tuples(st.just("audio"), st.integers(1, 6)))
segment = st.lists(item, min_size=1, max_size=4)
rows = st.lists(st.lists(segment, min_size=1, max_size=4), min_size=1, max_size=3)


@settings(max_examples=60, deadline=None)
@given(rows=rows, size=st.integers(1, 4), mode=st.sampled_from(["ring", "ulysses"]),
       attention=st.sampled_from(["varlen", "sdpa"]), multiple=st.sampled_from([None, 3, 8]), shuffle=st.randoms())
def test_property_slices_reassemble(rows, size, mode, attention, multiple, shuffle):
    if attention == "sdpa":
        mode = "ulysses"
    batch = PackedCollator(attention=attention, rope="mrope", pad_to_multiple_of=multiple)(
        [make_row(r, start_id=1 + 1000 * i) for i, r in enumerate(rows)])
    shuffle.shuffle(batch["media"])  # pieces come out in local order whatever the spans' order
    check(batch, size, mode)


def test_docs_recipe_scatters_what_an_unsliced_qwen2vl_would():
    """The docs' recipe on a tiny random Qwen2-VL: every rank's inputs_embeds equal the unsliced ones at its positions."""
    from transformers import Qwen2VLConfig, Qwen2VLForConditionalGeneration

    torch.manual_seed(0)
    cfg = Qwen2VLConfig(text_config=dict(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                         num_attention_heads=2, num_key_value_heads=1,
                                         rope_scaling={"type": "mrope", "mrope_section": [2, 3, 3]}),
                        vision_config=dict(depth=1, embed_dim=16, hidden_size=32, num_heads=2, patch_size=2,
                                           spatial_merge_size=2, temporal_patch_size=2),
                        image_token_id=63)
    model = Qwen2VLForConditionalGeneration(cfg).eval()
    rows = [make_row([[2, ("image", (1, 2, 3)), 3, ("image", (1, 3, 2)), 1], [1, ("image", (1, 2, 2)), 4]])]
    for r in rows:
        r["input_ids"] = np.where(r["input_ids"] >= IMAGE, 63, r["input_ids"] % 60 + 1)
    batch = PackedCollator(attention="varlen", rope="mrope")(rows)
    grid_thw = torch.tensor([[t, 2 * h, 2 * w] for t, h, w in (m["llm_grid"] for m in batch["media"])])  # patches, before merging
    pixel_values = torch.randn(int(grid_thw.prod(-1).sum()), 3 * 2 * 2 * 2)
    with torch.no_grad():
        image = torch.cat(model.get_image_features(pixel_values, grid_thw).pooler_output)
        full = model.get_input_embeddings()(batch["input_ids"])
        full = full.masked_scatter((batch["input_ids"] == 63)[..., None], image)  # what the model's own forward does
        for mode, size in [("ring", 2), ("ring", 3), ("ulysses", 3)]:
            for rank in range(size):
                local = shard_for_sequence_parallel(batch, rank, size, mode=mode)
                rows_ = local_media_rows(local["media"], batch["media"], kind="image")
                embeds = model.get_input_embeddings()(local["input_ids"])
                embeds[local["input_ids"] == model.config.image_token_id] = image[rows_].to(embeds.dtype)
                where = [global_position(local, mode, t) for t in range(local["input_ids"].shape[-1])]
                real = [t for t, g in enumerate(where) if g >= 0]
                assert torch.equal(embeds[0, real], full[0, [where[t] for t in real]])
