"""w01 / w02 (analyses.noisy_majority.attention_ratios): analytic values of the minimal transformer, measured ==
exact on the shipped model, exact == TransformerLens' FactoredMatrix QK circuit, measured == a plain average of the
cached attention pattern, and refusals where the exact formula does not hold."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch

from interp.analyses.noisy_majority.attention_ratios import (
    attention_ratios,
    exact_attention_ratios,
    measured_attention_ratios,
    query_key_scores,
    task_token_ids,
)
from interp.analyses.noisy_majority.handbuilt import attention_preference_model
from interp.errors import ConfigError, TaskError
from interp.task import Vocab


@pytest.mark.parametrize("N", [30.0, 8.0])
def test_minimal_transformer_ratios(nm_task, N):
    """Scores of the '=' query are N, N+1, 0 for 0, 1, 2: w01 = e^-1 and w02 = e^N. Tolerance: relative 1e-5
    exact (float32 scores, exp in float64); 1e-4 measured (float32 log-softmax)."""
    from interp.analyses.noisy_majority.handbuilt import minimal_majority_transformer

    model = minimal_majority_transformer(nm_task, N=N)
    w01, w02 = exact_attention_ratios(model)
    assert w01.item() == pytest.approx(math.exp(-1), rel=1e-5)
    assert w02.item() == pytest.approx(math.exp(N), rel=1e-5)
    res = measured_attention_ratios(model, nm_task.dataset("test").select(slice(0, 50)))
    assert res.w01.item() == pytest.approx(math.exp(-1), rel=1e-4)
    assert res.w02.item() == pytest.approx(math.exp(N), rel=1e-4)


def test_shipped_measured_equals_exact(nm_ckpt):
    res = attention_ratios(nm_ckpt.model, nm_ckpt.task.dataset("test").select(slice(0, 100)))
    assert res.exact_w01 is not None
    assert torch.allclose(res.w01.double().log(), res.exact_w01.log(), atol=1e-3)
    assert torch.allclose(res.w02.double().log(), res.exact_w02.log(), atol=1e-3)
    # no positional embedding: every sequence gives the same ratio
    spread = (res.log_w01 - res.log_w01.nanmean(0)).abs()
    assert float(spread[~spread.isnan()].max()) < 1e-3


def test_exact_scores_equal_factored_qk_circuit(nm_ckpt):
    """score(=, t) = W_E[=] QK W_E[t]^T / attn_scale with TransformerLens' FactoredMatrix (biases are zero)."""
    model = nm_ckpt.model
    eq = task_token_ids(nm_ckpt.task.vocab)[3]
    full = (model.W_E[eq][None] @ model.QK[0] @ model.W_E.T).AB[:, 0]  # [head, vocab]
    ours = query_key_scores(model)
    assert torch.allclose(ours, full / model.blocks[0].attn.attn_scale, atol=1e-4)


def test_measured_equals_plain_pattern_average(nm_ckpt):
    """The definition, computed naively: mean attention per 0 / 1 token from the cached pattern, ratio per
    sequence, geometric mean over sequences. Tolerance: relative 1e-4."""
    model = nm_ckpt.model
    data = nm_ckpt.task.dataset("train").select(slice(0, 30))
    data = data.select((data.fields["n0"] > 0) & (data.fields["n1"] > 0) & (data.fields["n2"] > 0))
    logs01, logs02 = [], []
    for i in range(len(data)):
        n = int(data.lengths[i])
        tokens = data.tokens[i : i + 1, :n]
        with torch.no_grad():
            _, cache = model.run_with_cache(tokens, names_filter="blocks.0.attn.hook_pattern")
        row = cache["blocks.0.attn.hook_pattern"][0, :, int(data.answer_pos[i])].double()  # [head, pos]
        mean = {c: row[:, tokens[0] == c].mean(-1) for c in (1, 2, 3)}  # token ids of '0', '1', '2'
        logs01.append((mean[1] / mean[2]).log())
        logs02.append((mean[1] / mean[3]).log())
    res = measured_attention_ratios(model, data)
    assert torch.allclose(res.w01[0].double(), torch.stack(logs01).mean(0).exp(), rtol=1e-4)
    assert torch.allclose(res.w02[0].double(), torch.stack(logs02).mean(0).exp(), rtol=1e-4)


def test_handbuilt_heads_ratios(small_task_data):
    model = attention_preference_model([{"0": 0.0, "1": 0.0}, {"0": 0.0}, {"0": 1.0, "1": 0.0, "2": -2.0}])
    w01, w02 = exact_attention_ratios(model)
    assert w01[0, 0].item() == 1.0 and math.isinf(w02[0, 0].item())
    assert math.isinf(w01[0, 1].item()) and math.isinf(w02[0, 1].item())
    assert w01[0, 2].item() == pytest.approx(math.e, rel=1e-6) and w02[0, 2].item() == pytest.approx(
        math.exp(3), rel=1e-6
    )
    res = measured_attention_ratios(model, small_task_data)
    assert res.w01[0, 0].item() == pytest.approx(1.0, abs=1e-6) and res.w02[0, 0].item() > 1e30
    assert res.w01[0, 2].item() == pytest.approx(math.e, rel=1e-5)
    fig = res.figure(separation=torch.tensor([1.0, 0.5, 0.9]))
    assert fig.layout.xaxis.type == "log" and fig.layout.yaxis.type == "log" and len(fig.data[0].x) == 3


@pytest.fixture(scope="module")
def small_task_data(nm_task):
    return nm_task.dataset("val").select(slice(0, 20))


def test_refusals(nm_task, small_task_data):
    from interp.model import ModelSpec, build_model

    two = build_model(ModelSpec(d_vocab=9, d_vocab_out=8, n_ctx=nm_task.n_ctx, n_layers=2), device="cpu")
    with pytest.raises(ConfigError, match="one-layer"):
        exact_attention_ratios(two)
    pos = build_model(ModelSpec(d_vocab=9, d_vocab_out=8, n_ctx=nm_task.n_ctx, positional="standard"), device="cpu")
    with pytest.raises(ConfigError, match="positional"):
        exact_attention_ratios(pos)
    res = attention_ratios(pos, small_task_data)  # measured still works; exact is left out
    assert res.exact_w01 is None and res.w01.shape == (1, 16)
    with pytest.raises(TaskError, match="lacks"):
        task_token_ids(Vocab(tokens=("a", "b", "0", "1")))
    model = attention_preference_model([{"0": 0.0}])
    with pytest.raises(TaskError, match="repeated-tokens"):
        measured_attention_ratios(model, dataclasses.replace(small_task_data, task="repeated-tokens"))
