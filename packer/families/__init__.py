"""Model families: how each model's processor expands media in the text (see :mod:`packer.families.base`).

``family = "qwen3vl"`` in a pipeline (``--family``) picks one; its settings come from the
processor checkpoint named by ``--processor`` (:mod:`packer.families.checkpoint`), the family's
defaults otherwise, and ``--processor-options key=value,...`` last. ``generic`` (the default) is
the configurable placeholder family of the 2024 pipelines.

The driver resolves the family once (:func:`make_family`) and ships its :meth:`Family.describe`
to the workers, which rebuild it without reading the checkpoint again (:func:`family_from_state`),
so every worker counts with the settings the manifest records.
"""

from __future__ import annotations

from typing import Any

from packer.errors import ConfigError
from packer.families.base import Expansion, Family, RecordMedia, Run
from packer.families.gemma3 import Gemma3
from packer.families.gemma4 import Gemma4
from packer.families.generic import Generic
from packer.families.hf import HFProcessor
from packer.families.internvl import InternVL
from packer.families.llama4 import Llama4
from packer.families.llava_onevision import LlavaOnevision
from packer.families.qwen3omni import Qwen3Omni
from packer.families.qwen3vl import Qwen3VL
from packer.families.qwen35 import Qwen35

ALL_KINDS = ("image", "audio", "video")

# name -> (class, the kinds it can encode); the generic family encodes what the config declares
FAMILIES: dict[str, tuple[type[Family], tuple[str, ...]]] = {
    "generic": (Generic, ALL_KINDS),
    "qwen3vl": (Qwen3VL, ("image", "video")),
    "internvl": (InternVL, ("image", "video")),
    "llama4": (Llama4, ("image",)),
    "qwen35": (Qwen35, ("image", "video")),
    "gemma3": (Gemma3, ("image",)),
    "gemma4": (Gemma4, ("image", "video", "audio")),
    "hf": (HFProcessor, ("image", "audio")),  # any other processor, asked for each item's text
    "llava_onevision": (LlavaOnevision, ("image", "video")),
    "qwen3omni": (Qwen3Omni, ("image", "audio", "video")),
}


def family_names() -> tuple[str, ...]:
    return tuple(FAMILIES)


def resolve_kinds(name: str, modalities: tuple[str, ...], default: tuple[str, ...] = ALL_KINDS) -> tuple[str, ...]:
    """The kinds a build encodes: the declared ``modalities``, each one the family can encode. Left at
    the default (all three), a named family takes the kinds it encodes."""
    supported = FAMILIES[name][1]
    if tuple(modalities) == default:
        return tuple(k for k in ALL_KINDS if k in supported)
    extra = [k for k in modalities if k not in supported]
    if extra:
        raise ConfigError(f"family {name} encodes {', '.join(supported)}; modalities also names {', '.join(extra)}: "
                          f"remove it, or pick a family whose model encodes it")
    return tuple(modalities)


def make_family(config: Any) -> Family:
    """The family a build config names, its settings resolved from ``config.processor``."""
    name = config.family
    if name not in FAMILIES:
        raise ConfigError(f"unknown family {name!r}; known: {', '.join(FAMILIES)}")
    cls, _ = FAMILIES[name]
    if cls is Generic:
        if config.processor_options:
            raise ConfigError("processor_options apply to a named family (--family); the generic family takes "
                              "--image-tokens / --audio-tokens / --video-tokens")
        return Generic(config)
    from packer.families.checkpoint import read_checkpoint

    try:
        settings = cls.settings_class.resolve(read_checkpoint(config.processor), config.processor_options)
    except (ValueError, TypeError, OverflowError) as e:  # int("sixteen"), int(inf), int(None) from a processor config
        raise ConfigError(f"{config.processor}: a processor setting of family {name} is not a number ({type(e).__name__}: "
                          f"{e}); fix it in the checkpoint's processor config, or override it with --processor-options "
                          f"NAME=VALUE") from None
    return cls(resolve_kinds(name, tuple(config.modalities)), settings)


def family_from_state(state: dict[str, Any], config: Any) -> Family:
    """The family :meth:`Family.describe` described (in a worker: no checkpoint read)."""
    cls, _ = FAMILIES[state["name"]]
    if cls is Generic:
        return Generic(config)
    return cls(tuple(state["modalities"]), cls.settings_class(**state["settings"]))


__all__ = ["FAMILIES", "Expansion", "Family", "RecordMedia", "Run", "family_from_state", "family_names", "make_family"]
