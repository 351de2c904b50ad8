"""Load an HF tokenizer / processor / config without ever running code from the checkpoint.

A checkpoint folder can ship Python (``auto_map`` in its ``config.json`` / ``tokenizer_config.json``
pointing at a ``.py`` beside it). Left to its default (``trust_remote_code=None``), transformers then asks
on standard input "Do you wish to run the custom code? [y/N]" -- inside ``packer build`` or
``packer verify --against-processor``, where a ``y`` (a pipe, a ``yes |``) runs the folder's code. packer
never does: every load passes ``trust_remote_code=False`` explicitly, standard input is replaced by an
empty stream while transformers runs (so no prompt of any dependency can read an answer), and a folder
that needs its own code is refused with a :class:`~packer.errors.ConfigError` (exit 2) saying so.

"Needs its own code": an ``auto_map`` in the checkpoint's JSON files naming the class being loaded
(``AutoTokenizer``, ``AutoProcessor`` and its sub-processors), or naming ``AutoConfig`` where no
``tokenizer_class`` / ``processor_class`` is declared (the model config would then decide the class, and
it is defined in the folder's .py). With ``trust_remote_code=False`` transformers would load some built-in
class in its place (``TokenizersBackend``): a tokenizer other than the checkpoint's, which packer refuses
rather than build with. An ``auto_map`` for the model alone (``AutoModel``), beside a declared tokenizer
class, is harmless and loads.

    >>> load_pretrained(AutoTokenizer, "ckpt/")            # doctest: +SKIP
    ConfigError: tokenizer 'ckpt/' needs the Python code the checkpoint ships (auto_map ...): packer never runs ...
"""

from __future__ import annotations

import contextlib
import io
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from packer.errors import ConfigError

HUB_TIMEOUT_S = 5.0  # the one reachability check before a hub download
REMOTE_CODE_MARKERS = ("trust_remote_code", "contains custom code", "references custom code")
FILES = ("config.json", "tokenizer_config.json", "processor_config.json", "preprocessor_config.json",
         "video_preprocessor_config.json")
# what each load reads: the Auto classes whose auto_map entry replaces it, and the key that declares a built-in class
CLASSES = {"tokenizer": (("AutoTokenizer",), "tokenizer_class"),
           "processor": (("AutoProcessor", "AutoTokenizer", "AutoImageProcessor", "AutoVideoProcessor",
                          "AutoFeatureExtractor"), "processor_class")}


def declared_remote_code(name: str, what: str) -> str:
    """Why the checkpoint at ``name`` (a folder, or a hub id's cached files) needs its own code to load its ``what``
    (``tokenizer`` / ``processor``): e.g. "config.json auto_map names AutoConfig: evil.EvilConfig"; '' when it does not
    (or when its files are not here to read: transformers, told trust_remote_code=False, still refuses the code)."""
    autos, declaring_key = CLASSES.get(what, CLASSES["processor"])
    found = _read(name)
    declared = any(isinstance(d.get(declaring_key), str) and d.get(declaring_key) for d in found.values())
    if what == "processor":  # a processor is also declared by its image processor / feature extractor's class alone
        declared = declared or any(isinstance(d.get(k), str) for d in found.values()
                                   for k in ("image_processor_type", "feature_extractor_type", "video_processor_type"))
    for filename, content in found.items():
        auto_map = content.get("auto_map")
        if isinstance(auto_map, (list, tuple)) and filename == "tokenizer_config.json":  # the legacy tokenizer form
            return f"{filename} auto_map names a tokenizer class: {list(auto_map)}"
        if not isinstance(auto_map, dict):
            continue
        for key in autos:
            if auto_map.get(key):
                return f"{filename} auto_map names {key}: {auto_map[key]}"
        if auto_map.get("AutoConfig") and not declared:
            return (f"{filename} auto_map names AutoConfig: {auto_map['AutoConfig']}, and no {declaring_key} is declared "
                    f"(the model config, defined in the folder's code, would decide the class)")
    return ""


def _read(name: str) -> dict[str, dict]:
    """The checkpoint's JSON files that are on this machine (a folder's, or a hub id's in the local cache)."""
    import json

    folder = Path(name).expanduser()
    paths: dict[str, str] = {}
    if folder.is_dir():
        paths = {f: str(folder / f) for f in FILES if (folder / f).is_file()}
    elif "://" not in name:
        try:
            from huggingface_hub import try_to_load_from_cache

            for f in FILES:
                hit = try_to_load_from_cache(name, f)
                if isinstance(hit, str):
                    paths[f] = hit
        except Exception:  # noqa: BLE001 -- not a valid hub id: nothing cached to read
            return {}
    found = {}
    for filename, path in paths.items():
        try:
            content = json.loads(Path(path).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        if isinstance(content, dict):
            found[filename] = content
    return found


def check_name(name: str, what: str) -> None:
    """Refuse (:class:`ConfigError`, exit 2) a ``--processor`` / ``--tokenizer`` value that can name nothing to load:
    a file (a checkpoint is a folder), or a path that is no folder here and cannot be a hub id either (``/abs/path``,
    ``a/b/c``, ``./x``). Left to transformers, huggingface_hub's repo-id check raised ``HFValidationError`` from deep
    inside the load (a traceback, exit 1). A valid hub id that is no folder here passes: the hub (or its cache) says."""
    if not name or "://" in name:
        return
    path = Path(name).expanduser()
    if path.is_dir():
        return
    fix = (f"pass the folder the {what}'s files are in (written by save_pretrained), or a hub id such as "
           f"Qwen/Qwen3-VL-8B-Instruct")
    if path.exists():
        raise ConfigError(f"cannot load {what} {name!r}: it is a file, not a folder; {fix}")
    from huggingface_hub.errors import HFValidationError
    from huggingface_hub.utils import validate_repo_id

    try:
        validate_repo_id(name)
    except HFValidationError:
        where = "" if path.is_absolute() else f" under {os.getcwd()}"
        raise ConfigError(f"cannot load {what} {name!r}: no such folder{where}, and not a hub id (namespace/name); "
                          f"{fix}") from None


def needs_remote_code(error: BaseException) -> bool:
    """Is ``error`` transformers refusing a checkpoint whose classes live in the checkpoint's own .py files?"""
    text = str(error)
    return any(m in text for m in REMOTE_CODE_MARKERS)


def remote_code_error(what: str, name: str, why: str = "") -> ConfigError:
    because = why or "transformers refuses it without trust_remote_code=True"
    return ConfigError(f"{what} {name!r} needs the Python code the checkpoint ships ({because}): packer never runs code "
                       f"from a checkpoint (trust_remote_code=False). Pass a folder whose {what} is a transformers class "
                       f"(its {CLASSES.get(what, CLASSES['processor'])[1]} naming one, no auto_map for it), e.g. the "
                       f"{what} loaded in a trusted environment and saved with save_pretrained")


@contextlib.contextmanager
def no_stdin() -> Iterator[None]:
    """Standard input is an empty stream meanwhile: a dependency's ``input()`` gets EOF, never the caller's answer."""
    saved = sys.stdin
    sys.stdin = io.StringIO("")
    try:
        yield
    finally:
        sys.stdin = saved


def load_pretrained(cls: Any, name: str, what: str = "checkpoint", **kwargs: Any) -> Any:
    """``cls.from_pretrained(name, trust_remote_code=False, **kwargs)`` with standard input detached; a checkpoint that
    needs its own code, or a name that can be no checkpoint (:func:`check_name`), raises :class:`ConfigError`. Other
    errors pass through unchanged (the caller words them)."""
    check_name(name, what)
    why = declared_remote_code(name, what)
    if why:
        raise remote_code_error(what, name, why)
    kwargs["trust_remote_code"] = False
    try:
        with no_stdin():
            loaded = cls.from_pretrained(name, **kwargs)
    except Exception as e:
        if needs_remote_code(e):
            raise remote_code_error(what, name) from None
        raise
    why = declared_remote_code(name, what)  # a hub id's files downloaded by the load: read now
    if why:
        raise remote_code_error(what, name, why)
    return loaded


__all__ = ["check_name", "declared_remote_code", "load_pretrained", "needs_remote_code", "no_stdin", "remote_code_error"]


def hub_unreachable() -> str:
    """Why the hub cannot be reached now ('' if it answers), in at most HUB_TIMEOUT_S seconds, no retries: asked once
    before a download, by the tokenizer's loader and the processor checkpoint's reader alike."""
    from huggingface_hub import constants, get_session, is_offline_mode

    if is_offline_mode():
        return "HF_HUB_OFFLINE is set"
    try:
        get_session().head(constants.ENDPOINT, timeout=HUB_TIMEOUT_S)
    except Exception as e:  # DNS failure, refused, timed out, proxy error: all mean "no hub"
        return f"{constants.ENDPOINT}: {type(e).__name__}: {e}"
    return ""
