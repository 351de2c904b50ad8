"""Inline SVG charts for the report page: bar charts with integer, percent or log axes; no script, no URL.

Kept apart from the page (:mod:`packer.report.html`) because the axis arithmetic -- nice tick steps, when a
count axis goes logarithmic, where a label fits -- is its own job and tested on its own.
"""

from __future__ import annotations

import html
import math

COLORS = ["#3b6fb6", "#e07b39", "#5aa469", "#b5475b", "#8a6bbe", "#7f7f7f"]


def number(x: float) -> str:
    return f"{x:,.0f}" if abs(x) >= 100 or float(x).is_integer() else f"{x:,.2f}"


def compact(x: float) -> str:
    """A count in at most 4-5 characters: 950, 1.2k, 12k, 3.4M."""
    x = float(x)
    for div, unit in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(x) >= div:
            v = x / div
            text = f"{v:.1f}" if abs(v) < 10 else f"{v:.0f}"
            return text.removesuffix(".0") + unit
    return f"{x:.0f}" if x.is_integer() else f"{x:.2g}"


def nice_step(span: float, target: int = 5, integer: bool = False) -> float:
    """The 1 / 2 / 5 x 10^k step that cuts ``span`` into about ``target`` intervals
    (at least 1 on an integer axis, so a count axis never shows 1.25)."""
    if span <= 0:
        return 1.0
    raw = span / target
    mag = 10 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1, 2, 5, 10) if m * mag >= raw)
    return max(1.0, float(round(step))) if integer else step


LOG_SPAN = 30  # a count axis goes logarithmic when largest / smallest non-zero value exceeds this (~1.5 decades)


def log_axis(values: list[float]) -> bool:
    """Whether a count axis should be logarithmic: its non-zero values span more than
    :data:`LOG_SPAN` (on a linear axis a bar of 1 next to one of 84 is a hairline)."""
    positive = [v for v in values if v > 0]
    return bool(positive) and max(positive) / min(positive) > LOG_SPAN


def bar_chart(categories: list[str], series: dict[str, list[float]], *, width: int = 500, height: int = 220,
              y_label: str = "", percent: bool = False, log: bool | None = None) -> str:
    """Grouped vertical bars, one group per category, one bar per series; inline SVG.

    Counts (``percent=False``) get integer ticks, and a log scale (log 1+n, so 0 stays
    the baseline and 1 is visible) when ``log`` is True, or when ``log`` is None and the
    values span more than two decades; the axis label says so. Every non-zero bar carries
    its value (rotated when the bar is too narrow for it)."""
    values = [v for vals in series.values() for v in vals]
    log = (not percent) and (log_axis(values) if log is None else log)
    peak = max(values + [0.0])
    if log:
        top_exp = max(0, math.ceil(math.log10(max(peak, 1))))
        ticks = [0.0] + [10.0**k for k in range(top_exp + 1)]
        scale = lambda v: math.log10(1 + max(v, 0)) / math.log10(1 + ticks[-1])  # noqa: E731
        tick_text = [compact(t) for t in ticks]
    else:
        unit = 100 if percent else 1
        step = nice_step(peak * unit, 4, integer=not percent)
        n_steps = max(1, math.ceil(peak * unit / step - 1e-9))
        ticks = [k * step / unit for k in range(n_steps + 1)]
        scale = lambda v: v / ticks[-1]  # noqa: E731
        if percent:
            decimals = max(0, -math.floor(math.log10(step)))
            tick_text = [f"{100 * t:.{decimals}f}%" for t in ticks]
        else:
            tick_text = [f"{t:,.0f}" for t in ticks]
    labels = {}
    for name, vals in series.items():
        for c_idx, v in enumerate(vals):
            if v > 0:
                labels[name, c_idx] = (f"{100 * v:.1f}%" if percent else compact(v))
    left, bottom = 56, 34
    n_cat, n_ser = max(1, len(categories)), max(1, len(series))
    group_w = (width - left - 10) / n_cat
    bar_w = max(1.0, group_w * 0.8 / n_ser)
    longest = max([len(t) for t in labels.values()] + [0])
    rotate = longest * 5.6 + 2 > bar_w + group_w * 0.2 / n_ser
    top = 12 + (longest * 5.6 if rotate else 12)
    plot_h = height - bottom - top
    scale_name = "log" if log else "linear"
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" viewBox="0 0 {width} {height}" '
             f'style="max-width:100%;height:auto" role="img" data-scale="{scale_name}" '
             f'data-kind="{"percent" if percent else "count"}">']
    last_y = math.inf
    for t, text in zip(ticks, tick_text, strict=True):
        y = top + plot_h * (1 - scale(t))
        if last_y - y < 11:  # log 1+n: 0 and 1 are close on a tall axis; keep the labels apart
            continue
        last_y = y
        parts.append(f'<line x1="{left}" x2="{width - 10}" y1="{y:.1f}" y2="{y:.1f}" stroke="#e4e8ee"/>'
                     f'<text class="tick" x="{left - 6}" y="{y + 4:.1f}" font-size="10" text-anchor="end" '
                     f'fill="#5b6675">{text}</text>')
    for s_idx, (name, vals) in enumerate(series.items()):
        for c_idx, v in enumerate(vals):
            h = plot_h * scale(v)
            x = left + c_idx * group_w + group_w * 0.1 + s_idx * bar_w
            y = top + plot_h - h
            tip = f"{html.escape(name)} {html.escape(categories[c_idx])}: {number(100 * v) + '%' if percent else number(v)}"
            parts.append(f'<rect x="{x:.1f}" y="{y:.1f}" width="{bar_w:.1f}" height="{h:.1f}" '
                         f'fill="{COLORS[s_idx % len(COLORS)]}"><title>{tip}</title></rect>')
            if (name, c_idx) in labels:
                cx = x + bar_w / 2
                if rotate:
                    parts.append(f'<text class="value" x="{cx + 3:.1f}" y="{y - 3:.1f}" font-size="9" fill="#33404f" '
                                 f'transform="rotate(-90 {cx + 3:.1f} {y - 3:.1f})">{labels[name, c_idx]}</text>')
                else:
                    parts.append(f'<text class="value" x="{cx:.1f}" y="{y - 3:.1f}" font-size="9" fill="#33404f" '
                                 f'text-anchor="middle">{labels[name, c_idx]}</text>')
    parts.append(f'<line x1="{left}" x2="{width - 10}" y1="{top + plot_h:.1f}" y2="{top + plot_h:.1f}" stroke="#9aa5b1"/>')
    step = max(1, math.ceil((max([len(c) for c in categories] + [1]) * 5.6 + 4) / group_w))  # x labels that fit
    for c_idx, cat in enumerate(categories):
        if c_idx % step == 0:
            x = left + (c_idx + 0.5) * group_w
            parts.append(f'<text x="{x:.1f}" y="{height - bottom + 14}" font-size="10" text-anchor="middle" '
                         f'fill="#5b6675">{html.escape(cat)}</text>')
    axis = y_label + (" (log scale)" if log else "")
    if axis:
        parts.append(f'<text x="12" y="{top + plot_h / 2}" font-size="10" fill="#5b6675" '
                     f'transform="rotate(-90 12 {top + plot_h / 2})" text-anchor="middle">{html.escape(axis)}</text>')
    parts.append("</svg>")
    return "".join(parts)

