"""Optional: run an open_clip vision tower over every image once, and store the result.

``--image-embeddings MODEL[:PRETRAINED]``:

- ``MODEL``: an open_clip model config name (``ViT-L-14-336``, ``ViT-B-32``, ...).
- ``PRETRAINED``: a local checkpoint file, or an open_clip pretrained tag (``openai``,
  ``laion2b_s34b_b79k``; downloaded from the hub where a network exists), or
  ``random`` (random weights: for tests and timing only).

The model is loaded before any record is read, so a missing checkpoint or an
unreachable hub fails the build at once, not after hours of encoding.

``--embed-output pooled`` stores the image embedding (``embed_dim`` floats per image,
open_clip's own output, unchanged). ``tokens`` stores one hidden state of the tower,
chosen by ``--embed-layer N`` (default -2), which is what a LLaVA projector consumes
(``vision_feature_layer=-2``). N indexes the hidden states as HF CLIP's
``output_hidden_states`` does::

    index   0        1          2        ...  L (= -1)      L - 1 (= -2, default)
    state   ln_pre   block 1    block 2  ...  last block    penultimate block
            output   output     output        output        output

Each state is ``[1 + n_patches, width]``: the class token first, then the patches in
row-major order (ViT-L-14-336: ``[577, 1024]``), taken *before* ``ln_post`` (the final
norm is applied only to the last layer's pooled output, never to a hidden state).
LLaVA's ``vision_feature_select_strategy="default"`` drops row 0 (the class token) at
train time; ``full`` keeps it. Stored float16, flattened, with the shape beside it.
Images are read with :func:`packer.media.load.load_image` (EXIF orientation applied,
RGB), the convention the counts were made with.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from packer.errors import ConfigError, PackerError
from packer.media.feature_specs import EmbedSpec


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
        self.visual.output_tokens = False  # forward() gives the pooled embedding; tokens come from _hidden_state
        self.torch = torch
        self.block = self._resolve_layer() if spec.output == "tokens" else None

    def _resolve_layer(self) -> int:
        """The block whose output is hidden state ``layer`` (0: ``ln_pre``, i.e. block -1 here)."""
        blocks = getattr(getattr(self.visual, "transformer", None), "resblocks", None)
        if blocks is None or not hasattr(self.visual, "ln_pre"):
            raise ConfigError(f"--embed-output tokens reads a ViT's hidden states; {self.spec.model} is not an open_clip "
                              f"VisionTransformer (use --embed-output pooled)")
        n = len(blocks)
        if not -(n + 1) <= self.spec.layer <= n:
            raise ConfigError(f"--embed-layer {self.spec.layer} is out of range for {self.spec.model}: it has {n} blocks, "
                              f"so hidden states {-(n + 1)}..{n} (-2, the penultimate block, is LLaVA's choice)")
        return (self.spec.layer % (n + 1)) - 1

    def describe(self) -> dict[str, Any]:
        norm = self.preprocess.transforms[-1]
        size = self.visual.image_size
        out = {
            "model": self.spec.model,
            "pretrained": self.spec.pretrained or "random",
            "output": self.spec.output,
            "dtype": "float16",
            "preprocessing": {"image_size": list(size) if isinstance(size, (tuple, list)) else [size, size],
                              "mean": list(norm.mean), "std": list(norm.std), "resize": "bicubic + center crop",
                              "loading": "EXIF transpose + RGB (transformers.image_utils.load_image)"},
        }
        if self.spec.output == "tokens":
            out["layer"] = self.spec.layer
            out["layout"] = "[1 + n_patches, width]: class token first, then patches row-major; before ln_post"
        return out

    def embed(self, paths: list[str]) -> list[np.ndarray]:
        from packer.media.load import load_image

        images = self.torch.stack([self.preprocess(load_image(p)) for p in paths]).to(self.device)
        with self.torch.inference_mode():
            out = self.visual(images) if self.block is None else self._hidden_state(images)
        return list(out.float().cpu().numpy().astype(np.float16))

    def _hidden_state(self, images):
        """Hidden state ``layer`` as ``[batch, 1 + n_patches, width]``, caught with a forward
        hook (open_clip exposes no per-layer output); the blocks after it still run."""
        visual = self.visual
        module = visual.ln_pre if self.block < 0 else visual.transformer.resblocks[self.block]
        caught = []
        handle = module.register_forward_hook(lambda _m, _i, output: caught.append(output))
        try:
            visual(images)
        finally:
            handle.remove()
        state = caught[0]
        batch_first = self.block < 0 or getattr(visual.transformer, "batch_first", True)
        return state if batch_first else state.transpose(0, 1)
