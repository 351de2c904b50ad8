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

from packer.families import MODEL_TYPES
from packer.loader import PackedCollator, model_inputs, packed_loss
from packer.loader.dummy import MediaDummies, media_dummies

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


class _Tokenizer:
    """The tokenizer the later families' model builders (tests/assets_*.py) read: a vocabulary of 128, and an id
    from 90 up for each special token, given in the order asked (the same token, the same id)."""

    bos_token_id, pad_token_id = 1, 0
    eoi_token = "<end_of_image>"  # Gemma 3's tokenizer names its image tokens

    def __init__(self):
        self.ids: dict[str, int] = {}

    def convert_tokens_to_ids(self, token):
        return self.ids.setdefault(token, 90 + len(self.ids))

    def __len__(self):
        return 128

    @property
    def image_token_id(self):
        return self.convert_tokens_to_ids("<image_soft_token>")

    @property
    def boi_token_id(self):
        return self.convert_tokens_to_ids("<start_of_image>")


class _Processor:
    vision_aspect_ratio, vision_feature_select_strategy = "anyres_max_4", "full"  # LLaVA-OneVision's (assets')

    def __init__(self):
        self.tokenizer = _Tokenizer()

    @property
    def video_token_id(self):  # Gemma 4's processor adds <|video|> itself
        return self.tokenizer.convert_tokens_to_ids("<|video|>")


def _family(builder, family: str, kinds: tuple[str, ...], **settings):
    """A later family: its tests' tiny model (tests/assets_*.py) over the stub tokenizer, and the collator arguments
    its tests give (``family=``: Gemma's masks per layer type, Llama 4's chunked masks, Qwen3-Omni's positions;
    ``model_config=``). The placeholders: the family's run tokens."""

    def make(attention):
        from packer.families import FAMILIES as PACKER_FAMILIES

        processor = _Processor()
        model = builder(processor, attention)
        cls = PACKER_FAMILIES[family]
        fam = cls(kinds, cls.settings_class(**settings))
        run_ids = {k: processor.tokenizer.convert_tokens_to_ids(t) for k, t in fam.run_tokens().items() if k in kinds}
        return model, run_ids, {"family": {**fam.describe(), "run_ids": run_ids}, "model_config": model.config}

    return make


def _plain(make, placeholders, rope):
    def build(attention):
        model = make(attention)
        model.config._attn_implementation = attention
        return model, placeholders, {"rope": rope}

    return build


CASES = {  # attention -> (model, placeholders, PackedCollator arguments)
    "qwen2_vl": _plain(lambda a: qwen2vl_model(IDS, VOCAB, a), {"image": 90, "video": 95}, "mrope"),
    "qwen2_5_vl": _plain(lambda a: qwen2vl_model(IDS, VOCAB, a, version="2.5"), {"image": 90, "video": 95}, "mrope"),
    "llava": _plain(lambda a: llava_model(IDS, VOCAB, a), {"image": 93}, "default"),
    "llava_next": _plain(lambda a: llava_next_model(IDS, VOCAB, a), {"image": 93}, "default"),
    "qwen2_audio": _plain(lambda a: qwen2audio_model(IDS, VOCAB, a), {"audio": 94}, "default"),
    "qwen2_5_omni_thinker": _plain(lambda a: qwen25omni_model(IDS, VOCAB, a), {"image": 90, "video": 95, "audio": 94},
                                   "mrope"),
}


def _declared() -> dict[str, tuple]:
    """Every registered family's case, by its first model type, from its declared test assets (tests/assets_*.py):
    ``dummy="plain"`` (Qwen3-VL, Qwen3.5) its tiny model with the plain mRoPE collator over the stub ids, else its
    tests' model and its collator arguments (``family=``, ``model_config=``); the later ones with the flag whether
    eager runs too."""
    from family_assets import FAMILY_ASSETS

    from packer.families import FAMILIES as PACKER_FAMILIES

    cases = {}
    for name, assets in FAMILY_ASSETS.items():
        model_type = PACKER_FAMILIES[name].model_types[0]
        if assets.dummy == "plain":
            cases[model_type] = (_plain(lambda a, make=assets.model: make(_Ids, "sdpa"), {"image": 90, "video": 95},
                                        assets.rope), None)
        else:
            kinds = tuple(k for k in ("image", "video", "audio") if k in assets.kinds)
            cases[model_type] = (_family(assets.model, name, kinds, **assets.dummy_settings), assets.dummy_eager)
    return cases


CASES.update({t: case for t, (case, _) in _declared().items()})


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


# Where a tower's parameters live (the projector and the newline embeddings with it)
TOWER_PARTS = ("visual", "vision_tower", "vision_model", "audio_tower", "projector", "image_newline", "embed_vision",
               "embed_audio")
LATER = tuple(t for t, (_, eager) in _declared().items() if eager is not None)
# eager for the later families only where the mask form matters: Llama 4 and Gemma 4 take one mask per layer type
# (chunked / sliding window, Gemma 4's image blocks both ways), additive under eager; the others' eager path is
# their text model's, already run for the 2024 families.
EAGER = tuple(t for t, (_, eager) in _declared().items() if eager)
# MoE layers that gather each expert's tokens in routing order (Qwen3-Omni: by top-k rank, then token): a dummy token
# routed unlike the padding it replaces reorders an expert's tokens, so that expert's weight gradient sums the same
# terms in another order (the last bits: 5e-8 relative here). Every other gradient exactly equal.
ROUTED = {"qwen3_omni_moe_thinker": ".mlp.experts."}


def _params():
    for attention in ("sdpa", "eager"):
        for f in CASES:
            if attention == "eager" and f in LATER and f not in EAGER:
                continue
            yield pytest.param(f, attention, marks=[] if f == "qwen2_vl" else pytest.mark.slow, id=f"{attention}-{f}")


@pytest.mark.parametrize("family, attention", list(_params()))
def test_dummy_runs_every_tower_and_changes_nothing(family, attention):
    model, placeholders, collator = CASES[family](attention)
    model.train()
    dummies = media_dummies(model, kinds=placeholders, placeholders=placeholders)
    guarded = {k for d in dummies.dummies.values() for k in (d.kind, *d.covers)}
    assert guarded == set(placeholders) and family in MODEL_TYPES
    plain = PackedCollator(attention=attention, pad_to_multiple_of=8, **collator)(text_rows())
    padded = PackedCollator(attention=attention, pad_to_multiple_of=8, dummy_media=dummies, **collator)(text_rows())
    loss, ref = grads(model, plain)
    loss_d, got = grads(model, padded)
    assert loss_d == loss
    towers = set(got) - set(ref)
    assert towers and all(any(t in n for t in TOWER_PARTS) for n in towers), sorted(set(towers))
    assert all(not got[n].any() for n in towers)  # exactly zero: the dummy contributes nothing
    for name, g in ref.items():
        if ROUTED.get(family, "\0") in name:
            assert torch.allclose(got[name], g, rtol=0, atol=1e-6 * float(g.abs().max())), name
        else:
            assert torch.equal(got[name], g), name
    trainable_unused = [n for n, p in model.named_parameters() if p.requires_grad and p.grad is None]
    assert all(n.startswith(UNUSED_WITH_REAL_MEDIA) for n in trainable_unused), trainable_unused
    kinds = sorted(m["kind"] for m in padded["media"])
    assert kinds == sorted(dummies.kinds) and all(m["dummy"] for m in padded["media"])
    assert (padded["loss_weights"] * (padded["input_ids"] >= 90)).sum() == 0


def test_dummy_only_for_the_missing_kinds_and_after_the_real_tokens():
    dummies = media_dummies(CASES["qwen2_vl"]("sdpa")[0].config, kinds=["image", "video"], placeholders={"image": 90, "video": 95})
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

    assert media_dummies(Config()) is None  # a model no family declares: nothing to guard
    with pytest.raises(ValueError, match="no placeholder token id for video"):
        MediaDummies({"video": object()}, {"image": 1})
    model = CASES["qwen2_vl"]("sdpa")[0]
    with pytest.raises(ValueError, match="give the dataset"):
        media_dummies(model)
    assert media_dummies(model, kinds=["audio"], placeholders={}) is None  # Qwen2-VL encodes no audio
    del model.model.visual
    with pytest.raises(ValueError, match="has no model.visual"):
        media_dummies(model, kinds=["image"], placeholders={"image": 90})


def test_internvl_one_dummy_for_images_and_videos():
    """InternVL's tower takes image tiles and video frames in ONE ``pixel_values`` (one call): one dummy (a tile of
    zeros, 4 ``<IMG_CONTEXT>`` here) stands for both kinds, and a batch holding a real image or a real video needs
    none (a video dummy beside a real image would add a second tower call's worth of tiles to the same tensor)."""
    model, placeholders, _ = CASES["internvl"]("sdpa")
    dummies = media_dummies(model, kinds=["image", "video"], placeholders=placeholders)
    assert dummies.kinds == ("image",) and dummies.dummies["image"].covers == ("image", "video")
    for kind in ("image", "video"):
        rows = text_rows()
        rows[0]["media"] = [{"segment": 0, "kind": kind, "start": 2, "length": 4, "tokens": 4, "ref": "x"}]
        assert dummies.add(rows) == (rows, {})
    grown, inputs = dummies.add(text_rows())
    assert list(inputs) == ["pixel_values"] and inputs["pixel_values"].shape == (1, 3, 56, 56)
    assert grown[1]["input_ids"][-4:].tolist() == [placeholders["image"]] * 4 and grown[1]["dummy_segments"] == 1
    only_videos = media_dummies(model, kinds=["video"], placeholders=placeholders)  # a build of videos alone
    assert only_videos.kinds == ("video",) and only_videos.dummies["video"].covers == ("video",)


def test_gemma4_without_an_audio_tower():
    """Gemma 4's smaller models have no audio tower (``audio_config`` None): no audio dummy, and the registry does
    not ask the model for one; with it, one dummy per kind (one soft token each: 3 x 3 patches pooled, one mel frame)."""
    from assets_gemma4 import gemma4_config
    from transformers import Gemma4ForConditionalGeneration

    from packer.loader.dummy import towers

    placeholders = {"image": 1, "video": 2, "audio": 3}
    config = gemma4_config(_Processor())
    full = media_dummies(config, kinds=placeholders, placeholders=placeholders)
    assert full.kinds == ("image", "video", "audio") and all(d.length == 1 for d in full.dummies.values())
    assert full.dummies["audio"].inputs["input_features"].shape == (1, 1, 16)
    config.audio_config = None
    model = Gemma4ForConditionalGeneration(config)
    assert model.model.audio_tower is None and [t.attribute for t in towers(model)] == ["model.vision_tower"]
    assert media_dummies(model, kinds=placeholders, placeholders=placeholders).kinds == ("image", "video")
    assert media_dummies(model, kinds=["audio"], placeholders=placeholders) is None
