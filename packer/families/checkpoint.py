"""Read a processor checkpoint's settings: the JSON files ``save_pretrained`` writes, no model code.

``--processor PATH_OR_ID`` names a folder (or a hub id, looked up in the local hub cache first)
holding the processor's configs. transformers 5.x writes one ``processor_config.json`` with
each sub-processor nested under its attribute name (``image_processor``, ``video_processor``,
``feature_extractor``) beside the processor's own keyword arguments (``image_seq_length``);
earlier versions, and most hub checkpoints, wrote ``preprocessor_config.json`` (the image
processor, or an audio model's feature extractor) and ``video_preprocessor_config.json``.
:func:`read_checkpoint` takes each sub-processor's settings from where ``AutoProcessor`` takes them
(the nested dict if there is one, else its own file; transformers never merges the two) into one
:class:`Checkpoint`; a family takes its settings from it, its own defaults (the processor classes'
defaults, tested equal) for a key the config does not hold. Reading JSON keeps a build free of
torch: the processor classes are not imported.

A build reproduces a processor it can read, never one it guesses (:func:`family_checkpoint`):

- a named family needs ``--processor`` (class defaults are not any released checkpoint's budgets:
  Qwen3-VL's give 360 placeholders where the 8B checkpoint gives 660);
- a checkpoint without the config of a sub-processor the build uses (no ``video_processor`` for a
  build that encodes video) is refused: ``AutoProcessor`` then builds that sub-processor from the
  image processor's ``preprocessor_config.json`` -- for Qwen3-VL a ``Qwen2VLVideoProcessor`` with
  the image budget and no frame sampling (774 ids where the family's defaults would give 246), a
  processor the family does not reproduce;
- a checkpoint whose processor or tokenizer is its own code (``auto_map``) is refused
  (:mod:`packer.io.pretrained`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from packer.errors import ConfigError
from packer.io.pretrained import check_name

FILES = ("processor_config.json", "preprocessor_config.json", "video_preprocessor_config.json")
SUBPROCESSORS = ("image_processor", "video_processor", "feature_extractor")


@dataclass(frozen=True)
class Checkpoint:
    """The settings found in a processor checkpoint (empty dicts where a file or key is absent)."""

    name: str = ""
    processor: dict[str, Any] = field(default_factory=dict)  # the processor's own kwargs (processor_class, ...)
    image_processor: dict[str, Any] = field(default_factory=dict)
    video_processor: dict[str, Any] = field(default_factory=dict)
    feature_extractor: dict[str, Any] = field(default_factory=dict)
    files: tuple[str, ...] = ()
    sources: dict[str, str] = field(default_factory=dict)  # section -> the file (and key) its settings came from

    def get(self, section: str, key: str, default: Any = None) -> Any:
        return getattr(self, section).get(key, default)


def read_checkpoint(name_or_path: str) -> Checkpoint:
    """The processor settings stored at ``name_or_path`` (see the module docstring)."""
    if not name_or_path:
        return Checkpoint()
    check_name(name_or_path, "processor")
    found = _find_files(name_or_path)
    if not found:
        raise ConfigError(f"processor {name_or_path!r}: no {', '.join(FILES)} there (a folder written by "
                          f"processor.save_pretrained, or a hub id in the local hub cache)")
    contents: dict[str, dict[str, Any]] = {}
    for filename, path in found.items():
        try:
            content = json.loads(Path(path).read_text(encoding="utf-8"))
        except (OSError, ValueError) as e:
            raise ConfigError(f"processor {name_or_path!r}: cannot read {filename}: {e}") from None
        if not isinstance(content, dict):
            raise ConfigError(f"processor {name_or_path!r}: {filename} is not a JSON object")
        contents[filename] = content
    data: dict[str, dict[str, Any]] = {k: {} for k in ("processor", *SUBPROCESSORS)}
    sources: dict[str, str] = {}  # transformers takes a nested dict alone, else the sub-processor's file, else the legacy one
    nested = contents.get("processor_config.json", {})
    for key, value in nested.items():  # the processor's own kwargs, and (5.x) each sub-processor nested
        if key not in (*SUBPROCESSORS, "audio_processor") or not isinstance(value, dict):
            data["processor"][key] = value
    for section, keys in (("image_processor", ("image_processor",)), ("video_processor", ("video_processor",)),
                          ("feature_extractor", ("feature_extractor", "audio_processor"))):  # transformers' order
        key = next((k for k in keys if isinstance(nested.get(k), dict)), None)
        if key is not None:
            data[section], sources[section] = dict(nested[key]), f"processor_config.json[{key}]"
    video = contents.get("video_preprocessor_config.json")
    if video is not None and "video_processor" not in sources:
        data["video_processor"], sources["video_processor"] = dict(video), "video_preprocessor_config.json"
    legacy = contents.get("preprocessor_config.json")
    if legacy is not None:  # each sub-processor without a config of its own reads this file (transformers' fallback)
        fits = {"image_processor": "image_processor_type" in legacy or "feature_extractor_type" not in legacy,
                "feature_extractor": "feature_extractor_type" in legacy,
                "video_processor": "video_processor_type" in legacy}  # else AutoProcessor builds another class from it
        for section, ok in fits.items():
            if ok and section not in sources:
                data[section], sources[section] = dict(legacy), "preprocessor_config.json"
        if legacy.get("processor_class") and "processor_class" not in data["processor"]:
            data["processor"]["processor_class"] = legacy["processor_class"]
    return Checkpoint(name_or_path, **data, files=tuple(sorted(found)), sources=sources)


SECTION_OF = {"image": "image_processor", "video": "video_processor", "audio": "feature_extractor"}


def family_checkpoint(family: str, processor: str, kinds: tuple[str, ...]) -> Checkpoint:
    """The checkpoint a named ``family`` takes its settings from, for a build that encodes ``kinds``; refused
    (:class:`ConfigError`, exit 2) where the build could not reproduce ``AutoProcessor.from_pretrained(processor)``:
    no processor named, a processor that is the checkpoint's own code, a sub-processor the build uses whose config
    the checkpoint lacks (see the module docstring)."""
    if not processor:
        raise ConfigError(f"family {family} needs --processor: the checkpoint (a folder written by "
                          f"processor.save_pretrained, or a hub id) whose configs give the budgets it counts with; "
                          f"without one the class defaults would be used, which are no released checkpoint's. Pass "
                          f"--processor PATH_OR_ID (e.g. the model's hub id), or `processor = ...` in the pipeline")
    from packer.io.pretrained import declared_remote_code, remote_code_error

    check_name(processor, "processor")
    why = declared_remote_code(processor, "processor")
    if why:
        raise remote_code_error("processor", processor, why)
    checkpoint = read_checkpoint(processor)
    for kind in kinds:
        section = SECTION_OF[kind]
        if section in checkpoint.sources:
            continue
        instead = (f"AutoProcessor would build its {section} from "
                   + ("preprocessor_config.json, the image processor's config (another class, the image's budget)"
                      if "preprocessor_config.json" in checkpoint.files and kind != "image" else "no config at all"))
        raise ConfigError(f"processor {processor!r} has no {section} config (neither {section} in "
                          f"processor_config.json nor {_OWN_FILE[kind]}), and the build encodes {kind} "
                          f"(modalities {list(kinds)}): {instead}, which family {family} does not reproduce. Save the "
                          f"model's full processor into the folder (AutoProcessor.from_pretrained(model_id)"
                          f".save_pretrained(folder)), or set modalities to the kinds the records hold without {kind}")
    return checkpoint


_OWN_FILE = {"image": "preprocessor_config.json", "video": "video_preprocessor_config.json",
             "audio": "preprocessor_config.json"}


def _find_files(name_or_path: str) -> dict[str, str]:
    folder = Path(name_or_path).expanduser()
    if folder.is_dir():
        return {f: str(folder / f) for f in FILES if (folder / f).is_file()}
    from huggingface_hub import try_to_load_from_cache

    found = {}
    for f in FILES:
        hit = try_to_load_from_cache(name_or_path, f)
        if isinstance(hit, str):
            found[f] = hit
    if found:
        return found
    from packer.io.pretrained import hub_unreachable

    unreachable = hub_unreachable()
    if unreachable:
        raise ConfigError(f"processor {name_or_path!r}: no such folder, not in the local hub cache, and the hub is "
                          f"unreachable ({unreachable}); pass a folder written by processor.save_pretrained")
    from huggingface_hub import hf_hub_download

    for f in FILES:
        try:
            found[f] = hf_hub_download(name_or_path, f)
        except Exception:  # noqa: BLE001 -- a file the repository does not have
            continue
    return found
