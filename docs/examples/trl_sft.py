"""TRL's SFTTrainer on a packed build (trl is not a packer dependency: pip install trl).

SFTTrainer takes HF datasets only, and re-tokenizes and re-packs unless told not to:
`PackedDataset.to_hf_dataset()` gives it the shards (memory-mapped), `skip_prepare_dataset`
keeps its hands off, `padding_free=False` keeps its own flattening off, and PackedCollator
(through `model_inputs`) hands the model packer's masks and positions plus the labels, which
TRL's loss shifts itself (labels are -100 at every segment start: nothing is trained across
a boundary; the loss is TRL's token mean over the accumulated step).

Its `num_tokens` metric sums `attention_mask`, which here is the 4-D block-diagonal mask (sum
of segment lengths squared over two: ~400 x the tokens at 4,096-token rows): `PackedSFTTrainer`
below counts the rows' real tokens instead.

    python docs/examples/trl_sft.py out/text --steps 10
    torchrun --standalone --nproc_per_node 2 docs/examples/trl_sft.py out/text --steps 10
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

import torch
from transformers import LlamaConfig, LlamaForCausalLM
from trl import SFTConfig, SFTTrainer

from packer.loader import PackedCollator, PackedDataset, model_inputs


class PackedSFTTrainer(SFTTrainer):
    """SFTTrainer whose ``num_tokens`` counts the packed rows' tokens, not the 4-D mask's entries."""

    tokens_seen = 0

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        real = inputs.pop("packer_tokens")
        result = super().compute_loss(model, inputs, return_outputs, num_items_in_batch)
        if model.training:
            self.tokens_seen += int(self.accelerator.gather_for_metrics(real).sum().item())
            self._metrics["train"]["num_tokens"] = [self.tokens_seen]  # TRL's metric, with the true count
        return result


def collator(collate: PackedCollator):
    """Rows -> what the model takes, the labels, and the rows' real token count (for the metric)."""

    def call(rows):
        batch = collate(rows)
        return {**model_inputs(batch), "labels": batch["labels"],
                "packer_tokens": torch.tensor(sum(int(r["n_tokens"]) for r in rows))}

    return call


def train(build: str, steps: int, output_dir: str, report_dir: str | None = None, order: str = "random") -> dict:
    ds = PackedDataset(build)
    cfg = LlamaConfig(vocab_size=ds.manifest.tokenizer["vocab_size"], hidden_size=64, intermediate_size=128,
                      num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=ds.max_length)
    cfg._attn_implementation = "sdpa"
    torch.manual_seed(0)
    args = SFTConfig(output_dir=output_dir, max_steps=steps, per_device_train_batch_size=2, learning_rate=3e-3,
                     logging_steps=1, report_to=[], save_strategy="no", use_cpu=True, seed=0, disable_tqdm=True,
                     dataset_kwargs={"skip_prepare_dataset": True}, padding_free=False, remove_unused_columns=False,
                     max_length=None, train_sampling_strategy=order)
    trainer = PackedSFTTrainer(model=LlamaForCausalLM(cfg), args=args, train_dataset=ds.to_hf_dataset(),
                               processing_class=ds.tokenizer(),
                               data_collator=collator(PackedCollator(attention="sdpa", pad_to_multiple_of=64)))
    trainer.train()
    logs = [h for h in trainer.state.log_history if "loss" in h]
    report = {"rank": trainer.args.process_index, "losses": [h["loss"] for h in logs],
              "num_tokens": [h["num_tokens"] for h in logs]}
    if report_dir:
        Path(report_dir, f"rank-{report['rank']}.json").write_text(json.dumps(report))
    return report


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("build")
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--report-dir")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        report = train(args.build, args.steps, tmp, args.report_dir)
    print("losses:", " ".join(f"{x:.3f}" for x in report["losses"]), "| tokens:", report["num_tokens"][-1], flush=True)


if __name__ == "__main__":
    main()
