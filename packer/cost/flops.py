"""FLOPs a packed row costs a model: the coefficients :meth:`packer.cost.CostModel.for_model` gives.

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

A tower the ViT and Whisper formulas miss is told by what its config declares, in :data:`TOWER_FLOPS`
(:func:`register_tower_flops`): today the tiled towers of InternVL and Llama 4.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

# The largest size a model config may give for_model (hidden size, layers, heads, vocabulary, ...): its products of
# a few such sizes stay far under packer.cost.model.MAX_COEFFICIENT.
MAX_SIZE = 2**31 - 1


def flop_coefficients(config: Any, *, causal: bool = True, training: bool = True, frozen: tuple[str, ...] = (),
                      lm_head: bool = True) -> dict[str, float]:
    """The cost model's coefficients in FLOPs (by coefficient name; those left out are 0) for a model config: an HF
    ``PretrainedConfig``, its dict, or a ``config.json`` path / folder. Reads ``text_config`` / ``vision_config`` /
    ``audio_config`` where present, else a flat text config; the arguments are :meth:`CostModel.for_model`'s."""
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
        tiled = tower_flops(cfg)
        item, token, square = tiled(cfg, h) if tiled else _vision(cfg["vision_config"], h)
        for kind in ("image", "video"):  # one tower, the same cost per merged patch (module doc)
            out |= {f"{kind}_item": tower("vision") * item, f"{kind}_token": tower("vision") * token,
                    f"{kind}_square": tower("vision") * square}
    if cfg.get("audio_config"):
        out["audio_item"] = tower("audio") * _audio(cfg["audio_config"], h)
    return out


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


def _side(x):
    return x[0] if isinstance(x, (list, tuple)) else x


def _tile(v: dict) -> tuple[int, float]:
    """(patches of a tile, forward FLOPs of the tower on one tile): a ViT on fixed tiles, a class token added, attention
    within the tile, plus the patch embedding."""
    w, i_v, depth = v["hidden_size"], v["intermediate_size"], v["num_hidden_layers"]
    patch = _side(v["patch_size"])
    p = (_side(v["image_size"]) // patch) ** 2  # patches of a tile; + a class token in both towers
    per_tile = depth * (2 * (p + 1) * (4 * w * w + 2 * w * i_v) + 4 * w * (p + 1) ** 2)
    per_tile += 2 * v.get("num_channels", 3) * patch**2 * w * p  # patch embedding
    return p, per_tile


def internvl_tiles(cfg: dict, llm_hidden: int) -> tuple[float, float, float]:
    """InternVL: InternViT on 448 / 14 = 32² patch tiles, a pixel shuffle by ``downsample_ratio``, then LayerNorm,
    Linear(w / s², h), GELU, Linear(h, h): every placeholder token costs one tile's FLOPs over its tokens."""
    v = cfg["vision_config"]
    p, per_tile = _tile(v)
    w = v["hidden_size"]
    s = cfg.get("downsample_ratio", 0.5)
    tokens = int(p * s * s)
    per_tile += tokens * (2 * w * int(1 / s) ** 2 * llm_hidden + 2 * llm_hidden * llm_hidden)
    return 0.0, float(per_tile / tokens), 0.0


def llama4_tiles(cfg: dict, llm_hidden: int) -> tuple[float, float, float]:
    """Llama 4: its ViT on 336 / 14 = 24² patch tiles, a pixel shuffle by ``pixel_shuffle_ratio``, the adapter's two
    layers and the projector to the LLM: every placeholder token costs one tile's FLOPs over its tokens."""
    v = cfg["vision_config"]
    p, per_tile = _tile(v)
    s = v.get("pixel_shuffle_ratio", 0.5)
    tokens = int(p * s * s)
    d_in, d_out = v["projector_input_dim"], v["projector_output_dim"]
    per_tile += tokens * (2 * v["intermediate_size"] * d_in + 2 * d_out * d_out + 2 * v["vision_output_dim"] * llm_hidden)
    return 0.0, float(per_tile / tokens), 0.0


TowerFlops = Callable[[dict, int], tuple[float, float, float]]


def _tiled_by_downsample(cfg: dict) -> bool:
    return "downsample_ratio" in cfg  # InternVL: the pixel shuffle's ratio is the top config's


def _tiled_by_shuffle(cfg: dict) -> bool:
    return "pixel_shuffle_ratio" in cfg["vision_config"] and "projector_input_dim" in cfg["vision_config"]  # Llama 4


# (the config declares such a tower, its (per image, per placeholder token, per placeholder token²) forward FLOPs of
# the vision tower and projector): the towers :func:`_vision`'s ViT formula does not fit (fixed tiles: no square
# term), told apart by what their configs declare (a pixel shuffle after fixed tiles), not by a list of model
# names; every other vision config is costed by :func:`_vision`. :func:`register_tower_flops` adds one.
TOWER_FLOPS: list[tuple[Callable[[dict], bool], TowerFlops]] = [(_tiled_by_downsample, internvl_tiles),
                                                                 (_tiled_by_shuffle, llama4_tiles)]


def register_tower_flops(declares: Callable[[dict], bool], fn: TowerFlops) -> None:
    """Declare the vision tower FLOPs of the configs ``declares(config dict)`` holds true for: ``fn(config dict, LLM
    hidden size)`` gives (per image, per placeholder token, per placeholder token²) forward FLOPs, as
    :func:`internvl_tiles` does. Checked before the ones already declared."""
    TOWER_FLOPS.insert(0, (declares, fn))


def tower_flops(cfg: dict) -> TowerFlops | None:
    """The declared FLOPs of ``cfg``'s vision tower (:data:`TOWER_FLOPS`), or None: the ViT formula's."""
    return next((fn for declares, fn in TOWER_FLOPS if declares(cfg)), None)


def _audio(a: dict, llm_hidden: int) -> float:
    """Forward FLOPs of one clip through a Whisper-style encoder (one padded 30 s window)."""
    d, layers, ffn = a["d_model"], a["encoder_layers"], a["encoder_ffn_dim"]
    positions, mels = a.get("max_source_positions", 1500), a.get("num_mel_bins", 80)
    convs = 2 * 3 * mels * d * 2 * positions + 2 * 3 * d * d * positions  # conv1 over 2P frames, conv2 stride 2
    body = layers * (2 * (4 * d * d + 2 * d * ffn) * positions + 4 * d * positions**2)
    return float(convs + body + 2 * d * llm_hidden * (positions // 2))


