"""The route for any other HF processor: ask the processor itself.

transformers 5 processors build a media item's text with ``replace_image_token`` / ``replace_audio_token``
from what their image processor / feature extractor returns, and that depends on the item's size (and, for
audio, its length) only. So for an image of h x w this family runs the checkpoint's processor on a *blank*
image of that size and takes the text it writes for it -- public: ``return_text_replacement_offsets`` --
(cached per size: the file's pixels are never read), split into text and runs of the placeholder the model
scatters into (``processor.image_token_ids``). Audio is the same with a silent clip of the item's length at
the feature extractor's rate. (The private ``_get_num_multimodal_tokens`` is no check: Idefics3's says 33
for a 40 x 60 image its processor expands to 20 placeholders in 64 tokens.)

What it cannot do is refused at the start, naming what is missing: a processor without a replacement
method for a kind the build declares, videos (a blank clip of a real clip's frame count is gigabytes; the
named families count videos from their headers), and processors whose text for one item depends on the
others (checked on two small blank items against one: LLaVA-OneVision tiles one image and not two: use
its named family). An image over 16 M pixels or a clip over 10 minutes is refused (``unsupported_image``
/ ``unsupported_audio``): the blank item asked about would cost more memory than the record is worth. Exact by the processor's own
rule, not by a test of the family's arithmetic: ``packer verify --against-processor`` checks a build.

Needs transformers' processor classes (and torch / torchvision where they do): ``pip install 'packer[train]'``.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import asdict, dataclass
from typing import Any, ClassVar

import numpy as np

from packer.errors import ConfigError
from packer.families.base import Expansion, Family, RecordMedia, Run
from packer.media import bounds as setting_bounds

CACHE = 4096  # sizes whose expansion a worker keeps
MAX_BLANK_PIXELS = 4096 * 4096  # the largest blank image asked about (48 MB of RGB, ~200 MB once the processor floats it)
MAX_BLANK_SECONDS = 600.0  # the longest silent clip asked about (10 min: 38 MB of float32 at 16 kHz)


@dataclass(frozen=True)
class HFSettings:
    processor: str = ""  # the checkpoint (folder or hub id)
    processor_class: str = ""
    image_token: str = ""  # what the template writes and the processor replaces
    image_run: str = ""  # the placeholder the replacement repeats
    audio_token: str = ""
    audio_run: str = ""
    sampling_rate: int = 0

    def __post_init__(self):
        setting_bounds.check(self, "hf", fix="the checkpoint's processor config (NAME)")

    @classmethod
    def resolve(cls, checkpoint: Any, options: str = "") -> HFSettings:
        if not checkpoint.name:
            raise ConfigError("family hf asks the processor itself: give --processor FOLDER_OR_HUB_ID")
        if options:
            raise ConfigError("family hf takes no processor_options: its settings are the processor's own")
        proc = load_processor(checkpoint.name)
        tok = proc.tokenizer
        found: dict[str, Any] = {"processor": checkpoint.name, "processor_class": type(proc).__name__}
        for kind in ("image", "audio"):
            token = getattr(proc, f"{kind}_token", None)
            ids = [i for i in (getattr(proc, f"{kind}_token_ids", None) or []) if i is not None]
            if token and ids:
                found[f"{kind}_token"], found[f"{kind}_run"] = token, tok.convert_ids_to_tokens(int(ids[0]))
        extractor = getattr(proc, "feature_extractor", None) or getattr(proc, "audio_processor", None)
        if extractor is not None and getattr(extractor, "sampling_rate", None):
            found["sampling_rate"] = int(extractor.sampling_rate)
        settings = cls(**found)
        independent(proc, settings)
        return settings


def independent(proc: Any, s: HFSettings) -> None:
    """Refuse a processor whose text for one item depends on the record's other items (LLaVA-OneVision tiles one
    image but not two): this route asks about each item alone. Checked once, on small blank items."""
    from PIL import Image

    probes = {"image": lambda: Image.new("RGB", (64, 48)), "audio": lambda: np.zeros(s.sampling_rate or 16000, np.float32)}
    for kind in ("image", "audio"):
        token = getattr(s, f"{kind}_token")
        if not token:
            continue
        try:
            _, (alone,) = ask(proc, kind, [probes[kind]()], token)
            _, together = ask(proc, kind, [probes[kind](), probes[kind]()], token, nested=True)
        except Exception:  # noqa: BLE001 -- a kind this processor cannot run on a probe: judged where it is used
            continue
        if together != [alone, alone]:
            raise ConfigError(f"family hf: {type(proc).__name__} writes another text for an {kind} when the record holds "
                              f"two, so it cannot be asked about each item alone; use its named family "
                              f"({', '.join(named_families())}) or a build with one {kind} per record")


def named_families() -> list[str]:
    """The families a processor can be sent to by name instead of this route (derived from the registry)."""
    from packer.families import FAMILIES

    return sorted(n for n, cls in FAMILIES.items() if cls.routed)


_PROCESSORS: dict[str, Any] = {}


def load_processor(name: str) -> Any:
    """The processor at ``name`` (one per process)."""
    if name not in _PROCESSORS:
        from packer.io.pretrained import load_pretrained

        try:
            from transformers import AutoProcessor
        except ImportError:
            raise ConfigError("family hf runs the HF processor: pip install 'packer[train]'") from None
        try:
            _PROCESSORS[name] = load_pretrained(AutoProcessor, name, "processor")
        except ConfigError:
            raise
        except Exception as e:  # noqa: BLE001 -- not a processor folder, an unknown id, a missing backend
            raise ConfigError(f"family hf: cannot load processor {name!r}: {type(e).__name__}: {e}") from None
    return _PROCESSORS[name]


class HFProcessor(Family):
    name = "hf"
    supports = ("image", "audio")  # asked for each item's text: any processor (refused where items depend on each other)
    settings_class: ClassVar[type] = HFSettings
    own_loading = ("image", "audio")
    routed = False

    def __init__(self, kinds: tuple[str, ...], settings: HFSettings):
        super().__init__(kinds)
        self.s = settings
        if "video" in kinds:
            raise ConfigError("family hf does not count videos (a blank clip of a real clip's frames would be gigabytes); "
                              "use a named family (--family qwen3vl, ...) or leave video out of modalities")
        for kind in kinds:
            if not getattr(settings, f"{kind}_token"):
                raise ConfigError(f"family hf: {settings.processor_class} has no {kind}_token / {kind}_token_ids, so "
                                  f"packer cannot find its {kind} placeholders; leave {kind} out of modalities")
        self._cache: OrderedDict[tuple, Expansion] = OrderedDict()

    def media_token(self, kind: str) -> str:
        return getattr(self.s, f"{kind}_token")

    def run_tokens(self) -> dict[str, str]:
        return {k: getattr(self.s, f"{k}_run") for k in self.kinds}

    def special_tokens(self) -> list[str]:
        return list(dict.fromkeys([*(self.media_token(k) for k in self.kinds), *self.run_tokens().values()]))

    def settings(self) -> dict[str, Any]:
        return asdict(self.s)

    def expand(self, kind: str, info: Any, part: Any, record: RecordMedia) -> Expansion:
        key = (kind, info.height, info.width) if kind == "image" else (kind, info.frames, info.sample_rate)
        hit = self._cache.get(key)
        if hit is None:
            hit = self._cache[key] = self._ask(kind, info)
            if len(self._cache) > CACHE:
                self._cache.popitem(last=False)
        return hit

    def _ask(self, kind: str, info: Any) -> Expansion:
        proc = load_processor(self.s.processor)
        if kind == "image":
            from PIL import Image

            if info.width * info.height > MAX_BLANK_PIXELS:
                raise ValueError(f"{info.width}x{info.height} is over the hf route's {MAX_BLANK_PIXELS:,}-pixel bound (it asks "
                                 f"the processor about a blank image of that size); resize it, or use a named family")
            item: Any = Image.new("RGB", (info.width, info.height))
        else:
            if info.frames / info.sample_rate > MAX_BLANK_SECONDS:
                raise ValueError(f"{info.frames / info.sample_rate:.0f} s is over the hf route's {MAX_BLANK_SECONDS:.0f} s bound "
                                 f"(it asks the processor about a silent clip of that length); cut it, or use a named family")
            item = np.zeros(-(-info.frames * self.s.sampling_rate // info.sample_rate), dtype=np.float32)
        _, (text,) = ask(proc, kind, [item], self.media_token(kind))
        return split_runs(text, getattr(self.s, f"{kind}_run"))

    # ---------------------------------------------------------------- loader hooks (train time)

    def image_inputs(self, image_processor: Any, pictures: list, spans: list[dict[str, Any]], check: Any) -> dict[str, Any]:
        """A batch's images through the checkpoint's processor; each item's placeholders checked against the
        processor's own text for it."""
        return self._inputs("image", pictures, spans, check)

    def audio_inputs(self, feature_extractor: Any, waves: list, spans: list[dict[str, Any]], check: Any) -> dict[str, Any]:
        return self._inputs("audio", waves, spans, check)

    def _inputs(self, kind: str, items: list, spans: list[dict[str, Any]], check: Any) -> dict[str, Any]:
        proc = load_processor(self.s.processor)
        outputs, texts = ask(proc, kind, items, self.media_token(kind), return_tensors="pt")
        run = getattr(self.s, f"{kind}_run")
        for i, (m, text) in enumerate(zip(spans, texts, strict=True)):
            check(m, split_runs(text, run).tokens, f"{type(proc).__name__} ({kind} {i} of the batch)")
        unused = {"input_ids", "attention_mask", "text_replacement_offsets", "mm_token_type_ids", "token_type_ids",
                  *(getattr(proc, "unused_input_names", []) or [])}
        return {k: v for k, v in outputs.items() if k not in unused}


def split_runs(text: str, run: str) -> Expansion:
    """A replacement string as text pieces and runs of ``run`` (consecutive copies counted)."""
    pieces: list[str | Run] = []
    parts = text.split(run)
    n = 0
    for k, piece in enumerate(parts):
        if k:
            n += 1
        if piece or k == len(parts) - 1:
            if n:
                pieces.append(Run(run, n))
                n = 0
            if piece:
                pieces.append(piece)
    return Expansion(tuple(pieces))



def ask(proc: Any, kind: str, items: list, token: str, *, nested: bool = False, **kwargs: Any) -> tuple[Any, list[str]]:
    """The processor run on ``items`` (one sample whose text is ``token`` per item; ``nested``: images given as that
    sample's list, as ``apply_chat_template`` gives a conversation's) with ``return_text_replacement_offsets``:
    (its outputs, the text it writes for each item)."""
    media = {"image": "images", "audio": "audio"}[kind]
    extra = {"sampling_rate": load_sampling_rate(proc)} if kind == "audio" else {}
    given = [items] if nested and kind == "image" else items
    out = proc(text=[token * len(items)], **{media: given}, return_text_replacement_offsets=True, **extra, **kwargs)
    replacements = [r["replacement"] for r in out["text_replacement_offsets"][0] if r["type"] == kind]
    if len(replacements) != len(items):
        raise ValueError(f"{type(proc).__name__} wrote {len(replacements)} {kind} replacement(s) for {len(items)} item(s)")
    return out, replacements


def load_sampling_rate(proc: Any) -> int:
    extractor = getattr(proc, "feature_extractor", None) or getattr(proc, "audio_processor", None)
    return int(extractor.sampling_rate)
