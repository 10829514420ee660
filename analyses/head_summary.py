"""Per-head summary of a noisy-majority model (seed 000 §5.4): learned accuracy, separation accuracy, ROC AUC,
``w01``, ``w02`` and a one-line verdict per head; plus the pair tables of Figures 4 and 5.

Verdict thresholds (on the head's separation accuracy A_s, the seed's measure of whether a head solves the
task on its own; the seed finds good heads above 95% and bad ones near 50%):

- ``good``: A_s >= 0.95; ``partial``: 0.70 <= A_s < 0.95; ``bad``: A_s < 0.70.

The verdict adds what the attention ratios say: ``w01 ~ 1`` means ``1/2 <= w01 <= 2`` (0s and 1s weighted
alike), ``2s ignored`` means ``w02 >= 10``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch
from jaxtyping import Float
from torch import Tensor

from interp.heads import all_heads, head_label
from interp.task import TaskData

from .ablation import head_subsets, learned_accuracy, supports_cached
from .answer_cache import as_cache
from .attention_ratios import attention_ratios
from .probes import separation_accuracy

GOOD, PARTIAL = 0.95, 0.70
W01_BAND, W02_IGNORED = 2.0, 10.0


def verdict(separation: float, w01: float, w02: float) -> str:
    """``good``/``partial``/``bad`` by separation accuracy, with the attention pattern in words."""
    grade = "good" if separation >= GOOD else "partial" if separation >= PARTIAL else "bad"
    notes = []
    if math.isfinite(w01) and 1 / W01_BAND <= w01 <= W01_BAND:
        notes.append("w01 ~ 1")
    elif w01 > W01_BAND:
        notes.append("favours 0s over 1s")
    elif w01 < 1 / W01_BAND:
        notes.append("favours 1s over 0s")
    if w02 >= W02_IGNORED:
        notes.append("2s ignored")
    elif w02 < 1:
        notes.append("favours 2s over 0s")
    else:
        notes.append("2s only partly ignored")
    return f"{grade}: " + ", ".join(notes)


@dataclass
class PairMatrix:
    """A value per pair of heads, singles on the diagonal (Figures 4 and 5)."""

    values: Float[Tensor, "head head"]
    heads: list[str]
    title: str

    def sorted_order(self) -> list[int]:
        """Heads sorted by their single-head value (the diagonal), best first."""
        return torch.argsort(self.values.diagonal(), descending=True, stable=True).tolist()

    def figure(self, sort: bool = True):
        from interp.visualize import heatmap

        order = self.sorted_order() if sort else list(range(len(self.heads)))
        m = self.values[order][:, order]
        names = [self.heads[i] for i in order]
        return heatmap(m, names, names, title=self.title + (" (heads sorted by the diagonal)" if sort else ""),
                       colorscale="Viridis", zmid=None, zmin=0.5, zmax=1.0, text_fmt=".2f")

    def to_dict(self) -> dict:
        return {"heads": self.heads, "values": self.values.tolist()}

    def _repr_mimebundle_(self, include=None, exclude=None):
        return self.figure()._repr_mimebundle_(include, exclude)


def pair_matrix(result, n_layers: int, n_heads: int, title: str, values: Tensor | None = None) -> PairMatrix:
    """Fill a :class:`PairMatrix` from a result over singles and pairs (``values`` defaults to its accuracy)."""
    heads = all_heads(n_layers, n_heads)
    index = {hd: i for i, hd in enumerate(heads)}
    vals = result.accuracy if values is None else values
    m = torch.full((len(heads), len(heads)), float("nan"))
    for subset, v in zip(result.subsets, vals.tolist()):
        if len(subset) == 1:
            i = index[subset[0]]
            m[i, i] = v
        elif len(subset) == 2:
            i, j = index[subset[0]], index[subset[1]]
            m[i, j] = m[j, i] = v
    return PairMatrix(m, [head_label(*h) for h in heads], title)


@dataclass
class HeadSummary:
    """The head table (``rows``), the pair matrices and the whole-model reference accuracies."""

    rows: list[dict]
    model_accuracy: float
    direct_accuracy: float
    chance: float
    n_train: int
    n_test: int
    learned_pairs: PairMatrix | None = None
    separation_pairs: PairMatrix | None = None
    thresholds: dict = field(default_factory=lambda: {"good": GOOD, "partial": PARTIAL, "w01_band": W01_BAND,
                                                      "w02_ignored": W02_IGNORED})

    COLUMNS = ("head", "learned_accuracy", "separation_accuracy", "roc_auc", "w01", "w02", "verdict")

    def table(self) -> str:
        """A plain-text table."""
        head = f"{'head':<6} {'learned':>8} {'separ.':>8} {'AUC':>7} {'w01':>10} {'w02':>10}  verdict"
        lines = [head, "-" * len(head)]
        for r in self.rows:
            lines.append(f"{r['head']:<6} {r['learned_accuracy']:>8.3f} {r['separation_accuracy']:>8.3f} {r['roc_auc']:>7.3f} "
                         f"{r['w01']:>10.3g} {r['w02']:>10.3g}  {r['verdict']}")
        return "\n".join(lines)

    def _repr_html_(self) -> str:
        from interp.visualize import render_table

        return (f"<p>all heads: accuracy {self.model_accuracy:.3f}; no heads (direct path): {self.direct_accuracy:.3f}; "
                f"chance {self.chance:.3f}; {self.n_train} train / {self.n_test} test sequences</p>"
                + render_table(self.rows, list(self.COLUMNS), float_format=".3g"))


def head_summary(model, train, test, *, pairs: bool = True, C: float = 1000.0, standardize: bool = False,
                 test_data: TaskData | None = None) -> HeadSummary:
    """Everything in the head table, from one pass over ``train`` and one over ``test`` (task data or
    :class:`AnswerCache`; the test cache needs attention rows for ``w01``/``w02``). Models deeper than one
    layer need the test data itself for learned accuracy (hook path): pass it as ``test`` or ``test_data``."""
    L, H = model.cfg.n_layers, model.cfg.n_heads
    tr = as_cache(model, train, attention=False)
    te = as_cache(model, test, attention=True)
    test_data = test if isinstance(test, TaskData) else test_data
    singles = head_subsets(L, H, 1)
    pair_list = head_subsets(L, H, 2) if pairs else []
    everything = [tuple(all_heads(L, H))]
    subsets = singles + pair_list + everything + [()]
    if supports_cached(model) or test_data is None:
        la = learned_accuracy(model, te, subsets)
    else:
        la = learned_accuracy(model, test_data, subsets, method="hooks")
    sep = separation_accuracy(model, tr, te, singles + pair_list, C=C, standardize=standardize)
    ratios = attention_ratios(model, te)
    rows = []
    for i, ((l, h),) in enumerate(singles):
        w01, w02 = float(ratios.w01[l, h]), float(ratios.w02[l, h])
        row = {"head": head_label(l, h), "learned_accuracy": float(la.accuracy[i]),
               "separation_accuracy": float(sep.accuracy[i]), "roc_auc": float(sep.roc_auc[i]), "w01": w01, "w02": w02}
        if ratios.exact_w01 is not None:
            row["exact_w01"], row["exact_w02"] = float(ratios.exact_w01[l, h]), float(ratios.exact_w02[l, h])
        row["verdict"] = verdict(row["separation_accuracy"], w01, w02)
        rows.append(row)
    n = len(singles) + len(pair_list)
    summary = HeadSummary(rows, float(la.accuracy[n]), float(la.accuracy[n + 1]), sep.chance, sep.n_train, sep.n_test)
    if pairs:
        summary.learned_pairs = pair_matrix(_take(la, n), L, H, "Learned accuracy of head pairs (Figure 5)")
        summary.separation_pairs = pair_matrix(sep, L, H, "Separation accuracy of head pairs (Figure 4)")
    return summary


def _take(result, n: int):
    """The first ``n`` subsets of a result (drops the all-heads and no-heads entries)."""
    from copy import copy

    r = copy(result)
    r.subsets, r.accuracy = result.subsets[:n], result.accuracy[:n]
    return r
