"""One self-contained HTML page for a report: inline SVG charts, no script, no URL."""

from __future__ import annotations

import html
import json
from typing import Any

COLORS = ["#3b6fb6", "#e07b39", "#5aa469", "#b5475b", "#8a6bbe", "#7f7f7f"]
CSS = """
body{font:14px/1.45 -apple-system,'Segoe UI',Helvetica,Arial,sans-serif;color:#1d2733;margin:0;background:#f4f6f9}
main{max-width:1080px;margin:0 auto;padding:28px}
h1{font-size:22px;margin:0 0 4px}h2{font-size:16px;margin:28px 0 10px;border-bottom:1px solid #d8dee6;padding-bottom:4px}
.sub{color:#5b6675;margin-bottom:18px}
.cards{display:grid;grid-template-columns:repeat(4,1fr);gap:12px}
.card{background:#fff;border:1px solid #dde3ea;border-radius:8px;padding:14px}
.card .v{font-size:26px;font-weight:600}.card .l{color:#5b6675;font-size:12px;text-transform:uppercase;letter-spacing:.04em}
.grid{display:grid;grid-template-columns:1fr 1fr;gap:16px}
.panel{background:#fff;border:1px solid #dde3ea;border-radius:8px;padding:12px}
.panel h3{font-size:13px;margin:0 0 6px;color:#33404f}
table{border-collapse:collapse;width:100%;background:#fff;font-size:13px}
td,th{border-bottom:1px solid #e6eaef;padding:5px 8px;text-align:left;vertical-align:top}
th{background:#f0f3f7;font-weight:600}td.n{text-align:right;font-variant-numeric:tabular-nums}
code{font:12px ui-monospace,Menlo,Consolas,monospace;color:#34495e}
.legend span{display:inline-block;margin-right:12px;font-size:12px}
.legend i{display:inline-block;width:10px;height:10px;margin-right:4px}
"""


def _n(x: float) -> str:
    return f"{x:,.0f}" if abs(x) >= 100 or float(x).is_integer() else f"{x:,.2f}"


def bar_chart(categories: list[str], series: dict[str, list[float]], *, width: int = 500, height: int = 220,
              y_label: str = "", percent: bool = False) -> str:
    """Grouped vertical bars, one group per category, one bar per series; inline SVG."""
    left, bottom, top = 52, 34, 10
    plot_w, plot_h = width - left - 10, height - bottom - top
    peak = max([v for vals in series.values() for v in vals] + [1e-9])
    n_cat, n_ser = max(1, len(categories)), max(1, len(series))
    group_w = plot_w / n_cat
    bar_w = max(1.0, group_w * 0.8 / n_ser)
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" role="img">']
    for k in range(5):
        y = top + plot_h * (1 - k / 4)
        value = peak * k / 4
        if percent:
            label = f"{100 * value:.0f}%" if peak >= 0.1 else f"{100 * value:.1f}%"
        else:
            label = f"{value:,.0f}" if peak >= 8 else f"{value:,.2f}"
        parts.append(f'<line x1="{left}" x2="{width - 10}" y1="{y:.1f}" y2="{y:.1f}" stroke="#e4e8ee"/>'
                     f'<text x="{left - 6}" y="{y + 4:.1f}" font-size="10" text-anchor="end" fill="#5b6675">{label}</text>')
    for s_idx, (name, values) in enumerate(series.items()):
        for c_idx, v in enumerate(values):
            h = plot_h * v / peak
            x = left + c_idx * group_w + group_w * 0.1 + s_idx * bar_w
            parts.append(f'<rect x="{x:.1f}" y="{top + plot_h - h:.1f}" width="{bar_w:.1f}" height="{h:.1f}" '
                         f'fill="{COLORS[s_idx % len(COLORS)]}"><title>{html.escape(name)} {html.escape(categories[c_idx])}: '
                         f'{_n(v)}</title></rect>')
    step = max(1, len(categories) // 12)
    for c_idx, cat in enumerate(categories):
        if c_idx % step == 0:
            x = left + (c_idx + 0.5) * group_w
            parts.append(f'<text x="{x:.1f}" y="{height - bottom + 14}" font-size="10" text-anchor="middle" '
                         f'fill="#5b6675">{html.escape(cat)}</text>')
    if y_label:
        parts.append(f'<text x="12" y="{top + plot_h / 2}" font-size="10" fill="#5b6675" '
                     f'transform="rotate(-90 12 {top + plot_h / 2})" text-anchor="middle">{html.escape(y_label)}</text>')
    parts.append("</svg>")
    return "".join(parts)


def _legend(names: list[str]) -> str:
    return '<div class="legend">' + "".join(f'<span><i style="background:{COLORS[k % len(COLORS)]}"></i>{html.escape(n)}</span>'
                                           for k, n in enumerate(names)) + "</div>"


def _panel(title: str, body: str, legend: list[str] | None = None) -> str:
    return f'<div class="panel"><h3>{html.escape(title)}</h3>{_legend(legend) if legend else ""}{body}</div>'


def _table(header: list[str], rows: list[list[Any]], numeric: set[int] = frozenset()) -> str:
    head = "".join(f"<th>{html.escape(h)}</th>" for h in header)
    body = "".join("<tr>" + "".join(f'<td class="{"n" if i in numeric else ""}">{c}</td>' for i, c in enumerate(r)) + "</tr>"
                   for r in rows)
    return f"<table><tr>{head}</tr>{body}</table>"


def render(r: dict[str, Any]) -> str:
    b, h = r["batching"], r["histograms"]
    edges = h["length_edges"]
    length_bins = [f"{edges[i]}" for i in range(len(edges) - 1)]
    cards = [
        ("fill", f"{100 * r['fill']:.2f}%", f"of {r['max_length']:,} tokens per row"),
        ("rows", f"{r['rows']:,}", f"lower bound {r['lower_bound']:,} (+{r['gap_to_lower_bound']:,})"),
        ("speed-up vs padding", f"{b['speedup_vs_padded_random']:.2f}x", f"random batches of {b['batch_size']}"),
        ("attention work", f"{100 * r['attention']['ratio']:.1f}%", "of dense L x L masks"),
    ]
    card_html = "".join(f'<div class="card"><div class="l">{t}</div><div class="v">{v}</div><div class="sub">{s}</div></div>'
                        for t, v, s in cards)
    acc = r["accounting"]
    accounting = _table(["", "count"], [
        ["records read", _n(acc["records_read"])], ["packed samples", _n(acc["samples_packed"])],
        ["quarantined", _n(acc["quarantined"])], ["dropped", _n(acc["dropped"])],
        ["truncated samples", _n(r["oversize"]["truncated_samples"])], ["split samples", _n(r["oversize"]["split_samples"])],
        *[[f"dropped: {html.escape(k)}", _n(v)] for k, v in acc["dropped_by_reason"].items()],
    ], {1})
    by_file = _table(["input file", "records", "packed", "quarantined", "dropped"], [
        [f"<code>{html.escape(k)}</code>", _n(v["records"]), _n(v["packed"]), _n(v["quarantined"]), _n(v["dropped"])]
        for k, v in acc["by_file"].items()], {1, 2, 3, 4})
    modal = _table(["modality", "samples", "tokens", "trained tokens", "media items", "media tokens"], [
        [html.escape(m), _n(v["samples"]), _n(v["tokens"]), _n(v["trained_tokens"]), _n(v["media_items"]), _n(v["media_tokens"])]
        for m, v in r["per_modality"].items()], {1, 2, 3, 4, 5})
    mods = list(h["sample_lengths"])
    fill = h["fill_edges"]
    fill_bins = [f"{int(100 * fill[i])}-{int(100 * fill[i + 1])}%" for i in range(len(fill) - 1)]
    charts = [
        _panel("Sample length distribution (tokens; bin k holds lengths from its label to the next)",
               bar_chart(length_bins, {m: h["sample_lengths"][m] for m in mods}, y_label="samples"), mods),
        _panel("Fill per row", bar_chart(fill_bins, {"rows": h["fill_per_row"]}, y_label="rows")),
        _panel("Segments per row", bar_chart(list(h["segments_per_row"]), {"rows": list(h["segments_per_row"].values())},
                                             y_label="rows")),
        _panel(f"Tokens computed for the same samples (B = {b['batch_size']})",
               bar_chart(["padded, random", "length-grouped", "packed"],
                         {"real tokens / computed": [b["padded_random"]["real_share"], b["length_grouped"]["real_share"],
                                                     b["packed"]["real_share"]]}, y_label="real share", percent=True)),
    ]
    ranks = {k: v for k, v in r["rank_imbalance"].items() if v}
    if ranks:
        series = {"round-robin": [v["round_robin"] - 1 for v in ranks.values()],
                  "TokenBalancedSampler": [v["balanced"] - 1 for v in ranks.values()]}
        charts.append(_panel("Per-step imbalance: how much slower the slowest rank is than the mean",
                             bar_chart([f"{k} ranks" for k in ranks], series, y_label="slowest / mean - 1", percent=True),
                             list(series)))
    else:
        charts.append(_panel("Per-step cost imbalance", "<p>Too few rows for one step of 8 ranks x 4 rows.</p>"))
    quarantine = _table(["reason", "records", "examples (file:line)"], [
        [html.escape(q["reason"]), _n(q["count"]), "<br>".join(f"<code>{html.escape(e)}</code>" for e in q["examples"])]
        for q in r["quarantine_top"]], {1}) if r["quarantine_top"] else "<p>No record was quarantined.</p>"
    config = _table(["key", "value"], [[f"<code>{html.escape(k)}</code>", f"<code>{html.escape(json.dumps(v))}</code>"]
                                       for k, v in sorted(r["config"].items())])
    name = html.escape(r["build"]["name"] or "packer build")
    return (f"<!doctype html><html><head><meta charset='utf-8'><title>{name} - packer report</title>"
            f"<style>{CSS}</style></head><body><main>"
            f"<h1>{name}</h1><div class='sub'>packer {html.escape(r['build']['packer_version'])} · built "
            f"{html.escape(r['build']['created_at'])} · {r['records']:,} records → {r['rows']:,} rows of "
            f"{r['max_length']:,} tokens</div>"
            f"<div class='cards'>{card_html}</div>"
            f"<h2>Accounting</h2><div class='grid'><div>{accounting}</div><div>{by_file}</div></div>"
            f"<h2>Modalities</h2>{modal}"
            f"<h2>Charts</h2><div class='grid'>{''.join(charts)}</div>"
            f"<h2>Top quarantine reasons</h2>{quarantine}"
            f"<h2>Resolved config</h2>{config}"
            f"</main></body></html>")
