"""Per-token loss weights that make a packed batch's loss equal the unpacked one.

With ``w`` from :func:`loss_weights` and per-token cross-entropy ``l`` (targets shifted
as the model shifts them), ``sum(w * l) / sum(w)`` is:

- ``token``:  the mean over all trained tokens (what unpacked training with a global
  token mean computes);
- ``sample``: the mean over samples of each sample's mean token loss (w = 1 / n_i for
  the n_i trained tokens of sample i, so sum(w) is the number of samples);
- ``sqrt``:   InternVL's square-root averaging (w = 1 / sqrt(n_i)).

Exact across gradient accumulation and data-parallel ranks: accumulate ``sum(w * l)``
over the micro-batches of a step and divide by the step's *global* ``sum(w)`` -- all-
reduce it (one scalar) before the backward passes, or compute it from the sampler's
batch ahead of time -- never by each micro-batch's own sum. :class:`StepNorm` does that once per step,
sequence parallelism included (its ranks hold one batch: the sum runs over the data-parallel replicas)::

    step = StepNorm(batches, sp=sp, scale=world)       # the step's micro-batches (unsliced), one all-reduce
    for batch in batches:
        local = sp.slice(batch)
        step.loss(model(**sp.model_inputs(local)).logits, local).backward()
    step.reported()                                    # the step's loss, the unsliced one, on every rank
"""

from __future__ import annotations

import torch

from packer.shards.schema import IGNORE


def loss_weights(labels: torch.Tensor, segment: torch.Tensor, kind: str, counts: torch.Tensor | None = None) -> torch.Tensor:
    """``[B, L]`` float32 weights aligned with ``labels`` (unshifted: the weight of
    target ``labels[b, t]``); 0 wherever the label is -100. ``counts[b, s]``: the
    supervised tokens of segment ``s`` of row ``b`` as the shards store them
    (``segment_trained``); counted from ``labels`` when not given."""
    trained = labels != IGNORE
    w = trained.to(torch.float32)
    if kind == "token":
        return w
    if counts is not None:
        per_token = torch.gather(counts.to(torch.float32), 1, segment).clamp(min=1)
    else:
        n_segments = int(segment.max()) + 1 if segment.numel() else 1
        flat = segment + torch.arange(segment.shape[0])[:, None] * n_segments  # distinct per row
        counted = torch.bincount(flat[trained], minlength=segment.shape[0] * n_segments).to(torch.float32)
        per_token = counted[flat].clamp(min=1)
    return w / (per_token if kind == "sample" else per_token.sqrt())


def loss_norm(batch: dict) -> torch.Tensor:
    """The batch's ``sum(w)`` over the targets :func:`packed_loss` scores: a micro-batch's share
    of the step's denominator (all-reduce it over ranks and add it over accumulation steps)."""
    if "shift_loss_weights" in batch:
        return batch["shift_loss_weights"].sum()
    return batch["loss_weights"][..., 1:].sum()


def packed_loss(logits: torch.Tensor, batch: dict, *, reduce: bool = True):
    """Weighted next-token cross-entropy of a packed batch.

    ``reduce=True`` returns ``sum(w * l) / sum(w)``; ``False`` returns the pair
    ``(sum(w * l), sum(w))`` for an exact reduction over micro-batches or ranks. Uses
    ``shift_labels`` / ``shift_loss_weights`` when the batch has them (sequence
    parallel slices), else shifts ``labels`` / ``loss_weights`` itself.
    """
    if "shift_labels" in batch:
        targets, weights = batch["shift_labels"], batch["shift_loss_weights"]
    else:
        targets = torch.nn.functional.pad(batch["labels"][..., 1:], (0, 1), value=IGNORE)
        weights = torch.nn.functional.pad(batch["loss_weights"][..., 1:], (0, 1), value=0.0)
    per_token = torch.nn.functional.cross_entropy(
        logits.float().reshape(-1, logits.shape[-1]), targets.reshape(-1).to(logits.device),
        ignore_index=IGNORE, reduction="none")
    total = (per_token * weights.reshape(-1).to(per_token.device)).sum()
    norm = weights.sum().to(total.device)
    return total / norm.clamp(min=torch.finfo(norm.dtype).tiny) if reduce else (total, norm)


class StepNorm:
    """One optimizer step's denominator: the ``sum(w)`` of every micro-batch of the step on every data-parallel
    replica, all-reduced ONCE when made; and the step's reported loss.

    ``batches``: this rank's micro-batches of the step, unsliced (:func:`loss_norm` of each). ``sp``: a
    :class:`~packer.loader.SequenceParallel`; the ranks of an SP group hold the same batches, so the sum runs over
    ``sp.dp_group`` (one rank a group; a world sum would count each batch ``sp.size`` times), or over the world
    divided by ``sp.size`` where the groups were not made by ``create``. Without ``sp``: the world (when
    ``torch.distributed`` runs), else this process. ``scale``: the world size where DDP / FSDP average the gradients
    over the ranks (then :meth:`loss` x world, averaged, is the sum), 1 where the loop sums them itself.

    :meth:`loss` of a micro-batch (or its slice) is ``sum(w * l) x scale / norm``: its backward, summed over the
    micro-batches and every rank, is the gradient of the step's loss as one unsliced batch. :meth:`reported` sums
    the micro-batches' ``sum(w * l)`` over every rank (one all-reduce: the slices of a batch partition its targets,
    so each target counts once) over ``norm``: the same value on every rank, the unsliced loss.
    """

    def __init__(self, batches, *, sp=None, scale: float = 1.0, device=None):
        import torch.distributed as dist

        self.sp, self.scale = sp, scale
        self.distributed = dist.is_available() and dist.is_initialized()
        norm = sum((loss_norm(b).to(torch.float64) for b in batches), torch.zeros((), dtype=torch.float64))
        norm = norm.to(device) if device is not None else norm
        if self.distributed:
            group = getattr(sp, "dp_group", None) if sp is not None else None
            dist.all_reduce(norm, group=group)
            if sp is not None and group is None:
                norm = norm / sp.size  # every rank of an SP group added its (same) batches
        self.value = norm
        self._total = torch.zeros((), dtype=torch.float64, device=norm.device)

    def loss(self, logits: torch.Tensor, batch: dict) -> torch.Tensor:
        """This micro-batch's (or slice's) ``sum(w * l)`` x ``scale`` / the step's ``sum(w)``, to backward."""
        total, _ = packed_loss(logits, batch, reduce=False)
        self._total = self._total + total.detach().to(self._total)
        return total * self.scale / self.value.to(total).clamp(min=torch.finfo(total.dtype).tiny)

    def reported(self) -> float:
        """The step's loss over every rank's targets (one all-reduce: call it on every rank, after the step's
        :meth:`loss` calls): what one process computes on the unsliced batches of every replica."""
        import torch.distributed as dist

        total = self._total.clone()
        if self.distributed:
            dist.all_reduce(total)
        return float(total / self.value.clamp(min=torch.finfo(self.value.dtype).tiny))
