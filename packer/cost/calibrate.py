"""``packer calibrate``: a cost model's coefficients fitted to a model's measured training step.

:meth:`packer.cost.CostModel.for_model` counts FLOPs; a real step also pays memory traffic, kernel
launches and attention kernels whose speed is not their FLOPs. Calibration measures instead: the
model's own transformers class, randomly initialised from its config (no weights downloaded), runs
forward + backward at a handful of shapes, each timed as the median of ``repeats`` runs after
``warmup`` runs, and the coefficients come from a non-negative least-squares fit of the times to the
cost model's statistics (:func:`nnls`, in seconds: a fit takes milliseconds)::

    seconds = call + token * tokens + attention * Σ seg²
            + image_item * images + image_token * image_tokens + image_square * Σ image_tokens²

- text rows: ``k`` sequences of ``s`` tokens as one batch ``[k, s]``, exactly the work of a packed row
  of ``k`` segments under a block-diagonal (varlen) kernel, so tokens (``k·s``) and attention pairs
  (``k·s²``) vary independently: row lengths ``max_tokens / 4 .. max_tokens``, segments of the whole
  row down to a sixteenth of it;
- images (a Qwen-style tower: ``pixel_values`` of merged patches and ``image_grid_thw``): one to four
  images of 16 to ``max_image_tokens`` placeholder tokens each in one sequence, so items, tokens and
  Σ tokens² vary independently. Videos go through the same tower: ``video_*`` get the image
  coefficients (:mod:`packer.cost`). An audio tower, and a vision tower of another kind (LLaVA's CLIP,
  InternViT, tiles), is not timed: its terms are its FLOPs (``for_model``) at the seconds per FLOP the
  fit found for the language model's tokens (``notes`` says so).

``call`` is a constant per model call (dispatch, the optimizer-free step's fixed work): fitted so it
does not leak into the per-token terms, reported as ``overhead_s``, not part of the cost model.

Written as JSON: ``coefficients`` (what ``cost_model = PATH`` and ``packer steps --cost-model`` read,
:meth:`CostModel.load`), the model, device, dtype and library versions, every measured point with its
fitted time and relative residual, the largest residual of the text and image points, and ``flops``:
``for_model``'s FLOPs per unit of each fitted term (FLOPs / coefficient: the rate each term runs at).

torch and transformers are imported inside the functions that use them (``import packer`` stays fast).
"""

from __future__ import annotations

import json
import statistics
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from packer.cost.model import CostModel
from packer.errors import ConfigError, PackerError

FEATURES = ("call", "token", "attention", "image_item", "image_token", "image_square")  # columns of the fit
DTYPES = ("float32", "bfloat16", "float16")  # --dtype besides auto: what a model trains in
# A fit whose largest |residual| passes this predicts some timed shape's step time off by more than a quarter: the
# planner and `packer steps` balance rows by costs that far from their time (a sampler balances to a few percent).
POOR_FIT = 0.25


@dataclass(frozen=True)
class Shape:
    """One timed call: ``segments`` sequences of ``length`` text tokens (a batch), or one sequence of ``length``
    text tokens holding ``images`` images of ``grid`` (h, w) patches each."""

    segments: int
    length: int
    images: int = 0
    grid: tuple[int, int] = (0, 0)

    def image_tokens(self, merge: int) -> int:
        """Placeholder tokens of one image (merged patches)."""
        return self.grid[0] * self.grid[1] // merge**2

    def stats(self, merge: int = 1) -> dict[str, float]:
        """The cost model's statistics of this call (the fit's columns): as ``sample_stats`` has them for a row of
        ``segments`` samples, image placeholders (each image between a begin and an end token) counted as tokens."""
        per_image = self.image_tokens(merge) if self.images else 0
        seq = self.length + self.images * (per_image + 2)
        return {"call": 1.0, "token": float(self.segments * seq), "attention": float(self.segments * seq**2),
                "image_item": float(self.images), "image_token": float(self.images * per_image),
                "image_square": float(self.images * per_image**2)}


def text_shapes(max_tokens: int) -> list[Shape]:
    """Rows of ``max_tokens / 4``, ``/ 2`` and ``max_tokens`` tokens, each as 1, 4 and 16 segments (none under 8)."""
    shapes = []
    for row in (max_tokens // 4, max_tokens // 2, max_tokens):
        for k in (1, 4, 16):
            if row // k >= 8:
                shapes.append(Shape(k, row // k))
    return sorted(set(shapes), key=lambda s: (s.segments * s.length, s.segments))


def image_shapes(max_image_tokens: int, merge: int, text: int = 16) -> list[Shape]:
    """Images of 16, 64, ... up to ``max_image_tokens`` placeholder tokens (square grids; 4 and 16 below 64), one
    each; 2 and 4 images of the smallest size, 2 of the next and one 1:2 grid, so items, tokens an image and
    tokens² vary apart."""
    sides = [s for s in (4, 8, 16, 32, 64) if s * s <= max_image_tokens]
    sides = sides if len(sides) > 1 else [2, 4]  # two sizes at least: tokens an image must vary apart from items
    grid = lambda side, wide=1: (side * merge, side * merge * wide)  # noqa: E731 -- tokens side² x wide
    shapes = [Shape(1, text, 1, grid(s)) for s in sides]
    shapes += [Shape(1, text, 2, grid(sides[0])), Shape(1, text, 4, grid(sides[0]))]
    if len(sides) > 1:
        shapes += [Shape(1, text, 2, grid(sides[1])), Shape(1, text, 1, grid(sides[-2], 2))]
    return shapes


def nnls(a: np.ndarray, b: np.ndarray, *, max_iter: int | None = None) -> np.ndarray:
    """``argmin ||a x - b||`` over ``x >= 0`` (Lawson and Hanson's active set method): exact on consistent data.
    Columns are scaled to unit norm first, so coefficients of very different sizes (per token, per token²) meet
    one tolerance."""
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    norms = np.linalg.norm(a, axis=0)
    norms[norms == 0] = 1.0
    a = a / norms
    n = a.shape[1]
    x, passive = np.zeros(n), np.zeros(n, bool)
    tol = 10 * np.finfo(np.float64).eps * max(1.0, np.linalg.norm(a, 1)) * max(a.shape)
    for _ in range(max_iter or 3 * n):
        w = a.T @ (b - a @ x)
        if passive.all() or w[~passive].max(initial=-np.inf) <= tol:
            break
        passive[np.argmax(np.where(passive, -np.inf, w))] = True
        while True:
            z = np.zeros(n)
            z[passive] = np.linalg.lstsq(a[:, passive], b, rcond=None)[0]
            if (z[passive] > 0).all():
                x = z
                break
            shrinking = passive & (z <= 0)
            alpha = np.min(x[shrinking] / (x[shrinking] - z[shrinking]))
            x = x + alpha * (z - x)
            passive &= x > tol
            x[~passive] = 0.0
    return x / norms


def fit(points: list[dict[str, float]], seconds: list[float], features: tuple[str, ...] = FEATURES) -> dict[str, float]:
    """Non-negative coefficients of ``features`` fitting ``seconds`` (one per point of statistics); a feature no point
    has gets 0."""
    a = np.array([[p.get(f, 0.0) for f in features] for p in points], np.float64)
    used = np.abs(a).sum(axis=0) > 0
    x = np.zeros(len(features))
    x[used] = nnls(a[:, used], np.asarray(seconds, np.float64))
    return {f: float(v) for f, v in zip(features, x, strict=True)}


def calibrate(model: str, *, device: str = "cpu", dtype: str = "auto", attention: str = "sdpa",
              max_tokens: int = 4096, max_image_tokens: int = 1024, repeats: int = 5, warmup: int = 2,
              seed: int = 0, threads: int = 0) -> dict[str, Any]:
    """Time ``model`` (a folder holding ``config.json``, or a hub id) at the shapes above and fit the cost model:
    the JSON :func:`calibrate_command` writes (see the module docstring)."""
    try:
        import torch
        import transformers
    except ImportError:
        raise PackerError("packer calibrate runs the model: pip install torch transformers") from None
    if repeats < 1 or warmup < 0 or max_tokens < 32 or max_image_tokens < 16:
        raise ConfigError(f"calibrate needs repeats >= 1, warmup >= 0, max_tokens >= 32 and max_image_tokens >= 16; got "
                          f"{repeats}, {warmup}, {max_tokens}, {max_image_tokens}")
    if threads:  # on a CPU other jobs share, one thread each op: threads that wait on each other time nothing
        torch.set_num_threads(threads)
    torch_dtype = _dtype(dtype, device)  # the options first: a bad one is refused before the config is fetched
    _check_device(device)
    _check_attention(attention)
    config = _config(model)
    flops = _flops(model, config)
    torch.manual_seed(seed)
    net, vision = _model(config, attention, device, torch_dtype)
    merge = vision.get("spatial_merge_size", 1) if vision else 1
    shapes = text_shapes(max_tokens) + (image_shapes(max_image_tokens, merge) if vision else [])
    ids = _Ids(config, seed)
    points = []
    for shape in shapes:
        inputs = ids.inputs(shape, vision, merge, net, device, torch_dtype)
        try:
            seconds = _time(net, inputs, repeats, warmup, device)
        except torch.OutOfMemoryError:
            raise PackerError(f"calibrate: {shape.segments} segment(s) of {shape.length} tokens"
                              f"{f' and {shape.images} image(s) of {shape.grid}' if shape.images else ''} do not fit "
                              f"in {device}'s memory (forward + backward, no activation checkpointing): lower "
                              f"--max-tokens / --max-image-tokens (now {max_tokens} / {max_image_tokens})") from None
        points.append({"kind": "image" if shape.images else "text", "segments": shape.segments, "length": shape.length,
                       "images": shape.images, "image_grid": list(shape.grid), **shape.stats(merge), "seconds": seconds})
    features = FEATURES if vision else FEATURES[:3]
    coef = fit(points, [p["seconds"] for p in points], features)
    for p in points:
        p["fitted"] = sum(coef[f] * p[f] for f in features)
        p["residual"] = (p["fitted"] - p["seconds"]) / p["seconds"]
    fields = {k: coef.get(k, 0.0) for k in ("token", "attention", "image_item", "image_token", "image_square")}
    if vision:
        fields |= {f"video_{t}": fields[f"image_{t}"] for t in ("item", "token", "square")}
    notes = [f"{k} fitted to 0: the timings do not show it over the per-call overhead; time longer rows (--max-tokens) "
             f"or more repeats" for k in ("token", "attention") if not fields[k]]
    untimed = [f"{kind}_{t}" for kind in ("image", "video") for t in ("item", "token", "square")] if not vision else []
    untimed += ["audio_item"]  # towers not timed: their FLOPs at the language model's measured seconds per FLOP
    for k in untimed:
        if getattr(flops, k):
            fields[k] = getattr(flops, k) * fields["token"] / flops.token
    if any(getattr(flops, k) for k in untimed):
        notes.append(f"{', '.join(k for k in untimed if getattr(flops, k))}: not timed (no Qwen-style vision tower / an "
                     f"audio tower); for_model's FLOPs x the fitted seconds per FLOP of the language model's tokens")
    worst = lambda kind: max((abs(p["residual"]) for p in points if p["kind"] == kind), default=None)  # noqa: E731
    residuals = {"text_max": worst("text"), "image_max": worst("image")}
    return {"model": model, "model_type": getattr(config, "model_type", ""), "device": device,
            "dtype": str(torch_dtype).removeprefix("torch."), "attention": attention, "units": "seconds",
            "coefficients": CostModel(**fields).coefficients(), "overhead_s": coef["call"],
            "flops": {f: getattr(flops, f) for f in features if f != "call"},  # CostModel.for_model: FLOPs a unit
            "fitted": [f for f in features if f != "call"], "points": points,
            "residuals": residuals, "warnings": fit_warnings(residuals), "notes": notes,
            "settings": {"max_tokens": max_tokens, "max_image_tokens": max_image_tokens, "repeats": repeats,
                         "warmup": warmup, "seed": seed, "threads": torch.get_num_threads()},
            "libraries": {"torch": torch.__version__, "transformers": transformers.__version__}}


def fit_warnings(residuals: dict[str, float | None]) -> list[str]:
    """What a poor fit means, for each kind of point whose largest |residual| is over :data:`POOR_FIT`."""
    out = []
    for kind in ("text", "image"):
        r = residuals.get(f"{kind}_max")
        if r is not None and r > POOR_FIT:
            article = "an" if kind == "image" else "a"
            out.append(f"poor fit: {article} {kind} shape's time is {100 * r:.1f}% off the fitted one (over "
                       f"{100 * POOR_FIT:.0f}%), "
                       f"so rows balanced by this cost model may differ by as much in step time. The timings are noisy "
                       f"(a shared device: --threads 1, more --repeats and --warmup) or the step time is not linear in "
                       f"the model's terms at these shapes (time the row lengths you train with: --max-tokens, "
                       f"--max-image-tokens); check the points in the JSON before using it")
    return out


def calibrate_command(model: str, output: str | Path, **settings: Any) -> dict[str, Any]:
    """``packer calibrate``: :func:`calibrate`, written to ``output`` (JSON, sorted keys); returns it with ``path``."""
    result = calibrate(model, **settings)
    path = Path(output)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=1, sort_keys=True) + "\n", encoding="utf-8")
    return {**result, "path": str(path)}


def summary_text(result: dict[str, Any]) -> str:
    c, r = result["coefficients"], result["residuals"]
    lines = [f"{result['path']}: {result['model']} ({result['model_type']}) on {result['device']}, {result['dtype']}, "
             f"{len(result['points'])} shapes timed"]
    for k in result["fitted"]:
        flops = result["flops"][k]
        rate = f"   ({flops / c[k] / 1e12:.3g} TFLOP/s of for_model's FLOPs)" if flops and c[k] else ""
        lines.append(f"  {k:<13} {c[k]:.4g} s{rate}")
    lines.append(f"  overhead      {result['overhead_s']:.4g} s a call (not in the cost model)")
    lines.append("  largest |residual|: " + ", ".join(f"{k} {100 * r[f'{k}_max']:.1f}%" for k in ("text", "image")
                                                       if r.get(f"{k}_max") is not None))
    lines += [f"  warning: {w}" for w in result.get("warnings", ())]
    lines += [f"  note: {n}" for n in result["notes"]]
    lines.append(f"  use it: packer build ... --cost-model {result['path']}")
    return "\n".join(lines)


def _config(model: str) -> Any:
    from transformers import AutoConfig

    from packer.io.pretrained import load_pretrained

    try:
        return load_pretrained(AutoConfig, model, "config")
    except (OSError, ValueError) as e:
        raise PackerError(f"calibrate: cannot read a model config from {model!r}: {e}") from None


def _flops(model: str, config: Any) -> CostModel:
    """:meth:`CostModel.for_model` of the config: the untimed towers' terms, and a check of its sizes before the model
    is built (a vocabulary of 0 tokens, a negative width)."""
    try:
        flops = CostModel.for_model(config)
    except (KeyError, TypeError, ValueError, ZeroDivisionError, OverflowError) as e:
        raise ConfigError(f"calibrate: {model!r}: the config cannot be costed ({type(e).__name__}: {e}); give a model "
                          f"config of real sizes") from None
    text = getattr(config, "text_config", None) or config
    vocab = getattr(text, "vocab_size", None)
    if not isinstance(vocab, int) or vocab < 2:
        raise ConfigError(f"calibrate: {model!r}: vocab_size = {vocab!r}; timing feeds random token ids, which needs a "
                          f"vocabulary of at least 2 tokens")
    return flops


def _dtype(name: str, device: str):
    import torch

    if name == "auto":
        return torch.bfloat16 if device.startswith("cuda") else torch.float32
    if name not in DTYPES:  # int8 and the like: a model is not trained in them (nn.Module.to refuses them)
        raise ConfigError(f"calibrate: --dtype {name!r} is not one of auto, {', '.join(DTYPES)}")
    return getattr(torch, name)


def _check_attention(name: str) -> None:
    """An ``attn_implementation`` transformers knows (``eager``, or one registered with its ``AttentionInterface``:
    sdpa, flex_attention, flash_attention_2, a user's own ...), before the model is built with it."""
    from transformers import AttentionInterface

    known = ["eager", *AttentionInterface().valid_keys()]
    if name not in known and not name.startswith("kernels-community/"):  # a hub kernel: transformers fetches it
        raise ConfigError(f"calibrate: --attention {name!r} is no attention implementation transformers knows: give one "
                          f"of {', '.join(known)} (or register yours with transformers.AttentionInterface)")


def _check_device(name: str) -> None:
    """A device torch can name and this machine has, before the model is built on it."""
    import torch

    try:
        device = torch.device(name)
    except (RuntimeError, ValueError):
        raise ConfigError(f"calibrate: --device {name!r} is not a device: cpu, cuda, cuda:1, mps, ...") from None
    if device.type == "cpu":
        return
    if device.type == "cuda":
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if (device.index or 0) >= count:
            have = f"{count} CUDA device(s) (cuda:0 to cuda:{count - 1})" if count else "no CUDA device torch can use"
            raise ConfigError(f"calibrate: --device {name!r}: this machine has {have}; time on one it has, or on cpu")
        return
    try:
        torch.empty(1, device=device)
    except Exception as e:  # noqa: BLE001 -- any backend's way of saying it is not here (RuntimeError, AssertionError)
        first = (str(e).strip() or type(e).__name__).splitlines()[0].split(". ")[0]  # torch's lists every backend
        raise ConfigError(f"calibrate: --device {name!r} cannot hold a tensor here ({first}); time on cpu or a device "
                          f"this machine has") from None


def _model(config: Any, attention: str, device: str, dtype) -> tuple[Any, dict]:
    """The model class for ``config``, randomly initialised, in training mode; its vision config where it has a
    Qwen-style tower (merged patches, ``image_grid_thw``), else {}."""
    import torch
    from transformers import AutoModelForCausalLM, AutoModelForImageTextToText

    vision_config = getattr(config, "vision_config", None)
    auto = AutoModelForImageTextToText if vision_config is not None else AutoModelForCausalLM
    try:
        with torch.device(device):  # initialised where it runs: a few seconds for billions of parameters on a GPU
            net = auto.from_config(config, attn_implementation=attention)
    except ValueError as e:
        raise PackerError(f"calibrate: transformers has no {auto.__name__} for {config.model_type!r}: {e}") from None
    net = net.to(device=device, dtype=dtype).train()
    vision = vision_config.to_dict() if vision_config is not None else {}
    qwen_style = all(k in vision for k in ("spatial_merge_size", "temporal_patch_size", "patch_size"))
    return net, vision if qwen_style and getattr(config, "image_token_id", None) is not None else {}


class _Ids:
    """Random token ids that are no special token of the config (placeholders, begin / end markers)."""

    def __init__(self, config: Any, seed: int):
        import torch

        text = getattr(config, "text_config", config)
        self.vocab = text.vocab_size
        self.special = {v for k, v in {**text.to_dict(), **config.to_dict()}.items()
                        if isinstance(v, int) and k.endswith(("_token_id", "_token_index"))}
        self.config = config
        self.generator = torch.Generator().manual_seed(seed)

    def text(self, *shape: int):
        import torch

        ids = torch.randint(0, self.vocab, shape, generator=self.generator)
        for s in self.special:
            ids[ids == s] = 0 if s else 1
        return ids

    def inputs(self, shape: Shape, vision: dict, merge: int, net, device: str, dtype) -> dict[str, Any]:
        import inspect

        import torch

        if not shape.images:
            ids = self.text(shape.segments, shape.length)
            return {"input_ids": ids.to(device), "labels": ids.to(device)}
        c = self.config
        per_image = shape.image_tokens(merge)
        begin = getattr(c, "vision_start_token_id", None)
        end = getattr(c, "vision_end_token_id", None)
        image = [begin if begin is not None else 0, *[c.image_token_id] * per_image, end if end is not None else 0]
        ids = torch.cat([torch.tensor(image * shape.images), self.text(shape.length)]).unsqueeze(0)
        labels = ids.clone()
        labels[ids == c.image_token_id] = -100
        patches = shape.grid[0] * shape.grid[1]
        channels = vision.get("in_channels", vision.get("num_channels", 3))
        width = channels * vision["temporal_patch_size"] * vision["patch_size"] ** 2
        out = {"input_ids": ids.to(device), "labels": labels.to(device),
               "pixel_values": torch.randn(shape.images * patches, width, generator=self.generator).to(device, dtype),
               "image_grid_thw": torch.tensor([[1, *shape.grid]] * shape.images).to(device)}
        if "mm_token_type_ids" in inspect.signature(net.forward).parameters:
            out["mm_token_type_ids"] = (ids == c.image_token_id).int().to(device)
        return out


def _time(net, inputs: dict[str, Any], repeats: int, warmup: int, device: str) -> float:
    """Median seconds of one forward + backward (gradients dropped after each)."""
    import torch

    sync = torch.cuda.synchronize if device.startswith("cuda") else (lambda: None)
    times = []
    for k in range(warmup + repeats):
        sync()
        start = time.perf_counter()
        net(**inputs).loss.backward()
        sync()
        if k >= warmup:
            times.append(time.perf_counter() - start)
        net.zero_grad(set_to_none=True)
    return statistics.median(times)
