"""A plain PyTorch loop over a packed build (CPU, a tiny random Llama), with gradient
accumulation: each optimizer step divides by the summed loss weights of all its micro-batches
(loss_norm), so the step's loss is the token / sample / sqrt mean over all of them.

    python docs/examples/train_loop.py out/text [--attention sdpa] [--steps 20] [--accumulation 2]
"""

from __future__ import annotations

import argparse

import torch
from torch.utils.data import DataLoader
from transformers import LlamaConfig, LlamaForCausalLM

from packer.loader import PackedCollator, PackedDataset, TokenBalancedSampler, loss_norm, model_inputs, packed_loss


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("build")
    ap.add_argument("--attention", default="sdpa", choices=["sdpa", "eager"])
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--accumulation", type=int, default=2)
    ap.add_argument("--loss", default="token", choices=["token", "sample", "sqrt"])
    args = ap.parse_args()

    ds = PackedDataset(args.build)
    vocab = ds.manifest.tokenizer["vocab_size"]
    cfg = LlamaConfig(vocab_size=vocab, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=ds.max_length)
    cfg._attn_implementation = args.attention
    torch.manual_seed(0)
    model = LlamaForCausalLM(cfg)
    sampler = TokenBalancedSampler(ds, num_replicas=1, rank=0, batch_size=2, seed=0)
    collate = PackedCollator(attention=args.attention, loss=args.loss, pad_to_multiple_of=64)
    loader = DataLoader(ds, batch_size=2, sampler=sampler, collate_fn=collate)
    opt = torch.optim.AdamW(model.parameters(), lr=2e-3)
    step, epoch, window = 0, 0, []
    while step < args.steps:
        sampler.set_epoch(epoch)
        for batch in loader:
            window.append(batch)
            if len(window) < args.accumulation:
                continue
            norm = sum(loss_norm(b) for b in window)  # the whole step's weights, known before any forward
            total = 0.0
            for b in window:
                part, _ = packed_loss(model(**model_inputs(b, model)).logits, b, reduce=False)  # model: mask form checked
                (part / norm).backward()
                total += part.item()
            opt.step()
            opt.zero_grad()
            window = []
            print(f"step {step:3d}  loss {total / norm.item():.4f}", flush=True)
            step += 1
            if step == args.steps:
                break
        epoch += 1


if __name__ == "__main__":
    main()
