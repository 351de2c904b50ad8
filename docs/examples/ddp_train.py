"""A vision-language model under DDP or FSDP2, one process per rank, on a build where some rows
hold no image: packer's dummy media (PackedCollator(dummy_media=media_dummies(model, ds))) give
such a batch one minimal zero image in a segment of its own, so every rank runs the vision
tower -- DDP sees every parameter used, FSDP2 runs the same collectives on every rank -- and the
loss and gradients are those of the batch without it. CPU (gloo):

    packer build pipelines/qwen2vl.toml -i sample_data/llava.jsonl -i sample_data/docs.jsonl -o out/vlm \\
        --max-length 512 --group-by modality --tokenizer sample_data/tokenizer
    torchrun --standalone --nproc_per_node 2 docs/examples/ddp_train.py out/vlm --steps 6
    torchrun --standalone --nproc_per_node 2 docs/examples/ddp_train.py out/vlm --steps 6 --fsdp

On GPUs add --gpu (NCCL; one GPU per process). --report-dir writes each rank's losses and how
many real images each of its batches held.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader

sys.path.insert(0, str(Path(__file__).parent))
from train_qwen2vl import tiny_model_and_processor  # noqa: E402

from packer.loader import (  # noqa: E402
    PackedCollator,
    PackedDataset,
    TokenBalancedSampler,
    loss_norm,
    media_dummies,
    model_inputs,
    packed_loss,
)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("build", help="a build made with pipelines/qwen2vl.toml")
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--fsdp", action="store_true", help="FSDP2 (fully_shard) instead of DDP")
    ap.add_argument("--gpu", action="store_true")
    ap.add_argument("--lr", type=float, default=5e-3)
    ap.add_argument("--report-dir")
    args = ap.parse_args()
    dist.init_process_group("nccl" if args.gpu else "gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    device = torch.device(f"cuda:{os.environ.get('LOCAL_RANK', 0)}" if args.gpu else "cpu")

    ds = PackedDataset(args.build)
    model, processor = tiny_model_and_processor(ds)  # or from_pretrained: see train_qwen2vl.py
    model.to(device).train()
    collate = PackedCollator(attention="sdpa", rope="mrope", processor=processor, pad_to_multiple_of=64,
                             dummy_media=media_dummies(model, ds))  # every tower on every rank
    if args.fsdp:
        from torch.distributed.fsdp import fully_shard

        for block in model.model.visual.blocks:
            fully_shard(block)
        for layer in model.model.language_model.layers:
            fully_shard(layer)
        wrapped = fully_shard(model)
    else:
        wrapped = torch.nn.parallel.DistributedDataParallel(model, device_ids=[device] if args.gpu else None)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr)
    sampler = TokenBalancedSampler(ds, num_replicas=world, rank=rank, batch_size=1, seed=0)
    loader = DataLoader(ds, batch_size=1, sampler=sampler, collate_fn=collate)

    losses, images, step, epoch = [], [], 0, 0
    while step < args.steps:
        sampler.set_epoch(epoch)
        for batch in loader:
            batch = {k: v.to(device) if torch.is_tensor(v) else v for k, v in batch.items()}
            total, _ = packed_loss(wrapped(**model_inputs(batch, model)).logits, batch, reduce=False)
            norm = loss_norm(batch).to(torch.float64)
            dist.all_reduce(norm)  # the step's global sum of weights
            (total * world / norm).backward()  # DDP and FSDP average gradients over ranks
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            opt.zero_grad()
            reported = (total / norm).detach()
            dist.all_reduce(reported)
            losses.append(reported.item())
            images.append(sum(m["kind"] == "image" and not m.get("dummy") for m in batch["media"]))
            step += 1
            if step == args.steps:
                break
        epoch += 1
    if rank == 0:
        print(f"{'FSDP2' if args.fsdp else 'DDP'}: {step} steps on {world} ranks; loss {losses[0]:.4f} -> {losses[-1]:.4f}",
              flush=True)
    if args.report_dir:
        Path(args.report_dir, f"rank-{rank}.json").write_text(json.dumps({"rank": rank, "losses": losses, "images": images}))
    del wrapped, model, opt  # before the process group goes: a DDP model destroyed after it can hang the exit
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
