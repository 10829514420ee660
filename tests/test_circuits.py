"""QK/OV circuits equal the dense products they factor; copying scores and top-k against plain computations;
the logit decomposition sums to the model's logits and matches the thesis's tensor-product formula."""

from __future__ import annotations

import pytest
import torch

from interp.analyses.circuits import (
    bigram_table,
    full_ov_circuit,
    full_qk_circuit,
    k_composition_circuit,
    logit_decomposition,
    ov_copying,
    positional_qk_circuit,
)
from interp.analyses.repeated_tokens.handbuilt import induction_circuit_model
from interp.errors import ConfigError, HeadError, InterpError
from interp.model import ModelSpec, build_model

ATOL = 1e-4


def make(n_layers=2, positional="standard", normalization=None, seed=0, **kw):
    spec = dict(
        d_vocab=9,
        d_vocab_out=8,
        n_ctx=10,
        n_layers=n_layers,
        d_model=12,
        n_heads=3,
        d_head=4,
        positional=positional,
        output_matrix="learned",
        attn_bias=True,
        normalization=normalization,
        init_seed=seed,
    )
    m = build_model(ModelSpec(**{**spec, **kw}), device="cpu")
    with torch.no_grad():  # nonzero biases, so the decomposition's bias term is exercised
        for name, p in m.named_parameters():
            if name.split(".")[-1].startswith("b_") and p.requires_grad:
                p.normal_(0, 0.1)
    return m


@pytest.fixture(scope="module")
def model():
    return make()


def test_circuits_equal_dense_products(model):
    W_E, W_pos, W_U = model.W_E, model.W_pos, model.W_U
    for l in range(2):
        for h in range(3):
            qk = model.W_Q[l, h] @ model.W_K[l, h].T
            ov = model.W_V[l, h] @ model.W_O[l, h]
            torch.testing.assert_close(
                full_qk_circuit(model, heads=(l, h)).dense(), W_E @ qk @ W_E.T, atol=ATOL, rtol=1e-4
            )
            torch.testing.assert_close(
                full_ov_circuit(model, heads=f"L{l}H{h}").dense(), W_E @ ov @ W_U, atol=ATOL, rtol=1e-4
            )
            torch.testing.assert_close(
                positional_qk_circuit(model, heads=(l, h)).dense(), W_pos @ qk @ W_pos.T, atol=ATOL, rtol=1e-4
            )
    torch.testing.assert_close(positional_qk_circuit(model, heads=(0, 1), n_pos=4).dense().shape, torch.Size([4, 4]))
    ov0 = model.W_V[0, 2] @ model.W_O[0, 2]
    qk1 = model.W_Q[1, 1] @ model.W_K[1, 1].T
    torch.testing.assert_close(
        k_composition_circuit(model, senders="L0H2", receivers="L1H1").dense(),
        W_E @ qk1 @ ov0.T @ W_E.T,
        atol=ATOL,
        rtol=1e-4,
    )
    torch.testing.assert_close(bigram_table(model).dense(), W_E @ W_U, atol=ATOL, rtol=1e-4)


def test_k_composition_circuit_scores_what_layer1_sees():
    """Through the hand-built circuit, the K-composition circuit is the induction QK: diagonal (same token)."""
    m = induction_circuit_model(n_symbols=6, n_ctx=13)
    kc = k_composition_circuit(m, senders="L0H0", receivers="L1H0").dense()
    assert torch.allclose(kc, kc[0, 0] * torch.eye(7), atol=1e-4) and kc[0, 0] > 0


def test_copying_scores_against_numpy_eigenvalues_and_loops(model):
    res = ov_copying(model, k=3)
    n = 8
    for l in range(2):
        for h in range(3):
            full = (model.W_E[:n] @ model.W_V[l, h] @ model.W_O[l, h] @ model.W_U[:, :n]).detach().double()
            ev = torch.linalg.eigvals(full)  # 8 eigenvalues, at most d_head = 4 of them nonzero
            assert float(res.copying_score[l, h]) == pytest.approx(float(ev.real.sum() / ev.abs().sum()), abs=1e-4)
            hits1 = hits3 = 0
            for i in range(n):
                order = torch.argsort(full[i], descending=True).tolist()
                hits1 += order[0] == i
                hits3 += i in order[:3]
            assert float(res.top1[l, h]) == pytest.approx(hits1 / n)
            assert float(res.topk[l, h]) == pytest.approx(hits3 / n)


def test_copying_score_signs():
    m = induction_circuit_model(n_symbols=6, n_ctx=13)
    res = ov_copying(m, k=1)
    assert float(res.copying_score[1, 0]) == pytest.approx(1.0, abs=1e-5)  # copies the attended token
    assert float(res.top1[1, 0]) == 1.0
    with torch.no_grad():
        m.blocks[1].attn.W_O.neg_()
    res = ov_copying(m, k=1)
    assert float(res.copying_score[1, 0]) == pytest.approx(-1.0, abs=1e-5)
    assert float(res.top1[1, 0]) == 0.0
    with pytest.raises(InterpError, match="k must"):
        ov_copying(m, k=0)


@pytest.mark.parametrize("positional", ["standard", "shortformer"])
def test_logit_decomposition_sums_to_logits(positional):
    m = make(positional=positional, seed=3)
    toks = torch.randint(0, 9, (4, 10), generator=torch.Generator().manual_seed(0))
    dec = logit_decomposition(m, toks)
    with torch.inference_mode():
        torch.testing.assert_close(dec.total(), m(toks), atol=ATOL, rtol=1e-4)
    assert dec.heads.shape == (2, 3, 4, 10, 8)
    assert dec.contributions().shape == (1 + 6,)


def test_one_layer_decomposition_is_the_seed_formula():
    """T = Id ⊗ W_U W_E + Σ_h A^h ⊗ W_U W_OV^h W_E: head term at q = Σ_k A^h[q, k] (W_E W_OV^h W_U)[tok_k]."""
    m = make(n_layers=1, positional="shortformer", seed=4, attn_bias=False, unembed_bias=False)
    toks = torch.randint(0, 9, (3, 10), generator=torch.Generator().manual_seed(1))
    dec = logit_decomposition(m, toks)
    _, cache = m.run_with_cache(toks)
    A = cache["pattern", 0]  # [b, h, q, k]
    for h in range(3):
        ov_table = m.W_E @ m.W_V[0, h] @ m.W_O[0, h] @ m.W_U  # [token, logit]
        want = torch.einsum("bqk,bkv->bqv", A[:, h], ov_table[toks])
        torch.testing.assert_close(dec.heads[0, h], want, atol=ATOL, rtol=1e-4)
    torch.testing.assert_close(dec.direct, (m.W_E @ m.W_U)[toks], atol=ATOL, rtol=1e-4)


def test_errors_and_figures(model):
    with pytest.raises(HeadError, match="out of range"):
        full_ov_circuit(model, heads="L2H0")
    with pytest.raises(InterpError, match="later layer"):
        k_composition_circuit(model, senders="L1H0", receivers="L0H0")
    with pytest.raises(ConfigError, match="LayerNorm"):
        logit_decomposition(make(normalization="LN"), torch.zeros(1, 3, dtype=torch.long))
    fig = full_ov_circuit(model, heads="L0H0").figure()
    assert fig.data[0].type == "heatmap" and len(fig.data[0].z) == 9
    assert ov_copying(model).figure().data[0].type == "heatmap"
    assert "<table" in ov_copying(model)._repr_html_() and "<td>L0H0</td>" in ov_copying(model)._repr_html_()


def test_token_qk_circuit_of_a_rotary_model_says_it_leaves_the_rotation_out():
    """Under rotary positions the attention score of two tokens depends on their distance, which W_E W_QK W_E^T
    leaves out: the circuit says so (its note and text), and the positional QK circuit, which needs a learned W_pos,
    is refused."""
    from transformer_lens import HookedTransformer, HookedTransformerConfig

    from interp.errors import ConfigError

    cfg = HookedTransformerConfig(
        n_layers=2,
        d_model=16,
        n_heads=2,
        d_head=8,
        d_vocab=9,
        n_ctx=12,
        attn_only=True,
        act_fn="relu",
        seed=0,
        positional_embedding_type="rotary",
        rotary_dim=8,
        device="cpu",
    )
    model = HookedTransformer(cfg).eval()
    for circuit in (
        full_qk_circuit(model, heads="L0H1"),
        full_qk_circuit(model, heads=["L0H0", "L1H1"]),
        k_composition_circuit(model, senders="L0H0", receivers="L1H1"),
    ):
        assert "rotary" in circuit.note and "rotary" in circuit.text()
        assert circuit.to_dict()["note"] == circuit.note
    assert full_ov_circuit(model, heads="L0H1").note == ""  # the OV circuit does not depend on positions
    with pytest.raises(ConfigError, match="learned W_pos"):
        positional_qk_circuit(model, heads="L0H0")
