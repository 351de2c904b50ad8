"""Load any HF tokenizer (local folder or hub name), check or add the media placeholders, fingerprint it.

Loading does not import torch where transformers' own choice of class is decidable from the
tokenizer files alone: a folder with ``tokenizer.json`` and a ``tokenizer_config.json`` naming
its class, without ``config.json`` or ``auto_map`` (every ``OUT/tokenizer``, ``sample_data/tokenizer``;
not LlamaTokenizer; for a hub-cache entry only the generic class). ``AutoTokenizer`` reads the
model config, and transformers' config module imports torch whenever it is installed (5.x has
no switch). Anything else goes through ``AutoTokenizer``, unchanged. A hub name is looked up in
the local hub cache first; when it is not there the hub is tried once with a short timeout, so
an offline machine fails in seconds.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
from pathlib import Path
from typing import Any

from packer.errors import PackerError
from packer.io.pretrained import check_name, hub_unreachable, load_pretrained

_GENERIC = {"TokenizersBackend", "PreTrainedTokenizer", "PythonBackend"}  # after removesuffix("Fast")


def load_tokenizer(name_or_path: str, placeholders: list[str]) -> Any:
    """A fast HF tokenizer with every placeholder string present as a special token (added where absent: the
    configurable ``generic`` family's pipelines; a named family's tokenizer must already hold them, see
    :func:`require_tokens`).

    A fast (Rust) tokenizer is required: labels are derived from character offsets.
    """
    tok = open_tokenizer(name_or_path)
    add_tokens(tok, placeholders)
    return tok


def open_tokenizer(name_or_path: str) -> Any:
    """The fast HF tokenizer at ``name_or_path`` as it is (no token added)."""
    if not name_or_path:
        raise PackerError("no tokenizer given: set `tokenizer` in the pipeline or pass --tokenizer NAME_OR_PATH")
    folder = Path(name_or_path).expanduser()
    if folder.is_dir():
        tok = _load(str(folder), _files_in_folder(folder))
    else:
        tok = _load_hub(name_or_path)
    if not getattr(tok, "is_fast", False):
        raise PackerError(f"tokenizer {name_or_path!r} has no fast (Rust) implementation; packer needs offsets")
    tok.model_max_length = 1 << 62  # packer enforces lengths itself; silence HF's length warning
    return tok


def missing_tokens(tok: Any, tokens: list[str]) -> list[str]:
    """The ``tokens`` the tokenizer's vocabulary lacks."""
    backend = tok.backend_tokenizer  # one lookup per token, not get_vocab()'s 151k-entry dict (~0.2 s)
    return [t for t in dict.fromkeys(tokens) if backend.token_to_id(t) is None]


def add_tokens(tok: Any, placeholders: list[str]) -> list[str]:
    """Add the placeholders the tokenizer lacks as special tokens; returns those added."""
    from tokenizers import AddedToken

    missing = missing_tokens(tok, placeholders)
    if missing:
        tok.add_tokens([AddedToken(t, special=True, normalized=False) for t in missing], special_tokens=True)
    return missing


def require_tokens(tok: Any, name_or_path: str, tokens: list[str], family: str, processor: str) -> None:
    """A named family's tokenizer is the model's: it holds every token the family's processor writes, and packer never
    adds one (an added token gets an id past the model's embeddings, or another id than the model was trained with)."""
    from packer.errors import ConfigError

    missing = missing_tokens(tok, tokens)
    if missing:
        raise ConfigError(f"tokenizer {name_or_path!r} lacks {', '.join(missing)} (family {family} needs "
                          f"{', '.join(dict.fromkeys(tokens))} in the tokenizer, as the model's own tokenizer holds "
                          f"them): packer never adds a named family's tokens. Pass the model's tokenizer: leave "
                          f"--tokenizer unset to use the processor's ({processor or '--processor'}), or give --tokenizer "
                          f"the model's; or check --family")


def _cannot(name: str, why: object) -> PackerError:
    return PackerError(f"cannot load tokenizer {name!r}: {why}. Pass a local folder with tokenizer.json, "
                       f"or a hub name on a machine with network access.")


def _load_hub(name: str) -> Any:
    """A hub name: the local hub cache first, then (reachable hub only) a download."""
    check_name(name, "tokenizer")  # a file, or a path that is no folder and no hub id: a configuration error
    cached = _files_in_cache(name)
    if cached("tokenizer_config.json") or cached("tokenizer.json"):
        try:
            return _load(name, cached, local_files_only=True)
        except PackerError:
            pass  # an incomplete cache entry: download what is missing below, if the hub answers
    unreachable = hub_unreachable()
    if unreachable:
        raise PackerError(f"cannot load tokenizer {name!r}: not in the local hub cache and the hub is unreachable "
                          f"({unreachable}; offline?). Pass a local folder with tokenizer.json "
                          f"(e.g. one saved with save_pretrained, or OUT/tokenizer of an earlier build).")
    return _load(name, lambda _filename: None)


# A finder maps a file name to its path, False where the file is known to be absent, None where unknown.
def _files_in_folder(folder: Path):
    def find(filename: str) -> str | bool | None:
        return str(folder / filename) if (folder / filename).is_file() else False
    return find


def _files_in_cache(name: str):
    from huggingface_hub import try_to_load_from_cache

    def find(filename: str) -> str | bool | None:
        hit = try_to_load_from_cache(name, filename)
        if isinstance(hit, str):
            return hit
        return False if hit is not None else None  # _CACHED_NO_EXIST: the hub said the file does not exist
    return find


def _import_transformers_quietly() -> None:
    """Without torch (``pip install packer``) transformers' import advises "PyTorch was not found. Models
    won't be available...": true, and not a problem for a build, so it is not printed."""
    if "transformers" in sys.modules:
        return
    before = os.environ.get("TRANSFORMERS_NO_ADVISORY_WARNINGS")
    os.environ["TRANSFORMERS_NO_ADVISORY_WARNINGS"] = "1"
    try:
        import transformers  # noqa: F401
    finally:
        if before is None:
            del os.environ["TRANSFORMERS_NO_ADVISORY_WARNINGS"]
        else:
            os.environ["TRANSFORMERS_NO_ADVISORY_WARNINGS"] = before


def _load(name: str, find, **kwargs: Any) -> Any:
    _import_transformers_quietly()
    try:
        cls = _declared_class(name, find)
        if cls is None:
            from transformers import AutoTokenizer  # imports torch if installed (transformers' config module)
            cls = AutoTokenizer
        return load_pretrained(cls, name, "tokenizer", **kwargs)
    except PackerError:
        raise
    except Exception as e:  # HF raises OSError, ValueError, HTTP errors... all mean "cannot load"
        raise _cannot(name, e) from None


def _declared_class(name: str, find) -> Any:
    """The class AutoTokenizer picks, where tokenizer_config.json alone decides it; None otherwise.

    Without config.json (and without auto_map) AutoTokenizer has no model type to override the
    declared class with: it loads ``tokenizer_class`` (``XFast`` = ``X``; the generic and Python
    classes become TokenizersBackend). LlamaTokenizer is left to AutoTokenizer (it checks
    tokenizer.json for ByteLevel), as is any hub id (its allow-list of ids is keyed by name).
    """
    config = find("tokenizer_config.json")
    if not config or not find("tokenizer.json") or find("config.json") is not False:
        return None
    try:
        declared = json.loads(Path(config).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    cls_name = declared.get("tokenizer_class")
    if not isinstance(cls_name, str) or "auto_map" in declared:
        return None
    from transformers.tokenization_utils_tokenizers import TokenizersBackend

    base = cls_name.removesuffix("Fast")
    if base in _GENERIC:
        return TokenizersBackend
    if base == "LlamaTokenizer" or not Path(name).expanduser().is_dir():
        return None
    import transformers

    cls = getattr(transformers, base, None)
    return cls if isinstance(cls, type) and issubclass(cls, TokenizersBackend) else None


def fingerprint(tok: Any, name_or_path: str, placeholders: list[str], serialized: str | None = None) -> dict[str, Any]:
    """What identifies a tokenizer's behaviour: its serialized model (``serialized``: its ``to_str()``, when
    the caller has it), template and specials."""
    h = hashlib.sha256()
    h.update((serialized if serialized is not None else tok.backend_tokenizer.to_str()).encode())
    h.update(json.dumps(tok.chat_template, sort_keys=True).encode())
    h.update(json.dumps({"bos": tok.bos_token, "eos": tok.eos_token, "pad": tok.pad_token}, sort_keys=True).encode())
    return {
        "name": name_or_path,
        "class": type(tok).__name__,
        "vocab_size": len(tok),
        "sha256": h.hexdigest(),
        "bos_token_id": tok.bos_token_id,
        "eos_token_id": tok.eos_token_id,
        "placeholders": {t: tok.convert_tokens_to_ids(t) for t in placeholders},
    }
