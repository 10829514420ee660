"""Per-head summary of a noisy-majority model (Fraknói 2024, §5.4): learned accuracy, separation accuracy, ROC AUC,
``w01``, ``w02`` and a one-line verdict per head; plus the pair tables of Figures 4 and 5.

The **grade** is based on the head's separation accuracy A_s alone (the thesis's measure of whether a linear
probe can read the answer from the head's output; the thesis finds good heads above 95% and bad ones near 50%):
``good``: A_s >= 0.95; ``partial``: 0.70 <= A_s < 0.95; ``bad``: A_s < 0.70. A probe can read the answer from
heads the model does not use (even from the heads of an untrained model, whose outputs still mix the digits'
value vectors by their counts), so the summary warns when the model itself is at or below chance, and the learned
accuracy beside the grade says what the head does for the model.

The **attention words** come from the measured ratios with a tolerance band of a factor 2 around 1 (ratios
within it are "alike", so 0.97 and 1.01 read the same): ``w01`` in [1/2, 2]: 0s and 1s weighted alike; above:
favours 0s; below: favours 1s. ``w02`` >= 10: 2s ignored; in [2, 10): 2s down-weighted; in [1/2, 2): 2s weighted
like 0s; below 1/2: favours 2s over 0s.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch
from jaxtyping import Float
from torch import Tensor

from interp.errors import TaskError
from interp.heads import all_heads, head_label
from interp.query_forward import supports_query_forward
from interp.results import Result, floats, jsonable
from interp.task import TaskData

from ..answer_cache import AnswerCache, as_cache, cache_answer, check_inputs
from ..learned_accuracies import head_subsets, learned_accuracy
from ..separation_accuracies import separation_accuracy
from . import require_task_data
from .attention_ratios import attention_ratios

if TYPE_CHECKING:
    from transformer_lens import HookedTransformer

    from interp.checkpoint import Checkpoint
    from interp.task import Task

GOOD, PARTIAL = 0.95, 0.70
BAND = 2.0  # ratios within a factor BAND of 1 read as "alike"
W02_IGNORED = 10.0
AT_CHANCE = 0.02  # a model at most this above chance accuracy (or below it) is "at or below chance"
LEARNED_PAIRS = "Learned accuracy of head pairs (Figure 5)"
SEPARATION_PAIRS = "Separation accuracy of head pairs (Figure 4)"
NUMERIC = ("learned_accuracy", "separation_accuracy", "roc_auc", "w01", "w02", "exact_w01", "exact_w02")


def grade(separation: float) -> str:
    """``good`` / ``partial`` / ``bad`` by separation accuracy (see the module doc)."""
    return "good" if separation >= GOOD else "partial" if separation >= PARTIAL else "bad"


def attention_words(w01: float, w02: float) -> list[str]:
    """The measured ratios in words, with the tolerance band of the module doc."""
    words = []
    if not math.isfinite(w01) and not math.isinf(w01):
        words.append("w01 undefined")
    elif 1 / BAND <= w01 <= BAND:
        words.append("0s and 1s weighted alike")
    else:
        words.append("favours 0s over 1s" if w01 > BAND else "favours 1s over 0s")
    if math.isnan(w02):
        words.append("w02 undefined")
    elif w02 >= W02_IGNORED:
        words.append("2s ignored")
    elif w02 >= BAND:
        words.append("2s down-weighted")
    elif w02 >= 1 / BAND:
        words.append("2s weighted like 0s")
    else:
        words.append("favours 2s over 0s")
    return words


def verdict(separation: float, w01: float, w02: float) -> str:
    """The grade, the separation accuracy it is based on, and the attention in words, e.g.
    ``good separator (separation accuracy 0.990): favours 0s over 1s, 2s ignored``."""
    return f"{grade(separation)} separator (separation accuracy {separation:.3f}): " + ", ".join(
        attention_words(w01, w02)
    )


@dataclass(eq=False)
class PairMatrix(Result):
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
        return heatmap(
            m,
            names,
            names,
            title=self.title + (" (heads sorted by the diagonal)" if sort else ""),
            colorscale="Viridis",
            zmid=None,
            zmin=0.5,
            zmax=1.0,
            text_fmt=".2f",
        )

    def to_dict(self) -> dict:
        return jsonable({"title": self.title, "heads": self.heads, "values": self.values})

    @classmethod
    def from_dict(cls, d: dict) -> PairMatrix:
        return cls(floats(d["values"]), list(d["heads"]), d["title"])

    def text(self, k: int = 5) -> str:
        """The best ``k`` pairs and the best single heads."""
        n = len(self.heads)
        pairs = sorted(
            ((float(self.values[i, j]), self.heads[i], self.heads[j]) for i in range(n) for j in range(i + 1, n)),
            key=lambda t: -t[0] if not math.isnan(t[0]) else math.inf,
        )[:k]
        singles = [(float(self.values[i, i]), self.heads[i]) for i in self.sorted_order()[:k]]
        return "\n".join(
            [
                f"{self.title}: {n} heads",
                "  best pairs: " + ", ".join(f"{a}+{b} {v:.3f}" for v, a, b in pairs),
                "  best single heads: " + ", ".join(f"{h} {v:.3f}" for v, h in singles),
            ]
        )


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


@dataclass(eq=False)
class HeadSummary(Result):
    """The head table (``rows``), the pair matrices and the whole-model reference accuracies."""

    rows: list[dict]
    model_accuracy: float
    direct_accuracy: float
    chance: float
    n_train: int
    n_test: int
    learned_pairs: PairMatrix | None = None
    separation_pairs: PairMatrix | None = None
    exact_ratios: bool = False  # w01/w02 also computed exactly from the QK circuit (1 layer, no positions)
    ratio_difference: float | None = None  # largest relative difference measured vs exact
    checkpoint: str = ""
    thresholds: dict = field(
        default_factory=lambda: {
            "good": GOOD,
            "partial": PARTIAL,
            "band": BAND,
            "w02_ignored": W02_IGNORED,
            "grade_based_on": "separation accuracy",
        }
    )

    COLUMNS = ("head", "learned_accuracy", "separation_accuracy", "roc_auc", "w01", "w02", "verdict")

    @property
    def warning(self) -> str | None:
        """Set when the model itself is at or below chance (at most ``AT_CHANCE`` above it): the grades then describe
        probes, not what the model uses."""
        if self.model_accuracy <= self.chance + AT_CHANCE:
            return (
                f"the model's accuracy {self.model_accuracy:.3f} is at or below chance ({self.chance:.3f}): the grades "
                "say what a linear probe reads from each head's output, not what this model uses"
            )
        return None

    def ratio_note(self) -> str:
        """Where w01/w02 come from, computed from this model (the caption of Figure 7)."""
        if self.exact_ratios and self.ratio_difference is None:
            return (
                "Measured on the test split; no head has a finite measured ratio to compare with the exact values "
                "from the QK circuit (a class of tokens gets no attention)."
            )
        if self.exact_ratios:
            return (
                "Measured on the test split. This model has one layer and no positional embedding, so every 0 (1, 2) "
                "gets the same attention and the measured ratios equal the exact values from the QK circuit (largest "
                f"relative difference {self.ratio_difference:.1e})."
            )
        return (
            "Measured on the test split (geometric mean over sequences of the per-token ratio). This model has more "
            "than one layer, a positional embedding or a sparse attention mask, so the ratios vary between sequences "
            "and have no exact value from the QK circuit alone."
        )

    def table(self) -> str:
        """A plain-text table."""
        head = (
            f"{'head':<6} {'learned':>8} {'separ.':>8} {'AUC':>7} {'w01':>10} {'w02':>10}  "
            "verdict (grade by separation accuracy)"
        )
        lines = [head, "-" * len(head)]
        for r in self.rows:
            lines.append(
                f"{r['head']:<6} {r['learned_accuracy']:>8.3f} {r['separation_accuracy']:>8.3f} {r['roc_auc']:>7.3f} "
                f"{r['w01']:>10.3g} {r['w02']:>10.3g}  {r['verdict']}"
            )
        return "\n".join(lines)

    def best_pairs(self, which: str = "learned", k: int = 5) -> list[tuple[float, str, str]]:
        m = self.learned_pairs if which == "learned" else self.separation_pairs
        if m is None:
            return []
        n = len(m.heads)
        pairs = [
            (float(m.values[i, j]), m.heads[i], m.heads[j])
            for i in range(n)
            for j in range(i + 1, n)
            if not math.isnan(float(m.values[i, j]))
        ]
        return sorted(pairs, reverse=True)[:k]

    def text(self) -> str:
        """What ``interp analyze`` prints."""
        lines = [
            f"{self.checkpoint or 'model'} (noisy-majority): accuracy {self.model_accuracy:.4f} with all heads, "
            f"{self.direct_accuracy:.4f} with none (direct path); separators fitted on {self.n_train} train, "
            f"scored on {self.n_test} test sequences (chance {self.chance:.3f})"
        ]
        if self.warning:
            lines.append("warning: " + self.warning)
        lines += ["", self.table(), ""]
        for which in ("learned", "separation"):
            best = self.best_pairs(which)
            if best:
                lines.append(f"best pairs by {which} accuracy: " + ", ".join(f"{a}+{b} {v:.3f}" for v, a, b in best))
        return "\n".join(lines)

    def to_dict(self) -> dict:
        d = {
            "task": "noisy-majority",
            "checkpoint": self.checkpoint,
            "n_train": self.n_train,
            "n_test": self.n_test,
            "accuracy": self.model_accuracy,
            "direct_path_accuracy": self.direct_accuracy,
            "chance": self.chance,
            "warning": self.warning,
            "thresholds": self.thresholds,
            "exact_ratios": self.exact_ratios,
            "ratio_difference": self.ratio_difference,
            "heads": self.rows,
            "pairs": None,
        }
        if self.learned_pairs is not None:
            d["pairs"] = {
                "heads": self.learned_pairs.heads,
                "learned_accuracy": self.learned_pairs.values,
                "separation_accuracy": self.separation_pairs.values,
            }
        return jsonable(d)

    @classmethod
    def from_dict(cls, d: dict) -> HeadSummary:
        def number(v):
            return float("nan") if v is None else v

        rows = [{k: number(v) if k in NUMERIC else v for k, v in r.items()} for r in d["heads"]]
        pairs = d["pairs"]
        res = cls(
            rows,
            d["accuracy"],
            d["direct_path_accuracy"],
            d["chance"],
            d["n_train"],
            d["n_test"],
            exact_ratios=d["exact_ratios"],
            ratio_difference=d.get("ratio_difference"),
            checkpoint=d["checkpoint"],
            thresholds=dict(d["thresholds"]),
        )
        if pairs is not None:
            res.learned_pairs = PairMatrix(floats(pairs["learned_accuracy"]), list(pairs["heads"]), LEARNED_PAIRS)
            res.separation_pairs = PairMatrix(
                floats(pairs["separation_accuracy"]), list(pairs["heads"]), SEPARATION_PAIRS
            )
        return res

    def figure(self):
        """Figure 7 of this model: w01 against w02, coloured by separation accuracy."""
        from .attention_ratios import ratio_figure

        return ratio_figure(
            [r["w01"] for r in self.rows],
            [r["w02"] for r in self.rows],
            [r["head"] for r in self.rows],
            torch.tensor([r["separation_accuracy"] for r in self.rows]),
        )

    def table_html(self) -> str:
        from interp.visualize import escape_text, render_table

        note = (
            f"<p>all heads: accuracy {self.model_accuracy:.3f}; no heads (direct path): {self.direct_accuracy:.3f}; "
            f"chance {self.chance:.3f}; {self.n_train} train / {self.n_test} test sequences</p>"
        )
        if self.warning:
            note += f"<p><b>warning:</b> {escape_text(self.warning)}</p>"
        return note + render_table(self.rows, list(self.COLUMNS), float_format=".3g")


def head_summary(
    model: HookedTransformer,
    data: TaskData | AnswerCache,
    *,
    train: TaskData | AnswerCache | None = None,
    pairs: bool = True,
    C: float = 1000.0,
    standardize: bool = False,
    center: bool = True,
    task: Task | None = None,
    batch_size: int | None = None,
    device: str | None = None,
) -> HeadSummary:
    """Everything in the head table, from one pass over ``train`` (the separators' fit; default
    ``task.dataset("train")``) and one over ``data`` (the scored test split): noisy-majority task data or
    :class:`AnswerCache` objects (a cache of ``data`` needs attention rows for ``w01``/``w02``; models deeper than
    one layer compute learned accuracy with hooks on the data the cache was built from). Works for any number of
    heads and layers (pairs need at least two heads)."""
    if train is None:
        if task is None:
            raise TaskError("head_summary fits its separators on a train split: pass train=... or task=...")
        train = task.dataset("train")
    require_task_data(train)
    require_task_data(data)
    check_inputs(model, train, task=task, device=device, batch_size=batch_size, what="train")
    check_inputs(model, data, task=task, what="data")
    L, H = model.cfg.n_layers, model.cfg.n_heads
    tr = as_cache(model, train, attention=False, batch_size=batch_size)
    te = as_cache(model, data, attention=True, batch_size=batch_size)
    singles = head_subsets(L, H, 1)
    pair_list = head_subsets(L, H, 2) if pairs and L * H >= 2 else []
    everything = [tuple(all_heads(L, H))]
    subsets = singles + pair_list + everything + [()]
    if supports_query_forward(model):
        la = learned_accuracy(model, te, heads=subsets, batch_size=batch_size)
    elif te.data is not None:
        la = learned_accuracy(model, te.data, heads=subsets, method="hooks", batch_size=batch_size)
    else:
        raise TaskError(
            "a model deeper than one layer needs the test data itself for learned accuracy (the hook path): pass "
            "it as data (or a cache built by cache_answer, which keeps it)"
        )
    sep = separation_accuracy(
        model, te, train=tr, heads=singles + pair_list, C=C, standardize=standardize, center=center
    )
    ratios = attention_ratios(model, te)
    rows = []
    for i, ((l, h),) in enumerate(singles):
        w01, w02 = float(ratios.w01[l, h]), float(ratios.w02[l, h])
        row = {
            "head": head_label(l, h),
            "learned_accuracy": float(la.accuracy[i]),
            "separation_accuracy": float(sep.accuracy[i]),
            "roc_auc": float(sep.roc_auc[i]),
            "w01": w01,
            "w02": w02,
        }
        if ratios.exact_w01 is not None:
            row["exact_w01"], row["exact_w02"] = float(ratios.exact_w01[l, h]), float(ratios.exact_w02[l, h])
        row["grade"] = grade(row["separation_accuracy"])
        row["threshold_limited"] = bool(sep.threshold_limited[i])
        row["verdict"] = verdict(row["separation_accuracy"], w01, w02)
        rows.append(row)
    n = len(singles) + len(pair_list)
    summary = HeadSummary(
        rows,
        float(la.accuracy[n]),
        float(la.accuracy[n + 1]),
        sep.chance,
        sep.n_train,
        sep.n_test,
        exact_ratios=ratios.exact_w01 is not None,
        ratio_difference=ratios.max_relative_difference(),
    )
    if pairs:
        summary.learned_pairs = pair_matrix(_take(la, n), L, H, LEARNED_PAIRS)
        summary.separation_pairs = pair_matrix(sep, L, H, SEPARATION_PAIRS)
    return summary


def _take(result, n: int):
    """The first ``n`` subsets of a result (drops the all-heads and no-heads entries)."""
    from copy import copy

    r = copy(result)
    r.subsets, r.accuracy = result.subsets[:n], result.accuracy[:n]
    return r


def checkpoint_summary(
    ckpt: Checkpoint, train_size: int | None = None, test_size: int | None = None, pairs: bool = True
):
    """The head summary of ``ckpt`` on the first ``train_size`` / ``test_size`` sequences of its task's splits
    (all by default), with the caches and data it used."""
    model, task = ckpt.model, ckpt.task
    train, test = task.dataset("train"), task.dataset("test")
    if train_size is not None and train_size < len(train):
        train = train.select(slice(0, train_size))
    if test_size is not None and test_size < len(test):
        test = test.select(slice(0, test_size))
    tr = cache_answer(model, train, attention=False, task=task)
    te = cache_answer(model, test, attention=True, task=task)
    summary = head_summary(model, te, train=tr, pairs=pairs)
    summary.checkpoint = ckpt.name
    return summary, train, test, tr, te
