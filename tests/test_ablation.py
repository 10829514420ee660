"""Learned accuracy (analyses.learned_accuracies): known answers, the whole model, the direct path, and equality of the
batched paths with a slow loop of one run_with_hooks per subset. Tolerances: logits 1e-4 absolute
(float32 sums in another order); accuracies exactly equal (same argmax on every example)."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from interp.analyses.learned_accuracies import (
    head_subsets,
    hooked_subset_logits,
    learned_accuracy,
    learned_accuracy_of_size,
    mean_head_outputs,
    subset_answer_logits,
)
from interp.analyses.reference import learned_accuracy_loop
from interp.errors import HeadError, InterpError, TaskError, TokenError
from interp.evaluation import evaluate
from interp.heads import head_mask

SUBSETS = [
    [],
    ["L0H1"],
    ["L0H3"],
    ["L0H8", "L0H9"],
    ["L0H0", "L0H5"],
    ["L0H1", "L0H7", "L0H12"],
    [f"L0H{h}" for h in range(16)],
]


@pytest.fixture(scope="module")
def small_test(nm_ckpt):
    """40 train sequences (0-100 digits) of the shipped task: short, so the slow loop stays cheap."""
    return nm_ckpt.task.dataset("train").select(slice(0, 40))


def test_minimal_transformer_head_is_perfect_alone(nm_task):
    from interp.analyses.noisy_majority.handbuilt import minimal_majority_transformer

    model = minimal_majority_transformer(nm_task)
    data = nm_task.dataset("test").select(slice(0, 200))
    data = data.select((data.fields["n0"] + data.fields["n1"]) > 0)
    res = learned_accuracy(model, data, heads=[["L0H0"], []])
    assert res.accuracy[0].item() == 1.0
    assert res["L0H0"] == 1.0
    # without its head the residual at '=' is x_= = 1, whose logits are threshold for '4' and -threshold for '5'
    from interp.tasks.noisy_majority import FOUR

    assert res.accuracy[1].item() == pytest.approx((data.labels == FOUR).float().mean().item(), abs=1e-7)


@pytest.mark.slow
def test_all_heads_equal_plain_accuracy(nm_ckpt):
    model, task = nm_ckpt.model, nm_ckpt.task
    data = task.dataset("test").select(slice(0, 100))
    res = learned_accuracy(model, data, heads=[[f"L0H{h}" for h in range(16)]])
    assert res.accuracy.item() == pytest.approx(evaluate(model, task, data, full_forward=True)["accuracy"], abs=1e-7)


def test_no_heads_equal_direct_path(nm_ckpt):
    """H = {}: logits (W_E[t] + W_pos[p] + b_O) W_U + b_U at '=', computed by hand."""
    model = nm_ckpt.model
    data = nm_ckpt.task.dataset("test").select(slice(0, 100))
    rows = torch.arange(len(data))
    tok = data.tokens[rows, data.answer_pos]
    with torch.no_grad():
        logits = (model.W_E[tok] + model.W_pos[data.answer_pos] + model.b_O[0]) @ model.W_U + model.b_U
    expected = (logits.argmax(-1) == data.labels).float().mean().item()
    for method in ("fast", "hooks"):
        got = learned_accuracy(model, data, heads=[[]], method=method).accuracy.item()
        assert got == pytest.approx(expected, abs=1e-7)


@pytest.mark.slow
@pytest.mark.parametrize("ablation", ["zero", "mean"])
def test_batched_paths_equal_slow_loop(nm_ckpt, small_test, ablation):
    model = nm_ckpt.model
    subsets = SUBSETS if ablation == "zero" else SUBSETS[1:4]
    kw = dict(ablation=ablation, reference=small_test)
    cached = subset_answer_logits(
        model, small_test, heads=[tuple((0, int(h[3:])) for h in s) for s in subsets], method="fast", **kw
    )
    hooked = subset_answer_logits(
        model, small_test, heads=[tuple((0, int(h[3:])) for h in s) for s in subsets], method="hooks", **kw
    )
    assert torch.allclose(cached, hooked, atol=1e-4)
    slow = learned_accuracy_loop(model, small_test, heads=subsets, **kw)
    for method in ("fast", "hooks"):
        assert torch.equal(
            learned_accuracy(model, small_test, heads=subsets, method=method, **kw).accuracy, slow.accuracy
        )


def test_hook_path_on_two_layer_model_equals_per_subset_runs(nm_task):
    """A random two-layer model with positions and LayerNorm: the generic hook path against one
    run_with_hooks per subset written here; the cached shortcut is refused."""
    from interp.model import ModelSpec, build_model

    spec = ModelSpec(
        d_vocab=9,
        d_vocab_out=8,
        n_ctx=nm_task.n_ctx,
        n_layers=2,
        d_model=16,
        n_heads=4,
        d_head=4,
        positional="standard",
        output_matrix="learned",
        normalization="LN",
        init_seed=3,
    )
    model = build_model(spec, device="cpu")
    data = nm_task.dataset("train").select(slice(0, 12))
    subsets = [(), ((0, 1),), ((0, 0), (1, 2)), ((1, 3),), tuple((l, h) for l in range(2) for h in range(4))]
    masks = head_mask(subsets, 2, 4)
    got = hooked_subset_logits(model, data, masks)
    rows = torch.arange(len(data))
    for s, m in enumerate(masks):
        hooks = [(f"blocks.{l}.attn.hook_z", lambda z, hook, l=l, m=m: z * m[l][None, None, :, None]) for l in range(2)]
        with torch.no_grad():
            ref = model.run_with_hooks(data.tokens, fwd_hooks=hooks)[rows, data.answer_pos]
        assert torch.allclose(got[s], ref, atol=1e-4)
    with pytest.raises(InterpError, match="one-layer"):
        learned_accuracy(model, data, heads=[[]], method="fast")
    z_mean = mean_head_outputs(model, data)
    assert z_mean.shape == (2, 4, 4)


def test_sizes_and_result_object(nm_ckpt, small_test):
    assert len(head_subsets(1, 16, 2)) == 120 and len(head_subsets(1, 16, 3)) == 560
    res = learned_accuracy_of_size(nm_ckpt.model, small_test, size=1)
    assert res.accuracy.shape == (16,) and res.names[3] == "{L0H3}"
    d = res.to_dict()
    assert d["subsets"][0] == ["L0H0"] and len(d["accuracy"]) == 16
    fig = res.figure()
    assert fig.data[0].type == "bar" and len(fig.data[0].x) == 16


def test_bad_input(nm_ckpt, small_test):
    model = nm_ckpt.model
    with pytest.raises(HeadError, match="out of range"):
        learned_accuracy(model, small_test, heads=[["L0H16"]])
    with pytest.raises(HeadError, match="twice"):
        learned_accuracy(model, small_test, heads=[["L0H1", "L0H1"]])
    with pytest.raises(InterpError, match="no head subsets"):
        learned_accuracy(model, small_test, heads=torch.zeros(0, 1, 16))  # a mask of no subsets ([] is one: empty)
    with pytest.raises(TaskError, match="repeated-tokens"):  # the task travels explicitly: data of another task
        learned_accuracy(
            model, dataclasses.replace(small_test, task="repeated-tokens"), heads=[["L0H1"]], task=nm_ckpt.task
        )
    from interp.tasks import get_task

    other = get_task("repeated-tokens", train_size=4, val_size=4, test_size=4).dataset("test")
    with pytest.raises(TaskError, match="does not fit the 'repeated-tokens' data"):  # without the task: by vocabulary
        learned_accuracy(model, other, heads=[["L0H1"]])
    with pytest.raises(TaskError, match="holds no examples"):
        learned_accuracy(model, small_test.select(slice(0, 0)), heads=[["L0H1"]])
    bad = dataclasses.replace(small_test, tokens=small_test.tokens.clone())
    bad.tokens[0, 1] = 42
    with pytest.raises(TokenError, match="outside the vocabulary"):
        learned_accuracy(model, bad, heads=[["L0H1"]])
    with pytest.raises(InterpError, match="ablation"):
        learned_accuracy(model, small_test, heads=[["L0H1"]], ablation="resample")
    with pytest.raises(InterpError, match="subset size"):
        head_subsets(1, 16, 17)


def test_pair_matrix_and_one_subset(nm_ckpt, small_test):
    """Figure 5's matrix: singles on the diagonal, pairs off it, heads sorted by the diagonal in the figure."""
    from interp.analyses.learned_accuracies import learned_accuracy_of
    from interp.analyses.noisy_majority.head_summary import pair_matrix

    model = nm_ckpt.model
    res = learned_accuracy(model, small_test, heads=head_subsets(1, 16, 1) + head_subsets(1, 16, 2))
    m = pair_matrix(res, 1, 16, "pairs")
    assert torch.equal(m.values, m.values.T) and not m.values.isnan().any()
    assert m.values[8, 9].item() == learned_accuracy_of(model, small_test, heads=["L0H8", "L0H9"])
    assert m.values[3, 3].item() == learned_accuracy_of(model, small_test, heads=["L0H3"])
    fig = m.figure()
    diag = m.values.diagonal()
    shown = [diag[int(name[3:])].item() for name in fig.data[0].y]
    assert shown == sorted(shown, reverse=True)
