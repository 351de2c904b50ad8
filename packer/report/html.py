"""One self-contained HTML page for a report: inline SVG charts, no script, no URL.

The page's sections, tables and cards from the computed report (:mod:`packer.report.compute`); the charts
themselves are drawn by :mod:`packer.report.svg`.
"""

from __future__ import annotations

import html
import json
from typing import Any

from packer.config.sources import capacity_text, policy_text
from packer.cost import COSTS
from packer.pack.plan import budget_applied
from packer.report.svg import COLORS, bar_chart, number

CSS = """
body{font:14px/1.45 -apple-system,'Segoe UI',Helvetica,Arial,sans-serif;color:#1d2733;margin:0;background:#f4f6f9}
main{max-width:1080px;margin:0 auto;padding:28px}
h1{font-size:22px;margin:0 0 4px}h2{font-size:16px;margin:28px 0 10px;border-bottom:1px solid #d8dee6;padding-bottom:4px}
.sub{color:#5b6675;margin-bottom:18px}
.cards{display:grid;grid-template-columns:repeat(auto-fit,minmax(180px,1fr));gap:12px}
.card{background:#fff;border:1px solid #dde3ea;border-radius:8px;padding:14px}
.card .v{font-size:26px;font-weight:600}.card .l{color:#5b6675;font-size:12px;text-transform:uppercase;letter-spacing:.04em}
.grid{display:grid;grid-template-columns:1fr 1fr;gap:16px}
.panel{background:#fff;border:1px solid #dde3ea;border-radius:8px;padding:12px}
.panel.wide{grid-column:1/-1}
.panel h3{font-size:13px;margin:0 0 6px;color:#33404f}
table{border-collapse:collapse;width:100%;background:#fff;font-size:13px}
td,th{border-bottom:1px solid #e6eaef;padding:5px 8px;text-align:left;vertical-align:top}
th{background:#f0f3f7;font-weight:600}td.n{text-align:right;font-variant-numeric:tabular-nums}
code{font:12px ui-monospace,Menlo,Consolas,monospace;color:#34495e}
.scroll{max-height:420px;overflow:auto;border:1px solid #e6eaef}
.legend span{display:inline-block;margin-right:12px;font-size:12px}
.legend i{display:inline-block;width:10px;height:10px;margin-right:4px}
.row{background:#fff;border:1px solid #dde3ea;border-radius:8px;padding:8px 12px}
.seg{border-left:3px solid #9aa5b1;margin:8px 0;padding:2px 10px}
.seg .h{color:#5b6675;font-size:12px;margin-bottom:4px}
.seg .x{font:12px/1.6 ui-monospace,Menlo,Consolas,monospace;white-space:pre-wrap;word-break:break-word}
.x .t{background:#d3f0d7;color:#114a1d}.x .u{color:#6b7684}.x .m{background:#e3e9f6;color:#2b4a8a;border-radius:3px;padding:0 3px}
"""



def _hours(x: float) -> str:
    return f"{x:,.0f}" if abs(x) >= 1000 else f"{x:.3g}"


def _gpu_unit(hours: float) -> tuple[str, float]:
    """The unit that keeps GPU time short: (name, factor from hours)."""
    if abs(hours) >= 1 or hours == 0:
        return "GPU-h", 1.0
    if abs(hours) >= 1 / 60:
        return "GPU-min", 60.0
    return "GPU-s", 3600.0


def _gpu_time(hours: float) -> str:
    unit, factor = _gpu_unit(hours)
    return f"{_hours(hours * factor)} {unit}"


def _legend(names: list[str]) -> str:
    return '<div class="legend">' + "".join(f'<span><i style="background:{COLORS[k % len(COLORS)]}"></i>{html.escape(n)}</span>'
                                           for k, n in enumerate(names)) + "</div>"


def _panel(title: str, body: str, legend: list[str] | None = None, *, wide: bool = False) -> str:
    cls = "panel wide" if wide else "panel"
    return f'<div class="{cls}"><h3>{html.escape(title)}</h3>{_legend(legend) if legend else ""}{body}</div>'


def _table(header: list[str], rows: list[list[Any]], numeric: set[int] = frozenset()) -> str:
    head = "".join(f"<th>{html.escape(h)}</th>" for h in header)
    body = "".join("<tr>" + "".join(f'<td class="{"n" if i in numeric else ""}">{c}</td>' for i, c in enumerate(r)) + "</tr>"
                   for r in rows)
    return f"<table><tr>{head}</tr>{body}</table>"


def _where(e: dict[str, Any]) -> str:
    return f"<code>{html.escape(str(e['file']))}:{e['line']}</code>"


def _scroll(table: str, rows: int) -> str:
    """A long table in a box of its own height (scrolls; no script)."""
    return f'<div class="scroll">{table}</div>' if rows > 12 else table


def _capped(part: dict[str, Any], noun: str) -> str:
    shown = len(part["listed"])
    return f"<p class='sub'>The first {shown:,} of {part['count']:,} {noun} are listed; report.json holds the same.</p>" \
        if part.get("capped") else ""


def padding_section(r: dict[str, Any]) -> str:
    b, pad = r["batching"], r["padding"]
    names = {"padded_random": "padded, random batches", "length_grouped": "length-grouped batches", "packed": "packed"}
    unit, factor = _gpu_unit(max(pad["padding_gpu_hours"].values()))  # one unit for the whole table
    rows = []
    for k, label in names.items():
        saved = pad["saved_by_packing"].get(k)
        rows.append([html.escape(label), number(b[k]["computed"]), f"{100 * b[k]['real_share']:.1f}%",
                     number(pad["padding_tokens"][k]),
                     _hours(factor * pad["padding_gpu_hours"][k]), number(saved["tokens"]) if saved else "&ndash;",
                     _hours(factor * saved["gpu_hours"]) if saved else "&ndash;"])
    table = _table(["batching", "tokens computed", "real share", "padding tokens", f"padding ({unit})",
                    "saved by packing (tokens)", f"saved by packing ({unit})"], rows, {1, 2, 3, 4, 5, 6})
    return (f"{table}<p class='sub'>One pass over the {number(b['real_tokens'])} real tokens, batches of {b['batch_size']}. "
            f"GPU-hours = tokens / {pad['tokens_per_gpu_second']:,.0f} tokens/s per GPU / 3600: about a 7B dense model "
            f"on one H100-class GPU at ~40% MFU; a linear cost per token (attention's quadratic term left out). "
            f"<code>report(..., tokens_per_gpu_second=...)</code> states another.</p>")


def _setup(b: dict[str, Any], ranks: str) -> str:
    return f"{ranks} x {b['rows_per_rank']}"


def rank_panel(b: dict[str, Any]) -> str:
    """The chart: how much longer the epoch takes than a perfectly balanced one, per ranks x batch."""
    shown = {k: v for k, v in b["by_ranks"].items() if v}
    if not shown:
        return _panel("Step imbalance", f"<p>Too few rows for one step of {_setup(b, str(min(b['ranks'])))} rows.</p>")
    series = {"random order": [v["random_weighted"] - 1 for v in shown.values()],
              f"TokenBalancedSampler (window {b['window']})": [v["sampler_weighted"] - 1 for v in shown.values()],
              "best possible" + (" (a bound)" if b["best_is_bound"] else ""): [v["best_weighted"] - 1 for v in shown.values()]}
    return _panel("Step imbalance: how much longer the epoch takes than perfectly balanced (Σ slowest / Σ mean)",
                  bar_chart([f"{_setup(b, k)} rows" for k in shown], series, y_label="Σ slowest / Σ mean - 1", percent=True),
                  list(series))


def step_balance_section(b: dict[str, Any]) -> str:
    """The table: random order, the sampler and the best possible, by the mean over steps and weighted."""
    rows = []
    for k, v in b["by_ranks"].items():
        if not v:
            rows.append([_setup(b, k), "0", "too few rows for one step", "", "", "", ""])
            continue
        best = ("&ge; " if b["best_is_bound"] else "") + f"{v['best_weighted']:.3f}"
        rows.append([_setup(b, k), number(v["steps"]), f"{v['random']:.3f}", f"{v['random_weighted']:.3f}", f"{v['sampler']:.3f}",
                     f"{v['sampler_weighted']:.3f}", best])
    table = _table(["ranks x rows", "steps", "random order: mean over steps", "random order: Σmax/Σmean",
                    f"sampler (window {b['window']}): mean over steps", "sampler: Σmax/Σmean", "best possible: Σmax/Σmean"],
                   rows, {1, 2, 3, 4, 5, 6})
    per_cost = []
    for k, v in b["by_ranks"].items():
        if v and "costs" in v:
            plan_time = max(v["costs"]["plan"]["time"], 1e-12)
            for name, label in (("random", "random order"), ("sampler", f"TokenBalancedSampler (window {b['window']})"),
                                ("plan", "step plan (packer steps, StepPlanSampler)")):
                c = v["costs"][name]
                per_cost.append([_setup(b, k), label, *("&ndash;" if c[x] is None else f"{c[x]:.3f}" for x in COSTS),
                                 f"{c['time'] / plan_time:.3f}"])
    costs = (_table(["ranks x rows", "order", "llm: Σmax/Σmean", "encoder: Σmax/Σmean", "supervised: Σmax/Σmean",
                     "simulated time / the plan's"], per_cost, {2, 3, 4, 5})
             + "<p class='sub'>Each of the three costs a row has (the build's cost model, <code>CostModel.vector</code>): "
               "llm (tokens and attention pairs), encoder (images, frames, clips through the towers), supervised "
               "tokens (what weighs a rank's loss); simulated time: Σ over steps of the slowest rank's llm + encoder. "
               "The step plan balances all three at once (docs/loader.md, \"Step plans\").</p>"
             + "".join(f"<p class='sub'>{c}: no figure (&ndash;): {html.escape(why)}.</p>"
                       for c, why in (b.get("absent") or {}).items())) if per_cost else ""
    bound = ("at more than one row per rank only a lower bound (&ge;): splitting a step's rows evenly is a partition "
             "problem" if b["best_is_bound"] else "the sampler with a window of the whole epoch reaches it")
    return (f"{table}<p class='sub'>Slowest rank / mean rank of each step's cost (<code>CostModel()</code>, the "
            f"sampler's default: tokens and attention Σ seg², no media), one epoch. Σmax/Σmean is the epoch's time "
            f"against a perfectly balanced one: what the ranks wait is Σ (max &minus; mean). The mean over steps weighs "
            f"a near-free step of cheap rows as much as an expensive one. Best possible: the lowest Σmax/Σmean any "
            f"assignment of the same rows reaches; {bound}. Set with <code>--report-ranks</code>, "
            f"<code>--report-batch</code>, <code>--report-window</code>.</p>{costs}")


def truncated_section(r: dict[str, Any]) -> str:
    t = r["truncated"]
    clips = r["oversize"].get("audio_truncated", 0)
    audio = (f"<p>{clips:,} audio clips longer than the encoder's window were cut to it: the model sees their first window "
             f"(<code>--long-audio drop</code> quarantines such records instead).</p>" if clips else "")
    if not t["count"]:
        return audio + "<p>No sample was truncated.</p>"
    rows = [[_where(e), f"<code>{html.escape(str(e['id']))}</code>", number(e["kept_tokens"]), number(e["cut_tokens"])]
            for e in t["listed"]]
    return audio + (f"<p>{t['count']:,} sample(s) longer than {r['max_length']:,} tokens were truncated; "
            f"{t['tokens_cut']:,} tokens cut.</p>"
            + _scroll(_table(["input file:line", "id", "tokens kept", "tokens cut"], rows, {2, 3}), len(rows))
            + _capped(t, "truncated samples"))


def dropped_section(r: dict[str, Any]) -> str:
    d = r["dropped"]
    if not d["count"]:
        return "<p>No sample was dropped.</p>"
    reasons = ", ".join(f"{html.escape(k)} {n:,}" for k, n in d["by_reason"].items())
    rows = [[_where(e), f"<code>{html.escape(str(e['id']))}</code>", html.escape(e["reason"]), html.escape(e["detail"])]
            for e in d["listed"]]
    return (f"<p>{d['count']:,} sample(s) dropped ({reasons}); every one is in <code>dropped.jsonl</code>.</p>"
            + _scroll(_table(["input file:line", "id", "reason", "detail"], rows), len(rows)) + _capped(d, "dropped samples"))


def quarantine_section(r: dict[str, Any]) -> str:
    if not r["quarantine_top"]:
        return "<p>No record was quarantined.</p>"
    rows = []
    for q in r["quarantine_top"]:
        entries = q.get("entries") or [{"file": e.rsplit(":", 1)[0], "line": e.rsplit(":", 1)[-1], "id": None, "detail": ""}
                                       for e in q["examples"]]
        for k, e in enumerate(entries):
            first = k == 0
            rows.append([html.escape(q["reason"]) if first else "", number(q["count"]) if first else "", _where(e),
                         f"<code>{html.escape(str(e['id']))}</code>" if e.get("id") is not None else "",
                         html.escape(e.get("detail") or "")])
    return ("<p>Every quarantined record, with its raw line, is in <code>quarantine.jsonl</code>; the first examples "
            "of each reason:</p>" + _table(["reason", "records", "example file:line", "id", "detail"], rows, {1}))


def preference_section(r: dict[str, Any]) -> str:
    """A ``--preference`` build: records, responses, and what the tree layout saves against pairs."""
    p = r.get("preference")
    if not p:
        return ""
    saved = f"{number(p['saved_against_pairs'])} ({100 * p['saved_share']:.1f}%)"
    rows = [["layout", html.escape(p["layout"])], ["records", number(p["records"])], ["responses", number(p["responses"])],
            ["tokens as pairs", number(p["pairs_tokens"])], ["tokens as trees", number(p["tree_tokens"])],
            ["tokens the tree saves against pairs", saved]]
    if p["layout"] == "tree":
        rows.append(["trees in the rows (prompts / branches)", f"{number(p['tree_prompts'])} / {number(p['tree_branches'])}"])
    return "<h2>Preference records</h2>" + _table(["", "value"], rows, {1})


def _card(key: str, label: str, value: str, sub: str) -> str:
    return (f'<div class="card" data-key="{key}"><div class="l">{label}</div><div class="v">{value}</div>'
            f'<div class="sub">{sub}</div></div>')


def headline(r: dict[str, Any]) -> list[tuple[str, str, str, str]]:
    """The first screen's cards: (key, label, value, line under it); the browser test reads them back."""
    b, pad, over = r["batching"], r["padding"], r["oversize"]
    saved = pad["saved_by_packing"]["padded_random"]
    return [
        ("fill", "fill", f"{100 * r['fill']:.2f}%", f"of {capacity_text(r['max_length'], r.get('policy_groups') or [])}"),
        ("trained_share", "tokens trained", f"{100 * r.get('trained_share', 0):.1f}%",
         f"{r.get('trained_tokens', 0):,} of {r['tokens']:,} tokens carry a label"),
        ("rows", "rows", f"{r['rows']:,}", f"lower bound {r['lower_bound']:,} (+{r['gap_to_lower_bound']:,})"
         + (f"; with the row encoder budget {r['row_budget']['bound']:,} (+{r['row_budget']['gap_to_bound']:,})"
            if budget_applied(r.get("row_budget")) else "")),
        ("speedup", "speed-up vs padding", f"{b['speedup_vs_padded_random']:.2f}x", f"random batches of {b['batch_size']}"),
        ("padding_saved", "padding saved", _gpu_time(saved["gpu_hours"]),
         f"{number(saved['tokens'])} tokens per pass, at {pad['tokens_per_gpu_second']:,.0f} tokens/s/GPU"),
        ("attention", "attention work", f"{100 * r['attention']['ratio']:.1f}%", "of dense L x L masks"),
        ("truncated", "samples truncated", f"{over['truncated_samples']:,}", f"{over['truncated_tokens']:,} tokens cut"),
        ("audio_truncated", "audio clips cut", f"{over.get('audio_truncated', 0):,}", "to the audio encoder's window"),
    ]


def sample_row_section(r: dict[str, Any]) -> str:
    """One packed row as the model sees it: each segment's text, trained tokens highlighted, media collapsed."""
    s = r.get("sample_row")
    if not s:
        return "<p>No row to show.</p>"
    if "error" in s:
        return f"<p>Row {s['row']} cannot be shown: {html.escape(s['error'])}</p>"
    blocks = []
    for k, seg in enumerate(s["shown"]):
        parts = []
        for p in seg["pieces"]:
            if "media" in p:
                parts.append(f'<span class="m">[{html.escape(p["media"])} x{p["count"]:,}]</span>')
            else:
                parts.append(f'<span class="{"t" if p["trained"] else "u"}">{html.escape(p["text"])}</span>')
        more = f' <span class="u">&hellip; {seg["hidden"]:,} more tokens</span>' if seg["hidden"] else ""
        role = f' &middot; {html.escape(seg["role"])}' if seg.get("role") else ""
        if seg.get("parent", -1) >= 0:
            role += f' (attends to segment {seg["parent"] + 1})'
        blocks.append(f'<div class="seg"><div class="h">segment {k + 1} &middot; <code>{html.escape(str(seg["id"]))}</code> '
                      f'&middot; {html.escape(seg["modality"])}{role} &middot; {seg["tokens"]:,} tokens, '
                      f'{seg["trained"]:,} trained</div><div class="x">{"".join(parts)}{more}</div></div>')
    rest = s["segments"] - len(s["shown"])
    note = f"<p class='sub'>&hellip; and {rest} more segment(s).</p>" if rest > 0 else ""
    legend = ('<div class="legend"><span><i style="background:#d3f0d7"></i>trained (has a label)</span>'
              '<span><i style="background:#f4f6f9;border:1px solid #9aa5b1"></i>not trained (prompt, template, padding)</span>'
              '<span><i style="background:#e3e9f6"></i>media placeholders</span></div>')
    alone = ("each its own sample (no segment attends to another)" if not any(g.get("parent", -1) >= 0 for g in s["shown"])
             else "each its own sample, but for a preference tree's responses, which attend to their prompt")
    return (f"<p>Row {s['row']:,} of the first shard: {s['tokens']:,} tokens in {s['segments']} segments, {alone}."
            f"</p>{legend}<div class='row'>{''.join(blocks)}</div>{note}")


def media_panels(r: dict[str, Any]) -> list[str]:
    """Tokens per item for each media kind; image sizes and clip durations from the files' headers."""
    m = r.get("media") or {}
    panels = []
    for kind, h in m.get("tokens_per_item", {}).items():
        bins = [f"{e:,}" for e in h["edges"][:-1]] + [f"{h['edges'][-1]:,}+"]
        panels.append(_panel(f"Placeholder tokens per {kind} ({h['items']:,} items, mean {h['mean']:,.0f}; bin k from "
                             f"its label to the next)", bar_chart(bins, {kind: h["counts"]}, y_label=f"{kind}s")))
    for key, title in (("image_sides", "Image size: longest side (px)"), ("audio_seconds", "Clip duration (s)")):
        h = m.get(key)
        if not h:
            continue
        bins = [f"{e:g}" for e in h["edges"][:-1]] + [f"{h['edges'][-1]:g}+"]
        sampled = (f"; {h['probed']:,} of {h['distinct']:,} distinct files read" if h["probed"] < h["distinct"]
                   else f"; {h['distinct']:,} distinct files")
        bad = f", {h['unreadable']:,} unreadable now" if h["unreadable"] else ""
        panels.append(_panel(f"{title}{sampled}{bad}", bar_chart(bins, {"files": h["counts"]}, y_label="files")))
    return panels


def family_html(r: dict[str, Any]) -> str:
    """The model family the build was made for, its processor and settings, and the media it packed."""
    f = r.get("family") or {}
    if not f:
        return ""
    about = [["family", f"<code>{html.escape(f['name'])}</code>"],
             ["processor class", html.escape(f.get("processor_class") or "none (generic token-count policies)")],
             ["processor", f"<code>{html.escape(f['processor'])}</code>" if f.get("processor") else "none"],
             ["modalities", html.escape(", ".join(f.get("modalities") or []) or "text only")]]
    settings = _table(["setting", "value"], [[f"<code>{html.escape(k)}</code>", f"<code>{html.escape(json.dumps(v))}</code>"]
                                             for k, v in sorted((f.get("settings") or {}).items())])
    counts = r.get("media_counts") or {}
    media = _table(["media", "items", "placeholder tokens"],
                   [[html.escape(k), number(v["items"]), number(v["tokens"])] for k, v in counts.items()], {1, 2})
    return (f"<h2>Model family</h2><div class='grid'><div>{_table(['', ''], about)}{media}</div>"
            f"<div>{settings}</div></div>")


def _policy(policy: dict[str, Any]) -> str:
    return html.escape(policy_text(policy) or "the build's")


def _reasons(n: int, by_reason: dict[str, int]) -> str:
    """``3 (missing_image 2, malformed_json 1)``."""
    named = ", ".join(f"{html.escape(k)} {v:,}" for k, v in sorted(by_reason.items(), key=lambda kv: -kv[1]))
    return number(n) + (f" ({named})" if named else "")


def render(r: dict[str, Any]) -> str:
    b, h = r["batching"], r["histograms"]
    edges = h["length_edges"]
    length_bins = [f"{edges[i]}" for i in range(len(edges) - 1)]
    card_html = "".join(_card(*c) for c in headline(r))
    acc = r["accounting"]
    accounting = _table(["", "count"], [
        ["records read", number(acc["records_read"])], ["packed samples", number(acc["samples_packed"])],
        ["quarantined", number(acc["quarantined"])], ["dropped", number(acc["dropped"])],
        ["truncated samples", number(r["oversize"]["truncated_samples"])],
        ["split samples", number(r["oversize"]["split_samples"])],
        ["audio clips cut to the encoder's window", number(r["oversize"].get("audio_truncated", 0))],
        *[[f"dropped: {html.escape(k)}", number(v)] for k, v in acc["dropped_by_reason"].items()],
    ], {1})
    by_file = _table(["input file", "records", "packed", "quarantined", "dropped"], [
        [f"<code>{html.escape(k)}</code>", number(v["records"]), number(v["packed"]), number(v["quarantined"]),
         number(v["dropped"])]
        for k, v in acc["by_file"].items()], {1, 2, 3, 4})
    sources = r.get("sources") or []
    if any(a["policy"] for a in sources):  # per input entry, each at its own capacity (none own: the build's say it)
        by_file += _table(["source", "own packing", "records", "packed", "quarantined", "dropped", "rows",
                           "max_length", "lower bound", "tokens", "fill"], [
            [f"<code>{html.escape(a['input'])}</code>", _policy(a["policy"]), number(a["records"]), number(a["packed"]),
             _reasons(a["quarantined"], a["quarantined_by_reason"]), _reasons(a["dropped"], a["dropped_by_reason"]),
             number(a["rows"]) + (f" ({number(a['shared_rows'])} shared)" if a["shared_rows"] else ""), number(a["capacity"]),
             # rows shared with another source: the bound and fill are the group's (the table below)
             "see its group" if a["shared_rows"] else number(a["lower_bound"]), number(a["tokens"]),
             "see its group" if a["shared_rows"] else f"{100 * a['fill']:.2f}%"]
            for a in sources], set(range(2, 11)))
    shared = [g for g in r.get("policy_groups") or [] if len(g["sources"]) > 1]
    if shared:  # sources of one policy share rows: the group's rows, bound and fill
        by_file += _table(["sources sharing rows", "own packing", "max_length", "rows", "lower bound", "tokens", "fill"], [
            ["<br>".join(f"<code>{html.escape(x)}</code>" for x in g["sources"]), _policy(g["policy"]),
             number(g["capacity"]), number(g["rows"]), number(g["lower_bound"]), number(g["tokens"]), f"{100 * g['fill']:.2f}%"]
            for g in shared], {2, 3, 4, 5, 6})
    modal = _table(["modality", "samples", "tokens", "trained tokens", "media items", "media tokens"], [
        [html.escape(m), number(v["samples"]), number(v["tokens"]), number(v["trained_tokens"]), number(v["media_items"]),
         number(v["media_tokens"])]
        for m, v in r["per_modality"].items()], {1, 2, 3, 4, 5})
    mods = list(h["sample_lengths"])
    fill = h["fill_edges"]
    fill_bins = [f"{int(round(100 * fill[i]))}-{int(round(100 * fill[i + 1]))}" for i in range(len(fill) - 1)]
    charts = [
        _panel("Sample length distribution (tokens; bin k holds lengths from its label to the next)",
               bar_chart(length_bins, {m: h["sample_lengths"][m] for m in mods}, y_label="samples", width=1000, height=260),
               mods, wide=True),
        _panel("Fill per row (% of its max_length)", bar_chart(fill_bins, {"rows": h["fill_per_row"]}, y_label="rows")),
        _panel("Segments per row", bar_chart(list(h["segments_per_row"]), {"rows": list(h["segments_per_row"].values())},
                                             y_label="rows")),
        _panel(f"Tokens computed for the same samples (B = {b['batch_size']})",
               bar_chart(["padded, random", "length-grouped", "packed"],
                         {"real tokens / computed": [b["padded_random"]["real_share"], b["length_grouped"]["real_share"],
                                                     b["packed"]["real_share"]]}, y_label="real share", percent=True)),
    ]
    charts.append(rank_panel(r["rank_imbalance"]))
    charts += media_panels(r)
    config = _table(["key", "value"], [[f"<code>{html.escape(k)}</code>", f"<code>{html.escape(json.dumps(v))}</code>"]
                                       for k, v in sorted(r["config"].items())])
    name = html.escape(r.get("title") or r["build"]["name"] or "packer build")
    return (f"<!doctype html><html><head><meta charset='utf-8'><title>{name} - packer report</title>"
            f"<style>{CSS}</style></head><body><main>"
            f"<h1>{name}</h1><div class='sub'>packer {html.escape(r['build']['packer_version'])} · built "
            f"{html.escape(r['build']['created_at'])} · {r['records']:,} records → {r['rows']:,} rows of "
            f"{r['max_length']:,} tokens</div>"
            f"<div class='cards'>{card_html}</div>"
            f"{family_html(r)}"
            f"<h2>A packed row, as the model sees it</h2>{sample_row_section(r)}"
            f"<h2>Accounting</h2><div class='grid'><div>{accounting}</div><div>{by_file}</div></div>"
            f"<h2>Modalities</h2>{modal}{preference_section(r)}"
            f"<h2>Charts</h2><div class='grid'>{''.join(charts)}</div>"
            f"<h2>Padding saved by packing</h2>{padding_section(r)}"
            f"<h2>Step balance across data-parallel ranks</h2>{step_balance_section(r['rank_imbalance'])}"
            f"<h2>Truncated samples</h2>{truncated_section(r)}"
            f"<h2>Dropped samples</h2>{dropped_section(r)}"
            f"<h2>Top quarantine reasons</h2>{quarantine_section(r)}"
            f"<h2>Resolved config</h2>{config}"
            f"</main></body></html>")
