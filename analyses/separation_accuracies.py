"""Separation accuracy A_s(H) (Fraknói 2024, Definition 5.2): how well a linear separator on the outputs of the
heads in H, at the answer position, predicts the answer.

Features are the heads' outputs ``r^h`` = ``hook_z`` at the answer position (``d_head`` numbers per head,
concatenated over the heads of H). The separator is scikit-learn's
``LinearSVC(penalty="l2", loss="squared_hinge", C=1000)`` as the thesis specifies, fitted on the train split and
scored on the test split; ROC AUC of its decision function is reported beside accuracy (the published
follow-up, Zsamboki et al. 2025, reports both).

Centring (``center=True``, the default) subtracts the train features' mean before the fit (and from the test
features). The separator's function class is unchanged (any ``w.x + b`` stays expressible), but liblinear
penalises the intercept like a weight (a bias feature of value ``intercept_scaling = 1``), so on raw features far
from the origin the fit cannot place its threshold: the thesis's §5.3 minimal transformer has head outputs near 30.7
and, raw, a train accuracy of 0.987 and test accuracy 0.928 although its ROC AUC is 1.0; centred it separates the
train split exactly. ``center=False`` gives scikit-learn's raw number. Where a perfect ranking (ROC AUC = 1) still
comes with test accuracy < 1 (the max-margin threshold fitted on the short train sequences misplaced on the
longer test ones: the thesis's definition itself), ``threshold_limited`` flags it.

Standardisation (``standardize=True``) puts a ``StandardScaler`` fitted on the train features in front of the
SVC. It is off by default because the thesis fits the raw outputs; with ``C=1000`` the penalty is weak either
way, but it changes the effective regularisation when head outputs are tiny or huge. The solver is
liblinear's primal Newton method (``dual=False``: far more samples than features), which converges in a few
dozen iterations here; a fit that still hits ``max_iter`` is recorded in ``converged`` instead of warning.

Tensors stay on the model's device until the scikit-learn boundary, where the features move to CPU once.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np
import torch
from jaxtyping import Float
from torch import Tensor

from interp.errors import InterpError
from interp.heads import head_label, one_set
from interp.results import Result, floats, head_of, jsonable

from .answer_cache import AnswerCache, as_cache, check_inputs
from .learned_accuracies import Subset, subset_name, subsets_of

if TYPE_CHECKING:
    from transformer_lens import HookedTransformer

    from interp.task import Task, TaskData


@dataclass(eq=False)
class SeparationAccuracy(Result):
    """Test accuracy and ROC AUC of a linear separator per head subset (``accuracy[s]`` is ``subsets[s]``'s)."""

    subsets: list[Subset]
    accuracy: Float[Tensor, " subset"]
    roc_auc: Float[Tensor, " subset"]
    train_accuracy: Float[Tensor, " subset"]
    converged: Tensor
    C: float
    standardize: bool
    n_train: int
    n_test: int
    chance: float = field(default=float("nan"))  # accuracy of always predicting the commonest test label
    center: bool = True

    @property
    def threshold_limited(self) -> Tensor:
        """Per subset: a perfect ranking (ROC AUC = 1) whose fitted threshold still misclassifies test examples."""
        return (self.roc_auc == 1.0) & (self.accuracy < 1.0)

    @property
    def names(self) -> list[str]:
        return [subset_name(s) for s in self.subsets]

    def to_dict(self) -> dict:
        return jsonable(
            {
                "C": self.C,
                "center": self.center,
                "standardize": self.standardize,
                "n_train": self.n_train,
                "n_test": self.n_test,
                "chance": self.chance,
                "subsets": [[head_label(*h) for h in s] for s in self.subsets],
                "accuracy": self.accuracy,
                "roc_auc": self.roc_auc,
                "train_accuracy": self.train_accuracy,
                "converged": self.converged,
                "threshold_limited": self.threshold_limited,
            }
        )

    @classmethod
    def from_dict(cls, d: dict) -> SeparationAccuracy:
        return cls(
            subsets=[tuple(head_of(h) for h in s) for s in d["subsets"]],
            accuracy=floats(d["accuracy"]),
            roc_auc=floats(d["roc_auc"]),
            train_accuracy=floats(d["train_accuracy"]),
            converged=torch.tensor(d["converged"], dtype=torch.bool),
            C=d["C"],
            standardize=d["standardize"],
            n_train=d["n_train"],
            n_test=d["n_test"],
            chance=float("nan") if d["chance"] is None else d["chance"],
            center=d["center"],
        )

    def text(self, top: int = 10) -> str:
        """The ``top`` best subsets: test accuracy, ROC AUC and train accuracy."""
        order = torch.argsort(self.accuracy, descending=True, stable=True)[:top].tolist()
        lines = [
            f"separation accuracy (LinearSVC C={self.C:g}, {self.n_train} train / {self.n_test} test; chance "
            f"{self.chance:.3f}) of {len(self.subsets)} head subset(s)"
        ]
        lines.append(f"  {'subset':<24}{'accuracy':>10}{'ROC AUC':>10}{'train':>10}")
        for i in order:
            lines.append(
                f"  {self.names[i]:<24}{float(self.accuracy[i]):>10.4f}{float(self.roc_auc[i]):>10.4f}"
                f"{float(self.train_accuracy[i]):>10.4f}" + ("" if bool(self.converged[i]) else "  (not converged)")
            )
        return "\n".join(lines)

    def figure(self, top: int = 40):
        import plotly.graph_objects as go

        order = torch.argsort(self.accuracy, descending=True)[:top].tolist()
        names = [self.names[i] for i in order]
        fig = go.Figure(
            [
                go.Bar(name="accuracy", x=names, y=[float(self.accuracy[i]) for i in order]),
                go.Bar(name="ROC AUC", x=names, y=[float(self.roc_auc[i]) for i in order]),
            ]
        )
        fig.update_layout(
            title=f"Separation accuracy (LinearSVC C={self.C:g}, {self.n_train} train / {self.n_test} test)",
            yaxis_range=[0, 1],
            barmode="group",
            template="plotly_white",
        )
        return fig


def head_features(cache: AnswerCache, *, heads: object) -> Float[Tensor, "batch feature"]:
    """The outputs of the heads of one set ``heads`` at the answer position, concatenated: ``[batch, |H| * d_head]``
    (the separator's features)."""
    _, n_layers, n_heads, _ = cache.z.shape
    subset = one_set(heads, n_layers, n_heads)
    return torch.cat([cache.z[:, l, h] for l, h in subset], dim=-1)


def make_separator(C: float = 1000.0, standardize: bool = False, max_iter: int = 10_000, random_state: int = 0):
    """The thesis's separator: ``LinearSVC(penalty="l2", loss="squared_hinge", C)``, optionally after a scaler."""
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler
    from sklearn.svm import LinearSVC

    if not (isinstance(C, (int, float)) and C > 0):
        raise InterpError(f"C must be a positive number, got {C!r}")
    svc = LinearSVC(
        penalty="l2", loss="squared_hinge", C=float(C), dual=False, max_iter=max_iter, random_state=random_state
    )
    return make_pipeline(StandardScaler(), svc) if standardize else svc


def fit_separator(
    x_train: np.ndarray,
    y_train: np.ndarray,
    x_test: np.ndarray,
    y_test: np.ndarray,
    *,
    C: float = 1000.0,
    standardize: bool = False,
    center: bool = True,
    max_iter: int = 10_000,
) -> dict:
    """Fit on train, score on test: ``accuracy``, ``roc_auc`` (binary labels; NaN otherwise), ``train_accuracy``,
    ``converged`` (False when liblinear stopped at ``max_iter``). ``center``: subtract the train mean first."""
    from sklearn.exceptions import ConvergenceWarning
    from sklearn.metrics import roc_auc_score

    if not (np.isfinite(x_train).all() and np.isfinite(x_test).all()):
        raise InterpError(
            "the head outputs hold NaN or infinite values (are the model's weights finite?); "
            "a separator needs finite features"
        )
    if center:
        mean = x_train.mean(0, keepdims=True)
        x_train, x_test = x_train - mean, x_test - mean
    classes = np.unique(y_train)
    if len(classes) < 2:
        raise InterpError(f"the train labels contain one class only ({classes.tolist()}); a separator needs two")
    clf = make_separator(C, standardize, max_iter)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", ConvergenceWarning)
        clf.fit(x_train, y_train)
    converged = not any(issubclass(w.category, ConvergenceWarning) for w in caught)
    auc = float("nan")
    if len(classes) == 2 and len(np.unique(y_test)) == 2:
        auc = float(roc_auc_score(y_test == classes[1], clf.decision_function(x_test)))
    return {
        "accuracy": float((clf.predict(x_test) == y_test).mean()),
        "roc_auc": auc,
        "train_accuracy": float((clf.predict(x_train) == y_train).mean()),
        "converged": converged,
    }


def separation_accuracy(
    model: HookedTransformer,
    data: TaskData | AnswerCache,
    *,
    train: TaskData | AnswerCache | None = None,
    heads: object = None,
    C: float = 1000.0,
    standardize: bool = False,
    center: bool = True,
    max_iter: int = 10_000,
    task: Task | None = None,
    batch_size: int | None = None,
    device: str | None = None,
) -> SeparationAccuracy:
    """A_s(H) for every head set H of ``heads`` (default: each head alone): a separator fitted on ``train`` (default
    ``task.dataset("train")``) and scored on ``data`` (the test split). Both are task data or :class:`AnswerCache`
    objects (reuse them across calls: the forward pass is the expensive part)."""
    if train is None:
        if task is None:
            raise InterpError(
                "separation_accuracy fits its separators on a train split: pass train=... (task data or an "
                "AnswerCache) or task=..."
            )
        train = task.dataset("train")
    check_inputs(model, train, task=task, device=device, batch_size=batch_size, what="train")
    check_inputs(model, data, task=task, what="data")
    parsed = subsets_of(model, heads, allow_empty=False)
    tr = as_cache(model, train, attention=False, batch_size=batch_size)
    te = as_cache(model, data, attention=False, batch_size=batch_size)
    if tr.task != te.task:
        raise InterpError(f"train data is of task {tr.task!r} but the scored data of task {te.task!r}")
    # the scikit-learn boundary: move everything to CPU once
    z_tr, z_te = tr.z.float().cpu(), te.z.float().cpu()
    y_tr, y_te = tr.labels.cpu().numpy(), te.labels.cpu().numpy()
    rows = []
    for subset in parsed:
        cols_tr = torch.cat([z_tr[:, l, h] for l, h in subset], -1).numpy()
        cols_te = torch.cat([z_te[:, l, h] for l, h in subset], -1).numpy()
        rows.append(
            fit_separator(cols_tr, y_tr, cols_te, y_te, C=C, standardize=standardize, center=center, max_iter=max_iter)
        )
    _, counts = np.unique(y_te, return_counts=True)
    return SeparationAccuracy(
        subsets=parsed,
        accuracy=torch.tensor([r["accuracy"] for r in rows]),
        roc_auc=torch.tensor([r["roc_auc"] for r in rows]),
        train_accuracy=torch.tensor([r["train_accuracy"] for r in rows]),
        converged=torch.tensor([r["converged"] for r in rows]),
        C=float(C),
        standardize=standardize,
        n_train=len(tr),
        n_test=len(te),
        chance=float(counts.max() / counts.sum()),
        center=center,
    )
