"""Run by tests/test_distributed.py under torchrun (2 processes, gloo, CPU): a tiny Qwen2-VL,
DDP or FSDP2 (fully_shard per vision block, per decoder layer, then the root), each rank
training on the rows given to it -- one rank's rows without any image -- with packer's dummy
media in the collator and the loss over the step's global sum of weights. Each step's full
gradients (and the final parameters) are written for the test to compare with one process.

    torchrun --nproc_per_node 2 tests/distributed_vlm.py BUILD RUNS.json

RUNS.json: the runs, one after another in one process group (a torchrun start costs each test ~20 s of CPU):
``[{"mode": "ddp" | "fsdp", "rows": [[rank 0's row, rank 1's row], ...] (a pair per step), "out": FOLDER,
"dummy": true | false}, ...]``. Each run writes ``started`` in its folder first, its reports when it ends; a run
without dummy media stops the process group (DDP's check), so it comes last.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).parent))
from mm_models import FAMILIES  # noqa: E402

from packer.loader import PackedCollator, PackedDataset, loss_norm, media_dummies, model_inputs, packed_loss  # noqa: E402

LR = 0.5


def setup(build: str):
    ds = PackedDataset(build)
    tok = ds.tokenizer()
    family = FAMILIES["qwen2vl"]
    model = family.model(ds.placeholder_ids, len(tok) + 1, "sdpa")
    return ds, model, family.processor(tok)


def train(build: str, mode: str, steps: list[list[int]], out: Path, dummy: bool) -> None:
    if mode not in ("ddp", "fsdp"):
        raise ValueError(f"mode {mode!r}: expected 'ddp' or 'fsdp'")
    rank, world = dist.get_rank(), dist.get_world_size()
    (out / f"started-{rank}").touch()
    ds, model, processor = setup(build)
    dummies = media_dummies(model, ds) if dummy else None
    collate = PackedCollator(attention="sdpa", rope="mrope", pad_to_multiple_of=16, processor=processor, dummy_media=dummies)
    if mode == "ddp":
        wrapped = torch.nn.parallel.DistributedDataParallel(model)
    else:
        from torch.distributed.fsdp import fully_shard

        for block in model.model.visual.blocks:
            fully_shard(block)
        for layer in model.model.language_model.layers:
            fully_shard(layer)
        wrapped = fully_shard(model)
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    report = {"rank": rank, "losses": [], "images": []}
    for k, pair in enumerate(steps):
        batch = collate([ds[pair[rank]]])
        total, _ = packed_loss(wrapped(**model_inputs(batch)).logits, batch, reduce=False)
        norm = loss_norm(batch).to(torch.float64)
        dist.all_reduce(norm)  # the step's global sum of weights
        (total * world / norm).backward()  # DDP / FSDP average the gradients over the ranks
        grads = {n: (p.grad.full_tensor() if hasattr(p.grad, "full_tensor") else p.grad).detach().clone()
                 for n, p in model.named_parameters() if p.grad is not None}
        if rank == 0:
            torch.save(grads, out / f"grads-{k}.pt")
        loss = (total / norm).detach()
        dist.all_reduce(loss)
        report["losses"].append(loss.item())
        report["images"].append(sum(m["kind"] == "image" and not m.get("dummy") for m in batch["media"]))
        opt.step()
        opt.zero_grad()
    (out / f"rank-{rank}.json").write_text(json.dumps(report))
    del wrapped, model, opt  # before the process group goes: a DDP model destroyed after it can hang the exit
    dist.barrier()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("build")
    ap.add_argument("runs")
    args = ap.parse_args()
    dist.init_process_group("gloo")
    for run in json.loads(Path(args.runs).read_text()):
        train(args.build, run["mode"], run["rows"], Path(run["out"]), run["dummy"])
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
