"""Coalition values and Shapley values of heads (analyses.coalitions, analyses.shapley, analyses.batched_svc).

Independent references: the textbook formulas as plain loops over subsets (n <= 8), shapiq's ExactComputer
(n <= 6), direct logit attribution from TransformerLens' own cache, learned_accuracy / learned_accuracy_loop of
analyses.learned_accuracies (one run_with_hooks per subset), and scikit-learn's LinearSVC. Tolerances: transforms 1e-12
(float64 sums in another order); accuracies 1e-6 (float32 means of 0/1 values); logit values 1e-5 (float32
logits summed in another order); separation: within one test sequence.
"""

from __future__ import annotations

import json
import math
import re
from itertools import combinations

import numpy as np
import pytest
import torch

from interp.analyses.coalitions import coalition_evaluator, coalition_values
from interp.analyses.learned_accuracies import learned_accuracy
from interp.analyses.reference import learned_accuracy_loop
from interp.analyses.shapley import moebius, shapley_transform, shapley_values, zeta
from interp.errors import InterpError
from interp.model import ModelSpec, build_model


def tiny(task, n_heads=4, n_layers=1, seed=0, d_model=8, d_head=2):
    spec = ModelSpec(
        **{
            **task.default_spec(),
            "n_heads": n_heads,
            "n_layers": n_layers,
            "d_model": d_model,
            "d_head": d_head,
            "output_matrix": "learned",
            "init_seed": seed,
        }
    )
    return build_model(spec, device="cpu")


@pytest.fixture(scope="module")
def short(nm_task):
    """200 short train sequences (0-100 digits): cheap forwards."""
    return nm_task.dataset("train").select(slice(0, 200))


# ------------------------------------------------------------------------------------------- transforms


def textbook(v: np.ndarray, n: int):
    """Shapley, Banzhaf and pairwise Shapley interaction index by their definitions, as loops over subsets."""
    f = math.factorial
    phi, ban, inter = np.zeros(n), np.zeros(n), np.zeros((n, n))
    for i in range(n):
        others = [j for j in range(n) if j != i]
        for k in range(n):
            for S in combinations(others, k):
                m = sum(1 << j for j in S)
                d = v[m | 1 << i] - v[m]
                phi[i] += f(k) * f(n - k - 1) / f(n) * d
                ban[i] += d / 2 ** (n - 1)
    for i, j in combinations(range(n), 2):
        rest = [h for h in range(n) if h not in (i, j)]
        for k in range(n - 1):
            for S in combinations(rest, k):
                m = sum(1 << h for h in S)
                d = v[m | 1 << i | 1 << j] - v[m | 1 << i] - v[m | 1 << j] + v[m]
                inter[i, j] += f(k) * f(n - k - 2) / f(n - 1) * d
        inter[j, i] = inter[i, j]
    return phi, ban, inter


@pytest.mark.parametrize("n", [1, 2, 3, 5, 8])
def test_transform_equals_textbook_formula(n):
    v = np.random.default_rng(n).normal(size=1 << n)
    phi, ban, inter = shapley_transform(torch.tensor(v))
    e_phi, e_ban, e_inter = textbook(v, n)
    np.testing.assert_allclose(phi.numpy(), e_phi, atol=1e-12)
    np.testing.assert_allclose(ban.numpy(), e_ban, atol=1e-12)
    np.testing.assert_allclose(inter.numpy(), e_inter, atol=1e-12)
    assert float(phi.sum()) == pytest.approx(v[-1] - v[0], abs=1e-12)  # efficiency
    torch.testing.assert_close(zeta(moebius(torch.tensor(v))), torch.tensor(v), atol=1e-12, rtol=0)


@pytest.mark.slow
@pytest.mark.parametrize("n", [3, 6])
def test_transform_equals_shapiq(n):
    shapiq = pytest.importorskip("shapiq")
    v = np.random.default_rng(10 + n).random(1 << n)

    def game(coalitions):  # shapiq: boolean coalition matrix [k, n] -> values
        return v[(coalitions.astype(int) * (1 << np.arange(n))).sum(1)]

    ec = shapiq.ExactComputer(game, n_players=n)
    sv, bv, sii = ec("SV", order=1).dict_values, ec("BV", order=1).dict_values, ec("SII", order=2).dict_values
    phi, ban, inter = shapley_transform(torch.tensor(v))
    for i in range(n):
        assert phi[i].item() == pytest.approx(sv[(i,)], abs=1e-12)
        assert ban[i].item() == pytest.approx(bv[(i,)], abs=1e-12)
    for i, j in combinations(range(n), 2):
        assert inter[i, j].item() == pytest.approx(sii[(i, j)], abs=1e-12)


def test_bad_value_vector():
    with pytest.raises(InterpError, match="2\\*\\*n"):
        shapley_transform(torch.zeros(6))


# ---------------------------------------------------------------------------------- coalition values


@pytest.mark.slow
def test_shipped_learned_accuracy_exact_and_equal_to_ablation(nm_ckpt):
    """All 2**16 coalitions; 300 random ones against learned_accuracy (the batched subset path of ablation.py),
    and efficiency."""
    model, task = nm_ckpt.model, nm_ckpt.task
    test = task.dataset("test")
    cv = coalition_values(model, test, value="learned-accuracy")
    assert cv.values.shape == (1 << 16,)
    idx = torch.randint(0, 1 << 16, (300,), generator=torch.Generator().manual_seed(0))
    subsets = [[f"L0H{h}" for h in range(16) if int(m) >> h & 1] for m in idx]
    ref = learned_accuracy(model, test, heads=subsets).accuracy.double()
    torch.testing.assert_close(cv.values[idx], ref, atol=1e-6, rtol=0)
    res = cv.shapley()
    assert abs(res.efficiency_gap) < 1e-12
    assert res.v_all == pytest.approx(cv[[f"L0H{h}" for h in range(16)]])
    d = res.to_dict()
    assert set(d) >= {"value", "v_all", "v_empty", "heads", "interactions"}
    assert [r["head"] for r in d["heads"]] == [f"L0H{h}" for h in range(16)]
    json.dumps(d)


@pytest.mark.parametrize("ablation", ["zero", "mean"])
@pytest.mark.parametrize("value", ["learned-accuracy", "answer-loss", "logit-diff"])
def test_fast_equals_hooks_on_every_coalition(nm_task, short, value, ablation):
    """One-layer model, 4 heads: the cached recombination equals the hook path with a subset axis."""
    model = tiny(nm_task, 4)
    data = short.select(slice(0, 50))
    fast = coalition_values(model, data, value=value, ablation=ablation, method="fast")
    hooks = coalition_values(model, data, value=value, ablation=ablation, method="hooks")
    torch.testing.assert_close(fast.values, hooks.values, atol=1e-5, rtol=1e-5)


def test_two_layers_equal_slow_loop(nm_task, short):
    """Two layers x 2 heads: the hook path with a subset axis equals one run_with_hooks per subset."""
    model = tiny(nm_task, 2, n_layers=2, seed=3)
    data = short.select(slice(0, 60))
    for ablation in ("zero", "mean"):
        cv = coalition_values(model, data, ablation=ablation)
        subsets = [[h for i, h in enumerate(cv.heads) if m >> i & 1] for m in range(16)]
        ref = learned_accuracy_loop(model, data, heads=subsets, ablation=ablation).accuracy.double()
        torch.testing.assert_close(cv.values, ref, atol=1e-6, rtol=0)
    res = cv.shapley()
    assert abs(res.efficiency_gap) < 1e-12


def test_heads_subset_others_ablated(nm_ckpt):
    """Players = 3 heads: every other head is ablated, so v(S) is learned_accuracy of S alone."""
    model, task = nm_ckpt.model, nm_ckpt.task
    data = task.dataset("test").select(slice(0, 300))
    heads = ["L0H8", "0.1", (0, 12)]
    cv = coalition_values(model, data, heads=heads)
    assert cv.names == ["L0H8", "L0H1", "L0H12"]
    subsets = [[h for i, h in enumerate(cv.heads) if m >> i & 1] for m in range(8)]
    ref = learned_accuracy(model, data, heads=subsets).accuracy.double()
    torch.testing.assert_close(cv.values, ref, atol=1e-6, rtol=0)
    assert cv[["L0H8", "L0H1"]] == pytest.approx(float(ref[3]))


@pytest.mark.slow
def test_dla_equals_shapley_of_linear_logit_difference(nm_task, short):
    """One-layer attention-only model without LayerNorm, zero ablation, v = mean logit difference: v is additive
    over heads, so phi_h = head h's direct logit attribution, computed here from TransformerLens' cache."""
    model = tiny(nm_task, 4, seed=1)
    for method in ("fast", "hooks"):
        res = coalition_values(model, short, value="logit-diff", ablation="zero", method=method).shapley()
        _, cache = model.run_with_cache(short.tokens)
        rows = torch.arange(len(short))
        z = cache["blocks.0.attn.hook_z"][rows, short.answer_pos]  # [b, h, e]
        classes = torch.unique(short.labels)
        other = torch.where(short.labels == classes[0], classes[1], classes[0])
        direction = model.W_U[:, short.labels] - model.W_U[:, other]  # [d, b]
        dla = torch.einsum("bhe,hed,db->h", z, model.blocks[0].attn.W_O, direction) / len(short)
        torch.testing.assert_close(res.shapley.float(), dla.detach(), atol=1e-5, rtol=1e-4)
        assert res.interactions.abs().max() < 1e-5  # additive: no interactions


@pytest.mark.parametrize("value", ["learned-accuracy", "logit-diff", "answer-loss", "separation"])
def test_dummy_head_gets_zero(nm_task, short, value):
    """A head with W_V = 0 outputs nothing: every marginal contribution is 0, so is its Shapley value."""
    model = tiny(nm_task, 4, seed=2)
    with torch.no_grad():
        model.blocks[0].attn.W_V[2] = 0
    kw = {"train": short, "solver": "torch"} if value == "separation" else {}
    test = nm_task.dataset("test").select(slice(0, 150)) if value == "separation" else short
    cv = coalition_values(model, test, value=value, **kw)
    res = cv.shapley()
    assert abs(res.shapley[2].item()) < 1e-9
    assert abs(res.banzhaf[2].item()) < 1e-9
    assert res.interactions[2].abs().max() < 1e-9
    assert abs(res.efficiency_gap) < 1e-12


@pytest.mark.parametrize("value", ["learned-accuracy", "logit-diff", "separation"])
def test_identical_heads_get_equal_values(nm_task, short, value):
    """Head 3 a copy of head 0: symmetric players get the same Shapley and Banzhaf values."""
    model = tiny(nm_task, 4, seed=4)
    attn = model.blocks[0].attn
    with torch.no_grad():
        for name in ("W_Q", "W_K", "W_V", "W_O", "b_Q", "b_K", "b_V"):
            p = getattr(attn, name)
            p[3] = p[0]
    kw = {"train": short} if value == "separation" else {}
    test = nm_task.dataset("test").select(slice(0, 150)) if value == "separation" else short
    res = shapley_values(model, test, value=value, method="exact", **kw)
    assert res.shapley[3].item() == pytest.approx(res.shapley[0].item(), abs=1e-9)
    assert res.banzhaf[3].item() == pytest.approx(res.banzhaf[0].item(), abs=1e-9)


def test_callable_value(nm_task, short):
    """v(S) = |S| from the masks: every head gets 1, no interactions."""
    model = tiny(nm_task, 3, n_layers=2)
    seen = []

    def size(masks):
        seen.append(masks.shape)
        return masks.sum((1, 2))

    res = shapley_values(model, short, value=size, method="exact")
    assert seen[0][1:] == (2, 3) and res.value == "size"
    torch.testing.assert_close(res.shapley, torch.ones(6, dtype=torch.float64), atol=1e-12, rtol=0)
    assert res.interactions.abs().max() < 1e-12
    with pytest.raises(InterpError, match="one per coalition"):
        coalition_values(model, short, value=lambda m: torch.zeros(3))


def test_sampled_converges_to_exact(nm_ckpt):
    """Permutation sampling over 6 heads of the shipped model: within 4 standard errors of the exact values,
    and its error shrinks with more samples."""
    model, task = nm_ckpt.model, nm_ckpt.task
    data = task.dataset("test").select(slice(0, 400))
    heads = ["L0H8", "L0H11", "L0H1", "L0H3", "L0H14", "L0H12"]
    exact = shapley_values(model, data, heads=heads, method="exact")
    errs = []
    for samples in (40, 1000):
        est = shapley_values(model, data, heads=heads, method="sampled", samples=samples, seed=1)
        assert est.v_all == exact.v_all and est.v_empty == exact.v_empty
        assert abs(est.efficiency_gap) < 1e-12  # every permutation sums to v(all) - v(empty)
        assert (est.shapley - exact.shapley).abs().le(4 * est.stderr + 1e-12).all()
        errs.append(float((est.shapley - exact.shapley).abs().max()))
    assert errs[1] < errs[0]
    json.dumps(est.to_dict())
    assert est.figure() is not None and "stderr" in est.text()


def test_errors(nm_ckpt, nm_task, short):
    model = nm_ckpt.model
    with pytest.raises(InterpError, match="unknown value"):
        coalition_values(model, short, value="accuracy")
    with pytest.raises(InterpError, match="unknown ablation"):
        coalition_values(model, short, ablation="resample")
    with pytest.raises(InterpError, match="train split"):
        coalition_values(model, short, value="separation")
    with pytest.raises(InterpError, match="unknown solver"):
        coalition_values(model, short, value="separation", train=short, solver="liblinear")
    big = tiny(nm_task, 25, d_model=50)
    with pytest.raises(InterpError, match="at most 24"):
        coalition_values(big, short)
    est = shapley_values(big, short, method="sampled", samples=4)  # sampling takes any number of heads
    assert len(est.shapley) == 25 and abs(est.efficiency_gap) < 1e-12
    with pytest.raises(InterpError, match="samples"):
        shapley_values(model, short, method="sampled", samples=1)
    with pytest.raises(Exception, match="L0H16"):
        coalition_values(model, short, heads=["L0H16"])


def test_result_display(nm_ckpt):
    data = nm_ckpt.task.dataset("test").select(slice(0, 100))
    res = shapley_values(nm_ckpt.model, data, heads=["L0H8", "L0H11", "L0H3"])
    fig = res.figure()
    assert len(fig.data) == 3  # Shapley bars, Banzhaf bars, interaction heatmap
    assert "L0H8" in res.text() and res._repr_html_()
    assert res.ranking()[0] in ("L0H8", "L0H11")


# ------------------------------------------------------------------------------------------- separation


def _svc_agreement(model, task, n_coalitions, seed):
    train, test = task.dataset("train"), task.dataset("test")
    idx = torch.randint(1, 1 << 16, (n_coalitions,), generator=torch.Generator().manual_seed(seed))
    idx[:3] = torch.tensor([0, 1 << 8, (1 << 16) - 1])
    fast = coalition_evaluator(model, test, value="separation", train=train, solver="torch")(idx)
    ref = coalition_evaluator(model, test, value="separation", train=train, solver="sklearn")(idx)
    return (fast - ref).abs() * len(test)


@pytest.mark.slow
def test_batched_svc_equals_sklearn(nm_ckpt):
    """Shipped model, full train split (7,500) and test split (1,000): the batched exact solver against one
    LinearSVC(C=1000, dual=False) per coalition, on 60 random coalitions: the same test accuracy within one test
    sequence (scikit-learn stops at its tolerance 1e-4, so a test point within that of the boundary may flip)."""
    diff = _svc_agreement(nm_ckpt.model, nm_ckpt.task, 60, 0)
    assert (diff <= 1 + 1e-9).float().mean() >= 0.99
    assert diff.max() <= 3


@pytest.mark.slow
def test_batched_svc_equals_sklearn_many(nm_ckpt):
    """The same on 500 random coalitions: within one test sequence on at least 99% of them."""
    diff = _svc_agreement(nm_ckpt.model, nm_ckpt.task, 500, 1)
    assert (diff <= 1 + 1e-9).float().mean() >= 0.99


def test_svc_weights_match_sklearn(nm_ckpt):
    """The weights themselves: close to LinearSVC's coef_ and intercept_ (which stop at liblinear's tolerance)."""
    from sklearn.svm import LinearSVC

    from interp.analyses.answer_cache import cache_answer
    from interp.analyses.batched_svc import svc_weights

    model, task = nm_ckpt.model, nm_ckpt.task
    tr = cache_answer(model, task.dataset("train").select(slice(0, 2000)), attention=False)
    x = tr.z[:, 0, :4].double()
    x = x - x.mean(0, keepdim=True)
    for mask in (0b0011, 0b1010, 0b1111):
        W, _ = svc_weights(x, tr.labels, torch.tensor([mask]))
        cols = [i * 2 + j for i in range(4) if mask >> i & 1 for j in range(2)]
        clf = LinearSVC(C=1000.0, dual=False, tol=1e-8, max_iter=100000).fit(
            x.reshape(len(x), -1)[:, cols].numpy(), tr.labels.numpy()
        )
        w = W[0].numpy()
        assert w[0] == pytest.approx(clf.intercept_[0], rel=1e-3, abs=1e-3)
        np.testing.assert_allclose(w[1:][cols], clf.coef_[0], rtol=1e-3, atol=1e-3)
        assert np.abs(np.delete(w[1:], cols)).max(initial=0) == 0


# ------------------------------------------------------------------------------------------- CLI and report


@pytest.mark.slow
def test_cli_json(tmp_path, capsys):
    from interp.app.cli import main

    out = tmp_path / "shapley.json"
    rc = main(
        [
            "shapley",
            "noisy-majority",
            "--value",
            "learned-accuracy",
            "--json",
            "--out",
            str(out),
            "--device",
            "cpu",
            "--threads",
            "1",
        ]
    )
    assert rc == 0
    d = json.loads(capsys.readouterr().out)
    assert d == json.loads(out.read_text())
    assert d["value"] == "learned-accuracy" and d["exact"] is True
    assert len(d["heads"]) == 16 and set(d["heads"][0]) == {"head", "shapley", "banzhaf"}
    assert sum(h["shapley"] for h in d["heads"]) == pytest.approx(d["v_all"] - d["v_empty"], abs=1e-12)
    assert len(d["interactions"]["matrix"]) == 16


def test_cli_sampled_and_errors(capsys):
    from interp.app.cli import main

    rc = main(
        [
            "shapley",
            "noisy-majority",
            "--value",
            "logit-diff",
            "--samples",
            "20",
            "--heads",
            "L0H8",
            "L0H1",
            "L0H3",
            "--device",
            "cpu",
            "--quiet",
        ]
    )
    assert rc == 0
    text = capsys.readouterr().out
    assert "sampled, 20 permutations" in text and "L0H8" in text
    assert main(["shapley", "noisy-majority", "--heads", "L0H99", "--device", "cpu"]) == 1
    assert "L0H99" in capsys.readouterr().err
    assert main(["shapley", "noisy-majority", "--value", "accuracy"]) == 1
    assert "unknown value 'accuracy'" in capsys.readouterr().err
    assert main(["shapley", "noisy-majority", "--value", "loss"]) == 1  # renamed: the answer position's loss only
    assert "'answer-loss'" in capsys.readouterr().err


@pytest.mark.slow
def test_report_section(nm_ckpt):
    """The noisy-majority report's Shapley section: computed caption, table and figure."""
    from interp.analyses.noisy_majority.suite import _shapley_section, checkpoint_summary
    from interp.report_page import Report

    report = Report("t")
    s, _train, test, _tr, te = checkpoint_summary(nm_ckpt, train_size=500, test_size=300)
    _shapley_section(nm_ckpt, report, s, test, te)
    html = report.html()
    assert "Heads: Shapley values" in html and "exact, from all 65,536 coalitions" in html


def test_batched_svc_multiclass_one_vs_rest():
    """Three classes: one-vs-rest like LinearSVC, on every coalition of 3 players (synthetic blobs)."""
    from sklearn.svm import LinearSVC

    from interp.analyses.batched_svc import svc_test_accuracy

    g = torch.Generator().manual_seed(0)
    centers = torch.randn(3, 3, 2, generator=g, dtype=torch.float64) * 1.5
    y_tr, y_te = torch.randint(0, 3, (600,), generator=g), torch.randint(0, 3, (300,), generator=g)
    x_tr = centers[y_tr] + torch.randn(600, 3, 2, generator=g, dtype=torch.float64)
    x_te = centers[y_te] + torch.randn(300, 3, 2, generator=g, dtype=torch.float64)
    acc = svc_test_accuracy(x_tr, y_tr, x_te, y_te, torch.arange(8))
    for mask in range(8):
        cols = [i * 2 + j for i in range(3) if mask >> i & 1 for j in range(2)]
        a_tr, a_te = x_tr.reshape(600, 6)[:, cols].numpy(), x_te.reshape(300, 6)[:, cols].numpy()
        if not cols:
            a_tr, a_te = np.zeros((600, 1)), np.zeros((300, 1))
        clf = LinearSVC(C=1000.0, dual=False, tol=1e-8, max_iter=100000).fit(a_tr, y_tr.numpy())
        ref = float((clf.predict(a_te) == y_te.numpy()).mean())
        assert abs(acc[mask].item() - ref) <= 1 / 300 + 1e-9, mask


def test_namespace_exports_do_not_shadow_modules():
    import importlib

    from interp import analyses
    from interp.analyses.shapley import shapley_values as fn

    assert analyses.shapley_values is fn and analyses.coalition_values is not None
    importlib.import_module("interp.analyses.shapley")
    assert analyses.shapley_values is fn
    for name in ("shapley", "shapley_result", "coalitions", "batched_svc"):
        assert name not in analyses.__all__


# ------------------------------------------------------------------------------------- soft-capped logits


@pytest.mark.parametrize("value", ["logit-diff", "answer-loss", "learned-accuracy"])
def test_soft_capped_logits_fast_path_equals_hooks_and_transformer_lens(nm_task, short, value):
    """A one-layer model whose config soft-caps its logits (``output_logits_soft_cap``: ``cap * tanh(x / cap)``,
    applied by TransformerLens' forward): the fast path's coalition values equal the hook path's and a plain loop
    of TransformerLens forwards written here, one per coalition (zero ablation of the heads outside it)."""
    model = tiny(nm_task, 3, seed=5)
    model.cfg.output_logits_soft_cap = 0.5  # small enough that the cap bends the answer logits
    data = short.select(slice(0, 60))
    fast = coalition_values(model, data, value=value, method="fast")
    hooks = coalition_values(model, data, value=value, method="hooks")
    rows = torch.arange(len(data))
    classes = torch.unique(data.labels)
    plain = []
    for m in range(1 << 3):
        keep = torch.tensor([m >> h & 1 for h in range(3)], dtype=torch.float32)
        hook = ("blocks.0.attn.hook_z", lambda z, hook, keep=keep: z * keep[None, None, :, None])
        with torch.no_grad():
            logits = model.run_with_hooks(data.tokens, fwd_hooks=[hook])[rows, data.answer_pos].double()
        right = logits[rows, data.labels]
        if value == "logit-diff":
            others = (logits[:, classes].sum(-1) - right) / (len(classes) - 1)
            plain.append(float((right - others).mean()))
        elif value == "answer-loss":
            plain.append(float(-logits.log_softmax(-1)[rows, data.labels].mean()))
        else:
            plain.append(float((logits.argmax(-1) == data.labels).double().mean()))
    plain = torch.tensor(plain, dtype=torch.float64)
    torch.testing.assert_close(hooks.values, plain, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(fast.values, plain, atol=1e-5, rtol=1e-5)
    res = shapley_values(model, data, value=value, method="exact")
    torch.testing.assert_close(res.shapley, hooks.shapley().shapley, atol=1e-5, rtol=1e-5)


def test_soft_capped_logits_of_the_query_forward(nm_task, short):
    """The query-restricted forward (training and evaluate's fast path) soft-caps its logits as model(tokens) does."""
    from interp.evaluation import evaluate
    from interp.query_forward import logits_at

    model = tiny(nm_task, 3, seed=5)
    model.cfg.output_logits_soft_cap = 0.5
    data = short.select(slice(0, 20))
    pos = data.answer_pos[:, None]
    with torch.no_grad():
        full = model(data.tokens)[torch.arange(len(data))[:, None], pos]
        torch.testing.assert_close(logits_at(model, data.tokens, pos), full, atol=1e-6, rtol=1e-6)
    fast, slow = evaluate(model, nm_task, data), evaluate(model, nm_task, data, full_forward=True)
    assert fast["loss"] == pytest.approx(slow["loss"], abs=1e-6)


def _lattice_data(N=4000, strengths=(3.0, 2.0, 1.5, 1.2, 0.3, 0.0)):
    """Six players of two features, the first shifted by the label times a strength: coalitions from near-separable
    (a few violators) to hopeless (all samples violate), so the solver takes each of its paths."""
    g = torch.Generator().manual_seed(0)
    y = torch.randint(0, 2, (N,), generator=g)
    x = torch.randn(N, len(strengths), 2, generator=g, dtype=torch.float64)
    x[:, :, 0] += (2 * y[:, None] - 1) * torch.tensor(strengths, dtype=torch.float64)
    return x - x.mean(0), y


def _newton_step(x, y, w, mask, C=1000.0):
    """The Newton step ``H^-1 grad f`` of f (the module doc's objective) at ``w`` on the coalition's columns, by the
    plain formulas: ``grad f = w - 2C sum_i y_i viol_i x_i``, ``H = I + 2C sum_(viol_i > 0) x_i x_i^T``. Since
    ``H >= I`` its length is at most the gradient's, and f being quadratic between changes of its active samples,
    ``w`` plus it is the minimiser once those are right."""
    N, n, e = x.shape
    cols = [0] + [1 + i * e + j for i in range(n) if mask >> i & 1 for j in range(e)]
    X = torch.cat([torch.ones(N, 1, dtype=torch.float64), x.reshape(N, -1)], 1)[:, cols]
    s = (2 * y - 1).double()
    viol = (1 - s * (X @ w[cols])).clamp_min(0)
    g = w[cols] - 2 * C * (X * (s * viol)[:, None]).sum(0)
    act = X[viol > 0]
    return torch.linalg.solve(torch.eye(len(cols), dtype=torch.float64) + 2 * C * act.T @ act, g)


def test_batched_svc_every_path_is_the_exact_minimiser(monkeypatch):
    """Every coalition of 6 players, solved along the subset lattice: working sets handed on from parents (64 to 512
    samples), rebuilt from margins, and all samples in the full feature space. Each weight vector is checked against
    f's own Newton step, recomputed here: at most the solver's stopping rule (1e-9 of max(1, |w|), times 1.01 for
    the recomputation's rounding), zero off the coalition; and the all-sample problems solved by the per-problem column
    copies instead (the full-space table switched off) give the same weights within 1e-6 of their norm, in the same
    number of Newton steps (within one)."""
    import interp.analyses.batched_svc as bs

    x, y = _lattice_data()
    used = {"full": 0, "handed_on": set()}
    full, solve = bs.LatticeSolver._newton_full, bs.LatticeSolver.solve

    def counted_full(self, w, cm, budget):
        used["full"] += len(w)
        return full(self, w, cm, budget)

    def counted_solve(self, masks, w, ws=None):
        if ws is not None:
            used["handed_on"] |= set((ws >= 0).sum(-1).unique().tolist())
        return solve(self, masks, w, ws)

    monkeypatch.setattr(bs.LatticeSolver, "_newton_full", counted_full)
    monkeypatch.setattr(bs.LatticeSolver, "solve", counted_solve)
    W, iters = bs.svc_weights(x, y, torch.arange(64), engine="torch")
    assert used["full"] > 0 and {64, 256, 512} <= used["handed_on"]
    assert int(iters.max()) <= 100  # every problem converged
    for mask in range(64):
        bound = 1.01e-9 * max(1.0, float(W[mask].norm()))
        assert float(torch.linalg.vector_norm(_newton_step(x, y, W[mask], mask))) <= bound, mask
        off = [1 + i * 2 + j for i in range(6) if not mask >> i & 1 for j in range(2)]
        assert bool((W[mask, off] == 0).all())
    monkeypatch.setattr(bs, "OUTER_ELEMS", 0)
    used["full"] = 0
    W2, iters2 = bs.svc_weights(x, y, torch.arange(64), engine="torch")
    assert used["full"] == 0
    assert float((W2 - W).norm(dim=-1).max() / W.norm(dim=-1).max()) <= 1e-6
    assert int((iters2 - iters).abs().max()) <= 1  # the same Newton steps: the same Hessians, up to rounding


def _blobs(N, n, e, sep, seed):
    """Two classes whose means differ by ``sep`` (unit noise) in every player's features, centred."""
    g = torch.Generator().manual_seed(seed)
    y = torch.randint(0, 2, (N,), generator=g)
    mu = torch.randn(2, n, e, generator=g, dtype=torch.float64)
    mu = mu / mu.flatten(1).norm(dim=1)[:, None, None] * sep
    x = torch.randn(N, n, e, generator=g, dtype=torch.float64) + mu[y]
    return x - x.mean(0), y


@pytest.mark.parametrize("C", [1000.0, 1e6])
def test_batched_svc_separable_data_reach_the_minimiser_whatever_the_start(C):
    """Well separated classes, where few samples are active at the minimiser: a Newton step from a few active
    samples overshoots, and backtracking to a sufficient decrease once crawled to max_iter far from the minimiser
    (objective 1,493 against scikit-learn's 0.256), and a child warm-started at its parent's solution stopped at once
    under a stopping rule relative to |grad f(0)| (a large C makes that large), its new player's weights left at 0.
    Every coalition, solved along the lattice, must converge, have a Newton step (plain formulas) within the stopping
    rule, equal the same coalition solved alone (no warm start) within 1e-7 of the weights' norm, and reach
    scikit-learn's objective (LinearSVC, tol 1e-10) or lower (on every coalition at C = 1e6; at C = 1000, where
    scikit-learn takes a second per fit, on the four largest)."""
    from sklearn.svm import LinearSVC

    from interp.analyses.batched_svc import svc_weights

    n, e = (5, 8) if C == 1000.0 else (4, 2)
    x, y = _blobs(2000 if C == 1000.0 else 100, n, e, 6.0, 0)
    W, iters = svc_weights(x, y, torch.arange(1 << n), C=C, engine="torch")  # the C one: tests/test_svc_native.py
    assert int(iters.max()) <= 100
    s = (2 * y - 1).double()
    for mask in range(1, 1 << n):
        size = max(1.0, float(W[mask].norm()))
        assert float(_newton_step(x, y, W[mask], mask, C).norm()) <= 1.01e-9 * size, mask
        alone, _ = svc_weights(x, y, torch.tensor([mask]), C=C, engine="torch")
        assert float((alone[0] - W[mask]).norm()) <= 1e-7 * size, mask
        if C == 1000.0 and mask % 8 != 7:
            continue
        cols = [i * e + j for i in range(n) if mask >> i & 1 for j in range(e)]
        X = x.reshape(len(x), -1)[:, cols]
        clf = LinearSVC(C=C, dual=False, tol=1e-10, max_iter=100000).fit(X.numpy(), y.numpy())

        def f(w, b, X=X):
            return 0.5 * (w @ w + b * b) + C * float(((1 - s * (X @ w + b)).clamp_min(0) ** 2).sum())

        ours = f(W[mask, 1:][cols], float(W[mask, 0]))
        theirs = f(torch.as_tensor(clf.coef_[0]), float(clf.intercept_[0]))
        assert ours <= theirs * (1 + 1e-9), (mask, ours, theirs)


def test_batched_svc_refuses_bad_input_and_warns_when_it_stops_short():
    """What gave silent numbers: NaN features, bitmasks outside the players, C <= 0, mismatched shapes; and fits
    stopped at max_iter are reported (a RuntimeWarning), not passed off as minimisers."""
    from interp.analyses.batched_svc import _checked, svc_test_accuracy, svc_weights

    x, y = _blobs(300, 3, 2, 1.0, 1)
    xt, yt = _blobs(100, 3, 2, 1.0, 2)
    idx = torch.arange(8)
    bad_x = x.clone()
    bad_x[3, 1, 0] = float("nan")
    cases = [
        ((bad_x, y, xt, yt, idx), {}, "x_tr holds NaN or infinite values"),
        ((x, y, xt.clone().fill_(float("inf")), yt, idx), {}, "x_te holds NaN or infinite values"),
        ((x, y, xt, yt, torch.tensor([8])), {}, "bitmasks outside 0 .. 2^3 - 1"),
        ((x, y, xt, yt, torch.tensor([-1])), {}, "bitmasks outside 0 .. 2^3 - 1"),
        ((x, y, xt, yt, idx), {"C": 0.0}, "C and tol must be finite positive numbers"),
        ((x, y[:-1], xt, yt, idx), {}, "y_tr must hold one label per train sample (300)"),
        ((x, y, xt[:, :2], yt, idx), {}, "x_te must be [test, 3, 2]"),
        ((x, y, xt, yt[:-1], idx), {}, "y_te must hold one label per test sample (100)"),
        ((x[:, 0], y, xt, yt, idx), {}, "x_tr must be [sample, player, d_head]"),
    ]
    for (x_tr, y_tr, x_te, y_te, index), kw, message in cases:
        with pytest.raises(InterpError, match=re.escape(message)):  # what every call checks first
            _checked(x_tr, y_tr, index, kw.get("C", 1000.0), 1e-9, 100, x_te, y_te)
    for (x_tr, y_tr, x_te, y_te, index), kw, message in cases[:5]:  # the shapes the signature's own check passes
        with pytest.raises(InterpError, match=re.escape(message)):
            svc_test_accuracy(x_tr, y_tr, x_te, y_te, index, **kw)
    with pytest.raises(InterpError, match="x_tr holds NaN"):
        svc_weights(bad_x, y, idx)
    with pytest.raises(InterpError, match="integer bitmasks"):  # (the signature's check refuses it first in tests)
        _checked(x, y, torch.tensor([3.0]), 1000.0, 1e-9, 100)
    with pytest.warns(RuntimeWarning, match=r"did not converge in max_iter=1 Newton steps"):
        svc_test_accuracy(x, y, xt, yt, idx, max_iter=1)
