"""HF Trainer on a packed build: PackedTrainer wires TokenBalancedSampler (one per rank),
model_inputs, packed_loss over the step's global sum of weights (gradient accumulation and
ranks included) and exact mid-epoch resume. One process, or any number under torchrun:

    python docs/examples/hf_trainer.py out/text --steps 10
    torchrun --standalone --nproc_per_node 2 docs/examples/hf_trainer.py out/text --steps 10   # CPU: gloo
    torchrun ... hf_trainer.py out/text --steps 10 --output-dir ckpt --save-steps 4   # checkpoints
    torchrun ... hf_trainer.py out/text --steps 10 --output-dir ckpt --resume ckpt/checkpoint-4   # mid-epoch resume

On GPUs drop --cpu (the default backend is then NCCL). --report-dir writes each rank's logged
losses and the rows it trained (and rank 0 the final weights), for tests/test_distributed.py.
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

import torch
from transformers import LlamaConfig, LlamaForCausalLM, TrainingArguments

from packer.loader import PackedCollator, PackedDataset, PackedTrainer


def tiny_llama(ds: PackedDataset) -> LlamaForCausalLM:
    """A tiny random Llama over the build's vocabulary; for a real run, load a checkpoint instead:
    AutoModelForCausalLM.from_pretrained(NAME, attn_implementation="sdpa") (built with its tokenizer)."""
    cfg = LlamaConfig(vocab_size=ds.manifest.tokenizer["vocab_size"], hidden_size=64, intermediate_size=128,
                      num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=ds.max_length)
    cfg._attn_implementation = "sdpa"
    torch.manual_seed(0)
    return LlamaForCausalLM(cfg)


class Recording(PackedTrainer):
    """Records the dataset rows of every micro-batch it trains (the collator's ``rows``)."""

    rows: list[int]

    def compute_loss(self, model, inputs, *args, **kwargs):
        self.rows.extend(inputs["rows"])
        return super().compute_loss(model, inputs, *args, **kwargs)


def train(build: str, steps: int, output_dir: str, *, batch_size: int = 2, accumulation: int = 2, loss: str = "token",
          lr: float = 3e-3, cpu: bool = True, report_dir: str | None = None, save_steps: int = 0,
          resume: str | None = None, optim: str = "adamw_torch") -> list[float]:
    ds = PackedDataset(build)
    args = TrainingArguments(output_dir=output_dir, max_steps=steps, per_device_train_batch_size=batch_size,
                             gradient_accumulation_steps=accumulation, learning_rate=lr, lr_scheduler_type="constant",
                             logging_steps=1, report_to=[], use_cpu=cpu, seed=0, disable_tqdm=True,
                             save_strategy="steps" if save_steps else "no", save_steps=save_steps or 500, optim=optim)
    collate = PackedCollator(attention="sdpa", loss=loss, pad_to_multiple_of=64)
    trainer = Recording(model=tiny_llama(ds), args=args, train_dataset=ds, data_collator=collate)
    trainer.rows = rows = []
    trainer.train(resume_from_checkpoint=resume)
    losses = [h["loss"] for h in trainer.state.log_history if "loss" in h]
    if report_dir:
        rank = trainer.args.process_index
        Path(report_dir, f"rank-{rank}.json").write_text(json.dumps({"rank": rank, "losses": losses, "rows": rows}))
        if rank == 0:
            torch.save({k: v.detach().cpu() for k, v in trainer.model.state_dict().items()}, Path(report_dir, "model.pt"))
    return losses


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("build")
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--batch-size", type=int, default=2)
    ap.add_argument("--accumulation", type=int, default=2)
    ap.add_argument("--loss", default="token", choices=["token", "sample", "sqrt"])
    ap.add_argument("--gpu", action="store_true", help="train on GPUs (NCCL under torchrun)")
    ap.add_argument("--report-dir")
    ap.add_argument("--output-dir", help="where checkpoints go (default: a temporary folder)")
    ap.add_argument("--save-steps", type=int, default=0, help="a checkpoint every N optimizer steps")
    ap.add_argument("--resume", help="a checkpoint folder to resume from (mid-epoch: the next unseen rows)")
    ap.add_argument("--optim", default="adamw_torch", help="the Trainer's optimizer (sgd: what the equivalence test checks)")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        losses = train(args.build, args.steps, args.output_dir or tmp, batch_size=args.batch_size,
                       accumulation=args.accumulation, loss=args.loss, cpu=not args.gpu, report_dir=args.report_dir,
                       save_steps=args.save_steps, resume=args.resume, optim=args.optim)
    print("losses:", " ".join(f"{x:.3f}" for x in losses), flush=True)


if __name__ == "__main__":
    main()
