"""The report is a web page: opened in a real browser (Debian's Chromium, driven by
playwright), it renders with no console error, every chart is drawn, and the numbers on the
first screen are report.json's. Skipped, with the reason, where no Chromium is installed
(`apt-get install -y chromium`; .ci/run installs it before `make test`)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

pytestmark = [pytest.mark.browser, pytest.mark.slow]  # starts a browser

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
        "--disable-component-update", "--disable-sync"]
VIEWPORT = {"width": 1280, "height": 800}


@pytest.fixture(scope="module")
def browser():
    if not Path(CHROMIUM).is_file():
        pytest.skip(f"no Chromium at {CHROMIUM}: apt-get install -y chromium (.ci/run does) to run the report in a browser")
    sync_api = pytest.importorskip("playwright.sync_api", reason="playwright (requirements.lock) drives the browser")
    with sync_api.sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)  # the system's browser: nothing downloaded
        yield b
        b.close()


def open_report(browser, path: Path):
    page = browser.new_page(viewport=VIEWPORT)
    problems = []
    page.on("console", lambda m: problems.append(f"console {m.type}: {m.text}") if m.type in ("error", "warning") else None)
    page.on("pageerror", lambda e: problems.append(f"page error: {e}"))
    page.on("request", lambda r: problems.append(f"request {r.url}") if not r.url.startswith("file:") else None)
    page.goto(path.resolve().as_uri())
    page.wait_for_load_state("load")
    return page, problems


def test_report_renders_every_chart_and_the_headline_numbers(browser, sample_build):
    out, _ = sample_build
    r = json.loads((out / "report.json").read_text())
    page, problems = open_report(browser, out / "report.html")
    assert problems == []  # no console error or warning, no failed script, no request leaving the file

    charts = page.query_selector_all("svg[role=img]")
    kinds = r["media"]["tokens_per_item"]
    expected = 4 + bool(any(r["rank_imbalance"]["by_ranks"].values())) + len(kinds) + ("image_sides" in r["media"]) \
        + ("audio_seconds" in r["media"])
    assert len(charts) == expected
    for svg in charts:
        box = svg.bounding_box()
        assert box and box["width"] > 100 and box["height"] > 100, box
        bars = [b for b in svg.query_selector_all("rect") if (b.bounding_box() or {}).get("height", 0) > 0.5]
        assert bars, svg.inner_html()[:300]  # a chart with something drawn in it
    titles = page.inner_text("main")
    for kind in kinds:
        assert f"Placeholder tokens per {kind}" in titles
    assert "Image size: longest side (px)" in titles and "Clip duration (s)" in titles

    shown = {c.get_attribute("data-key"): c for c in page.query_selector_all(".card")}
    over = r["oversize"]
    want = {
        "fill": f"{100 * r['fill']:.2f}%",
        "trained_share": f"{100 * r['trained_tokens'] / r['tokens']:.1f}%",
        "rows": f"{r['rows']:,}",
        "speedup": f"{r['batching']['padded_random']['computed'] / (r['rows'] * r['max_length']):.2f}x",
        "attention": f"{100 * r['attention']['block_diagonal'] / r['attention']['dense']:.1f}%",
        "truncated": f"{over['truncated_samples']:,}",
        "audio_truncated": f"{over['audio_truncated']:,}",
    }
    for key, value in want.items():
        assert shown[key].query_selector(".v").inner_text() == value, key
        assert shown[key].is_visible()
    first_screen = shown["trained_share"].bounding_box()
    assert first_screen["y"] + first_screen["height"] <= VIEWPORT["height"]  # on the first screen
    assert f"{r['truncated']['tokens_cut']:,} tokens cut" in shown["truncated"].inner_text()

    trained = page.query_selector_all(".seg .x .t")
    assert trained and all(t.is_visible() for t in trained[:3])
    colour = trained[0].evaluate("e => getComputedStyle(e).backgroundColor")
    plain = page.query_selector(".seg .x .u").evaluate("e => getComputedStyle(e).backgroundColor")
    assert colour != plain  # trained tokens stand out
    segments = page.query_selector_all(".seg")
    assert len(segments) == len(r["sample_row"]["shown"])
    media = page.query_selector_all(".seg .x .m")
    marks = [p for s in r["sample_row"]["shown"] for p in s["pieces"] if "media" in p]
    assert [m.inner_text() for m in media] == [f"[{p['media']} x{p['count']:,}]" for p in marks]
    page.close()
