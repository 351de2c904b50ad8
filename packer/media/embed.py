"""Optional: run an open_clip vision tower over every image once, and store the result.

``--image-embeddings MODEL[:PRETRAINED]``:

- ``MODEL``: an open_clip model config name (``ViT-L-14-336``, ``ViT-B-32``, ...).
- ``PRETRAINED``: a local checkpoint file, or an open_clip pretrained tag (``openai``,
  ``laion2b_s34b_b79k``; downloaded from the hub where a network exists), or
  ``random`` (random weights: for tests and timing only).

The model is loaded before any record is read, so a missing checkpoint or an
unreachable hub fails the build at once, not after hours of encoding.
``--embed-output pooled`` stores the image embedding (``embed_dim`` floats per image);
``tokens`` stores the tower's patch tokens (``n_patches x width``), what a LLaVA-style
projector consumes. float16, flattened, with the shape beside it.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from packer.errors import ConfigError, PackerError


@dataclass(frozen=True)
class EmbedSpec:
    model: str
    pretrained: str | None  # None: random weights
    output: str = "pooled"
    device: str = "auto"
    batch_size: int = 32

    @classmethod
    def parse(cls, spec: str, *, output: str, device: str, batch_size: int) -> EmbedSpec:
        model, _, pretrained = spec.partition(":")
        if not model:
            raise ConfigError("--image-embeddings needs MODEL[:PRETRAINED], e.g. ViT-L-14-336:openai")
        if output not in ("pooled", "tokens"):
            raise ConfigError(f"embed output must be pooled or tokens, got {output!r}")
        return cls(model, None if pretrained in ("", "random", "none") else pretrained, output, device, batch_size)


class ImageEmbedder:
    def __init__(self, spec: EmbedSpec):
        try:
            import open_clip
            import torch
        except ImportError:
            raise PackerError("--image-embeddings needs torch and open_clip: pip install open_clip_torch") from None
        self.spec = spec
        if open_clip.get_model_config(spec.model) is None:
            raise ConfigError(f"open_clip has no model config {spec.model!r}")
        pretrained = spec.pretrained
        if pretrained is not None and not Path(pretrained).is_file():
            tags = open_clip.list_pretrained_tags_by_model(spec.model)
            if pretrained not in tags:
                raise ConfigError(f"{pretrained!r} is neither a checkpoint file nor a pretrained tag of {spec.model} "
                                  f"(tags: {', '.join(tags) or 'none'}); use MODEL:/path/to/checkpoint")
        try:
            model, _, self.preprocess = open_clip.create_model_and_transforms(spec.model, pretrained=pretrained)
        except Exception as e:  # download errors, bad checkpoints
            raise PackerError(f"cannot load {spec.model} weights {pretrained!r}: {e}. Give a local checkpoint file "
                              f"(MODEL:/path/to/open_clip_model.bin) where the hub is unreachable.") from None
        self.device = ("cuda" if torch.cuda.is_available() else "cpu") if spec.device == "auto" else spec.device
        self.visual = model.visual.eval().to(self.device)
        self.visual.output_tokens = spec.output == "tokens"
        self.torch = torch

    def describe(self) -> dict[str, Any]:
        norm = self.preprocess.transforms[-1]
        size = self.visual.image_size
        return {
            "model": self.spec.model,
            "pretrained": self.spec.pretrained or "random",
            "output": self.spec.output,
            "dtype": "float16",
            "preprocessing": {"image_size": list(size) if isinstance(size, (tuple, list)) else [size, size],
                              "mean": list(norm.mean), "std": list(norm.std), "resize": "bicubic + center crop"},
        }

    def embed(self, paths: list[str]) -> list[np.ndarray]:
        from PIL import Image

        images = []
        for p in paths:
            with Image.open(p) as img:
                images.append(self.preprocess(img.convert("RGB")))
        with self.torch.inference_mode():
            out = self.visual(self.torch.stack(images).to(self.device))
            out = out[1] if self.spec.output == "tokens" else out
        return list(out.float().cpu().numpy().astype(np.float16))
