"""Run by tests/test_sp_step.py under torchrun (4 processes, gloo, CPU, float32): one optimizer step of a tiny Llama
on a packed build as 2 data-parallel replicas x an SP group of 2, each replica 2 micro-batches (gradient
accumulation), in three ways -- a plain loop (gradients summed over the world), FSDP2 over the world (averaged, the
loss x world), and ``PackedTrainer(sequence_parallel=2)`` (DDP) -- and the refusals the trainer owes.

    torchrun --nproc_per_node 4 tests/sp_step_ranks.py BUILD CASES.json OUT

CASES.json: ``[{"name": ..., "kind": "loop" | "fsdp" | "trainer" | "misuse", "mode": "ring" | "ulysses",
"rows": [[replica 0's rows], [replica 1's]] (loop, fsdp)}, ...]``. Each case writes ``NAME-rank-K.json`` per rank
(its reported loss, the rows it trained) and rank 0 ``NAME.pt`` (every parameter's full gradient); ``misuse``
writes ``NAME.json`` (the messages). :func:`reference` is the one-process step the test compares with.
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from packer.loader import PackedCollator, PackedDataset, SequenceParallel, StepNorm, loss_norm, packed_loss  # noqa: E402

LOSS = "sample"  # per-sample weights: a denominator that is not a token count
SP = 2
LR = 0.1


def model(ds, impl: str):
    """A tiny Llama over the build's vocabulary (4 heads, 2 key / value heads, hidden 32, 2 layers); the same weights
    for any attention implementation."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from packer.loader.sp_attention import register

    register()
    config = LlamaConfig(vocab_size=ds.manifest.tokenizer["vocab_size"], hidden_size=32, intermediate_size=64,
                         num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=8,
                         max_position_embeddings=2 * ds.max_length, attention_dropout=0.0)
    torch.manual_seed(0)
    m = LlamaForCausalLM(config)
    m.set_attn_implementation(impl)
    return m


def reference(build: str, rows: list[int]) -> tuple[float, dict[str, torch.Tensor]]:
    """One process, SDPA with the packed mask, the step's rows one micro-batch each: (loss, every gradient)."""
    ds = PackedDataset(build)
    m = model(ds, "sdpa")
    collate = PackedCollator(attention="sdpa", loss=LOSS)
    batches = [collate([ds[i]]) for i in rows]
    norm = sum(loss_norm(b) for b in batches)
    total = sum(packed_loss(m(**_inputs(b)).logits, b, reduce=False)[0] for b in batches)
    (total / norm).backward()
    return (total / norm).item(), {n: p.grad.clone() for n, p in m.named_parameters()}


def _inputs(batch):
    from packer.loader import model_inputs

    return model_inputs(batch)


def loop(build: str, case: dict, out: Path, fsdp: bool) -> None:
    """The plain loop of docs/training.md: StepNorm over the replicas, each rank its slice; gradients summed over
    the world by hand, or averaged by FSDP2 (the loss x world)."""
    ds = PackedDataset(build)
    sp = SequenceParallel.create(SP, case["mode"])
    m = model(ds, sp.attn_implementation)
    sp.check_model(m)
    world = dist.get_world_size()
    if fsdp:
        from torch.distributed.fsdp import fully_shard

        for layer in m.model.layers:
            fully_shard(layer)
        fully_shard(m)
    collate = PackedCollator(attention=sp.collator_attention[0], loss=LOSS)
    sp.check_collator(collate, ds)
    replica = dist.get_rank() // SP
    batches = [collate([ds[i]]) for i in case["rows"][replica]]
    step = StepNorm(batches, sp=sp, scale=world if fsdp else 1)
    for batch in batches:
        local = sp.slice(batch)
        step.loss(m(**sp.model_inputs(local, m)).logits, local).backward()
    grads = {}
    for n, p in m.named_parameters():
        g = p.grad.full_tensor() if hasattr(p.grad, "full_tensor") else p.grad
        if not fsdp:
            dist.all_reduce(g)  # every rank's share: its slices (SP) of its replica's batches (DP)
        grads[n] = g.detach().clone()
    report(out, case, step.reported(), case["rows"][replica], grads)


def trainer(build: str, case: dict, out: Path) -> None:
    from transformers import TrainerCallback, TrainingArguments

    from packer.loader import PackedTrainer

    ds = PackedDataset(build)
    m = model(ds, f"packer_{case['mode']}")
    grads, rows = {}, []

    class Grads(TrainerCallback):
        def on_pre_optimizer_step(self, args, state, control, **kwargs):  # after DDP's average, before SGD
            grads.update({n: p.grad.detach().clone() for n, p in m.named_parameters()})

    class Recording(PackedTrainer):
        def compute_loss(self, model, inputs, *args, **kwargs):
            rows.extend(inputs["rows"])
            return super().compute_loss(model, inputs, *args, **kwargs)

    with tempfile.TemporaryDirectory() as tmp:
        args = TrainingArguments(output_dir=tmp, max_steps=1, per_device_train_batch_size=1, gradient_accumulation_steps=2,
                                 learning_rate=LR, optim="sgd", lr_scheduler_type="constant", max_grad_norm=0,
                                 logging_steps=1, report_to=[], use_cpu=True, seed=0, disable_tqdm=True,
                                 save_strategy="no")
        t = Recording(model=m, args=args, train_dataset=ds, data_collator=PackedCollator.for_build(ds, m, loss=LOSS),
                      sequence_parallel=SP, callbacks=[Grads()])
        t.train()
    loss = next(h["loss"] for h in t.state.log_history if "loss" in h)
    report(out, case, loss, rows, grads)


def report(out: Path, case: dict, loss: float, rows: list[int], grads: dict) -> None:
    rank = dist.get_rank()
    (out / f"{case['name']}-rank-{rank}.json").write_text(json.dumps({"loss": loss, "rows": rows}))
    if rank == 0:
        torch.save(grads, out / f"{case['name']}.pt")


def misuse(build: str, case: dict, out: Path) -> None:
    """The trainer's refusals (each needs the process group), and the ParallelismConfig it reads."""
    from accelerate import ParallelismConfig
    from transformers import TrainingArguments

    from packer.loader import PackedTrainer, TokenBalancedSampler

    ds = PackedDataset(build)
    found = {}

    def args(**kw):
        return TrainingArguments(output_dir=tempfile.gettempdir(), use_cpu=True, report_to=[], max_steps=1, **kw)

    def attempt(key, **kw):
        try:
            PackedTrainer(train_dataset=ds, **{"model": model(ds, "packer_ring"), "args": args(), **kw})
        except ValueError as e:
            found[key] = str(e)

    attempt("size", sequence_parallel=3)
    attempt("sampler", sequence_parallel=SP, sampler=TokenBalancedSampler(ds, num_replicas=dist.get_world_size(),
                                                                          rank=dist.get_rank()))
    attempt("collator", sequence_parallel=SP, data_collator=PackedCollator(attention="sdpa"))
    attempt("model", sequence_parallel=SP, model=model(ds, "sdpa"))
    attempt("config", args=args(parallelism_config=ParallelismConfig(sp_size=SP, dp_shard_size=2)))
    read = PackedTrainer(model=model(ds, "packer_ring"), args=args(parallelism_config=ParallelismConfig(cp_size=SP)),
                         train_dataset=ds)
    found["read"] = [read.sp.size, read.sp.mode, read.args.parallelism_config is None,
                     read.sampler().num_replicas, read.sampler().rank]
    try:
        read.evaluate()
    except ValueError as e:
        found["eval"] = str(e)
    if dist.get_rank() in (0, 1):  # the replica 0 of SP group 0, and its second rank
        (out / f"{case['name']}-{dist.get_rank()}.json").write_text(json.dumps(found))


def run(build: str, case: dict, out: Path) -> None:
    kind = case["kind"]
    if kind in ("loop", "fsdp"):
        loop(build, case, out, fsdp=kind == "fsdp")
    elif kind == "trainer":
        trainer(build, case, out)
    elif kind == "misuse":
        misuse(build, case, out)
    else:
        raise ValueError(f"case kind {kind!r}: expected loop, fsdp, trainer or misuse")


def main() -> None:
    build, cases, out = sys.argv[1], json.loads(Path(sys.argv[2]).read_text()), Path(sys.argv[3])
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    try:
        for case in cases:
            try:
                run(build, case, out)
            except Exception as e:  # noqa: BLE001 -- reported to the test, which names the case
                (out / f"{case['name']}-rank-{dist.get_rank()}.error").write_text(f"{type(e).__name__}: {e}")
                raise
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
