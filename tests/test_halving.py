"""Halving heads (Fraknói 2024, §5.5): masked heads are exactly absent through training, every strategy keeps the heads
its score ranks highest (scores checked against scikit-learn, the slow hook loop and the Shapley formula over all
orderings), a 4-head d=8 run halves twice and reloads in plain TransformerLens, resume mid-halving equals the
uninterrupted run, a run left with more than one head scores 0, Figure 10 and the report section, the CLI."""

import copy
import itertools
import json

import numpy as np
import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file

from interp.analyses.halving import (
    HalvingHistory,
    add_halving_section,
    halving_history,
    scorer,
    shapley_scores,
    train_halving,
)
from interp.analyses.reference import learned_accuracy_loop
from interp.configs import STRATEGIES
from interp.errors import ConfigError, InterpError
from interp.halving import Halving, keep_best, random_scores
from interp.model import ModelSpec, build_model
from interp.tasks import get_task, load_checkpoint
from interp.training import TrainConfig, batch_loss, dropout_hooks, resume_path, train

TINY = dict(
    train_size=512, val_size=128, test_size=128, train_lengths=[0, 20], val_lengths=[21, 30], test_lengths=[31, 40]
)
HEADS = [(0, h) for h in range(4)]


@pytest.fixture(scope="module")
def task():
    return get_task("noisy-majority", **TINY)


@pytest.fixture(scope="module")
def spec(task):
    return ModelSpec(**{**task.default_spec(), "d_model": 8, "n_heads": 4, "d_head": 2})


def _cfg(**kw):
    return TrainConfig(
        **{"epochs": 30, "batch_size": 64, "lr": 1e-2, "warmup_steps": 10, "seed": 0, "halving": "svc", **kw}
    )


@pytest.fixture(scope="module")
def svc_run(tmp_path_factory, task, spec):
    out = tmp_path_factory.mktemp("halving") / "svc.safetensors"
    prov = train_halving(task, spec, _cfg(), out, device="cpu", progress=False)
    return out, prov


@pytest.fixture(scope="module")
def trained(tmp_path_factory, task, spec):
    """A plain 4-head model (no halving) whose heads differ, for the strategies' scores."""
    out = tmp_path_factory.mktemp("plain") / "m.safetensors"
    train(task, spec, _cfg(epochs=12, halving=None), out, device="cpu", progress=False)
    return load_checkpoint(out, device="cpu").model


def _z_at_answer(model, data):
    _, cache = model.run_with_cache(data.tokens, names_filter="blocks.0.attn.hook_z")
    return cache["blocks.0.attn.hook_z"][torch.arange(len(data)), data.answer_pos]  # [batch, head, d_head]


# -- the mask -------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("n_layers", [1, 2])
def test_masked_heads_output_exactly_zero_and_get_no_gradient(task, n_layers):
    spec = ModelSpec(
        **{
            **task.default_spec(),
            "d_model": 8,
            "n_heads": 4,
            "d_head": 2,
            "n_layers": n_layers,
            "output_matrix": "learned",
        }
    )
    torch.manual_seed(0)
    model = build_model(spec, device="cpu")
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2, weight_decay=0.01)
    active = [(0, 1)] + ([(1, 2), (1, 3)] if n_layers == 2 else [(0, 3)])
    halving = Halving("random", 0.95, n_layers, 4, active=active, steps=[{"epoch": 0}])
    data = task.dataset("train").select(slice(0, 64))
    hooks = dropout_hooks(model, 0.1)
    for _ in range(3):  # a few steps: Adam moments, weight decay and dropout must not revive a masked head
        halving.apply(model, opt)
        loss = batch_loss(model, data, hooks, 0.1)
        opt.zero_grad()
        loss.backward()
        for l, block in enumerate(model.blocks):
            for name in ("W_Q", "W_K", "W_V", "W_O", "b_Q", "b_K", "b_V"):
                g = getattr(block.attn, name).grad
                for h in range(4):
                    if (l, h) not in active and g is not None:
                        assert torch.equal(g[h], torch.zeros_like(g[h])), (name, l, h)
        opt.step()
    halving.apply(model)
    _, cache = model.run_with_cache(data.tokens)
    for l in range(n_layers):
        z = cache[f"blocks.{l}.attn.hook_z"]
        for h in range(4):
            if (l, h) in active:
                assert z[..., h, :].abs().max() > 0
            else:
                assert torch.equal(z[..., h, :], torch.zeros_like(z[..., h, :]))


def test_keep_best_takes_the_highest_scores_ties_to_the_lower_head():
    assert keep_best(HEADS, [0.1, 0.9, 0.5, 0.7], 2) == [(0, 1), (0, 3)]
    assert keep_best(HEADS, [1.0, 1.0, 1.0, 0.2], 2) == [(0, 0), (0, 1)]
    assert keep_best(HEADS, [0.0, 0.0, 0.0, 0.3], 1) == [(0, 3)]
    # values equal but for float noise (as Shapley sums in different orders give) are ties
    assert keep_best(HEADS, [0.04599103396603365, 0.0459910339660337, 0.04599103396603365, 0.01], 1) == [(0, 0)]


# -- a run ------------------------------------------------------------------------------------------------------------


@pytest.mark.slow
def test_a_4_head_d8_run_halves_twice_and_keeps_a_one_head_state(svc_run):
    out, prov = svc_run
    h = prov["halving"]
    assert h["success"] and h["n_steps"] == 2 and len(h["active"]) == 1
    assert [len(s["before"]) for s in h["steps"]] == [4, 2] and [len(s["kept"]) for s in h["steps"]] == [2, 1]
    assert h["steps"][1]["kept"] == h["active"] and set(h["steps"][1]["before"]) == set(h["steps"][0]["kept"])
    for s in h["steps"]:
        assert s["val_accuracy"] >= 0.95
        rec = prov["history"][s["epoch"] - 1]
        assert rec["val_accuracy"] == s["val_accuracy"] and rec["kept_heads"] == s["kept"]
        # the kept heads are the best by the step's scores
        assert s["kept"] == sorted(sorted(s["scores"], key=lambda k: (-round(s["scores"][k], 9), k))[: len(s["kept"])])
    # the kept model is the best one-head state by validation accuracy
    last = h["steps"][-1]["epoch"]
    one_head = [r for r in prov["history"] if r["epoch"] > last]
    assert prov["kept"] == "best" and prov["kept_epoch"] > last
    best = max(r["val_accuracy"] for r in one_head)
    assert prov["history"][prov["kept_epoch"] - 1]["val_accuracy"] == best == prov["accuracy"]["val"]
    assert h["score"] == prov["accuracy"]["test"]
    meta = load_checkpoint(out, device="cpu").training["halving"]
    assert (
        meta["mask"] == [[1.0 if f"L0H{i}" in h["active"] else 0.0 for i in range(4)]] and meta["steps"] == h["steps"]
    )


def test_the_checkpoint_computes_the_masked_model_in_plain_transformer_lens(svc_run, task):
    from transformer_lens import HookedTransformer, HookedTransformerConfig

    out, prov = svc_run
    with safe_open(str(out), "pt") as f:
        tl_config = json.loads(f.metadata()["tl_config"])
    plain = HookedTransformer(HookedTransformerConfig(**tl_config, device="cpu"))
    plain.load_state_dict(load_file(str(out)))
    ours = load_checkpoint(out, device="cpu").model
    data = task.dataset("test")
    assert torch.allclose(plain(data.tokens), ours(data.tokens), atol=1e-5, rtol=0)
    masked = [int(s[3:]) for s in prov["halving"]["steps"][0]["masked"] + prov["halving"]["steps"][1]["masked"]]
    w = load_file(str(out))
    for name in ("W_Q", "W_K", "W_V"):
        assert torch.equal(w[f"blocks.0.attn.{name}"][masked], torch.zeros_like(w[f"blocks.0.attn.{name}"][masked]))
    z = _z_at_answer(plain, data)
    assert (
        torch.equal(z[:, masked], torch.zeros_like(z[:, masked]))
        and z[:, [i for i in range(4) if i not in masked]].abs().max() > 0
    )
    # the one head left does the model's work: zeroing it leaves the direct path alone
    acc = (plain(data.tokens)[torch.arange(len(data)), data.answer_pos].argmax(-1) == data.labels).float().mean()
    assert float(acc) == prov["accuracy"]["test"]


@pytest.mark.slow
def test_resume_mid_halving_equals_the_uninterrupted_run(tmp_path, svc_run, task, spec):
    _, full = svc_run
    first, second = (s["epoch"] for s in full["halving"]["steps"])
    stop = first + 1  # after the first halving step, before the second
    assert stop < second
    out = tmp_path / "r.safetensors"

    def interrupt(epoch, record):
        if epoch == stop:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        train_halving(task, spec, _cfg(save_every=1), out, device="cpu", progress=False, on_epoch_end=interrupt)
    assert resume_path(out).is_file() and not out.exists()
    resumed = train_halving(task, spec, _cfg(save_every=1), out, device="cpu", progress=False, resume=True)
    assert resumed["halving"] == full["halving"] and resumed["history"] == full["history"]
    a, b = load_file(str(out)), load_file(str(svc_run[0]))
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_a_run_left_with_more_than_one_head_fails_and_scores_zero(tmp_path, task, spec):
    prov = train(
        task,
        spec,
        _cfg(epochs=3, halving="random", halving_threshold=1.0),
        tmp_path / "f.safetensors",
        device="cpu",
        progress=False,
    )
    h = prov["halving"]
    assert not h["success"] and h["score"] == 0.0 and len(h["active"]) == 4 and h["steps"] == []
    assert prov["kept"] == "last" and prov["kept_epoch"] == 3


def test_patience_counts_only_once_one_head_is_left(tmp_path, task, spec, svc_run):
    """Before the last halving step no state can be kept, so patience must not stop the run there."""
    prov = train_halving(task, spec, _cfg(patience=2), tmp_path / "p.safetensors", device="cpu", progress=False)
    last = svc_run[1]["halving"]["steps"][-1]["epoch"]
    assert prov["halving"] == svc_run[1]["halving"] and prov["epochs_run"] >= last + 2
    assert prov["epochs_run"] - max(prov["best_epoch"], last) == 2  # stopped by patience, counted from there


def test_halving_across_two_layers(tmp_path, task):
    """A 2-layer model (trained through TransformerLens' forward and hooks): heads of both layers compete."""
    spec = ModelSpec(
        **{**task.default_spec(), "d_model": 8, "n_heads": 2, "d_head": 2, "n_layers": 2, "output_matrix": "learned"}
    )
    out = tmp_path / "l2.safetensors"
    prov = train_halving(task, spec, _cfg(epochs=6, halving_threshold=0.5), out, device="cpu", progress=False)
    h = prov["halving"]
    assert h["success"] and [len(s["before"]) for s in h["steps"]] == [4, 2]
    assert set(h["steps"][0]["before"]) == {"L0H0", "L0H1", "L1H0", "L1H1"}
    model = load_checkpoint(out, device="cpu").model
    data = task.dataset("val")
    _, cache = model.run_with_cache(data.tokens)
    ((kl, kh),) = [(int(n[1]), int(n[3])) for n in h["active"]]
    for l in range(2):
        for hd in range(2):
            z = cache[f"blocks.{l}.attn.hook_z"][..., hd, :]
            assert (z.abs().max() > 0) if (l, hd) == (kl, kh) else torch.equal(z, torch.zeros_like(z))


def test_mask_all_but_one_masks_a_minus_1_heads_from_the_start(tmp_path, task, spec):
    out = tmp_path / "m.safetensors"
    prov = train(task, spec, _cfg(epochs=3, halving="mask-all-but-one"), out, device="cpu", progress=False)
    h = prov["halving"]
    assert h["success"] and [s["epoch"] for s in h["steps"]] == [0] and len(h["active"]) == 1
    assert h["steps"][0]["kept"] == [f"L0H{int(np.argmax(random_scores(4, 0, 0)))}"]
    assert prov["kept_epoch"] >= 1  # every epoch trains the one head, so every epoch is a candidate
    w = load_file(str(out))["blocks.0.attn.W_V"]
    keep = int(h["active"][0][3:])
    assert all(torch.equal(w[i], torch.zeros_like(w[i])) for i in range(4) if i != keep) and w[keep].abs().max() > 0


# -- the strategies -----------------------------------------------------------------------------------------------


def _sklearn_separation(model, train, val, subset):
    """Separation accuracy by hand: TransformerLens' cache and scikit-learn's LinearSVC (train-centred features)."""
    from sklearn.svm import LinearSVC

    if not subset:  # the SVC with its intercept alone: the commonest train label (v of the empty coalition)
        labels, counts = np.unique(train.labels.numpy(), return_counts=True)
        return float((val.labels.numpy() == labels[np.argmax(counts)]).mean())
    idx = [h for _, h in subset]
    xtr = _z_at_answer(model, train)[:, idx].reshape(len(train), -1).detach().numpy()
    xva = _z_at_answer(model, val)[:, idx].reshape(len(val), -1).detach().numpy()
    mu = xtr.mean(0, keepdims=True)
    clf = LinearSVC(C=1000.0, dual=False, max_iter=10_000).fit(xtr - mu, train.labels.numpy())
    return float((clf.predict(xva - mu) == val.labels.numpy()).mean())


def _shapley_by_orderings(heads, v):
    """Shapley values as the mean marginal contribution over all n! orderings (independent of the subset formula)."""
    phi = dict.fromkeys(heads, 0.0)
    perms = list(itertools.permutations(heads))
    for order in perms:
        seen = frozenset()
        for h in order:
            phi[h] += v(seen | {h}) - v(seen)
            seen = seen | {h}
    return [phi[h] / len(perms) for h in heads]


@pytest.fixture(scope="module")
def splits(task):
    return task.dataset("train"), task.dataset("val")


@pytest.mark.slow
@pytest.mark.parametrize("strategy", ["svc", "learned", "shapley-svc", "shapley-learned", "random"])
def test_each_strategy_keeps_the_heads_its_score_ranks_highest(strategy, trained, task, splits):
    train_data, val = splits
    n_val = len(val)
    if strategy == "random":
        expected = random_scores(4, 0, 1)
    else:
        value = strategy.removeprefix("shapley-")

        def v(s):
            if value == "svc":
                return _sklearn_separation(trained, train_data, val, sorted(s))
            return float(learned_accuracy_loop(trained, val, heads=[sorted(s)]).accuracy[0])

        memo = {}

        def vm(s):
            return memo.setdefault(s, v(s))

        expected = (
            _shapley_by_orderings(HEADS, vm) if strategy.startswith("shapley") else [vm(frozenset([h])) for h in HEADS]
        )
        ours = scorer(strategy)(trained, task, HEADS, train_data, val)
        # the same numbers up to one validation sequence per coalition (float paths differ: cached vs hooks)
        tol = 1.0 / n_val + 1e-9
        assert np.allclose(ours, expected, atol=tol, rtol=0), (ours, expected)
        expected = ours if np.allclose(ours, expected, atol=1e-12) else expected
        assert len(set(np.round(expected, 9))) > 1  # the heads do differ, so the test means something
    model = copy.deepcopy(trained)
    halving = Halving(strategy, 0.95, 1, 4, seed=0)
    step = halving.after_validation(model, None, 7, 0.97, task, train_data, val, scorer(strategy))
    top = sorted(sorted(range(4), key=lambda i: (-round(expected[i], 9), i))[:2])
    assert step["kept"] == [f"L0H{i}" for i in top] and halving.active == [(0, i) for i in top]
    assert step["scores"] == pytest.approx({f"L0H{i}": expected[i] for i in range(4)}, abs=1.0 / n_val + 1e-9)
    z = _z_at_answer(model, val)
    assert torch.equal(z[:, [i for i in range(4) if i not in top]], torch.zeros(n_val, 2, 2))


def test_shapley_scores_of_one_head_is_its_value_and_bad_input_is_refused(trained, splits):
    _train_data, val = splits
    one = shapley_scores(trained, val, heads=["L0H2"], value="learned")
    direct = float(learned_accuracy_loop(trained, val, heads=[[]]).accuracy[0])
    assert one[0] == pytest.approx(
        float(learned_accuracy_loop(trained, val, heads=[[(0, 2)]]).accuracy[0]) - direct, abs=1 / len(val)
    )
    with pytest.raises(InterpError, match="unknown head value"):
        shapley_scores(trained, val, heads=["L0H2"], value="loss")
    with pytest.raises(InterpError, match="train data"):
        shapley_scores(trained, val, heads=["L0H2"], value="svc")


def test_bad_halving_options_are_refused(tmp_path, task, spec):
    with pytest.raises(ConfigError, match="unknown halving strategy"):
        _cfg(halving="best")
    with pytest.raises(ConfigError, match="threshold"):
        _cfg(halving_threshold=0.0)
    with pytest.raises(ConfigError, match="needs a scorer"):
        train(task, spec, _cfg(epochs=30), tmp_path / "x.safetensors", device="cpu", progress=False)
    with pytest.raises(ConfigError, match="unknown halving strategy"):
        scorer("nope")
    from interp.app.cli import build_parser  # the CLI lists the strategies without importing torch: the same names

    train_parser = build_parser()._subparsers._group_actions[0].choices["train"]
    assert tuple(next(a for a in train_parser._actions if a.dest == "halving").choices) == STRATEGIES


# -- Figure 10, the report, the CLI -------------------------------------------------------------------------------


def test_figure_10_and_the_report_section(svc_run):
    out, prov = svc_run
    ckpt = load_checkpoint(out, device="cpu")
    hist = halving_history(ckpt)
    assert isinstance(hist, HalvingHistory) and hist.success and hist.epochs == list(range(1, 31))
    fig = hist.figure()
    dashed = [s for s in fig.layout.shapes if s.line.dash == "dash"]
    assert sorted(s.x0 for s in dashed) == [s["epoch"] for s in prov["halving"]["steps"]]
    assert json.loads(hist.to_json())["steps"] == prov["halving"]["steps"]
    assert "ended with one head" in hist.text()
    from interp.report_page import Report

    report = Report()
    add_halving_section(ckpt, report)
    html = report.html()
    assert "Halving heads" in html and prov["halving"]["active"][0] in html
    with pytest.raises(InterpError, match="not trained with halving"):
        halving_history({"history": []})
    # the noisy-majority report opens with it
    from interp.analyses import suite_for

    full = Report()
    suite_for("noisy-majority").add_report_sections(ckpt, full, progress=False)
    assert full.sections[0].title == "Halving heads" and "Halving heads" not in [s.title for s in full.sections[1:]]


@pytest.mark.slow
def test_cli_trains_with_halving_and_resumes_with_its_options(tmp_path, capsys, task, spec, svc_run):
    from interp.app.cli import main

    out = tmp_path / "c.safetensors"
    args = [
        "train",
        "noisy-majority",
        "--set",
        "train_size=512",
        "--set",
        "val_size=128",
        "--set",
        "test_size=128",
        "--set",
        "train_lengths=[0,20]",
        "--set",
        "val_lengths=[21,30]",
        "--set",
        "test_lengths=[31,40]",
        "--d-model",
        "8",
        "--n-heads",
        "4",
        "--d-head",
        "2",
        "--lr",
        "0.01",
        "--epochs",
        "14",
        "--halving",
        "shapley-svc",
        "--halving-threshold",
        "0.9",
        "--out",
        str(out),
        "--quiet",
        "--device",
        "cpu",
    ]
    assert main(args) == 0
    assert "halving (shapley-svc)" in capsys.readouterr().out
    meta = load_checkpoint(out, device="cpu").training
    assert meta["config"]["halving"] == "shapley-svc" and meta["halving"]["threshold"] == 0.9
    with pytest.raises(SystemExit, match="invalid choice"):
        main(["train", "noisy-majority", "--halving", "nope"])
    capsys.readouterr()
    assert main(["train", "noisy-majority", "--halving", "svc", "--halving-threshold", "1.5"]) == 1
    assert "(0, 1]" in capsys.readouterr().err

    # an interrupted halving run resumes from the command line with the strategy read from its resume file
    out2 = tmp_path / "r.safetensors"

    def interrupt(epoch, record):
        if epoch == 12:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        train_halving(task, spec, _cfg(save_every=1), out2, device="cpu", progress=False, on_epoch_end=interrupt)
    assert main(["train", "noisy-majority", "--resume", "--out", str(out2), "--quiet", "--halving", "random"]) != 0
    assert "--halving random" in capsys.readouterr().err
    assert main(["train", "noisy-majority", "--resume", "--out", str(out2), "--quiet", "--device", "cpu"]) == 0
    resumed = load_checkpoint(out2, device="cpu").training
    assert resumed["halving"] == svc_run[1]["halving"] and resumed["history"] == svc_run[1]["history"]
    a, b = load_file(str(out2)), load_file(str(svc_run[0]))
    assert all(torch.equal(a[k], b[k]) for k in a)
