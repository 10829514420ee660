"""Composition scores: equal to TransformerLens' and to a dense recomputation, in [0, 1], scale invariant,
random baseline near 1/sqrt(d_model) (peers.md R5/R6)."""

from __future__ import annotations

import math

import pytest
import torch

from interp.analyses.composition import composition_scores, random_baseline
from interp.analyses.repeated_tokens.handbuilt import induction_circuit_model
from interp.errors import InterpError
from interp.model import ModelSpec, build_model


def random_model(n_layers=3, d_model=24, n_heads=3, d_head=5, seed=0):
    return build_model(
        ModelSpec(
            d_vocab=11,
            n_ctx=8,
            n_layers=n_layers,
            d_model=d_model,
            n_heads=n_heads,
            d_head=d_head,
            positional="standard",
            output_matrix="learned",
            init_seed=seed,
        ),
        device="cpu",
    )


@pytest.fixture(scope="module")
def model():
    return random_model()


def dense_score(a, b):
    fro = torch.linalg.matrix_norm
    a, b = a.detach(), b.detach()
    return fro(a @ b) / fro(a) / fro(b)


def test_equal_to_transformer_lens_and_dense_products(model):
    cs = composition_scores(model, n_baseline=50)
    for mode in ("Q", "K", "V"):
        torch.testing.assert_close(cs.scores(mode), model.all_composition_scores(mode))
    L, H = 3, 3
    for l1 in range(L):
        for h1 in range(H):
            ov = model.W_V[l1, h1] @ model.W_O[l1, h1]
            for l2 in range(L):
                for h2 in range(H):
                    qk = model.W_Q[l2, h2] @ model.W_K[l2, h2].T
                    ov2 = model.W_V[l2, h2] @ model.W_O[l2, h2]
                    want = {"Q": dense_score(ov, qk), "K": dense_score(ov, qk.T), "V": dense_score(ov, ov2)}
                    for mode, w in want.items():
                        got = cs.scores(mode)[l1, h1, l2, h2]
                        if l2 > l1:
                            assert float(got) == pytest.approx(float(w), rel=1e-4, abs=1e-6)
                        else:
                            assert float(got) == 0.0


def test_scores_in_unit_interval_and_pairs(model):
    cs = composition_scores(model, n_baseline=50)
    for mode in ("Q", "K", "V"):
        s = cs.scores(mode)
        assert float(s.min()) >= 0 and float(s.max()) <= 1
    assert len(cs.pairs()) == 3 * 3 * 3  # (l1, l2) in {(0,1), (0,2), (1,2)}, 3 x 3 heads each
    top = cs.top_pairs("K", 4)
    assert [r["score"] for r in top] == sorted((r["score"] for r in top), reverse=True)
    assert top[0]["score"] == pytest.approx(float(cs.K.max()), rel=1e-6)
    z, rows, cols = cs.matrix("K")
    assert z.shape == (6, 6) and rows[0] == "L0H0" and cols[0] == "L1H0"


def test_invariant_to_rescaling(model):
    before = composition_scores(model, n_baseline=50)
    m2 = random_model()
    with torch.no_grad():
        m2.blocks[0].attn.W_V.mul_(3.7)
        m2.blocks[1].attn.W_Q.mul_(0.2)
        m2.blocks[2].attn.W_O.mul_(-5.0)
    after = composition_scores(m2, n_baseline=50)
    for mode in ("Q", "K", "V"):
        torch.testing.assert_close(after.scores(mode), before.scores(mode), rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("d_model,d_head", [(32, 4), (64, 16), (128, 8)])
def test_random_baseline_near_inverse_sqrt_d_model(d_model, d_head):
    mean, std = random_baseline(d_model, d_head, n_samples=300)
    assert mean == pytest.approx(1 / math.sqrt(d_model), rel=0.1)
    assert std < 0.25 * mean


def test_handbuilt_pair_far_above_baseline():
    m = induction_circuit_model(n_symbols=12, n_ctx=25)
    cs = composition_scores(m, n_baseline=300)
    k = float(cs.K[0, 0, 1, 0])
    # L0H0 writes the 13 token directions exactly where L1H0's keys read: score 1/sqrt(rank) = 1/sqrt(13)
    assert k == pytest.approx(1 / math.sqrt(13), rel=1e-4)
    assert (k - cs.baseline_mean) / cs.baseline_std > 10
    assert cs.top_pairs("K", 1)[0]["from"] == "L0H0"


def test_figure_and_errors(model):
    cs = composition_scores(model, n_baseline=50)
    fig = cs.figure("K")
    assert fig.data[0].type == "heatmap" and "baseline" in fig.layout.title.text
    assert "<table" in cs._repr_html_() and "<th>ratio_to_baseline</th>" in cs._repr_html_()
    with pytest.raises(InterpError, match="mode"):
        cs.scores("X")
    one = composition_scores(random_model(n_layers=1), n_baseline=50)
    assert one.top_pairs("K") == []
    with pytest.raises(InterpError, match="one-layer"):
        one.mode_figure()
    assert one.figure() is None and "<table" in one._repr_html_()  # no picture for one layer, still a display
