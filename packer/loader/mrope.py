"""Qwen2-VL-style 3-D rotary positions (mRoPE), computed per segment from stored grids.

Within a segment, text tokens take the same running position on all three axes; an
image span with merged grid ``(t, h, w)`` takes ``(start + ti, start + hi, start + wi)``
over its patches in row-major order, and text after it resumes at ``start + max(h, w)``
-- what transformers' ``Qwen2VLModel.get_rope_index`` computes (the tests compare).
Every segment starts again at 0, so a packed row gets the positions each sample would
get alone. Spans without a grid (audio) are positioned like text.
"""

from __future__ import annotations

import torch


def mrope_positions(length: int, segments: list[tuple[int, int]], spans: list[dict]) -> torch.Tensor:
    """``[3, length]`` positions for one row: ``segments`` are (start, end) token ranges,
    ``spans`` the row's media spans (absolute ``start``, ``length``, ``grid``)."""
    pos = torch.zeros(3, length, dtype=torch.long)
    by_segment: dict[int, list[dict]] = {}
    for s in spans:
        by_segment.setdefault(s["segment"], []).append(s)
    for k, (a, b) in enumerate(segments):
        cursor, current = a, 0
        for s in sorted(by_segment.get(k, []), key=lambda s: s["start"]):
            if not s["grid"] or s["kind"] != "image":
                continue  # positioned like text
            text = s["start"] - cursor
            pos[:, cursor : s["start"]] = torch.arange(current, current + text)
            current += text
            t, h, w = (int(x) for x in s["grid"])
            if t * h * w != s["length"]:
                raise ValueError(f"media span of {s['length']} tokens has grid {tuple(s['grid'])} ({t * h * w} cells)")
            tt, hh, ww = torch.meshgrid(torch.arange(t), torch.arange(h), torch.arange(w), indexing="ij")
            pos[:, s["start"] : s["start"] + s["length"]] = torch.stack([tt, hh, ww]).reshape(3, -1) + current
            current += max(h, w)
            cursor = s["start"] + s["length"]
        pos[:, cursor:b] = torch.arange(current, current + b - cursor)
    return pos
