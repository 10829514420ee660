"""Separation accuracy (analyses.separation_accuracies): equal to a plain scikit-learn fit on features read from
run_with_cache, and right on hand-built heads whose answer is known."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from interp.analyses.answer_cache import cache_answer
from interp.analyses.noisy_majority.handbuilt import attention_preference_model
from interp.analyses.separation_accuracies import fit_separator, head_features, separation_accuracy
from interp.errors import HeadError, InterpError, TaskError


@pytest.fixture(scope="module")
def shipped_split(nm_ckpt):
    task = nm_ckpt.task
    return task.dataset("train").select(slice(0, 600)), task.dataset("test").select(slice(0, 150))


@pytest.fixture(scope="module")
def small_task():
    from interp.tasks import get_task

    return get_task("noisy-majority", train_size=800, val_size=10, test_size=300)


def tie_free(data):
    return data.select(data.fields["n0"] != data.fields["n1"])


@pytest.mark.slow
def test_equals_plain_sklearn_on_run_with_cache_features(nm_ckpt, shipped_split):
    """Features read here with TransformerLens' run_with_cache (hook_z at '='), fitted with a LinearSVC built
    here. Tolerance: the accuracies may differ by one test example (features agree to ~1e-6, a point could sit
    on the boundary); AUC to 1e-3."""
    from sklearn.metrics import roc_auc_score
    from sklearn.svm import LinearSVC

    model = nm_ckpt.model
    train, test = shipped_split
    subsets = [["L0H1"], ["L0H0"], ["L0H3", "L0H5"]]
    res = separation_accuracy(model, test, train=train, heads=subsets, center=False)  # scikit-learn's raw number

    def feats(data):
        out = []
        for i in range(0, len(data), 50):
            chunk = data.select(slice(i, i + 50))
            with torch.no_grad():
                _, cache = model.run_with_cache(chunk.tokens, names_filter="blocks.0.attn.hook_z")
            out.append(cache["blocks.0.attn.hook_z"][torch.arange(len(chunk)), chunk.answer_pos])
        return torch.cat(out)

    z_tr, z_te = feats(train), feats(test)
    for i, subset in enumerate(subsets):
        heads = [int(h[3:]) for h in subset]
        x_tr = z_tr[:, heads].flatten(1).numpy()
        x_te = z_te[:, heads].flatten(1).numpy()
        clf = LinearSVC(penalty="l2", loss="squared_hinge", C=1000, dual=False, max_iter=10_000).fit(
            x_tr, train.labels.numpy()
        )
        acc = (clf.predict(x_te) == test.labels.numpy()).mean()
        auc = roc_auc_score(test.labels.numpy() == clf.classes_[1], clf.decision_function(x_te))
        assert abs(res.accuracy[i].item() - acc) <= 1 / len(test) + 1e-9
        assert res.roc_auc[i].item() == pytest.approx(auc, abs=1e-3)
    assert bool(res.converged.all())


def test_handbuilt_heads(small_task):
    """Head 0 weighs 0s and 1s alike and ignores everything else (w01 = 1, w02 = inf): its output is a point on
    the segment v0-v1 set by the share of 1s, so a line separates every tie-free example. Head 1 sees only 0s
    (w01 = inf): its output is v0 whatever the counts, so it cannot beat chance. The separators are fitted on
    the tie-free train split too: ties (labelled '4') sit exactly on the boundary and pull a soft-margin SVC."""
    model = attention_preference_model([{"0": 0.0, "1": 0.0}, {"0": 0.0}], task=small_task)
    train, test = tie_free(small_task.dataset("train")), tie_free(small_task.dataset("test"))
    for standardize in (False, True):
        res = separation_accuracy(model, test, train=train, standardize=standardize)
        assert res.accuracy[0].item() == 1.0 and res.roc_auc[0].item() == 1.0
        assert res.accuracy[1].item() < 0.6
        assert res.accuracy[1].item() <= res.chance + 1e-9


def test_answer_cache_paths_agree(nm_ckpt, shipped_split):
    """The query-restricted path of cache_answer equals run_with_cache (features to 1e-5)."""
    test = shipped_split[1].select(slice(0, 40))
    a = cache_answer(nm_ckpt.model, test, method="fast")
    b = cache_answer(nm_ckpt.model, test, method="hooks")
    assert torch.allclose(a.z, b.z, atol=1e-5) and torch.allclose(a.resid_pre, b.resid_pre, atol=1e-6)
    finite = torch.isfinite(b.log_attn)
    assert torch.equal(finite, torch.isfinite(a.log_attn))
    assert torch.allclose(a.log_attn[finite], b.log_attn[finite], atol=1e-4)
    assert head_features(a, heads=((0, 2), (0, 5))).shape == (40, 4)


def test_result_object(nm_ckpt, shipped_split):
    train, test = shipped_split
    res = separation_accuracy(nm_ckpt.model, test, train=train, heads=[["L0H1"], ["L0H8", "L0H9"]])
    d = res.to_dict()
    assert d["subsets"] == [["L0H1"], ["L0H8", "L0H9"]] and d["C"] == 1000.0 and d["n_train"] == 600
    fig = res.figure()
    assert [t.name for t in fig.data] == ["accuracy", "ROC AUC"]


def test_bad_input(nm_ckpt, shipped_split):
    model = nm_ckpt.model
    train, test = shipped_split
    with pytest.raises(HeadError, match="empty head subset"):
        separation_accuracy(model, test, train=train, heads=[[]])
    with pytest.raises(HeadError, match="out of range"):
        separation_accuracy(model, test, train=train, heads=[["L1H0"]])
    with pytest.raises(TaskError, match="repeated-tokens"):
        separation_accuracy(model, test, train=dataclasses.replace(train, task="repeated-tokens"), task=nm_ckpt.task)
    with pytest.raises(InterpError, match="C must be"):
        separation_accuracy(model, test, train=train, heads=[["L0H1"]], C=0)
    x = np.zeros((4, 2))
    with pytest.raises(InterpError, match="one class"):
        fit_separator(x, np.array([5, 5, 5, 5]), x, np.array([5, 6, 5, 6]))
