"""FSDP (fully_shard) training on a packed build, one process per rank, each reading
its share through TokenBalancedSampler. Runs on CPU with the gloo backend:

    torchrun --standalone --nproc_per_node 2 docs/examples/fsdp_train.py out/text --steps 6

Every rank runs the same number of steps (the sampler guarantees it), so no rank waits
in a collective for another that ran out of data. The loss is normalised by the global
sum of loss weights (one all-reduce per step), so it equals the unpacked token mean.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch
import torch.distributed as dist
from torch.distributed.fsdp import fully_shard
from torch.utils.data import DataLoader
from transformers import LlamaConfig, LlamaForCausalLM

from packer.loader import PackedCollator, PackedDataset, TokenBalancedSampler, packed_loss


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("build")
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--report-dir", help="write each rank's summary to REPORT_DIR/rank-N.json")
    args = ap.parse_args()
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()

    ds = PackedDataset(args.build)
    cfg = LlamaConfig(vocab_size=ds.manifest.tokenizer["vocab_size"], hidden_size=64, intermediate_size=128,
                      num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                      max_position_embeddings=ds.max_length)
    cfg._attn_implementation = "sdpa"
    torch.manual_seed(0)
    model = LlamaForCausalLM(cfg)
    for layer in model.model.layers:
        fully_shard(layer)
    fully_shard(model)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)

    sampler = TokenBalancedSampler(ds, num_replicas=world, rank=rank, batch_size=1, seed=0)
    loader = DataLoader(ds, batch_size=1, sampler=sampler, collate_fn=PackedCollator(attention="sdpa", pad_to_multiple_of=64))
    losses, steps = [], 0
    while steps < args.steps:
        sampler.set_epoch(steps)
        for batch in loader:
            logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                           position_ids=batch["position_ids"]).logits
            total, norm = packed_loss(logits, batch, reduce=False)
            dist.all_reduce(norm)  # the step's global sum of weights
            loss = total * world / norm  # FSDP averages gradients over ranks
            loss.backward()
            opt.step()
            opt.zero_grad()
            reported = loss.detach() / world
            dist.all_reduce(reported)
            losses.append(reported.item())
            steps += 1
            if steps == args.steps:
                break
    report = {"rank": rank, "steps": steps, "batches_per_epoch": len(sampler), "losses": losses}
    if args.report_dir:
        Path(args.report_dir, f"rank-{rank}.json").write_text(json.dumps(report))
    if rank == 0:
        print(f"{steps} steps on {world} ranks; loss {losses[0]:.4f} -> {losses[-1]:.4f}", flush=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
