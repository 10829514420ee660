"""The explorer's circuit view in a real browser (JupyterLab in Debian's Chromium, as tests/test_explorer_browser.py
runs it): the shipped noisy-majority model on test example 0 and its flip, the graph drawn as SVG; clicking the
edge into the logits with the largest score switches it off, and the page then shows the logit difference and the
faithfulness that a plain ``run_with_hooks`` pass and ``discover_circuit``'s empty and full metrics give, computed
here in the test's own process. Every request off the local server is aborted and recorded."""

from __future__ import annotations

import pytest

from tests.test_browser import pixel_std
from tests.test_explorer_browser import jupyter_lab

pytestmark = [pytest.mark.browser, pytest.mark.slow]

CELL = (
    "import interp\n"
    'w = interp.explore("noisy-majority", device="cpu", batch_size=64)\n'
    'w.corruption = "flip"\n'
    'w.compute("circuit")\n'
    "w"
)
GRAPH = ".ix [data-testid=circuit-graph]"


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    yield from jupyter_lab(tmp_path_factory, CELL, f"{GRAPH} g.ix-edge")


def _expected():
    """The head-to-logits edge of largest |EAP score| on test example 0 and its flip, its score, and the logit
    difference and faithfulness with it removed: the corrupted run's head output minus the clean one added to the
    residual stream entering the unembedding, in a plain ``run_with_hooks`` pass."""
    import torch

    import interp
    from interp import analyses

    model, task = interp.load("noisy-majority", device="cpu")
    clean = task.dataset("test").select([0])
    corrupted = analyses.flip_answer(clean, seed=0)
    ref = analyses.discover_circuit(model, clean, corrupted=corrupted, method="eap", top_n=0, curve_points=0)
    names = ref.graph.edge_names
    into_logits = [i for i, n in enumerate(names) if n.endswith("->logits") and n.startswith("L0H")]
    i = max(into_logits, key=lambda j: abs(float(ref.scores[j])))
    head = int(names[i].split("->")[0][3:])
    with torch.inference_mode():
        _, cc = model.run_with_cache(clean.tokens, names_filter="blocks.0.attn.hook_z")
        _, kc = model.run_with_cache(corrupted.tokens, names_filter="blocks.0.attn.hook_z")
        delta = (kc["blocks.0.attn.hook_z"][:, :, head] - cc["blocks.0.attn.hook_z"][:, :, head]) @ model.W_O[0, head]
        logits = model.run_with_hooks(
            clean.tokens, fwd_hooks=[("blocks.0.hook_resid_post", lambda x, hook: x + delta)]
        )[0, int(clean.answer_pos[0])]
    left = float(logits[int(clean.labels[0])] - logits[int(corrupted.labels[0])])
    return {
        "edge": names[i],
        "score": float(ref.scores[i]),
        "n_edges": len(names),
        "full": ref.full,
        "left": left,
        "faithfulness": (left - ref.empty) / (ref.full - ref.empty),
    }


def _number(page, testid: str) -> float:
    return float(page.inner_text(f".ix [data-testid={testid}]"))


def _click_edge(page, edge: str) -> None:
    """A real mouse click on the edge's path, near its sender (where no other edge runs in a one-layer model)."""
    x, y = page.evaluate(
        """(name) => {
          const p = document.querySelector(`.ix g.ix-edge[data-edge="${name}"] path.ix-ehit`);
          const pt = p.getPointAtLength(p.getTotalLength() * 0.06);
          const m = p.getScreenCTM();
          return [pt.x * m.a + pt.y * m.c + m.e, pt.x * m.b + pt.y * m.d + m.f];
        }""",
        edge,
    )
    page.mouse.click(x, y)


def test_clicking_an_edge_switches_it_off_and_the_page_shows_the_toolkits_numbers(lab):
    page, browser, _, shots, blocked, errors = lab
    want = _expected()
    edge = want["edge"]
    assert len(page.query_selector_all(f"{GRAPH} g.ix-edge")) == want["n_edges"]
    assert len(page.query_selector_all(f"{GRAPH} g.ix-cnode")) == 18  # input, 16 heads, logits
    sel = f'{GRAPH} g.ix-edge[data-edge="{edge}"]'
    assert float(page.get_attribute(sel, "data-score")) == pytest.approx(want["score"], rel=1e-6)
    assert _number(page, "circuit-left") == pytest.approx(want["full"], abs=2e-4)
    assert _number(page, "circuit-faithfulness") == pytest.approx(1.0, abs=1e-4)

    _click_edge(page, edge)
    page.wait_for_selector(f"{sel}.ix-edge-off", timeout=60_000)
    page.wait_for_function(
        "document.querySelector('.ix [data-testid=circuit-faithfulness]').textContent !== '1.0000'", timeout=60_000
    )
    assert _number(page, "circuit-left") == pytest.approx(want["left"], abs=2e-4)
    assert _number(page, "circuit-faithfulness") == pytest.approx(want["faithfulness"], abs=1e-4)
    chosen = page.inner_text(".ix [data-testid=circuit-selected]")
    assert edge in chosen and f"{want['score']:+.4f}" in chosen and "off" in chosen
    assert page.inner_text(".ix [data-testid=circuit-prediction]")  # the prediction with the edge off is shown
    page.mouse.move(5, 5)
    png = page.query_selector(".ix [data-testid=circuit]").screenshot(path=str(shots / "circuit.png"))
    assert pixel_std(browser, png) > 10, "the circuit view's screenshot is blank"

    # a node: its edges in the panel; then the edge back on restores the full model
    page.click(f'{GRAPH} g.ix-cnode[data-node="{edge.split("->")[0]}"] rect')
    assert edge.split("->")[0] in page.inner_text(".ix [data-testid=circuit-selected]")
    _click_edge(page, edge)
    page.wait_for_selector(f"{sel}:not(.ix-edge-off)", timeout=60_000)
    page.wait_for_function(
        "document.querySelector('.ix [data-testid=circuit-faithfulness]').textContent === '1.0000'", timeout=60_000
    )
    assert _number(page, "circuit-left") == pytest.approx(want["full"], abs=2e-4)
    print(f"\ncircuit view screenshot: {shots / 'circuit.png'}")
    assert blocked == [], f"the page tried to fetch: {blocked[:5]}"
    assert errors == [], f"page errors: {errors[:5]}"
