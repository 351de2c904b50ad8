"""The preference layouts' claim: per-response log-probabilities from packed ``pairs`` rows and from ``tree`` rows equal
each prompt + response run alone, and so do their gradients; a DPO step on packed rows gives TRL's.

- tiny random Llama (float64), rows of a real build (the sample tokenizer's ChatML template): every trained
  token's log-probability within 1e-5 of the response run alone, the gradient of a weighted sum of all
  responses' log-probabilities within 1e-4 (relative), sdpa and eager; FlexAttention's forward on the CPU
  (float32: its CPU kernel takes no float64), its backward only where CUDA is;
- tiny random Qwen2-VL (float64) with an image in the prompt: the same, the alone run being the HF
  processor on the record's text and image (positions from the model's own ``get_rope_index``), the vision
  tower's gradients included -- the tree encodes the prompt's image once, each alone run encodes it again;
- TRL's ``DPOTrainer`` (its collator and ``compute_loss``, the concatenated forward) on the same pairs: the
  loss and every gradient equal ``dpo_loss`` over packed pairs and tree rows (within float32's rounding:
  TRL's fused log-prob kernel computes in float32 whatever the model's dtype; measured 1.4e-7 on the loss,
  7e-7 relative on the gradients), on conversational pairs and on string pairs (TRL's standard format);
  and on conversational pairs with images in the prompt (a tiny Qwen3-VL, float32, TRL's vision collator:
  the same ids and trained tokens, 6e-7 on the loss, 3e-6 on the gradients).
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
from media_fixtures import write_images
from mm_models import QWEN_IMAGE, qwen2vl_model, qwen2vl_processor

from conftest import TOKENIZER
from packer.build import build
from packer.config import resolve
from packer.loader import PackedCollator, PackedDataset, SampleDataset, dpo_loss, model_inputs, packed_logps, token_logps

pytestmark = pytest.mark.slow  # real model forward and backward passes, both layouts, three attention forms

IGNORE = -100
SYSTEM = {"role": "system", "content": "Answer in one short sentence."}
TEXT_RECORDS = [
    {"id": "p0", "prompt": "What colour is the sky on a clear day?", "chosen": "It is blue.", "rejected": "Green, mostly."},
    {"id": "p1", "prompt": [SYSTEM, {"role": "user", "content": "Name a prime number below ten."},
                            {"role": "assistant", "content": "Seven."}, {"role": "user", "content": "Another one?"}],
     "chosen": [{"role": "assistant", "content": "Three."}], "rejected": [{"role": "assistant", "content": "Nine."}]},
    {"id": "m0", "prompt": "Count to three.", "responses": ["1 2 3", "one, two, three", "3 2 1"], "rewards": [1, 0.5, 0]},
    {"id": "k0", "prompt": "Say hi.", "completion": "Hi!", "label": True},
    {"id": "s0", "messages": [{"role": "user", "content": "An SFT record"}, {"role": "assistant", "content": "packed too"}]},
]


def build_layouts(records: list[dict], root: Path, **settings) -> dict[str, Path]:
    source = root / "records.jsonl"
    source.write_text("".join(json.dumps(r) + "\n" for r in records))
    out = {}
    for layout in ("pairs", "tree"):
        out[layout] = root / layout
        manifest = build(resolve(None, input=[str(source)], output=str(out[layout]), tokenizer=TOKENIZER, preference=layout,
                                 order="planner", max_bad_fraction=0.0, **settings), progress=False).to_dict()
        assert manifest["accounting"]["quarantined"] == 0 and manifest["accounting"]["dropped"] == 0
    return out


@pytest.fixture(scope="module")
def text_builds(tmp_path_factory):
    return build_layouts(TEXT_RECORDS, tmp_path_factory.mktemp("text"), max_length=160)


def llama(vocab: int, impl: str, dtype=torch.float64, seed: int = 0):
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(vocab_size=vocab, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, max_position_embeddings=512, initializer_range=0.3, tie_word_embeddings=False)
    cfg._attn_implementation = impl
    torch.manual_seed(seed)
    return LlamaForCausalLM(cfg).to(dtype).eval()


def alone_responses(out: Path) -> list[dict]:
    """Every response of the build's preference samples as its own conversation (prompt + response), unpacked."""
    ds = SampleDataset(out)
    found = []
    for i in range(len(ds)):
        row = ds[i]
        for k, role in enumerate(row.get("segment_role") or []):
            if role == "":  # an SFT sample or a document: no response
                continue
            a, b = int(row["cu_seqlens"][k]), int(row["cu_seqlens"][k + 1])
            found.append({"id": row["key"], "role": role, "ids": np.asarray(row["input_ids"][a:b]),
                          "labels": np.asarray(row["labels"][a:b]),
                          "media": sorted(({**m, "start": m["start"] - a} for m in row["media"] if m["segment"] == k),
                                          key=lambda m: m["start"])})
    return found


WEIGHTS = {"chosen": 1.0, "rejected": -0.7, "0": 0.3, "1": 0.9, "2": -1.1, "desirable": 0.5}


def per_token(logits: torch.Tensor, labels: np.ndarray) -> torch.Tensor:
    """Log-probability of each trained target of one sequence run alone (0 elsewhere)."""
    target = torch.as_tensor(labels[1:], dtype=torch.long, device=logits.device)
    lp = torch.log_softmax(logits[:-1], -1).gather(-1, target.clamp(min=0)[:, None])[:, 0]
    return lp * (target != IGNORE)


def check(model, batch: dict, logits: torch.Tensor, reference: dict, grads_ref: dict, *, token_tol: float,
          grad_tol: float | None) -> None:
    """Per trained token and per response against the alone runs; then the gradients of the weighted sum."""
    out = packed_logps(logits, batch)
    tokens = token_logps(logits, batch)
    assert len(out) == len(reference)
    total = 0
    for i, r in enumerate(batch["responses"]):
        want = reference[(r["id"], r["role"])]
        got = tokens[r["batch"], r["start"] : r["end"] - 1]  # a tree's branch: the tail of its run alone
        assert len(got) <= len(want) and not want[: len(want) - len(got)].any()  # what it shares is untrained
        assert (got.detach() - want[len(want) - len(got) :]).abs().max() <= token_tol, (r["id"], r["role"])
        n = int((want != 0).sum())
        assert abs(float(out.sum[i]) - float(want.sum())) <= token_tol * n
        assert int(out.tokens[i]) == n
        total = total + WEIGHTS[r["role"]] * out.sum[i]
    if grad_tol is None:
        return
    model.zero_grad()
    total.backward()
    compared = 0
    floor = 1e-6 * max(g.abs().max() for g in grads_ref.values())
    for name, p in model.named_parameters():
        if name not in grads_ref:
            assert p.grad is None or not p.grad.any(), name
            continue
        scale = grads_ref[name].abs().max().clamp(min=floor)
        assert (p.grad - grads_ref[name]).abs().max() / scale <= grad_tol, f"gradient of {name}"
        compared += 1
    assert compared


def reference_text(model, responses: list[dict]) -> tuple[dict, dict]:
    model.zero_grad()
    reference, total = {}, 0
    for r in responses:
        logits = model(torch.as_tensor(r["ids"], dtype=torch.long)[None]).logits[0]
        lp = per_token(logits, r["labels"])
        reference[(r["id"], r["role"])] = lp.detach()
        total = total + WEIGHTS[r["role"]] * lp.sum()
    total.backward()
    return reference, {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("layout", ["pairs", "tree"])
@pytest.mark.parametrize("impl", ["sdpa", "eager"])
def test_llama_packed_responses_equal_each_run_alone(text_builds, layout, impl):
    ds = PackedDataset(text_builds[layout])
    model = llama(len(ds.tokenizer()), impl)
    reference, grads = reference_text(model, alone_responses(text_builds[layout]))
    rows = [ds[i] for i in range(len(ds))]
    assert any(p >= 0 for r in rows for p in r["segment_parent"]) == (layout == "tree")
    batch = PackedCollator(attention=impl, pad_to_multiple_of=16, mask_dtype=torch.float64)(rows)
    logits = model(**model_inputs(batch)).logits
    check(model, batch, logits, reference, grads, token_tol=1e-5, grad_tol=1e-4)


@pytest.mark.parametrize("layout", ["pairs", "tree"])
def test_llama_flex_forward_on_cpu(text_builds, layout):
    """FlexAttention's CPU kernel takes float32 (no float64) and has no backward: forward, float32 tolerance."""
    ds = PackedDataset(text_builds[layout])
    vocab = len(ds.tokenizer())
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        reference, _ = {}, None
        sdpa = llama(vocab, "sdpa", torch.float32)
        for r in alone_responses(text_builds[layout]):
            reference[(r["id"], r["role"])] = per_token(sdpa(torch.as_tensor(r["ids"])[None].long()).logits[0], r["labels"])
        batch = PackedCollator(attention="flex", pad_to_multiple_of=128, device="cpu")([ds[i] for i in range(len(ds))])
        logits = llama(vocab, "flex_attention", torch.float32)(**model_inputs(batch)).logits
    check(None, batch, logits, reference, {}, token_tol=2e-4, grad_tol=None)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="FlexAttention backward needs CUDA")
@pytest.mark.parametrize("layout", ["pairs", "tree"])
def test_llama_flex_gradients_on_gpu(text_builds, layout):  # pragma: no cover - runs where a GPU is
    ds = PackedDataset(text_builds[layout])
    vocab = len(ds.tokenizer())
    ref_model = llama(vocab, "sdpa", torch.float32).cuda()
    reference, grads = {}, None
    total = 0
    for r in alone_responses(text_builds[layout]):
        lp = per_token(ref_model(torch.as_tensor(r["ids"], device="cuda")[None].long()).logits[0], r["labels"])
        reference[(r["id"], r["role"])] = lp.detach()
        total = total + WEIGHTS[r["role"]] * lp.sum()
    total.backward()
    grads = {n: p.grad.clone() for n, p in ref_model.named_parameters()}
    model = llama(vocab, "flex_attention", torch.float32).cuda()
    batch = PackedCollator(attention="flex", pad_to_multiple_of=128, device="cuda")([ds[i] for i in range(len(ds))])
    batch = {k: v.cuda() if isinstance(v, torch.Tensor) else v for k, v in batch.items()}
    check(model, batch, model(**model_inputs(batch)).logits, reference, grads, token_tol=2e-4, grad_tol=1e-3)


# ---------------------------------------------------------------- Qwen2-VL, an image in the prompt


@pytest.fixture(scope="module")
def vl_builds(tmp_path_factory):
    root = tmp_path_factory.mktemp("vl")
    images = write_images(root / "img")
    part = lambda name: {"type": "image", "image": str(images[name].relative_to(root))}  # noqa: E731
    records = [
        {"id": "v0", "prompt": [{"role": "user", "content": [part("plain_300x200.jpg"), {"type": "text", "text": "What is it?"}]}],
         "chosen": [{"role": "assistant", "content": "A gradient."}], "rejected": [{"role": "assistant", "content": "A cat."}]},
        {"id": "v1", "prompt": [{"role": "user", "content": [{"type": "text", "text": "Compare"}, part("exif6.jpg"),
                                                              part("photo.webp")]}],
         "responses": [[{"role": "assistant", "content": "The first is rotated."}], "They match.", "No idea."]},
        {"id": "v2", "prompt": "No image here.", "chosen": "Right.", "rejected": "Wrong."},
    ]
    return build_layouts(records, root, max_length=400, **QWEN_IMAGE)


def reference_vl(model, processor, tok, responses: list[dict]) -> tuple[dict, dict]:
    """Each prompt + response the plain HF way: its text with one placeholder per image, its own files through the
    processor, positions from the model."""
    from transformers.image_utils import load_image

    model.zero_grad()
    reference, total = {}, 0
    for r in responses:
        ids, collapsed, cursor = r["ids"], [], 0
        for s in r["media"]:
            collapsed += ids[cursor : s["start"]].tolist() + [int(ids[s["start"]])]
            cursor = s["start"] + s["length"]
        text = tok.decode(collapsed + ids[cursor:].tolist(), skip_special_tokens=False)
        images = [load_image(s["path"]) for s in r["media"]] or None
        enc = processor(text=[text], images=images, return_tensors="pt")
        assert enc["input_ids"][0].tolist() == ids.tolist()
        enc.pop("attention_mask", None)
        if "pixel_values" in enc:
            enc["pixel_values"] = enc["pixel_values"].double()
        lp = per_token(model(**enc, use_cache=False).logits[0], r["labels"])
        reference[(r["id"], r["role"])] = lp.detach()
        total = total + WEIGHTS[r["role"]] * lp.sum()
    total.backward()
    return reference, {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("layout", ["pairs", "tree"])
@pytest.mark.parametrize("impl", ["sdpa", "eager"])
def test_qwen2vl_image_in_the_prompt_packed_equals_each_run_alone(vl_builds, layout, impl):
    ds = PackedDataset(vl_builds[layout])
    tok = ds.tokenizer()
    model = qwen2vl_model(ds.placeholder_ids, len(tok) + 1, impl).double()
    processor = qwen2vl_processor(tok)
    responses = alone_responses(vl_builds[layout])
    for r in responses:  # the alone runs' spans carry the files' paths
        for m in r["media"]:
            m["path"] = str(Path(ds.media_root) / m["ref"])
    reference, grads = reference_vl(model, processor, tok, responses)
    assert any("visual" in n for n in grads)
    rows = [ds[i] for i in range(len(ds))]
    spans = sum(len(r["media"]) for r in rows)
    assert spans == (3 if layout == "tree" else 8)  # the tree holds each prompt's images once
    batch = PackedCollator(attention=impl, rope="mrope", pad_to_multiple_of=64, processor=processor,
                           mask_dtype=torch.float64)(rows)
    batch["pixel_values"] = batch["pixel_values"].double()
    logits = model(**model_inputs(batch)).logits
    check(model, batch, logits, reference, grads, token_tol=1e-5, grad_tol=1e-4)


# ---------------------------------------------------------------- TRL's DPOTrainer


DPO_PAIRS = [
    ([{"role": "user", "content": "What colour is the sky?"}], "It is blue.", "It is green, I believe."),
    ([SYSTEM, {"role": "user", "content": "Name a prime."}], "Seven.", "Nine."),
    ([{"role": "user", "content": "2 + 2?"}, {"role": "assistant", "content": "4."}, {"role": "user", "content": "And 3 + 3?"}],
     "6.", "It is 7."),
    ([{"role": "user", "content": "Say hello in French."}], "Bonjour.", "Hola."),
]


STRING_PAIRS = [  # TRL's standard (non-chat) format: no template, EOS appended, BPE merges at the boundary
    ("What colour is the sky?", " It is blue.", " It is green, I believe."),
    ("Q: Name a prime.\nA:", " Seven.", " Nine."),
    ("The frog likes to jump", "ing around.", "ed once."),  # the prompt's last word merges with each response
    ("<|im_start|>user\nSay hello in French.<|im_end|>\n<|im_start|>assistant\n", "Bonjour.", "Hola.<|endoftext|>"),
]


def dpo_data(kind: str) -> list[dict]:
    if kind == "string":
        return [{"prompt": p, "chosen": c, "rejected": r} for p, c, r in STRING_PAIRS]
    return [{"prompt": p, "chosen": [{"role": "assistant", "content": c}], "rejected": [{"role": "assistant", "content": r}]}
            for p, c, r in DPO_PAIRS]


@pytest.fixture(scope="module")
def dpo_builds(tmp_path_factory):
    out = {}
    for kind in ("conversational", "string"):
        records = [{"id": f"d{k}", **r} for k, r in enumerate(dpo_data(kind))]
        out[kind] = build_layouts(records, tmp_path_factory.mktemp(f"dpo-{kind}"), max_length=256)
    return out


@pytest.mark.parametrize("kind", ["conversational", "string"])
@pytest.mark.parametrize("layout", ["pairs", "tree"])
def test_dpo_step_on_packed_rows_equals_trls_dpo_trainer(dpo_builds, layout, kind, tmp_path):
    """Conversational records (messages, the chat template) and string records (TRL's standard format, no
    template: ``preference_strings = "standard"``, the default): the loss and every gradient are TRL's."""
    trl = pytest.importorskip("trl", reason="trl is in the test layer (requirements.lock); not installed here")
    from datasets import Dataset

    ds = PackedDataset(dpo_builds[kind][layout])
    assert ds.manifest.config["preference_strings"] == "standard"
    tok = ds.tokenizer()
    vocab = len(tok)
    policy, ref_model = llama(vocab, "sdpa"), llama(vocab, "sdpa", seed=1)
    data = Dataset.from_list(dpo_data(kind))
    args = trl.DPOConfig(output_dir=str(tmp_path / "trl"), per_device_train_batch_size=len(data), beta=0.1,
                         report_to=[], max_length=None, use_cpu=True, bf16=False, fp16=False, dataset_num_proc=None)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer = trl.DPOTrainer(model=policy, ref_model=ref_model, args=args, train_dataset=data, processing_class=tok)
    examples = [trainer.train_dataset[i] for i in range(len(data))]
    inputs = trainer.data_collator(examples)
    model = trainer.model
    model.zero_grad()
    trl_loss = trainer.compute_loss(model, inputs)
    trl_loss.backward()
    trl_grads = {n: p.grad.clone() for n, p in model.named_parameters()}

    # the same pairs, packed by packer: the policy on the rows, the reference model on the same rows
    rows = [ds[i] for i in range(len(ds))]
    batch = PackedCollator(attention="sdpa", pad_to_multiple_of=16)(rows)
    with torch.no_grad():
        reference = packed_logps(trainer.ref_model(**model_inputs(batch)).logits, batch)
    model.zero_grad()
    policy_logps = packed_logps(model(**model_inputs(batch)).logits, batch)
    assert len(policy_logps.pairs()[0]) == len(data)
    loss = dpo_loss(policy_logps, reference, beta=0.1)
    # TRL's fused log-prob kernel computes in float32 whatever the model's dtype: the bounds are float32's
    assert abs(float(loss) - float(trl_loss)) <= 1e-6
    loss.backward()
    for name, p in model.named_parameters():
        scale = trl_grads[name].abs().max().clamp(min=1e-12)
        assert (p.grad - trl_grads[name]).abs().max() / scale <= 1e-5, name


def test_dpo_step_on_image_pairs_equals_trls_dpo_trainer(tmp_path):
    """Conversational pairs with images in the prompt, a Qwen3-VL family build (its processor, its template):
    the ids and trained tokens are those TRL's vision collator makes, and the DPO loss and gradients are
    DPOTrainer's (float32 model: measured 6e-7 on the loss, 3e-6 relative on the gradients)."""
    trl = pytest.importorskip("trl", reason="trl is in the test layer (requirements.lock); not installed here")
    pytest.importorskip("torchvision")
    import copy

    from datasets import Dataset
    from family_assets import FAMILY_ASSETS, qwen3vl_model
    from family_harness import build_family
    from transformers.image_utils import load_image
    from trl.trainer.dpo_trainer import DataCollatorForVisionPreference

    images = write_images(tmp_path / "img")
    part = lambda name: {"type": "image", "image": str(images[name].relative_to(tmp_path))}  # noqa: E731
    answer = lambda text: [{"role": "assistant", "content": text}]  # noqa: E731
    records = [{"id": "q0", "prompt": [{"role": "user", "content": [part("exif6.jpg"), {"type": "text", "text": "What is it?"}]}],
                "chosen": answer("A gradient."), "rejected": answer("A cat, I think.")},
               {"id": "q1", "prompt": [{"role": "user", "content": [{"type": "text", "text": "Compare"}, part("photo.webp"),
                                                                    part("one_1x1.png")]}],
                "chosen": answer("Two images."), "rejected": answer("One.")}]
    source = tmp_path / "pref.jsonl"
    source.write_text("".join(json.dumps(r) + "\n" for r in records))
    processor = FAMILY_ASSETS["qwen3vl"].processor(tmp_path / "checkpoint")
    build_family("qwen3vl", tmp_path / "checkpoint", source, tmp_path / "out", preference="pairs")
    examples = [{"prompt": [{"role": "user", "content": [{"type": p["type"]} if p["type"] == "image" else p
                                                         for p in r["prompt"][0]["content"]]}],
                 "chosen": r["chosen"], "rejected": r["rejected"],
                 "images": [load_image(str(tmp_path / p["image"])) for p in r["prompt"][0]["content"] if p["type"] == "image"]}
                for r in records]

    samples = SampleDataset(tmp_path / "out")
    by_id = {row["key"]: row for row in (samples[i] for i in range(len(samples)))}
    trl_batch = DataCollatorForVisionPreference(processor)(copy.deepcopy(examples))  # it fills the messages in place
    real = trl_batch["attention_mask"].bool()
    for k, r in enumerate(records):
        row = by_id[r["id"]]
        for j in range(2):  # chosen, rejected: TRL's rows k and k + n
            b, a, e = k + j * len(records), int(row["cu_seqlens"][j]), int(row["cu_seqlens"][j + 1])
            assert trl_batch["input_ids"][b][real[b]].tolist() == np.asarray(row["input_ids"][a:e]).tolist()
            trained = (np.asarray(row["labels"][a:e]) != IGNORE).astype(int).tolist()
            assert trl_batch["completion_mask"][b][real[b]].tolist() == trained

    policy, ref_model = qwen3vl_model(processor, "sdpa"), qwen3vl_model(processor, "sdpa", seed=1)
    args = trl.DPOConfig(output_dir=str(tmp_path / "trl"), per_device_train_batch_size=len(records), beta=0.1, report_to=[],
                         max_length=None, use_cpu=True, bf16=False, fp16=False, dataset_num_proc=None,
                         remove_unused_columns=False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer = trl.DPOTrainer(model=policy, ref_model=ref_model, args=args, processing_class=processor,
                                 train_dataset=Dataset.from_list([{"prompt": "x", "chosen": "y", "rejected": "z",
                                                                   "images": []}]))
    model = trainer.model
    model.zero_grad()
    trl_loss = trainer.compute_loss(model, trainer.data_collator(copy.deepcopy(examples)))
    trl_loss.backward()
    trl_grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}

    ds = PackedDataset(tmp_path / "out")
    batch = PackedCollator(attention="sdpa", processor=processor, family=ds.family,
                           pad_to_multiple_of=16)([ds[i] for i in range(len(ds))])
    with torch.no_grad():
        reference = packed_logps(trainer.ref_model(**model_inputs(batch)).logits, batch)
    model.zero_grad()
    loss = dpo_loss(packed_logps(model(**model_inputs(batch)).logits, batch), reference, beta=0.1)
    assert abs(float(loss) - float(trl_loss)) <= 1e-5
    loss.backward()
    assert any("visual" in n for n in trl_grads)
    for name, grad in trl_grads.items():
        p = dict(model.named_parameters())[name]
        assert (p.grad - grad).abs().max() / grad.abs().max().clamp(min=1e-12) <= 1e-4, name


def test_string_kto_records_are_the_tokens_trls_kto_trainer_trains(tmp_path):
    """KTO's string records (TRL's standard format): each record's ids are KTOTrainer's prompt_ids + completion_ids,
    and exactly its completion_ids are trained (EOS appended, the completion from where the prompt's tokens stop)."""
    trl = pytest.importorskip("trl", reason="trl is in the test layer (requirements.lock); not installed here")
    from datasets import Dataset

    from packer.encode import Encoder, EncoderSpec
    from packer.ingest.reader import RawLine

    enc = Encoder(EncoderSpec.of(tokenizer=TOKENIZER, preference="pairs"))
    data = [{"prompt": "The frog likes to jump", "completion": "ing around.", "label": True},  # BPE merges across
            {"prompt": "Q: 2 + 2?\nA:", "completion": " 5", "label": False},
            {"prompt": "Say hi.", "completion": " Hi!<|endoftext|>", "label": True}]  # already ends with EOS
    args = trl.KTOConfig(output_dir=str(tmp_path / "kto"), per_device_train_batch_size=len(data), report_to=[],
                         max_length=None, use_cpu=True, bf16=False, fp16=False, dataset_num_proc=None)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer = trl.KTOTrainer(model=llama(len(enc.tok), "sdpa"), ref_model=llama(len(enc.tok), "sdpa", seed=1),
                                 args=args, train_dataset=Dataset.from_list(data), processing_class=enc.tok)
    for i, record in enumerate(data):
        want = trainer.train_dataset[i]
        sample = enc.encode_line(RawLine(i + 1, json.dumps(record).encode()), "t.jsonl", Path("."))
        assert sample.input_ids.tolist() == want["prompt_ids"] + want["completion_ids"]
        assert (sample.labels != IGNORE).astype(int).tolist() == [0] * len(want["prompt_ids"]) + [1] * len(want["completion_ids"])


MIXED_RECORDS = TEXT_RECORDS + [{"text": "A plain document, trained whole."},
                                {"id": "one", "prompt": "2+2?", "chosen": "4", "rejected": "5"},  # 1-token answers
                                {"id": "k1", "prompt": "Say no.", "completion": "No", "label": False}]


@pytest.fixture(scope="module")
def mixed_builds(tmp_path_factory):
    return build_layouts(MIXED_RECORDS, tmp_path_factory.mktemp("mixed"), max_length=160)


@pytest.mark.parametrize("layout", ["pairs", "tree"])
@pytest.mark.parametrize("impl", ["sdpa", "eager"])
def test_the_documented_recipe_on_batches_mixing_sft_documents_kto_and_one_token_responses(mixed_builds, layout, impl):
    """docs/preference.md's loop, as written (DataLoader, PackedCollator, model_inputs(batch, model), the policy and the
    no-grad reference, dpo_loss, backward), over every row of a build mixing pairs, a KTO completion, a multi-response
    record, 1-token responses, SFT records and a document, from PackedDataset and SampleDataset in numpy and torch
    format, a row a batch and all rows in one: each response's log-probability is the same in every one of them.
    (Reported: a RuntimeError on float 'indices' on such batches; not reproduced here.)"""
    from torch.utils.data import DataLoader

    out = mixed_builds[layout]
    model = llama(len(PackedDataset(out).tokenizer()), impl)
    ref_model = llama(len(PackedDataset(out).tokenizer()), impl, seed=1)
    found: dict[tuple[str, str], list[float]] = {}
    for kind, fmt, batch_size in [(PackedDataset, "numpy", 1), (PackedDataset, "torch", 64), (SampleDataset, "numpy", 64),
                                  (SampleDataset, "torch", 1)]:
        ds = kind(out, format=fmt)
        collate = PackedCollator(attention=impl)
        for batch in DataLoader(ds, batch_size=batch_size, collate_fn=collate):
            assert batch["input_ids"].dtype == torch.long
            policy = packed_logps(model(**model_inputs(batch, model)).logits, batch)
            with torch.no_grad():
                reference = packed_logps(ref_model(**model_inputs(batch, ref_model)).logits, batch)
            if len(policy.pairs()[0]):
                loss = dpo_loss(policy, reference, beta=0.1)
                loss.backward()
                assert torch.isfinite(loss)
            for record, role, value in zip(policy.record, policy.role, policy.sum.tolist(), strict=True):
                found.setdefault((record, role), []).append(value)
    roles = {"p0": 2, "p1": 2, "m0": 3, "k0": 1, "one": 2, "k1": 1}
    assert sorted({r for r, _ in found}) == sorted(roles) and len(found) == sum(roles.values())
    for key, values in found.items():
        assert len(values) == 4 and max(values) - min(values) < 1e-5, (key, values)  # the module's token tolerance
