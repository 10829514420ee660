"""The result of interchange interventions: :class:`CausalAbstraction`.

One row per alignment (a variable and the sites it is mapped to; for distributed alignment search, the learned
subspace, each random subspace of the same dimension and the whole site), one column per (base, source) pair. The
interchange-intervention accuracy (IIA, Geiger et al. 2021, *Causal Abstractions of Neural Networks*) of a row is
the share of pairs where the patched network predicts the causal model's counterfactual output; it is reported with
its Wilson 95% interval, and apart on the pairs whose counterfactual output differs from the base output (the
informative ones) and on the others. ``null_iia`` is the same share for the network left alone (its base
prediction against the counterfactual output): what a site that carries nothing scores.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

from interp.results import Result, jsonable


def _wilson(k: int, n: int) -> tuple[float, float]:
    from interp.analyses.populations import wilson_interval

    return wilson_interval(k, n)


def _ints(x, dtype=torch.long) -> Tensor:
    return torch.tensor(x, dtype=dtype)


@dataclass(eq=False)
class CausalAbstraction(Result):
    """Interchange interventions of alignments (rows) on pairs (columns); see the module docstring.

    ``correct[row, pair]``: the patched prediction equals ``counterfactual[row, pair]``; ``base_output`` /
    ``source_output``: the causal model's outputs on the unpatched inputs, ``base_prediction`` /
    ``source_prediction`` the network's; ``base_index`` / ``source_index``: the pairs' examples in the data they
    were drawn from (None where given row by row). ``das``: one record per distributed alignment search (the site,
    ``k``, the training IIA, the learned basis, ...)."""

    hypothesis: str
    causal_model: str
    labels: list[str]
    variables: list[str]
    kinds: list[str]  # "site", "das", "random", "whole"
    correct: Tensor
    counterfactual: Tensor
    base_output: Tensor
    source_output: Tensor
    base_prediction: Tensor
    source_prediction: Tensor
    base_index: Tensor | None = None
    source_index: Tensor | None = None
    pairs: dict[str, Any] = field(default_factory=dict)  # how the pairs were drawn
    das: list[dict[str, Any]] = field(default_factory=list)
    info: dict[str, Any] = field(default_factory=dict)

    # -- numbers ------------------------------------------------------------------------------------------------------

    @property
    def n_pairs(self) -> int:
        return int(self.correct.shape[1])

    @property
    def changed(self) -> Tensor:
        """``[row, pair]``: the counterfactual output differs from the base output."""
        return self.counterfactual != self.base_output[None]

    @property
    def iia(self) -> Tensor:
        return self.correct.float().mean(1)

    def _masked(self, mask: Tensor) -> Tensor:
        n = mask.sum(1)
        return torch.where(
            n > 0, (self.correct & mask).sum(1) / n.clamp(min=1), torch.full_like(n, float("nan"), dtype=torch.float)
        )

    @property
    def iia_changed(self) -> Tensor:
        """IIA on the pairs whose counterfactual output differs from the base output."""
        return self._masked(self.changed)

    @property
    def iia_unchanged(self) -> Tensor:
        return self._masked(~self.changed)

    @property
    def null_iia(self) -> Tensor:
        """``[row]``: the unpatched network's base prediction against each row's counterfactual."""
        return (self.base_prediction[None] == self.counterfactual).float().mean(1)

    @property
    def base_accuracy(self) -> float:
        """The share of base inputs where the network already gives the causal model's output."""
        return float((self.base_prediction == self.base_output).float().mean())

    @property
    def source_accuracy(self) -> float:
        return float((self.source_prediction == self.source_output).float().mean())

    def interval(self, row: int) -> tuple[float, float]:
        """The Wilson 95% interval of row ``row``'s IIA."""
        return _wilson(int(self.correct[row].sum()), self.n_pairs)

    def row(self, label: str) -> int:
        if label not in self.labels:
            raise KeyError(f"no row {label!r}; the rows are {self.labels}")
        at = [i for i, x in enumerate(self.labels) if x == label]
        if len(at) > 1:  # e.g. two different subspaces of one site with the same k: a label cannot tell them apart
            raise KeyError(f"{label!r} labels rows {at} (different subspaces of one site); read them by row: .iia[i]")
        return at[0]

    def __getitem__(self, label: str) -> float:
        """The IIA of the row labelled ``label``."""
        return float(self.iia[self.row(label)])

    def rows(self) -> list[dict[str, Any]]:
        out = []
        iia, ch, un, null = self.iia, self.iia_changed, self.iia_unchanged, self.null_iia
        for i, label in enumerate(self.labels):
            lo, hi = self.interval(i)
            out.append(
                {
                    "site": label,
                    "kind": self.kinds[i],
                    "variable": self.variables[i],
                    "iia": float(iia[i]),
                    "low": lo,
                    "high": hi,
                    "iia_changed": float(ch[i]),
                    "iia_unchanged": float(un[i]),
                    "changed_share": float(self.changed[i].float().mean()),
                    "null_iia": float(null[i]),
                }
            )
        return out

    # -- protocol ------------------------------------------------------------------------------------------------------

    def to_dict(self) -> dict:
        def idx(x):
            return None if x is None else x

        return jsonable(
            {
                "hypothesis": self.hypothesis,
                "causal_model": self.causal_model,
                "n_pairs": self.n_pairs,
                "base_accuracy": self.base_accuracy,
                "source_accuracy": self.source_accuracy,
                "rows": self.rows(),
                "labels": self.labels,
                "variables": self.variables,
                "kinds": self.kinds,
                "correct": self.correct.to(torch.uint8),
                "counterfactual": self.counterfactual,
                "base_output": self.base_output,
                "source_output": self.source_output,
                "base_prediction": self.base_prediction,
                "source_prediction": self.source_prediction,
                "base_index": idx(self.base_index),
                "source_index": idx(self.source_index),
                "pairs": self.pairs,
                "das": self.das,
                "info": self.info,
            }
        )

    @classmethod
    def from_dict(cls, d: dict) -> CausalAbstraction:
        return cls(
            hypothesis=d["hypothesis"],
            causal_model=d["causal_model"],
            labels=list(d["labels"]),
            variables=list(d["variables"]),
            kinds=list(d["kinds"]),
            correct=_ints(d["correct"], torch.uint8).bool().reshape(len(d["labels"]), -1),
            counterfactual=_ints(d["counterfactual"]).reshape(len(d["labels"]), -1),
            base_output=_ints(d["base_output"]),
            source_output=_ints(d["source_output"]),
            base_prediction=_ints(d["base_prediction"]),
            source_prediction=_ints(d["source_prediction"]),
            base_index=None if d["base_index"] is None else _ints(d["base_index"]),
            source_index=None if d["source_index"] is None else _ints(d["source_index"]),
            pairs=dict(d["pairs"]),
            das=[dict(x) for x in d["das"]],
            info=dict(d["info"]),
        )

    def merged(self, other: CausalAbstraction) -> CausalAbstraction:
        """This result's rows and ``other``'s, on the same pairs (checked), as one result."""
        same = (
            self.n_pairs == other.n_pairs
            and torch.equal(self.base_output, other.base_output)
            and torch.equal(self.base_prediction, other.base_prediction)
            and torch.equal(self.source_prediction, other.source_prediction)
        )
        if not same:
            from interp.errors import ConfigError

            raise ConfigError("results can be merged only when they were computed on the same pairs")
        return CausalAbstraction(
            hypothesis=self.hypothesis,
            causal_model=self.causal_model,
            labels=self.labels + other.labels,
            variables=self.variables + other.variables,
            kinds=self.kinds + other.kinds,
            correct=torch.cat([self.correct, other.correct]),
            counterfactual=torch.cat([self.counterfactual, other.counterfactual]),
            base_output=self.base_output,
            source_output=self.source_output,
            base_prediction=self.base_prediction,
            source_prediction=self.source_prediction,
            base_index=self.base_index,
            source_index=self.source_index,
            pairs=self.pairs,
            das=self.das + other.das,
            info={**other.info, **self.info},
        )

    def text(self) -> str:
        from interp.visualize import aligned

        p = self.pairs
        lines = [f"hypothesis {self.hypothesis}: {self.causal_model}"]
        how = p.get("how", "")
        lines.append(
            f"{self.n_pairs} pairs{(' ' + how) if how else ''}; the network gives the causal model's output on "
            f"{self.base_accuracy:.3f} of bases and {self.source_accuracy:.3f} of sources"
        )
        if min(self.base_accuracy, self.source_accuracy) < 0.9:
            lines.append(
                "note: the network disagrees with the causal model's output on many inputs, so IIA also counts pairs "
                "the model gets wrong without any intervention (compare with the 'no patch' column)"
            )
        cells = []
        for r in self.rows():
            cells.append(
                [
                    r["site"],
                    r["variable"],
                    f"{r['iia']:.3f}",
                    f"[{r['low']:.3f}, {r['high']:.3f}]",
                    _fmt(r["iia_changed"]),
                    _fmt(r["iia_unchanged"]),
                    f"{r['changed_share']:.2f}",
                    f"{r['null_iia']:.3f}",
                ]
            )
        lines.append(
            aligned(["site", "variable", "IIA", "95% CI", "changed", "unchanged", "share changed", "no patch"], cells)
        )
        for rec in self.das:
            rand = rec.get("random_iia") or []
            rtxt = (
                f"random k={rec['k']} mean {sum(rand) / len(rand):.3f} (range {min(rand):.3f}-{max(rand):.3f}, "
                f"{len(rand)} draws)"
                if rand
                else "no random subspaces"
            )
            lines.append(
                f"DAS {rec['site']} k={rec['k']} ({rec['variable']}): training IIA {rec['train_iia']:.3f} on "
                f"{rec['train_pairs']} pairs ({rec['steps']} steps, {rec['seconds']:.1f} s); held out: learned "
                f"{rec['heldout_iia']:.3f}, {rtxt}, whole site {rec['whole_iia']:.3f}"
            )
        lines.append(
            "IIA: the share of pairs where the patched network predicts the counterfactual output; 'changed' / "
            "'unchanged': on the pairs whose counterfactual differs from / equals the base output; 'no patch': the "
            "unpatched network scored the same way"
        )
        return "\n".join(lines)

    def table_html(self) -> str:
        from interp.visualize import render_table

        rows = [{k: v for k, v in r.items() if k != "kind"} for r in self.rows()]
        return render_table(
            rows,
            caption=f"hypothesis {self.hypothesis}: interchange-intervention accuracy on {self.n_pairs} pairs "
            "(95% Wilson interval)",
            formats={
                "iia": ".3f",
                "low": ".3f",
                "high": ".3f",
                "iia_changed": ".3f",
                "iia_unchanged": ".3f",
                "changed_share": ".2f",
                "null_iia": ".3f",
            },
        )

    def figure(self):
        """IIA per row with its 95% interval, coloured by kind; the dashed line is the unpatched network's score."""
        import plotly.graph_objects as go

        rows = self.rows()
        colors = {"site": "#4c72b0", "das": "#dd8452", "random": "#8c8c8c", "whole": "#55a868"}
        fig = go.Figure()
        for kind in dict.fromkeys(self.kinds):
            rs = [r for r in rows if r["kind"] == kind]
            fig.add_trace(
                go.Bar(
                    x=[r["site"] for r in rs],
                    y=[r["iia"] for r in rs],
                    name=kind,
                    marker_color=colors.get(kind, "#4c72b0"),
                    error_y=dict(
                        type="data",
                        symmetric=False,
                        array=[r["high"] - r["iia"] for r in rs],
                        arrayminus=[r["iia"] - r["low"] for r in rs],
                    ),
                )
            )
        null = float(self.null_iia.mean()) if len(self.labels) else 0.0
        fig.add_hline(y=null, line_dash="dash", annotation_text=f"no patch {null:.2f}")
        fig.update_layout(
            title=f"Interchange-intervention accuracy: {self.hypothesis}<br><sup>{self.n_pairs} pairs, 95% Wilson "
            "intervals</sup>",
            yaxis=dict(title="IIA", range=[0, 1.05]),
            xaxis=dict(type="category"),
            template="plotly_white",
            width=max(480, 36 * len(rows) + 220),
            height=420,
        )
        return fig


def _fmt(x: float) -> str:
    return "-" if math.isnan(x) else f"{x:.3f}"
