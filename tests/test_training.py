"""Training on packed builds in the trainers people use, one process: PackedTrainer against a
plain loop, its mid-epoch resume, the mask form checked against the attention implementation,
Accelerate's re-sharding undone, StatefulDataLoader's resume under prefetch. Two processes
(DDP, FSDP2, torchrun, accelerate): tests/test_distributed.py."""

from __future__ import annotations

import copy
import json
import math

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader

from conftest import ROOT
from packer.build import build
from packer.config import resolve
from packer.loader import PackedCollator, PackedDataset, TokenBalancedSampler, loss_norm, model_inputs, packed_loss
from packer.loader.checks import check_attention


@pytest.fixture(scope="module")
def small_build(tmp_path_factory):
    """sample_data at 512-token rows: 25 or so rows, so epochs are short."""
    out = tmp_path_factory.mktemp("small") / "out"
    build(resolve(ROOT / "pipelines" / "sample.toml", output=str(out), max_length=512, max_bad_fraction=1.0,
                  modalities=[]), progress=False)  # text only: these train a text model (media records quarantined)
    return out


def tiny_llama(ds, impl="sdpa", seed=0):
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(vocab_size=ds.manifest.tokenizer["vocab_size"], hidden_size=32, intermediate_size=64,
                      num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=512)
    cfg._attn_implementation = impl
    torch.manual_seed(seed)
    return LlamaForCausalLM(cfg)


def trainer_args(tmp, **kw):
    from transformers import TrainingArguments

    base = dict(output_dir=str(tmp), per_device_train_batch_size=2, gradient_accumulation_steps=2, learning_rate=1e-2,
                lr_scheduler_type="constant", max_grad_norm=0.0, logging_steps=1, report_to=[], save_strategy="no",
                use_cpu=True, seed=3, dataloader_num_workers=0, weight_decay=0.0, disable_tqdm=True)
    return TrainingArguments(**{**base, **kw})


class Recorded(PackedDataset):
    """Remembers which rows were loaded (DataLoader without workers: in this process)."""

    seen: list[int]

    def __getitem__(self, index):
        self.seen.append(int(index))
        return super().__getitem__(index)


@pytest.fixture
def one_thread():
    """One intra-op thread: every reduction sums in one order, whatever the machine's load or core count."""
    saved = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(saved)


def plain_loop(model, ds, collate, steps, *, batch_size=2, accumulation=2, seed=3, lr=1e-2):
    """The reference: plain SGD (the Trainer's ``optim="sgd"``), each optimizer step over `accumulation`
    micro-batches divided by their summed weights. SGD, not Adam: the Trainer and this loop sum the same
    gradients in another order (float noise of ~1e-9), which SGD keeps at lr x noise, while Adam divides each
    step by the root of the gradient's second moment and turns noise on a near-zero gradient into a step of
    about lr (a weight off by 1e-5 after a few steps, on a loaded machine)."""
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    sampler = TokenBalancedSampler(ds, num_replicas=1, rank=0, batch_size=batch_size, seed=seed)
    loader = DataLoader(ds, batch_size=batch_size, sampler=sampler, collate_fn=collate)
    losses, epoch = [], 0
    while len(losses) < steps:
        sampler.set_epoch(epoch)
        batches = list(loader)
        for k in range(0, len(batches), accumulation):
            group = batches[k : k + accumulation]
            norm = sum(loss_norm(b) for b in group)
            total = 0.0
            for b in group:
                part, _ = packed_loss(model(**model_inputs(b)).logits, b, reduce=False)
                (part / norm).backward()
                total += part.item()
            opt.step()
            opt.zero_grad()
            losses.append(total / norm.item())
            if len(losses) == steps:
                break
        epoch += 1
    return losses


@pytest.mark.slow
@pytest.mark.parametrize("loss", ["token", "sample"])
def test_packed_trainer_equals_a_plain_loop(small_build, tmp_path, loss, one_thread):
    from packer.loader import PackedTrainer

    ds = PackedDataset(small_build)
    model = tiny_llama(ds)
    collate = PackedCollator(attention="sdpa", loss=loss, pad_to_multiple_of=64)
    steps = 9  # past the first epoch's 7 optimizer steps: the second epoch's order too
    trainer = PackedTrainer(model=copy.deepcopy(model), args=trainer_args(tmp_path, max_steps=steps, optim="sgd"),
                            train_dataset=ds, data_collator=collate)
    trainer.train()
    logged = [h["loss"] for h in trainer.state.log_history if "loss" in h]
    initial = copy.deepcopy(model)
    reference = plain_loop(model, ds, collate, steps)
    assert logged == pytest.approx(reference, abs=1e-4)  # the Trainer logs 4 decimals
    moved = max((initial.get_parameter(name) - p).abs().max().item() for name, p in model.named_parameters())
    assert moved > 1e-3  # the weights did move: the check below is not vacuous
    for name, p in model.named_parameters():
        assert (trainer.model.get_parameter(name) - p.detach()).abs().max() < 1e-6, name


@pytest.mark.slow
def test_packed_trainer_resumes_mid_epoch_on_the_same_rows(small_build, tmp_path, one_thread):
    from packer.loader import PackedTrainer

    ds = Recorded(small_build)
    model = tiny_llama(ds)
    collate = PackedCollator(attention="sdpa", pad_to_multiple_of=64)
    per_epoch = math.ceil(math.ceil(len(ds) / 2) / 2)  # optimizer steps an epoch: 2 rows a batch, 2 batches a step
    saved, steps = per_epoch + 2, per_epoch + 4  # the checkpoint is mid-epoch 1
    ds.seen = []
    whole = PackedTrainer(model=copy.deepcopy(model), args=trainer_args(tmp_path / "a", max_steps=steps), train_dataset=ds,
                          data_collator=collate)
    whole.train()
    order = ds.seen
    sampler = TokenBalancedSampler(ds, num_replicas=1, rank=0, batch_size=2, seed=3)
    epochs = [list(sampler) for e in (0, 1) if sampler.set_epoch(e) is None]
    assert order == (epochs[0] + epochs[1])[: len(order)] and epochs[0] != epochs[1][: len(epochs[0])]  # a new order each epoch
    ds.seen = []
    first = PackedTrainer(model=copy.deepcopy(model), train_dataset=ds, data_collator=collate,
                          args=trainer_args(tmp_path / "b", max_steps=steps, save_strategy="steps", save_steps=saved))
    first.train()
    checkpoint = tmp_path / "b" / f"checkpoint-{saved}"
    state = json.loads((checkpoint / "packer_sampler.json").read_text())
    assert state["epoch"] == 1 and state["consumed"] == 2 * 2 * 2 and state["num_replicas"] == 1
    before = len(order) - (steps - saved) * 4  # rows of the last steps (4 a step) are the last ones seen
    ds.seen = []
    resumed = PackedTrainer(model=copy.deepcopy(model), train_dataset=ds, data_collator=collate,
                            args=trainer_args(tmp_path / "b", max_steps=steps))
    resumed.train(resume_from_checkpoint=str(checkpoint))
    assert ds.seen == order[before:]  # the same remaining rows, none loaded twice
    for name, p in whole.model.named_parameters():
        assert torch.allclose(resumed.model.get_parameter(name), p, atol=1e-6), name
    other = PackedTrainer(model=copy.deepcopy(model), train_dataset=ds, data_collator=collate,
                          args=trainer_args(tmp_path / "b", max_steps=steps, seed=4))
    with pytest.raises(ValueError, match=r"dealt other rows \(seed 3 -> 4\)"):
        other.train(resume_from_checkpoint=str(checkpoint))


def test_mask_forms_the_attention_implementation_ignores_are_refused(small_build, tmp_path):
    ds = PackedDataset(small_build)
    sdpa, eager = tiny_llama(ds, "sdpa"), tiny_llama(ds, "eager")
    with pytest.raises(ValueError, match="runs attention 'sdpa'.*attention='varlen'.*PackedCollator\\(attention='sdpa'\\)"):
        check_attention(sdpa, "varlen")
    with pytest.raises(ValueError, match="eager implementation adds its mask"):
        check_attention(eager, "sdpa")
    with pytest.raises(ValueError, match="BlockMask"):
        check_attention(sdpa, "flex")
    for ok in (("sdpa", sdpa), ("eager", eager), ("eager", sdpa)):
        check_attention(ok[1], ok[0])
    flash = copy.deepcopy(sdpa.config)
    flash._attn_implementation = "flash_attention_2"
    check_attention(flash, "varlen")
    with pytest.raises(ValueError, match="ignores a 4-D mask"):
        check_attention(flash, "sdpa")
    rows = [ds[i] for i in range(2)]
    varlen = PackedCollator(attention="varlen")(rows)
    with pytest.raises(ValueError, match="attention='varlen'"):
        model_inputs(varlen, sdpa)
    assert "cu_seq_lens_q" in model_inputs(varlen)  # without the model: unchecked, as before
    model_inputs(PackedCollator(attention="sdpa")(rows), sdpa)
    from packer.loader import PackedTrainer

    with pytest.raises(ValueError, match="attention='varlen'"):
        PackedTrainer(model=sdpa, args=trainer_args(tmp_path, max_steps=1), train_dataset=ds,
                      data_collator=PackedCollator(attention="varlen"))
    with pytest.raises(TypeError, match="trains on a PackedDataset"):
        PackedTrainer(model=sdpa, args=trainer_args(tmp_path, max_steps=1), train_dataset=list(range(3)))


class Rows:
    def __init__(self, n=40, seed=0):
        rng = np.random.default_rng(seed)
        self.tokens = rng.integers(100, 4000, n).astype(float)

    def __len__(self):
        return len(self.tokens)

    def __getitem__(self, i):
        return i

    def row_stats(self):
        return {"tokens": self.tokens, "attention": self.tokens**2, "media_items": 0 * self.tokens,
                "media_tokens": 0 * self.tokens}


@pytest.mark.parametrize("drop_last", [False, True])
def test_accelerate_prepare_keeps_the_samplers_sharding(drop_last):
    """accelerator.prepare wraps the batch sampler in BatchSamplerShard, which keeps every
    num_processes-th batch; under it the sampler yields every rank's steps, so each rank still
    gets exactly its own rows (each row once per epoch) and len() is right."""
    from accelerate.data_loader import BatchSamplerShard, SkipBatchSampler

    ds, world, bs = Rows(41), 2, 3
    for rank in range(world):
        plain = TokenBalancedSampler(ds, num_replicas=world, rank=rank, batch_size=bs, seed=1, drop_last=drop_last)
        wrapped = TokenBalancedSampler(ds, num_replicas=world, rank=rank, batch_size=bs, seed=1, drop_last=drop_last)
        shard = BatchSamplerShard(torch.utils.data.BatchSampler(wrapped, bs, drop_last=False), num_processes=world,
                                  process_index=rank)
        want = [list(b) for b in torch.utils.data.BatchSampler(plain, bs, drop_last=False)]
        assert [list(b) for b in shard] == want and len(shard) == len(want)
        assert wrapped.state_dict()["consumed"] == 0  # a finished epoch
        skip = SkipBatchSampler(shard, skip_batches=2)  # what Accelerate's skip_first_batches builds
        assert [list(b) for b in skip] == want[2:]
    bad = TokenBalancedSampler(ds, num_replicas=4, rank=0, batch_size=bs, seed=1)
    shard = BatchSamplerShard(torch.utils.data.BatchSampler(bad, bs, drop_last=False), num_processes=2, process_index=0)
    with pytest.raises(ValueError, match="shard the TokenBalancedSampler's rows a second time: Accelerate shards over 2"):
        list(shard)
    half = TokenBalancedSampler(ds, num_replicas=2, rank=0, batch_size=bs, seed=1)
    with pytest.raises(ValueError, match="batch_size is 6"):
        list(BatchSamplerShard(torch.utils.data.BatchSampler(half, 6, drop_last=False), num_processes=2, process_index=0,
                               split_batches=True))


@pytest.mark.parametrize("workers", [0, 2])
def test_stateful_dataloader_resumes_exactly_under_prefetch(workers):
    """A plain DataLoader's workers draw indices ahead, so the sampler's own count runs ahead of
    the batches trained; torchdata's StatefulDataLoader saves the sampler's state as of each
    batch it hands out, so a resume continues at the next unseen row."""
    from torchdata.stateful_dataloader import StatefulDataLoader

    ds = Rows(50)

    def loader():
        sampler = TokenBalancedSampler(ds, num_replicas=2, rank=1, batch_size=3, seed=4)
        sampler.set_epoch(1)
        return StatefulDataLoader(ds, batch_size=3, sampler=sampler, num_workers=workers), sampler

    full = [b.tolist() for b in loader()[0]]
    first, sampler = loader()
    it = iter(first)
    head = [next(it).tolist() for _ in range(2)]
    state = first.state_dict()
    assert sampler.state_dict()["consumed"] == 6 if workers == 0 else sampler.state_dict()["consumed"] > 6  # ran ahead
    resumed, fresh = loader()
    fresh.set_epoch(0)  # the saved state brings its epoch back
    resumed.load_state_dict(state)
    assert head + [b.tolist() for b in resumed] == full


def test_to_hf_dataset_gives_the_same_rows_with_their_files(sample_build):
    out, _ = sample_build
    ds = PackedDataset(out)
    hf = ds.to_hf_dataset()
    assert len(hf) == len(ds)
    with_media = next(i for i in range(len(ds)) if ds[i]["media"])
    for i in (0, with_media, len(ds) - 1):
        ours, theirs = ds[i], hf[i]
        for key in ("input_ids", "labels", "cu_seqlens", "segment_trained"):
            assert list(ours[key]) == list(theirs[key]), key
        assert ours["n_tokens"] == theirs["n_tokens"] and ours["segment_ids"] == theirs["segment_ids"]
        assert [m["path"] for m in ours["media"]] == [m["path"] for m in theirs["media"]]
    batch = PackedCollator(pad_to_multiple_of=64)([hf[0], hf[1]])
    assert torch.equal(batch["input_ids"], PackedCollator(pad_to_multiple_of=64)([ds[0], ds[1]])["input_ids"])


@pytest.mark.slow
def test_trl_sft_recipe_trains_and_counts_the_true_tokens(small_build, tmp_path):
    """docs/examples/trl_sft.py: SFTTrainer on to_hf_dataset(); TRL's own num_tokens would sum the
    4-D mask; the recipe's is the rows' tokens. Its loss is packer's token mean."""
    pytest.importorskip("trl", reason="trl is a test-layer package (requirements.lock); the recipe needs it")
    import sys

    sys.path.insert(0, str(ROOT / "docs" / "examples"))
    from transformers import LlamaConfig, LlamaForCausalLM
    from trl_sft import train

    ds = PackedDataset(small_build)
    report = train(str(small_build), 3, str(tmp_path), order="sequential")  # rows 0-1, 2-3, 4-5
    assert report["num_tokens"] == [sum(int(ds[i]["n_tokens"]) for i in range(2 * (k + 1))) for k in range(3)]
    cfg = LlamaConfig(vocab_size=ds.manifest.tokenizer["vocab_size"], hidden_size=64, intermediate_size=128,
                      num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=ds.max_length)
    cfg._attn_implementation = "sdpa"
    torch.manual_seed(0)
    model = LlamaForCausalLM(cfg)  # the recipe's model before its first step
    batch = PackedCollator(attention="sdpa", pad_to_multiple_of=64)([ds[0], ds[1]])
    with torch.no_grad():
        first = packed_loss(model(**model_inputs(batch)).logits, batch).item()
    assert report["losses"][0] == pytest.approx(first, abs=1e-3)  # logged to 4 significant digits
    assert report["losses"][-1] < report["losses"][0]


def trained_rows(ds, model, args, **kw) -> list[int]:
    """The rows a PackedTrainer run loads, in order (one process, no workers)."""
    from packer.loader import PackedTrainer

    ds.seen = []
    trainer = PackedTrainer(model=copy.deepcopy(model), args=args, train_dataset=ds,
                            data_collator=PackedCollator(attention="sdpa", pad_to_multiple_of=64), **kw)
    trainer.train()
    assert all(math.isfinite(h["loss"]) for h in trainer.state.log_history if "loss" in h)
    return list(ds.seen)


def test_packed_trainer_follows_a_step_plan_computed_written_or_staged(small_build, tmp_path, one_thread):
    """sampler="plan" (StepPlanSampler planning each epoch), a plan file packer steps wrote, and a plan of mixture
    stages: a real tiny model trains on exactly the plan's rows, in its order; a plan that cannot serve the run (too
    few epochs, another world size) is refused when the trainer is made."""
    from packer.loader import PackedTrainer, StepPlanSampler
    from packer.loader.samplers.step_plan import plan_command, row_sources, source_names

    ds = Recorded(small_build)
    model = tiny_llama(ds)
    args = trainer_args(tmp_path / "a", max_steps=1)  # 1 optimizer step: 2 micro-batches of 2 rows
    computed = StepPlanSampler(ds, num_replicas=1, rank=0, batch_size=2, seed=3)
    assert trained_rows(ds, model, args, sampler="plan") == list(computed)[:4]

    written = plan_command(str(small_build), ranks=1, batch_size=2, seed=5, output=str(tmp_path / "plan.arrow"))
    follow = StepPlanSampler(ds, num_replicas=1, rank=0, batch_size=2, plan=written["path"])
    assert follow.seed == 5 and trained_rows(ds, model, args, sampler=written["path"]) == list(follow)[:4]

    names = source_names(ds.manifest)
    text = next(n for n in names if n.endswith("docs.jsonl"))
    stages = tmp_path / "stages.toml"
    stages.write_text(f'[[stages]]\nstart = 0\nend = 4\nweights = {{ "{text}" = 1.0 }}\n')
    staged = plan_command(str(small_build), ranks=1, batch_size=2, stages=str(stages), output=str(tmp_path / "st.arrow"))
    seen = trained_rows(ds, model, args, sampler=staged["path"])
    assert len(seen) == 4 and {names[s] for s in row_sources(ds)[seen]} == {text}  # the stage's source only

    with pytest.raises(ValueError, match=r"holds 1 epoch\(s\) of 4 steps, the run trains more \(max_steps=3: 2 epochs"):
        PackedTrainer(model=model, args=trainer_args(tmp_path / "b", max_steps=3), train_dataset=ds,
                      sampler=staged["path"])
    with pytest.raises(ValueError, match=r"dataloader_drop_last=True, but the step plan .* trains every row each epoch "
                                         r".*set dataloader_drop_last=False"):  # the plan's last step is not dropped
        PackedTrainer(model=model, args=trainer_args(tmp_path / "c", max_steps=1, dataloader_drop_last=True),
                      train_dataset=ds, sampler=written["path"])
    other = StepPlanSampler(ds, num_replicas=2, rank=1, batch_size=2)
    with pytest.raises(ValueError, match=r"made for another run: num_replicas 2 \(this run: 1\), rank 1 \(this run: 0\)"):
        PackedTrainer(model=model, args=args, train_dataset=ds, sampler=other)
    with pytest.raises(ValueError, match="neither 'token' nor 'plan' nor a step plan file"):
        PackedTrainer(model=model, args=args, train_dataset=ds, sampler="plans")
