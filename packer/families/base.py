"""What a model family is to packer: the text its processor puts in place of each media item.

An HF processor turns ``processor(text=rendered_chat, images=..., videos=..., audio=...)`` into
ids in two steps: it replaces every media token the chat template wrote (``<|image_pad|>``,
``<start_of_image>``, ``<image>``) with a replacement string built from the processed media
(``replace_image_token``), then tokenizes the whole text. The replacement holds runs of a
placeholder token (one per feature the encoder scatters) and, for many families, text
around and between them: Qwen3-VL's ``<1.5 seconds>`` before each temporal group, Gemma's
``\\n\\n`` around ``<start_of_image>``, Llama 4's tile separators, InternVL's ``<img>``.

A family gives packer that replacement as an :class:`Expansion`: pieces of text and
:class:`Run` s, computed from the media file's header by the family's own arithmetic (its
processor's resize and sampling rules, with the checkpoint's settings: no pixel is decoded).
The encoder does what the processor does with it -- replaces, then tokenizes -- except that
each run goes into the text as *one* placeholder token and is widened to its count after
tokenizing. A run of an added special token tokenizes to one id per copy whatever surrounds
it, so the ids equal the processor's, and a 1,000-token image costs the tokenizer one token.

Worked example, Qwen3-VL, a 4-frame video sampled to 2 temporal groups of 2 x 3 merged patches::

    template text   ...<|vision_start|><|video_pad|><|vision_end|>...
    expansion       "<0.3 seconds>" "<|vision_start|>" Run(<|video_pad|>, 6) "<|vision_end|>"
                    "<1.3 seconds>" "<|vision_start|>" Run(<|video_pad|>, 6) "<|vision_end|>"
    media span      start = first <|video_pad|>, length = through the last one (21 positions),
                    tokens = 12, llm_grid = (2, 2, 3): the text between the runs is positioned as text
"""

from __future__ import annotations

import dataclasses
from abc import ABC, abstractmethod
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from typing import Any, ClassVar

from packer.errors import PackerError
from packer.modeling.towers import Tower

KINDS = ("image", "audio", "video")  # every media kind, in the order a family lists them


@dataclass(frozen=True)
class Run:
    """``count`` copies of the placeholder token ``token``: positions the encoder's features fill."""

    token: str
    count: int


@dataclass(frozen=True)
class Expansion:
    """One media item as its processor writes it: text pieces and runs, in order.

    ``llm_grid`` is (t, h, w) of the item's features in the language model's positions (after
    the vision tower's spatial merge: Qwen2-VL's ``image_grid_thw`` / merge) where the family's
    rotary positions need it; a run of ``k * h * w`` placeholders covers ``k`` temporal steps.
    ``second_per_grid_t`` is what Qwen2.5-VL's ``second_per_grid_ts`` holds for a video."""

    pieces: tuple[str | Run, ...]
    llm_grid: tuple[int, ...] = ()
    second_per_grid_t: float = 0.0
    extra: dict[str, Any] = field(default_factory=dict, compare=False)

    @property
    def tokens(self) -> int:
        return sum(p.count for p in self.pieces if isinstance(p, Run))

    @property
    def runs(self) -> list[Run]:
        return [p for p in self.pieces if isinstance(p, Run)]


@dataclass(frozen=True)
class RecordMedia:
    """What a family may need to know about the rest of the record (InternVL caps an image's
    tiles by the number of images in it; Qwen3-Omni's clips are padded to the record's longest).
    ``infos(kind)``: the probed infos of the record's items of that kind, in record order."""

    counts: dict[str, int]
    parts: tuple[Any, ...] = field(default=(), compare=False, repr=False)
    probe: Callable[[Any], Any] | None = field(default=None, compare=False, repr=False)
    _infos: dict[str, list[Any]] = field(default_factory=dict, compare=False, repr=False)

    def infos(self, kind: str) -> list[Any]:
        """Probed once per record and kind (a family asking for every item's neighbours stays linear)."""
        if self.probe is None:
            raise ValueError("this RecordMedia carries no prober: the record's other items cannot be probed")
        if kind not in self._infos:
            self._infos[kind] = [self.probe(p) for p in self.parts if p.kind == kind]
        return self._infos[kind]


class Family(ABC):
    """A model family, declared once from build to batch: every hook the build and the loader call is here,
    with its default. A family is one file that subclasses this and one line in the registry
    (:data:`packer.families.FAMILIES`); every other list of families -- dummy media by model type, model-input
    keys, per-token keys for sequence parallelism, the processors the ``hf`` route sends to a named family --
    is derived from the registry (docs/families.md: adding a family).

    Declarations (class attributes):

    ``name``              the registry key (``--family``)
    ``supports``          the media kinds the family can encode
    ``processor_class``   the HF processor class it reproduces ("" for the configurable families)
    ``settings_class``    its settings dataclass: ``resolve(checkpoint, options)`` reads a processor checkpoint
    ``model_types``       HF config ``model_type`` s of the model classes it feeds (a model of another family is
                          refused); ``towers``: their media towers (dummy media), by model type
    ``structured``        media parts reach the chat template as ``{"type": "image"}`` parts
    ``rope``              ``"mrope"``: Qwen-style 3-D positions from ``llm_grid`` (:meth:`positions`)
    ``model_inputs``      keys of a batch the model takes beyond the text ones (what its hooks add)
    ``per_token_inputs``  those of them that are ``[B, L]`` per token (sliced with the tokens under SP)
    ``own_loading``       kinds whose loading the family does itself (:meth:`image_inputs`, ...); the others
                          go through the generic media step (:mod:`packer.loader.media`)
    ``own_positions``     :meth:`positions` is the family's own (Qwen3-Omni's TMRoPE), not Qwen2-VL's mRoPE
    ``layer_masks``       :meth:`attention_masks` builds a mask per layer type (Llama 4, Gemma 3 / 4)
    ``linear_attention``  the text model has linear-attention layers (Qwen3.5): segment boundaries flattened
    ``routed``            the ``hf`` route sends its processor class here (False for the configurable families)
    ``is_generic``        the configurable placeholder family: its counts are the pipeline's policies, not a
                          processor's, so the loader takes rope, processor and model inputs from the model, not
                          from the family

    The family crosses the build once as an object: the driver resolves it (:func:`packer.families.make_family`),
    the manifest records :meth:`record`, and the workers, ``packer verify``, the planner, the collator and the
    loader's derivations rebuild it from that record alone (:meth:`from_record`: no checkpoint, no build config).
    """

    name: ClassVar[str] = ""
    supports: ClassVar[tuple[str, ...]] = ()
    processor_class: ClassVar[str] = ""
    settings_class: ClassVar[type | None] = None
    model_types: ClassVar[tuple[str, ...]] = ()
    towers: ClassVar[dict[str, tuple[Tower, ...]]] = {}
    structured: ClassVar[bool] = True
    rope: ClassVar[str] = "default"
    model_inputs: ClassVar[tuple[str, ...]] = ()
    per_token_inputs: ClassVar[tuple[str, ...]] = ()
    own_loading: ClassVar[tuple[str, ...]] = ()
    own_positions: ClassVar[bool] = False
    layer_masks: ClassVar[bool] = False
    linear_attention: ClassVar[bool] = False
    routed: ClassVar[bool] = True
    is_generic: ClassVar[bool] = False

    def __init__(self, kinds: tuple[str, ...]):
        self.kinds = kinds

    # ---------------------------------------------------------------- build hooks

    @abstractmethod
    def run_tokens(self) -> dict[str, str]:
        """kind -> the placeholder token its runs are made of."""

    @abstractmethod
    def expand(self, kind: str, info: Any, part: Any, record: RecordMedia) -> Expansion:
        """The item's replacement, from its probed ``info`` (ImageInfo / AudioInfo / VideoInfo).
        ``ValueError`` where the processor would refuse the item (quarantined as unsupported_<kind>)."""

    def media_token(self, kind: str) -> str:
        """The token the rendered template holds for one ``kind`` item (what the processor replaces); by
        default the token its runs are made of."""
        return self.run_tokens()[kind]

    def special_tokens(self) -> list[str]:
        """Tokens the tokenizer must know as special tokens."""
        return list(dict.fromkeys([*(self.media_token(k) for k in self.kinds), *self.run_tokens().values()]))

    def settings(self) -> dict[str, Any]:
        """The resolved settings (JSON-able): recorded in the manifest and the build fingerprint."""
        return {}

    def joined_kinds(self) -> tuple[str, ...]:
        """Kinds whose items' counts depend on the other items of the record (LLaVA-OneVision tiles one image, not
        two; Qwen3-Omni pads a record's clips to its longest): a cut must keep all of them or none, so the planner
        protects them as one span (a truncated or split sample never holds a subset the processor would count
        otherwise)."""
        return ()

    def row_key(self, span: dict[str, Any]) -> Hashable | None:
        """What a media item (a stored span: ``kind``, ``tokens``, ``length``, ``llm_grid``) must share with every
        other keyed item of its row and of its batch for the model class to take them in one call; None: it mixes
        with anything. LLaVA-OneVision stacks a batch's videos into one ``[videos, frames, 3, H, W]`` tensor: its
        videos' key is their frame count. The planner groups rows by it (``packer.pack.plan(row_key=...)``), a
        record whose own items' keys differ is quarantined (``incompatible_media``), and ``packer verify``
        checks it from the stored spans."""
        return None

    def row_keys(self, spans: list[dict[str, Any]]) -> list[Hashable]:
        """The distinct :meth:`row_key` s of ``spans`` (dummy items left out), in a stable order."""
        return sorted({k for m in spans if not m.get("dummy") and (k := self.row_key(m)) is not None}, key=str)

    def row_problem(self, spans: list[dict[str, Any]]) -> str | None:
        """Why a row (or a batch) holding ``spans`` cannot be collated for this family's model class, from the stored
        spans alone (no pixel loaded); None where it can. ``packer verify --collate`` asks it of every row."""
        keys = self.row_keys(spans)
        return self.row_key_reason(keys) if len(keys) > 1 else None

    def row_key_reason(self, keys: list[Hashable]) -> str:
        """Why items of these different keys cannot be taken together (the quarantine and refusal detail)."""
        return f"family {self.name}: the model takes these items in one call only when they agree ({sorted(map(str, keys))})"

    # ---------------------------------------------------------------- train hooks (torch imported inside)
    #
    # ``spans`` are the batch's media spans of one kind in scatter order (row, then position), each with ``path`` /
    # ``frames`` resolved; ``check(span, produced, by, stored_grid=None)`` (packer.modeling.spans.check) raises a
    # named MediaMismatchError unless the features the model will get equal the span's stored ``tokens``.

    def image_inputs(self, image_processor: Any, pictures: list[Any], spans: list[dict[str, Any]], check: Any) -> dict[str, Any]:
        """The model inputs of a batch's images (``own_loading`` names ``image``)."""
        raise NotImplementedError(f"family {self.name} loads no images itself: the generic media step does")

    def video_inputs(self, video_processor: Any, spans: list[dict[str, Any]], check: Any) -> dict[str, Any]:
        """The model inputs of a batch's videos, frames decoded here (``own_loading`` names ``video``)."""
        raise NotImplementedError(f"family {self.name} loads no videos itself: the generic media step does")

    def audio_inputs(self, feature_extractor: Any, waves: list[Any], spans: list[dict[str, Any]], check: Any) -> dict[str, Any]:
        """The model inputs of a batch's clips (``own_loading`` names ``audio``)."""
        raise NotImplementedError(f"family {self.name} loads no audio itself: the generic media step does")

    def merge_inputs(self, out: dict[str, Any], ordered: list[dict[str, Any]]) -> dict[str, Any]:
        """The batch's media inputs once every kind is loaded (InternVL joins images and videos in one tensor)."""
        return out

    def row_inputs(self, input_ids: Any, run_ids: dict[str, int]) -> dict[str, Any]:
        """Per-token model inputs of a batch: ``mm_token_type_ids`` (0 text, 1 image, 2 video, 3 audio
        placeholders, the processors' own values) where the family's model takes it."""
        if "mm_token_type_ids" not in self.model_inputs:
            return {}
        import torch

        types = torch.zeros_like(input_ids)
        for kind, value in (("image", 1), ("video", 2), ("audio", 3)):
            if run_ids.get(kind) is not None:
                types[input_ids == run_ids[kind]] = value
        return {"mm_token_type_ids": types}

    def positions(self, length: int, segments: list[tuple[int, int]], spans: list[dict[str, Any]],
                  tokens_per_second: float | None = None, parents: list[int] | None = None) -> Any:
        """``[3, length]`` positions of one row under ``rope="mrope"`` (Qwen2-VL's mRoPE by default)."""
        from packer.modeling.mrope import mrope_positions

        return mrope_positions(length, segments, spans, tokens_per_second, parents=parents)

    def attention_masks(self, cu: list[Any], segment: Any, position: Any, attention: str, *, base: Any, mask_dtype: Any,
                        device: Any, model_config: Any, input_ids: Any, run_ids: dict[str, int]) -> dict[str, Any]:
        """The batch's mask per layer type (``layer_masks``: Llama 4's chunked layers, Gemma's sliding windows and
        image blocks), from the real segments' boundaries ``cu`` (a trailing dummy segment left out)."""
        return {}

    # ---------------------------------------------------------------- the record

    @property
    def keys_rows(self) -> bool:
        """The family declares a :meth:`row_key` (its model takes some items together only when they agree): the
        planner groups rows by it and ``packer verify --collate`` judges rows by it; False: any row collates."""
        return type(self).row_key is not Family.row_key

    def record(self) -> dict[str, Any]:
        """What the manifest records (``tokenizer.family``) and the workers and the loader rebuild the family from
        (:meth:`from_record`)."""
        return {"name": self.name, "processor_class": self.processor_class, "modalities": list(self.kinds),
                "runs": {k: v for k, v in self.run_tokens().items() if k in self.kinds}, "rope": self.rope,
                "model_inputs": list(self.model_inputs), "joined_kinds": list(self.joined_kinds()),
                "settings": self.settings(), **({"linear_attention": True} if self.linear_attention else {})}

    describe = record  # the name tests and notebooks call

    @staticmethod
    def from_record(record: Any) -> Family:
        """The family :meth:`record` recorded (the manifest's ``tokenizer.family``, a dataset's ``family``), by its
        name in the registry and its settings; no checkpoint is read. A record no build writes (an edited or damaged
        manifest) raises :class:`~packer.families.FamilyStateError` naming the field, not a KeyError from deep
        inside. Keys beyond name, modalities and settings (``runs``, ``rope``, a dataset's ``run_ids``) are derived
        from these, or the build's, and are not read."""
        from packer.families import FAMILIES

        if not isinstance(record, dict):
            raise FamilyStateError(f"family = {record!r} is not an object of name, modalities and settings")
        cls = FAMILIES.get(record.get("name")) if isinstance(record.get("name"), str) else None
        if cls is None:
            raise FamilyStateError(f"family.name = {record.get('name')!r} is not one of {', '.join(FAMILIES)}")
        modalities, settings = record.get("modalities"), record.get("settings")
        if not isinstance(modalities, list) or not set(modalities) <= set(KINDS):
            raise FamilyStateError(f"family.modalities = {modalities!r} is not a list of {', '.join(KINDS)}")
        if not isinstance(settings, dict):
            raise FamilyStateError(f"family.settings = {settings!r} is not an object of {cls.name}'s settings")
        fields = dataclasses.fields(cls.settings_class)
        unknown = sorted(set(settings) - {f.name for f in fields})
        missing = [f.name for f in fields if f.name not in settings and f.default is dataclasses.MISSING
                   and f.default_factory is dataclasses.MISSING]
        if unknown or missing:
            what = f"names {', '.join(unknown)}, which {cls.name} lacks" if unknown else f"lacks {', '.join(missing)}"
            raise FamilyStateError(f"family.settings {what} (its settings: {', '.join(f.name for f in fields)})")
        return cls(tuple(modalities), cls.settings_class(**settings))


class FamilyStateError(PackerError, ValueError):
    """A recorded family (a manifest's ``tokenizer.family``) that no build writes: an unknown name, no settings, a
    setting the family lacks. The message names the field (``family.settings``) and what it holds."""
