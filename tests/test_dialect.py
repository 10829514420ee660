"""The toolkit's one dialect (docs/analyses.md, "The dialect"), checked on every public analysis: the signature
``fn(model, data, *, ...)`` or ``fn(model, *, ...)``, the argument names, ``device=`` following the model and
refusing another device, ``batch_size=`` changing memory and never numbers, and every spelling of ``heads=`` naming
the same head sets."""

from __future__ import annotations

import inspect

import pytest
import torch

import interp.analyses as A
from interp.errors import ConfigError, HeadError, InterpError
from interp.heads import head_sets, parse_head_sets

# names the dialect replaced: an analysis taking one of them speaks an old dialect (``tokens`` as the data argument;
# value_vectors' keyword ``tokens`` names which vocabulary tokens, no data)
OLD_NAMES = {"test_data", "test", "subsets", "head", "sources", "earlier", "later", "budget", "chunk"}
OLD_NAMES |= {"block_elems", "clean", "mask"}


def analyses():
    """Every public function of interp.analyses that takes a model first."""
    out = {}
    for name in A.__all__:
        fn = getattr(A, name)
        if inspect.isfunction(fn):
            params = list(inspect.signature(fn).parameters.values())
            if params and params[0].name == "model":
                out[name] = params
    return out


def test_every_analysis_speaks_the_dialect():
    found = analyses()
    assert len(found) > 40
    for name, params in found.items():
        positional = [p.name for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
        assert positional in (["model"], ["model", "data"]), f"{name}: positional arguments {positional}"
        names = {p.name for p in params}
        assert not names & OLD_NAMES, f"{name} takes {names & OLD_NAMES}"
        assert "device" in names or any(p.kind == p.VAR_KEYWORD for p in params), f"{name} has no device="


def test_the_oracles_left_the_public_namespace():
    from interp.analyses import reference

    for name in ("learned_accuracy_loop", "path_patching_loop", "variant_metric"):
        assert name not in A.__all__ and callable(getattr(reference, name))
    for name in ("exact_shapley", "sampled_shapley", "shapley_of"):
        assert name not in A.__all__
    assert "shapley_values" in A.__all__


@pytest.fixture(scope="module")
def nm(nm_ckpt):
    return nm_ckpt.model, nm_ckpt.task, nm_ckpt.task.dataset("test").select(slice(0, 40))


@pytest.mark.slow
def test_device_follows_the_model_and_another_is_refused(nm):
    model, _, data = nm
    calls = {
        "learned_accuracy": lambda **kw: A.learned_accuracy(model, data, heads=["L0H1"], **kw),
        "separation_accuracy": lambda **kw: A.separation_accuracy(model, data, train=data, heads=["L0H1"], **kw),
        "coalition_values": lambda **kw: A.coalition_values(model, data, heads=["L0H1", "L0H2"], **kw),
        "shapley_values": lambda **kw: A.shapley_values(model, data, heads=["L0H1", "L0H2"], **kw),
        "full_qk_circuit": lambda **kw: A.full_qk_circuit(model, heads="L0H1", **kw),
        "attention_ratios": lambda **kw: A.attention_ratios(model, data, **kw),
        "head_scores": lambda **kw: A.head_scores(model, data.tokens[:4], n_boot=10, **kw),
        "activation_patching": lambda **kw: A.activation_patching(model, data, corrupted=data, per="head", **kw),
    }
    for name, call in calls.items():
        assert call(device=None) is not None and call(device="cpu") is not None, name
        with pytest.raises(ConfigError, match="the model is on cpu"):
            call(device="cuda")


@pytest.mark.slow
def test_batch_size_changes_memory_not_numbers(nm):
    model, _, data = nm
    heads = [["L0H1"], ["L0H8", "L0H9"], []]
    for method in ("fast", "hooks"):
        ref = A.learned_accuracy(model, data, heads=heads, method=method)
        for batch_size in (1, 7):
            got = A.learned_accuracy(model, data, heads=heads, method=method, batch_size=batch_size)
            assert torch.equal(got.accuracy, ref.accuracy), (method, batch_size)
    a = A.coalition_values(model, data, heads=["L0H1", "L0H8"], method="hooks", value="answer-loss")
    b = A.coalition_values(model, data, heads=["L0H1", "L0H8"], method="hooks", value="answer-loss", batch_size=5)
    torch.testing.assert_close(a.values, b.values, atol=1e-6, rtol=1e-6)
    for bad in (0, -1, True):  # of the annotated type: wrong types are refused by the type checker in tests
        with pytest.raises(ConfigError, match="batch_size"):
            A.learned_accuracy(model, data, heads=heads, batch_size=bad)


def test_every_spelling_of_heads_names_the_same_sets(nm):
    model, _, data = nm
    mask = torch.zeros(2, 1, 16)
    mask[0, 0, 1] = mask[1, 0, 8] = mask[1, 0, 9] = 1
    spellings = [[["L0H1"], ["L0H8", "L0H9"]], [[(0, 1)], [(0, 8), "0.9"]], mask]
    accs = [A.learned_accuracy(model, data, heads=h).accuracy for h in spellings]
    assert all(torch.equal(a, accs[0]) for a in accs)
    one = A.learned_accuracy(model, data, heads=["L0H8", "L0H9"])  # a list of heads is one set
    assert len(one.subsets) == 1 and float(one.accuracy[0]) == float(accs[0][1])
    assert len(A.learned_accuracy(model, data).subsets) == 16  # default: each head alone
    with pytest.raises(HeadError, match="out of range"):
        A.learned_accuracy(model, data, heads="L1H0")


def test_parse_head_sets_keeps_the_order_given():
    assert parse_head_sets(["L0H2", (0, 1)], 1, 3) == [((0, 2), (0, 1))]
    assert parse_head_sets([["L0H2"], [], ["0.1", "L0H0"]], 1, 3) == [((0, 2),), (), ((0, 1), (0, 0))]
    assert parse_head_sets(None, 2, 2, default="each") == [((0, 0),), ((0, 1),), ((1, 0),), ((1, 1),)]
    torch.testing.assert_close(head_sets([["L0H2"], ["0.1"]], 1, 3), torch.tensor([[[0.0, 0, 1]], [[0.0, 1, 0]]]))
    with pytest.raises(HeadError, match="0 and 1"):
        parse_head_sets(torch.full((1, 3), 0.5), 1, 3)


def test_shapley_values_is_the_one_entry(nm):
    model, _, data = nm
    heads = ["L0H1", "L0H8", "L0H9"]
    exact = A.shapley_values(model, data, heads=heads, method="exact")
    cv = A.coalition_values(model, data, heads=heads)
    assert torch.equal(exact.shapley, cv.shapley().shapley) and exact.exact
    auto = A.shapley_values(model, data, heads=heads)
    assert auto.exact and "auto: exact" in auto.text() and torch.equal(auto.shapley, exact.shapley)
    sampled = A.shapley_values(model, data, heads=heads, method="sampled", samples=6, seed=3)
    assert not sampled.exact and sampled.samples == 6
    with pytest.raises(InterpError, match="unknown method"):
        A.shapley_values(model, data, heads=heads, method="permutation")


def test_shapley_values_auto_samples_beyond_sixteen_heads(nm_task):
    from interp.model import ModelSpec, build_model

    spec = ModelSpec(**{**nm_task.default_spec(), "n_heads": 17, "d_model": 34, "d_head": 2})
    model = build_model(spec, device="cpu")
    data = nm_task.dataset("test").select(slice(0, 20))
    res = A.shapley_values(model, data, samples=4)
    assert not res.exact and res.samples == 4 and "17 heads > 16" in res.text()
