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

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, ClassVar


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


class Family:
    """A model family: its modalities, its media tokens, its expansions, its settings.

    ``structured``: media parts reach the chat template as ``{"type": "image"}`` content parts
    (what ``processor.apply_chat_template`` passes), so the template writes the media token;
    otherwise (the configurable ``generic`` family) the media token is put in the text for it.
    """

    name: ClassVar[str] = ""
    structured: ClassVar[bool] = True
    processor_class: ClassVar[str] = ""  # the HF processor class the family reproduces
    rope: ClassVar[str] = "default"  # "mrope": Qwen-style 3-D positions from llm_grid
    model_inputs: ClassVar[tuple[str, ...]] = ()  # extra keyword arguments the model class takes (mm_token_type_ids)

    def __init__(self, kinds: tuple[str, ...]):
        self.kinds = kinds

    def media_token(self, kind: str) -> str:
        """The token the rendered template holds for one ``kind`` item (what the processor replaces); by
        default the token its runs are made of."""
        return self.run_tokens()[kind]

    def run_tokens(self) -> dict[str, str]:
        """kind -> the placeholder token its runs are made of."""
        raise NotImplementedError

    def special_tokens(self) -> list[str]:
        """Tokens the tokenizer must know as special tokens (added where absent)."""
        return list(dict.fromkeys([*(self.media_token(k) for k in self.kinds), *self.run_tokens().values()]))

    def expand(self, kind: str, info: Any, part: Any, record: RecordMedia) -> Expansion:
        """The item's replacement, from its probed ``info`` (ImageInfo / AudioInfo / VideoInfo).
        ``ValueError`` where the processor would refuse the item (quarantined as unsupported_<kind>)."""
        raise NotImplementedError

    def settings(self) -> dict[str, Any]:
        """The resolved settings (JSON-able): recorded in the manifest and the build fingerprint."""
        return {}

    def joined_kinds(self) -> tuple[str, ...]:
        """Kinds whose items' counts depend on the other items of the record (LLaVA-OneVision tiles one image, not
        two; Qwen3-Omni pads a record's clips to its longest): a cut must keep all of them or none, so the planner
        protects them as one span (a truncated or split sample never holds a subset the processor would count
        otherwise)."""
        return ()

    # Loader hooks (train time, torch imported inside), optional: a family defines the ones whose loading
    # differs from the generic media step (packer.loader.media.MediaStep), which calls them when present.
    #
    #   image_inputs(image_processor, pictures, spans, check) -> dict   pixel values etc. of a batch's images
    #   video_inputs(video_processor, spans, check) -> dict              ... of its videos (frames decoded here)
    #   audio_inputs(feature_extractor, waves, spans, check) -> dict     ... of its clips
    #   row_inputs(input_ids, run_ids) -> dict                           per-token model inputs (token_type_ids)
    #   attention_masks(cu, segment, position, attention, *, base, mask_dtype, device, model_config, input_ids,
    #                   run_ids) -> dict                                 the mask per layer type (Llama 4, Gemma)
    #
    # ``spans`` are the batch's media spans of that kind in scatter order (row, then position), each with
    # ``path`` / ``frames`` resolved; ``check(span, produced, by, stored_grid=None)`` raises a named
    # MediaMismatchError unless the features the model will get equal the span's stored ``tokens``.

    def describe(self) -> dict[str, Any]:
        return {"name": self.name, "processor_class": self.processor_class, "modalities": list(self.kinds),
                "runs": {k: v for k, v in self.run_tokens().items() if k in self.kinds}, "rope": self.rope,
                "model_inputs": list(self.model_inputs), "joined_kinds": list(self.joined_kinds()),
                "settings": self.settings()}
