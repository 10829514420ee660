"""Head scores and the K-composition causal test, against a hand-built induction circuit, a plain loop, and
TransformerLens' head-detector patterns."""

from __future__ import annotations

import pytest
import torch

from interp.analyses.pattern_scores import ablation_induction_test, head_scores, repeated_random_tokens, target_masks
from interp.analyses.repeated_tokens.handbuilt import induction_circuit_model
from interp.errors import HeadError, InterpError, TokenError
from interp.visualize import attention_patterns, attention_view

V = 12  # symbols of the hand-built model; [BOS] = V


@pytest.fixture(scope="module")
def circuit():
    return induction_circuit_model(n_symbols=V, n_ctx=25)


@pytest.fixture(scope="module")
def unique_tokens():
    return repeated_random_tokens(16, 10, V, bos=V, seed=3, unique=True)


@pytest.fixture(scope="module")
def dup_tokens():
    """R drawn with replacement from 12 symbols: most sequences repeat a symbol inside R."""
    toks = repeated_random_tokens(16, 12, V, bos=V, seed=4)
    r = toks[:, 1:13]
    assert sum(len(set(row.tolist())) < 12 for row in r) >= 12
    return toks


def test_handbuilt_previous_token_head(circuit, unique_tokens):
    s = head_scores(circuit, unique_tokens)
    assert s.prev_token[0, 0] > 0.99
    assert s.induction[0, 0] < 0.01  # attends to q-1, never to the token after an earlier copy (len(R) > 2)


def test_handbuilt_induction_head(circuit, unique_tokens, dup_tokens):
    for toks in (unique_tokens, dup_tokens):  # repeats inside R: every earlier occurrence is a target
        s = head_scores(circuit, toks)
        assert s.induction[1, 0] > 0.99
        assert s.prev_token[1, 0] < 0.3


def test_layer1_head_without_qk_is_not_induction(unique_tokens):
    m = induction_circuit_model(n_symbols=V, n_ctx=25, induction=False)
    s = head_scores(m, unique_tokens)
    assert s.prev_token[0, 0] > 0.99
    assert s.induction[1, 0] < 0.3  # uniform attention: about the share of one position among q+1


def naive_scores(model, tokens):
    """Plain loops over sequences, queries and keys."""
    _, cache = model.run_with_cache(tokens)
    L, H = model.cfg.n_layers, model.cfg.n_heads
    out = {k: torch.zeros(L, H) for k in ("induction", "prev_token", "duplicate", "bos")}
    counts = dict.fromkeys(out, 0)
    for b in range(tokens.shape[0]):
        t = tokens[b].tolist()
        for q in range(len(t)):
            targets = {
                "induction": [k for k in range(1, q + 1) if t[k - 1] == t[q]],
                "prev_token": [q - 1] if q >= 1 else [],
                "duplicate": [k for k in range(q) if t[k] == t[q]],
                "bos": [0] if q >= 1 else [],
            }
            for name, ks in targets.items():
                if not ks:
                    continue
                counts[name] += 1
                for l in range(L):
                    out[name][l] += cache["pattern", l][b, :, q, ks].sum(-1)
    return {k: v / counts[k] for k, v in out.items()}


def test_scores_equal_naive_loop_on_random_model(dup_tokens):
    from interp.model import ModelSpec, build_model

    m = build_model(
        ModelSpec(
            d_vocab=V + 1,
            d_vocab_out=V,
            n_ctx=25,
            n_layers=2,
            d_model=16,
            n_heads=3,
            d_head=4,
            positional="standard",
            output_matrix="learned",
            init_seed=5,
        ),
        device="cpu",
    )
    toks = dup_tokens[:5]
    got = head_scores(m, toks, batch_size=2)  # chunks of unequal size must weigh by their valid queries
    want = naive_scores(m, toks)
    for name, w in want.items():
        torch.testing.assert_close(getattr(got, name), w, atol=1e-5, rtol=1e-5)


def test_scale_relation_to_transformer_lens_detector(circuit, dup_tokens):
    """TL's 'mul' score = ours * (rows with a target) / seq_len, per sequence and head."""
    from transformer_lens import head_detector as hd

    tok = dup_tokens[:1]
    ours = head_scores(circuit, tok)
    masks = target_masks(tok)
    pats = attention_patterns(circuit, tok)[0]
    for name, det_fn in (
        ("induction", hd.get_induction_head_detection_pattern),
        ("duplicate", hd.get_duplicate_token_head_detection_pattern),
        ("prev_token", hd.get_previous_token_head_detection_pattern),
    ):
        det = det_fn(tok.cpu())
        assert torch.equal(det, masks[name][0].cpu())  # the same detection pattern
        n_valid = int((masks[name][0].sum(-1) > 0).sum())
        for l in range(2):
            tl = hd.compute_head_attention_similarity_score(
                pats[l, 0].clone(), det, exclude_bos=False, exclude_current_token=False, error_measure="mul"
            )
            assert tl == pytest.approx(float(getattr(ours, name)[l, 0]) * n_valid / tok.shape[1], abs=1e-5)


def test_k_composition_causal_test_on_handbuilt(circuit, unique_tokens):
    res = ablation_induction_test(circuit, unique_tokens)
    assert res.senders == [(0, 0)]
    assert res.base[1, 0] > 0.99
    assert res.ablated[0, 1, 0] < 0.3  # without the previous-token head the induction head attends uniformly
    rows = res.rows()
    assert rows[0]["ablated"] == "L0H0" and rows[0]["head"] == "L1H0"
    assert rows[0]["drop"] == pytest.approx(rows[0]["induction_score"] - rows[0]["ablated_score"])


def test_batched_ablation_equals_one_run_per_head(dup_tokens):
    from interp.model import ModelSpec, build_model

    m = build_model(
        ModelSpec(
            d_vocab=V + 1,
            d_vocab_out=V,
            n_ctx=25,
            n_layers=2,
            d_model=16,
            n_heads=3,
            d_head=4,
            positional="shortformer",
            output_matrix="learned",
            init_seed=2,
        ),
        device="cpu",
    )
    toks = dup_tokens[:4]
    res = ablation_induction_test(m, toks)
    for h in range(3):

        def zero(z, hook, h=h):
            z = z.clone()
            z[:, :, h] = 0
            return z

        with m.hooks(fwd_hooks=[("blocks.0.attn.hook_z", zero)]):
            single = head_scores(m, toks)
        torch.testing.assert_close(res.ablated[h], single.induction, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(res.base, head_scores(m, toks).induction, atol=1e-5, rtol=1e-5)


def test_bad_input(circuit):
    toks = repeated_random_tokens(2, 5, V, bos=V)
    with pytest.raises(HeadError, match="later layer"):
        ablation_induction_test(circuit, toks, layers=[1])
    with pytest.raises(HeadError, match="out of range"):
        ablation_induction_test(circuit, toks, senders=["L0H5"])
    with pytest.raises(InterpError, match="unknown path"):
        ablation_induction_test(circuit, toks, path="keys")
    with pytest.raises(TokenError, match="n_ctx"):
        head_scores(circuit, repeated_random_tokens(2, 20, V, bos=V))


def test_attention_view_offline_html(circuit, unique_tokens, tmp_path):
    view = attention_view(circuit, unique_tokens[0], heads=["L0H0", "L1H0"])
    assert view.head_names == ["L0H0", "L1H0"]
    assert view.pattern.shape == (2, unique_tokens.shape[1], unique_tokens.shape[1])
    assert torch.allclose(view.pattern.sum(-1), torch.ones(2, unique_tokens.shape[1]), atol=1e-5)
    path = view.save(tmp_path / "attn.html")
    text = path.read_text()
    assert "CircuitsVis.render" in text and "unpkg.com" not in text
    assert "CircuitsVis" in view._repr_html_()


def test_default_probe_for_a_foreign_model():
    """A model of another task gets [R R] over its output symbols, no BOS, filling the context."""
    from interp.analyses.pattern_scores import repeated_random_tokens
    from interp.model import ModelSpec, build_model

    m = build_model(
        ModelSpec(
            d_vocab=10, d_vocab_out=7, n_ctx=21, n_layers=1, d_model=8, n_heads=2, d_head=4, output_matrix="learned"
        ),
        device="cpu",
    )
    toks = repeated_random_tokens(5, 10, 7, seed=0)
    assert toks.shape == (5, 20) and int(toks.max()) < 7
    assert torch.equal(toks[:, :10], toks[:, 10:])
    s = head_scores(m, repeated_random_tokens(64, 10, 7, seed=0))
    assert s.induction.shape == (1, 2) and s.tokens.shape == (64, 20)
    with pytest.raises(TokenError, match="longer than the model's context"):
        head_scores(m, repeated_random_tokens(5, 11, 7))
