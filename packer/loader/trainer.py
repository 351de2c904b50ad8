"""``PackedTrainer``: the HF ``Trainer`` over a packed build, every packed-training rule wired in.

    from packer.loader import PackedCollator, PackedDataset, PackedTrainer
    trainer = PackedTrainer(model=model, args=TrainingArguments(...), train_dataset=PackedDataset("out/qwen2vl"),
                            data_collator=PackedCollator(attention="sdpa", rope="mrope", processor=processor, loss="sample"))
    trainer.train()                                   # torchrun / accelerate launch: the same script

What the plain ``Trainer`` gets wrong on packed rows, and what this does instead:

- data: each rank reads its own rows through :class:`TokenBalancedSampler` (``world_size`` ranks,
  ``per_device_train_batch_size`` rows, ``seed``, cost-balanced steps), a new order every epoch, or
  through :class:`StepPlanSampler` (``sampler="plan"``: steps balanced on the llm, encoder and
  supervised cost at once; ``sampler=PATH``: a plan ``packer steps`` wrote, mixture stages included;
  ``sampler=`` an instance built for this run); the loader is not handed to Accelerate (which would
  shard it a second time);
- the model call: ``model(**model_inputs(batch))``, so the Qwen2-VL vision tower never sees the
  batch's ``cu_seqlens``; the mask form is checked against the model's attention implementation
  first (:func:`~packer.loader.checks.check_attention`: ``varlen`` under SDPA is refused);
- the loss: :func:`packed_loss` with the collator's token / sample / sqrt weights, divided by the
  *global* sum of weights of the optimizer step -- every micro-batch of the gradient-accumulation
  window on every rank, one all-reduce per step -- times the world size (DDP and FSDP average
  gradients over ranks): the loss and gradients of one big batch (tested over 2 processes
  against a plain loop);
- rows without media: with more than one rank and a build that declares media, the collator
  gets the model's dummy media (:mod:`packer.loader.dummy`), so every rank runs every tower
  (``dummy_media=False`` turns it off, ``True`` on);
- sequence parallelism: ``sequence_parallel=N`` (or a :class:`~packer.loader.SequenceParallel`, or Accelerate's
  ``ParallelismConfig(sp_size=N)`` / ``cp_size=N`` in the TrainingArguments, which packer then runs instead of
  DeepSpeed's or torch's) cuts the world into ``world / N`` data-parallel replicas of ``N`` consecutive ranks
  (:meth:`SequenceParallel.create`; the mode is the model's ``packer_ulysses`` / ``packer_ring`` /
  ``packer_hybrid``); the sampler deals ``world / N`` replicas, so every rank of a group gets the same batch;
  each rank trains its slice (``sp.slice``), a media batch through :func:`~packer.loader.shared_encoders`; the
  step's sum of weights is all-reduced over the replicas once (:class:`~packer.loader.StepNorm`) and the loss
  scaled by the world size, so DDP / FSDP averaging over the world gives the unsliced step's gradient and the
  logged loss is the unsliced loss;
- resume: ``train(resume_from_checkpoint=...)`` restarts mid-epoch at the next unseen row. The
  Trainer skips the batches already trained (indices only, no data loaded) and this loader sets
  the epoch's order before it does; each checkpoint holds ``packer_sampler.json`` (seed, ranks,
  rows per rank, rows, epoch and rows consumed), and a resume whose sampler would deal other
  rows (another seed, world size, batch size or build) is refused, since no exact resume exists.
"""

from __future__ import annotations

import copy
import json
import math
from pathlib import Path
from typing import Any

import torch
from transformers import Trainer

from packer.loader.checks import check_attention, default_attention
from packer.loader.collate import PackedCollator, model_inputs
from packer.loader.dummy import media_dummies, towers
from packer.loader.loss import StepNorm, packed_loss
from packer.loader.samplers import StepPlanSampler, TokenBalancedSampler
from packer.loader.samplers.token_balanced import WINDOW

SAMPLER_STATE = "packer_sampler.json"  # in each checkpoint folder
MATCHED = ("sampler", "seed", "num_replicas", "batch_size", "rows", "window")  # what decides the rows a rank gets
SAMPLERS = ("token", "plan")
_SP_EVAL = ("PackedTrainer evaluates without sequence parallelism only: the Trainer's evaluation loader deals rows over "
            "the world, so the ranks of an SP group would slice different batches. Evaluate in your own loop (every "
            "rank of a group the same batch, sp.slice, StepNorm(batches, sp=sp).reported()), or in a run without "
            "sequence_parallel")  # sampler= by name; else a plan file's path or a sampler instance


class Batches(torch.utils.data.BatchSampler):
    """``batch_size`` consecutive indices of the sampler at a time, forwarding ``set_epoch``
    (the Trainer calls it on the batch sampler it finds under Accelerate's skip wrapper)."""

    def set_epoch(self, epoch: int) -> None:
        self.sampler.set_epoch(epoch)


class PackedLoader(torch.utils.data.DataLoader):
    """A DataLoader whose ``set_epoch`` reaches the sampler (the Trainer calls it every epoch)."""

    def set_epoch(self, epoch: int) -> None:
        self.batch_sampler.set_epoch(epoch)


class PackedTrainer(Trainer):
    """A ``transformers.Trainer`` for :class:`~packer.loader.PackedDataset`; see the module docstring.

    ``data_collator`` defaults to ``PackedCollator.for_build(train_dataset, model=model)``: the mask form of the
    model's attention implementation, the build's family, rope and processor (:mod:`packer.loader.derive`). A
    collator given is checked against the build and the model (another family, no processor for a media build,
    another rope, a mask form the attention ignores: refused, naming the fix).

    ``sampler``: which rows each rank trains at each step --

    - ``"token"`` (default): :class:`TokenBalancedSampler`, steps balanced on one scalar cost (``cost``, ``window``);
    - ``"plan"``: :class:`StepPlanSampler` planning each epoch itself, balanced on the llm, encoder and supervised
      cost at once (``cost``, ``window``: default the whole epoch), every micro-step balanced;
    - a path (``str`` / ``Path``): a plan ``packer steps OUT`` wrote (epochs, or mixture stages: ``--stages``) for
      this world size, batch size and accumulation, refused here when it holds fewer epochs than the run trains;
    - a :class:`StepPlanSampler` / :class:`TokenBalancedSampler` instance, for any other setting (checked against
      this run's world size, rank, batch size and dataset).

    The seed is the TrainingArguments' (``data_seed``, else ``seed``); a plan file has its own.

    ``sequence_parallel``: an SP size (the groups made here, the mode read from the model's attention
    implementation) or a :class:`~packer.loader.SequenceParallel` made with ``create``; by default
    ``args.parallelism_config``'s ``sp_size`` / ``cp_size`` (that config then leaves the Trainer: packer runs the
    SP, not DeepSpeed or torch's context parallel), else none. Other arguments are the Trainer's.
    """

    def __init__(self, model=None, args=None, train_dataset=None, data_collator=None, *, cost=None,
                 window: int | None = None, dummy_media: bool | None = None,
                 sampler: str | Path | StepPlanSampler | TokenBalancedSampler = "token",
                 sequence_parallel: int | Any = None, **kwargs):
        args, sequence_parallel = _sp_setting(args, sequence_parallel)
        if train_dataset is not None and not hasattr(train_dataset, "row_stats"):
            raise TypeError(f"PackedTrainer trains on a PackedDataset (its rows' costs balance the ranks), got "
                            f"{type(train_dataset).__name__}; for other datasets use transformers.Trainer")
        derived = data_collator is None and train_dataset is not None
        if derived:  # checked against the build and the model as it is made
            collator = PackedCollator.for_build(train_dataset, model, dummy_media=False)  # dummies: below, by world size
        else:
            collator = data_collator if data_collator is not None else PackedCollator(attention=default_attention(model))
        if not isinstance(collator, PackedCollator):
            raise TypeError(f"data_collator must be a PackedCollator, got {type(collator).__name__}")
        if train_dataset is not None and not derived:
            collator.check_build(train_dataset, model)
        elif model is not None and train_dataset is None:
            check_attention(model, collator.attention)
        super().__init__(model=model, args=args, train_dataset=train_dataset, data_collator=collator, **kwargs)
        self.sp = self._sequence_parallel(sequence_parallel, model, collator, train_dataset)
        self.cost, self.window = cost, window
        self._sampler: TokenBalancedSampler | StepPlanSampler | None = None
        self._sampler_setting = sampler
        named = isinstance(sampler, str) and sampler in SAMPLERS
        if isinstance(sampler, (str, Path)) and not named and not Path(sampler).is_file():
            raise ValueError(f"sampler={str(sampler)!r} is neither {' nor '.join(map(repr, SAMPLERS))} nor a step plan "
                             f"file: give one of those, a plan `packer steps OUT` wrote, or a sampler instance")
        if not isinstance(sampler, (str, Path, StepPlanSampler, TokenBalancedSampler)):
            raise TypeError(f"sampler must be 'token', 'plan', a step plan path or a StepPlanSampler / "
                            f"TokenBalancedSampler, got {type(sampler).__name__}")
        if sampler != "token" and train_dataset is not None:
            self.sampler()  # a plan file or an instance that does not fit this run: refused now, not at train()
        self.loss_is_scaled_for_ga = True  # compute_loss divides by the whole step's weights: no further division
        if self._wants_dummies(dummy_media, model, train_dataset) and collator.dummy_media is None:
            collator = copy.copy(collator)  # the caller's collator is left as it was
            collator.dummy_media = media_dummies(model, train_dataset)
            self.data_collator = collator

    def _sequence_parallel(self, setting, model, collator, dataset):
        """This rank's :class:`SequenceParallel` (made here from a size), checked against the world, the model, the
        collator and the build; None without SP."""
        if setting is None or setting == 1:
            return None
        from packer.loader.sp_attention import IMPLEMENTATIONS, SequenceParallel, plan_groups

        world = self.args.world_size
        if isinstance(setting, SequenceParallel):
            sp = setting
            if sp.dp_group is None or world % sp.size:
                raise ValueError("sequence_parallel= a SequenceParallel made without its data-parallel groups: make it "
                                 "with SequenceParallel.create(size, mode) on every rank, or pass the size")
        elif isinstance(setting, int) and not isinstance(setting, bool):
            modes = {v: k for k, v in IMPLEMENTATIONS.items()}
            from packer.loader.checks import implementation

            impl = implementation(model) if model is not None else None
            if impl not in modes:
                raise ValueError(f"sequence_parallel={setting}, but {type(model).__name__} runs attention {impl!r}, "
                                 f"not one of packer's sequence-parallel attentions: load it with attn_implementation="
                                 f"'packer_ring' (or 'packer_ulysses', 'packer_hybrid'; a VLM: its text_config's)")
            plan_groups(world, setting, "ulysses")  # a size that does not divide the world: refused with the sizes that do
            text = model.config.get_text_config()
            sp = SequenceParallel.create(setting, modes[impl], kv_heads=getattr(text, "num_key_value_heads", None)
                                         or text.num_attention_heads)
        else:
            raise TypeError(f"sequence_parallel must be an SP size (int) or a SequenceParallel, got "
                            f"{type(setting).__name__}")
        if model is not None:
            sp.check_model(model)
        sp.check_collator(collator, dataset)
        return sp

    def _wants_dummies(self, dummy_media: bool | None, model, dataset) -> bool:
        if dummy_media is not None:
            if dummy_media and (model is None or not towers(model)):
                raise ValueError(f"dummy_media=True, but no registered family declares the towers of "
                                 f"{type(model).__name__}: declare them on its family (Family.towers, docs/families.md)")
            return dummy_media
        declared = bool(dataset is not None and dataset.manifest.config.get("modalities"))
        return self.args.world_size > 1 and declared and model is not None and bool(towers(model))

    # ------------------------------------------------------------------ data

    def sampler(self) -> TokenBalancedSampler | StepPlanSampler:
        """This rank's sampler (built once: its costs read every shard's row statistics)."""
        if self._sampler is None:
            args, setting = self.args, self._sampler_setting
            replicas, replica = _replicas(args, self.sp)  # every rank of an SP group reads the same rows
            world = dict(num_replicas=replicas, rank=replica, batch_size=args.per_device_train_batch_size)
            if isinstance(setting, (StepPlanSampler, TokenBalancedSampler)):
                self._sampler = check_sampler(setting, self.train_dataset, args, self.sp)
            elif setting == "token":
                self._sampler = TokenBalancedSampler(self.train_dataset, **world, seed=_data_seed(args),
                                                     drop_last=args.dataloader_drop_last, cost=self.cost,
                                                     window=WINDOW if self.window is None else self.window)
            elif setting == "plan":
                self._sampler = StepPlanSampler(self.train_dataset, **world, seed=_data_seed(args),
                                                drop_last=args.dataloader_drop_last, cost=self.cost, window=self.window)
            else:
                if args.dataloader_drop_last:  # the plan's last step is completed, not dropped: refused, not ignored
                    raise ValueError(f"dataloader_drop_last=True, but the step plan {setting} trains every row each epoch "
                                     f"(its last step completed from the epoch's start): set dataloader_drop_last=False "
                                     f"to follow it, or sampler='plan' to plan each epoch here without the partial step")
                plan = StepPlanSampler(self.train_dataset, **world, plan=setting, cost=self.cost, window=self.window,
                                       accumulation=_plan_accumulation(setting))
                self._sampler = check_sampler(plan, self.train_dataset, args, self.sp)
        return self._sampler

    def get_train_dataloader(self) -> PackedLoader:
        if self.train_dataset is None:
            raise ValueError("PackedTrainer: training requires a train_dataset")
        args, sampler = self.args, self.sampler()
        workers = args.dataloader_num_workers
        extra = {"prefetch_factor": args.dataloader_prefetch_factor, "persistent_workers": args.dataloader_persistent_workers,
                 "multiprocessing_context": args.dataloader_multiprocessing_context} if workers else {}
        return PackedLoader(self.train_dataset, batch_sampler=Batches(sampler, sampler.batch_size, drop_last=False),
                            collate_fn=self.data_collator, num_workers=workers, pin_memory=args.dataloader_pin_memory,
                            **extra)

    def _get_collator_with_removed_columns(self, data_collator, description=None):
        return data_collator  # packed rows are not model inputs: the collator builds those

    # ------------------------------------------------------------------ loss

    def get_batch_samples(self, epoch_iterator, num_batches: int, device) -> tuple[list, torch.Tensor | None]:
        """The step's micro-batches and the global sum of their loss weights (every data-parallel replica, once:
        :class:`StepNorm`)."""
        batches = []
        for _ in range(num_batches):
            try:
                batches.append(next(epoch_iterator))
            except StopIteration:
                break
        if not batches:
            return batches, None
        return batches, StepNorm(batches, sp=self.sp, device=device).value

    def compute_loss(self, model, inputs: dict[str, Any], return_outputs: bool = False, num_items_in_batch=None):
        """``sum(w * ce)`` over this micro-batch (under SP: this rank's slice) / the step's global ``sum(w)`` x world
        size; without the step's sum (evaluation) the micro-batch's own weighted mean (refused under SP)."""
        if self.sp is not None:
            inputs, outputs = self._sp_forward(model, inputs)
        else:
            outputs = model(**model_inputs(inputs, self.model))  # the unwrapped model: its towers and attention judged
        total, local = packed_loss(outputs.logits, inputs, reduce=False)
        if num_items_in_batch is None:
            if self.sp is not None:
                raise ValueError(_SP_EVAL)
            loss = total / local.clamp(min=torch.finfo(local.dtype).tiny)
        else:
            norm = torch.as_tensor(num_items_in_batch, dtype=total.dtype, device=total.device)
            loss = total * self.accelerator.num_processes / norm.clamp(min=torch.finfo(total.dtype).tiny)
        return (loss, outputs) if return_outputs else loss

    def evaluate(self, *args, **kwargs):
        if self.sp is not None:  # the Trainer's eval loader deals the world: an SP group's ranks would hold other rows
            raise ValueError(_SP_EVAL)
        return super().evaluate(*args, **kwargs)

    def _sp_forward(self, model, batch: dict[str, Any]) -> tuple[dict[str, Any], Any]:
        """This rank's slice of ``batch`` and the model's outputs on it; a batch with media through
        :func:`shared_encoders` (each item encoded on one rank of the group)."""
        local = self.sp.slice(batch, pad_token_id=self.data_collator.pad_token_id)
        if not batch.get("media") or not towers(self.model):
            return local, model(**self.sp.model_inputs(local, self.model))
        from packer.loader.sp_media import shared_encoders

        with shared_encoders(self.model, self.sp, batch, local) as media:
            return local, model(**media.inputs)

    # ------------------------------------------------------------------ checkpoints

    def sampler_state(self) -> dict[str, Any]:
        """The sampler that deals this run's rows and where the run stands in its epoch."""
        args, sampler = self.args, self.sampler()
        steps_per_update = math.ceil(sampler.steps / args.gradient_accumulation_steps) if sampler.steps else 1
        epoch, update = divmod(self.state.global_step, steps_per_update)
        batches = min(update * args.gradient_accumulation_steps, sampler.steps)
        kind = "token" if isinstance(sampler, TokenBalancedSampler) else "plan"
        if getattr(sampler, "file", None) is not None:  # a written plan: its rows, whatever its file is called
            kind = f"plan file {sampler.file.meta['build'][:12]}-seed{sampler.seed}-{sampler.file.meta['steps_per_epoch']}"
        return {"sampler": kind, "seed": sampler.seed, "num_replicas": sampler.num_replicas,
                "batch_size": sampler.batch_size, "rows": len(self.train_dataset), "window": sampler.window,
                "epoch": int(epoch), "consumed": int(batches * sampler.batch_size), "global_step": self.state.global_step}

    def _save_checkpoint(self, model, trial):
        super()._save_checkpoint(model, trial)
        if self.args.should_save and self.train_dataset is not None:
            folder = Path(self.args.output_dir) / f"checkpoint-{self.state.global_step}"
            folder.mkdir(parents=True, exist_ok=True)
            (folder / SAMPLER_STATE).write_text(json.dumps(self.sampler_state(), indent=2, sort_keys=True) + "\n")

    def train(self, resume_from_checkpoint: str | bool | None = None, *args, **kwargs):
        if resume_from_checkpoint:
            self.check_resume(resume_from_checkpoint)
        return super().train(resume_from_checkpoint, *args, **kwargs)

    def check_resume(self, checkpoint: str | bool) -> None:
        """Refuse a resume whose sampler would deal other rows than the run that saved ``checkpoint``."""
        if checkpoint is True:
            from transformers.trainer_utils import get_last_checkpoint

            checkpoint = get_last_checkpoint(self.args.output_dir)
            if checkpoint is None:
                return  # the Trainer says there is nothing to resume
        path = Path(checkpoint) / SAMPLER_STATE
        if not path.is_file() or self.train_dataset is None:
            return  # not a PackedTrainer checkpoint: the Trainer's own resume
        saved = {"sampler": "token", **json.loads(path.read_text())}  # a checkpoint from before the choice: token
        current = self.sampler_state()
        changed = [f"{k} {saved[k]} -> {current[k]}" for k in MATCHED if saved.get(k) != current[k]]
        if changed:
            raise ValueError(f"{checkpoint} was saved by a run whose sampler dealt other rows ({', '.join(changed)}): "
                             f"resuming would repeat some rows and skip others. Resume with the same seed, world size, "
                             f"per-device batch size and build, or start a new run from its weights")


def _sp_setting(args, setting):
    """``(args, SP setting)``: ``setting`` as given; else ``args.parallelism_config``'s ``sp_size`` or ``cp_size``
    (accelerate's ``ParallelismConfig``), which then leaves a copy of ``args`` -- the Trainer would hand it to
    DeepSpeed's Ulysses or torch's context parallel, and packer runs the SP itself."""
    config = getattr(args, "parallelism_config", None)
    if config is None:
        return args, setting
    size = max(getattr(config, "sp_size", 1) or 1, getattr(config, "cp_size", 1) or 1)
    if size == 1:
        return args, setting
    other = {k: getattr(config, k, 1) or 1 for k in ("dp_replicate_size", "dp_shard_size", "tp_size")}
    other = {k: v for k, v in other.items() if v > 1}
    if other:
        raise ValueError(f"args.parallelism_config sets {', '.join(f'{k}={v}' for k, v in other.items())} beside an "
                         f"SP size {size}: PackedTrainer makes the data-parallel x SP groups itself; give FSDP through "
                         f"TrainingArguments(fsdp=...) and only sp_size (or cp_size) in the ParallelismConfig")
    if setting is not None and setting != size and getattr(setting, "size", None) != size:
        raise ValueError(f"sequence_parallel={setting!r} but args.parallelism_config says SP size {size}: give one")
    args = copy.copy(args)
    args.parallelism_config = None
    return args, setting if setting is not None else size


def _plan_accumulation(path: str | Path) -> int:
    from packer.shards.step_plan import read_plan

    return int(read_plan(path).meta.get("accumulation", 1))


def _replicas(args, sp) -> tuple[int, int]:
    """The data-parallel replicas of the run and this rank's: the world's ranks, or its SP groups (consecutive ranks)."""
    size = sp.size if sp is not None else 1
    return args.world_size // size, args.process_index // size


def check_sampler(sampler, dataset, args, sp=None):
    """``sampler`` if it deals this run's rows: the data-parallel replicas (the world size, or its SP groups: every
    rank of a group the same rows), this rank's replica and batch size of ``args``, ``dataset``'s rows, a plan's
    accumulation equal to the run's, and (a plan file) as many epochs as the run trains; else refused."""
    replicas, replica = _replicas(args, sp)
    want = {"num_replicas": replicas, "rank": replica, "batch_size": args.per_device_train_batch_size,
            "rows": len(dataset)}
    have = {"num_replicas": sampler.num_replicas, "rank": sampler.rank, "batch_size": sampler.batch_size,
            "rows": sampler.rows if hasattr(sampler, "rows") else len(sampler.costs)}
    wrong = [f"{k} {have[k]} (this run: {want[k]})" for k in want if have[k] != want[k]]
    if wrong:
        made = ("num_replicas=args.world_size, rank=args.process_index" if sp is None else
                f"num_replicas=args.world_size // {sp.size}, rank=args.process_index // {sp.size} (the SP groups: every "
                f"rank of a group must read the same rows)")
        raise ValueError(f"the sampler was made for another run: {', '.join(wrong)}; make it with {made}, "
                         f"batch_size=args.per_device_train_batch_size over train_dataset, or pass sampler='token' / "
                         f"'plan' / a plan path")
    accumulation = getattr(sampler, "accumulation", 1)
    if accumulation != 1 and accumulation != args.gradient_accumulation_steps:
        raise ValueError(f"the step plan balances {accumulation} micro-steps together, this run accumulates "
                         f"gradient_accumulation_steps={args.gradient_accumulation_steps}: give the run the plan's, or "
                         f"write a plan with --accumulation {args.gradient_accumulation_steps}")
    if getattr(sampler, "file", None) is not None:
        updates = max(-(-sampler.steps // args.gradient_accumulation_steps), 1)  # the Trainer's updates an epoch
        epochs = -(-args.max_steps // updates) if args.max_steps > 0 else math.ceil(args.num_train_epochs)
        if epochs > sampler.file.epochs:
            need = (f"max_steps={args.max_steps}: {epochs} epochs of {updates} optimizer steps" if args.max_steps > 0
                    else f"num_train_epochs={args.num_train_epochs}")
            staged = (f", or stages up to step {args.max_steps * args.gradient_accumulation_steps}"
                      if sampler.file.meta.get("stages") and args.max_steps > 0 else "")
            raise ValueError(f"the step plan holds {sampler.file.epochs} epoch(s) of {sampler.steps} steps, the run trains "
                             f"more ({need}): write them (`packer steps OUT --epochs {epochs}`{staged}), or train fewer "
                             f"steps")
    return sampler


def _data_seed(args) -> int:
    return args.data_seed if getattr(args, "data_seed", None) is not None else args.seed
