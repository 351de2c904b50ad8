"""Per-response log-probabilities of a packed preference batch, and the DPO loss over them.

    batch = collate(rows)                                   # pairs or tree rows of a --preference build
    policy = packed_logps(model(**model_inputs(batch)).logits, batch)
    with torch.no_grad():
        reference = packed_logps(ref_model(**model_inputs(batch)).logits, batch)
    loss = dpo_loss(policy, reference, beta=0.1)

A response's log-probability is the sum over its trained tokens of ``log p(token | what it
follows)``, read from the logits at the position before each token (the HF shift). In a tree,
a response's first trained token is predicted inside its own branch (the branch starts with
the last token the responses share, :mod:`packer.encode.preference`), so every response's
sum comes from its own segment, in either layout, and equals the record's prompt + response
run alone (``tests/test_preference_equivalence.py``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from packer.shards.schema import IGNORE


@dataclass
class ResponseLogps:
    """One entry per response of the batch (``batch["responses"]``, in order).

    ``sum``: the summed log-probability of its trained tokens; ``mean``: ``sum / tokens``; ``tokens``:
    how many; ``record``: its record's display id; ``role``: ``chosen`` / ``rejected`` /
    ``desirable`` / ``undesirable`` / ``"0"``, ``"1"``, ...; ``weight``: its reward / weight (NaN: none);
    ``key``: (row, group) -- the responses of one record share it."""

    sum: torch.Tensor
    mean: torch.Tensor
    tokens: torch.Tensor
    record: list[str]
    role: list[str]
    weight: torch.Tensor
    key: list[tuple[int, int]]

    def __len__(self) -> int:
        return len(self.role)

    def pairs(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Indices ``(chosen, rejected)`` of each record's ``chosen`` / ``rejected`` responses, in batch order."""
        chosen: dict[tuple[int, int], int] = {}
        rejected: dict[tuple[int, int], int] = {}
        for i, (key, role) in enumerate(zip(self.key, self.role, strict=True)):
            if role in ("chosen", "rejected"):
                found = chosen if role == "chosen" else rejected
                if key in found:
                    raise ValueError(f"record {self.record[i]!r} has two {role} responses in one group")
                found[key] = i
        if set(chosen) != set(rejected):
            alone = sorted(set(chosen) ^ set(rejected))[0]
            raise ValueError(f"a record in row {alone[0]} (group {alone[1]}) has a chosen response without a rejected one "
                             f"or the reverse: its segments were not packed together")
        keys = sorted(chosen, key=lambda k: chosen[k])
        return torch.tensor([chosen[k] for k in keys], dtype=torch.long), torch.tensor([rejected[k] for k in keys],
                                                                                       dtype=torch.long)


def token_logps(logits: torch.Tensor, batch: dict[str, Any]) -> torch.Tensor:
    """``[B, L]``: at position ``t`` the log-probability of its target (``labels[t + 1]``, or ``shift_labels[t]``),
    0 where the target is not trained. float64 logits stay float64; others are computed in float32."""
    targets = batch["shift_labels"] if "shift_labels" in batch else \
        torch.nn.functional.pad(batch["labels"][..., 1:], (0, 1), value=IGNORE)
    targets = targets.to(logits.device)
    work = logits if logits.dtype == torch.float64 else logits.float()
    trained = targets != IGNORE
    picked = work.gather(-1, targets.clamp(min=0).unsqueeze(-1)).squeeze(-1)
    return (picked - work.logsumexp(-1)) * trained


def packed_logps(logits: torch.Tensor, batch: dict[str, Any]) -> ResponseLogps:
    """Each response's summed and mean log-probability (differentiable through ``logits``), with its record,
    role and weight. ``logits`` ``[B, L, V]`` from ``model(**model_inputs(batch))``; ``batch`` from
    :class:`~packer.loader.PackedCollator` over rows of a ``--preference`` build (``batch["responses"]``)."""
    responses = batch.get("responses")
    if responses is None:
        raise ValueError("the batch lists no responses: collate rows of a build made with --preference pairs or tree")
    per_token = token_logps(logits, batch)
    n = len(responses)
    index = torch.full(per_token.shape, n, dtype=torch.long, device=per_token.device)
    for i, r in enumerate(responses):
        index[r["batch"], r["start"] : r["end"] - 1] = i  # targets inside the response's own segment
    sums = torch.zeros(n + 1, dtype=per_token.dtype, device=per_token.device).index_add(0, index.flatten(),
                                                                                       per_token.flatten())[:n]
    targets = batch["shift_labels"] if "shift_labels" in batch else \
        torch.nn.functional.pad(batch["labels"][..., 1:], (0, 1), value=IGNORE)
    trained = (targets.to(per_token.device) != IGNORE).to(per_token.dtype)
    tokens = torch.zeros(n + 1, dtype=per_token.dtype, device=per_token.device).index_add(0, index.flatten(),
                                                                                         trained.flatten())[:n]
    weight = torch.tensor([r["weight"] for r in responses], dtype=torch.float32)
    return ResponseLogps(sums, sums / tokens.clamp(min=1), tokens.long(), [r["id"] for r in responses],
                         [r["role"] for r in responses], weight, [(r["batch"], r["group"]) for r in responses])


def all_reduce_logps(part: ResponseLogps, group=None) -> ResponseLogps:
    """Under Ulysses sequence parallelism: each rank's :func:`packed_logps` of its slice (its local logits and
    local batch, whose ``responses`` hold the targets on that rank) summed over the SP ``group``, differentiably
    (``torch.distributed.nn.all_reduce``): every rank then holds each response's whole sum, tokens and mean."""
    import torch.distributed as dist
    import torch.distributed.nn as dist_nn

    total = dist_nn.all_reduce(part.sum, group=group)
    tokens = part.tokens.clone()  # counts: no gradient, summed exactly
    dist.all_reduce(tokens, group=group)
    return ResponseLogps(total, total / tokens.clamp(min=1).to(total.dtype), tokens, part.record, part.role,
                         part.weight, part.key)


def dpo_loss(policy: ResponseLogps, reference: ResponseLogps | torch.Tensor, *, beta: float = 0.1,
             label_smoothing: float = 0.0, reduce: bool = True):
    """The DPO loss (sigmoid, TRL's default ``loss_type``; ``label_smoothing`` as TRL's conservative DPO) over the
    batch's chosen / rejected pairs: ``-log sigmoid(beta * ((pi_c - ref_c) - (pi_r - ref_r)))``, summed log-probs.

    ``reference`` is :func:`packed_logps` of the reference model on the same batch, or its ``sum`` tensor
    (precomputed). ``reduce=True``: the mean over pairs; ``False``: ``(sum over pairs, number of pairs)``, to
    divide by a step's pairs across micro-batches and ranks."""
    ref = reference.sum if isinstance(reference, ResponseLogps) else reference
    chosen, rejected = policy.pairs()
    if not len(chosen):
        raise ValueError("the batch holds no chosen / rejected pair")
    ref = ref.to(policy.sum.device, policy.sum.dtype)
    margin = (policy.sum[chosen] - ref[chosen]) - (policy.sum[rejected] - ref[rejected])
    losses = -torch.nn.functional.logsigmoid(beta * margin) * (1 - label_smoothing) \
        - torch.nn.functional.logsigmoid(-beta * margin) * label_smoothing
    return losses.mean() if reduce else (losses.sum(), len(losses))
