"""Circuit discovery against computations written here: per-edge patching against one ``run_with_hooks`` per edge,
EAP against a per-edge gradient x difference taken by hand, EAP-IG with one step against EAP, circuit runs against a
forward that patches every removed edge by hand; shapes: 1 head, 64 heads with a trained W_O, 2 layers with MLP and
LayerNorm, grouped-query attention, an attention variant; the result's round trip.

Tolerances: 1e-4 absolute + relative on metrics of order 1 (float32; the batched runs differ from the loops only by
summation order: the stacked edges start at their receiver's layer from the cached residual stream).
"""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch
from transformer_lens import HookedTransformer, HookedTransformerConfig

from interp.analyses.circuit_discovery import Circuit, discover_circuit, edge_roc_auc
from interp.analyses.circuit_graph import computational_graph
from interp.analyses.circuit_scores import circuit_metrics, edge_attribution, edge_patching, prepare
from interp.errors import ConfigError, InterpError, TaskError
from interp.task import IGNORE, TaskData

ATOL = RTOL = 1e-4
V, T, B = 7, 6, 3


def make_model(n_layers, n_heads, attn_only=True, normalization=None, seed=0, n_kv=None, d_head=4):
    cfg = HookedTransformerConfig(
        n_layers=n_layers,
        d_model=16,
        n_heads=n_heads,
        d_head=d_head,
        d_mlp=None if attn_only else 32,
        d_vocab=V,
        n_ctx=T,
        attn_only=attn_only,
        normalization_type=normalization,
        seed=seed,
        device="cpu",
        act_fn="relu",
        n_key_value_heads=n_kv,
    )
    model = HookedTransformer(cfg)
    with torch.no_grad():  # biases start at 0 in TransformerLens; give them values so they are exercised
        for name, p in model.named_parameters():
            if name.split(".")[-1].startswith("b_"):
                p.normal_(0, 0.1)
    return model.eval()


MODELS = {
    "1L1H": dict(n_layers=1, n_heads=1),
    "2L2H-mlp-ln": dict(n_layers=2, n_heads=2, attn_only=False, normalization="LN"),
    "2L4H-gqa": dict(n_layers=2, n_heads=4, n_kv=2, normalization="RMS"),
}


def pair(seed=0, b=B):
    gen = torch.Generator().manual_seed(seed)
    clean = torch.randint(0, V, (b, T), generator=gen)
    corrupted = clean.clone()
    corrupted[:, 1] = (clean[:, 1] + 1) % V
    corrupted[:, 3] = (clean[:, 3] + 2) % V
    answer_pos = torch.tensor([T - 1, T - 2, T - 1][:b] + [T - 1] * max(0, b - 3))
    labels, wrong = torch.arange(b) % V, (torch.arange(b) + 3) % V

    def data(tokens, lab):
        return TaskData("toy", tokens, torch.full_like(tokens, IGNORE), answer_pos, lab, torch.full((b,), T))

    return data(clean, labels), data(corrupted, wrong)


def logit_diff(logits, clean, corrupted):
    b = torch.arange(len(clean))
    at = logits[b, clean.answer_pos]
    return (at[b, clean.labels] - at[b, corrupted.labels]).mean()


# -- a plain reimplementation: one run_with_hooks per edge ---------------------------------------------------------


def sender_out(model, cache, name):
    """A sender's output, read off a cache as written here (not the module's helper)."""
    if name == "input":
        return cache["blocks.0.hook_resid_pre"]
    if name.startswith("MLP"):
        return cache[f"blocks.{int(name[3:])}.hook_mlp_out"]
    l, h = (int(x) for x in name[1:].split("H"))
    return cache[f"blocks.{l}.attn.hook_z"][:, :, h] @ model.W_O[l, h]


def receiver_hook(model, name):
    """``(hook name, slot)`` of a receiver named ``L1H0.q`` / ``L1KV0.k`` / ``MLP1`` / ``logits``."""
    if name == "logits":
        return f"blocks.{model.cfg.n_layers - 1}.hook_resid_post", None
    if name.startswith("MLP"):
        return f"blocks.{int(name[3:])}.hook_mlp_in", None
    node, letter = name.split(".")
    l, h = node[1:].replace("KV", "H").split("H")
    return f"blocks.{int(l)}.hook_{letter}_input", int(h)


def patch_one_edge_loop(model, clean, corrupted, edge):
    """M(edge patched) - M(clean) with one run_with_hooks: the receiver's input gets corrupted minus clean output."""
    s, r = edge.split("->")
    _, c_cache = model.run_with_cache(clean.tokens)
    _, k_cache = model.run_with_cache(corrupted.tokens)
    delta = sender_out(model, k_cache, s) - sender_out(model, c_cache, s)
    hook_name, slot = receiver_hook(model, r)

    def hook(x, hook):
        x = x.clone()
        if slot is None:
            x += delta
        else:
            x[:, :, slot] += delta
        return x

    model.cfg.use_split_qkv_input = True
    if not model.cfg.attn_only:
        model.cfg.use_hook_mlp_in = True
    try:
        with torch.no_grad():
            logits = model.run_with_hooks(clean.tokens, fwd_hooks=[(hook_name, hook)])
    finally:
        model.cfg.use_split_qkv_input = model.cfg.use_hook_mlp_in = False
    return (logit_diff(logits, clean, corrupted) - logit_diff(model(clean.tokens), clean, corrupted)).item()


def eap_by_hand(model, clean, corrupted, edge):
    """(corrupted - clean output of the sender) . d logit_diff / d (receiver input), summed over batch and position."""
    s, r = edge.split("->")
    _, c_cache = model.run_with_cache(clean.tokens)
    _, k_cache = model.run_with_cache(corrupted.tokens)
    delta = sender_out(model, k_cache, s) - sender_out(model, c_cache, s)
    hook_name, slot = receiver_hook(model, r)
    grabbed = {}

    def hook(x, hook):
        x.retain_grad()
        grabbed["x"] = x
        return x

    model.cfg.use_split_qkv_input = True
    if not model.cfg.attn_only:
        model.cfg.use_hook_mlp_in = True
    try:
        with torch.enable_grad():
            logits = model.run_with_hooks(clean.tokens, fwd_hooks=[(hook_name, hook)])
            logit_diff(logits, clean, corrupted).backward()
    finally:
        model.cfg.use_split_qkv_input = model.cfg.use_hook_mlp_in = False
        model.zero_grad(set_to_none=True)
    g = grabbed["x"].grad
    g = g if slot is None else g[:, :, slot]
    return (g * delta).sum().item()


@pytest.mark.parametrize("name", list(MODELS))
def test_edge_patching_equals_a_loop_of_run_with_hooks(name):
    model = make_model(**MODELS[name])
    clean, corr = pair()
    ctx = prepare(model, clean, corrupted=corr, metric="logit_diff", batch_size=5)  # chunks cut through layers
    got = edge_patching(ctx)
    names = ctx.graph.edge_names
    for e in range(0, len(names), max(1, len(names) // 12)):  # a spread of edges of every kind
        want = patch_one_edge_loop(model, clean, corr, names[e])
        assert got[e].item() == pytest.approx(want, abs=ATOL, rel=RTOL), names[e]
    assert not model.cfg.use_split_qkv_input  # the flags are restored


@pytest.mark.parametrize("name", list(MODELS))
def test_eap_equals_gradient_times_difference_by_hand(name):
    model = make_model(**MODELS[name])
    clean, corr = pair(1)
    ctx = prepare(model, clean, corrupted=corr, metric="logit_diff", batch_size=2)  # two example chunks
    got = edge_attribution(ctx, 1)
    names = ctx.graph.edge_names
    for e in range(0, len(names), max(1, len(names) // 12)):
        assert got[e].item() == pytest.approx(eap_by_hand(model, clean, corr, names[e]), abs=ATOL, rel=RTOL)


def test_eap_ig_with_one_step_is_eap_and_more_steps_differ():
    model = make_model(**MODELS["2L2H-mlp-ln"])
    clean, corr = pair(2)
    eap = discover_circuit(model, clean, corrupted=corr, method="eap", curve_points=0, top_n=3)
    ig1 = discover_circuit(model, clean, corrupted=corr, method="eap-ig", steps=1, curve_points=0, top_n=3)
    ig8 = discover_circuit(model, clean, corrupted=corr, method="eap-ig", steps=8, curve_points=0, top_n=3)
    torch.testing.assert_close(ig1.scores, eap.scores, atol=1e-6, rtol=1e-6)
    assert not torch.allclose(ig8.scores, eap.scores, atol=1e-4)  # a nonlinear model: the path integral differs


def test_eap_is_exact_on_a_linear_path():
    """Edges into the logits of an attention-only model without LayerNorm: the logit difference is linear in the
    residual stream, so EAP's first-order estimate equals exact patching there."""
    model = make_model(2, 3)
    clean, corr = pair(3)
    ctx = prepare(model, clean, corrupted=corr)
    exact, eap = edge_patching(ctx), edge_attribution(ctx, 1)
    into_logits = [i for i, n in enumerate(ctx.graph.edge_names) if n.endswith("->logits")]
    torch.testing.assert_close(eap[into_logits], exact[into_logits], atol=ATOL, rtol=RTOL)


def masked_forward_by_hand(model, clean, corrupted, graph, keep):
    """Every removed edge patched in one forward written here: each receiver's input gets, for each removed edge,
    the sender's corrupted output minus its output in this run (read from this run's own hooks)."""
    _, k_cache = model.run_with_cache(corrupted.tokens)
    here = {}
    removed = [graph.edge_names[e] for e in range(graph.n_edges) if not keep[e]]

    def record(name):
        def hook(x, hook):
            here[name] = x
            return x

        return hook

    def receive(rname):
        _hook_name, slot = receiver_hook(model, rname)

        def hook(x, hook):
            x = x.clone()
            for e in removed:
                s, r = e.split("->")
                if r != rname:
                    continue
                cache = {"blocks.0.hook_resid_pre": here["input"]} if s == "input" else here
                cur = sender_out(model, cache, s) if s == "input" else sender_out_live(model, here, s)
                d = sender_out(model, k_cache, s) - cur
                if slot is None:
                    x += d
                else:
                    x[:, :, slot] += d
            return x

        return hook

    hooks = [("blocks.0.hook_resid_pre", record("input"))]
    for l in range(model.cfg.n_layers):
        hooks.append((f"blocks.{l}.attn.hook_z", record(f"z{l}")))
        if not model.cfg.attn_only:
            hooks.append((f"blocks.{l}.hook_mlp_out", record(f"mlp{l}")))
    for rname in graph.receivers:
        hooks.append((receiver_hook(model, rname)[0], receive(rname)))
    model.cfg.use_split_qkv_input = True
    if not model.cfg.attn_only:
        model.cfg.use_hook_mlp_in = True
    try:
        logits = model.run_with_hooks(clean.tokens, fwd_hooks=hooks)
    finally:
        model.cfg.use_split_qkv_input = model.cfg.use_hook_mlp_in = False
    return logit_diff(logits, clean, corrupted).item()


def sender_out_live(model, here, s):
    if s.startswith("MLP"):
        return here[f"mlp{int(s[3:])}"]
    l, h = (int(x) for x in s[1:].split("H"))
    return here[f"z{l}"][:, :, h] @ model.W_O[l, h]


@pytest.mark.parametrize("name", list(MODELS))
def test_circuit_runs_equal_a_forward_patched_by_hand(name):
    model = make_model(**MODELS[name])
    clean, corr = pair(4)
    ctx = prepare(model, clean, corrupted=corr, batch_size=4)
    gen = torch.Generator().manual_seed(0)
    keep = torch.rand(5, ctx.graph.n_edges, generator=gen) < 0.5
    keep[0] = True  # the full model
    keep[1] = False  # the empty circuit: the corrupted run
    got = circuit_metrics(ctx, keep)
    for i in range(len(keep)):
        want = masked_forward_by_hand(model, clean, corr, ctx.graph, keep[i])
        assert got[i].item() == pytest.approx(want, abs=ATOL, rel=RTOL)
    assert got[0].item() == pytest.approx(ctx.full, abs=ATOL)
    assert got[1].item() == pytest.approx(float(logit_diff(model(corr.tokens), clean, corr)), abs=ATOL, rel=RTOL)


def test_graph_shapes_and_gqa_receivers():
    g = computational_graph(make_model(**MODELS["2L4H-gqa"]))
    assert g.senders == ["input"] + [f"L{l}H{h}" for l in range(2) for h in range(4)]
    assert "L1KV1.k" in g.receivers and "L1H1.k" not in g.receivers and "L1H3.q" in g.receivers
    # input feeds 2 x (4 q + 2 k + 2 v) receivers and the logits; layer-0 heads feed layer 1's 8 and the logits
    assert g.n_edges == 17 + 4 * 9 + 4 * 1
    mlp = computational_graph(make_model(**MODELS["2L2H-mlp-ln"]))
    assert "L0H1->MLP0" in mlp.edge_names and "MLP0->L0H0.q" not in mlp.edge_names
    assert "MLP0->L1H0.k" in mlp.edge_names and "MLP1->logits" in mlp.edge_names


def test_sixty_four_heads_with_a_trained_w_o():
    """64 heads, W_O trained for a few steps so heads differ: patching and EAP agree on the edges into the logits
    (linear there) and the top circuit is faithful by construction at full size."""
    torch.manual_seed(0)
    model = make_model(1, 64, d_head=2)
    opt = torch.optim.SGD([model.blocks[0].attn.W_O], lr=0.5)
    clean, corr = pair(5, b=4)
    for _ in range(5):
        opt.zero_grad()
        torch.nn.functional.cross_entropy(
            model(clean.tokens)[torch.arange(4), clean.answer_pos], clean.labels
        ).backward()
        opt.step()
    model.zero_grad(set_to_none=True)
    ctx = prepare(model, clean, corrupted=corr, batch_size=64)
    exact, eap = edge_patching(ctx), edge_attribution(ctx, 1)
    assert ctx.graph.n_edges == 1 + 64 * 3 + 64
    into_logits = [i for i, n in enumerate(ctx.graph.edge_names) if n.endswith("->logits")]
    torch.testing.assert_close(eap[into_logits], exact[into_logits], atol=ATOL, rtol=RTOL)
    c = discover_circuit(model, clean, corrupted=corr, method="eap", top_n=ctx.graph.n_edges, curve_points=0)
    assert c.faithfulness == pytest.approx(1.0, abs=1e-5)


def test_attention_variant_has_qkv_receivers_and_exact_patching():
    from interp.model import ModelSpec, build_model

    spec = ModelSpec(n_layers=2, d_model=8, n_heads=2, d_head=4, d_vocab=V, n_ctx=T, attention="linear:elu")
    model = build_model(spec, device="cpu").eval()
    clean, corr = pair(6)
    ctx = prepare(model, clean, corrupted=corr)
    got = edge_patching(ctx)
    for e in (ctx.graph.edge_index("L0H1->L1H0.k"), ctx.graph.edge_index("input->L1H1.q")):
        want = patch_one_edge_loop(model, clean, corr, ctx.graph.edge_names[e])
        assert got[e].item() == pytest.approx(want, abs=ATOL, rel=RTOL)


def test_acdc_keeps_what_matters_and_is_faithful():
    model = make_model(**MODELS["2L2H-mlp-ln"])
    clean, corr = pair(7)
    exact = discover_circuit(model, clean, corrupted=corr, method="acdc", tau=0.0, curve_points=0)
    assert exact.faithfulness == pytest.approx(1.0, abs=1e-4)  # tau = 0: the distance to the full metric never grows
    c = discover_circuit(model, clean, corrupted=corr, method="acdc", tau=0.05, curve_points=0)
    # ACDC's rule, edge by edge: removed iff removing it changed the distance to the full metric by less than tau
    assert bool((c.scores[~c.kept] < 0.05).all()) and bool((c.scores[c.kept] >= 0.05).all())
    assert 0 < c.size < c.graph.n_edges
    assert abs(c.circuit - c.full) < 0.05 * c.graph.n_edges  # each removal moved it by less than tau
    loose = discover_circuit(model, clean, corrupted=corr, method="acdc", tau=1e6, curve_points=0)
    assert loose.size == 0


def test_zero_and_mean_ablation_and_callable_metric():
    model = make_model(**MODELS["1L1H"])
    clean, corr = pair(8)
    for ablation in ("zero", "mean"):
        c = discover_circuit(model, clean, ablation=ablation, method="patching", top_n=2)
        assert c.ablation == ablation and c.metric == "logit_diff_margin" and c.size == 2

    def ld(logits):
        return logit_diff(logits, clean, corr)

    a = discover_circuit(model, clean.tokens, corrupted=corr.tokens, metric=ld, method="patching", top_n=2)
    b = discover_circuit(model, clean, corrupted=corr, metric="logit_diff", method="patching", top_n=2)
    torch.testing.assert_close(a.scores, b.scores, atol=ATOL, rtol=RTOL)


def test_round_trip_text_figure_and_auc():
    model = make_model(**MODELS["2L2H-mlp-ln"])
    clean, corr = pair(9)
    c = discover_circuit(model, clean, corrupted=corr, method="eap", curve_points=6, top_n=3)
    d = c.to_dict()
    assert Circuit.from_dict(d).to_dict() == d
    assert "faithfulness" in c.text() and c.figure() is not None and c.curve_figure() is not None
    assert c.curve[0][0] == 0 and c.curve[-1] == (c.graph.n_edges, pytest.approx(1.0, abs=1e-5))
    top = c.top(1)[0]["edge"]
    assert edge_roc_auc(c, [top]) == 1.0
    # ablating every edge barely moves the metric: faithfulness is undefined, not a ratio of two near-zero numbers
    flat = dataclasses.replace(c, full=2.0, empty=2.0 + 1e-4, circuit=2.0)
    assert math.isnan(flat.faithfulness) and "faithfulness undefined" in flat.text()


def test_bad_arguments_are_one_clear_error():
    model = make_model(**MODELS["1L1H"])
    clean, corr = pair()
    with pytest.raises(ConfigError, match="unknown method"):
        discover_circuit(model, clean, corrupted=corr, method="magic")
    with pytest.raises(TaskError, match="corrupted run"):
        discover_circuit(model, clean, ablation="patch")
    with pytest.raises(ConfigError, match="does not use corrupted"):
        discover_circuit(model, clean, corrupted=corr, ablation="zero")
    with pytest.raises(ConfigError, match="tau"):
        discover_circuit(model, clean, corrupted=corr, method="eap", tau=0.1)
    with pytest.raises(ConfigError, match="steps"):
        discover_circuit(model, clean, corrupted=corr, method="eap-ig", steps=0)
    with pytest.raises(InterpError, match="no edge"):
        computational_graph(model).edge_index("L9H9->logits")
