"""Dummy media (packer.loader.dummy): a batch without an image (audio, video) still runs every
tower of the model, on a minimal dummy item in a segment of its own, and changes nothing else:
the loss and every gradient equal the batch without it, the towers' gradients are exactly zero
and present (what DDP needs), for every family of the registry. Multi-process DDP / FSDP2:
tests/test_distributed.py."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from mm_models import llava_model, llava_next_model, qwen2audio_model, qwen2vl_model, qwen25omni_model

from packer.loader import PackedCollator, model_inputs, packed_loss
from packer.loader.dummy import FAMILIES, MediaDummies, Tower, media_dummies, register

IDS = {"<|image_pad|>": 90, "<|vision_start|>": 91, "<|vision_end|>": 92, "<image>": 93, "<|AUDIO|>": 94, "<|video_pad|>": 95}
VOCAB = 100
class _Ids:  # what tests/family_assets' model builders read of a processor: its tokenizer's ids and size
    class tokenizer:  # noqa: N801
        @staticmethod
        def convert_tokens_to_ids(token):
            return IDS[token]

        def __len__(self):
            return VOCAB

    tokenizer = tokenizer()


def _qwen3(name):
    from family_assets import qwen3vl_model, qwen35_model

    return (qwen3vl_model if name == "qwen3_vl" else qwen35_model)(_Ids, "sdpa")


CASES = {  # model, placeholders, rope
    "qwen2_vl": (lambda: qwen2vl_model(IDS, VOCAB, "sdpa"), {"image": 90, "video": 95}, "mrope"),
    "qwen2_5_vl": (lambda: qwen2vl_model(IDS, VOCAB, "sdpa", version="2.5"), {"image": 90, "video": 95}, "mrope"),
    "llava": (lambda: llava_model(IDS, VOCAB, "sdpa"), {"image": 93}, "default"),
    "llava_next": (lambda: llava_next_model(IDS, VOCAB, "sdpa"), {"image": 93}, "default"),
    "qwen2_audio": (lambda: qwen2audio_model(IDS, VOCAB, "sdpa"), {"audio": 94}, "default"),
    "qwen2_5_omni_thinker": (lambda: qwen25omni_model(IDS, VOCAB, "sdpa"), {"image": 90, "video": 95, "audio": 94}, "mrope"),
    "qwen3_vl": (lambda: _qwen3("qwen3_vl"), {"image": 90, "video": 95}, "mrope"),
    "qwen3_5": (lambda: _qwen3("qwen3_5"), {"image": 90, "video": 95}, "mrope"),
}


# Parameters a real item leaves without a gradient too: LLaVA's tower after vision_feature_layer -2, and
# the Omni thinker's audio begin / end embedding (used when generating only). DDP needs them frozen.
UNUSED_WITH_REAL_MEDIA = ("model.vision_tower.encoder.layers.1.", "model.vision_tower.post_layernorm.",
                          "model.audio_tower.audio_bos_eos_token.")


def text_rows(seed=0, lengths=([7, 5], [9])):
    rng = np.random.default_rng(seed)
    rows = []
    for lens in lengths:
        n = sum(lens)
        ids = rng.integers(1, 80, n)
        labels = ids.copy()
        cu = np.concatenate([[0], np.cumsum(lens)])
        labels[cu[:-1]] = -100
        rows.append({"input_ids": ids, "labels": labels, "cu_seqlens": cu, "n_tokens": n, "media": [],
                     "segment_trained": [int(x) - 1 for x in lens]})
    return rows


def grads(model, batch):
    model.zero_grad()
    loss = packed_loss(model(**model_inputs(batch)).logits, batch)
    loss.backward()
    return loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("family", [pytest.param(f, marks=[] if f == "qwen2_vl" else pytest.mark.slow) for f in CASES])
@pytest.mark.parametrize("attention", ["sdpa", "eager"])
def test_dummy_runs_every_tower_and_changes_nothing(family, attention):
    make, placeholders, rope = CASES[family]
    model = make()
    model.config._attn_implementation = attention
    model.train()
    dummies = media_dummies(model, kinds=placeholders, placeholders=placeholders)
    assert set(dummies.kinds) == set(placeholders) and family in FAMILIES
    plain = PackedCollator(attention=attention, rope=rope, pad_to_multiple_of=8)(text_rows())
    padded = PackedCollator(attention=attention, rope=rope, pad_to_multiple_of=8, dummy_media=dummies)(text_rows())
    loss, ref = grads(model, plain)
    loss_d, got = grads(model, padded)
    assert loss_d == loss
    towers = set(got) - set(ref)
    assert towers and all(any(t in n for t in ("visual", "vision_tower", "audio_tower", "projector", "image_newline"))
                          for n in towers)
    assert all(not got[n].any() for n in towers)  # exactly zero: the dummy contributes nothing
    for name, g in ref.items():
        assert torch.equal(got[name], g), name
    trainable_unused = [n for n, p in model.named_parameters() if p.requires_grad and p.grad is None]
    assert all(n.startswith(UNUSED_WITH_REAL_MEDIA) for n in trainable_unused), trainable_unused
    kinds = sorted(m["kind"] for m in padded["media"])
    assert kinds == sorted(placeholders) and all(m["dummy"] for m in padded["media"])
    assert (padded["loss_weights"] * (padded["input_ids"] >= 90)).sum() == 0


def test_dummy_only_for_the_missing_kinds_and_after_the_real_tokens():
    dummies = media_dummies(CASES["qwen2_vl"][0]().config, kinds=["image", "video"], placeholders={"image": 90, "video": 95})
    rows = text_rows(lengths=([7, 5], [3]))
    rows[0]["media"] = [{"segment": 0, "kind": "image", "start": 2, "length": 1, "tokens": 1, "ref": "a.png",
                         "llm_grid": [1, 1, 1]}]
    grown, inputs = dummies.add(rows)
    assert set(inputs) == {"pixel_values_videos", "video_grid_thw"} and inputs["video_grid_thw"].tolist() == [[1, 2, 2]]
    assert grown[0] is rows[0] and rows[1]["n_tokens"] == 3  # the shortest row grows; the rows given are untouched
    assert grown[1]["n_tokens"] == 4 and grown[1]["cu_seqlens"].tolist() == [0, 3, 4]
    assert grown[1]["input_ids"][-1] == 95 and grown[1]["labels"][-1] == -100 and grown[1]["segment_trained"] == [2, 0]
    assert dummies.add(grown) == (grown, {})  # nothing missing: nothing added
    # pad_to: the real rows must fit; the dummy may pass it by its positions
    batch = PackedCollator(pad_to=12, dummy_media=dummies)(text_rows(lengths=([7, 5], [6, 6])))
    assert batch["input_ids"].shape == (2, 14)
    with pytest.raises(ValueError, match="pad_to is 11"):
        PackedCollator(pad_to=11, dummy_media=dummies)(text_rows(lengths=([7, 5], [6, 6])))


def test_registry_and_errors():
    class Config:
        model_type = "a_new_family"

    with pytest.raises(ValueError, match="registered twice"):
        register("qwen2_vl", Tower("model.visual", ("image",), lambda c, k: None))
    assert media_dummies(Config()) is None  # a family the registry does not know: nothing to guard
    with pytest.raises(ValueError, match="no placeholder token id for video"):
        MediaDummies({"video": object()}, {"image": 1})
    model = CASES["qwen2_vl"][0]()
    with pytest.raises(ValueError, match="give the dataset"):
        media_dummies(model)
    assert media_dummies(model, kinds=["audio"], placeholders={}) is None  # Qwen2-VL encodes no audio
    del model.model.visual
    with pytest.raises(ValueError, match="has no model.visual"):
        media_dummies(model, kinds=["image"], placeholders={"image": 90})
