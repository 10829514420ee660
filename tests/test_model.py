"""Model specs -> HookedTransformer, the exact query-restricted forward, and the minimal §5.3 transformer."""

import math

import pytest
import torch

from interp.analyses.noisy_majority.handbuilt import minimal_majority_transformer
from interp.errors import ConfigError
from interp.evaluation import evaluate
from interp.model import ModelSpec, build_model
from interp.query_forward import logits_at, supports_query_forward
from interp.tasks.noisy_majority import make_sentences


def _randomise(model, scale=0.5, seed=0):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            if p.requires_grad:
                p.add_(torch.randn(p.shape, generator=g) * scale)


def test_seed_shape_is_config_plus_frozen_parameters(nm_task):
    from transformer_lens import HookedTransformer

    model = build_model(ModelSpec(**nm_task.default_spec()), device="cpu")
    assert type(model) is HookedTransformer
    assert model.cfg.attn_only and model.cfg.n_layers == 1 and model.cfg.normalization_type is None
    assert not model.W_pos.requires_grad and torch.count_nonzero(model.W_pos) == 0
    eye = model.W_O[0].reshape(32, 32)
    assert not model.blocks[0].attn.W_O.requires_grad and torch.equal(eye, torch.eye(32))
    for name in ("b_Q", "b_K", "b_V", "b_O"):
        p = getattr(model.blocks[0].attn, name)
        assert not p.requires_grad and torch.count_nonzero(p) == 0
    assert model.unembed.b_U.requires_grad
    assert model.cfg.d_vocab == 9 and model.cfg.d_vocab_out == 8


def test_identity_output_matrix_routes_each_head_to_its_own_dimensions(nm_task):
    model = build_model(ModelSpec(**nm_task.default_spec()), device="cpu")
    _randomise(model)
    data = make_sentences([[0, 1, 2, 2, 1]])
    _, cache = model.run_with_cache(data.tokens)
    z = cache["z", 0]  # [1, pos, 16, 2]
    assert torch.allclose(cache["attn_out", 0], z.reshape(1, z.shape[1], 32), atol=1e-6)


def test_learned_output_matrix_and_shape_checks(nm_task):
    spec = ModelSpec(**{**nm_task.default_spec(), "d_model": 2, "n_heads": 64, "d_head": 2, "output_matrix": "learned"})
    model = build_model(spec, device="cpu")
    assert model.blocks[0].attn.W_O.requires_grad and model.W_O.shape == (1, 64, 2, 2)
    auto = ModelSpec(**{**nm_task.default_spec(), "d_model": 2, "n_heads": 64, "d_head": 2})  # unset: the rule
    assert (
        auto.output_matrix is None and auto.w_o == "learned" and ModelSpec(**nm_task.default_spec()).w_o == "identity"
    )
    with pytest.raises(ConfigError, match="n_heads \\* d_head == d_model"):
        ModelSpec(**{**nm_task.default_spec(), "d_model": 2, "n_heads": 64, "d_head": 2, "output_matrix": "identity"})
    with pytest.raises(ConfigError, match="positional"):
        ModelSpec(**{**nm_task.default_spec(), "positional": "sinusoidal"})
    with pytest.raises(ConfigError, match="d_model must be a positive integer"):
        ModelSpec(**{**nm_task.default_spec(), "d_model": 0})


def test_building_does_not_disturb_the_global_rng(nm_task):
    torch.manual_seed(123)
    expected = torch.rand(3)
    torch.manual_seed(123)
    build_model(ModelSpec(**nm_task.default_spec()), device="cpu")
    assert torch.equal(torch.rand(3), expected)


@pytest.mark.parametrize(
    "overrides",
    [
        {},
        {"attn_bias": True, "output_matrix": "learned"},
        {"normalization": "LN", "positional": "standard", "attn_bias": True},
        {"d_model": 2, "n_heads": 64, "d_head": 2, "output_matrix": "learned"},
    ],
)
def test_query_restricted_forward_equals_the_hooked_transformer(nm_task, overrides):
    model = build_model(ModelSpec(**{**nm_task.default_spec(), **overrides}), device="cpu")
    _randomise(model)
    assert supports_query_forward(model)
    data = nm_task.dataset("val").select(slice(0, 40))
    qpos = torch.stack([data.answer_pos, data.answer_pos + 1], 1)
    with torch.no_grad():
        full = model(data.tokens)[torch.arange(40)[:, None], qpos]
        fast = logits_at(model, data.tokens, qpos)
    assert torch.allclose(fast, full, atol=1e-5, rtol=1e-5)


@pytest.mark.slow
def test_fast_evaluation_equals_full_forward_evaluation(nm_task):
    model = build_model(ModelSpec(**nm_task.default_spec()), device="cpu")
    _randomise(model, scale=1.0)
    data = nm_task.dataset("test").select(slice(0, 120))
    fast, full = evaluate(model, nm_task, data), evaluate(model, nm_task, data, full_forward=True)
    assert fast["accuracy"] == full["accuracy"] and fast["eos_accuracy"] == full["eos_accuracy"]
    assert math.isclose(fast["loss"], full["loss"], rel_tol=1e-5)


def test_two_layer_models_are_not_given_the_one_layer_shortcut(nm_task):
    model = build_model(ModelSpec(**{**nm_task.default_spec(), "n_layers": 2}), device="cpu")
    assert not supports_query_forward(model)


@pytest.fixture(scope="module")
def minimal(nm_task):
    return minimal_majority_transformer(nm_task, device="cpu")


class TestMinimalTransformer:
    """Fraknói 2024, §5.3: d_model = d_head = 1, one head, hand-set weights, large N."""

    def test_it_is_a_one_dimensional_hooked_transformer(self, minimal):
        assert (minimal.cfg.d_model, minimal.cfg.d_head, minimal.cfg.n_heads) == (1, 1, 1)
        assert torch.equal(minimal.W_Q.flatten(), torch.ones(1)) and torch.equal(minimal.W_V.flatten(), torch.ones(1))

    @pytest.mark.parametrize("split", ["train", "val", "test"])
    def test_predicts_every_sequence_with_zeros_or_ones(self, minimal, nm_task, split):
        data = nm_task.dataset(split)
        keep = (data.fields["n0"] + data.fields["n1"]) > 0
        metrics = evaluate(minimal, nm_task, data.select(keep))  # fast path: tested equal to the full forward above
        assert metrics["accuracy"] == 1.0 and metrics["eos_accuracy"] == 1.0

    def test_exhaustive_ties_and_near_ties_up_to_200_digits(self, minimal, nm_task):
        seqs = []
        for n0 in range(101):
            for n1 in (n0 - 1, n0, n0 + 1):
                if n1 >= 0 and 0 < n0 + n1 <= 200:
                    for n2 in sorted({0, 200 - n0 - n1}):
                        g = torch.Generator().manual_seed(n0 * 7 + n1)
                        digits = torch.tensor([0] * n0 + [1] * n1 + [2] * n2)[torch.randperm(n0 + n1 + n2, generator=g)]
                        seqs.append(digits)
        metrics = evaluate(minimal, nm_task, make_sentences(seqs), full_forward=True)
        assert metrics["accuracy"] == 1.0 and metrics["eos_accuracy"] == 1.0

    def test_attention_follows_the_seed_formula(self, minimal):
        data = make_sentences([[0, 1, 2, 0]])
        _, cache = minimal.run_with_cache(data.tokens)
        row = cache["pattern", 0][0, 0, int(data.answer_pos[0])]  # '=' query over [BOS] 0 1 2 0 =
        N = 30.0
        weights = torch.tensor([1.0, math.exp(N), math.exp(N + 1), 1.0, math.exp(N), math.e], dtype=torch.float64)
        assert torch.allclose(row[:6].double(), weights / weights.sum(), rtol=1e-5, atol=1e-12)
        assert math.isclose(float(row[1] / row[2]), math.exp(-1), rel_tol=1e-5)  # w01 = e^-1
