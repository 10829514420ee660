"""The generated reports in a real headless Chromium with the network cut off.

Playwright drives Debian's ``/usr/bin/chromium`` (``playwright install`` cannot download browsers here).
Every request that is not ``file:``/``data:``/``blob:``/``about:`` is aborted and counted as a failure.
Skipped, with the reason, only when no Chromium or no playwright can be found; set
``INTERP_REQUIRE_BROWSER=1`` (as CI does) to turn that skip into a failure.
"""

from __future__ import annotations

import base64
import os
import shutil
from pathlib import Path

import pytest

pytestmark = pytest.mark.browser

LOCAL_SCHEMES = ("file", "data", "blob", "about")
CANDIDATES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")


def find_chromium() -> str | None:
    """``$INTERP_CHROMIUM``, else the first Chromium on PATH or in /usr/bin."""
    env = os.environ.get("INTERP_CHROMIUM")
    if env:
        return env if Path(env).is_file() else None
    for name in CANDIDATES:
        path = shutil.which(name) or (f"/usr/bin/{name}" if Path(f"/usr/bin/{name}").is_file() else None)
        if path:
            return path
    return None


def _unavailable(reason: str):
    if os.environ.get("INTERP_REQUIRE_BROWSER") == "1":
        pytest.fail(f"{reason}, but INTERP_REQUIRE_BROWSER=1 requires the browser test to run")
    pytest.skip(reason)


@pytest.fixture(scope="module")
def browser():
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        _unavailable("the playwright Python package is not installed (pip install playwright)")
    exe = find_chromium()
    if exe is None:
        _unavailable("no Chromium found (apt-get install chromium, or set INTERP_CHROMIUM=/path/to/chrome)")
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=exe, args=["--no-sandbox"], headless=True)
        yield b
        b.close()


def pixel_std(browser, png: bytes) -> float:
    """Standard deviation of the grey levels (0-255) of a PNG, decoded by the browser itself."""
    page = browser.new_page()
    try:
        return page.evaluate(
            """async (src) => {
                const img = new Image(); img.src = src; await img.decode();
                const c = document.createElement('canvas'); c.width = img.width; c.height = img.height;
                const ctx = c.getContext('2d'); ctx.drawImage(img, 0, 0);
                const d = ctx.getImageData(0, 0, c.width, c.height).data;
                let s = 0, s2 = 0, n = d.length / 4;
                for (let i = 0; i < d.length; i += 4) {
                    const g = 0.299 * d[i] + 0.587 * d[i + 1] + 0.114 * d[i + 2]; s += g; s2 += g * g;
                }
                return Math.sqrt(Math.max(s2 / n - (s / n) ** 2, 0));
            }""",
            "data:image/png;base64," + base64.b64encode(png).decode(),
        )
    finally:
        page.close()


def box(element) -> tuple[float, float]:
    b = element.bounding_box()
    return (b["width"], b["height"]) if b else (0.0, 0.0)


# Building and rendering a report in Chromium takes 15-45 s each on 2 cores, so these run with -m slow (CI runs the
# slow set; the reports' sections are checked without a browser in each task's tests).
@pytest.mark.slow
@pytest.mark.parametrize("name", ["noisy-majority", "repeated-tokens", "modular-addition", "integer-addition"])
def test_report_renders_offline_in_chromium(name, browser, shipped_report):
    path, _ = shipped_report(name)
    text = path.read_text(encoding="utf-8")
    n_figures = text.count('class="plotly-graph-div"')
    n_views = text.count('class="cv-view"')
    assert n_views >= 3  # the attention patterns on three examples at least

    context = browser.new_context(viewport={"width": 1400, "height": 1000})
    page = context.new_page()
    blocked, failed, console, errors = [], [], [], []

    def route(r):
        if r.request.url.split(":", 1)[0] in LOCAL_SCHEMES:
            r.continue_()
        else:
            blocked.append(r.request.url)
            r.abort()

    page.route("**/*", route)
    page.on("requestfailed", lambda r: failed.append(f"{r.url}: {r.failure}"))
    page.on("console", lambda m: console.append(f"{m.type}: {m.text}") if m.type == "error" else None)
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.goto(path.resolve().as_uri(), wait_until="load")

    if n_figures:
        page.wait_for_function(
            f"document.querySelectorAll('.js-plotly-plot .main-svg').length >= {n_figures}", timeout=30_000
        )
    page.mouse.move(200, 200)
    page.mouse.move(700, 600)  # headless circuitsvis draws the head thumbnails after the mouse moves
    page.wait_for_function(
        "[...document.querySelectorAll('.cv-view')].every(v => v.querySelectorAll('canvas').length > 0)", timeout=30_000
    )

    plots = page.query_selector_all(".js-plotly-plot")
    assert len(plots) == n_figures
    for el in plots:
        w, h = box(el)
        assert w > 100 and h > 100, f"a plotly figure has size {w}x{h}"
    views = page.query_selector_all(".cv-view")
    assert len(views) == n_views
    for el in views:
        w, h = box(el)
        assert w > 100 and h > 100, f"an attention view has size {w}x{h}"
        assert el.query_selector_all("canvas"), "an attention view drew no canvas"

    assert pixel_std(browser, page.screenshot()) > 10, "the screenshot of the page is blank"
    views[0].scroll_into_view_if_needed()
    assert pixel_std(browser, views[0].screenshot()) > 10, "the first attention view is blank"
    if plots:
        plots[0].scroll_into_view_if_needed()
        assert pixel_std(browser, plots[0].screenshot()) > 5, "the first plotly figure is blank"

    context.close()
    assert blocked == [], f"the page tried to fetch: {blocked[:5]}"
    assert failed == [], f"failed requests: {failed[:5]}"
    assert errors == [], f"page errors: {errors[:5]}"
    assert console == [], f"console errors: {console[:5]}"
