"""The explorer's circuit view (``w.compute("circuit")``, ``w.edges_off``, ``w.circuit``): its scores and metrics
equal ``analyses.discover_circuit``'s own on the same input pair, and removing an edge equals a plain
``run_with_hooks`` pass that adds the corrupted sender output minus the clean one to that receiver's input alone.

Models: a one-layer attention-only model with two heads, and a two-layer model with MLPs and LayerNorm, both
randomly initialised on a small noisy-majority task; the page's events are sent as the page sends them.
"""

from __future__ import annotations

import json

import pytest
import torch

import interp
from interp import analyses
from interp.errors import InterpError
from interp.tasks import get_task

SHAPES = {
    "1 head": {"n_layers": 1, "d_model": 4, "n_heads": 1, "d_head": 4},
    "1 layer, 2 heads": {"n_layers": 1, "d_model": 8, "n_heads": 2, "d_head": 4},
    "64 heads, learned W_O": {"n_layers": 1, "d_model": 8, "n_heads": 64, "d_head": 2, "output_matrix": "learned"},
    "2 layers with MLP": {
        "n_layers": 2,
        "d_model": 16,
        "n_heads": 4,
        "d_head": 4,
        "attn_only": False,
        "d_mlp": 32,
        "normalization": "LN",
        "positional": "standard",
        "output_matrix": "learned",
        "attn_bias": True,
    },
}
BATCH = 16
INDEX = 2
ATOL = 1e-5  # float32 runs of the same sums in another order (stacked circuit forward vs plain forward)


@pytest.fixture(scope="module")
def small_task():
    return get_task(
        "noisy-majority",
        train_size=64,
        val_size=32,
        test_size=32,
        train_lengths=[0, 20],
        val_lengths=[21, 30],
        test_lengths=[31, 40],
    )


@pytest.fixture(scope="module", params=list(SHAPES))
def opened(request, small_task):
    """``(widget, model, clean, corrupted)``: the circuit view opened on test example ``INDEX`` and its flip."""
    spec = interp.ModelSpec(**{**small_task.default_spec(), **SHAPES[request.param], "init_seed": 5})
    torch.manual_seed(0)
    model = interp.build_model(spec, device="cpu")
    w = interp.explore(model, small_task, batch_size=BATCH, index=INDEX)
    w.corruption = "flip"
    w.compute("circuit")
    clean = small_task.dataset("test").select([INDEX])
    return w, model, clean, analyses.flip_answer(clean, seed=0)


def send(w, **msg) -> str:
    w._on_msg(w, msg, [])
    return w.status["error"]


def logit_diff(logits, clean, corrupted) -> float:
    return float(logits[int(clean.labels[0])] - logits[int(corrupted.labels[0])])


def test_scores_and_circuit_metrics_equal_discover_circuit(opened):
    w, model, clean, corrupted = opened
    w.edges_off = []
    names = w.circuit.graph.edge_names
    for top_n in (0, 3, len(names) // 2):
        ref = analyses.discover_circuit(model, clean, corrupted=corrupted, method="eap", top_n=top_n, curve_points=0)
        w.edges_off = [n for n, k in zip(names, ref.kept.tolist()) if not k]
        c = w.circuit
        torch.testing.assert_close(c.scores, ref.scores, rtol=0, atol=0)
        assert c.graph.edge_names == ref.graph.edge_names and torch.equal(c.kept, ref.kept)
        assert c.full == ref.full and c.empty == ref.empty
        assert c.circuit == pytest.approx(ref.circuit, abs=ATOL)
        assert c.faithfulness == pytest.approx(ref.faithfulness, abs=1e-4)
        view = w.circuit_view
        assert view["n_off"] == len(names) - top_n and view["left"] == pytest.approx(c.circuit)
        assert sorted(view["edges_off"]) == sorted(w.edges_off)
    w.edges_off = []


def test_no_edge_off_is_the_model_and_every_edge_off_is_the_empty_circuit(opened):
    w, model, clean, corrupted = opened
    w.edges_off = []
    ap = int(clean.answer_pos[0])
    with torch.inference_mode():
        own = model(clean.tokens)[0, ap]
    torch.testing.assert_close(w.circuit_logits, own, rtol=0, atol=ATOL)
    assert w.circuit.circuit == pytest.approx(logit_diff(own, clean, corrupted), abs=ATOL)
    assert w.circuit.faithfulness == pytest.approx(1.0, abs=1e-6)
    assert w.circuit_view["prediction"] == w.circuit_view["full_prediction"]
    assert w.circuit_view["prediction"]["argmax"] == task_token(w, int(own.argmax()))
    w.edges_off = w.circuit.graph.edge_names
    assert w.circuit.circuit == pytest.approx(w.circuit.empty, abs=ATOL) and w.circuit.faithfulness == pytest.approx(
        0.0, abs=1e-4
    )
    # every edge off: every receiver reads the corrupted run's senders, so the logits are the corrupted run's
    with torch.inference_mode():
        corr = model(corrupted.tokens)[0, ap]
    torch.testing.assert_close(w.circuit_logits, corr, rtol=0, atol=1e-4)
    w.edges_off = []


def task_token(w, i: int) -> str:
    return w.task.vocab.tokens[i]


def test_removing_one_edge_equals_a_plain_run_with_hooks(opened):
    """``L{last}H0->logits`` off: the residual stream entering the unembedding gets the corrupted run's head output
    minus the clean one; ``input->L0H{h}.k`` off (h = 1, or 0 on a one-head model): head h's key input in layer 0
    gets the corrupted embedding minus the clean one (TransformerLens' split q/k/v inputs)."""
    w, model, clean, corrupted = opened
    last = model.cfg.n_layers - 1
    ap = int(clean.answer_pos[0])
    names = [f"blocks.{last}.attn.hook_z", "blocks.0.hook_resid_pre"]
    with torch.inference_mode():
        _, cc = model.run_with_cache(clean.tokens, names_filter=names)
        _, kc = model.run_with_cache(corrupted.tokens, names_filter=names)
    w_o = model.W_O[last, 0]
    delta = (kc[names[0]][:, :, 0] - cc[names[0]][:, :, 0]) @ w_o

    def add_head(x, hook):
        return x + delta

    with torch.inference_mode():
        ref = model.run_with_hooks(clean.tokens, fwd_hooks=[(f"blocks.{last}.hook_resid_post", add_head)])[0, ap]
    w.edges_off = [f"L{last}H0->logits"]
    torch.testing.assert_close(w.circuit_logits, ref, rtol=0, atol=ATOL)
    assert w.circuit.circuit == pytest.approx(logit_diff(ref, clean, corrupted), abs=ATOL)

    emb = kc[names[1]] - cc[names[1]]
    h = min(1, model.cfg.n_heads - 1)

    def add_key(x, hook):
        x = x.clone()
        x[:, :, h] += emb
        return x

    model.cfg.use_split_qkv_input = True
    try:
        with torch.inference_mode():
            ref = model.run_with_hooks(clean.tokens, fwd_hooks=[("blocks.0.hook_k_input", add_key)])[0, ap]
    finally:
        model.cfg.use_split_qkv_input = False
    w.edges_off = [f"input->L0H{h}.k"]
    torch.testing.assert_close(w.circuit_logits, ref, rtol=0, atol=ATOL)
    w.edges_off = []


def test_page_events_toggle_edges_and_bad_names_are_one_line(opened):
    w = opened[0]
    w.edges_off = []
    edge = w.circuit.top(1)[0]["edge"]
    assert send(w, type="edge", edge=edge) == "" and w.edges_off == [edge]
    assert w.circuit.circuit == pytest.approx(w.circuit_view["left"])
    assert send(w, type="edge", edge=edge) == "" and w.edges_off == []
    for bad in ("L9H0->logits", None, "nonsense"):
        line = send(w, type="edge", edge=bad)
        assert line and "\n" not in line and w.edges_off == [], line
    assert "no edge 'L9H0->logits'" in send(w, type="edges_off", edges=["L9H0->logits"])
    with pytest.raises(InterpError, match="no edge 'x->y'"):
        w.edges_off = ["x->y"]
    with pytest.raises(InterpError, match="must be a list of edge names"):
        w.edges_off = 3
    assert w.edges_off == []
    assert w.circuit_view["edges"] and all(
        set(e) == {"name", "s", "r", "score", "off"} for e in w.circuit_view["edges"]
    )


def test_the_view_follows_a_new_input_and_needs_a_corruption(opened, small_task):
    w, model = opened[:2]
    edge = w.circuit.top(1)[0]["edge"]
    w.edges_off = [edge]
    w.example = ("test", INDEX + 1)
    new = small_task.dataset("test").select([INDEX + 1])
    ref = analyses.discover_circuit(model, new, corrupted=analyses.flip_answer(new, seed=0), method="eap", top_n=0)
    torch.testing.assert_close(w.circuit.scores, ref.scores, rtol=0, atol=0)
    assert w.edges_off == [edge] and not bool(w.circuit.kept[w.circuit.graph.edge_index(edge)])
    state = w.state().to_dict()
    assert state["circuit"]["edges_off"] == [edge]
    json.dumps(state)
    w.corruption = None
    assert w.circuit is None and "choose a corrupted input" in w.circuit_view["error"]
    assert w.circuit_view["on"] and w.edges_off == [edge]
    w.corruption = "flip"
    w.example = ("test", INDEX)
    w.edges_off = []
    assert w.circuit is not None


def test_the_snippet_reproduces_the_circuit_view(opened):
    """The exported Python gives the scores and the logit difference shown (no edge off, and two off)."""
    w, model = opened[:2]
    for off in ([], [e["edge"] for e in w.circuit.top(2)]):
        w.edges_off = off
        ns: dict = {"model": model}
        exec(w.snippet(), ns)
        torch.testing.assert_close(ns["scores"], w.circuit.scores, rtol=0, atol=0)
        got = float(ns["circuit_metrics"](ns["ctx"], ns["keep"][None])[0])
        assert got == pytest.approx(w.circuit.circuit, abs=ATOL)
    w.edges_off = []


def test_grouped_query_attention_and_a_post_norm_model(small_task):
    """Grouped-query attention: key and value receivers per key/value head (``L1KV0.k``) are nodes of their own;
    the scores and a circuit with edges off equal ``discover_circuit``'s. A post-norm model has no such graph: the
    circuit view says so in one line and the rest of the explorer works."""
    from transformer_lens import HookedTransformer, HookedTransformerConfig

    common = {
        "d_model": 16,
        "n_heads": 4,
        "d_head": 4,
        "n_ctx": small_task.n_ctx,
        "d_vocab": len(small_task.vocab),
        "d_vocab_out": small_task.vocab.n_out,
        "attn_only": True,
        "seed": 0,
        "device": "cpu",
    }
    model = HookedTransformer(HookedTransformerConfig(n_layers=2, n_key_value_heads=2, **common))
    w = interp.explore(model, small_task, batch_size=BATCH, index=INDEX)
    w.corruption = "flip"
    w.edges_off = ["L0H1->L1KV0.k", "input->logits"]
    clean = small_task.dataset("test").select([INDEX])
    ref = analyses.discover_circuit(model, clean, corrupted=analyses.flip_answer(clean, seed=0), method="eap", top_n=0)
    torch.testing.assert_close(w.circuit.scores, ref.scores, rtol=0, atol=0)
    assert {"name": "L1KV0", "layer": 1, "kind": "head"} in w.circuit_view["nodes"]
    assert {"node": "L1KV0", "input": "k"} in w.circuit_view["receivers"]
    keep = torch.ones(ref.graph.n_edges, dtype=torch.bool)
    keep[[ref.graph.edge_index("L0H1->L1KV0.k"), ref.graph.edge_index("input->logits")]] = False
    ctx = analyses.circuit_scores.prepare(model, clean, corrupted=analyses.flip_answer(clean, seed=0))
    assert w.circuit.circuit == pytest.approx(float(analyses.circuit_scores.circuit_metrics(ctx, keep[None])[0]))

    post = HookedTransformer(
        HookedTransformerConfig(n_layers=1, normalization_type="RMS", use_normalization_before_and_after=True, **common)
    )
    w = interp.explore(post, small_task, batch_size=BATCH, index=INDEX)
    w.corruption = "flip"
    w.compute("circuit")
    assert w.circuit is None and "pre-norm" in w.circuit_view["error"] and "\n" not in w.circuit_view["error"]
    assert w.patching is not None and w.status["error"] == ""
