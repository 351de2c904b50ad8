"""What a packed row costs a training step -- not just its length.

A row's cost is linear in a few per-row statistics (``PackedDataset.row_stats()``,
:mod:`packer.shards.stats`)::

    cost = token * tokens + attention * Σ seg²
         + media_item * items + media_token * media_tokens                 (every kind)
         + image_item * image_items + image_token * image_tokens + image_square * Σ image_tokens²
         + audio_item * audio_items + audio_token * audio_tokens + audio_square * Σ audio_tokens²
         + video_item * video_items + video_token * video_tokens + video_square * Σ video_tokens² / t

Only ratios matter to a sampler, so the units are the coefficients' own: ``CostModel()``
counts in "one token through the LLM's dense layers", :meth:`CostModel.for_model` in FLOPs.

The coefficients in FLOPs, and their derivation, are :mod:`packer.cost.flops`; fitted to a measured
step, :mod:`packer.cost.calibrate`.
"""

from __future__ import annotations

import json
import numbers
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

import numpy as np

from packer.errors import ArgumentError, ConfigError
from packer.shards.schema import MEDIA_KINDS

KINDS = MEDIA_KINDS
COSTS = ("llm", "encoder", "supervised")  # the three things a row costs a step: CostModel.vector
PER_KIND = ("image", "audio")  # stats holding these are read per kind; video's arrays count where present
# The largest coefficient: its products stay finite. A row's largest statistic is Σ seg² of 2^31 - 1 tokens, under
# 4.7e18, so a term is under 4.7e218 and the 13 terms of a row, summed over 10^12 rows, under 1e233 (float64: 1.8e308).
# Real models sit far below: FLOPs a token of a 10^12-parameter model are 6e12, calibrated seconds under 1.
MAX_COEFFICIENT = 1e200


class CostModelError(ArgumentError):
    """A cost model's coefficients, or the file or model config they come from, cannot be used: a configuration
    error (exit 2), raised before any record is read. A ValueError too, for callers of the library that catch one."""


@dataclass(frozen=True)
class CostModel:
    token: float = 1.0
    attention: float = 1.0 / 49152  # 1 / (12 h) at h = 4096: causal attention (derivation above)
    media_item: float = 0.0
    media_token: float = 0.0
    image_item: float = 0.0
    image_token: float = 0.0
    image_square: float = 0.0
    audio_item: float = 0.0
    audio_token: float = 0.0
    audio_square: float = 0.0
    video_item: float = 0.0
    video_token: float = 0.0
    video_square: float = 0.0

    def __post_init__(self):
        """Every coefficient a finite number from 0 to :data:`MAX_COEFFICIENT`: a cost stored or summed from them is
        never inf, NaN or negative (an ``Infinity`` in a JSON stored inf and NaN for every sample)."""
        for f in fields(self):
            v = getattr(self, f.name)
            if isinstance(v, bool) or not isinstance(v, numbers.Real) or not 0 <= float(v) <= MAX_COEFFICIENT:
                raise CostModelError(f"cost model coefficient {f.name} = {v!r} is not a number from 0 to "
                                     f"{MAX_COEFFICIENT:g}: give finite, non-negative coefficients (packer calibrate "
                                     f"writes them)")
            object.__setattr__(self, f.name, float(v))

    def __call__(self, stats: dict[str, np.ndarray]) -> np.ndarray:
        """Per-row cost. Stats without the per-kind arrays (``image_tokens``, ...) are read as
        one kind of media: the one this model charges (image first), with Σ tokens² taken as
        media_tokens² / media_items (exact when a row's items have equal sizes, else low)."""
        cost = (self.token * stats["tokens"] + self.attention * stats["attention"]
                + self.media_item * stats["media_items"] + self.media_token * stats["media_tokens"])
        for kind, items, tokens, square in self._kinds(stats):
            c = (getattr(self, f"{kind}_item") * items + getattr(self, f"{kind}_token") * tokens
                 + getattr(self, f"{kind}_square") * square)
            cost = cost + c
        return np.asarray(cost, dtype=np.float64)

    def vector(self, stats: dict[str, np.ndarray]) -> np.ndarray:
        """Per row, the three costs of :data:`COSTS` as ``float64 [rows, 3]``: ``llm`` (tokens and attention pairs
        through the language model), ``encoder`` (the media towers: every media term), ``supervised`` (tokens the
        loss counts, ``stats["trained"]``; 0 where the stats lack them). ``llm + encoder`` is :meth:`__call__`, the
        row's compute; supervised tokens cost no compute of their own but weigh a rank's loss."""
        llm = np.asarray(self.token * stats["tokens"] + self.attention * stats["attention"], dtype=np.float64)
        total = self(stats)
        supervised = np.asarray(stats.get("trained", np.zeros_like(llm)), dtype=np.float64)
        return np.stack([llm, total - llm, supervised], axis=-1)

    def _kinds(self, stats):
        charged = [k for k in KINDS if any(getattr(self, f"{k}_{t}") for t in ("item", "token", "square"))]
        if all(f"{k}_tokens" in stats for k in PER_KIND):
            return [(k, stats[f"{k}_items"], stats[f"{k}_tokens"], stats[f"{k}_square"]) for k in charged
                    if f"{k}_tokens" in stats]
        if not charged:
            return []
        items, tokens = stats["media_items"], stats["media_tokens"]
        return [(charged[0], items, tokens, tokens**2 / np.maximum(items, 1))]

    def coefficients(self) -> dict[str, float]:
        """Every coefficient by name: what a cost model JSON holds (:meth:`load` reads it back)."""
        return {f.name: getattr(self, f.name) for f in fields(self)}

    @classmethod
    def of_build(cls, manifest: Any) -> CostModel:
        """The cost model a build recorded (its manifest's ``stats["cost_model"]["coefficients"]``: the one its
        samples' cost vectors hold), else ``CostModel()`` (a build from before it recorded one)."""
        recorded = (manifest.stats.get("cost_model") or {}).get("coefficients")
        return cls(**recorded) if recorded else cls()

    @classmethod
    def load(cls, path: str | Path) -> CostModel:
        """A cost model JSON: any subset of the coefficients (the rest default), at the top level or under
        ``coefficients`` (what ``packer calibrate`` writes). ``ValueError`` names a key that is no coefficient."""
        try:
            raw = json.loads(Path(path).read_text(encoding="utf-8"))
        except OSError as e:
            raise CostModelError(f"{path}: cannot read it ({e.strerror or e}): give a cost model JSON (packer calibrate "
                                 f"writes one)") from None
        except ValueError as e:
            raise CostModelError(f"{path}: not JSON ({e}): give a cost model JSON (packer calibrate writes one)") from None
        if isinstance(raw, dict) and _is_model_config(raw):
            raise CostModelError(f"{path}: a model's config, not a cost model JSON: give the coefficients (packer "
                                 f"calibrate writes them; packer build --cost-model takes a model config)")
        raw = raw.get("coefficients", raw) if isinstance(raw, dict) else raw
        if not isinstance(raw, dict):
            raise CostModelError(f"{path}: a cost model JSON is an object of coefficients, got {type(raw).__name__}: give "
                                 f"a cost model JSON (packer calibrate writes one)")
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(raw) - known)
        if unknown:
            raise CostModelError(f"{path}: {unknown} are not cost model coefficients (known: {sorted(known)})")
        bad = {k: v for k, v in raw.items()
               if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 <= v <= MAX_COEFFICIENT}
        if bad:
            raise CostModelError(f"{path}: coefficients must be finite non-negative numbers (at most "
                                 f"{MAX_COEFFICIENT:g}), got {bad}")
        return cls(**{k: float(v) for k, v in raw.items()})

    @classmethod
    def for_model(cls, config: Any, *, causal: bool = True, training: bool = True, frozen: tuple[str, ...] = (),
                  lm_head: bool = True) -> CostModel:
        """Coefficients in FLOPs for a model config: an HF ``PretrainedConfig``, its dict, or a
        ``config.json`` path / folder (:func:`packer.cost.flops.flop_coefficients`, which derives them).
        ``causal=False`` counts the whole attention square (eager / sdpa without a causal skip);
        ``training=False`` gives forward FLOPs; ``frozen`` names towers ("vision", "audio") that get no backward."""
        from packer.cost.flops import flop_coefficients

        out = flop_coefficients(config, causal=causal, training=training, frozen=frozen, lm_head=lm_head)
        return cls(**{f.name: float(out.get(f.name, 0.0)) for f in fields(cls)})


AUTO, DEFAULT = "auto", "default"  # the build's ``cost_model`` settings besides a path


def resolve_cost_model(setting: str, checkpoints: tuple[str, ...] = ()) -> dict[str, Any]:
    """The build's cost model as its manifest records it (``stats["cost_model"]``): ``coefficients`` (what
    ``CostModel(**coefficients)`` rebuilds), ``source`` (``model_config``: :meth:`CostModel.for_model` of ``path``;
    ``file``: coefficients read from ``path``; ``default``: ``CostModel()``) and ``setting``.

    ``setting``: ``auto`` (the first of ``checkpoints`` -- the processor, the tokenizer -- whose folder or hub cache
    holds a model ``config.json``, else ``CostModel()`` with a ``note`` saying why), ``default``, or a path: a model
    config (``config.json`` or its folder) or a cost model JSON (:meth:`CostModel.load`; a calibration's ``device``,
    ``dtype`` and ``model`` recorded under ``calibrated``). A path that cannot be read raises ``ConfigError``."""
    record: dict[str, Any] = {"setting": setting}
    if setting == DEFAULT:
        return record | {"source": "default", "coefficients": CostModel().coefficients()}
    if setting == AUTO:
        for name in dict.fromkeys(c for c in checkpoints if c):
            path = _config_json(name)
            config = _json(path) if path else None
            if isinstance(config, dict) and _is_model_config(config):
                try:
                    model = CostModel.for_model(_full_config(config))
                except (KeyError, TypeError, ValueError, ZeroDivisionError, OverflowError) as e:
                    note = f"{path}: no FLOP model for this config ({type(e).__name__}: {e})"
                    import sys

                    print(f"packer: warning: cost_model auto: {note}; CostModel() used (pass cost_model = a cost model "
                          f"JSON, e.g. from packer calibrate)", file=sys.stderr)
                    return record | {"source": "default", "note": note, "coefficients": CostModel().coefficients()}
                return record | {"source": "model_config", "path": str(path), "coefficients": model.coefficients()}
        names = ", ".join(dict.fromkeys(c for c in checkpoints if c)) or "none"
        return record | {"source": "default", "coefficients": CostModel().coefficients(),
                         "note": f"no model config.json with the checkpoint ({names}) in its folder or the local hub cache"}
    path = Path(setting)
    if path.is_dir():
        path = path / "config.json"
    raw = _json(path)
    if raw is None:
        raise ConfigError(f"cost_model = {setting!r}: cannot read {path} as JSON; give a cost model JSON (packer "
                          f"calibrate writes one), a model's config.json or its folder, or auto / default")
    if isinstance(raw, dict) and _is_model_config(raw):
        try:
            return record | {"source": "model_config", "path": str(path),
                             "coefficients": CostModel.for_model(_full_config(raw)).coefficients()}
        except (KeyError, TypeError, ValueError, ZeroDivisionError, OverflowError) as e:
            raise ConfigError(f"cost_model = {setting!r}: no FLOP model for this config ({type(e).__name__}: {e}); "
                              f"give a cost model JSON instead (packer calibrate writes one)") from None
    try:
        model = CostModel.load(path)
    except ValueError as e:
        raise ConfigError(f"cost_model = {setting!r}: {e}") from None
    calibrated = {k: raw[k] for k in ("model", "device", "dtype") if k in raw}
    return record | {"source": "file", "path": str(path), "coefficients": model.coefficients(),
                     **({"calibrated": calibrated} if calibrated else {})}


def _config_json(name: str) -> Path | None:
    """``config.json`` of a checkpoint folder, or of a hub id in the local hub cache (never downloaded: a build
    decides its bytes from what is here); None when there is none."""
    folder = Path(name).expanduser()
    if folder.is_dir():
        return folder / "config.json" if (folder / "config.json").is_file() else None
    if "://" in name:
        return None
    try:
        from huggingface_hub import try_to_load_from_cache

        hit = try_to_load_from_cache(name, "config.json")
    except Exception:  # noqa: BLE001 -- not a valid hub id: nothing cached
        return None
    return Path(hit) if isinstance(hit, str) else None


def _json(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def _is_model_config(d: dict) -> bool:
    return isinstance(d.get("text_config"), dict) or ("hidden_size" in d and "num_hidden_layers" in d)


def _full_config(d: dict) -> Any:
    """The config with its class's defaults filled in (transformers' class for ``model_type``, built from the JSON:
    no checkpoint code runs), or the JSON itself where transformers has no such class."""
    try:
        from transformers import AutoConfig

        return AutoConfig.for_model(d["model_type"], **{k: v for k, v in d.items() if k != "model_type"})
    except Exception:  # noqa: BLE001 -- no model_type, a type this transformers lacks: the JSON's own keys
        return d
