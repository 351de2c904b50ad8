"""What the report and ``packer inspect`` say about the model family a build was made for.

A build records its family in the manifest (``tokenizer["family"]``: the family's ``describe()``,
with the processor class and the settings read from the checkpoint). The generic token-count
policies (``image_tokens = "fixed:image_size=336,patch_size=14"``, ``image_token = "<image>"``, ...)
are settings of the ``generic`` family only: a named family counts with its processor's own
settings, so for such a build they are left out of the config the report shows (the manifest keeps
the whole config; the fingerprint depends on it), and ``modalities`` shows the kinds the family encodes.

    family_section(manifest)  # {"name": "qwen3vl", "processor_class": "Qwen3VLProcessor", "processor": ...,
                              #  "modalities": ["image", "video"], "runs": {...}, "settings": {...}}
    shown_config(manifest)    # manifest.config less the generic policy keys, for a named family
"""

from __future__ import annotations

from typing import Any

import numpy as np

from packer.shards.manifest import Manifest
from packer.shards.schema import MEDIA_KINDS

GENERIC = "generic"
# The generic family's settings: placeholder token, token-count policy and begin / end tokens of each kind
GENERIC_POLICY_KEYS = tuple(f"{kind}_{what}" for kind in MEDIA_KINDS for what in ("token", "tokens", "begin", "end"))


def family_section(manifest: Manifest) -> dict[str, Any]:
    """The family, its processor class and checkpoint (``processor``: the build's ``--processor``, empty when
    none), the kinds it encodes, their placeholder runs and the resolved settings. A build made before the
    family was recorded is ``generic``, its settings the config's policies."""
    recorded = dict(manifest.tokenizer.get("family") or {})
    config = manifest.config
    name = str(recorded.get("name") or config.get("family") or GENERIC)
    settings = recorded.get("settings")
    if settings is None and name == GENERIC:
        settings = {k: config[k] for k in GENERIC_POLICY_KEYS if k in config}
    return {"name": name, "processor_class": str(recorded.get("processor_class") or ""),
            "processor": str(config.get("processor") or ""),
            "modalities": list(recorded.get("modalities") or config.get("modalities") or []),
            "runs": dict(recorded.get("runs") or {}), "rope": str(recorded.get("rope") or ""),
            "settings": dict(settings or {})}


def shown_config(manifest: Manifest) -> dict[str, Any]:
    """The resolved config as the report shows it: a named family's build without the generic policy keys
    (they played no part), its ``modalities`` the kinds the family encodes."""
    family = family_section(manifest)
    if family["name"] == GENERIC:
        return dict(manifest.config)
    shown = {k: v for k, v in manifest.config.items() if k not in GENERIC_POLICY_KEYS}
    if "modalities" in shown:
        shown["modalities"] = family["modalities"]
    return shown


def media_counts(kinds: Any, tokens: Any) -> dict[str, dict[str, int]]:
    """Items and placeholder tokens per media kind (every kind listed, zeros included), from the packed
    spans' kinds and token counts."""
    kinds = np.asarray(kinds, dtype=object).astype(str)
    tokens = np.asarray(tokens, dtype=np.int64)
    return {k: {"items": int((kinds == k).sum()), "tokens": int(tokens[kinds == k].sum())}
            for k in [*MEDIA_KINDS, *sorted(set(kinds.tolist()) - set(MEDIA_KINDS))]}


def settings_line(family: dict[str, Any]) -> str:
    """A named family's resolved settings, ``key=value`` (its tokens left out: ``runs`` names them)."""
    return ", ".join(f"{k}={v}" for k, v in sorted(family["settings"].items()) if not isinstance(v, (str, dict, list)))


def family_line(family: dict[str, Any]) -> str:
    """``qwen3vl (Qwen3VLProcessor from CHECKPOINT)``; ``generic`` with its policies for a generic build."""
    if family["name"] == GENERIC:
        settings = family["settings"]
        policies = settings.get("policies") or {k: settings.get(f"{k}_tokens") for k in MEDIA_KINDS}
        shown = [f"{k} {policies[k]}" for k in family["modalities"] if policies.get(k)]
        return GENERIC + (f" (token-count policies: {', '.join(shown)})" if shown else "")
    source = f" from {family['processor']}" if family["processor"] else ""
    return f"{family['name']} ({family['processor_class'] or 'processor'}{source})"
