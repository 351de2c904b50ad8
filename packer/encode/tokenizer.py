"""Load any HF tokenizer (local folder or hub name), add the media placeholders, fingerprint it."""

from __future__ import annotations

import hashlib
import json
from typing import Any

from packer.errors import PackerError


def load_tokenizer(name_or_path: str, placeholders: list[str]) -> Any:
    """A fast HF tokenizer with every placeholder string present as a special token.

    A fast (Rust) tokenizer is required: labels are derived from character offsets.
    """
    if not name_or_path:
        raise PackerError("no tokenizer given: set `tokenizer` in the pipeline or pass --tokenizer NAME_OR_PATH")
    from tokenizers import AddedToken
    from transformers import AutoTokenizer

    try:
        tok = AutoTokenizer.from_pretrained(name_or_path, use_fast=True)
    except Exception as e:  # HF raises OSError, ValueError, HTTP errors... all mean "cannot load"
        raise PackerError(
            f"cannot load tokenizer {name_or_path!r}: {e}. Pass a local folder with tokenizer.json, "
            f"or a hub name on a machine with network access."
        ) from None
    if not getattr(tok, "is_fast", False):
        raise PackerError(f"tokenizer {name_or_path!r} has no fast (Rust) implementation; packer needs offsets")
    tok.model_max_length = 1 << 62  # packer enforces lengths itself; silence HF's length warning
    missing = [t for t in placeholders if t not in tok.get_vocab()]
    if missing:
        tok.add_tokens([AddedToken(t, special=True, normalized=False) for t in missing], special_tokens=True)
    return tok


def fingerprint(tok: Any, name_or_path: str, placeholders: list[str]) -> dict[str, Any]:
    """What identifies a tokenizer's behaviour: its serialized model, template and specials."""
    h = hashlib.sha256()
    h.update(tok.backend_tokenizer.to_str().encode())
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
