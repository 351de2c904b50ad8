"""HF Trainer on a packed build: PackedDataset as train_dataset, PackedCollator as
data_collator. The model's own loss is then the token mean over trained tokens (labels
are -100 at every segment start, so nothing is trained across a boundary).

    python docs/examples/hf_trainer.py out/sample [--steps 10]
"""

from __future__ import annotations

import argparse
import tempfile

import torch
from transformers import LlamaConfig, LlamaForCausalLM, Trainer, TrainingArguments

from packer.loader import PackedCollator, PackedDataset


def train(build: str, steps: int, output_dir: str) -> list[float]:
    ds = PackedDataset(build)
    cfg = LlamaConfig(vocab_size=ds.manifest.tokenizer["vocab_size"], hidden_size=128, intermediate_size=256,
                      num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                      max_position_embeddings=ds.max_length)
    cfg._attn_implementation = "sdpa"
    torch.manual_seed(0)
    args = TrainingArguments(output_dir=output_dir, max_steps=steps, per_device_train_batch_size=2, learning_rate=3e-3,
                             logging_steps=1, report_to=[], save_strategy="no", use_cpu=True,
                             remove_unused_columns=False, dataloader_num_workers=0, seed=0)
    trainer = Trainer(model=LlamaForCausalLM(cfg), args=args, train_dataset=ds,
                      data_collator=PackedCollator(attention="sdpa", pad_to_multiple_of=64))
    trainer.train()
    return [h["loss"] for h in trainer.state.log_history if "loss" in h]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("build")
    ap.add_argument("--steps", type=int, default=10)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        losses = train(args.build, args.steps, tmp)
    print("losses:", " ".join(f"{x:.3f}" for x in losses))


if __name__ == "__main__":
    main()
