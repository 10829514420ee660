"""Halving-heads strategies, their head scores and Figure 10 (Fraknói 2024, §5.5).

The mask and the schedule live in :mod:`interp.halving`; this module supplies what scores the active heads at a
halving step (higher is kept), all computed on the model as it is at that step (masked heads are zero already):

- ``svc``: each head's separation accuracy (Definition 5.2,
  :func:`analyses.separation_accuracies.separation_accuracy`: a linear SVC fitted on the train split, scored on the
  validation split: the test split is never seen during training).
- ``learned``: each head's learned accuracy on the validation split (Definition 5.1,
  :func:`analyses.learned_accuracies.learned_accuracy`: every other head zeroed).
- ``shapley-svc`` / ``shapley-learned``: each head's exact Shapley value (Definition 5.3) over the active heads
  with v = separation accuracy or learned accuracy (:func:`analyses.shapley.shapley_values`, exact):
  :func:`analyses.coalitions.coalition_values` evaluates v on all 2^n coalitions (the exact SVC for separation, in
  C: 8-10 s on one thread for all 65,536 coalitions of 16 heads of Table 1's d = 32 models, docs/benchmarks.md) and
  :meth:`analyses.coalitions.CoalitionValues.shapley` transforms them, so the thesis's a = 16 runs that it skipped
  "because of the high computational time" are affordable.
- ``random`` and ``mask-all-but-one`` are scored in :mod:`interp.halving` (no analysis needed).

:func:`train_halving` is :func:`interp.training.train` with the strategy's scorer wired in (the CLI's
``interp train TASK --halving STRATEGY``); :func:`halving_history` reads a checkpoint's halving record into a
:class:`HalvingHistory` result whose figure is the thesis's Figure 10.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from interp.configs import SELF_SCORED, STRATEGIES
from interp.errors import ConfigError, InterpError
from interp.halving import Scorer
from interp.heads import one_set
from interp.results import Result, jsonable

from .learned_accuracies import learned_accuracy
from .separation_accuracies import separation_accuracy

if TYPE_CHECKING:
    from transformer_lens import HookedTransformer

    from interp.task import Task

VALUES = ("learned", "svc")


def single_head_scores(
    model: HookedTransformer,
    data,
    *,
    heads: object,
    value: str,
    train=None,
    task: Task | None = None,
    batch_size: int | None = None,
    device: str | None = None,
) -> list[float]:
    """Per head of ``heads`` (one set): its separation accuracy (``value="svc"``, fitted on ``train``, scored on
    ``data``) or its learned accuracy on ``data`` (``value="learned"``)."""
    if value not in VALUES:
        raise InterpError(f"unknown head value {value!r}; expected one of {VALUES}")
    cfg = model.cfg
    subsets = [[h] for h in one_set(heads, cfg.n_layers, cfg.n_heads)]
    kw = dict(heads=subsets, task=task, batch_size=batch_size, device=device)
    if value == "svc":
        if train is None:
            raise InterpError("value='svc' needs train data to fit the separators on")
        return separation_accuracy(model, data, train=train, **kw).accuracy.tolist()
    return learned_accuracy(model, data, **kw).accuracy.tolist()


def shapley_scores(
    model: HookedTransformer,
    data,
    *,
    heads: object,
    value: str,
    train=None,
    task: Task | None = None,
    solver: str = "torch",
    batch_size: int | None = None,
    device: str | None = None,
) -> list[float]:
    """Exact Shapley value of each head in ``heads`` over the coalitions of ``heads`` (the other heads zeroed), with
    v = learned accuracy on ``data`` (``value="learned"``) or separation accuracy fitted on ``train`` and scored on
    ``data`` (``value="svc"``; ``solver="torch"``: the batched SVC, ``"sklearn"``: one LinearSVC per coalition):
    :func:`analyses.shapley.shapley_values` with ``method="exact"``."""
    from .shapley import shapley_values

    if value not in VALUES:
        raise InterpError(f"unknown head value {value!r}; expected one of {VALUES}")
    if value == "svc" and train is None:
        raise InterpError("value='svc' needs train data to fit the separators on")
    kw = dict(value="separation", train=train, solver=solver) if value == "svc" else dict(value="learned-accuracy")
    res = shapley_values(
        model, data, heads=heads, method="exact", task=task, batch_size=batch_size, device=device, **kw
    )
    return res.shapley.tolist()


def scorer(strategy: str) -> Scorer | None:
    """The scorer :func:`interp.training.train` needs for ``strategy`` (None for ``random``/``mask-all-but-one``)."""
    if strategy not in STRATEGIES:
        raise ConfigError(f"unknown halving strategy {strategy!r}; expected one of {', '.join(STRATEGIES)}")
    if strategy in SELF_SCORED:
        return None
    shapley = strategy.startswith("shapley-")
    value = strategy.removeprefix("shapley-")

    def score(model, task: Task, heads, train, val):
        if shapley:
            return shapley_scores(model, val, heads=heads, value=value, train=train, task=task)
        return single_head_scores(model, val, heads=heads, value=value, train=train, task=task)

    score.__name__ = f"score_{strategy.replace('-', '_')}"
    return score


def train_halving(task: Task, spec, cfg, out, **kw) -> dict[str, Any]:
    """:func:`interp.training.train` of a ``cfg.halving`` run, with its strategy's scorer."""
    from interp.training import train

    if cfg.halving is None:
        raise ConfigError("train_halving needs a TrainConfig with halving=<strategy>")
    return train(task, spec, cfg, out, head_scorer=scorer(cfg.halving), **kw)


@dataclass(eq=False)
class HalvingHistory(Result):
    """A halving run: validation accuracy per epoch and its halving steps (Figure 10)."""

    strategy: str
    threshold: float
    epochs: list[int]
    val_accuracy: list[float]
    steps: list[dict[str, Any]]
    active: list[str]
    success: bool
    score: float | None
    kept_epoch: int | None = None
    test_accuracy: float | None = None

    def to_dict(self) -> dict:
        return jsonable(
            {
                "strategy": self.strategy,
                "threshold": self.threshold,
                "active": self.active,
                "success": self.success,
                "score": self.score,
                "kept_epoch": self.kept_epoch,
                "test_accuracy": self.test_accuracy,
                "steps": self.steps,
                "epochs": self.epochs,
                "val_accuracy": self.val_accuracy,
            }
        )

    @classmethod
    def from_dict(cls, d: dict) -> HalvingHistory:
        return cls(**{k: d[k] for k in cls.__dataclass_fields__})

    def text(self) -> str:
        lines = [
            f"halving heads ({self.strategy}, threshold {self.threshold:g}): "
            + (
                f"ended with one head ({', '.join(self.active)})"
                if self.success
                else f"FAILED: ended with {len(self.active)} heads ({', '.join(self.active)}); scored 0"
            )
        ]
        for s in self.steps:
            scores = ", ".join(f"{h} {v:.3f}" for h, v in s["scores"].items())
            acc = "" if s["val_accuracy"] is None else f" (val {s['val_accuracy']:.4f})"
            lines.append(
                f"  epoch {s['epoch']}{acc}: kept {', '.join(s['kept'])} of {len(s['before'])}; scores {scores}"
            )
        if self.kept_epoch is not None:
            lines.append(f"kept epoch {self.kept_epoch}; test accuracy {self.test_accuracy}; score {self.score}")
        return "\n".join(lines)

    def figure(self):
        import plotly.graph_objects as go

        fig = go.Figure(go.Scatter(x=self.epochs, y=self.val_accuracy, mode="lines", name="validation accuracy"))
        for s in self.steps:
            fig.add_vline(
                x=s["epoch"],
                line_dash="dash",
                line_color="gray",
                annotation_text=f"{len(s['before'])}→{len(s['kept'])}",
                annotation_position="top left",
            )
        fig.add_hline(y=self.threshold, line_dash="dot", line_color="lightgray")
        if self.kept_epoch is not None and self.kept_epoch in self.epochs:
            i = self.epochs.index(self.kept_epoch)
            fig.add_trace(
                go.Scatter(
                    x=[self.kept_epoch],
                    y=[self.val_accuracy[i]],
                    mode="markers",
                    name="kept",
                    marker=dict(size=9, symbol="star"),
                )
            )
        fig.update_layout(
            title=f"Halving heads ({self.strategy}): validation accuracy; dashed lines: halving steps",
            xaxis_title="epoch",
            yaxis_title="validation accuracy",
            template="plotly_white",
            height=380,
            width=760,
        )
        return fig


def halving_history(ckpt_or_training) -> HalvingHistory:
    """The halving record of a checkpoint (or its ``training`` metadata dict); an InterpError if it has none."""
    training = getattr(ckpt_or_training, "training", ckpt_or_training)
    h = training.get("halving") if isinstance(training, Mapping) else None
    if not h:
        raise InterpError("this checkpoint was not trained with halving heads (no 'halving' in its training metadata)")
    history = [r for r in training.get("history", []) if "epoch" in r]
    return HalvingHistory(
        strategy=h["strategy"],
        threshold=h["threshold"],
        epochs=[r["epoch"] for r in history],
        val_accuracy=[r["val_accuracy"] for r in history],
        steps=h["steps"],
        active=h["active"],
        success=h["success"],
        score=h.get("score"),
        kept_epoch=training.get("kept_epoch"),
        test_accuracy=training.get("accuracy", {}).get("test"),
    )


def add_halving_section(ckpt, report) -> None:
    """Figure 10 and the halving steps of a checkpoint trained with halving heads (nothing if it was not)."""
    if not ckpt.training.get("halving"):
        return
    hist = halving_history(ckpt)
    report.section(
        "Halving heads",
        "Fraknói 2024, §5.5, Figure 10: validation accuracy over the epochs; each dashed line "
        f"is a halving step, taken when validation accuracy reached {hist.threshold:g}, that masked half of "
        f"the active heads, keeping the best by the strategy ({hist.strategy}). The kept model is the best "
        "one-head state by validation accuracy; a run that ends with more than one head scores 0.",
    )
    report.result(hist, caption=hist.text().splitlines()[0])
    report.table(
        [
            {
                "epoch": s["epoch"],
                "val_accuracy": "-" if s["val_accuracy"] is None else f"{s['val_accuracy']:.4f}",
                "kept": " ".join(s["kept"]),
                "masked": " ".join(s["masked"]),
                "scores": ", ".join(f"{k} {v:.3f}" for k, v in s["scores"].items()),
            }
            for s in hist.steps
        ],
        caption="Halving steps (scores: higher is kept)",
    )
