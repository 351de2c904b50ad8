"""Model families: how each model's processor expands media in the text (see :mod:`packer.families.base`).

``family = "qwen3vl"`` in a pipeline (``--family``) picks one; its settings come from the
processor checkpoint named by ``--processor`` (:mod:`packer.families.checkpoint`), the family's
defaults otherwise, and ``--processor-options key=value,...`` last. ``generic`` (the default) is
the configurable placeholder family of the 2024 pipelines.

The driver resolves the family once (:func:`make_family`) and ships its :meth:`Family.record`
to the workers, which rebuild it without reading the checkpoint again (:meth:`Family.from_record`),
so every worker counts with the settings the manifest records.
"""

from __future__ import annotations

from typing import Any

from packer.errors import ConfigError
from packer.families.base import KINDS, Expansion, Family, FamilyStateError, RecordMedia, Run
from packer.families.gemma3 import Gemma3
from packer.families.gemma4 import Gemma4
from packer.families.generic import Generic, GenericSettings
from packer.families.hf import HFProcessor
from packer.families.internvl import InternVL
from packer.families.llama4 import Llama4
from packer.families.llava_onevision import LlavaOnevision
from packer.families.qwen3omni import Qwen3Omni
from packer.families.qwen3vl import Qwen3VL
from packer.families.qwen35 import Qwen35

ALL_KINDS = KINDS

# The registry: adding a family is its file and one line here (docs/families.md). Every other list of families
# below is derived from it.
FAMILIES: dict[str, type[Family]] = {cls.name: cls for cls in (
    Generic, Qwen3VL, InternVL, Llama4, Qwen35, Gemma3, Gemma4, HFProcessor, LlavaOnevision, Qwen3Omni)}


def _by_model_type() -> dict[str, type[Family]]:
    found: dict[str, type[Family]] = {}
    for cls in FAMILIES.values():
        for model_type in (*cls.model_types, *cls.towers):
            if found.get(model_type, cls) is not cls:
                raise RuntimeError(f"model type {model_type!r} declared by families {found[model_type].name} and {cls.name}")
            found[model_type] = cls
    return found


MODEL_TYPES: dict[str, type[Family]] = _by_model_type()  # HF config model_type -> the family that feeds it
# Batch keys a model call takes beyond the text ones, and those of them that are per token ([B, L]: sliced under SP)
MODEL_INPUT_KEYS: tuple[str, ...] = tuple(dict.fromkeys(k for cls in FAMILIES.values() for k in cls.model_inputs))
PER_TOKEN_KEYS: tuple[str, ...] = tuple(dict.fromkeys(k for cls in FAMILIES.values() for k in cls.per_token_inputs))


def family_of_model(model) -> type[Family] | None:
    """The family whose model classes ``model`` (an HF model or config) belongs to, by ``model_type``; None for a
    model no family declares (a text model)."""
    config = getattr(model, "config", model)
    return MODEL_TYPES.get(getattr(config, "model_type", None) or "")


def families_of_processor(processor) -> list[str]:
    """The named families that reproduce ``processor``'s class (Qwen3-VL and Qwen3.5 share one); [] for others."""
    name = type(processor).__name__
    return [cls.name for cls in FAMILIES.values() if cls.processor_class and cls.processor_class == name]


def family_names() -> tuple[str, ...]:
    return tuple(FAMILIES)


def resolve_kinds(name: str, modalities: tuple[str, ...], default: tuple[str, ...] = ALL_KINDS) -> tuple[str, ...]:
    """The kinds a build encodes: the declared ``modalities``, each one the family can encode. Left at
    the default (all three), a named family takes the kinds it encodes."""
    supported = FAMILIES[name].supports
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
    cls = FAMILIES[name]
    if cls is Generic:
        if config.processor_options:
            raise ConfigError("processor_options apply to a named family (--family); the generic family takes "
                              "--image-tokens / --audio-tokens / --video-tokens")
        return Generic(tuple(config.modalities), GenericSettings.of_keys(config))
    from packer.families.checkpoint import family_checkpoint

    kinds = resolve_kinds(name, tuple(config.modalities))
    if cls is HFProcessor:  # it loads AutoProcessor itself (and names the missing --processor)
        from packer.families.checkpoint import read_checkpoint

        checkpoint = read_checkpoint(config.processor)
    else:  # refused where the build could not reproduce AutoProcessor on that folder
        checkpoint = family_checkpoint(name, config.processor, kinds)
    try:
        settings = cls.settings_class.resolve(checkpoint, config.processor_options)
    except (ValueError, TypeError, OverflowError) as e:  # int("sixteen"), int(inf), int(None) from a processor config
        raise ConfigError(f"{config.processor}: a processor setting of family {name} is not a number ({type(e).__name__}: "
                          f"{e}); fix it in the checkpoint's processor config, or override it with --processor-options "
                          f"NAME=VALUE") from None
    return cls(kinds, settings)


__all__ = ["FAMILIES", "MODEL_INPUT_KEYS", "MODEL_TYPES", "PER_TOKEN_KEYS", "Expansion", "Family", "FamilyStateError",
           "GenericSettings", "RecordMedia", "Run", "family_names", "family_of_model", "families_of_processor", "make_family"]
