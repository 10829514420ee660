"""Figures over a population of runs (a sweep's rows, :func:`interp.sweep_directory.load_results`), as results.

- :class:`Survival`: 1 - CDF of a value per group, i.e. the share of the group at or above each value. Test accuracy
  per configuration and strategy (:func:`accuracy_survival`: Fraknói 2024, Figure 9 left, 1 vs 64 heads, and Figure 11,
  the halving strategies), or any per-head value (the census of a task's heads draws separation accuracy with it:
  Figure 9 right).
- :class:`GridAccuracy`: the share of runs at 100% and the mean test accuracy over the d_model x n_heads grid
  (Figure 2).
- :class:`LearningRateAccuracy`: test accuracy against the learning rate, per configuration (Figure 3).

Every figure is built from the rows alone (nothing is loaded or trained); a failed halving run counts 0, as in the
table (:func:`analyses.populations.scores`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from interp.results import Result, jsonable


def _label(config: dict[str, Any]) -> str:
    return " ".join(f"{k}={v}" if k != "strategy" else str(v) for k, v in config.items()) or "all runs"


@dataclass(eq=False)
class Survival(Result):
    """``groups[label]``: the values of one group (runs, or heads); the figure draws, per group, the share of values
    ``>= x`` against ``x`` (1 - CDF, counting ties as reached: at ``x = 1`` it is the share at 100%)."""

    groups: dict[str, list[float]]
    title: str = "1 - CDF"
    xlabel: str = "value"
    unit: str = "runs"

    def share_at_least(self, label: str, x: float) -> float:
        values = self.groups[label]
        return sum(v >= x for v in values) / len(values) if values else math.nan

    def curve(self, label: str) -> tuple[list[float], list[float]]:
        """The step curve's corners: ``x`` the distinct values (ascending), ``y`` the share at or above each."""
        values = sorted(self.groups[label])
        xs = sorted(set(values))
        return xs, [self.share_at_least(label, x) for x in xs]

    def figure(self, x_min: float | None = None):
        import plotly.graph_objects as go

        fig = go.Figure()
        for label, values in self.groups.items():
            if not values:
                continue
            xs, ys = self.curve(label)
            start = min(0.0, xs[0]) if x_min is None else x_min
            if xs[-1] < 1.0:  # nothing above the largest value: the curve drops to 0 there
                xs, ys = xs + [1.0], ys + [0.0]
            fig.add_trace(
                go.Scatter(
                    x=[start] + xs,
                    y=[1.0] + ys,
                    mode="lines+markers",
                    line_shape="vh",
                    name=f"{label} ({len(values)} {self.unit})",
                    marker=dict(size=4),
                )
            )
        fig.update_layout(
            title=self.title,
            xaxis_title=self.xlabel,
            yaxis_title=f"share of {self.unit} >= x",
            template="plotly_white",
            width=760,
            height=420,
            yaxis_range=[0, 1.02],
        )
        if x_min is not None:
            fig.update_xaxes(range=[x_min, 1.001])
        return fig

    def to_dict(self) -> dict:
        return jsonable(
            {
                "title": self.title,
                "xlabel": self.xlabel,
                "unit": self.unit,
                "groups": {k: sorted(v) for k, v in self.groups.items()},
                "share_at_1": {k: self.share_at_least(k, 1.0) for k in self.groups},
            }
        )

    @classmethod
    def from_dict(cls, d: dict) -> Survival:
        groups = {k: [math.nan if v is None else v for v in vs] for k, vs in d["groups"].items()}
        return cls(groups, d["title"], d["xlabel"], d["unit"])

    def text(self) -> str:
        """Per group: how many values, and the share at 1 (100%)."""
        lines = [self.title]
        lines += [
            f"  {label}: {len(v)} {self.unit}, share at 1: {self.share_at_least(label, 1.0):.3f}"
            for label, v in self.groups.items()
        ]
        return "\n".join(lines)


def accuracy_survival(frame, split: str = "test") -> Survival:
    """1 - CDF of each run's ``split`` accuracy, one curve per configuration and strategy (the columns that vary,
    with d_model, n_heads and strategy)."""
    from .populations import config_columns, groups, scores

    keys, shown = config_columns(frame)
    score = scores(frame, split)
    curves = {_label({k: c[k] for k in shown}): score.loc[members.index].tolist() for c, members in groups(frame, keys)}
    return Survival(
        curves,
        title=f"1 - CDF of {split} accuracy per configuration (Fraknói 2024, Figures 9 and 11)",
        xlabel=f"{split} accuracy",
        unit="runs",
    )


@dataclass(eq=False)
class GridAccuracy(Result):
    """Per (d_model, n_heads) cell: runs, the share at 100% ``split`` accuracy and the mean (NaN: no runs)."""

    d_models: list[int]
    n_heads: list[int]
    runs: list[list[int]]
    share: list[list[float]]
    mean: list[list[float]]
    split: str = "test"
    strategy: str = "normal"
    val_mean: list[list[float]] | None = None  # mean validation accuracy (the thesis's Figure 2 shows both)

    @property
    def cells(self) -> int:
        return sum(r > 0 for row in self.runs for r in row)

    def to_dict(self) -> dict:
        return jsonable(
            {
                "d_model": self.d_models,
                "n_heads": self.n_heads,
                "runs": self.runs,
                "share_at_1": self.share,
                "mean_accuracy": self.mean,
                "mean_val_accuracy": self.val_mean,
                "split": self.split,
                "strategy": self.strategy,
            }
        )

    @classmethod
    def from_dict(cls, d: dict) -> GridAccuracy:
        def grid(rows):
            return None if rows is None else [[math.nan if v is None else v for v in row] for row in rows]

        return cls(
            list(d["d_model"]),
            list(d["n_heads"]),
            [list(r) for r in d["runs"]],
            grid(d["share_at_1"]),
            grid(d["mean_accuracy"]),
            d["split"],
            d["strategy"],
            grid(d["mean_val_accuracy"]),
        )

    def text(self) -> str:
        """Per cell with runs: their number, the share at 100% and the mean."""
        lines = [f"{self.split} accuracy over d_model x n_heads ({self.strategy} runs): runs, share at 100%, mean"]
        for i, dm in enumerate(self.d_models):
            for j, h in enumerate(self.n_heads):
                if self.runs[i][j]:
                    lines.append(
                        f"  d_model={dm} n_heads={h}: {self.runs[i][j]} runs, {self.share[i][j]:.3f}, "
                        f"{self.mean[i][j]:.4f}"
                    )
        return "\n".join(lines)

    def figure(self):
        import plotly.graph_objects as go
        from plotly.subplots import make_subplots

        panels = [
            (f"share of runs at 100% {self.split} accuracy", self.share),
            (f"mean {self.split} accuracy", self.mean),
        ]
        if self.val_mean is not None:
            panels.append(("mean validation accuracy", self.val_mean))
        fig = make_subplots(rows=1, cols=len(panels), subplot_titles=[t for t, _ in panels], horizontal_spacing=0.12)
        x = [str(h) for h in self.n_heads]
        y = [str(d) for d in self.d_models]
        for col, (_, z) in enumerate(panels, 1):
            text = [
                [("" if math.isnan(v) else f"{v:.2f}<br>n={n}") for v, n in zip(zr, nr)] for zr, nr in zip(z, self.runs)
            ]
            fig.add_trace(
                go.Heatmap(
                    z=[[None if math.isnan(v) else v for v in zr] for zr in z],
                    x=x,
                    y=y,
                    zmin=0,
                    zmax=1,
                    colorscale="Viridis",
                    text=text,
                    texttemplate="%{text}",
                    showscale=col == len(panels),
                ),
                row=1,
                col=col,
            )
            fig.update_xaxes(title_text="n_heads", type="category", row=1, col=col)
            fig.update_yaxes(title_text="d_model", type="category", row=1, col=col)
        fig.update_layout(
            title=f"Accuracy over the d_model x n_heads grid ({self.strategy} runs; Fraknói 2024, Figure 2)",
            template="plotly_white",
            width=430 * len(panels),
            height=420,
        )
        return fig

    def table_html(self) -> str:
        from interp.visualize import render_table

        rows = [
            {
                "d_model": d,
                "n_heads": h,
                "runs": self.runs[i][j],
                "share at 100%": self.share[i][j],
                "mean": self.mean[i][j],
            }
            for i, d in enumerate(self.d_models)
            for j, h in enumerate(self.n_heads)
            if self.runs[i][j]
        ]
        return render_table(rows, formats={"share at 100%": ".2f", "mean": ".4f"})


def grid_accuracy(frame, split: str = "test", strategy: str = "normal") -> GridAccuracy:
    """Figure 2: the runs of ``strategy`` over d_model x n_heads (other options pooled)."""
    from .populations import scores

    rows = frame[frame["strategy"] == strategy] if "strategy" in frame else frame
    score = scores(rows, split) if len(rows) else rows.get(f"{split}_accuracy")
    ds = sorted({int(v) for v in rows["d_model"]}) if len(rows) else []
    hs = sorted({int(v) for v in rows["n_heads"]}) if len(rows) else []
    runs = [[0] * len(hs) for _ in ds]
    share = [[math.nan] * len(hs) for _ in ds]
    mean = [[math.nan] * len(hs) for _ in ds]
    val = [[math.nan] * len(hs) for _ in ds] if "val_accuracy" in rows else None
    for i, d in enumerate(ds):
        for j, h in enumerate(hs):
            cell = (rows["d_model"] == d) & (rows["n_heads"] == h)
            acc = score[cell]
            if len(acc):
                runs[i][j], share[i][j], mean[i][j] = len(acc), float((acc >= 1.0).mean()), float(acc.mean())
                if val is not None:
                    val[i][j] = float(rows.loc[cell, "val_accuracy"].astype(float).mean())
    return GridAccuracy(ds, hs, runs, share, mean, split, strategy, val)


@dataclass(eq=False)
class LearningRateAccuracy(Result):
    """Per configuration (without lr) and learning rate: each run's accuracy, the share at 100% and the mean."""

    series: dict[str, dict[float, list[float]]]
    split: str = "test"

    @property
    def varies(self) -> bool:
        return any(len(by_lr) > 1 for by_lr in self.series.values())

    def to_dict(self) -> dict:
        return jsonable(
            {
                "split": self.split,
                "series": {
                    label: [
                        {
                            "lr": lr,
                            "accuracy": sorted(v),
                            "share_at_1": sum(a >= 1 for a in v) / len(v),
                            "mean": sum(sorted(v)) / len(v),
                        }
                        for lr, v in by.items()
                    ]
                    for label, by in self.series.items()
                },
            }
        )

    @classmethod
    def from_dict(cls, d: dict) -> LearningRateAccuracy:
        series = {
            label: {r["lr"]: [math.nan if a is None else a for a in r["accuracy"]] for r in rows}
            for label, rows in d["series"].items()
        }
        return cls(series, d["split"])

    def text(self) -> str:
        """Per configuration and learning rate: runs, share at 100% and mean."""
        lines = [f"{self.split} accuracy over learning rates"]
        for label, rows in self.to_dict()["series"].items():
            for r in rows:
                lines.append(
                    f"  {label} lr={r['lr']:g}: {len(r['accuracy'])} runs, share at 1 {r['share_at_1']:.3f}, "
                    f"mean {r['mean']}"
                )
        return "\n".join(lines)

    def figure(self):
        import plotly.graph_objects as go

        fig = go.Figure()
        for label, by in self.series.items():
            lrs = sorted(by)
            fig.add_trace(
                go.Scatter(
                    x=[lr for lr in lrs for _ in by[lr]],
                    y=[a for lr in lrs for a in by[lr]],
                    mode="markers",
                    name=f"{label}: runs",
                    marker=dict(size=6, opacity=0.6),
                )
            )
            fig.add_trace(
                go.Scatter(
                    x=lrs, y=[sum(by[lr]) / len(by[lr]) for lr in lrs], mode="lines+markers", name=f"{label}: mean"
                )
            )
        fig.update_layout(
            title=f"{self.split} accuracy over learning rates (Fraknói 2024, Figure 3)",
            xaxis_title="learning rate",
            yaxis_title=f"{self.split} accuracy",
            template="plotly_white",
            width=760,
            height=420,
        )
        fig.update_xaxes(type="log")
        return fig


def lr_accuracy(frame, split: str = "test") -> LearningRateAccuracy:
    """Figure 3: each configuration's runs (the varying columns except lr) against their learning rate."""
    from .populations import config_columns, groups, scores

    keys, shown = config_columns(frame)
    keys = [k for k in keys if k != "lr"]
    shown = [k for k in shown if k != "lr"]
    score = scores(frame, split)
    series: dict[str, dict[float, list[float]]] = {}
    for config, members in groups(frame, keys):
        by: dict[float, list[float]] = {}
        for i in members.index:
            by.setdefault(float(frame.loc[i, "lr"]), []).append(float(score.loc[i]))
        series[_label({k: config[k] for k in shown})] = dict(sorted(by.items()))
    return LearningRateAccuracy(series, split)
