"""Nothing to forget: the build decides the batch. Each step off the documented path that used to
train the wrong thing silently is refused here with the value, the expected value and the fix, or does the
right thing (``PackedCollator.for_build``, ``PackedTrainer``'s defaults, ``model_inputs``)."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("av")

import numpy as np  # noqa: E402
import torch  # noqa: E402
from family_assets import FAMILY_ASSETS  # noqa: E402
from family_harness import build_family  # noqa: E402
from media_fixtures import write_images  # noqa: E402

from packer.families import Family  # noqa: E402
from packer.loader import PackedCollator, PackedDataset, model_inputs  # noqa: E402

QWEN3VL = FAMILY_ASSETS["qwen3vl"]


def _records(root, image: str) -> list[dict]:
    def turn(k, media):
        return {"id": f"r{k}", "messages": [{"role": "user", "content": [*media, {"type": "text", "text": f"Q{k}?"}]},
                                            {"role": "assistant", "content": f"A{k}."}]}

    records = [turn(0, [{"type": "image", "image": image}]), turn(1, []), turn(2, [{"type": "image", "image": image}])]
    (root / "records.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    return records


@pytest.fixture(scope="module")
def qwen3vl(tmp_path_factory):
    root = tmp_path_factory.mktemp("for_build")
    files = write_images(root / "img")
    _records(root, str(files["plain_300x200.jpg"].relative_to(root)))
    processor = QWEN3VL.processor(root / "checkpoint")
    build_family("qwen3vl", root / "checkpoint", root / "records.jsonl", root / "out")
    ds = PackedDataset(root / "out")
    return ds, processor, QWEN3VL.model(processor, "sdpa")


def test_for_build_derives_family_rope_processor_and_attention(qwen3vl):
    ds, processor, model = qwen3vl
    collate = PackedCollator.for_build(ds, model)  # the build's --processor loaded: nothing else given
    assert collate.family.name == "qwen3vl" and collate.rope == "mrope" and collate.attention == "sdpa"
    assert type(collate.media_step.image_processor).__name__ == type(processor.image_processor).__name__
    batch = collate([ds[i] for i in range(len(ds))])
    assert {"pixel_values", "image_grid_thw", "mm_token_type_ids"} <= set(batch) and batch["position_ids"].shape[0] == 3
    mine = PackedCollator(family=ds.family, processor=processor)([ds[i] for i in range(len(ds))])
    for key in ("input_ids", "position_ids", "pixel_values", "mm_token_type_ids"):
        assert torch.equal(batch[key], mine[key]), key
    with torch.no_grad():
        model(**model_inputs(batch, model))


def test_a_media_batch_never_reaches_the_model_without_its_pixels(qwen3vl):
    ds, processor, model = qwen3vl
    rows = [ds[i] for i in range(len(ds))]
    batch = PackedCollator(family=ds.family)(rows)  # spans collated, no processor: masks and positions only
    with pytest.raises(ValueError, match=r"media span\(s\) \(image\) but the collator loads no media.*for_build"):
        model_inputs(batch)
    with pytest.raises(ValueError, match="the build holds image but the collator loads no media"):
        PackedCollator(family=ds.family).check_build(ds, model)


def test_a_relative_processor_is_recorded_absolute_and_for_build_finds_it_from_another_folder(qwen3vl, tmp_path,
                                                                                              monkeypatch):
    """``--processor checkpoint`` typed relative to the shell's folder is recorded as the folder it named (absolute,
    as the media root is): the same manifest from any folder, and ``for_build`` loads it from the trainer's."""
    ds, processor, model = qwen3vl
    root = ds.out.parent

    def build_from(cwd, name: str, out: str):
        monkeypatch.chdir(cwd)
        return build_family("qwen3vl", name, root / "records.jsonl", root / out)

    here = build_from(root, "checkpoint", "out_here")
    above = build_from(root.parent, f"{root.name}/checkpoint", "out_above")
    assert here["config"]["processor"] == above["config"]["processor"] == str(root / "checkpoint")
    assert here["files"]["packed"] == above["files"]["packed"]
    monkeypatch.chdir(tmp_path)  # the trainer's folder: neither relative spelling names the checkpoint here
    built = PackedDataset(root / "out_here")
    collate = PackedCollator.for_build(built, model)
    assert type(collate.media_step.image_processor).__name__ == type(processor.image_processor).__name__
    batch = collate([built[i] for i in range(len(built))])
    assert "pixel_values" in batch



def test_a_relative_tokenizer_is_recorded_absolute_and_for_build_works_from_another_folder(qwen3vl, tmp_path,
                                                                                          monkeypatch):
    """``--tokenizer checkpoint`` typed relative to the shell's folder is recorded as the folder it named (absolute,
    as ``--processor`` and the media root are): builds from two folders write the same manifest (but its time and
    execution), and ``for_build`` and the build's tokenizer load from a third folder."""
    ds, processor, model = qwen3vl
    root = ds.out.parent
    checkpoint = str(root / "checkpoint")

    def build_from(cwd, tokenizer: str):
        monkeypatch.chdir(cwd)
        build_family("qwen3vl", checkpoint, root / "records.jsonl", root / "out_tok", tokenizer=tokenizer, overwrite=True)
        manifest = json.loads((root / "out_tok" / "manifest.json").read_text())
        return json.dumps({k: v for k, v in manifest.items() if k not in ("created_at", "execution")}, sort_keys=True)

    here = build_from(root, "checkpoint")
    above = build_from(root.parent, f"{root.name}/checkpoint")
    assert here == above
    manifest = json.loads(here)
    assert manifest["config"]["tokenizer"] == manifest["tokenizer"]["name"] == checkpoint
    monkeypatch.chdir(tmp_path)  # the trainer's folder: neither relative spelling names the checkpoint here
    built = PackedDataset(root / "out_tok")
    assert built.tokenizer()("Q0?")["input_ids"] == processor.tokenizer("Q0?")["input_ids"]
    batch = PackedCollator.for_build(built, model)([built[i] for i in range(len(built))])
    assert "pixel_values" in batch

def test_a_family_processor_without_the_family_or_with_another_rope_is_refused(qwen3vl):
    ds, processor, _ = qwen3vl
    with pytest.raises(ValueError, match="processor Qwen3VLProcessor is family qwen3vl / qwen35's, but the collator has "
                                         "no family.*for_build"):
        PackedCollator(rope="mrope", processor=processor)  # the old README snippet
    with pytest.raises(ValueError, match="rope='default' contradicts family qwen3vl.*leave rope out"):
        PackedCollator(rope="default", family=ds.family, processor=processor)
    llama = Family.from_record({"name": "llama4", "modalities": ["image"], "settings": {}})
    with pytest.raises(ValueError, match="the collator's family is 'llama4' but the build's is 'qwen3vl'"):
        from packer.loader.derive import check_collator

        collate = PackedCollator(processor=None)
        collate.family = llama
        check_collator(collate, ds)


def test_a_model_of_another_family_is_refused(qwen3vl, tmp_path):
    ds, _, _ = qwen3vl
    from assets_gemma3 import ASSETS as GEMMA3

    gemma = GEMMA3.model(GEMMA3.processor(tmp_path / "gemma3"), "sdpa")
    with pytest.raises(ValueError, match=r"Gemma3ForConditionalGeneration \(gemma3\) is family gemma3's model, but the "
                                         r"build was made for family qwen3vl.*--family gemma3"):
        PackedCollator.for_build(ds, gemma)


def test_packed_trainer_defaults_to_the_builds_collator_and_refuses_one_without_media(qwen3vl, tmp_path):
    from transformers import TrainingArguments

    from packer.loader import PackedTrainer

    ds, processor, model = qwen3vl
    args = TrainingArguments(output_dir=str(tmp_path / "t"), per_device_train_batch_size=1, max_steps=1, report_to=[],
                             use_cpu=True)
    trainer = PackedTrainer(model=model, args=args, train_dataset=ds)
    batch = trainer.data_collator([ds[0]])
    assert trainer.data_collator.family.name == "qwen3vl" and "pixel_values" in batch
    with pytest.raises(ValueError, match="the build holds image but the collator loads no media"):
        PackedTrainer(model=model, args=args, train_dataset=ds, data_collator=PackedCollator(family=ds.family))


def test_dummy_media_are_on_by_default_under_torch_distributed(qwen3vl, monkeypatch):
    ds, processor, model = qwen3vl
    monkeypatch.setattr(torch.distributed, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.distributed, "get_world_size", lambda group=None: 2)
    assert PackedCollator.for_build(ds, model).dummy_media is not None  # a rank without an image still runs the tower
    assert PackedCollator.for_build(ds, model, dummy_media=False).dummy_media is None
    with pytest.raises(ValueError, match="torch.distributed runs 2 ranks.*model_config=model.config"):
        PackedCollator(family=ds.family, processor=processor)  # the plain collator: asks for the model's config
    text = {"input_ids": np.arange(10, 15), "labels": np.arange(10, 15), "cu_seqlens": np.array([0, 5]), "n_tokens": 5,
            "media": [], "segment_trained": [4]}  # a rank's row without media
    batch = PackedCollator.for_build(ds, model)([text])
    assert {m["kind"] for m in batch["media"]} == {"image", "video"} and all(m["dummy"] for m in batch["media"])


def test_model_inputs_reads_the_form_of_a_mask_per_layer_type(tmp_path):
    """A Gemma 3 sdpa batch (a bool mask per layer type) was taken for flex and refused."""
    from assets_gemma3 import ASSETS as GEMMA3

    from packer.loader.checks import attention_form

    processor = GEMMA3.processor(tmp_path / "gemma3")
    masks = {"full_attention": torch.ones(1, 1, 4, 4, dtype=torch.bool), "sliding_attention": torch.ones(1, 1, 4, 4, dtype=torch.bool)}
    batch = {"input_ids": torch.zeros(1, 4, dtype=torch.long), "attention_mask": masks, "media": []}
    assert attention_form(batch) == "sdpa"
    assert model_inputs(batch, GEMMA3.model(processor, "sdpa"))["attention_mask"] is masks
    with pytest.raises(ValueError, match="attention='sdpa' gives a bool mask, and the eager implementation adds"):
        model_inputs(batch, GEMMA3.model(processor, "eager"))


def _text_model(vocab: int):
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(vocab_size=vocab, hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                      num_key_value_heads=1, max_position_embeddings=4096)
    cfg._attn_implementation = "sdpa"
    return LlamaForCausalLM(cfg).eval()


def test_a_batch_the_model_does_not_fit_is_refused_naming_the_cause(qwen3vl):
    """A text model on a Qwen3-VL build trained on the placeholder ids with no pixel; a Qwen3-VL batch reaching a
    text model, a Qwen2-VL model, a model of another image_token_id or a smaller vocabulary failed deep inside it
    ("too many values to unpack", a view's shape, "tokens: 0, features: N", IndexError). Each is refused first."""
    import copy

    from mm_models import qwen2vl_model

    ds, processor, model = qwen3vl
    rows = [ds[i] for i in range(len(ds))]
    vocab = model.get_input_embeddings().num_embeddings
    text = _text_model(vocab)
    plain = PackedCollator(attention="sdpa")(rows)  # no family, no processor: spans and 1-D positions
    with pytest.raises(ValueError, match=r"the batch holds 2 image span\(s\) \([\d,]+ placeholder tokens\) but "
                                         r"LlamaForCausalLM \(llama\) has no media tower: it would train on the placeholder"):
        model_inputs(plain, text)
    with pytest.raises(ValueError, match=r"the build holds image but LlamaForCausalLM \(llama\) has no media tower.*"
                                         r"modalities = \[\]"):
        PackedCollator(attention="sdpa").check_build(ds, text)
    batch = PackedCollator.for_build(ds, model)(rows)
    with pytest.raises(ValueError, match=r"collated for family qwen3vl but LlamaForCausalLM \(llama\) is a model of no "
                                         r"media family.*load a qwen3vl model \(qwen3_vl, qwen3_vl_moe\)"):
        model_inputs(batch, text)
    ids = ds.placeholder_ids
    qwen2 = qwen2vl_model(ids, vocab, "sdpa")
    with pytest.raises(ValueError, match=r"collated for family qwen3vl but Qwen2VLForConditionalGeneration \(qwen2_vl\) "
                                         r"is family generic's model"):
        model_inputs(batch, qwen2)
    other = copy.deepcopy(model)
    other.config.image_token_id = ids["<|image_pad|>"] + 1
    with pytest.raises(ValueError, match=rf"the batch's image placeholders are token id {ids['<|image_pad|>']} but "
                                         rf"Qwen3VLForConditionalGeneration \(qwen3_vl\) looks for its image features at "
                                         rf"config.image_token_id {ids['<|image_pad|>'] + 1}"):
        model_inputs(batch, other)
    small = _text_model(1000)
    top = int(plain["input_ids"].max())
    with pytest.raises(ValueError, match=rf"token id {top:,} but LlamaForCausalLM \(llama\)'s input embeddings have 1,000 "
                                         rf"rows.*resize_token_embeddings"):
        model_inputs(plain, small)
    row = {"input_ids": np.arange(10, 15), "labels": np.arange(10, 15), "cu_seqlens": np.array([0, 5]), "n_tokens": 5,
           "media": [], "segment_trained": [4]}  # a text row, 3-D positions asked by hand
    mrope = PackedCollator(attention="sdpa", rope="mrope")([row])
    with pytest.raises(ValueError, match=r"3-D mRoPE positions \(3, 1, 5\) but LlamaForCausalLM \(llama\) takes one "
                                         r"position per token"):
        model_inputs(mrope, text)
    model_inputs(batch, model)  # the build's own model: nothing refused
