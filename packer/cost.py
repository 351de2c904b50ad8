"""What a packed row costs a training step -- not just its length.

    cost = token * tokens + attention * sum(seg^2) + media_item * items + media_token * media_tokens

Defaults, per row, in units of "one token through the LLM's dense layers":

- ``token = 1``;
- ``attention = 1 / 24576``: causal attention over a segment of length s costs about
  s^2 * h * 2 FLOPs per layer against ~12 * h^2 * 2 * s for the dense layers, i.e.
  s^2 / (12 h) token-equivalents per segment of s tokens. With h = 4096 and ~half the
  pairs masked, 1 / (6 h) = 1 / 24576. Set it for your model: ``1 / (6 * hidden_size)``;
- ``media_item = 0``, ``media_token = 0``: set them when the vision / audio tower runs in
  the step (e.g. ``media_token`` = tower FLOPs per patch / LLM FLOPs per token, about
  0.3B / 7B = 0.04 for ViT-L under a 7B LLM), so the rank that got the images does not
  keep the others waiting.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class CostModel:
    token: float = 1.0
    attention: float = 1.0 / 24576
    media_item: float = 0.0
    media_token: float = 0.0

    def __call__(self, stats: dict[str, np.ndarray]) -> np.ndarray:
        return (self.token * stats["tokens"] + self.attention * stats["attention"]
                + self.media_item * stats["media_items"] + self.media_token * stats["media_tokens"])
