"""Qwen2-VL-style 3-D rotary positions (mRoPE), computed per segment from stored grids.

Within a segment, text tokens take the same running position on all three axes; an
image span with merged grid ``(t, h, w)`` takes ``(start + ti, start + hi, start + wi)``
over its patches in row-major order, and text after it resumes at ``start + max(h, w)``
-- what transformers' ``Qwen2VLModel.get_rope_index`` computes (the tests compare).
A video span is positioned the same way, its temporal index ``ti`` counting grid steps
(Qwen2-VL); with ``tokens_per_second`` (Qwen2.5-VL, ``config.vision_config.tokens_per_second``)
the temporal axis is time-scaled as ``Qwen2_5_VLModel.get_rope_index`` does:
``start + int(ti * tokens_per_second * second_per_grid_t)``, in float32 (the dtype of the
processor's ``second_per_grid_ts``). Text after a video resumes at ``start + max(h, w)``
too, as the pinned transformers (5.24) does (4.x resumed after the grid's largest position,
the temporal one included). Every segment starts again at 0, so a packed row gets the
positions each sample would get alone. Spans without a grid (audio) are positioned like text.
A segment with a parent (a preference tree's branch, :mod:`packer.loader.trees`) starts where
its parent's positions leave off -- the position text would take after the parent -- so a
branch is positioned as it is after its prompt, alone.
"""

from __future__ import annotations

import torch

from packer.modeling.spans import span_runs

VISUAL = ("image", "video")


def mrope_positions(length: int, segments: list[tuple[int, int]], spans: list[dict],
                    tokens_per_second: float | None = None, parents: list[int] | None = None) -> torch.Tensor:
    """``[3, length]`` positions for one row: ``segments`` are (start, end) token ranges,
    ``spans`` the row's media spans (absolute ``start``, ``length``, ``llm_grid``, ``runs`` where a
    family writes text between runs, and for videos ``second_per_grid_t``); ``tokens_per_second``
    time-scales videos (Qwen2.5-VL). Each run of ``k * h * w`` placeholders is positioned as a
    ``(k, h, w)`` grid at the text position it starts at (Qwen3-VL: one run per temporal group,
    its timestamp text between); text resumes at that position + ``max(h, w)``. ``parents[k]`` >= 0: segment
    ``k`` continues from where segment ``parents[k]`` (an earlier one) leaves off."""
    pos = torch.zeros(3, length, dtype=torch.long)
    by_segment: dict[int, list[dict]] = {}
    for s in spans:
        by_segment.setdefault(s["segment"], []).append(s)
    ends: list[int] = []  # where each segment's positions leave off: the next text position
    for k, (a, b) in enumerate(segments):
        parent = parents[k] if parents is not None and k < len(parents) else -1
        cursor, current = a, ends[parent] if parent >= 0 else 0
        for s in sorted(by_segment.get(k, []), key=lambda s: s["start"]):
            grid = s.get("llm_grid") or ()
            if not grid or s["kind"] not in VISUAL:
                continue  # positioned like text
            t, h, w = (int(x) for x in grid)
            tokens = int(s.get("tokens", s["length"]))
            if t * h * w != tokens:
                raise ValueError(f"media span of {tokens} placeholders has llm_grid {tuple(grid)} ({t * h * w} cells)")
            seconds = None
            if s["kind"] == "video" and tokens_per_second is not None:
                seconds = float(s.get("second_per_grid_t") or 0.0)
                if seconds <= 0:
                    raise ValueError(f"video {s.get('path') or s['ref']} has no second_per_grid_t (stored {seconds}): "
                                     f"time-scaled mRoPE (tokens_per_second={tokens_per_second}) needs it; rebuild with "
                                     f"this packer, or leave tokens_per_second out for Qwen2-VL")
            for offset, run in span_runs(s):
                if run % (h * w):
                    raise ValueError(f"a run of {run} placeholders is not whole temporal steps of {h} x {w}")
                start = s["start"] + offset
                text = start - cursor
                pos[:, cursor:start] = torch.arange(current, current + text)
                current += text
                steps = torch.arange(run // (h * w))
                if seconds is not None:
                    steps = (steps * (torch.tensor(seconds, dtype=torch.float32) * tokens_per_second)).long()
                tt, hh, ww = torch.meshgrid(steps, torch.arange(h), torch.arange(w), indexing="ij")
                pos[:, start : start + run] = torch.stack([tt, hh, ww]).reshape(3, -1) + current
                current += max(h, w)
                cursor = start + run
        pos[:, cursor:b] = torch.arange(current, current + b - cursor)
        ends.append(current + b - cursor)
    return pos
