"""The explorer in a real browser: a headless Jupyter server on localhost (a free port, token auth, the kernel's
``PYTHONPATH`` pointing at this checkout), JupyterLab opened in Debian's Chromium by playwright, a notebook cell
running ``interp.explore("noisy-majority")``; a head is switched off by clicking its switch and the accuracy read
from the page must equal the toolkit's own number. The notebook, saved by JupyterLab with its output, is then
converted by nbconvert and opened offline: the static snapshot shows where no kernel runs.

Every request that does not go to the local server is aborted and recorded (nothing may be fetched from a CDN).
Screenshots stay in the test's temporary directory (the path is printed); with ``INTERP_DOCS_SCREENSHOT=1`` the
page's screenshot also replaces ``docs/explorer.png``. Skipped, saying why, without Chromium, playwright or
JupyterLab; ``INTERP_REQUIRE_BROWSER=1`` (CI) turns the skip into a failure.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from tests.test_browser import find_chromium, pixel_std

pytestmark = pytest.mark.browser

ROOT = Path(__file__).resolve().parents[1]
BATCH = 256  # the explorer's default accuracy batch
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
CELL = 'import interp\nw = interp.explore("noisy-majority", device="cpu")\nw'


def _unavailable(reason: str):
    if os.environ.get("INTERP_REQUIRE_BROWSER") == "1":
        pytest.fail(f"{reason}, but INTERP_REQUIRE_BROWSER=1 requires the browser test to run")
    pytest.skip(reason)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _expected_click():
    """The head whose switching off lowers the learned accuracy most, and that accuracy: the toolkit's numbers,
    computed here, in the test's own process."""
    import interp
    from interp import analyses

    model, task = interp.load("noisy-majority", device="cpu")
    batch = task.dataset("test").select(slice(0, BATCH))
    heads = [(0, h) for h in range(model.cfg.n_heads)]
    without = analyses.learned_accuracy(model, batch, heads=[[x for x in heads if x != h] for h in heads])
    i = int(without.accuracy.argmin())
    full = analyses.learned_accuracy_of(model, batch, heads=heads)
    return interp.head_label(*heads[i]), float(without.accuracy[i]), full


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    """A JupyterLab page with the explorer running in a notebook: ``(page, browser, notebook path, shots dir,
    blocked requests, page errors)``."""
    yield from jupyter_lab(tmp_path_factory, CELL, ".ix [data-testid=accuracy][data-n]")


def jupyter_lab(tmp_path_factory, cell: str, ready: str):
    """A headless JupyterLab running the notebook cell ``cell`` until the selector ``ready`` shows in its output;
    yields ``(page, browser, notebook path, shots dir, blocked requests, page errors)`` (the ``lab`` fixture's)."""
    try:
        from playwright.sync_api import TimeoutError as PlaywrightTimeout
        from playwright.sync_api import sync_playwright
    except ImportError:
        _unavailable("the playwright Python package is not installed (pip install playwright)")
    exe = find_chromium()
    if exe is None:
        _unavailable("no Chromium found (apt-get install chromium, or set INTERP_CHROMIUM=/path/to/chrome)")
    jupyter = Path(sys.executable).parent / "jupyter"
    try:
        import jupyterlab  # noqa: F401
        import nbformat
    except ImportError:
        _unavailable("JupyterLab is not installed (pip install -e '.[test]')")
    if not jupyter.exists():
        _unavailable(f"no jupyter command beside {sys.executable}")

    tmp = tmp_path_factory.mktemp("explorer-lab")
    work, shots = tmp / "notebooks", tmp / "shots"
    work.mkdir()
    shots.mkdir()
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(cell)]
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nbformat.write(nb, work / "explore.ipynb")
    settings = tmp / "settings" / "@jupyterlab" / "apputils-extension"
    settings.mkdir(parents=True)  # no news, no update check: the page asks nothing of the internet
    (settings / "notification.jupyterlab-settings").write_text(
        json.dumps({"fetchNews": "false", "checkForUpdates": False})
    )
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "JUPYTER_CONFIG_DIR": str(tmp / "config"),
        "JUPYTER_RUNTIME_DIR": str(tmp / "runtime"),
        "JUPYTERLAB_SETTINGS_DIR": str(tmp / "settings"),
        "JUPYTERLAB_WORKSPACES_DIR": str(tmp / "workspaces"),
        "IPYTHONDIR": str(tmp / "ipython"),
        "OMP_NUM_THREADS": "1",
        "MKL_NUM_THREADS": "1",
    }
    port, token = _free_port(), secrets.token_hex(16)
    base = f"http://127.0.0.1:{port}"
    log = open(tmp / "server.log", "w")  # noqa: SIM115 - closed at teardown
    server = subprocess.Popen(
        [
            str(jupyter),
            "lab",
            "--no-browser",
            "--ServerApp.ip=127.0.0.1",
            f"--ServerApp.port={port}",
            "--ServerApp.port_retries=0",
            f"--IdentityProvider.token={token}",
            f"--ServerApp.root_dir={work}",
            "--allow-root",
        ],
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    try:
        for _ in range(240):
            try:
                urllib.request.urlopen(f"{base}/api/status?token={token}", timeout=1)
                break
            except OSError:
                if server.poll() is not None:
                    pytest.fail(f"the Jupyter server exited: {(tmp / 'server.log').read_text()[-2000:]}")
                time.sleep(0.25)
        else:
            pytest.fail("the Jupyter server did not answer within 60 s")
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=exe, args=CHROMIUM_ARGS, headless=True)
            page = browser.new_page(viewport={"width": 1400, "height": 2200})
            blocked, errors = [], []

            def route(r):
                url = r.request.url
                if url.startswith(base) or url.split(":", 1)[0] in ("data", "blob", "about"):
                    r.continue_()
                else:
                    blocked.append(url)
                    r.abort()

            page.route("**/*", route)
            page.on("pageerror", lambda e: errors.append(str(e)))
            page.goto(f"{base}/lab/tree/explore.ipynb?token={token}")
            page.wait_for_selector(".jp-Notebook .jp-Cell .cm-content", timeout=90_000)
            page.wait_for_function("document.body.innerText.includes('| Idle')", timeout=90_000)
            for _ in range(3):  # the first keystrokes can land before the kernel's connection is up: try again
                page.click(".jp-Notebook .jp-Cell .cm-content")
                page.keyboard.press("Control+Enter")
                try:
                    page.wait_for_function(
                        "/\\[(\\*|\\d+)\\]/.test(document.querySelector('.jp-Cell .jp-InputArea-prompt').textContent)",
                        timeout=15_000,
                    )
                    break
                except PlaywrightTimeout:  # the cell did not start: press again
                    print("the cell did not start; running it again")
            page.wait_for_selector(ready, timeout=180_000)
            yield page, browser, work / "explore.ipynb", shots, blocked, errors
            browser.close()
    finally:
        try:
            req = urllib.request.Request(f"{base}/api/shutdown?token={token}", method="POST")
            urllib.request.urlopen(req, timeout=5)
        except OSError:
            pass
        try:
            server.wait(timeout=20)
        except subprocess.TimeoutExpired:
            server.terminate()
            server.wait(timeout=10)
        log.close()


def _accuracy(page) -> dict:
    el = page.query_selector(".ix [data-testid=accuracy]")
    return {
        "ablated": el.get_attribute("data-ablated"),
        "correct": int(el.get_attribute("data-correct")),
        "n": int(el.get_attribute("data-n")),
        "text": el.query_selector(".ix-accval").inner_text(),
    }


def _roundtrip(page, seq_before: str) -> float:
    page.wait_for_function(
        f"(() => {{ const r = document.querySelector('.ix'); return r.dataset.seq !== '{seq_before}'"
        " && r.dataset.roundtripMs !== undefined && !r.classList.contains('ix-busy'); })()",
        timeout=60_000,
    )
    return float(page.get_attribute(".ix", "data-roundtrip-ms"))


@pytest.mark.slow
def test_switching_a_head_off_by_clicking_updates_the_accuracy(lab):
    page, browser, _, shots, blocked, errors = lab
    head, expected, full = _expected_click()
    before = _accuracy(page)
    assert before["ablated"] == "" and before["n"] == BATCH and before["correct"] == round(full * BATCH)
    assert before["text"] == f"{full:.4f}"
    seq = page.get_attribute(".ix", "data-seq")
    page.click(f".ix .ix-toggle[data-head={head}]")
    page.wait_for_selector(f".ix [data-testid=accuracy][data-ablated={head}]", timeout=60_000)
    ms = _roundtrip(page, seq)
    after = _accuracy(page)
    assert after["correct"] == round(expected * BATCH) and after["n"] == BATCH
    assert after["text"] == f"{expected:.4f}", (head, after, expected)
    assert expected < full  # the click changed the number, and the page shows the toolkit's
    assert page.get_attribute(f".ix .ix-thumb[data-head={head}]", "class").count("ix-off") == 1
    page.screenshot(path=str(shots / "after-click.png"))

    # hover a pattern: query, key and weight
    canvas = page.query_selector(".ix .ix-thumb[data-head=L0H0] canvas")
    box = canvas.bounding_box()
    page.mouse.move(box["x"] + box["width"] * 0.2, box["y"] + box["height"] * 0.9)
    assert "weight" in page.inner_text(".ix [data-testid=hover]")

    # click-to-update times: switch heads off and on again, each click timed in the page until its view is drawn
    times = [ms]
    for h in ["L0H3", "L0H3", "L0H11", "L0H11", "L0H5", "L0H5"]:
        seq = page.get_attribute(".ix", "data-seq")
        page.click(f".ix .ix-toggle[data-head={h}]")
        times.append(_roundtrip(page, seq))
    assert _accuracy(page)["ablated"] == head

    # a bad typed token: one line in the widget, no traceback anywhere in the output area, nothing changed
    typed = page.query_selector_all(".ix .ix-typed")[0]
    typed.fill("0 1 x")
    seq = page.get_attribute(".ix", "data-seq")
    page.click(".ix button.ix-btn:text-is('use typed')")
    _roundtrip(page, seq)
    line = page.inner_text(".ix [data-testid=error]")
    assert "unknown token 'x'" in line and "\n" not in line.strip(), line
    outputs = page.inner_text(".jp-Notebook .jp-Cell .jp-OutputArea")
    assert "Traceback" not in outputs and not page.query_selector(".jp-OutputArea-output[data-mime-type*=stderr]")
    assert _accuracy(page)["ablated"] == head
    typed.fill("")

    # the head panel, the patching
    page.click(f".ix .ix-thumb[data-head={head}] canvas")
    page.wait_for_selector(".ix .ix-panel .ix-circ .ix-ctable td", timeout=60_000)
    page.select_option(".ix .ix-corruption", "flip")
    page.wait_for_selector(".ix .ix-patch .ix-hgrid", timeout=60_000)
    page.mouse.move(10, 10)
    widget = page.query_selector(".ix")
    widget.scroll_into_view_if_needed()
    png = widget.screenshot(path=str(shots / "explorer.png"))
    assert pixel_std(browser, png) > 10, "the explorer's screenshot is blank"
    if os.environ.get("INTERP_DOCS_SCREENSHOT") == "1":
        (ROOT / "docs").mkdir(exist_ok=True)
        shutil.copyfile(shots / "explorer.png", ROOT / "docs" / "explorer.png")
    (shots / "click-times.json").write_text(json.dumps({"ms": times}))
    print(f"\nexplorer screenshots in {shots}; click-to-update in the page (ms): {[round(t) for t in times]}")
    assert blocked == [], f"the page tried to fetch: {blocked[:5]}"
    assert errors == [], f"page errors: {errors[:5]}"


@pytest.mark.slow
def test_a_saved_notebook_shows_the_static_snapshot_offline(lab):
    """JupyterLab saves the notebook with the widget's output; nbconvert's HTML of it, opened with the network off,
    shows the snapshot (input, prediction, accuracy, every head's pattern), not a broken widget."""
    import nbformat
    from nbconvert import HTMLExporter

    page, browser, path, shots, _, _ = lab
    page.click(".jp-Notebook .jp-Cell .cm-content")
    page.keyboard.press("Control+s")
    for _ in range(150):  # until the file on disk holds the output
        nb = nbformat.read(path, as_version=4)
        if nb.cells[0].outputs:
            break
        page.wait_for_timeout(200)  # not time.sleep: playwright must keep serving the page's routed requests
    else:
        page.screenshot(path=str(shots / "save-failed.png"))
        pytest.fail(f"JupyterLab did not save the output (screenshot: {shots / 'save-failed.png'})")
    data = nb.cells[0].outputs[0]["data"]
    assert "application/vnd.jupyter.widget-view+json" in data and "Static snapshot" in data["text/html"]
    html, _ = HTMLExporter().from_notebook_node(nb)
    out = shots / "explore.html"
    out.write_text(html, encoding="utf-8")

    context = browser.new_context(viewport={"width": 1200, "height": 1600}, offline=True)
    view = context.new_page()
    errors = []
    view.on("pageerror", lambda e: errors.append(str(e)))
    view.goto(out.as_uri(), wait_until="load")
    snap = view.wait_for_selector(".interp-explorer-snapshot", timeout=30_000)
    imgs = snap.query_selector_all("img")
    assert len(imgs) == 16
    assert view.evaluate(
        "[...document.querySelectorAll('.interp-explorer-snapshot img')].every(i => i.naturalWidth > 0)"
    )
    assert "1.0000" in snap.inner_text() or "0." in snap.inner_text()
    assert "Static snapshot" in snap.inner_text()
    png = snap.screenshot(path=str(shots / "snapshot.png"))
    assert pixel_std(browser, png) > 10
    context.close()
    assert errors == [], errors
