"""Every analysis on every kind of attention variant (interp.attention): trained briefly on a small noisy-majority
task as one head, 64 heads with a trained W_O, and two layers with an MLP; each analysis runs, or refuses in one
line where it is undefined (a QK circuit of linear or additive pooling)."""

from __future__ import annotations

import pytest
import torch

from interp.checkpoint import Checkpoint
from interp.errors import ConfigError
from interp.model import ModelSpec
from interp.variants import canonical_attention

VARIANTS = {
    "linear relu": ("linear:relu", "full"),
    "additive": ("additive", "full"),
    "bigbird": ("bigbird:3,1,2", "full"),
    "TL window, low-rank Q/K/V": ("window:4", "lowrank:1"),
    "linear elu, dilated, sparse Q/K/V": ("linear:elu+dilated:2,2", "sparse:0.5"),
}
SHAPES = {
    "1 head": dict(d_model=2, n_heads=1, d_head=2),
    "64 heads, trained W_O": dict(d_model=2, n_heads=64, d_head=2),
    "2 layers with MLP": dict(n_layers=2, attn_only=False, d_model=8, n_heads=4, d_head=2),
}
# The suite and the report of a 64-head model fit 64 + 2016 separators (about a minute here): the default run does
# them for one variant; `-m slow` for every one. Everything else runs on every case by default.
FULL_64 = "bigbird"
CASES = [
    pytest.param(v, s, full, id=f"{v} / {s}" + ("" if full else " (no suite)"), marks=mark)
    for v in VARIANTS
    for s in SHAPES
    for full, mark in (
        [(True, ())] if not s.startswith("64") or v == FULL_64 else [(False, ()), (True, pytest.mark.slow)]
    )
]


@pytest.fixture(scope="module")
def small_task():
    from interp.tasks import get_task

    return get_task(
        "noisy-majority",
        train_size=256,
        val_size=64,
        test_size=64,
        train_lengths=[0, 12],
        val_lengths=[13, 16],
        test_lengths=[17, 20],
    )


@pytest.fixture(scope="module")
def trained(tmp_path_factory, small_task):
    """``get(variant, shape)``: a checkpoint trained for one epoch (cached per module)."""
    from interp.tasks import load_checkpoint
    from interp.training import TrainConfig, train

    tiny_task = small_task
    made = {}

    def get(variant: str, shape: str) -> Checkpoint:
        if (variant, shape) not in made:
            attention, qkv = VARIANTS[variant]
            spec = ModelSpec(**{**tiny_task.default_spec(), **SHAPES[shape], "attention": attention, "qkv": qkv})
            out = tmp_path_factory.mktemp("variant") / "m.safetensors"
            cfg = TrainConfig(epochs=1, batch_size=64, lr=1e-2, warmup_steps=5)
            train(tiny_task, spec, cfg, out, device="cpu", progress=False)
            made[variant, shape] = load_checkpoint(out, device="cpu")
        return made[variant, shape]

    return get


@pytest.mark.slow
@pytest.mark.parametrize("variant,shape,full", CASES)
def test_every_analysis_runs_on_the_variant(trained, variant, shape, full):
    from interp.analyses import (
        activation_patching,
        attention_spectrum,
        composition_scores,
        full_ov_circuit,
        full_qk_circuit,
        head_scores,
        path_patching,
        shapley_values,
        suite_for,
    )
    from interp.analyses.learned_accuracies import learned_accuracy
    from interp.analyses.noisy_majority.corrupt import flip_answer
    from interp.app.report import build_report
    from interp.evaluation import evaluate
    from interp.visualize import attention_view

    ck = trained(variant, shape)
    model, task = ck.model, ck.task
    assert ck.spec.attention == canonical_attention(VARIANTS[variant][0])
    test = task.dataset("test").select(slice(0, 48))
    if full:
        summary = suite_for(task).analyze(ck)  # learned and separation accuracy, attention ratios, pair tables
        assert len(summary.rows) == model.cfg.n_layers * model.cfg.n_heads
    every = [(l, h) for l in range(model.cfg.n_layers) for h in range(model.cfg.n_heads)]
    learned = learned_accuracy(model, test, heads=[[(0, 0)], every], task=task)
    assert learned.accuracy[-1] == pytest.approx(evaluate(model, task, test)["accuracy"])
    heads = [(0, h) for h in range(min(4, model.cfg.n_heads))]
    shapley = shapley_values(model, test, value="learned-accuracy", heads=heads, method="exact", task=task)
    assert torch.isfinite(shapley.shapley).all()
    corrupted = flip_answer(test.select(slice(0, 8)))
    clean = test.select(slice(0, 8))
    for where in ("z", "pattern"):
        patched = activation_patching(model, clean, corrupted=corrupted, metric="logit_diff", where=where, per="head")
        assert patched.to_json()
    if model.cfg.n_layers > 1:
        assert path_patching(model, clean, corrupted=corrupted).to_json()
        comp = composition_scores(model, n_baseline=20)
        pooling = ck.spec.attention.split("+")[0]
        assert bool(torch.isnan(comp.scores("K")[0, :, 1]).all()) == (
            pooling in ("linear:relu", "linear:elu", "additive")
        )
    assert torch.isfinite(head_scores(model, test.tokens[:8]).induction).all()
    assert full_ov_circuit(model, heads="L0H0").dense().isfinite().all()
    if ck.spec.attention.split("+")[0] in ("linear:relu", "linear:elu", "additive"):
        with pytest.raises(ConfigError, match="bilinear q·k score, undefined") as e:
            full_qk_circuit(model, heads="L0H0")
        assert "\n" not in str(e.value)
    else:
        assert full_qk_circuit(model, heads="L0H0").dense().isfinite().all()
    spectrum = attention_spectrum(model, test, task=task, n_inputs=8)
    assert spectrum.accuracy[-1] == pytest.approx(spectrum.full_accuracy)  # full rank: P itself
    masked = any(
        t.split(":")[0] in ("window", "dilated", "global", "random", "bigbird") for t in ck.spec.attention.split("+")
    )
    view = attention_view(model, test.tokens[0], vocab=task.vocab)
    assert (view.holes is not None and bool(view.holes.any())) == masked
    if not full:
        return
    html = build_report(ck, progress=False).html()  # model card, suite sections, spectrum, attention views
    assert "Attention spectrum" in html and "free Q/K/V entries per layer" in html
    assert ('"negativeColor": "#8a8f98"' in html) == masked  # the holes of a sparse pattern, drawn grey
