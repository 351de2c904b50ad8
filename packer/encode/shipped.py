"""The files of the driver's disk a stage-1 worker reads, carried in the job instead of looked up by path.

A worker on another node (``--engine ray`` on a cluster) has neither the driver's folders nor its current
folder: a pipeline's ``tokenizer = "../sample_data/tokenizer"`` resolves to a folder relative to the
driver's, a hub name to the driver's hub cache, a ``--chat-template`` file to the driver's disk. The
driver reads those files once (:func:`ship`: the tokenizer's folder, or the hub cache snapshot it loads
from, its tokenizer files only -- never weights -- and the template file) and they travel inside the
:class:`~packer.encode.spec.EncoderSpec` the workers are set up with (through Ray's object store).
A worker writes them into ``$PACKER_CACHE/shipped/<sha256>/`` once per machine (:func:`unpack`) and
loads from there: the same bytes as on the driver, so the same tokenizer, in whatever folder its
``ray start`` ran. The manifest still names the tokenizer as the user gave it.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from pathlib import Path

from packer.errors import ConfigError
from packer.io.cache import cache_root
from packer.io.files import atomic_open

# What a tokenizer (and a processor's tokenizer) is read from: configs, vocabularies, templates. Weights are left.
SUFFIXES = (".json", ".txt", ".model", ".jinja", ".tiktoken", ".vocab", ".merges")
MAX_BYTES = 256 * 2**20  # in all: a tokenizer folder is tens of MB at most
NAMES = ("tokenizer_config.json", "tokenizer.json", "config.json")  # one of them locates a hub cache snapshot


@dataclass(frozen=True)
class Shipped:
    """``files``: (path relative to the tokenizer folder, bytes); ``template``: a ``.jinja`` file's bytes."""

    files: tuple[tuple[str, bytes], ...] = ()
    template: bytes | None = None

    def digest(self) -> str:
        h = hashlib.sha256()
        for name, data in self.files:
            h.update(name.encode() + b"\0" + hashlib.sha256(data).digest())
        h.update(b"template\0" + hashlib.sha256(self.template or b"").digest())
        return h.hexdigest()


def tokenizer_folder(name: str) -> Path | None:
    """The local folder a tokenizer is loaded from: ``name`` itself when it is a folder, else the hub cache's
    snapshot of that hub name (None: neither; the worker then resolves ``name`` itself)."""
    folder = Path(name).expanduser()
    if folder.is_dir():
        return folder.resolve()
    if not name or "://" in name:
        return None
    try:
        from huggingface_hub import try_to_load_from_cache
    except ImportError:
        return None
    for filename in NAMES:
        try:
            hit = try_to_load_from_cache(name, filename)
        except Exception:  # noqa: BLE001 -- not a valid hub name: nothing cached under it
            return None
        if isinstance(hit, str):
            return Path(hit).parent
    return None


def ship(tokenizer: str, chat_template: str = "") -> Shipped:
    """Read the tokenizer's files (and a ``.jinja`` chat template file) on the driver."""
    files: list[tuple[str, bytes]] = []
    folder = tokenizer_folder(tokenizer)
    total = 0
    if folder is not None:
        for path in sorted(folder.rglob("*")):
            if path.is_file() and path.suffix in SUFFIXES and not path.name.startswith("."):
                data = path.read_bytes()  # a hub snapshot's files are links into its blobs: read through them
                total += len(data)
                if total > MAX_BYTES:
                    raise ConfigError(f"tokenizer {tokenizer!r}: its folder {folder} holds over {MAX_BYTES:,} bytes of "
                                      f"tokenizer files ({', '.join(SUFFIXES)}) to send to the workers; give a folder "
                                      f"with the tokenizer only")
                files.append((path.relative_to(folder).as_posix(), data))
    template = None
    if chat_template.endswith(".jinja") and Path(chat_template).is_file():
        template = Path(chat_template).read_bytes()
    return Shipped(tuple(files), template)


def unpack(shipped: Shipped) -> tuple[str | None, str | None]:
    """Write the shipped files under ``$PACKER_CACHE/shipped/<sha256>/`` (once per machine: a folder whose
    files all have their shipped size is reused); returns (the tokenizer folder or None, the template file
    or None)."""
    root = cache_root() / "shipped" / shipped.digest()
    for name, data in shipped.files:
        target = root / "tokenizer" / name
        if not (target.is_file() and target.stat().st_size == len(data)):
            target.parent.mkdir(parents=True, exist_ok=True)
            with atomic_open(target) as f:
                f.write(data)
    template = None
    if shipped.template is not None:
        template = root / "chat_template.jinja"
        if not (template.is_file() and template.stat().st_size == len(shipped.template)):
            root.mkdir(parents=True, exist_ok=True)
            with atomic_open(template) as f:
                f.write(shipped.template)
    return (os.fspath(root / "tokenizer") if shipped.files else None), (os.fspath(template) if template else None)
