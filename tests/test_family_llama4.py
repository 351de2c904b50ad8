"""Llama 4, token for token with ``Llama4Processor`` and logit for logit with ``Llama4ForConditionalGeneration``.

The processor (``assets_llama4``: 56-px tiles of 4 ``<|patch|>`` features, at most 6 tiles plus the global one)
is saved into a checkpoint folder the build reads with ``--processor``; records hold the awkward images of the
family harness. The tiny text model has chunked-attention layers of 16-position chunks, so every packed segment
crosses chunk boundaries: the collator's per-layer-type masks must restart the chunks at each segment. The
canvas choice is also compared with ``get_best_fit`` / ``find_supported_resolutions`` and the image processor
over grids of sizes, and the expansion with ``Llama4Processor._prompt_split_image``.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Any

import numpy as np
import pytest
import torch

pytest.importorskip("torchvision")

from assets_llama4 import CHUNK, PER_TILE, llama4_processor  # noqa: E402
from family_harness import conformance, hf_inputs, segments  # noqa: E402

from packer.families.base import Run  # noqa: E402
from packer.families.checkpoint import read_checkpoint  # noqa: E402
from packer.families.llama4 import (  # noqa: E402
    Llama4Settings,
    best_fit,
    chunk_segments,
    image_pieces,
    supported_resolutions,
    tile_grid,
)
from packer.loader import PackedCollator, PackedDataset, model_inputs  # noqa: E402
from packer.loader.sequence_parallel import shard_for_sequence_parallel  # noqa: E402

FAMILY = "llama4"
TestConformance = conformance(FAMILY)  # without the 30-image row; tiled images cut anywhere under SP


def test_processor_options_override(tmp_path):
    llama4_processor(tmp_path / "ck")
    s = Llama4Settings.resolve(read_checkpoint(str(tmp_path / "ck")), "max_patches=4,resize_to_max_canvas=true")
    assert (s.tile_size, s.max_patches, s.resize_to_max_canvas) == (56, 4, True)


@pytest.mark.parametrize("max_patches", [1, 4, 6, 16])
@pytest.mark.parametrize("to_max", [False, True])
def test_canvas_equals_get_best_fit(max_patches, to_max):
    from transformers.image_utils import SizeDict
    from transformers.models.llama4.image_processing_llama4 import find_supported_resolutions, get_best_fit

    ours = supported_resolutions(max_patches, 336)
    theirs = find_supported_resolutions(max_patches, SizeDict(height=336, width=336))
    assert ours == list(theirs)
    sizes = [(h, w) for h in (1, 2, 13, 100, 335, 336, 337, 500, 672, 1000, 1344, 2600, 5000)
             for w in (1, 7, 100, 300, 336, 601, 1008, 2000, 4000)]
    resolutions = torch.tensor(theirs)
    for h, w in sizes:
        assert best_fit(h, w, ours, to_max) == tuple(get_best_fit((h, w), resolutions, resize_to_max_canvas=to_max).tolist())


def test_tiles_equal_the_image_processor():
    from transformers import Llama4ImageProcessor

    for settings in ({}, {"resize_to_max_canvas": True}, {"max_patches": 3}):
        ip = Llama4ImageProcessor(size={"height": 56, "width": 56}, **{"max_patches": 6, **settings})
        s = Llama4Settings(tile_size=56, **{"max_patches": 6, **settings})
        for h, w in [(1, 1), (30, 100), (100, 30), (7, 700), (56, 56), (57, 112), (200, 300), (13, 2600), (2000, 10)]:
            out = ip(images=[torch.zeros(3, h, w, dtype=torch.uint8)], return_tensors="pt")
            assert tuple(out["aspect_ratios"][0].tolist()) == tile_grid(h, w, s), (settings, h, w)


def test_expansion_equals_prompt_split_image(built):
    processor = built.processor
    for rows, columns in [(1, 1), (1, 2), (2, 1), (2, 3), (4, 4), (1, 6)]:
        pieces = image_pieces(rows, columns, 7)
        text = "".join(p.token * p.count if isinstance(p, Run) else p for p in pieces)
        assert text == processor._prompt_split_image((rows, columns), 7)
        assert sum(p.count for p in pieces if isinstance(p, Run)) == 7 * (rows * columns + (rows * columns > 1))


def test_tile_runs_are_separate_runs_of_one_span(built):
    """A tiled image is one media span whose ``runs`` are its tiles' ``<|patch|>`` runs (the separators and
    ``<|image|>`` between them are text inside the span)."""
    ds = PackedDataset(built.out)
    patch = built.processor.tokenizer.convert_tokens_to_ids("<|patch|>")
    tiled = [(ds[i], m) for i in range(len(ds)) for m in ds[i]["media"] if m["tokens"] > PER_TILE]
    assert tiled
    for row, m in tiled:
        ids = np.asarray(row["input_ids"][m["start"] : m["start"] + m["length"]])
        assert [n for _, n in m["runs"]] == [PER_TILE] * (m["tokens"] // PER_TILE)
        assert int((ids == patch).sum()) == m["tokens"] and ids[0] == ids[-1] == patch


def _packed_forward(model, ds, processor, rows, attention, **collator):
    batch = PackedCollator(attention=attention, pad_to_multiple_of=64, processor=processor, family=ds.family,
                           model_config=model.config, **collator)([ds[i] for i in rows])
    with torch.no_grad():
        return model(**model_inputs(batch)).logits, batch


def _alone(model, ds, processor, records, rows):
    by_id = {r["id"]: r for r in records}
    out = {}
    with torch.no_grad():
        for r, i in enumerate(rows):
            for a, b, rid in segments(ds[i]):
                enc = hf_inputs(processor, by_id[rid], ds.out.parent)
                enc.pop("attention_mask", None)
                out[(r, a, b)] = model(**enc, use_cache=False).logits[0]
    return out


def _worst(logits, reference):
    return max(float((logits[r, a:b] - ref).abs().max() / ref.abs().max()) for (r, a, b), ref in reference.items())


@dataclass(frozen=True)
class Reference:
    """Packed rows of the build, the sdpa model, and each of their segments' logits run alone through it."""

    ds: PackedDataset
    rows: list[int]
    model: Any
    logits: dict[tuple[int, int, int], torch.Tensor]  # (row in the batch, start, end) -> the record's logits alone


@pytest.fixture(scope="module")
def small_rows(built):
    """The shortest packed row (a tiled image's record then another, crossing several chunks) and its records alone
    through the sdpa model."""
    ds = PackedDataset(built.out)
    rows = sorted(range(len(ds)), key=lambda i: ds[i]["n_tokens"])[:1]
    row = ds[rows[0]]
    assert len(row["cu_seqlens"]) > 2 and row["n_tokens"] > 3 * CHUNK and any(m["tokens"] > PER_TILE for m in row["media"])
    model = built.model("sdpa")
    return Reference(ds, rows, model, _alone(model, ds, built.processor, built.records, rows))


@pytest.mark.slow
def test_one_mask_for_every_layer_would_leak_across_chunks(built, small_rows):
    """The control: the generic single mask (causal within segments) given to every layer differs from the record
    alone -- the chunked layers would attend across chunks -- while the per-layer-type masks equal it."""
    ds, rows, model, reference = small_rows.ds, small_rows.rows, small_rows.model, small_rows.logits
    logits, batch = _packed_forward(model, ds, built.processor, rows, "sdpa")
    assert set(batch["attention_mask"]) == {"chunked_attention", "full_attention"} and _worst(logits, reference) <= 1e-4
    single = dict(batch, attention_mask=batch["attention_mask"]["full_attention"])
    with torch.no_grad():
        leaked = model(**model_inputs(single)).logits
    assert _worst(leaked, reference) > 1e-2


@pytest.mark.slow
def test_flex_block_masks_per_layer_type(built, small_rows):
    """FlexAttention (forward on CPU): a BlockMask per layer type gives each segment its logits alone."""
    ds, rows, model, reference = small_rows.ds, small_rows.rows, small_rows.model, small_rows.logits
    flex = built.model("flex_attention")
    flex.load_state_dict(model.state_dict())
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        logits, batch = _packed_forward(flex, ds, built.processor, rows, "flex")
    from torch.nn.attention.flex_attention import BlockMask

    assert all(isinstance(m, BlockMask) for m in batch["attention_mask"].values())
    assert _worst(logits, reference) <= 1e-4


def test_chunk_segments_and_masks():
    """Chunks restart at every segment (a 5-token segment then a 7-token one, chunks of 3, padding to 14)."""
    from packer.modeling import masks

    segment, position = masks.segments_and_positions([[0, 5, 12]], 14)
    chunks = chunk_segments(segment, position, 3)
    assert chunks.tolist() == [[0, 0, 0, 1, 1, 2, 2, 2, 3, 3, 3, 4, 5, 5]]
    collate = PackedCollator(attention="eager", family={"name": "llama4", "modalities": ["image"], "settings": {}},
                             model_config=_config(CHUNK=3))
    row = {"input_ids": np.arange(12), "labels": np.arange(12), "cu_seqlens": np.asarray([0, 5, 12]), "n_tokens": 12,
           "media": []}
    out = collate([row])["attention_mask"]
    assert set(out) == {"chunked_attention", "full_attention"}
    chunked = out["chunked_attention"][0, 0] == 0
    assert chunked.tolist() == masks.allowed(chunk_segments(*masks.segments_and_positions([[0, 5, 12]], 12), 3))[0, 0].tolist()
    assert chunked[7, 5] and not chunked[8, 7] and not chunked[4, 2] and chunked[4, 3]  # segment 2 restarts at 5


def _config(CHUNK=CHUNK, layer_types=("chunked_attention", "full_attention"), tuning=True, floor=8192):
    from transformers import Llama4TextConfig

    return Llama4TextConfig(num_hidden_layers=len(layer_types), layer_types=list(layer_types), attention_chunk_size=CHUNK,
                            no_rope_layers=[int(t == "chunked_attention") for t in layer_types],
                            attn_temperature_tuning=tuning, floor_scale=floor, vocab_size=32, hidden_size=16,
                            num_attention_heads=2, num_key_value_heads=1, head_dim=8)


def _rows(*lengths_per_row):
    out = []
    for lengths in lengths_per_row:
        n = sum(lengths)
        out.append({"input_ids": np.arange(n) % 30, "labels": np.arange(n) % 30, "cu_seqlens": np.cumsum([0, *lengths]),
                    "n_tokens": n, "media": []})
    return out


DESCRIBED = {"name": "llama4", "modalities": ["image"], "settings": {}}


def test_refusals():
    """Without the model's config, under a flattened form over the chunk size, and where the NoPE layers'
    temperature tuning would see row positions past floor_scale - 1 in a later segment: a ValueError saying why."""
    with pytest.raises(ValueError, match=r"pass PackedCollator\(model_config=model.config"):
        PackedCollator(family=DESCRIBED)(_rows([5, 5]))
    with pytest.raises(ValueError, match="attention='varlen' cannot isolate Llama 4's chunked-attention layers"):
        PackedCollator(attention="varlen", family=DESCRIBED, model_config=_config(CHUNK=8))(_rows([5, 6]))
    short = PackedCollator(attention="varlen", family=DESCRIBED, model_config=_config(CHUNK=16))(_rows([5, 6]))
    assert short["cu_seq_lens_q"].tolist() == [0, 5, 11] and "attention_mask" not in short  # chunks never apply
    tuned = _config(floor=16)
    with pytest.raises(ValueError, match=r"row 0 packs 2 segments into 16 tokens.*attn_temperature_tuning=False"):
        PackedCollator(family=DESCRIBED, model_config=tuned)(_rows([10, 6]))
    PackedCollator(family=DESCRIBED, model_config=tuned)(_rows([10, 5], [40]))  # last position 14 < 15; one segment: fine
    PackedCollator(family=DESCRIBED, model_config=_config(floor=16, tuning=False))(_rows([10, 30]))



def test_dummy_segment_left_out_of_the_temperature_check():
    """A dummy media segment (packer.loader.dummy) appended to a row is not one of its records: its logits are unused,
    so the NoPE layers' temperature check reads the real segments only. 15 real tokens pass at floor_scale 16 with 4
    dummy tokens after them (the last at row position 18), rows or flattened; 16 real tokens are refused as before."""
    from packer.loader.dummy import Dummy, MediaDummies

    dummies = MediaDummies({"image": Dummy("image", 4, {"pixel_values": torch.zeros(1, 3, 56, 56)})}, {"image": 7})
    tuned = _config(floor=16, CHUNK=32)  # varlen: the flattened batch, dummy included, within one chunk
    for attention in ("sdpa", "varlen"):
        batch = PackedCollator(attention=attention, family=DESCRIBED, model_config=tuned, dummy_media=dummies)(_rows([10, 5]))
        assert batch["input_ids"].shape[-1] == 19 and batch["media"][0]["dummy"]
    with pytest.raises(ValueError, match="attn_temperature_tuning"):
        PackedCollator(family=DESCRIBED, model_config=tuned, dummy_media=dummies)(_rows([10, 6]))

@pytest.mark.slow
def test_temperature_tuning_refusal_is_needed(built, small_rows):
    """With floor_scale below the rows' length the collator refuses; forced through anyway, the later segments'
    logits differ from theirs alone -- the refusal guards a real leak, not a formality."""
    import packer.families.llama4 as llama4

    processor, ds, rows = built.processor, small_rows.ds, small_rows.rows
    model = built.model("sdpa", floor_scale=8, attn_scale=2.0)
    with pytest.raises(ValueError, match="attn_temperature_tuning"):
        _packed_forward(model, ds, processor, rows, "sdpa")
    from unittest import mock

    records = built.records
    with mock.patch.object(llama4, "check_temperature_tuning", lambda cu, config: None):
        logits, _ = _packed_forward(model, ds, processor, rows, "sdpa")
    reference = _alone(model, ds, processor, records, rows)
    first = {k: v for k, v in reference.items() if k[1] == 0}
    later = {k: v for k, v in reference.items() if k[1] > 0}
    assert _worst(logits, first) <= 1e-4 < _worst(logits, later)  # the later segment fails the equivalence check


def test_ulysses_keeps_a_mask_per_layer_type():
    """Sequence parallelism (Ulysses) keeps every layer type's global mask, grown for its padding like the single one."""
    collate = PackedCollator(attention="eager", family=DESCRIBED, model_config=_config(CHUNK=4))
    batch = collate(_rows([5, 6]))
    parts = [shard_for_sequence_parallel(batch, r, 4) for r in range(4)]
    for p in parts:
        assert set(p["attention_mask"]) == {"chunked_attention", "full_attention"}
        for kind, mask in p["attention_mask"].items():
            assert mask.shape[-1] == 12 and torch.equal(mask[..., :11, :11], batch["attention_mask"][kind])
            assert mask[0, 0, 11, 11] == 0 and (mask[0, 0, 11, :11] < 0).all()  # the SP padding sees itself only


def test_flex_masks_equal_the_sdpa_masks():
    """Each layer type's BlockMask (flex) allows exactly what its sdpa mask allows, with the block layout FlexAttention's
    own ``create_block_mask`` finds for that rule (chunked: causal, same segment, same chunk of the segment)."""
    from torch.nn.attention.flex_attention import create_block_mask, create_mask

    from packer.modeling import masks

    rows = _rows([40, 100, 7], [200, 3])
    config = _config(CHUNK=32)
    flex = PackedCollator(attention="flex", family=DESCRIBED, model_config=config)(rows)["attention_mask"]
    sdpa = PackedCollator(attention="sdpa", family=DESCRIBED, model_config=config)(rows)["attention_mask"]
    segment, position = masks.segments_and_positions([r["cu_seqlens"] for r in rows], 203)
    for kind in ("full_attention", "chunked_attention"):
        block = flex[kind]
        dense = create_mask(block.mask_mod, 2, 1, 203, 203, device="cpu")
        assert torch.equal(dense, sdpa[kind])

        def rule(b, h, q, kv, kind=kind):
            same = (segment[b, q] == segment[b, kv]) & (q >= kv)
            return same & (position[b, q] // 32 == position[b, kv] // 32) if kind == "chunked_attention" else same

        ref = create_block_mask(rule, 2, None, 203, 203, device="cpu")
        assert torch.equal(block.to_dense(), ref.to_dense()) and torch.equal(block.full_kv_num_blocks, ref.full_kv_num_blocks)


def test_loader_names_a_file_the_processor_tiles_otherwise(built):
    """A collator given another processor setting than the build's (max_patches 2 instead of 6) raises naming the file."""
    from transformers import Llama4ImageProcessor

    from packer.loader import MediaMismatchError

    ds = PackedDataset(built.out)
    other = Llama4ImageProcessor(size={"height": 56, "width": 56}, max_patches=2)
    with pytest.raises(MediaMismatchError, match=r"img/\S+: the build gave this image \d+ placeholder positions but "
                                                 r"Llama4ImageProcessor .* produces \d+ features"):
        PackedCollator(image_processor=other, family=ds.family, model_config=_config())([ds[i] for i in range(len(ds))])


