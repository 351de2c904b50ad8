"""Read a processor checkpoint's settings: the JSON files ``save_pretrained`` writes, no model code.

``--processor PATH_OR_ID`` names a folder (or a hub id, looked up in the local hub cache first)
holding the processor's configs. transformers 5.x writes one ``processor_config.json`` with
each sub-processor nested under its attribute name (``image_processor``, ``video_processor``,
``feature_extractor``) beside the processor's own keyword arguments (``image_seq_length``);
earlier versions, and most hub checkpoints, wrote ``preprocessor_config.json`` (the image
processor, or an audio model's feature extractor) and ``video_preprocessor_config.json``.
:func:`read_checkpoint` merges whichever are present into one :class:`Checkpoint`; a family
takes its settings from it, its own defaults (the processor classes' defaults, tested equal)
otherwise. Reading JSON keeps a build free of torch: the processor classes are not imported.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from packer.errors import ConfigError

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

    def get(self, section: str, key: str, default: Any = None) -> Any:
        return getattr(self, section).get(key, default)


def read_checkpoint(name_or_path: str) -> Checkpoint:
    """The processor settings stored at ``name_or_path`` (see the module docstring)."""
    if not name_or_path:
        return Checkpoint()
    found = _find_files(name_or_path)
    if not found:
        raise ConfigError(f"processor {name_or_path!r}: no {', '.join(FILES)} there (a folder written by "
                          f"processor.save_pretrained, or a hub id in the local hub cache)")
    data: dict[str, dict[str, Any]] = {k: {} for k in ("processor", *SUBPROCESSORS)}
    for filename, path in found.items():
        try:
            content = json.loads(Path(path).read_text(encoding="utf-8"))
        except (OSError, ValueError) as e:
            raise ConfigError(f"processor {name_or_path!r}: cannot read {filename}: {e}") from None
        if not isinstance(content, dict):
            raise ConfigError(f"processor {name_or_path!r}: {filename} is not a JSON object")
        if filename == "processor_config.json":
            for key, value in content.items():
                if key in SUBPROCESSORS and isinstance(value, dict):
                    data[key].update(value)
                else:
                    data["processor"][key] = value
        elif filename == "video_preprocessor_config.json":
            data["video_processor"].update(content)
        else:  # preprocessor_config.json: an image processor, or (audio models) a feature extractor
            section = "feature_extractor" if "feature_extractor_type" in content and "image_processor_type" not in content \
                else "image_processor"
            data[section] = {**content, **data[section]}
            if content.get("processor_class") and "processor_class" not in data["processor"]:
                data["processor"]["processor_class"] = content["processor_class"]
    return Checkpoint(name_or_path, **data, files=tuple(sorted(found)))


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
    from packer.encode.tokenizer import _hub_unreachable

    unreachable = _hub_unreachable()
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
