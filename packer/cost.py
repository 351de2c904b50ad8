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

Derivation (a multiply-add is 2 FLOPs; ``tests/test_balance.py`` checks every term
against ``torch.utils.flop_counter.FlopCounterMode`` on tiny HF models)

LLM, per layer, forward. h = hidden size, q = heads * head_dim, k = kv_heads * head_dim,
i = intermediate size, V = vocabulary:

- projections, per token: Q h·q, K and V 2·h·k, O q·h multiply-adds -> 2·(2hq + 2hk);
- MLP, per token: 2·m·h·i with m = 3 matrices for a gated (SwiGLU) MLP, 2 for a plain one;
- attention, per (query, key) pair the mask allows: q multiply-adds for the score QKᵀ and q
  for the weighted sum AV -> 4q. A varlen / block-causal kernel only does the pairs of
  each segment: causal, s(s+1)/2 per segment of s tokens, so per row
  Σ s(s+1)/2 = (Σ seg² + tokens) / 2 pairs (exactly what ``row_stats`` has); a kernel
  that computes the whole square (eager, or sdpa without a causal skip) does s²;
- LM head, per token, once: 2·h·V.

With MHA, an MLP of 4h and no GQA, the dense part is 2·(4h² + 8h²) = 24h² per token and
layer, the causal attention 4h·s²/2 = 2h·s² per segment: 2h·s² / 24h² = s² / (12 h)
token-equivalents. Hence ``attention = 1 / (12 h)`` (1 / 49152 at h = 4096; an older
text said 1 / (6 h), which is the full square, twice the causal work).

Vision tower (ViT), per image of p patches, width w, depth D, MLP intermediate i_v:
every layer does 2·(4w² + m_v·w·i_v) per patch (QKV + out projections, MLP) and
4w·p² for bidirectional attention over the image (Qwen2-VL attends within each image);
the patch embedding adds 2·c·t·P²·w per patch (channels c, temporal patch t, patch side P),
and the merger / projector 2·(w·M²)² + 2·w·M²·h per merged token (Qwen2-VL, merge M) or
2·w·h + 2·h·h per token (LLaVA's two-layer projector). Placeholder tokens are merged
patches, p = M²·tokens, so Σ p² = M⁴·Σ tokens² (the ``image_square`` stat). Qwen2.5-VL's
windowed layers attend within windows of W = (window_size / patch_size)² patches:
4w·p·min(p, W) there (edge windows are smaller: an upper bound). LLaVA's CLIP adds a class
token (p + 1 positions; left out: under 0.2 %).

Qwen3-VL / Qwen3.5's tower is a ViT with a plain MLP whose merger runs once more per DeepStack
level (``deepstack_visual_indexes``); Qwen3.5's gated-delta-net layers (``layer_types``
``linear_attention``) pay their projections, a short causal convolution and a state update per
token and no (query, key) pairs: only attention layers count in ``attention`` (tested against
``FlopCounterMode`` for the tower; the delta rule's chunked torch fallback is approximated by its
recurrent form, 4·heads·d_k·d_v per token).

InternVL and Llama 4 run their towers on fixed tiles of p patches (448 / 14 = 32² for InternViT, 336 / 14 = 24²
for Llama 4), a class token added, attention within each tile, then a pixel shuffle (ratio 0.5: p / 4 placeholder
tokens a tile) and the projector: every placeholder token costs one tile's FLOPs over its tokens, whatever the
image (no square term); a video frame is one tile.

Videos go through the same tower: a video's placeholder tokens are merged patches of
temporal_patch_size frames each, as an image's (whose frame is repeated to fill the
temporal patch), so ``video_item`` / ``video_token`` / ``video_square`` are the image
coefficients. The tower attends within each temporal grid step (t steps of tokens / t
tokens), so the square stat of a video is tokens² / t (``row_video_square``).

Audio tower (Whisper / Qwen2-Audio encoder): every clip is padded to one 30 s window of
``max_source_positions`` positions, so each clip costs the same: the two input
convolutions, ``encoder_layers`` layers over P positions (2·(4d² + 2d·ffn)·P + 4d·P²) and
the projector 2·d·h per pooled token (P / 2): the ``audio_item`` coefficient.

Training runs forward + backward: 3x the forward FLOPs for the parts that get gradients.
A frozen tower at the input needs no backward at all: ``frozen=("vision",)`` counts it once.
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
# The largest size a model config may give for_model (hidden size, layers, heads, vocabulary, ...): its products of
# a few such sizes stay far under MAX_COEFFICIENT.
MAX_SIZE = 2**31 - 1


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
            raise CostModelError(f"{path}: a cost model JSON is an object of coefficients, got {type(raw).__name__}")
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
        ``config.json`` path / folder. Reads ``text_config`` / ``vision_config`` /
        ``audio_config`` where present, else a flat text config. ``causal=False`` counts the
        whole attention square (eager / sdpa without a causal skip); ``training=False`` gives
        forward FLOPs; ``frozen`` names towers ("vision", "audio") that get no backward."""
        cfg = _Sizes(_as_dict(config))
        text = cfg.get("text_config") or cfg
        h, layers = text["hidden_size"], text["num_hidden_layers"]
        heads = text["num_attention_heads"]
        head_dim = text.get("head_dim") or h // heads
        q, k = heads * head_dim, (text.get("num_key_value_heads") or heads) * head_dim
        gated = text.get("hidden_act", "silu") in ("silu", "swish", "swiglu") or text.get("model_type") in ("llama", "qwen2")
        i = text.get("intermediate_size") or 4 * h
        mlp = 2 * (3 if gated else 2) * h * i
        dense = 2 * (2 * h * q + 2 * h * k) + mlp
        kinds = text.get("layer_types") or ["full_attention"] * layers
        full = sum(t != "linear_attention" for t in kinds)  # sliding / chunked layers counted as full: an upper bound
        head = 2 * h * text.get("vocab_size", 0) if lm_head else 0
        pair = 4 * q * full  # per allowed (query, key) pair, all attention layers
        if full < layers:  # Qwen3.5's gated delta nets: projections, a short causal conv, a state update per token
            dk, dv = text["linear_key_head_dim"], text["linear_value_head_dim"]
            nk, nv = text["linear_num_key_heads"], text["linear_num_value_heads"]
            kd, vd = nk * dk, nv * dv
            linear = (2 * h * (2 * kd + vd) + 2 * h * vd + 2 * 2 * h * nv + 2 * vd * h
                      + 2 * (2 * kd + vd) * text.get("linear_conv_kernel_dim", 4) + 4 * nv * dk * dv + mlp)
            dense = (full * dense + (layers - full) * linear) / layers
        llm = 3 if training else 1
        out = {"token": llm * (layers * dense + head + (pair / 2 if causal else 0)),
               "attention": llm * (pair / 2 if causal else pair)}
        tower = lambda name: 1 if (not training or name in frozen) else 3  # noqa: E731
        if cfg.get("vision_config"):
            item, token, square = _tiled(cfg, h) or _vision(cfg["vision_config"], h)
            for kind in ("image", "video"):  # one tower, the same cost per merged patch (module doc)
                out |= {f"{kind}_item": tower("vision") * item, f"{kind}_token": tower("vision") * token,
                        f"{kind}_square": tower("vision") * square}
        if cfg.get("audio_config"):
            out["audio_item"] = tower("audio") * _audio(cfg["audio_config"], h)
        return cls(**{f.name: float(out.get(f.name, 0.0)) for f in fields(cls)})


class _Sizes(dict):
    """A model config whose numbers, as :meth:`CostModel.for_model` reads them, are checked: each a finite number
    over 0 and at most :data:`MAX_SIZE` (a hidden size of 1e308 gave inf coefficients, a negative one negative
    costs). Lists (layer indexes, layer types) are read as they are; nested configs are checked alike."""

    def __getitem__(self, key):
        return self._checked(key, super().__getitem__(key))

    def get(self, key, default=None):
        value = super().get(key)
        return default if value is None else self._checked(key, value)

    @staticmethod
    def _checked(key, value):
        if isinstance(value, dict):
            return _Sizes(value)
        if isinstance(value, (int, float)) and not isinstance(value, bool) and not 0 < value <= MAX_SIZE:
            raise ValueError(f"{key} = {value!r} is not a size from 1 to {MAX_SIZE:,}")
        return value


def _as_dict(config: Any) -> dict:
    if isinstance(config, (str, Path)):
        path = Path(config)
        return json.loads((path / "config.json" if path.is_dir() else path).read_text())
    if hasattr(config, "to_dict"):
        return config.to_dict()
    return dict(config)


def _vision(v: dict, llm_hidden: int) -> tuple[float, float, float]:
    """(per image, per placeholder token, per placeholder token²) forward FLOPs of a ViT."""
    merge = v.get("spatial_merge_size", 1)
    mergers = 1
    if str(v.get("model_type", "")).startswith(("qwen3_vl", "qwen3_5")):  # Qwen3-VL / 3.5: plain MLP, DeepStack mergers
        w, i_v, mats, out_dim = v["hidden_size"], v["intermediate_size"], 2, v["out_hidden_size"]
        mergers += len(v.get("deepstack_visual_indexes") or ())
    elif "embed_dim" in v:  # Qwen2-VL: width embed_dim, plain MLP of mlp_ratio, merger to hidden_size
        w, i_v, mats, out_dim = v["embed_dim"], v["embed_dim"] * v.get("mlp_ratio", 4), 2, v["hidden_size"]
    else:  # Qwen2.5-VL (gated MLP, out_hidden_size) or CLIP / SigLIP (plain MLP, LLaVA projector)
        w, i_v = v["hidden_size"], v.get("intermediate_size") or 4 * v["hidden_size"]
        mats, out_dim = (3, v["out_hidden_size"]) if "out_hidden_size" in v else (2, llm_hidden)
    depth = v.get("depth") or v["num_hidden_layers"]
    pixels = v.get("in_channels", v.get("num_channels", 3)) * v.get("temporal_patch_size", 1) * v["patch_size"] ** 2
    per_patch = depth * 2 * (4 * w * w + mats * w * i_v) + 2 * pixels * w
    if merge > 1:  # Qwen's PatchMerger: LayerNorm, Linear(wM², wM²), GELU, Linear(wM², out); one per DeepStack level more
        merger = mergers * (2 * (w * merge**2) ** 2 + 2 * w * merge**2 * out_dim)
    else:  # LLaVA's projector: Linear(w, h), GELU, Linear(h, h)
        merger = 2 * w * out_dim + 2 * out_dim * out_dim
    full = len(v["fullatt_block_indexes"]) if "fullatt_block_indexes" in v else depth
    window = (v["window_size"] // v["patch_size"]) ** 2 if "window_size" in v and full < depth else 0
    # windowed layers: 4w·p·min(p, W) <= 4w·p·W, linear in p (exact for images no wider than a window in patches)
    per_token = merge**2 * (per_patch + (depth - full) * 4 * w * window) + merger
    return 0.0, float(per_token), float(full * 4 * w * merge**4)


def _tiled(cfg: dict, llm_hidden: int) -> tuple[float, float, float] | None:
    """InternVL / Llama 4 towers, which see fixed tiles (an image cut into tiles, a video frame one tile): forward
    FLOPs per placeholder token = one tile's over its tokens, a constant (tiles attend within themselves: no square
    term). None for other models."""
    from packer.families import MODEL_TYPES

    kind = cfg.get("model_type")
    if kind not in MODEL_TYPES or not MODEL_TYPES[kind].tiled_tower:
        return None
    v = cfg["vision_config"]

    def side(x):
        return x[0] if isinstance(x, (list, tuple)) else x

    w, i_v, depth = v["hidden_size"], v["intermediate_size"], v["num_hidden_layers"]
    patch = side(v["patch_size"])
    p = (side(v["image_size"]) // patch) ** 2  # patches of a tile; + a class token in both towers
    per_tile = depth * (2 * (p + 1) * (4 * w * w + 2 * w * i_v) + 4 * w * (p + 1) ** 2)
    per_tile += 2 * v.get("num_channels", 3) * patch**2 * w * p  # patch embedding
    if kind == "internvl":  # pixel shuffle by downsample_ratio, then LayerNorm, Linear(w / s², h), GELU, Linear(h, h)
        s = cfg.get("downsample_ratio", 0.5)
        tokens = int(p * s * s)
        per_tile += tokens * (2 * w * int(1 / s) ** 2 * llm_hidden + 2 * llm_hidden * llm_hidden)
    else:  # pixel shuffle by pixel_shuffle_ratio, the adapter's two layers, the projector to the LLM
        s = v.get("pixel_shuffle_ratio", 0.5)
        tokens = int(p * s * s)
        d_in, d_out = v["projector_input_dim"], v["projector_output_dim"]
        per_tile += tokens * (2 * i_v * d_in + 2 * d_out * d_out + 2 * v["vision_output_dim"] * llm_hidden)
    return 0.0, float(per_tile / tokens), 0.0


def _audio(a: dict, llm_hidden: int) -> float:
    """Forward FLOPs of one clip through a Whisper-style encoder (one padded 30 s window)."""
    d, layers, ffn = a["d_model"], a["encoder_layers"], a["encoder_ffn_dim"]
    positions, mels = a.get("max_source_positions", 1500), a.get("num_mel_bins", 80)
    convs = 2 * 3 * mels * d * 2 * positions + 2 * 3 * d * d * positions  # conv1 over 2P frames, conv2 stride 2
    body = layers * (2 * (4 * d * d + 2 * d * ffn) * positions + 4 * d * positions**2)
    return float(convs + body + 2 * d * llm_hidden * (positions // 2))


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
