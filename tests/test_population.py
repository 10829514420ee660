"""Batched training of many models (interp.population): each model of a population equals the same seed trained
alone by interp.training.train, to float tolerance, in weights and in history; checkpoints are ordinary files."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from safetensors.torch import load_file

from interp.errors import ConfigError
from interp.population import seed_population, train_population
from interp.tasks import load_checkpoint
from interp.training import train

# Tolerances: the batched forward sums in another order than the solo one (einsum with a model axis), so weights
# agree to float32 rounding accumulated over the run, not bit for bit. Measured: 2.4e-7 after 6 epochs.
WEIGHT_ATOL = 2e-5
LOSS_ATOL = 1e-5


def _compare(pop_path, solo_path, pop, solo):
    a, b = load_file(pop_path), load_file(solo_path)
    assert a.keys() == b.keys()
    for name in a:
        if a[name].is_floating_point():
            torch.testing.assert_close(a[name], b[name], atol=WEIGHT_ATOL, rtol=0, equal_nan=True, msg=name)
        else:
            assert torch.equal(a[name], b[name]), name
    assert len(pop["history"]) == len(solo["history"])
    for hp, hs in zip(pop["history"], solo["history"]):
        assert hp["epoch"] == hs["epoch"] and hp["val_accuracy"] == hs["val_accuracy"]
        assert hp["train_loss"] == pytest.approx(hs["train_loss"], abs=LOSS_ATOL)
        assert hp["val_loss"] == pytest.approx(hs["val_loss"], abs=LOSS_ATOL)
    for key in ("best_epoch", "kept_epoch", "epochs_run", "steps", "accuracy"):
        assert pop[key] == solo[key], key


def _population_equals_solo(tmp_path, task, spec, cfg, seeds, head_scorer=None):
    """Train ``seeds`` as one population and each alone; compare them (:func:`_compare`); return (pop, solo) pairs."""
    specs, cfgs = seed_population(task, spec, cfg, seeds)
    outs = [tmp_path / f"pop{s}.safetensors" for s in seeds]
    pops = train_population(task, specs, cfgs, outs, device="cpu", progress=False, head_scorer=head_scorer)
    pairs = []
    for s, sp, c, out, pop in zip(seeds, specs, cfgs, outs, pops):
        solo_out = tmp_path / f"solo{s}.safetensors"
        solo = train(task, sp, c, solo_out, device="cpu", progress=False, head_scorer=head_scorer)
        _compare(out, solo_out, pop, solo)
        pairs.append((pop, solo))
    return pairs


@pytest.mark.slow
@pytest.mark.parametrize("seeds", [[5], [0, 1, 2], list(range(8))], ids=["K=1", "K=3", "K=8"])
def test_each_batched_model_equals_its_seed_trained_alone(tmp_path, tiny_task, tiny_spec, tiny_cfg, seeds):
    pairs = _population_equals_solo(tmp_path, tiny_task, tiny_spec, tiny_cfg(epochs=4 if len(seeds) < 8 else 3), seeds)
    for s, (pop, _solo) in zip(seeds, pairs):
        bookkeeping = {k: v for k, v in pop["population"].items() if k not in ("seconds", "softmax_form_steps")}
        assert bookkeeping == {
            "size": len(seeds),
            "index": seeds.index(s),
            "forward": "positions",
            "compiled": False,
            "resumed_at_epoch": 0,
        }


def test_the_token_count_forward_equals_the_positional_one(tiny_task, tiny_spec):
    """Where dropout does not touch the embedding, attention at a query depends on the query token and the counts
    of the tokens before it: the O(vocab) forward equals the O(pos) one (float32 rounding: atol 1e-5)."""
    from interp.evaluation import target_positions
    from interp.model import build_model
    from interp.population import PARAMS, stacked_count_logits, stacked_logits_at, token_counts
    from interp.query_forward import logits_at

    models = [build_model(tiny_spec.__class__(**{**tiny_spec.to_dict(), "init_seed": s}), device="cpu") for s in (0, 1)]
    for m in models:  # random, larger weights than the initialisation, so attention is far from uniform
        with torch.no_grad():
            for n, p in m.named_parameters():
                if p.requires_grad:
                    p.normal_(0, 1.0, generator=torch.Generator().manual_seed(len(n)))
    P = {n: torch.stack([m.state_dict()[n] for m in models]) for n in PARAMS}
    data = tiny_task.dataset("val").select(slice(0, 50))
    qpos = target_positions(data)
    counted = token_counts(data, models[0].cfg.d_vocab)
    # tokens that never occur before a target ([PAD], [EOS]) are left out of the softmax: exact, they get no attention
    assert set(counted.present.tolist()) == set(data.tokens[:, 0].tolist()) | set(
        data.tokens.gather(1, qpos).flatten().tolist()
    ) | set(range(1, 5))
    assert tiny_task.vocab.pad not in counted.present.tolist()
    scale = float(models[0].blocks[0].attn.attn_scale)
    with torch.no_grad():
        by_counts = stacked_count_logits(
            P, counted.query_tok.expand(2, -1, -1), counted.log_counts.expand(2, -1, -1, -1), counted.present, scale
        )
        by_pos = stacked_logits_at(P, data.tokens.expand(2, -1, -1), qpos.expand(2, -1, -1), scale)
        solo = torch.stack([logits_at(m, data.tokens, qpos) for m in models])
    torch.testing.assert_close(by_pos, solo, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(by_counts, solo, atol=1e-5, rtol=1e-5)


def test_attention_only_dropout_population_equals_solo(tmp_path, tiny_task, tiny_spec, tiny_cfg):
    pairs = _population_equals_solo(tmp_path, tiny_task, tiny_spec, tiny_cfg(epochs=4, dropout_at="attention"), [0, 3])
    assert all(pop["population"]["forward"] == "token counts" for pop, _ in pairs)
    assert load_checkpoint(tmp_path / "pop0.safetensors", device="cpu").training["config"]["dropout_at"] == "attention"


def _three_models(task, spec):
    """Three initialised models of ``spec`` (seeds 0-2) stacked as a population's parameters, the task's validation
    split and the attention scale."""
    from interp.model import build_model
    from interp.population import PARAMS

    models = [build_model(spec.__class__(**{**spec.to_dict(), "init_seed": s}), device="cpu") for s in (0, 1, 2)]
    P = {n: torch.stack([m.state_dict()[n] for m in models]) for n in PARAMS}
    return P, task.dataset("val"), float(models[0].blocks[0].attn.attn_scale), models[0].cfg.d_vocab


@pytest.mark.slow
@pytest.mark.skipif(not shutil.which("g++"), reason="torch.compile on the CPU needs a C++ compiler")
@pytest.mark.parametrize(
    "shape",
    [{}, dict(d_model=2, n_heads=1, d_head=2, output_matrix="identity"), dict(d_model=8, n_heads=64, d_head=2)],
    ids=["4 heads", "1 head", "64 heads, trained W_O"],
)
def test_compiled_validation_equals_the_plain_one(tiny_task, tiny_spec, shape):
    """Validation's token-count predictions compiled (what a compiled population runs every epoch) and plain, in
    all three forms (weights, softmax, grouped), on one head, four and 64 (W_O trained): the same predicted tokens,
    losses equal to float32 rounding (fused kernels sum in another order). Compiled from a copy with its own code
    object: torch keeps graphs per code object, and a limit other tests' shapes exhausted would run the plain
    function and compare it with itself; each call is checked to have compiled a graph of its own."""
    import inspect
    from dataclasses import replace

    from interp.population import (
        NO_NORM,
        _count_predictions,
        _grouped_predictions,
        grouped_rows,
        target_positions,
        token_counts,
    )
    from tests.test_compiled import fresh_code, graphs

    P, data, scale, d_vocab = _three_models(tiny_task, replace(tiny_spec, **shape))
    c = token_counts(data, d_vocab)
    qidx, cnt = (x.expand(3, *x.shape[1:]) for x in c.select(torch.arange(len(data))[None]))
    targets = data.targets.gather(1, target_positions(data))
    args = (P, qidx, cnt, c.queries, c.present, targets, scale, NO_NORM, "softmax")
    compiled = torch.compile(fresh_code(inspect.unwrap(_count_predictions)), dynamic=False)
    for by_weights in (True, False):
        preds, losses = _count_predictions(*args, by_weights=by_weights)
        before = graphs()
        cpreds, closses = compiled(*args, by_weights=by_weights)
        assert graphs() > before  # this form ran compiled, not the plain function
        assert preds.shape == (3, *targets.shape) and torch.equal(preds, cpreds)
        torch.testing.assert_close(closses, losses, rtol=1e-5, atol=1e-6)
    # the grouped form (all models' rows at once), compiled against plain
    order, bounds = grouped_rows(c.query_idx.flatten(), len(c.queries))
    gargs = (P, c.counts.flatten(0, 1)[order], c.queries, c.present, targets.flatten()[order], scale, "softmax")
    preds, losses = _grouped_predictions(*gargs, bounds)
    before = graphs()
    cpreds, closses = torch.compile(fresh_code(inspect.unwrap(_grouped_predictions)), dynamic=False)(*gargs, bounds)
    assert graphs() > before
    assert torch.equal(preds, cpreds)
    torch.testing.assert_close(closses, losses, rtol=1e-5, atol=1e-6)


def _grouped(P, c, targets, scale, pooling="softmax"):
    """:func:`interp.population._grouped_predictions` of token counts ``c``, back in the rows' own order."""
    from interp.population import _grouped_predictions, grouped_rows

    order, bounds = grouped_rows(c.query_idx.flatten(), len(c.queries))
    counts, tgt = c.counts.flatten(0, 1)[order], targets.flatten()[order]
    preds, losses = _grouped_predictions(P, counts, c.queries, c.present, tgt, scale, pooling, bounds)
    back_p, back_l = torch.empty_like(preds), torch.empty_like(losses)
    back_p[:, order], back_l[:, order] = preds, losses
    return back_p.view(-1, *targets.shape), back_l.view(-1, *targets.shape)


@pytest.mark.parametrize(
    "shape",
    [
        {},
        dict(d_model=2, n_heads=1, d_head=2, output_matrix="identity"),
        dict(d_model=8, n_heads=64, d_head=2),
        dict(d_model=32, n_heads=16, d_head=2, output_matrix="identity"),
        dict(attention="additive"),
    ],
    ids=["4 heads", "1 head", "64 heads, trained W_O", "d32, 16 heads (Table 1)", "additive pooling"],
)
def test_grouped_validation_equals_each_models_own(tiny_task, tiny_spec, shape):
    """Validation's grouped form (every model's rows at once, sorted by query token, ``W_U^T W_O^T`` formed once)
    against each model's own weights form and against the softmax form (the exponentials per query, nothing
    rearranged): the same predicted tokens, losses equal to float32 rounding (products reassociated: rtol 1e-5,
    atol 1e-6, the tolerance of the compiled-validation test). The weights are sharpened (W_Q, W_K, W_E, W_U x 3)
    so that the models predict different tokens for different rows. And ``_val_metrics`` gives the same metrics
    either way (the grouped form switched off by ``GROUPED_QUERIES = 0``)."""
    from dataclasses import replace

    import interp.population as pop
    from interp.attention import extra_parameters
    from interp.model import build_model

    spec = replace(tiny_spec, **shape)
    models = [build_model(replace(spec, init_seed=s), device="cpu") for s in (0, 1, 2)]
    names = pop.PARAMS + tuple(extra_parameters(models[0]))
    sharpen = ("blocks.0.attn.W_Q", "blocks.0.attn.W_K", "embed.W_E", "unembed.W_U")
    P = {n: torch.stack([m.state_dict()[n] for m in models]) * (3 if n in sharpen else 1) for n in names}
    data, scale, pooling = tiny_task.dataset("val"), float(models[0].blocks[0].attn.attn_scale), "softmax"
    if "attention" in shape:
        pooling = shape["attention"]
    c = pop.token_counts(data, models[0].cfg.d_vocab)
    assert pop.weights_are_exact(P, c.queries, c.present, c.always, scale, pop.NO_NORM, pooling)
    targets = data.targets.gather(1, pop.target_positions(data))
    qidx, cnt = (x.expand(3, *x.shape[1:]) for x in c.select(torch.arange(len(data))[None]))
    args = (P, qidx, cnt, c.queries, c.present, targets, scale, pop.NO_NORM, pooling)
    preds, losses = _grouped(P, c, targets, scale, pooling)
    assert preds.shape == (3, *targets.shape) and len(preds.unique()) > 1
    for by_weights in (True, False):
        own_preds, own_losses = pop._count_predictions(*args, by_weights=by_weights)
        assert torch.equal(preds, own_preds)
        torch.testing.assert_close(losses, own_losses, rtol=1e-5, atol=1e-6)
    grouped = pop._val_metrics(tiny_task, P, data, scale, c, pooling=pooling)
    before, pop.GROUPED_QUERIES = pop.GROUPED_QUERIES, 0
    try:
        own = pop._val_metrics(tiny_task, P, data, scale, c, pooling=pooling)
    finally:
        pop.GROUPED_QUERIES = before
    for a, b in zip(grouped, own):
        assert a.keys() == b.keys() and a["accuracy"] == b["accuracy"] and a["eos_accuracy"] == b["eos_accuracy"]
        assert a["loss"] == pytest.approx(b["loss"], rel=1e-5)


@pytest.mark.slow
@pytest.mark.timeout(1800)  # compiling the prefix-count step from an empty inductor cache: 319 s on a loaded core
@pytest.mark.skipif(not shutil.which("g++"), reason="torch.compile on the CPU needs a C++ compiler")
@pytest.mark.parametrize(
    "shape, recipe, forward",
    [
        ({}, dict(dropout_at="attention"), "token counts"),
        (
            dict(d_model=32, n_heads=16, d_head=2, output_matrix="identity"),
            dict(dropout_at="attention"),
            "token counts",
        ),
        ({}, dict(dropout_at="embedding+attention"), "positions"),
        ({}, dict(dropout_at="attention", objective="lm", dropout_rng="counter"), "prefix counts"),
        (
            dict(d_model=2, n_heads=1, d_head=2, output_matrix="identity"),
            dict(dropout_at="embedding+attention"),
            "positions",
        ),
        (
            dict(d_model=8, n_heads=64, d_head=2, output_matrix="learned"),
            dict(dropout_at="embedding+attention"),
            "positions",
        ),
        (
            dict(d_model=32, n_heads=16, d_head=2, output_matrix="identity"),
            dict(dropout_at="attention", halving="mask-all-but-one"),
            "token counts",
        ),
    ],
    ids=[
        "d8",
        "d32, 16 heads",
        "d8, per position",
        "d8, prefix counts",
        "1 head, per position",
        "64 heads, trained W_O, per position",
        "d32, 16 heads narrowed to one (mask-all-but-one)",
    ],
)
def test_compiled_population_equals_eager(tmp_path, tiny_task, tiny_spec, tiny_cfg, shape, recipe, forward):
    """compile=True (torch.compile of the training step) trains the same models as the eager code, to float
    rounding (fused kernels sum in another order): the solo-equality tolerances. The token-count step at d_model 8
    and at Table 1's d_model 32, on both sides of ROW_GRAD_D_MODEL (the unembedding's two backward layouts); the
    per-position step (dropout on the embedding), whose length-sorted runs change width every call; the prefix-count
    step (the language-model objective; compiled without duck sizing it trained to NaN weights); the per-position
    step on one head and on 64 heads with a trained W_O (K x n_heads is a size of the step's tensors, which the
    compiled graph must not confuse with a run's width); the token-count step narrowed to each model's one head
    (halving's masking strategy: one head from the first step)."""
    from dataclasses import replace

    seeds = [0, 3]
    spec = replace(tiny_spec, **shape)
    specs, cfgs = seed_population(tiny_task, spec, tiny_cfg(epochs=2, **recipe), seeds)
    eager = train_population(
        tiny_task, specs, cfgs, [tmp_path / f"e{s}.safetensors" for s in seeds], device="cpu", progress=False
    )
    comp = train_population(
        tiny_task,
        specs,
        cfgs,
        [tmp_path / f"c{s}.safetensors" for s in seeds],
        device="cpu",
        progress=False,
        compile=True,
    )
    for s, e, c in zip(seeds, eager, comp):
        assert c["population"]["compiled"] and not e["population"]["compiled"]
        assert c["population"]["forward"] == e["population"]["forward"] == forward
        _compare(tmp_path / f"c{s}.safetensors", tmp_path / f"e{s}.safetensors", c, e)


@pytest.mark.slow
def test_learning_rates_patience_and_keep_last_per_model(tmp_path, tiny_task, tiny_spec, tiny_cfg):
    from dataclasses import replace

    cfgs = [tiny_cfg(epochs=5, lr=lr, patience=2, keep=keep) for lr, keep in ((1e-2, "best"), (3e-3, "best"))]
    specs = [replace(tiny_spec, init_seed=c.seed) for c in cfgs]
    outs = [tmp_path / "a.safetensors", tmp_path / "b.safetensors"]
    pops = train_population(tiny_task, specs, cfgs, outs, device="cpu", progress=False)
    for spec, c, out, pop in zip(specs, cfgs, outs, pops):
        solo_out = tmp_path / f"solo-{out.name}"
        _compare(out, solo_out, pop, train(tiny_task, spec, c, solo_out, device="cpu", progress=False))
    last = [tiny_cfg(epochs=3, keep="last")]
    p = train_population(tiny_task, [tiny_spec], last, [tmp_path / "l.safetensors"], device="cpu", progress=False)
    _compare(
        tmp_path / "l.safetensors",
        tmp_path / "sl.safetensors",
        p[0],
        train(tiny_task, tiny_spec, last[0], tmp_path / "sl.safetensors", device="cpu", progress=False),
    )


@pytest.mark.slow
def test_population_checkpoints_are_ordinary(tmp_path, tiny_task, tiny_spec, tiny_cfg):
    import subprocess
    import sys

    specs, cfgs = seed_population(tiny_task, tiny_spec, tiny_cfg(epochs=1), [0, 1])
    outs = [tmp_path / "m0.safetensors", tmp_path / "m1.safetensors"]
    train_population(tiny_task, specs, cfgs, outs, device="cpu", progress=False)
    ckpt = load_checkpoint(outs[1], device="cpu")
    assert ckpt.training["population"]["size"] == 2 and ckpt.spec.init_seed == 1
    tokens = tiny_task.dataset("test").tokens[:3]
    code = (
        "import json,sys,torch; from safetensors import safe_open; from safetensors.torch import load_file; "
        "from transformer_lens import HookedTransformer, HookedTransformerConfig; p=sys.argv[1]; "
        "cfg=json.loads(safe_open(p,'pt').metadata()['tl_config']); "
        "m=HookedTransformer(HookedTransformerConfig(**cfg)); "
        "m.load_state_dict(load_file(p)); t=torch.tensor(json.loads(sys.argv[2])); "
        "print(json.dumps(m(t).tolist()))"
    )
    res = subprocess.run(
        [sys.executable, "-c", code, str(outs[1]), json.dumps(tokens.tolist())],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        check=True,
    )
    with torch.no_grad():
        torch.testing.assert_close(torch.tensor(json.loads(res.stdout)), ckpt.model(tokens), atol=1e-6, rtol=0)


def test_mixed_populations_are_refused(tmp_path, tiny_task, tiny_spec, tiny_cfg):
    from dataclasses import replace

    with pytest.raises(ConfigError, match="d_model"):
        train_population(
            tiny_task,
            [tiny_spec, replace(tiny_spec, d_model=16, init_seed=1)],
            [tiny_cfg(), tiny_cfg()],
            [tmp_path / "a.safetensors", tmp_path / "b.safetensors"],
            device="cpu",
            progress=False,
        )
    with pytest.raises(ConfigError, match="batch_size"):
        train_population(
            tiny_task,
            [tiny_spec, tiny_spec],
            [tiny_cfg(), tiny_cfg(batch_size=32)],
            [tmp_path / "a.safetensors", tmp_path / "b.safetensors"],
            device="cpu",
            progress=False,
        )
    with pytest.raises(ConfigError, match="one-layer"):
        two = replace(tiny_spec, n_layers=2)
        train_population(tiny_task, [two], [tiny_cfg()], [tmp_path / "a.safetensors"], device="cpu", progress=False)
    with pytest.raises(ConfigError, match="distinct"):
        train_population(
            tiny_task,
            [tiny_spec, tiny_spec],
            [tiny_cfg(), tiny_cfg(seed=1)],
            [tmp_path / "a.safetensors"] * 2,
            device="cpu",
            progress=False,
        )
    assert not list(tmp_path.iterdir())  # nothing written


@pytest.mark.parametrize(
    "spec_kw, error, match",
    [
        (dict(d_vocab_out=None), "TaskError", "does not fit task"),
        (dict(d_vocab=5), "TaskError", "does not fit task"),
        (dict(n_ctx=10), "TokenError", "'train' split .* longer than the model's context"),
    ],
    ids=["output vocabulary", "input vocabulary", "context"],
)
def test_a_model_that_does_not_fit_the_task_is_refused_before_training(
    tmp_path, tiny_task, tiny_spec, tiny_cfg, spec_kw, error, match
):
    """Solo and population alike: a clear error before the first step, not a checkpoint error after every epoch
    (an output vocabulary of 9 for 8 outputs) or an index error deep in torch (a vocabulary or a context too small)."""
    from dataclasses import replace

    import interp.errors

    spec, cfg = replace(tiny_spec, **spec_kw), tiny_cfg(epochs=50)
    with pytest.raises(getattr(interp.errors, error), match=match):
        train(tiny_task, spec, cfg, tmp_path / "solo.safetensors", device="cpu", progress=False, snapshot_every=1)
    specs, cfgs = seed_population(tiny_task, spec, cfg, [0, 1])
    outs = [tmp_path / "a.safetensors", tmp_path / "b.safetensors"]
    with pytest.raises(getattr(interp.errors, error), match=match):
        train_population(tiny_task, specs, cfgs, outs, device="cpu", progress=False, snapshot_every=1)
    assert not list(tmp_path.rglob("*.safetensors"))  # no epoch ran: not even a snapshot


def _short_task(train_size: int = 64, **lengths):
    """noisy-majority with small splits; ``lengths`` overrides a split's sentence lengths (digits)."""
    from interp.tasks import get_task

    kw = {"train_lengths": [0, 20], "val_lengths": [21, 30], "test_lengths": [31, 40], **lengths}
    return get_task("noisy-majority", train_size=train_size, val_size=16, test_size=16, **kw)


def test_a_split_of_short_sentences(tmp_path, tiny_spec, tiny_cfg):
    """Sentences of 0-3 digits: two targets in at most 7 tokens, more than a quarter of the padded width. In the
    test split they are evaluated exactly (the population equals its solo runs; before, it trained every epoch and
    then failed in the final evaluation). In the training split the solo run trains through TransformerLens'
    forward, whose torch dropout masks a population does not draw: refused before the first step (before, the
    population trained other models than the solo runs, 0.15 apart, and failed at the end)."""
    cfg = tiny_cfg(epochs=2, batch_size=8)
    _population_equals_solo(tmp_path, _short_task(test_lengths=[0, 3]), tiny_spec, cfg, [0, 1])
    short = _short_task(train_lengths=[0, 3])
    specs, cfgs = seed_population(short, tiny_spec, cfg, [0])
    with pytest.raises(ConfigError, match="a quarter of the training split"):
        train_population(short, specs, cfgs, [tmp_path / "short.safetensors"], device="cpu", progress=False)
    assert not (tmp_path / "short.safetensors").exists()


def test_evaluation_in_chunks_equals_one_chunk(tiny_task, tiny_spec):
    """Validation of a population runs in chunks of rows (bounded memory); the chunking changes nothing."""
    from interp.population import _val_metrics, token_counts

    P, data, scale, d_vocab = _three_models(tiny_task, tiny_spec)
    counted = token_counts(data, d_vocab)
    for c in (None, counted):
        whole = _val_metrics(tiny_task, P, data, scale, c)
        chunked = _val_metrics(tiny_task, P, data, scale, c, budget=1)  # one row per chunk
        for a, b in zip(whole, chunked):
            assert a.keys() == b.keys() and a["accuracy"] == b["accuracy"]
            assert a["loss"] == pytest.approx(b["loss"], abs=1e-6)


@pytest.mark.parametrize("narrow", [False, True], ids=["4 heads", "narrowed to one head"])
@pytest.mark.parametrize("strategy", ["random", "mask-all-but-one", "svc"])
def test_halving_population_equals_halving_runs_alone(
    tmp_path, tiny_task, tiny_spec, tiny_cfg, strategy, narrow, monkeypatch
):
    """Halving inside a population: each model keeps its own head mask and schedule, and ends where the same seed's
    halving run trained alone ends (weights, history, the halving steps and their scores, the kept epoch). The
    threshold is low so that 4 heads halve to 2 and to 1 within the few epochs; svc scores the heads of each
    model's current weights with analyses.halving.scorer, as the solo run does. Narrowed: the population's step
    leaves the masked heads out once every model is down to one head (from the first step under masking), as it
    does from NARROW_MIN_HEADS heads on."""
    from interp import population
    from interp.analyses.halving import scorer

    if narrow:
        monkeypatch.setattr(population, "NARROW_MIN_HEADS", 2)

    cfg = tiny_cfg(epochs=4, halving=strategy, halving_threshold=0.5, dropout_at="attention")
    head_scorer = scorer(strategy) if strategy == "svc" else None
    pairs = _population_equals_solo(tmp_path, tiny_task, tiny_spec, cfg, [0, 2, 5], head_scorer)
    assert any(len(pop["halving"]["steps"]) > 0 for pop, _ in pairs)
    for pop, solo in pairs:
        hp, hs = pop["halving"], solo["halving"]
        assert [st["kept"] for st in hp["steps"]] == [st["kept"] for st in hs["steps"]]
        assert [st["epoch"] for st in hp["steps"]] == [st["epoch"] for st in hs["steps"]]
        for a, b in zip(hp["steps"], hs["steps"]):
            assert a["scores"].keys() == b["scores"].keys()
            assert all(a["scores"][h] == pytest.approx(b["scores"][h], abs=1e-6) for h in a["scores"])
        assert (hp["active"], hp["success"], hp["score"]) == (hs["active"], hs["success"], hs["score"])
        assert [h.get("kept_heads") for h in pop["history"]] == [h.get("kept_heads") for h in solo["history"]]
        assert pop["kept"] == solo["kept"]


@pytest.mark.parametrize(
    "shape",
    [{}, dict(d_model=32, n_heads=16, d_head=2, output_matrix="identity"), dict(d_model=8, n_heads=64, d_head=2)],
    ids=["4 heads, identity W_O", "d32, 16 heads (Table 1)", "64 heads, trained W_O"],
)
def test_a_step_narrowed_to_each_models_one_head_equals_the_full_step(tiny_task, tiny_spec, shape, monkeypatch):
    """Where every model of a population is down to one head, the token-count step runs on that head alone
    (``narrow_heads``). Against the full step on the masked parameters (every other head's Q/K/V weights zero,
    as halving leaves them), both forms (weights and softmax): the same losses (rtol 1e-6: the products have fewer
    zero terms), the same gradient of every parameter of the kept heads and of the rest of the model, and none in
    the masked heads. (The full step gives a masked head's W_V a gradient where W_O is the fixed identity, since
    its zero output still reaches the residual; masking zeroes those weights again after every update, so they never
    move either way.)"""
    from dataclasses import replace

    import interp.population as pop
    from interp.model import build_model

    spec = replace(tiny_spec, **shape)
    models = [build_model(replace(spec, init_seed=s), device="cpu") for s in (0, 1, 2)]
    P0 = {n: torch.stack([m.state_dict()[n] for m in models]).float() for n in pop.PARAMS}
    H = spec.n_heads
    head_on = torch.zeros(3, H)
    head_on[torch.arange(3), torch.tensor([0, H - 1, H // 2])] = 1
    pop._mask_heads(P0, ["W_Q", "W_K", "W_V", "b_Q", "b_K", "b_V"], head_on)
    assert (pop.one_head_each(head_on) is None) == (H < pop.NARROW_MIN_HEADS)
    monkeypatch.setattr(pop, "NARROW_MIN_HEADS", 2)  # the step narrowed at every head count here
    one = pop.one_head_each(head_on)
    assert one.flatten().tolist() == [0, H - 1, H // 2]
    assert pop.one_head_each(torch.ones(3, H)) is None and pop.one_head_each(torch.ones(3, 1)) is None
    two = head_on.clone()
    two[0, 1] = 1
    assert pop.one_head_each(two) is None  # one model still has two heads: nothing narrows
    data, scale = tiny_task.dataset("train"), float(models[0].blocks[0].attn.attn_scale)
    c = pop.token_counts(data, models[0].cfg.d_vocab)
    idx = torch.stack([torch.arange(64), torch.arange(64, 128), torch.arange(128, 192)])
    qidx, cnt = c.select(idx)
    targets = data.targets.gather(1, pop.target_positions(data))[idx]
    identity = models[0].cfg.d_model == H * spec.d_head and spec.output_matrix == "identity"
    for always in (c.always, None):  # the weights form, then the softmax form
        runs = []
        for narrowed in (False, True):
            P = {n: v.clone().requires_grad_(n in ("embed.W_E", "unembed.W_U") or "attn" in n) for n, v in P0.items()}
            Q = pop.narrow_heads(P, one) if narrowed else P
            out = pop._count_losses(
                Q,
                qidx,
                cnt,
                c.queries,
                c.present,
                scale,
                None,
                targets,
                identity_w_o=identity and not narrowed,
                always=always,
            )
            losses = out[0] if always is not None else out
            losses.sum().backward()
            runs.append((losses.detach(), {n: v.grad for n, v in P.items() if v.grad is not None}))
        (full, full_grads), (narrow, narrow_grads) = runs
        torch.testing.assert_close(narrow, full, rtol=1e-6, atol=0)
        assert narrow_grads.keys() >= full_grads.keys()
        for n, g in narrow_grads.items():
            if n.split(".")[-1] not in pop.HEAD_PARAMS:
                torch.testing.assert_close(g, full_grads[n], rtol=1e-5, atol=1e-7)
                continue
            on = (head_on > 0).view(3, H, *[1] * (g.ndim - 2)).expand_as(g)
            assert torch.equal(g[~on], torch.zeros_like(g[~on]))  # the masked heads: left out, no gradient
            if n in full_grads:  # (a fixed identity W_O has none in the full step, which does not multiply by it)
                torch.testing.assert_close(g[on], full_grads[n][on], rtol=1e-5, atol=1e-7)


def test_halving_population_needs_a_scorer(tmp_path, tiny_task, tiny_spec, tiny_cfg):
    specs, cfgs = seed_population(tiny_task, tiny_spec, tiny_cfg(epochs=1, halving="svc"), [0, 1])
    with pytest.raises(ConfigError, match="needs a head scorer"):
        train_population(
            tiny_task,
            specs,
            cfgs,
            [tmp_path / "a.safetensors", tmp_path / "b.safetensors"],
            device="cpu",
            progress=False,
        )


_KILLED_POPULATION = """
import sys, torch
from pathlib import Path
torch.set_num_threads(1)
from interp.tasks import get_task
from interp.model import ModelSpec
from interp.population import seed_population, train_population
from interp.training import TrainConfig
task = get_task("noisy-majority", train_size=512, val_size=128, test_size=128, train_lengths=[0, 20],
                val_lengths=[21, 30], test_lengths=[31, 40])
spec = ModelSpec(**{**task.default_spec(), "d_model": 8, "n_heads": 4, "d_head": 2})
cfg = TrainConfig(epochs=int(sys.argv[2]), batch_size=64, lr=1e-2, warmup_steps=10, save_every=1,
                  halving="random", halving_threshold=0.9, dropout_at=sys.argv[3])
d = Path(sys.argv[1])
specs, cfgs = seed_population(task, spec, cfg, [0, 1, 2])
train_population(task, specs, cfgs, [d / f"m{s}.safetensors" for s in range(3)], device="cpu", progress=False,
                 resume_file=d / "population.resume")
"""


@pytest.mark.slow
@pytest.mark.parametrize("dropout_at", ["attention", "embedding+attention"])
def test_population_killed_with_sigkill_resumes_to_the_same_models(tmp_path, dropout_at):
    """A population killed with SIGKILL mid-training continues from its resume file (weights, Adam moments, random
    generators, best states, histories, halving schedules) to the models an uninterrupted run trains."""
    import os
    import signal
    import subprocess
    import sys
    import time
    from pathlib import Path

    from safetensors import safe_open

    root = Path(__file__).resolve().parents[1]
    script = tmp_path / "pop.py"
    script.write_text(_KILLED_POPULATION)
    env = {**os.environ, "PYTHONPATH": str(root), "OMP_NUM_THREADS": "1"}
    killed, whole = tmp_path / "killed", tmp_path / "whole"
    killed.mkdir()
    whole.mkdir()
    epochs = "12"
    proc = subprocess.Popen(
        [sys.executable, str(script), str(killed), epochs, dropout_at], env=env, stderr=subprocess.PIPE
    )
    # the uninterrupted run, alongside (one thread each: the same numbers as run alone)
    uninterrupted = subprocess.Popen([sys.executable, str(script), str(whole), epochs, dropout_at], env=env)
    resume, deadline, at = killed / "population.resume", time.time() + 300, 0
    while time.time() < deadline and at < 3:
        assert proc.poll() is None, proc.stderr.read().decode()[-800:]
        if resume.is_file():
            try:
                with safe_open(str(resume), "pt") as f:
                    at = json.loads(f.metadata()["progress"])["epoch"]
            except Exception:  # replaced while being read: try again
                pass
        time.sleep(0.02)
    proc.send_signal(signal.SIGKILL)
    proc.wait(30)
    assert resume.is_file() and not any(killed.glob("m*.safetensors")), "killed before the end"
    assert subprocess.run([sys.executable, str(script), str(killed), epochs, dropout_at], env=env).returncode == 0
    assert uninterrupted.wait(300) == 0
    assert not resume.is_file()  # removed once the checkpoints are written
    for s in range(3):
        a = load_checkpoint(killed / f"m{s}.safetensors", device="cpu").training
        b = load_checkpoint(whole / f"m{s}.safetensors", device="cpu").training
        assert a["population"]["resumed_at_epoch"] >= 3 and b["population"]["resumed_at_epoch"] == 0
        wa, wb = load_file(killed / f"m{s}.safetensors"), load_file(whole / f"m{s}.safetensors")
        for name in wa:  # the same computation, on the same thread count: equal bit for bit
            assert torch.equal(wa[name], wb[name]), name
        assert a["history"] == b["history"] and a["halving"] == b["halving"] and a["kept_epoch"] == b["kept_epoch"]


def test_a_resume_file_does_not_depend_on_the_flat_buffers_layout(tmp_path, tiny_task, tiny_spec, tiny_cfg):
    """Token-count populations keep W_Q, W_K, W_V and W_U in their gradients' memory order in the flat buffer
    (GRADIENT_ORDER); a resume file holds every tensor by name in its usual shape, so a population stopped under the
    row-major layout (as the code before that order kept it) continues under the new one to the models of an
    uninterrupted run, bit for bit."""
    from interp import population

    cfg = tiny_cfg(epochs=6, dropout_at="attention", save_every=3)
    specs, cfgs = seed_population(tiny_task, tiny_spec, cfg, [0, 1])
    whole, cut = tmp_path / "whole", tmp_path / "cut"
    whole.mkdir(), cut.mkdir()
    kw = dict(device="cpu", progress=False)
    train_population(tiny_task, specs, cfgs, [whole / f"m{s}.safetensors" for s in (0, 1)], **kw)

    class Stop(Exception):
        pass

    real_end, real_orders = population._Population.end_epoch, population.GRADIENT_ORDER

    def stop_at_epoch_5(self, *a, **k):
        assert all(order == tuple(range(len(shape))) for _, _, shape, order in self.views.values())  # row-major
        real_end(self, *a, **k)
        if self.epoch == 5:
            raise Stop

    outs, resume = [cut / f"m{s}.safetensors" for s in (0, 1)], cut / "pop.resume"
    population._Population.end_epoch, population.GRADIENT_ORDER = stop_at_epoch_5, {}
    try:
        with pytest.raises(Stop):
            train_population(tiny_task, specs, cfgs, outs, resume_file=resume, **kw)
    finally:
        population._Population.end_epoch, population.GRADIENT_ORDER = real_end, real_orders
    assert resume.is_file()
    pop = population._Population(tiny_task, specs, cfgs, "cpu", None)
    assert pop.forward == "token counts"
    assert pop.views["blocks.0.attn.W_Q"][3] == (1, 0, 2) and pop.views["unembed.W_U"][3] == (1, 0)
    train_population(tiny_task, specs, cfgs, outs, resume_file=resume, **kw)
    for s in (0, 1):
        assert load_checkpoint(outs[s], device="cpu").training["population"]["resumed_at_epoch"] == 3
        wa, wb = load_file(outs[s]), load_file(whole / f"m{s}.safetensors")
        for name in wa:
            assert torch.equal(wa[name], wb[name]), name


def test_population_resume_file_of_another_population_is_refused(tmp_path, tiny_task, tiny_spec, tiny_cfg):
    from interp.errors import CheckpointError

    specs, _cfgs = seed_population(
        tiny_task, tiny_spec, tiny_cfg(epochs=3, save_every=1, dropout_at="attention"), [0, 1]
    )
    resume = tmp_path / "p.resume"
    specs2, cfgs2 = seed_population(
        tiny_task, tiny_spec, tiny_cfg(epochs=3, save_every=1, dropout_at="attention"), [0, 1, 2]
    )
    import interp.population as pop

    # a resume file written by one population and offered to another
    pop._save_resume(
        resume,
        {
            "task": {"name": tiny_task.name, "params": tiny_task.params()},
            "specs": [s.to_dict() for s in specs],
            "configs": [],
        },
        {},
        {},
    )
    with pytest.raises(CheckpointError, match="belongs to another population"):
        train_population(
            tiny_task,
            specs2,
            cfgs2,
            [tmp_path / f"b{s}.safetensors" for s in range(3)],
            device="cpu",
            progress=False,
            resume_file=resume,
        )
    resume.write_bytes(b"not a safetensors file")
    with pytest.raises(CheckpointError, match="corrupt"):
        train_population(
            tiny_task,
            specs2,
            cfgs2,
            [tmp_path / f"b{s}.safetensors" for s in range(3)],
            device="cpu",
            progress=False,
            resume_file=resume,
        )


@pytest.mark.slow
def test_first_best_keeps_the_first_epoch_at_the_best_validation_accuracy(tmp_path, tiny_task, tiny_spec, tiny_cfg):
    """keep="first-best": ties in validation accuracy go to the earlier epoch (no loss tie-break), in populations as
    in solo runs; the kept epoch is read off the history by a plain loop."""
    cfg = tiny_cfg(epochs=8, keep="first-best", dropout_at="attention")
    for pop, _ in _population_equals_solo(tmp_path, tiny_task, tiny_spec, cfg, [0, 4]):
        accs = [h["val_accuracy"] for h in pop["history"]]
        assert pop["kept"] == "first-best" and pop["kept_epoch"] == accs.index(max(accs)) + 1


@pytest.mark.parametrize(
    "shape",
    [
        dict(d_model=2, n_heads=1, d_head=2, output_matrix="identity"),
        dict(d_model=8, n_heads=64, d_head=2, output_matrix="learned"),
        dict(d_model=32, n_heads=16, d_head=2, output_matrix="identity"),
    ],
    ids=["1 head", "64 heads, trained W_O", "d32, 16 heads"],
)
def test_population_of_one_head_and_of_64_heads_equals_solo(tmp_path, tiny_task, tiny_spec, tiny_cfg, shape):
    """The token-count forward and the halving mask on the shapes at both ends: one head (the thesis's d = 2, a = 1)
    and 64 heads whose W_O is trained (n_heads x d_head != d_model); and Table 1's d = 32 (16 heads), where the
    unembedding's backward writes the residual's gradient N x d_model (ROW_GRAD_D_MODEL)."""
    from dataclasses import replace

    from interp.population import ROW_GRAD_D_MODEL

    assert (shape["d_model"] >= ROW_GRAD_D_MODEL) == (shape["d_model"] == 32)
    spec = replace(tiny_spec, **shape)
    halving = None if shape["n_heads"] == 1 else "random"
    cfg = tiny_cfg(epochs=3, dropout_at="attention", halving=halving, halving_threshold=0.5)
    pairs = _population_equals_solo(tmp_path, tiny_task, spec, cfg, [0, 1])
    for pop, solo in pairs:
        assert pop["population"]["forward"] == "token counts"
        if halving:
            assert pop["halving"]["steps"] == solo["halving"]["steps"] and pop["halving"]["steps"]


@pytest.mark.parametrize(
    "cfg_kw",
    [
        dict(dropout_at="attention"),
        dict(dropout_at="embedding+attention"),
        dict(dropout_at="attention", padding="left"),
        dict(objective="lm", dropout=0.0),
        dict(objective="lm", dropout_at="attention", dropout_rng="counter"),
    ],
    ids=["token counts", "positions", "left padding", "lm (prefix counts)", "lm, counter masks (prefix counts)"],
)
def test_batches_of_one_short_sentence_equal_solo(tmp_path, tiny_spec, tiny_cfg, cfg_kw):
    """Batches of one sentence trimmed to its own length, some of them short enough that their two targets fill
    more than a quarter of the batch: the solo run keeps the forward (and so the shapes of its dropout draws) its
    training split chose, and the population equals it under torch's masks. Before, such a batch went through
    TransformerLens' forward alone, drew masks of another shape, and the models parted by up to 0.43; and under the
    language-model objective a step where no model had a row in one of the prefix forward's blocks crashed."""
    task = _short_task(train_size=24, train_lengths=[0, 6], val_lengths=[0, 6], test_lengths=[0, 6])
    short = task.dataset("train").lengths
    assert int((short < 8).sum()) >= 3  # batches that fail the quarter test on their own
    pairs = _population_equals_solo(tmp_path, task, tiny_spec, tiny_cfg(epochs=2, batch_size=1, **cfg_kw), [0, 1])
    forward = {"embedding+attention": "positions", "attention": "token counts"}[cfg_kw.get("dropout_at", "attention")]
    forward = "prefix counts" if cfg_kw.get("objective") == "lm" else forward
    assert all(pop["population"]["forward"] == forward for pop, _ in pairs)


SHAPES = {
    "1 head": dict(d_model=2, n_heads=1, d_head=2, output_matrix="identity"),
    "64 heads, trained W_O": dict(d_model=8, n_heads=64, d_head=2, output_matrix="learned"),
    "2 layers": dict(n_layers=2),
}


@pytest.mark.parametrize("shape", list(SHAPES))
def test_short_batches_and_unfit_models_on_every_shape(tmp_path, tiny_spec, tiny_cfg, shape):
    """On one head, 64 heads with a trained W_O and two layers: a run trained in batches of one short sentence
    keeps the forward its training split chose (the one-layer models: the query-restricted forward, and their
    population equals them; two layers: TransformerLens' forward, which populations refuse), and a model whose
    context is too short for the task is refused before training."""
    from dataclasses import replace

    from interp.errors import TokenError
    from interp.model import build_model
    from interp.training import solo_forward

    spec = replace(tiny_spec, **SHAPES[shape])
    task = _short_task(train_size=16, train_lengths=[0, 6], val_lengths=[0, 6], test_lengths=[0, 6])
    cfg = tiny_cfg(epochs=1, batch_size=1, dropout_at="attention")
    train_data = task.dataset("train")
    layers = spec.n_layers
    assert solo_forward(build_model(spec, device="cpu"), cfg, train_data) == (
        "query" if layers == 1 else "transformer-lens"
    )
    if layers == 1:
        pairs = _population_equals_solo(tmp_path, task, spec, cfg, [0, 1])
        assert all(pop["population"]["forward"] == "token counts" for pop, _ in pairs)
    else:
        two = train(task, spec, cfg, tmp_path / "two.safetensors", device="cpu", progress=False)
        assert two["steps"] == len(train_data) and (tmp_path / "two.safetensors").exists()
        with pytest.raises(ConfigError, match="one-layer"):
            train_population(task, [spec], [cfg], [tmp_path / "pop.safetensors"], device="cpu", progress=False)
    with pytest.raises(TokenError, match="longer than the model's context"):
        train(task, replace(spec, n_ctx=4), cfg, tmp_path / "short_ctx.safetensors", device="cpu", progress=False)
    assert not (tmp_path / "short_ctx.safetensors").exists()


@pytest.mark.parametrize("rng", ["torch", "counter"])
@pytest.mark.parametrize("shape", ["1 head", "64 heads, trained W_O"])
def test_per_position_populations_on_every_shape(tmp_path, tiny_spec, tiny_cfg, shape, rng):
    """Dropout on the embedding (the per-position forward: torch masks written into buffers kept from step to step,
    counter masks hashed with their unit axis inside the compiled loop) on one head and on 64 heads with a trained
    W_O: each model of a population equals its solo run, over steps of different widths and a short last batch."""
    from dataclasses import replace

    spec = replace(tiny_spec, **SHAPES[shape])
    cfg = tiny_cfg(epochs=2, batch_size=12, dropout_at="embedding+attention", dropout_rng=rng)
    pairs = _population_equals_solo(tmp_path, _short_task(), spec, cfg, [0, 1])
    assert all(pop["population"]["forward"] == "positions" for pop, _ in pairs)


@pytest.mark.parametrize(
    "shape, dropout_at",
    [("4 heads", "attention"), ("4 heads", "embedding+attention")]
    + [(s, "embedding+attention") for s in ("1 head", "64 heads, trained W_O")],
)
def test_left_padded_language_models_of_different_widths(tmp_path, tiny_spec, tiny_cfg, shape, dropout_at):
    """Left padding under the language-model objective, several batches an epoch: each model's batch is laid out to
    the widest model's, so a narrower model's leading positions are queries with no key of its own. Their softmax
    was NaN and reached every weight through their zero gradient (the population failed saving, after training);
    they now keep finite pads as keys, and each model equals its solo run, on 4 heads, 1 head and 64 heads with a
    trained W_O (two-layer models: populations refuse them, tested above)."""
    from dataclasses import replace

    spec = replace(tiny_spec, **SHAPES.get(shape, {}))
    cfg = tiny_cfg(epochs=2, batch_size=7, padding="left", objective="lm", dropout_at=dropout_at)
    pairs = _population_equals_solo(tmp_path, _short_task(), spec, cfg, [0, 1])
    assert all(pop["population"]["forward"] == "positions" for pop, _ in pairs)


def _counted_models(tiny_task, tiny_spec, std: float, **spec_kw):
    """Two models with random weights of size ``std`` (attention far from uniform), their stacked parameters, a
    validation slice's :class:`TokenCounts` and the solo logits at its targets (the query-restricted forward)."""
    from dataclasses import replace

    from interp.evaluation import target_positions
    from interp.model import build_model
    from interp.population import PARAMS, token_counts
    from interp.query_forward import logits_at

    models = [build_model(replace(tiny_spec, init_seed=s, **spec_kw), device="cpu") for s in (0, 1)]
    for s, m in enumerate(models):
        g = torch.Generator().manual_seed(s)
        with torch.no_grad():
            for p in m.parameters():
                if p.requires_grad:
                    p.copy_(torch.randn(p.shape, generator=g) * std)
    P = {n: torch.stack([m.state_dict()[n] for m in models]) for n in PARAMS if n in models[0].state_dict()}
    data = tiny_task.dataset("val").select(slice(0, 60))
    counted = token_counts(data, models[0].cfg.d_vocab)
    with torch.no_grad():
        solo = torch.stack([logits_at(m, data.tokens, target_positions(data)) for m in models])
    return models, P, counted, solo


@pytest.mark.parametrize("output_matrix", ["identity", "learned"])
def test_both_forms_of_the_token_count_forward_equal_the_solo_forward(tiny_task, tiny_spec, output_matrix):
    """The weights form (a ratio of two products linear in the counts) and the softmax form (a softmax over the
    present tokens with log counts added) give the logits of the query-restricted forward, with identity and
    learned W_O, and with LayerNorm (float32 rounding: atol 1e-5)."""
    from interp.population import _softmax_count_logits, _weighted_count_logits, weights_are_exact
    from interp.position_forward import Norm

    for norm in (None, "LN"):
        models, P, counted, solo = _counted_models(
            tiny_task, tiny_spec, 1.0, output_matrix=output_matrix, normalization=norm
        )
        P.update({n: torch.stack([m.state_dict()[n] for m in models]) for n in Norm.of(models[0]).param_names()})
        nm, scale = Norm.of(models[0]), float(models[0].blocks[0].attn.attn_scale)
        assert weights_are_exact(P, counted.queries, counted.present, counted.always, scale, nm)
        qidx, cnt = (x.expand(2, *x.shape[1:]) for x in counted.select(torch.arange(60)[None]))
        with torch.no_grad():
            by_weights = _weighted_count_logits(
                P, qidx, cnt, counted.queries, counted.present, scale, None, nm, "softmax", output_matrix == "identity"
            )
            by_softmax = _softmax_count_logits(
                P, counted.queries[qidx], cnt.log().clamp(min=-1e30), counted.present, scale, None, nm
            )
        torch.testing.assert_close(by_weights, solo, atol=1e-5, rtol=1e-5, msg=f"weights, {norm}")
        torch.testing.assert_close(by_softmax, solo, atol=1e-5, rtol=1e-5, msg=f"softmax, {norm}")


def test_sharp_attention_takes_the_softmax_form(tiny_task, tiny_spec):
    """Where a head scores some token far above every token counted at all its queries (gap over WEIGHT_GAP), the
    weights form could underflow (a denominator of 0 where that token is absent): weights_are_exact refuses it and
    stacked_count_logits still gives the solo logits, finite."""
    from interp.population import stacked_count_logits, weights_are_exact

    models, P, counted, solo = _counted_models(tiny_task, tiny_spec, 30.0)  # scores of order 30^2 x d_model
    scale = float(models[0].blocks[0].attn.attn_scale)
    assert not weights_are_exact(P, counted.queries, counted.present, counted.always, scale)
    with torch.no_grad():
        logits = stacked_count_logits(
            P, counted.query_tok.expand(2, -1, -1), counted.log_counts.expand(2, -1, -1, -1), counted.present, scale
        )
    assert torch.isfinite(logits).all()
    torch.testing.assert_close(logits, solo, atol=1e-3, rtol=1e-5)  # logits of order 1e4: float32 rounding


def opt_views_equal_init(flat, views, init):
    """Each view of the flat buffer reads back its parameter, whatever its memory order."""
    from interp.population import _view

    return all(torch.equal(_view(flat, *views[n]), init[n]) for n in init)


@pytest.mark.parametrize("optimizer", ["adamw", "adam"])
def test_the_flat_optimiser_equals_adam_per_tensor(optimizer):
    """The population's Adam over one flat [K, T] buffer (each parameter a view of its columns) gives bit for bit
    what a plain loop over the stacked tensors with the same operations gives (the per-tensor update the population
    used before its buffers were flat), and, per model, what torch.optim.AdamW (or Adam with L2 weight decay) gives
    that model's tensors with its own learning rate, to float32 rounding (torch.optim rounds the step size and the
    decay factor in double, and divides before it scales: a few ulps per step, rtol 1e-6 after 5 steps)."""
    import math

    from interp.population import _Adam

    K, shapes = 3, {"a": (4, 5), "b": (7,)}
    g = torch.Generator().manual_seed(0)
    init = {n: torch.randn(K, *s, generator=g) for n, s in shapes.items()}
    grads = [{n: torch.randn(K, *s, generator=g) for n, s in shapes.items()} for _ in range(5)]
    lrs = torch.tensor([1e-3, 3e-3, 1e-2])
    (b1, b2), wd, eps, decoupled = (0.9, 0.999), 0.01, 1e-8, optimizer == "adamw"
    # "a" kept transposed in the flat buffer (as the token-count populations keep W_U): the same update per number
    views, start, orders = {}, 0, {"a": (1, 0), "b": (0,)}
    for n, s in shapes.items():
        size = math.prod(s)
        views[n], start = (start, start + size, s, orders[n]), start + size
    flat = torch.cat([init[n].permute(0, *(o + 1 for o in orders[n])).reshape(K, -1) for n in shapes], 1)
    assert opt_views_equal_init(flat, views, init)
    opt = _Adam(flat, views, lrs, (b1, b2), wd, eps, decoupled=decoupled)
    loop = {n: init[n].clone() for n in shapes}  # the per-tensor loop, written out
    moments = {n: (torch.zeros_like(v), torch.zeros_like(v)) for n, v in loop.items()}
    cls = torch.optim.AdamW if decoupled else torch.optim.Adam
    refs = []
    for k in range(K):
        ps = {n: init[n][k].clone().requires_grad_() for n in shapes}
        refs.append((ps, cls(ps.values(), lr=float(lrs[k]), betas=(b1, b2), weight_decay=wd, foreach=False)))
    for t, step_grads in enumerate(grads, 1):
        opt.zero_grad()
        for n in shapes:
            opt.params[n].grad.add_(step_grads[n])
        opt.step(1.0)
        for n, p in loop.items():
            lr = lrs.view(-1, *[1] * (p.ndim - 1))
            grad = step_grads[n]
            if decoupled:
                p.mul_(1 - lr * wd)
            else:
                grad = grad.add(p, alpha=wd)
            m, v = moments[n]
            m.lerp_(grad, 1 - b1)
            v.mul_(b2).addcmul_(grad, grad, value=1 - b2)
            p.sub_(lr / (1 - b1**t) * m / (v.sqrt() / math.sqrt(1 - b2**t)).add_(eps))
        for k, (ps, ref) in enumerate(refs):
            for n, p in ps.items():
                p.grad = step_grads[n][k].clone()
            ref.step()
    for n in shapes:
        assert torch.equal(opt.params[n].detach(), loop[n]), (optimizer, n)
    for k, (ps, _) in enumerate(refs):
        for n, p in ps.items():
            torch.testing.assert_close(opt.params[n][k].detach(), p.detach(), rtol=1e-6, atol=1e-7)


def test_population_provenance_says_where_its_time_went(tmp_path, tiny_task, tiny_spec, tiny_cfg):
    """Each model's provenance carries its population's wall seconds by part of the run, and the count of
    token-count steps the weights form refused (none here)."""
    specs, cfgs = seed_population(tiny_task, tiny_spec, tiny_cfg(epochs=2, dropout_at="attention"), [0, 1])
    provs = train_population(
        tiny_task, specs, cfgs, [tmp_path / f"{s}.safetensors" for s in (0, 1)], device="cpu", progress=False
    )
    pop = provs[0]["population"]
    assert {"train", "validation", "epoch_end", "final_evaluation"} <= set(pop["seconds"])
    assert all(v >= 0 for v in pop["seconds"].values()) and pop["softmax_form_steps"] == 0


def test_a_records_json_is_its_dict_at_every_epoch():
    """``RunRecord.to_json`` encodes each history entry but the last once; decoded, it is ``to_dict()`` at every
    epoch: empty, after each epoch, after a halving step noted on the last entry (which must not be frozen), and
    after a record rebuilt from its dict (its cache starts empty)."""
    import json

    from interp.run_record import RunRecord

    r = RunRecord()
    assert json.loads(r.to_json()) == r.to_dict()
    for epoch in range(1, 8):
        r.end_epoch(epoch, 10 * epoch, 1.0 / epoch, {"accuracy": epoch / 10, "loss": 2.0 / epoch})
        assert json.loads(r.to_json()) == r.to_dict()
        if epoch in (3, 4):
            r.note_halving({"kept": [[1, 0]]})
            assert json.loads(r.to_json())["history"][-1]["kept_heads"] == [[1, 0]]
            assert json.loads(r.to_json()) == r.to_dict()
    again = RunRecord.from_dict(json.loads(r.to_json()), "best", None)
    again.end_epoch(8, 80, 0.1, {"accuracy": 0.9, "loss": 0.2})
    assert json.loads(again.to_json()) == again.to_dict()
    assert len(again.to_dict()["history"]) == 8


def test_encoded_values_are_written_as_they_are_anywhere_in_an_entry(tmp_path):
    """``Encoded`` JSON inside a resume file's entries (a dict's value, a list's item) is written as it is and reads
    back as the value ``json.dumps`` would have written; everything else is ``json.dumps``'s."""
    import json

    from interp.resume_file import Encoded, read_resume_file, write_resume_file

    value = {"a": 1, "b": [1.5, {"c": None}], "d": {"1": "x"}, "e": (True, "y")}
    progress = {**value, "records": [Encoded(json.dumps({"h": [1, 2]})), Encoded("[]")]}
    write_resume_file(tmp_path / "r", {}, {"id": 1}, "the resume file", progress=progress, plain={2: "z"})
    _, meta = read_resume_file(tmp_path / "r", "resume file")
    assert meta["progress"] == {**json.loads(json.dumps(value)), "records": [{"h": [1, 2]}, []]}
    assert meta["plain"] == {"2": "z"}


def test_population_runs_without_the_gradient_layout_warning(tmp_path, tiny_task, tiny_spec, tiny_cfg):
    """The flat buffer's gradient views are strided like their parameters, which autograd's layout contract warns
    about although it adds into them in place; a population run does not show that warning (torch's warn-once is
    made warn-always here, so an earlier test cannot have used it up). The control: the same views warn, with the
    message the population filters, so a torch that rewords it fails here instead of warning users."""
    import warnings

    from interp.population import LAYOUT_WARNING, _view

    was = torch.is_warn_always_enabled()
    torch.set_warn_always(True)
    try:
        flat = torch.zeros(3, 20)
        param, grad = (
            _view(flat, 4, 10, (2, 3), (0, 1)).requires_grad_(),
            _view(torch.zeros(3, 20), 4, 10, (2, 3), (0, 1)),
        )
        param.grad = grad
        with warnings.catch_warnings(record=True) as control:
            warnings.simplefilter("always")
            (param * 2).sum().backward()
        assert any(LAYOUT_WARNING in str(w.message) for w in control)
        specs, cfgs = seed_population(tiny_task, tiny_spec, tiny_cfg(epochs=1, dropout_at="attention"), [0, 1])
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            outs = [tmp_path / f"{s}.safetensors" for s in (0, 1)]
            train_population(tiny_task, specs, cfgs, outs, device="cpu", progress=False)
        assert not [w for w in caught if "layout contract" in str(w.message)]
    finally:
        torch.set_warn_always(was)


@pytest.mark.parametrize("rows", [False, True], ids=["d_model x N", "N x d_model"])
def test_the_transposed_unembedding_has_autograds_gradients(rows):
    """The token-count forward's unembedding (``_Unembed``: ``b_U + W_U^T @ resid^T``, its backward written by
    hand so the residual's gradient can come out N x d_model) against autograd through the plain product: the same
    logits bit for bit and the same gradients of the residual, W_U and b_U to float32 rounding (a dot product over
    vocab either way: rtol 1e-6)."""
    from interp.population import _Unembed

    g = torch.Generator().manual_seed(0)
    K, N, d, V = 3, 40, 32, 8
    resid, W_U, b_U = (torch.randn(*s, generator=g, requires_grad=True) for s in ((K, N, d), (K, d, V), (K, V)))
    weights = torch.randn(K, V, N, generator=g)
    ours = _Unembed.apply(resid, W_U, b_U, rows)
    (ours * weights).sum().backward()
    mine = [t.grad.clone() for t in (resid, W_U, b_U)]
    for t in (resid, W_U, b_U):
        t.grad = None
    plain = torch.baddbmm(b_U[:, :, None], W_U.transpose(1, 2), resid.transpose(1, 2))
    (plain * weights).sum().backward()
    assert torch.equal(ours, plain)
    for name, a, t in zip(("resid", "W_U", "b_U"), mine, (resid, W_U, b_U)):
        torch.testing.assert_close(a, t.grad, rtol=1e-6, atol=1e-6, msg=name)


@pytest.mark.parametrize(
    "forward, cfg_kw",
    [
        ("token counts", dict(dropout_at="attention")),
        ("positions", dict(dropout_at="embedding+attention")),
        ("prefix counts", dict(objective="lm", dropout_at="attention", dropout_rng="counter")),
    ],
)
@pytest.mark.parametrize("shape", ["4 heads", "1 head", "64 heads, trained W_O"])
def test_trained_attention_biases_equal_solo_key_bias_included(
    tmp_path, tiny_task, tiny_spec, tiny_cfg, forward, cfg_kw, shape
):
    """``attn_bias=True``: every parameter of each model equals its solo run, the key bias ``b_K`` too. Under
    softmax attention ``b_K`` adds one constant to every score of a query, which the softmax removes: its exact
    gradient is zero. Before, the computed one was rounding noise, which Adam scales to full steps, so ``b_K``
    random-walked differently in the population and alone (1e-4 to 3e-3 apart; every other tensor within 1e-7)."""
    from dataclasses import replace

    spec = replace(tiny_spec, attn_bias=True, **SHAPES.get(shape, {}))
    # init="torch" draws the biases (TransformerLens zeroes them), so b_K is not trivially zero in both runs
    cfg = tiny_cfg(epochs=3, init="torch", weight_decay=0.1, **cfg_kw)
    pairs = _population_equals_solo(tmp_path, tiny_task, spec, cfg, [0, 1])
    assert all(pop["population"]["forward"] == forward for pop, _ in pairs)
    assert torch.count_nonzero(load_file(tmp_path / "pop0.safetensors")["blocks.0.attn.b_K"]) > 0


@pytest.mark.parametrize("positional", ["shortformer", "rotary", "random", "alibi"])
def test_populations_name_the_positional_embedding_they_refuse(tiny_task, tiny_spec, tiny_cfg, positional):
    """Before, these were refused after the models were built, by a line that did not name the cause ("batched
    training needs a model the exact query-restricted forward covers"; found by a researcher's trial)."""
    from dataclasses import replace

    from interp.population import check_population

    specs, cfgs = seed_population(tiny_task, replace(tiny_spec, positional=positional), tiny_cfg(), [0, 1])
    with pytest.raises(ConfigError, match=f"positional={positional!r}"):
        check_population(specs, cfgs)
