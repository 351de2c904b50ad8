"""Sequence-parallel attention for HF models over packer's slices: Ulysses, zigzag ring, and both.

A :class:`SequenceParallel` holds the process groups; the user makes it once, on every rank::

    sp = SequenceParallel.create(size=4, mode="ring")            # the world cut into DP x SP groups
    model = AutoModelForCausalLM.from_config(config, attn_implementation=sp.attn_implementation)
    sp.check_model(model)
    for batch in loader:                                          # PackedCollator(attention=sp.collator_attention)
        local = sp.slice(batch)
        logits = model(**sp.model_inputs(local)).logits           # this rank's tokens
        total, _ = packed_loss(logits, local, reduce=False)       # divide by the step's global sum of weights

``sp.model_inputs(local)`` is :func:`~packer.loader.model_inputs` plus ``packer_sp``: a
:class:`SPStep` naming the groups and the batch's padded boundaries. transformers hands the
model's extra keyword arguments down to every attention call, so the attention functions
registered here (``packer_ulysses``, ``packer_ring``, ``packer_hybrid``) read the step there:
no global state, and a call without it is refused.

- ``ulysses``: all-to-all from sequence shards to head shards (``all_to_all_single``), the
  local kernel over the whole sequence with the batch's own mask (a bool mask: SDPA; an additive
  one: eager math; a ``BlockMask``: flex; a flattened ``varlen`` batch, no mask: a varlen kernel over
  the padded global ``cu_seqlens``, :func:`varlen_local`), all-to-all back. Key / value heads fewer than the group
  are replicated (each rank's query heads then share one), as DeepSpeed's Ulysses does.
- ``ring``: :mod:`packer.loader.ring_attention` on a flattened (``varlen``) batch's zigzag slices.
- ``hybrid`` (ms-swift's layout): Ulysses over ``u = gcd(kv_heads, size)`` consecutive ranks, ring over
  the ``size / u`` groups of them. The ring slice of a ring rank is cut in ``u`` contiguous pieces
  (its tail padded to a multiple of ``u``); after the all-to-all the ring runs on the ring slice.

Rank ``k`` of an SP group is ring rank ``k // u`` and Ulysses rank ``k % u`` (``u = size`` for
Ulysses, 1 for ring). Gradients of the parameters: sum them over the SP group (each rank's loss
reaches the others' activations through the collectives' backward).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from packer.loader.checks import SP_FORMS
from packer.loader.ring_attention import ring_attention, ring_layout
from packer.loader.sequence_parallel import shard_for_sequence_parallel
from packer.shards.schema import IGNORE

IMPLEMENTATIONS = {"ulysses": "packer_ulysses", "ring": "packer_ring", "hybrid": "packer_hybrid"}
COLLATOR = {mode: SP_FORMS[name] for mode, name in IMPLEMENTATIONS.items()}  # the collator forms each mode takes


@dataclass(frozen=True)
class SPStep:
    """What the attention functions need of one batch: the groups and the padded global boundaries."""

    sp: SequenceParallel
    cu_padded: torch.Tensor


def plan_groups(world: int, size: int, mode: str, ulysses: int | None = None) -> dict[str, list[list[int]]]:
    """The ranks of every SP, Ulysses and ring group of a world cut into ``world // size`` replicas of
    ``size`` consecutive ranks. Pure: raises on a size that does not divide the world."""
    if mode not in IMPLEMENTATIONS:
        raise ValueError(f"mode must be one of {', '.join(IMPLEMENTATIONS)}, got {mode!r}")
    if size < 1 or world % size:
        raise ValueError(f"the sequence-parallel size {size} does not divide the world size {world}: each data-parallel "
                         f"replica holds size ranks; use a size among {[d for d in range(1, world + 1) if world % d == 0]}")
    u = {"ulysses": size, "ring": 1}.get(mode, ulysses)
    if u is None or u < 1 or size % u:
        raise ValueError(f"hybrid needs a Ulysses size dividing the SP size {size}, got {ulysses}; pass "
                         f"ulysses=math.gcd(kv_heads, {size}) (SequenceParallel.create(..., kv_heads=...))")
    sp = [list(range(a, a + size)) for a in range(0, world, size)]
    return {"sp": sp, "ulysses": [g[i : i + u] for g in sp for i in range(0, size, u)],
            "ring": [g[i::u] for g in sp for i in range(u)]}


def check_heads(heads: int, kv_heads: int, ulysses: int) -> None:
    """Refuse a head layout the Ulysses all-to-all cannot split over ``ulysses`` ranks."""
    if heads % ulysses:
        raise ValueError(f"{heads} attention heads do not split over {ulysses} Ulysses ranks: use a Ulysses size that "
                         f"divides {heads} (mode='ring' needs none, or mode='hybrid' with ulysses=math.gcd(heads, size))")
    if kv_heads % ulysses and ulysses % kv_heads:
        raise ValueError(f"{kv_heads} key / value heads neither split over {ulysses} Ulysses ranks nor replicate onto "
                         f"them: use a Ulysses size that {kv_heads} divides or that divides {kv_heads} "
                         f"(mode='hybrid' with ulysses=math.gcd({kv_heads}, size))")


class SequenceParallel:
    """The sequence-parallel groups of this rank. ``group``: the SP group (None: the world);
    ``hybrid`` also takes this rank's ``ulysses_group`` and ``ring_group`` (:meth:`create` builds them)."""

    def __init__(self, group=None, mode: str = "ulysses", *, ulysses_group=None, ring_group=None):
        if mode not in IMPLEMENTATIONS:
            raise ValueError(f"mode must be one of {', '.join(IMPLEMENTATIONS)}, got {mode!r}")
        if mode == "hybrid" and (ulysses_group is None or ring_group is None):
            raise ValueError("mode='hybrid' needs ulysses_group and ring_group: use SequenceParallel.create(size, "
                             "mode='hybrid', kv_heads=...)")
        self.group, self.mode, self.dp_group = group, mode, None  # create() sets dp_group
        self.rank, self.size = dist.get_rank(group), dist.get_world_size(group)
        self.ulysses_group = group if mode == "ulysses" else ulysses_group
        self.ring_group = group if mode == "ring" else ring_group
        self.ulysses_size = {"ulysses": self.size, "ring": 1}.get(mode) or dist.get_world_size(ulysses_group)
        self.ring_size = self.size // self.ulysses_size
        self.ring_rank, self.ulysses_rank = divmod(self.rank, self.ulysses_size)
        if mode == "hybrid" and (dist.get_rank(ring_group) != self.ring_rank
                                 or dist.get_rank(ulysses_group) != self.ulysses_rank):
            raise ValueError("the hybrid groups do not match the layout: SP rank k must be rank k // u of its ring group "
                             "and k % u of its Ulysses group (u consecutive ranks); build them with SequenceParallel.create")
        register()

    @classmethod
    def create(cls, size: int, mode: str = "ulysses", *, ulysses: int | None = None, kv_heads: int | None = None):
        """Cut the world (initialised) into replicas of ``size`` consecutive ranks and return this rank's
        groups. Every rank must call it (new groups are collective). ``hybrid``: ``ulysses`` ranks, by default
        ``gcd(kv_heads, size)``. The data-parallel group (same SP rank across replicas) is ``.dp_group``."""
        if mode == "hybrid" and ulysses is None:
            if kv_heads is None:
                raise ValueError("mode='hybrid' needs ulysses= or kv_heads= (the Ulysses size is gcd(kv_heads, size))")
            ulysses = math.gcd(kv_heads, size)
        world, me = dist.get_world_size(), dist.get_rank()
        plan = plan_groups(world, size, mode, ulysses)
        mine = {}
        for kind in ("sp", "ulysses", "ring"):
            for ranks in plan[kind]:
                g = dist.new_group(ranks)  # collective: every rank creates every group
                if me in ranks:
                    mine[kind] = g
        dp = None
        for k in range(size):
            g = dist.new_group(list(range(k, world, size)))
            if me % size == k:
                dp = g
        sp = cls(mine["sp"], mode, ulysses_group=mine["ulysses"], ring_group=mine["ring"])
        sp.dp_group = dp
        return sp

    @property
    def attn_implementation(self) -> str:
        """The ``attn_implementation`` a model needs for this mode."""
        return IMPLEMENTATIONS[self.mode]

    @property
    def collator_attention(self) -> tuple[str, ...]:
        """The ``PackedCollator(attention=...)`` forms this mode takes."""
        return COLLATOR[self.mode]

    def check_model(self, model) -> None:
        """Refuse a model that would not run this SP attention in every layer."""
        from packer.loader.checks import implementation
        from packer.loader.isolation import stateful_layers

        impl = implementation(model)
        if impl != self.attn_implementation:
            raise ValueError(f"{type(model).__name__} runs attention {impl!r}, not the sequence-parallel "
                             f"{self.attn_implementation!r}: load it with attn_implementation="
                             f"{self.attn_implementation!r} (or model.set_attn_implementation(...))")
        text = model.config.get_text_config()
        linear = stateful_layers(model) or "linear_attention" in (getattr(text, "layer_types", None) or ())
        if linear:
            raise ValueError(f"{type(model).__name__} has linear-attention layers ({', '.join(linear) or 'linear_attention'}), "
                             "whose recurrence runs along the whole sequence, which no SP slice holds: train it "
                             "without sequence parallelism")
        heads = text.num_attention_heads
        check_heads(heads, getattr(text, "num_key_value_heads", None) or heads, self.ulysses_size)

    def check_collator(self, collator, ds=None) -> None:
        """Refuse, before the first batch, a collator (and ``ds``'s build) whose batches this mode cannot slice: another
        mask form; Ulysses over a ``BlockMask`` whose padded lengths (``pad_to``, ``pad_to_multiple_of``, the build's
        ``row_lengths``) are not multiples of the SP size; a ring over preference trees."""
        if collator.attention not in self.collator_attention:
            raise ValueError(f"{self.mode} attention takes a batch of PackedCollator(attention="
                             f"{' or '.join(map(repr, self.collator_attention))}), the collator gives attention="
                             f"{collator.attention!r}: build it with attention={self.collator_attention[0]!r} "
                             f"(PackedCollator.for_build(ds, model=model) follows the model's SP attention)")
        if self.mode == "ulysses" and collator.attention == "flex":
            lengths = collator.row_lengths or ([collator.pad_to] if collator.pad_to else [])
            step = collator.pad_to_multiple_of
            odd = [n for n in lengths if n % self.size and not (step and step % self.size == 0)]
            if odd or (not lengths and not (step and step % self.size == 0)):
                what = (f"row lengths {odd} (the build's --row-lengths or pad_to)" if odd else
                        f"rows padded to {'multiples of ' + str(step) if step else 'their own length'}")
                raise ValueError(f"Ulysses over a FlexAttention BlockMask slices rows whose length is a multiple of the "
                                 f"SP size {self.size}, but the collator gives {what}: pass PackedCollator(..., "
                                 f"pad_to_multiple_of={self.size}) (or a multiple of it; a build with row lengths: "
                                 f"rebuild with --row-lengths multiples of {self.size}), or attention='sdpa'")
        preference = ds.manifest.config.get("preference") if ds is not None and hasattr(ds, "manifest") else None
        if self.mode != "ulysses" and preference == "tree":
            raise ValueError(f"{self.mode} attention zigzags each segment over the ranks, but {ds.out} holds preference "
                             f"trees (--preference tree: a response attends to its prompt, another segment): use "
                             f"mode='ulysses' (attn_implementation='packer_ulysses'), or rebuild with --preference pairs")

    def slice(self, batch: dict[str, Any], *, pad_token_id: int = 0, rank: int | None = None) -> dict[str, Any]:
        """This rank's slice of a collated batch (:func:`~packer.loader.shard_for_sequence_parallel`); ``rank``: another
        SP rank's (what :mod:`packer.loader.sp_media` reads to send each rank its encoder rows)."""
        from packer.loader.checks import attention_form

        form = attention_form(batch)
        if form not in COLLATOR[self.mode]:
            raise ValueError(f"{self.mode} attention takes a batch from PackedCollator(attention="
                             f"{' or '.join(map(repr, COLLATOR[self.mode]))}), got one of attention={form!r}: build the "
                             f"collator with attention={COLLATOR[self.mode][0]!r}")
        rank = self.rank if rank is None else rank
        if not 0 <= rank < self.size:
            raise ValueError(f"rank {rank} is not an SP rank of this group of {self.size}: give one in [0, {self.size})")
        if self.mode == "ulysses":
            return shard_for_sequence_parallel(batch, rank, self.size, mode="ulysses", pad_token_id=pad_token_id)
        ring_rank, ulysses_rank = divmod(rank, self.ulysses_size)
        local = shard_for_sequence_parallel(batch, ring_rank, self.ring_size, mode="ring", pad_token_id=pad_token_id)
        return local if self.mode == "ring" else _cut(local, ulysses_rank, self.ulysses_size, pad_token_id)

    def model_inputs(self, local: dict[str, Any], model=None) -> dict[str, Any]:
        """:func:`~packer.loader.model_inputs` of a slice, with the ``packer_sp`` step; refuses a slice made for
        another mode, rank or size (and, given ``model``, one that would not run this attention)."""
        from packer.loader.collate import model_inputs

        if model is not None:
            self.check_model(model)
        cu_padded = local["cu_seqlens_padded"].to(torch.int64)
        expected = self.expected_index(cu_padded, local["input_ids"].shape[-1])
        got = local["global_index"]
        if expected is None or got.shape != expected.shape or not torch.equal(got, expected):
            raise ValueError(f"the slice's tokens (global_index {_brief(got)}) are not rank {self.rank}'s of a {self.mode} "
                             f"slice over {self.size} ranks (expected {_brief(expected)}): slice the batch with "
                             f"sp.slice(batch), not another mode, rank or size")
        return {**model_inputs(local), "packer_sp": SPStep(self, cu_padded)}

    def expected_index(self, cu_padded: torch.Tensor, length: int) -> torch.Tensor | None:
        """The ``global_index`` of this rank's slice of a batch with these padded boundaries, or None."""
        if self.mode == "ulysses":
            return torch.arange(self.rank * length, (self.rank + 1) * length)
        try:
            index, _ = ring_layout(cu_padded, self.ring_rank, self.ring_size)
        except ValueError:
            return None
        if self.mode == "ring":
            return index
        return _pad_cut(index, self.ulysses_rank, self.ulysses_size, -1)


def _brief(t: torch.Tensor | None) -> str:
    if t is None:
        return "none (the boundaries do not fit this mode)"
    values = t.tolist()
    return str(values) if len(values) <= 8 else f"[{', '.join(map(str, values[:6]))}, ... {len(values)} tokens]"


def _pad_cut(t: torch.Tensor, rank: int, size: int, value) -> torch.Tensor:
    """Piece ``rank`` of ``size`` contiguous pieces of ``t``'s last axis, its tail padded with ``value``."""
    length = t.shape[-1]
    chunk = -(-length // size)
    t = torch.nn.functional.pad(t, (0, chunk * size - length), value=value)
    return t[..., rank * chunk : (rank + 1) * chunk]


PADS = {"input_ids": None, "labels": IGNORE, "shift_labels": IGNORE, "shift_loss_weights": 0.0, "position_ids": 0,
        "global_index": -1}


def _cut(local: dict[str, Any], rank: int, size: int, pad_token_id: int) -> dict[str, Any]:
    """A ring slice cut in ``size`` contiguous pieces for the Ulysses ranks of a hybrid group: this rank's."""
    length = local["input_ids"].shape[-1]
    chunk = -(-length // size)
    lo, hi = rank * chunk, (rank + 1) * chunk
    out = dict(local)
    for key, value in local.items():
        if isinstance(value, torch.Tensor) and value.shape[-1:] == (length,) and not key.startswith("cu_seqlens"):
            pad = PADS.get(key, 0)
            pad = pad_token_id if key == "input_ids" else int(value.max()) + 1 if key == "seq_idx" else pad
            out[key] = _pad_cut(value, rank, size, pad)
    ring_cu = local["cu_seqlens_local"].to(torch.int64)
    out["cu_seqlens_local"] = (torch.unique(torch.clamp(torch.cat([ring_cu, torch.tensor([chunk * size])]), lo, hi))
                               - lo).to(torch.int32)
    out["max_seqlen_local"] = int(out["cu_seqlens_local"].diff().max()) if out["cu_seqlens_local"].numel() > 1 else 0
    pieces = []
    for p in local.get("media", []):
        a, b = max(p["start"], lo), min(p["start"] + p["length"], hi)
        if a < b:
            pieces.append({**p, "start": a - lo, "length": b - a, "offset": p["offset"] + a - p["start"]})
    out["media"] = pieces
    if "mm_token_type_ids" in out:
        out["visual_pos_masks"] = (out["mm_token_type_ids"] == 1) | (out["mm_token_type_ids"] == 2)
    return out


class _AllToAll(torch.autograd.Function):
    """Equal splits along dim 0 swapped over the group; its own inverse, so the backward is the same exchange."""

    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        x = x.contiguous()  # empty_like keeps a view's strides, and the exchange writes memory in order
        out = torch.empty_like(x)
        dist.all_to_all_single(out, x, group=group)
        return out

    @staticmethod
    def backward(ctx, grad):
        grad = grad.contiguous()
        out = torch.empty_like(grad)
        dist.all_to_all_single(out, grad, group=ctx.group)
        return out, None


def _seq_to_heads(x: torch.Tensor, group, n: int) -> torch.Tensor:
    """``[B, H, L/n, D]`` (this rank's tokens, every head) -> ``[B, H/n, L, D]`` (every token, this rank's heads)."""
    b, h, length, d = x.shape
    x = x.permute(1, 0, 2, 3).reshape(n, h // n, b, length, d)
    x = _AllToAll.apply(x, group)  # dim 0 now: the sequence pieces of my heads
    return x.permute(2, 1, 0, 3, 4).reshape(b, h // n, n * length, d)


def _heads_to_seq(x: torch.Tensor, group, n: int) -> torch.Tensor:
    """The inverse of :func:`_seq_to_heads`."""
    b, h, length, d = x.shape
    x = x.reshape(b, h, n, length // n, d).permute(2, 1, 0, 3, 4).contiguous()
    x = _AllToAll.apply(x, group)  # dim 0 now: the head groups of my tokens
    return x.reshape(n * h, b, length // n, d).permute(1, 0, 2, 3)


def _replicate(kv: torch.Tensor, n: int) -> torch.Tensor:
    """Key / value heads fewer than the Ulysses ranks: each repeated so that every rank gets the one its
    query heads read."""
    heads = kv.shape[1]
    return kv if heads % n == 0 else kv.repeat_interleave(n // heads, dim=1)


def _local(query, key, value, mask, scale: float, cu_padded: torch.Tensor) -> torch.Tensor:
    """Attention over the whole sequence with the batch's mask (none: a flattened ``varlen`` batch, its
    padded boundaries ``cu_padded``): ``[B, H, L, D]`` -> ``[B, H, L, D]``."""
    group = query.shape[1] // key.shape[1]
    if mask is None:
        return varlen_local(query, key, value, cu_padded, scale)
    if not isinstance(mask, torch.Tensor):  # a FlexAttention BlockMask
        from torch.nn.attention.flex_attention import flex_attention

        return flex_attention(query, key, value, block_mask=mask, scale=scale, enable_gqa=group > 1)
    key, value = key.repeat_interleave(group, dim=1), value.repeat_interleave(group, dim=1)
    if mask.dtype == torch.bool:
        return torch.nn.functional.scaled_dot_product_attention(query, key, value, attn_mask=mask, scale=scale)
    weights = torch.matmul(query, key.transpose(2, 3)) * scale + mask  # eager: the additive mask, as transformers adds it
    return torch.matmul(torch.softmax(weights, dim=-1, dtype=torch.float32).to(query.dtype), value)


def varlen_local(query, key, value, cu_padded: torch.Tensor, scale: float) -> torch.Tensor:
    """Causal attention within each segment of a flattened batch, ``query [1, H, T, D]``, ``key`` / ``value
    [1, Hkv, T, D]`` (``H`` a multiple of ``Hkv``), segments bounded by ``cu_padded`` (the SP padding is one
    more segment) -> ``[1, H, T, D]``. The kernel, by what is there: on CUDA in bf16 / fp16, flash-attn's
    ``flash_attn_varlen_func`` where installed (grouped heads as given), else torch's
    ``torch.nn.attention.varlen.varlen_attn`` (key / value heads repeated to the query heads); otherwise (CPU,
    float32) SDPA with the block-diagonal causal mask ``cu_padded`` implies -- exact, and dense: ``T x T``."""
    if query.shape[0] != 1:
        raise ValueError(f"Ulysses over a varlen batch takes one flattened row, got {query.shape[0]} rows: build the "
                         f"collator with PackedCollator(attention='varlen') (or a masked form: 'sdpa', 'eager', 'flex')")
    total = query.shape[2]
    if int(cu_padded[-1]) != total:
        raise ValueError(f"the batch's padded boundaries end at {int(cu_padded[-1])}, but the sequence after the "
                         f"all-to-all holds {total} tokens: slice the batch with sp.slice and pass sp.model_inputs(local)")
    group = query.shape[1] // key.shape[1]
    if query.is_cuda and query.dtype in (torch.bfloat16, torch.float16):
        cu = cu_padded.to(device=query.device, dtype=torch.int32)
        longest = int(cu_padded.diff().max())
        q, k, v = (x[0].transpose(0, 1).contiguous() for x in (query, key, value))  # [T, H, D]
        try:
            from flash_attn import flash_attn_varlen_func
        except ImportError:
            from torch.nn.attention.varlen import varlen_attn

            k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
            out = varlen_attn(q, k, v, cu, cu, longest, longest, scale=scale, window_size=(-1, 0))
        else:
            out = flash_attn_varlen_func(q, k, v, cu, cu, longest, longest, softmax_scale=scale, causal=True)
        return out.transpose(0, 1)[None]
    segment = torch.bucketize(torch.arange(total, device=query.device), cu_padded.to(query.device), right=True)
    mask = (segment[:, None] == segment[None, :]) & torch.ones(total, total, dtype=torch.bool, device=query.device).tril()
    key, value = key.repeat_interleave(group, dim=1), value.repeat_interleave(group, dim=1)
    return torch.nn.functional.scaled_dot_product_attention(query, key, value, attn_mask=mask, scale=scale)


def _step(kwargs: dict[str, Any], mode: str) -> SPStep:
    step = kwargs.get("packer_sp")
    if not isinstance(step, SPStep):
        raise ValueError(f"attention {IMPLEMENTATIONS[mode]!r} was called without packer_sp: run the model on "
                         f"model(**sp.model_inputs(sp.slice(batch))) of a SequenceParallel(mode={mode!r})")
    if step.sp.mode != mode:
        raise ValueError(f"the model runs {IMPLEMENTATIONS[mode]!r} but the batch was sliced for "
                         f"{step.sp.attn_implementation!r}: load the model with attn_implementation="
                         f"{step.sp.attn_implementation!r} or slice with SequenceParallel(mode={mode!r})")
    return step


def _refuse(module, dropout: float, kwargs: dict[str, Any]) -> None:
    if dropout:
        raise ValueError(f"attention dropout {dropout} under sequence parallelism: set the config's attention_dropout to 0")
    if kwargs.get("sliding_window") or getattr(module, "sliding_window", None):
        raise ValueError("sliding-window attention under packer's sequence parallelism is not supported: train "
                         "without SP, or with a model whose layers attend fully")


def _attention(mode: str):
    def attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
        if getattr(module, "is_causal", True) is False:  # an encoder's layer: its tokens are not this rank's slice
            raise ValueError(f"{type(module).__name__} (not causal: an encoder's attention) runs "
                             f"{IMPLEMENTATIONS[mode]!r}, which is for the language model's layers only: set it there, "
                             f"model.set_attn_implementation({{'text_config': {IMPLEMENTATIONS[mode]!r}, "
                             f"'vision_config': 'sdpa'}}) (the encoder's own sub-config names)")
        step = _step(kwargs, mode)
        _refuse(module, dropout, kwargs)
        sp = step.sp
        scale = scaling if scaling is not None else query.shape[-1] ** -0.5
        n = sp.ulysses_size
        if n > 1:
            check_heads(query.shape[1], key.shape[1], n)
            key, value = _replicate(key, n), _replicate(value, n)
            query, key, value = (_seq_to_heads(x, sp.ulysses_group, n) for x in (query, key, value))
        if mode == "ulysses":
            out = _local(query, key, value, attention_mask, scale, step.cu_padded)
        else:
            ring_length = ring_layout(step.cu_padded, sp.ring_rank, sp.ring_size)[0].numel()
            out = ring_attention(query[:, :, :ring_length], key[:, :, :ring_length], value[:, :, :ring_length],
                                 step.cu_padded, sp.ring_group, sp.ring_rank, sp.ring_size, scale)
            out = torch.nn.functional.pad(out, (0, 0, 0, query.shape[2] - ring_length))  # the cut's tail padding
        if n > 1:
            out = _heads_to_seq(out, sp.ulysses_group, n)
        return out.transpose(1, 2).contiguous(), None

    attention.__name__ = f"{IMPLEMENTATIONS[mode]}_attention"
    return attention


def register() -> None:
    """Register ``packer_ulysses``, ``packer_ring`` and ``packer_hybrid`` with transformers' AttentionInterface."""
    from transformers import AttentionInterface

    for mode, name in IMPLEMENTATIONS.items():
        AttentionInterface.register(name, _attention(mode))
