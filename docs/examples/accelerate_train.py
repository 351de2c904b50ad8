"""Accelerate on a packed build: the loader goes through accelerator.prepare like any other,
and each rank still trains on exactly the rows TokenBalancedSampler gives it (each row once per
epoch: the sampler undoes Accelerate's second sharding, see docs/training.md). The loss is
normalised by the step's global sum of weights (accelerator.reduce), times the number of
processes, since DDP averages gradients.

    python docs/examples/accelerate_train.py out/text --steps 10
    torchrun --standalone --nproc_per_node 2 docs/examples/accelerate_train.py out/text --steps 10    # CPU, 2 processes
    accelerate launch --multi_gpu --num_processes 2 docs/examples/accelerate_train.py out/text --steps 10  # the same

(`accelerate launch --cpu` starts one process; `--multi_gpu` starts them through torchrun, and
this script asks for the CPU unless --gpu.) On 8 GPUs:
`accelerate launch --multi_gpu --num_processes 8 docs/examples/accelerate_train.py out/text --gpu`.
--report-dir writes each rank's rows per epoch and losses, for tests/test_distributed.py.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch
from accelerate import Accelerator
from torch.utils.data import DataLoader
from transformers import LlamaConfig, LlamaForCausalLM

from packer.loader import PackedCollator, PackedDataset, TokenBalancedSampler, loss_norm, model_inputs, packed_loss


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("build")
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--batch-size", type=int, default=2)
    ap.add_argument("--gpu", action="store_true")
    ap.add_argument("--report-dir")
    args = ap.parse_args()
    accelerator = Accelerator(cpu=not args.gpu)

    ds = PackedDataset(args.build)
    cfg = LlamaConfig(vocab_size=ds.manifest.tokenizer["vocab_size"], hidden_size=64, intermediate_size=128,
                      num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=ds.max_length)
    cfg._attn_implementation = "sdpa"
    torch.manual_seed(0)
    model = LlamaForCausalLM(cfg)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    sampler = TokenBalancedSampler(ds, num_replicas=accelerator.num_processes, rank=accelerator.process_index,
                                   batch_size=args.batch_size, seed=0)
    loader = DataLoader(ds, batch_size=args.batch_size, sampler=sampler,
                        collate_fn=PackedCollator(attention="sdpa", pad_to_multiple_of=64))
    model, opt, loader = accelerator.prepare(model, opt, loader)

    losses, epochs, step, epoch = [], [], 0, 0
    while step < args.steps:
        sampler.set_epoch(epoch)
        epochs.append([])
        for batch in loader:
            epochs[-1] += batch["rows"]
            total, _ = packed_loss(model(**model_inputs(batch, accelerator.unwrap_model(model))).logits, batch, reduce=False)
            norm = accelerator.reduce(loss_norm(batch), reduction="sum")  # the step's weights on every rank
            accelerator.backward(total * accelerator.num_processes / norm)
            opt.step()
            opt.zero_grad()
            losses.append(accelerator.reduce(total.detach() / norm, reduction="sum").item())
            step += 1
            if step == args.steps:
                break
        epoch += 1
    if accelerator.is_main_process:
        print(f"{step} steps on {accelerator.num_processes} process(es), {len(loader)} batches per epoch each; "
              f"loss {losses[0]:.4f} -> {losses[-1]:.4f}", flush=True)
    if args.report_dir:
        rank = accelerator.process_index
        Path(args.report_dir, f"rank-{rank}.json").write_text(json.dumps(
            {"rank": rank, "epochs": epochs, "losses": losses, "batches_per_epoch": len(loader)}))
    del model, opt, loader  # before the process group goes: a DDP model destroyed after it can hang the exit
    accelerator.free_memory()
    accelerator.end_training()


if __name__ == "__main__":
    main()
