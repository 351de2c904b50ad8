"""The encoders' work shared across a sequence-parallel group: each media item encoded once, rows sent where needed.

Every rank of an SP group holds the same batch and its own slice of the tokens. Without this module every
rank runs the vision / audio towers on the whole batch and keeps the rows of its own placeholders
(``local_media_rows``): with SP 4 each image is encoded four times. Here each media unit (an image, a
video's frame group, an audio clip) is given to ONE rank, balanced by its encoder cost (largest first, onto the least
loaded rank; the build's :class:`~packer.cost.CostModel`), encoded there, and one ``all_to_all_single`` per kind (split
sizes: gloo and NCCL have it) sends every rank exactly the rows its pieces take, in its local token order.

A video of grid ``(t, h, w)`` is ``t`` units of grid ``(1, h, w)`` for the towers of :data:`FRAME_GROUP_TOWERS`
(Qwen2-VL, Qwen2.5-VL, Qwen3-VL, the Qwen2.5-Omni / Qwen3-Omni thinkers): transformers builds their vision
attention's ``cu_seqlens`` per frame group (``get_vision_cu_seqlens``, ``merge_temporal=False``), their rotary
positions and interpolated position embeddings from ``(h, w)`` repeated ``t`` times, Qwen2.5-VL's windows within a
frame group, and the patch merger and DeepStack mergers take four rows of one frame group: the rows of ``t`` separate
frame groups, concatenated, are the video's rows (tested, to the bit on CPU). Another model's video stays one unit.
The exchange is its own autograd function: the gradient of a row goes back to the rank that encoded it.
DeepStack features (Qwen3-VL, Qwen3-Omni) travel beside the rows, in the same exchange.

Worked example, SP 2 (Ulysses, 2 ranks of 6 tokens), image A (4 rows, cost 9) and image B (2 rows, cost 4)::

    tokens     t A A A | A t B B t t t t         A -> rank 0 (the costlier), B -> rank 1
    rank 0 encodes A (rows a0..a3): keeps a0 a1 a2, sends a3 to rank 1
    rank 1 encodes B (rows b0 b1):  keeps b0 b1,    sends nothing
    rank 1 scatters a3 b0 b1 on its placeholders A B B (its local order)

The model runs its own forward: :func:`shared_encoders` stands in for its ``get_{image,video,audio}_features``
for one call (each rank's tower runs inside the model's forward, in the model's order: FSDP's and DDP's
collectives stay in step), and a rank given no item of a kind runs the tower on the model's dummy item
(:mod:`packer.loader.dummy`) whose rows it keeps none of, so every parameter takes part (its gradient 0)::

    local = sp.slice(batch)
    with shared_encoders(model, sp, batch, local) as media:       # media.inputs: sp.model_inputs(local) + media
        logits = model(**media.inputs).logits

``frames=False`` keeps each video whole. ``split=False`` keeps the replicated encoding (every rank encodes everything,
keeps its rows): the reference the split equals, and the fallback for a model whose encoder outputs depend on the
other items of the batch.
Supported: models whose forward calls ``get_image_features(pixel_values, image_grid_thw)``,
``get_video_features(pixel_values_videos, video_grid_thw)``, ``get_audio_features(input_features,
feature_attention_mask)`` (Qwen2-VL, Qwen2.5-VL, Qwen3-VL, Qwen2.5-Omni / Qwen3-Omni thinkers) or take one row of
``pixel_values`` per image; a model that calls none of them is refused when its forward ends.
"""

from __future__ import annotations

import contextlib
import functools
import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from packer.loader.sequence_parallel import local_media_rows
from packer.modeling.spans import span_runs

# per kind: the model's method and its inputs (the first takes the item's rows: split by the grid's patches where
# the second is a grid, else one row an item)
ENCODERS = {"image": ("get_image_features", ("pixel_values", "image_grid_thw")),
            "video": ("get_video_features", ("pixel_values_videos", "video_grid_thw")),
            "audio": ("get_audio_features", ("input_features", "feature_attention_mask"))}
# models (``config.model_type``) whose vision tower attends within a video's frame group (the module docstring)
FRAME_GROUP_TOWERS = ("qwen2_vl", "qwen2_5_vl", "qwen3_vl", "qwen3_vl_moe", "qwen2_5_omni", "qwen2_5_omni_thinker",
                      "qwen3_omni_moe", "qwen3_omni_moe_thinker")
TEXT_KEYS = ("input_ids", "attention_mask", "position_ids", "cu_seq_lens_q", "cu_seq_lens_k", "max_length_q",
             "max_length_k")


def assign(costs: Sequence[float], size: int) -> list[int]:
    """The rank of each item: largest cost first, onto the least loaded rank (the lowest on a tie). Pure and
    deterministic, so every rank computes the same plan. ``assign([9, 4, 4, 1], 2) == [0, 1, 1, 1]`` (9 against 4 + 4 + 1)."""
    loads, owner = [0.0] * size, [0] * len(costs)
    for j in sorted(range(len(costs)), key=lambda j: (-costs[j], j)):
        rank = min(range(size), key=lambda r: (loads[r], r))
        owner[j] = rank
        loads[rank] += costs[j]
    return owner


def item_cost(cost, kind: str, tokens: int) -> float:
    """An item's encoder cost under a :class:`~packer.cost.CostModel` (its media and per-kind terms); its token
    count where the model charges media nothing (the default cost model)."""
    terms = (cost.media_item + cost.media_token * tokens + getattr(cost, f"{kind}_item")
             + getattr(cost, f"{kind}_token") * tokens + getattr(cost, f"{kind}_square") * tokens * tokens)
    return float(terms) if terms > 0 else float(tokens)


def loads(spans: Sequence[dict[str, Any]], size: int, cost=None, *, split: bool = True,
          frames: bool = False) -> list[float]:
    """Each rank's encoder cost for ``spans`` (a batch's media): split (each unit on one rank, :func:`assign` per
    kind, as :func:`shared_encoders` runs it) or replicated (every rank every unit). ``frames``: a video's units
    are its frame groups, one per run of its placeholders (Qwen3-VL writes a timestamp between frame groups), each
    charged as an item of its own tokens; else the whole video is one."""
    from packer.cost import CostModel

    cost = cost if cost is not None else CostModel()
    out = [0.0] * size
    for kind in sorted({m["kind"] for m in spans}):
        sizes = [n for m in _ordered(spans, kind) for n in
                 ([n for _, n in span_runs(m)] if frames and kind == "video" else [int(m.get("tokens", m["length"]))])]
        costs = [item_cost(cost, kind, n) for n in sizes]
        for j, rank in enumerate(assign(costs, size) if split else []):
            out[rank] += costs[j]
        if not split:
            out = [x + sum(costs) for x in out]
    return out


def _ordered(spans: Sequence[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    """A kind's spans in the order of the collator's media tensors and of the model's scatter."""
    return sorted((m for m in spans if m["kind"] == kind), key=lambda m: (m.get("batch", 0), int(m["start"])))


class _AllToAllV(torch.autograd.Function):
    """Rows exchanged over ``group`` with split sizes; the backward sends each row's gradient back."""

    @staticmethod
    def forward(ctx, x, received: list[int], sent: list[int], group):
        ctx.received, ctx.sent, ctx.group = received, sent, group
        out = x.new_empty(sum(received), *x.shape[1:])
        dist.all_to_all_single(out, x.contiguous(), output_split_sizes=received, input_split_sizes=sent, group=group)
        return out

    @staticmethod
    def backward(ctx, grad):
        out = grad.new_empty(sum(ctx.sent), *grad.shape[1:])
        dist.all_to_all_single(out, grad.contiguous(), output_split_sizes=ctx.sent, input_split_sizes=ctx.received,
                               group=ctx.group)
        return out, None, None, None


def _cat(t) -> torch.Tensor:
    return torch.cat(list(t)) if isinstance(t, (list, tuple)) else t


def _features(out: Any, kind: str) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """An encoder call's rows and DeepStack features, each ``[rows, hidden]``."""
    if isinstance(out, torch.Tensor):
        return out.reshape(-1, out.shape[-1]), []
    main = out.last_hidden_state if kind == "audio" or getattr(out, "pooler_output", None) is None else out.pooler_output
    main = _cat(main)
    deep = [_cat(f) for f in (getattr(out, "deepstack_features", None) or [])]
    return main.reshape(-1, main.shape[-1]), deep


@dataclass(frozen=True)
class _Unit:
    """What one rank encodes in one piece: a whole item, or one frame group of a video."""

    item: int  # the span's place in the kind's batch order
    first: int  # its first feature (row) within the span
    tokens: int  # its features
    inputs: tuple[int, int]  # its rows of the kind's input tensor (``pixel_values_videos``, ...)
    grid: tuple[int, ...] | None  # its encoder grid, ``(1, h, w)`` for a frame group; None: no grid input


def _units(kind: str, spans: list[dict[str, Any]], batch: dict[str, Any], frames: bool) -> list[_Unit]:
    """A kind's units, in batch order: one an item, or ``t`` a video of grid ``(t, h, w)`` under ``frames``."""
    tokens = [int(m.get("tokens", m["length"])) for m in spans]
    first, grid = ENCODERS[kind][1]
    if grid not in batch or kind == "audio":
        return [_Unit(j, 0, n, (j, j + 1), None) for j, n in enumerate(tokens)]
    grids = [tuple(int(x) for x in g) for g in batch[grid].tolist()]
    if len(grids) != len(spans):
        raise ValueError(f"{grid} holds {len(grids)} grids for {len(spans)} {kind} items: collate the batch with its "
                         f"media (PackedCollator.for_build) and pass it whole to shared_encoders")
    out, row = [], 0
    for j, (n, g) in enumerate(zip(tokens, grids, strict=True)):
        t, per = g[0], math.prod(g[1:])
        if frames and kind == "video" and t > 1 and n % t == 0:
            out.extend(_Unit(j, f * (n // t), n // t, (row + f * per, row + (f + 1) * per), (1, *g[1:])) for f in range(t))
        else:
            out.append(_Unit(j, 0, n, (row, row + t * per), g))
        row += t * per
    return out


class _Kind:
    """One kind's plan: its items (spans), their units and owners, the rows every rank needs."""

    def __init__(self, kind: str, spans: list[dict[str, Any]], units: list[_Unit], pieces: list[list[dict[str, Any]]],
                 owners: list[int]):
        self.kind, self.spans, self.units, self.owners = kind, spans, units, owners
        index = {(m.get("batch", 0), int(m["start"])): j for j, m in enumerate(spans)}
        of_item: dict[int, list[int]] = {}
        for u, unit in enumerate(units):
            of_item.setdefault(unit.item, []).append(u)
        # per rank, in its local token order: (unit, first feature within the unit, rows)
        self.needs = []
        for rank_pieces in pieces:
            need = []
            for p in sorted(rank_pieces, key=lambda p: (p.get("batch", 0), p["start"])):
                if p["kind"] != kind:
                    continue
                lo, hi = int(p["offset"]), int(p["offset"]) + int(p["length"])
                for u in of_item[index[(p.get("batch", 0), int(p["span_start"]))]]:
                    a, b = max(lo, units[u].first), min(hi, units[u].first + units[u].tokens)
                    if a < b:
                        need.append((u, a - units[u].first, b - a))
            self.needs.append(need)


class SharedEncoders:
    """What :func:`shared_encoders` sets up for one forward; ``calls`` counts the kinds encoded."""

    def __init__(self, model, sp, batch: dict[str, Any], local: dict[str, Any], *, split: bool = True, cost=None,
                 frames: bool = True):
        self.model, self.sp, self.batch, self.local, self.split = model, sp, batch, local, split
        frames = frames and split and getattr(model.config, "model_type", None) in FRAME_GROUP_TOWERS
        self.cost = cost if cost is not None else _cost_model(model)
        spans = list(batch.get("media", []))
        kinds = sorted({m["kind"] for m in spans})
        unknown = [k for k in kinds if k not in ENCODERS]
        if unknown:
            raise ValueError(f"shared_encoders encodes image, video and audio items; the batch holds {unknown}: use "
                             f"split=False (every rank encodes the whole batch) or train without sequence parallelism")
        pieces = [local["media"] if r == sp.rank else sp.slice(batch, rank=r)["media"] for r in range(sp.size)] \
            if split else []
        self.kinds: dict[str, _Kind] = {}
        for kind in kinds:
            ordered = _ordered(spans, kind)
            units = _units(kind, ordered, batch, frames)
            owners = assign([item_cost(self.cost, kind, u.tokens) for u in units], sp.size) if split \
                else [sp.rank] * len(units)
            self.kinds[kind] = _Kind(kind, ordered, units, pieces, owners)
        self.results: dict[str, Any] = {}
        # per kind: what this rank encoded, (item in batch order, first row, rows) a unit
        self.encoded: dict[str, list[tuple[int, int, int]]] = {}
        self.inputs = self._inputs()

    def _inputs(self) -> dict[str, Any]:
        """The model's keyword arguments: the slice's (``sp.model_inputs``) and the batch's media inputs."""
        from packer.loader.collate import MODEL_KEYS

        media = {k: self.batch[k] for k in MODEL_KEYS if k in self.batch and k not in TEXT_KEYS and k not in self.local}
        return self.sp.model_inputs({**self.local, **media})

    def patch(self) -> None:
        """Stand in for the model's ``get_{kind}_features`` of every kind the batch holds (every module that has one)."""
        found, originals = [], {}
        for module in self.model.modules():  # pre-order: the innermost method found last is the one that encodes
            for kind in self.kinds:
                name = ENCODERS[kind][0]
                if callable(getattr(type(module), name, None)):
                    originals[kind] = getattr(module, name)
                    found.append((module, name, kind))
        missing = [k for k in self.kinds if k not in originals]
        if missing:
            raise ValueError(f"{type(self.model).__name__} has no {', '.join(ENCODERS[k][0] for k in missing)}: its "
                             f"encoders cannot be shared; use split=False with your own inputs_embeds (docs/loader.md)")
        self.patched = [(module, name, self.encoder(kind, originals[kind])) for module, name, kind in found]
        self._repatch()

    def _repatch(self) -> None:
        for module, name, stand_in in self.patched:
            setattr(module, name, stand_in)

    def unpatch(self) -> None:
        for module, name, _ in self.patched:
            if name in vars(module):
                delattr(module, name)

    @contextlib.contextmanager
    def _unpatched(self) -> Iterator[None]:
        self.unpatch()
        try:
            yield
        finally:
            self._repatch()

    def encoder(self, kind: str, original):
        """The stand-in for the model's ``get_{kind}_features``: the rows this rank's placeholders take, in order."""
        def features(*args, **kwargs):
            if kind not in self.results:
                self.results[kind] = self._encode(kind, original)
            return self.results[kind]

        return features

    def _encode(self, kind: str, original) -> Any:
        plan = self.kinds.get(kind)
        if plan is None:
            raise ValueError(f"the model encodes {kind} but the batch's media hold no {kind} span: collate the batch "
                             f"with its media (PackedCollator.for_build) and pass it to shared_encoders")
        mine = [u for u, o in enumerate(plan.owners) if o == self.sp.rank]
        self.encoded[kind] = [(plan.units[u].item, plan.units[u].first, plan.units[u].tokens) for u in mine]
        with self._unpatched():  # Qwen3-VL's get_video_features calls its get_image_features
            # a rank given none still runs the tower (FSDP / DDP), on the model's dummy item, and keeps none of its rows
            out = original(**(self._select(kind, mine) if mine else self._dummy(kind)))
        main, deep = _features(out, kind)
        widths = [main.shape[-1], *(d.shape[-1] for d in deep)]
        table = torch.cat([main, *deep], dim=-1) if deep else main
        if mine and table.shape[0] != sum(plan.units[u].tokens for u in mine):
            raise ValueError(f"{type(self.model).__name__}.{ENCODERS[kind][0]} gave {table.shape[0]} rows for "
                             f"{len(mine)} {kind} unit(s) of {sum(plan.units[u].tokens for u in mine)} placeholders: its "
                             f"outputs do not map one row to a placeholder; use shared_encoders(..., split=False)")
        if not mine:
            table = table[:0]
        rows = self._exchange(plan, table, mine) if self.split else \
            table[local_media_rows(self.local["media"], plan.spans, kind=kind)]
        parts = torch.split(rows, widths, dim=-1)
        return _output_class()(last_hidden_state=parts[0], pooler_output=(parts[0],),
                               deepstack_features=[(d,) for d in parts[1:]])

    def _exchange(self, plan: _Kind, table: torch.Tensor, mine: list[int]) -> torch.Tensor:
        """Every rank's rows from this rank's ``table`` (its items' rows, in item order), and this rank's from all."""
        me, size = self.sp.rank, self.sp.size
        base, at = {}, 0
        for u in mine:
            base[u] = at
            at += plan.units[u].tokens
        send, sent = [], []
        for r in range(size):
            idx = [base[j] + off + i for j, off, n in plan.needs[r] if plan.owners[j] == me for i in range(n)]
            send.extend(idx)
            sent.append(len(idx))
        received = [sum(n for j, _, n in plan.needs[me] if plan.owners[j] == e) for e in range(size)]
        got = _AllToAllV.apply(table[torch.tensor(send, dtype=torch.long)], received, sent, self.sp.group)
        # got holds rank 0's rows for me, then rank 1's, ...; each block in my local order: back to my local order
        start = [0]
        for n in received:
            start.append(start[-1] + n)
        order, taken = [], [0] * size
        for j, _, n in plan.needs[me]:
            e = plan.owners[j]
            order.extend(range(start[e] + taken[e], start[e] + taken[e] + n))
            taken[e] += n
        return got[torch.tensor(order, dtype=torch.long)]

    def _select(self, kind: str, units: list[int]) -> dict[str, Any]:
        plan, keys = self.kinds[kind], ENCODERS[kind][1]
        first, grid = keys
        if first not in self.batch:
            raise ValueError(f"the batch holds {kind} spans but no {first}: collate it with the build's processor "
                             f"(PackedCollator.for_build(ds, model=model))")
        value, out = self.batch[first], {}
        items = [plan.units[u].item for u in units]
        if grid in self.batch and kind in ("image", "video"):
            g = self.batch[grid]
            out[first] = torch.cat([value[slice(*plan.units[u].inputs)] for u in units])
            out[grid] = torch.tensor([plan.units[u].grid for u in units], dtype=g.dtype, device=g.device)
        else:
            if value.shape[0] != len(plan.spans):
                raise ValueError(f"{first} holds {value.shape[0]} rows for {len(plan.spans)} {kind} items: shared_encoders "
                                 f"splits one row an item; use split=False for this model")
            out[first] = value[items]
            if grid in self.batch:
                out[grid] = self.batch[grid][items]
        return out

    def _dummy(self, kind: str) -> dict[str, Any]:
        from packer.loader.dummy import towers

        for tower in towers(self.model):
            if kind in tower.kinds:
                inputs = tower.build(self.model.config, kind).inputs
                return {k: v for k, v in inputs.items() if k in ENCODERS[kind][1]}
        raise ValueError(f"rank {self.sp.rank} holds no {kind} item to encode and {type(self.model).__name__} declares "
                         f"no {kind} tower's dummy item (Family.towers): declare it, or use shared_encoders(..., "
                         f"split=False)")


@functools.cache
def _output_class():
    """An encoder output as the models read it: ``pooler_output`` (Qwen vision), ``last_hidden_state`` (audio),
    ``deepstack_features``; a ``ModelOutput`` (the model's own output calls ``to_tuple`` on it)."""
    from dataclasses import dataclass

    from transformers.modeling_outputs import BaseModelOutputWithPooling

    @dataclass
    class SharedEncoderOutput(BaseModelOutputWithPooling):
        deepstack_features: list | None = None

    return SharedEncoderOutput


def _cost_model(model):
    from packer.cost import CostModel

    try:
        return CostModel.for_model(model.config)
    except (ValueError, TypeError, KeyError, AttributeError):  # a config the FLOP formulas do not read: tokens
        return CostModel()


@contextlib.contextmanager
def shared_encoders(model, sp, batch: dict[str, Any], local: dict[str, Any], *, split: bool = True,
                    cost=None, frames: bool = True) -> Iterator[SharedEncoders]:
    """For ONE forward of ``model``: its encoders share the SP group's media (module docstring); yields the
    :class:`SharedEncoders`, whose ``inputs`` are the model's keyword arguments. ``batch``: the unsliced batch
    (the same on every rank of the group); ``local``: ``sp.slice(batch)``; ``cost``: a
    :class:`~packer.cost.CostModel` (default: ``CostModel.for_model(model.config)``, else token counts);
    ``frames``: a video's frame groups are units of their own where the tower attends within one
    (:data:`FRAME_GROUP_TOWERS`), else (``False``, or another model) a video is one unit."""
    state = SharedEncoders(model, sp, batch, local, split=split, cost=cost, frames=frames)
    state.patch()
    try:
        yield state
    finally:
        state.unpatch()
    unused = [k for k in state.kinds if k not in state.results]
    if unused:
        raise ValueError(f"the batch holds {', '.join(unused)} items but {type(model).__name__}'s forward never called "
                         f"{', '.join(ENCODERS[k][0] for k in unused)}: pass the inputs shared_encoders yields")
