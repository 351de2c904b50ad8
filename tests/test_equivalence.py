"""The strongest claim: a packed batch through a real (randomly initialised) transformers
model gives the same per-sample logits, losses and gradients as the samples run one by
one. fp32, Llama and Qwen2 configs built here (no download)."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch

from packer.loader import PackedCollator, packed_loss

VOCAB = 97
IGNORE = -100


def make_model(arch: str, impl: str, seed: int = 0):
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

    cls_cfg, cls_model = {"llama": (LlamaConfig, LlamaForCausalLM), "qwen2": (Qwen2Config, Qwen2ForCausalLM)}[arch]
    cfg = cls_cfg(vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, max_position_embeddings=128, initializer_range=0.3, tie_word_embeddings=False)
    cfg._attn_implementation = impl
    torch.manual_seed(seed)
    return cls_model(cfg).float().eval()


def make_samples(seed: int = 0):
    """Four samples: a prompt part (untrained) then a trained answer, like SFT."""
    rng = np.random.default_rng(seed)
    samples = []
    for length, prompt in ((9, 4), (5, 2), (13, 6), (7, 1)):
        ids = rng.integers(1, VOCAB, length)
        labels = ids.copy()
        labels[:prompt] = IGNORE
        labels[0] = IGNORE
        samples.append((ids, labels))
    return samples


def pack(samples, groups):
    rows = []
    for group in groups:
        ids = np.concatenate([samples[i][0] for i in group])
        labels = np.concatenate([samples[i][1] for i in group])
        cu = np.concatenate([[0], np.cumsum([len(samples[i][0]) for i in group])])
        rows.append({"input_ids": ids, "labels": labels, "cu_seqlens": cu, "media": [], "n_tokens": len(ids),
                     "segment_ids": [str(i) for i in group], "segment_modality": ["text"] * len(group)})
    return rows


GROUPS = [[0, 1], [2, 3]]


def unpacked(model, samples):
    """Per-sample logits and per-token losses, each sample alone, no mask, default positions."""
    out = []
    for ids, labels in samples:
        logits = model(torch.as_tensor(ids)[None]).logits[0]
        target = torch.as_tensor(labels[1:])
        ce = torch.nn.functional.cross_entropy(logits[:-1], target.clamp(min=0), reduction="none") * (target != IGNORE)
        out.append((logits, ce, int((target != IGNORE).sum())))
    return out


def forward(model, batch):
    keys = ("input_ids", "attention_mask", "position_ids")
    return model(**{k: batch[k] for k in keys if k in batch}).logits


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
@pytest.mark.parametrize("attention, impl", [("sdpa", "sdpa"), ("eager", "eager")])
def test_packed_equals_unpacked_logits_losses_and_gradients(arch, attention, impl):
    samples = make_samples()
    model = make_model(arch, impl)
    ref = unpacked(model, samples)
    n_total = sum(r[2] for r in ref)
    loss_ref = sum(r[1].sum() for r in ref) / n_total
    model.zero_grad()
    loss_ref.backward()
    grads_ref = {n: p.grad.clone() for n, p in model.named_parameters()}

    batch = PackedCollator(attention=attention, pad_to=24)(pack(samples, GROUPS))
    logits = forward(model, batch)
    for b, group in enumerate(GROUPS):
        start = 0
        for i in group:
            n = len(samples[i][0])
            torch.testing.assert_close(logits[b, start : start + n], ref[i][0], atol=2e-4, rtol=1e-4)
            start += n
    assert torch.isfinite(logits).all(), "padding produced NaN/inf"
    loss = packed_loss(logits, batch)
    torch.testing.assert_close(loss, loss_ref, atol=1e-5, rtol=1e-5)
    model.zero_grad()
    loss.backward()
    for name, p in model.named_parameters():
        torch.testing.assert_close(p.grad, grads_ref[name], atol=1e-5, rtol=1e-4, msg=f"gradient of {name}")


@pytest.mark.parametrize("kind", ["sample", "sqrt"])
def test_sample_and_sqrt_weighting_equal_the_unpacked_reductions(kind):
    samples = make_samples(1)
    model = make_model("llama", "sdpa")
    with torch.no_grad():
        ref = unpacked(model, samples)
        if kind == "sample":
            expected = sum(r[1].sum() / r[2] for r in ref) / len(ref)
        else:  # InternVL: sum_i sum_t l / sqrt(n_i) / sum_i sqrt(n_i)
            expected = sum(r[1].sum() / np.sqrt(r[2]) for r in ref) / sum(np.sqrt(r[2]) for r in ref)
        batch = PackedCollator(attention="sdpa", loss=kind)(pack(samples, GROUPS))
        torch.testing.assert_close(packed_loss(forward(model, batch), batch), torch.as_tensor(expected, dtype=torch.float32),
                                   atol=1e-5, rtol=1e-5)


def test_exact_across_micro_batches_with_a_global_normalizer():
    """Gradient accumulation: sum(w*l) over micro-batches / the step's sum(w) == one big batch."""
    samples = make_samples(2)
    model = make_model("qwen2", "sdpa")
    collate = PackedCollator(attention="sdpa", loss="sample")
    with torch.no_grad():
        whole = packed_loss(forward(model, b := collate(pack(samples, GROUPS))), b)
        parts = [collate(pack(samples, [g])) for g in GROUPS]
        sums = [packed_loss(forward(model, p), p, reduce=False) for p in parts]
        torch.testing.assert_close(sum(s for s, _ in sums) / sum(n for _, n in sums), whole)


def test_bool_mask_under_eager_leaks_which_is_why_eager_gets_an_additive_mask():
    samples = make_samples(3)
    model = make_model("llama", "eager")
    with torch.no_grad():
        ref = unpacked(model, samples)
        batch = PackedCollator(attention="sdpa")(pack(samples, GROUPS))  # bool mask, wrong for eager
        logits = forward(model, batch)
        second = logits[0, 9:14]
        assert (second - ref[1][0]).abs().max() > 0.1 * ref[1][0].std()


def test_position_ids_alone_do_not_isolate_segments_under_sdpa():
    samples = make_samples(4)
    model = make_model("llama", "sdpa")
    with pytest.warns(UserWarning, match="isolates packed segments only under flash-attention kernels"):
        collate = PackedCollator(attention="position_ids")
    with torch.no_grad():
        ref = unpacked(model, samples)
        batch = collate(pack(samples, GROUPS))
        assert batch["input_ids"].shape == (1, 34) and "attention_mask" not in batch
        logits = forward(model, batch)
        torch.testing.assert_close(logits[0, :9], ref[0][0], atol=2e-4, rtol=1e-4)  # the first segment is fine
        assert (logits[0, 9:14] - ref[1][0]).abs().max() > 0.1 * ref[1][0].std()  # the second sees the first


@pytest.mark.slow
def test_flex_block_mask_forward_equals_unpacked():
    """FlexAttention on CPU: forward only (no backward on CPU); gradients are checked on GPU."""
    samples = make_samples(5)
    model = make_model("llama", "flex_attention")
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ref = unpacked(make_model("llama", "sdpa"), samples)
        batch = PackedCollator(attention="flex", pad_to=32, device="cpu")(pack(samples, GROUPS))
        logits = forward(model, batch)
    start = 0
    for i in GROUPS[0]:
        n = len(samples[i][0])
        torch.testing.assert_close(logits[0, start : start + n], ref[i][0], atol=2e-4, rtol=1e-4)
        start += n
    assert torch.isfinite(logits).all()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="FlexAttention backward needs CUDA")
def test_flex_gradients_on_gpu():  # pragma: no cover - runs where a GPU is
    samples = make_samples(6)
    model = make_model("llama", "flex_attention").cuda()
    ref_model = make_model("llama", "sdpa").cuda()
    ref = [(ids, labels) for ids, labels in samples]
    loss_ref = 0
    n = 0
    for ids, labels in ref:
        logits = ref_model(torch.as_tensor(ids, device="cuda")[None]).logits[0]
        t = torch.as_tensor(labels[1:], device="cuda")
        loss_ref = loss_ref + (torch.nn.functional.cross_entropy(logits[:-1], t.clamp(min=0), reduction="none") * (t != IGNORE)).sum()
        n += int((t != IGNORE).sum())
    (loss_ref / n).backward()
    batch = PackedCollator(attention="flex", pad_to=32, device="cuda")(pack(samples, GROUPS))
    batch = {k: v.cuda() if isinstance(v, torch.Tensor) else v for k, v in batch.items()}
    packed_loss(forward(model, batch), batch).backward()
    for (name, p), (_, q) in zip(model.named_parameters(), ref_model.named_parameters()):
        torch.testing.assert_close(p.grad, q.grad, atol=1e-4, rtol=1e-3, msg=name)
