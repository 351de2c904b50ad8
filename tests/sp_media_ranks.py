"""Run by tests/test_sp_media.py: spawned ranks (gloo, CPU, float32) train one step of a tiny VLM / audio LM on one
packed row under packer's SP attention (language model only; towers on SDPA), the encoders' work shared across
the SP group (:func:`packer.loader.sp_media.shared_encoders`) or replicated; rank 0 of each SP group writes the
per-segment loss sums, the loss, every parameter's gradient (summed over the SP group) and the items each rank
encoded.

    python tests/sp_media_ranks.py WORLD BUILD CASES.json OUT

CASES.json: ``[{"name": ..., "mode": "ulysses" | "ring" | "hybrid", "size": SP size (default: the world),
"split": true | false, "frames": true | false (a video's frame groups as units), "kind": "trainer" (one step of
PackedTrainer(sequence_parallel=size) instead of the plain step)}, ...]``; a case writes ``NAME-dpK.pt`` per data-parallel replica K. The build (one packed
row), the model and the one-process reference (:func:`reference`) come from this module.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from ranks import run_cases  # noqa: E402

from packer.loader import PackedCollator, PackedDataset, packed_loss  # noqa: E402
from packer.loader.sequence_parallel import shard_for_sequence_parallel  # noqa: E402

# per family: the records of one packed row -- (kind, file) media of a user turn; [] a text-only turn
RECORDS = {
    "qwen3vl": [[("image", "plain_300x200.jpg"), ("image", "photo.webp")], [("video", "odd_17f.mp4")], [],
                [("image", "exif6.jpg"), ("video", "tenth_s.mp4")], [("image", "one_1x1.png")]],
    "qwen3omni": [[("audio", "1s_48k_stereo.wav"), ("image", "photo.webp")], [("audio", "2s_44k.mp3")], [],
                  [("image", "plain_300x200.jpg")], [("audio", "1s_48k_stereo.wav")]],
}
SUBCONFIGS = {"qwen3vl": ("vision_config",), "qwen3omni": ("vision_config", "audio_config")}


def make_build(family: str, root: Path) -> Path:
    """The family's records built into ``root / "out"`` (one packed row); the processor in ``root / "checkpoint"``."""
    from family_assets import assets_for
    from family_harness import build_family, write_media

    files = write_media(root, assets_for(family).kinds)
    records = []
    for k, media in enumerate(RECORDS[family]):
        parts = [{"type": kind, kind: str(files[name].relative_to(root))} for kind, name in media]
        records.append({"id": f"r{k}", "messages": [
            {"role": "user", "content": [*parts, {"type": "text", "text": f"Question {k}: what is it?"}]},
            {"role": "assistant", "content": "A gradient, some noise." if k % 2 else "It is hard to say, really."}]})
    source = root / "records.jsonl"
    source.write_text("".join(json.dumps(r) + "\n" for r in records))
    assets_for(family).processor(root / "checkpoint")
    build_family(family, root / "checkpoint", source, root / "out", max_length=4096, max_segments=8)
    return root / "out"


def model(family: str, build: Path, impl: str | None):
    """The family's tiny model (the same weights whatever the attention); ``impl`` None: SDPA everywhere, else the
    SP attention on the language model only."""
    from family_assets import assets_for
    from transformers import AutoProcessor

    processor = AutoProcessor.from_pretrained(str(build.parent / "checkpoint"))
    m = assets_for(family).model(processor, "sdpa")
    if impl is not None:
        m.set_attn_implementation({"text_config": impl, **{c: "sdpa" for c in SUBCONFIGS[family]}})
    return m.train()


def batch_of(build: Path, m, attention: str) -> dict:
    ds = PackedDataset(str(build))
    assert len(ds) == 1, f"the build packs {len(ds)} rows, not one"
    return PackedCollator.for_build(ds, m, attention=attention, dummy_media=False)([ds[0]])


def segment_losses(logits: torch.Tensor, batch: dict, segments: int) -> torch.Tensor:
    """Weighted loss sum of each of the row's segments (the sliced batch's shifted targets)."""
    per_token = torch.nn.functional.cross_entropy(logits.float().reshape(-1, logits.shape[-1]),
                                                  batch["shift_labels"].reshape(-1), ignore_index=-100, reduction="none")
    weighted = per_token * batch["shift_loss_weights"].reshape(-1)
    seq = batch["seq_idx"].reshape(-1).long()
    keep = seq < segments  # SP padding holds no weight
    return torch.zeros(segments, dtype=weighted.dtype).index_add(0, seq[keep], weighted[keep])


def reference(family: str, build: Path):
    """One process, SDPA with the packed mask, the model's own forward: (segment loss sums, loss, gradients, spans)."""
    from packer.loader import model_inputs

    m = model(family, build, None)
    batch = batch_of(build, m, "sdpa")
    full = shard_for_sequence_parallel(batch, 0, 1)
    logits = m(**model_inputs(batch, m)).logits
    total, norm = packed_loss(logits, full, reduce=False)
    (total / norm).backward()
    segments = int(batch["seq_idx"].max()) + 1
    return {"segments": segment_losses(logits, full, segments).detach(), "loss": (total / norm).item(),
            "grads": {n: p.grad.clone() for n, p in m.named_parameters() if p.grad is not None},
            "media": [(m_["kind"], int(m_["tokens"])) for m_ in batch["media"]]}


def trainer(case: dict, family: str, build: Path, out: Path) -> None:
    """One step of ``PackedTrainer(sequence_parallel=size)`` (DDP over the world, SGD, no clipping): the trainer slices
    the row, shares the encoders and scales the loss; rank 0 writes the reported loss and every gradient (after DDP's
    average, before the step)."""
    import tempfile

    from transformers import TrainerCallback, TrainingArguments

    from packer.loader import PackedTrainer
    from packer.loader.sp_attention import IMPLEMENTATIONS, register

    register()
    rank, world = dist.get_rank(), dist.get_world_size()
    # what torchrun sets and TrainingArguments / Accelerate read (the process group is already up: they take it)
    os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world), LOCAL_WORLD_SIZE=str(world))
    m = model(family, build, IMPLEMENTATIONS[case["mode"]])
    grads = {}

    class Grads(TrainerCallback):
        def on_pre_optimizer_step(self, args, state, control, **kwargs):
            grads.update({n: p.grad.detach().clone() for n, p in m.named_parameters() if p.grad is not None})

    ds = PackedDataset(str(build))
    with tempfile.TemporaryDirectory() as tmp:
        args = TrainingArguments(output_dir=tmp, max_steps=1, per_device_train_batch_size=1, learning_rate=0.1,
                                 optim="sgd", lr_scheduler_type="constant", max_grad_norm=0, logging_steps=1,
                                 report_to=[], use_cpu=True, seed=0, disable_tqdm=True, save_strategy="no")
        t = PackedTrainer(model=m, args=args, train_dataset=ds, sequence_parallel=case.get("size", dist.get_world_size()),
                          callbacks=[Grads()])
        t.train()
    if dist.get_rank() == 0:
        loss = next(h["loss"] for h in t.state.log_history if "loss" in h)
        torch.save({"loss": loss, "grads": grads, "mode": t.sp.mode, "collator": t.data_collator.attention},
                   out / f"{case['name']}-dp0.pt")


def run_case(case: dict, family: str, build: Path, out: Path) -> None:
    from packer.loader.sp_attention import SequenceParallel
    from packer.loader.sp_media import shared_encoders

    if case.get("kind") == "trainer":
        return trainer(case, family, build, out)

    mode, size = case["mode"], case.get("size", dist.get_world_size())
    sp = SequenceParallel.create(size, mode, kv_heads=2)
    m = model(family, build, sp.attn_implementation)
    batch = batch_of(build, m, "sdpa" if mode == "ulysses" else "varlen")
    segments = int(batch["seq_idx"].max()) + 1
    local = sp.slice(batch)
    with shared_encoders(m, sp, batch, local, split=case.get("split", True), frames=case.get("frames", True)) as media:
        logits = m(**media.inputs).logits
    total, norm = packed_loss(logits, local, reduce=False)
    dist.all_reduce(norm, group=sp.group)  # the step's sum of weights over the SP group
    (total / norm).backward()
    losses = segment_losses(logits, local, segments).detach()
    dist.all_reduce(losses, group=sp.group)
    grads = {n: p.grad.clone() for n, p in m.named_parameters() if p.grad is not None}
    for g in grads.values():
        dist.all_reduce(g, group=sp.group)
    encoded = [None] * sp.size
    dist.all_gather_object(encoded, media.encoded, group=sp.group)
    if sp.rank == 0:
        torch.save({"segments": losses, "loss": float(losses.sum() / norm), "grads": grads, "encoded": encoded},
                   out / f"{case['name']}-dp{dist.get_rank() // size}.pt")


def worker(rank: int, world: int, family: str, build: str, cases: list[dict], out: str, store: str) -> None:
    run_cases(rank, world, store, cases, out, lambda case: run_case(case, family, Path(build), Path(out)))


if __name__ == "__main__":
    world, family, build = int(sys.argv[1]), sys.argv[2], sys.argv[3]
    cases, out = json.loads(Path(sys.argv[4]).read_text()), sys.argv[5]
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    torch.multiprocessing.spawn(worker, args=(world, family, build, cases, out, str(Path(out) / "store")), nprocs=world)
