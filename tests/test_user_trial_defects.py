"""Regression tests for the defects a user trial of 0.2.0 found (D-a ... D-k; D-e is tested on its own branch), each
failing before its fix. Tiny TransformerLens models built here; the oracle of each number is named in its test."""

from __future__ import annotations

import dataclasses
import importlib
import re

import pytest
import torch
from transformer_lens import HookedTransformer, HookedTransformerConfig

import interp
from interp import analyses
from interp.errors import CheckpointError, HeadError, RemovedNameError, TaskError, TokenError
from interp.heads import parse_head_sets
from interp.registry import TaskPlugin
from interp.tasks import get_task


def tl_model(n_layers=1, n_heads=3, d_vocab=12, d_vocab_out=None, n_ctx=8, attn_only=True, seed=0, **kw):
    torch.manual_seed(seed)
    cfg = HookedTransformerConfig(
        n_layers=n_layers,
        d_model=16,
        n_heads=n_heads,
        d_head=4,
        d_vocab=d_vocab,
        d_vocab_out=d_vocab_out or d_vocab,
        n_ctx=n_ctx,
        act_fn="relu",
        attn_only=attn_only,
        **({"d_mlp": 32} if not attn_only else {}),
        **kw,
    )
    model = HookedTransformer(cfg)
    model.eval()
    return model


def token_data(model, n=24, seed=1):
    gen = torch.Generator().manual_seed(seed)
    tokens = torch.randint(0, model.cfg.d_vocab, (n, model.cfg.n_ctx), generator=gen)
    labels = torch.randint(0, model.cfg.d_vocab_out, (n,), generator=gen)
    return tokens, labels


# -- D-a: labels the model can never output -------------------------------------------------------------------------


def test_labels_outside_the_output_vocabulary_are_refused():
    model = tl_model()
    tokens, labels = token_data(model)
    data = interp.task_data(tokens, answer_pos=7, labels=labels + 100)  # no vocabulary: only the model knows
    with pytest.raises(TokenError, match=r"label 1\d\d \(example 0\) .*\[0, 12\)") as err:
        analyses.learned_accuracy(model, data)  # was: accuracy 0 for every head, no error
    assert "\n" not in str(err.value) and "d_vocab_out 12" in str(err.value)
    bad = labels.clone()
    bad[5] = -1
    with pytest.raises(TokenError, match=r"label -1 \(example 5\)"):
        analyses.learned_accuracy(model, interp.task_data(tokens, answer_pos=7, labels=bad))
    vocab = interp.Vocab(tokens=tuple(str(i) for i in range(12)), n_out=10)
    with pytest.raises(TokenError, match=r"label 11 \(example 3\) .*\[0, 10\)"):
        interp.task_data(tokens, 7, torch.where(torch.arange(len(labels)) == 3, 11, labels % 10), vocab=vocab)


# -- D-k: mean ablation takes the fast path under method="auto" ----------------------------------------------------


def test_mean_ablation_auto_takes_the_fast_path_with_the_hooks_numbers():
    model = tl_model(n_heads=4)
    tokens, labels = token_data(model, n=40)
    data = interp.task_data(tokens, answer_pos=torch.arange(40) % 8, labels=labels)
    sets = [["L0H0", "L0H3"], ["L0H1"], [], ["L0H0", "L0H1", "L0H2", "L0H3"]]
    auto = analyses.learned_accuracy(model, data, heads=sets, ablation="mean")
    hooks = analyses.learned_accuracy(model, data, heads=sets, ablation="mean", method="hooks")
    assert auto.method == "fast" and hooks.method == "hooks"
    torch.testing.assert_close(auto.accuracy, hooks.accuracy, rtol=0, atol=0)
    # the logits behind them, to float32 rounding (the fast path sums the heads' W_O products in another order)
    fast_logits = analyses.subset_answer_logits(model, data, heads=sets, ablation="mean")
    hook_logits = analyses.subset_answer_logits(model, data, heads=sets, ablation="mean", method="hooks")
    torch.testing.assert_close(fast_logits, hook_logits, rtol=1e-5, atol=1e-5)
    assert type(auto).from_dict(auto.to_dict()).method == "fast"
    deep = tl_model(n_layers=2, n_heads=2)
    t2, l2 = token_data(deep)
    assert analyses.learned_accuracy(deep, interp.task_data(t2, 7, l2), ablation="mean").method == "hooks"


# -- D-c: a task whose parameters do not rebuild it is refused at save ---------------------------------------------


def test_save_refuses_a_task_its_parameters_do_not_rebuild(tmp_path):
    task = get_task("modular-addition", p=5)
    model = tl_model(d_vocab=6, d_vocab_out=5, n_ctx=3)
    object.__setattr__(task, "seed", -1)  # what loading would refuse: get_task("modular-addition", seed=-1)
    out = tmp_path / "bad.safetensors"
    with pytest.raises(
        CheckpointError, match=r"do not rebuild task 'modular-addition'.*seed must be a non-negative integer, got -1"
    ):
        interp.save_checkpoint(model, task, out)
    assert list(tmp_path.iterdir()) == []  # nothing written


# -- D-b: a model cast with model.to(dtype) saves and reloads ------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.float64, torch.bfloat16])
def test_a_model_cast_to_another_dtype_saves_and_reloads(tmp_path, dtype):
    task = get_task("modular-addition", p=5)
    model = tl_model(n_layers=2, d_vocab=6, d_vocab_out=5, n_ctx=3, attn_only=False).to(dtype)
    path = interp.save_checkpoint(model, task, tmp_path / "cast.safetensors")  # was: refused, naming IGNORE
    loaded, _ = interp.load(path, device="cpu")
    assert loaded.cfg.dtype == dtype
    tokens = torch.tensor([[0, 3, 5], [4, 1, 5]])
    with torch.no_grad():
        assert torch.equal(loaded(tokens), model(tokens))


# -- D-d: task names -------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["a/b", "../x", "x\ny", "über", "-lead", ".hidden", "a b", "", "tab\t"])
def test_task_names_outside_the_rule_are_refused(name):
    rule = re.escape("ASCII letters, digits, '-', '_' and '.', starting with a letter or digit")
    with pytest.raises(TaskError, match=rule) as e:
        TaskPlugin(name=name, make=lambda: None)
    assert "\n" not in str(e.value)


def test_task_names_inside_the_rule_are_accepted():
    for name in ("count-mod3", "v1.2_task", "3sum", "A"):
        assert TaskPlugin(name=name, make=lambda: None).name == name


# -- D-f: the generic suite's sentence where head scores are not defined --------------------------------------------


def test_generic_suite_says_head_scores_are_not_defined_as_a_sentence():
    from interp.analyses import generic_suite
    from interp.checkpoint import Checkpoint
    from interp.report_page import Report

    task = get_task("modular-addition", p=5)  # a context of 3 tokens: no repeat
    ckpt = Checkpoint(tl_model(d_vocab=6, d_vocab_out=5, n_ctx=3), task)
    text = generic_suite.analyze(ckpt).text()
    assert "head scores: not defined here: a context of 3 tokens holds no repeat:" in text
    assert "on not defined" not in text
    report = Report()
    generic_suite.add_report_sections(ckpt, report)
    page = report.html()
    assert "Learning and Induction Heads): not defined here: a context of 3 tokens holds no repeat." in page
    assert "on not defined" not in page


# -- D-g: removed names name their replacement ----------------------------------------------------------------------


@pytest.mark.parametrize(
    "module, name, says",
    [
        ("interp.tasks", "TASKS", "interp.register_task"),
        ("interp.tasks", "CHECKPOINT_ALIASES", "checkpoint_aliases()"),
        ("interp.app.explorer.inputs", "TYPED", "typed_example"),
        ("interp.app.explorer.inputs", "PAIR_KINDS", "corruption_kinds(task)"),
        ("interp.app.explorer.inputs", "OWN_KINDS", "corruption_kinds(task)"),
        ("interp.analyses.shapley", "shapley_of", "method='exact'"),
        ("interp.analyses.shapley", "exact_shapley", "CoalitionValues.shapley()"),
        ("interp.analyses.shapley", "sampled_shapley", "method='sampled'"),
        ("interp.analyses", "shapley_of", "method='exact'"),
        ("interp.analyses", "exact_shapley", "CoalitionValues.shapley()"),
        ("interp.analyses", "sampled_shapley", "method='sampled'"),
        ("interp.analyses", "learned_accuracy_loop", "moved to interp.analyses.reference"),
        ("interp.analyses", "path_patching_loop", "moved to interp.analyses.reference"),
        ("interp.analyses", "variant_metric", "moved to interp.analyses.reference"),
    ],
)
def test_removed_names_name_their_replacement(module, name, says):
    with pytest.raises(
        ImportError, match=re.escape(f"{module}.{name} was removed in 0.2.0: ") + ".*" + re.escape(says)
    ) as e:
        exec(f"from {module} import {name}", {})
    assert isinstance(e.value, RemovedNameError)
    with pytest.raises(RemovedNameError):
        getattr(importlib.import_module(module), name)


def test_unknown_names_stay_attribute_errors():
    for module in ("interp.tasks", "interp.analyses", "interp.analyses.shapley", "interp.app.explorer.inputs"):
        assert not hasattr(importlib.import_module(module), "no_such_name_here")


# -- D-h: a head mask as nested Python lists; 0-d integer tensors --------------------------------------------------


def test_heads_take_a_nested_list_mask_and_0d_integer_tensors():
    model = tl_model(n_layers=2, n_heads=3)
    tokens, labels = token_data(model)
    data = interp.task_data(tokens, 7, labels)
    mask = [[1.0, 0.0, 1.0], [1.0, 1.0, 0.0]]
    want = analyses.learned_accuracy(model, data, heads=torch.tensor(mask))
    for spelling in (mask, [[1, 0, 1], [1, 1, 0]], ((1, 0, 1), (1, 1, 0)), [mask, mask]):
        got = analyses.learned_accuracy(model, data, heads=spelling)
        assert got.subsets[0] == want.subsets[0] == ((0, 0), (0, 2), (1, 0), (1, 1))
        assert float(got.accuracy[0]) == float(want.accuracy[0])
    with pytest.raises(HeadError, match=r"does not fit this model; expected \[2, 3\]"):
        analyses.learned_accuracy(model, data, heads=[[1.0, 0.0], [1.0, 1.0]])
    with pytest.raises(HeadError, match="values other than 0 and 1"):
        analyses.learned_accuracy(model, data, heads=[[1.0, 0.5, 1.0], [1.0, 1.0, 1.0]])
    zero_d = (torch.tensor(1), torch.tensor(2))
    assert parse_head_sets(zero_d, 2, 3) == [((1, 2),)]
    assert parse_head_sets([zero_d, (0, torch.tensor(0))], 2, 3) == [((1, 2), (0, 0))]
    assert analyses.learned_accuracy(model, data, heads=[zero_d]).subsets == [((1, 2),)]
    with pytest.raises(HeadError):
        parse_head_sets((torch.tensor(1.0), torch.tensor(2)), 2, 3)  # a float is not an index
    # two heads per layer: integer pairs that are also a [2, 2] mask naming other heads are refused, tuples are heads
    with pytest.raises(HeadError, match="reads both as"):
        parse_head_sets([[1, 1], [0, 1]], 2, 2)
    assert parse_head_sets([(1, 1), (0, 1)], 2, 2) == [((1, 1), (0, 1))]
    assert parse_head_sets([[0, 1], [1, 0]], 2, 2) == [((0, 1), (1, 0))]  # the two readings agree


# -- D-i: non-players stay ablated in every coalition (stated, and measured) ----------------------------------------


def test_shapley_of_some_players_keeps_the_others_ablated_and_says_so():
    from pathlib import Path

    model = tl_model(n_layers=2, n_heads=2)
    tokens, labels = token_data(model, n=32)
    data = interp.task_data(tokens, 7, labels)
    players = ["L0H1", "L1H0"]
    res = analyses.shapley_values(model, data, heads=players, method="exact")
    # efficiency: the values add up to v(players) - v(no head), both with every non-player ablated
    alone = analyses.learned_accuracy(model, data, heads=[players, []]).accuracy
    assert res.v_all == pytest.approx(float(alone[0]), abs=1e-6)  # the players alone, not the whole model
    assert res.v_empty == pytest.approx(float(alone[1]), abs=1e-6)
    assert float(res.shapley.sum()) == pytest.approx(float(alone[0] - alone[1]), abs=1e-6)
    doc = " ".join(analyses.shapley_values.__doc__.split())
    assert "every other head of the model stays ablated in every coalition" in doc
    page = " ".join((Path(__file__).resolve().parents[1] / "docs" / "shapley.md").read_text().split())
    assert "Heads that are not players stay ablated in every coalition." in page
    assert "There is no option that keeps the other heads" in page


# -- D-j: a task whose dataset raises ------------------------------------------------------------------------------


def test_a_task_whose_dataset_raises_is_one_task_error(tmp_path):
    from interp.evaluation import evaluate_splits
    from interp.model import ModelSpec
    from interp.tasks.modular_addition import ModularAddition
    from interp.training import TrainConfig, train

    @dataclasses.dataclass(frozen=True)
    class Boom(ModularAddition):
        name = "boom"

        def dataset(self, split, seed=None):
            raise RuntimeError("dataset exploded\nsecond line")

    task = Boom(p=5)
    model = tl_model(d_vocab=6, d_vocab_out=5, n_ctx=3)
    pattern = r"task 'boom' could not build its '(train|test)' split: RuntimeError: dataset exploded second line"
    with pytest.raises(TaskError, match=pattern) as e:
        evaluate_splits(model, task)
    assert isinstance(e.value.__cause__, RuntimeError)
    spec = ModelSpec(**{**task.default_spec(), "d_model": 8, "n_heads": 2, "d_head": 4, "d_mlp": 8})
    with pytest.raises(TaskError, match=pattern):
        train(task, spec, TrainConfig(epochs=1), tmp_path / "boom.safetensors", device="cpu", progress=False)
    with pytest.raises(TaskError, match=pattern):
        interp.explore(model, task)
