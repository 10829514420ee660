"""Circuit discovery: which edges of the computational graph does a model use for a task?

One entry point, :func:`discover_circuit`, scores every edge of :func:`computational_graph` (senders: the input,
heads, MLPs; receivers: each head's q, k and v input, each MLP, the logits) with one of

- ``method="patching"``: the exact effect of patching each edge alone (batched over edges);
- ``method="eap"``: edge attribution patching (Syed, Rager and Conmy 2023, *Attribution Patching Outperforms
  Automated Circuit Discovery*): gradient x activation difference, two forwards and a backward for every edge;
- ``method="eap-ig"``: EAP with integrated gradients over the inputs (Hanna, Pezzelle and Belinkov 2024, *Have
  Faith in Faithfulness*), ``steps`` interpolations;
- ``method="acdc"``: ACDC's greedy pruning (Conmy et al. 2023, *Towards Automated Circuit Discovery for
  Mechanistic Interpretability*) with tolerance ``tau``;

then keeps a circuit (``top_n`` edges, ``|score| >= threshold``, ACDC's own result, or by default the smallest
top-k circuit whose faithfulness reaches ``target``) and measures its **faithfulness**: the metric with only the
circuit's edges live and every other edge ablated, as a fraction of the way from the empty circuit (every edge
ablated) to the full model, ``(M(C) - M(empty)) / (M(full) - M(empty))``, plus a faithfulness-against-size curve
of the top-k circuits of the ranking. The ablation (``"patch"`` from the corrupted input, ``"mean"``, ``"zero"``) is
recorded in the result: circuit metrics depend on it (Miller, Chughtai and Saunders 2024, *Transformer Circuit
Faithfulness Metrics are not Robust*).

The scores and the circuit forward live in :mod:`interp.analyses.circuit_scores`, the graph in
:mod:`interp.analyses.circuit_graph`.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch
from jaxtyping import Float, Int
from torch import Tensor

from interp.errors import ConfigError, InterpError
from interp.results import Result, floats, jsonable
from interp.task import TaskData

from .circuit_graph import ComputationalGraph, computational_graph
from .circuit_scores import Context, acdc, circuit_metrics, edge_attribution, edge_patching, prepare

if TYPE_CHECKING:
    from transformer_lens import HookedTransformer

METHODS = ("eap", "eap-ig", "patching", "acdc")
CURVE_POINTS = 24  # circuit sizes on the faithfulness curve (geometric from 1 edge to all)
# Faithfulness is undefined (NaN) when ablating every edge moves the metric by less than this fraction of its scale
# (max(1, |M(full)|, |M(empty)|)): the ratio of two near-zero differences would be noise, not a measurement.
SPAN_RTOL = 1e-3


def faithfulness_defined(full: float, empty: float) -> bool:
    """Whether ``M(full) - M(empty)`` is large enough to divide by (see ``SPAN_RTOL``)."""
    return abs(full - empty) > SPAN_RTOL * max(1.0, abs(full), abs(empty))


@dataclass(eq=False)
class Circuit(Result):
    """A discovered circuit: per-edge ``scores`` (``[edge]``, the metric's change when the edge is removed, or its
    estimate), the ``kept`` edges (``[edge]`` bool), the graph, and the metric of the ``full`` model, the ``empty``
    circuit (every edge ablated) and this ``circuit``; ``curve_sizes`` / ``curve_values`` the metric of the top-k
    circuits of the ranking (by ``|score|``). ``rule`` says how edges were kept (``top_n``, ``threshold``,
    ``tau``, ``target``), ``info`` the time and forward passes spent."""

    graph: ComputationalGraph
    scores: Tensor
    kept: Tensor
    method: str
    ablation: str
    metric: str
    full: float
    empty: float
    circuit: float
    curve_sizes: list[int] = field(default_factory=list)
    curve_values: list[float] = field(default_factory=list)
    n_examples: int = 0
    rule: dict = field(default_factory=dict)
    info: dict = field(default_factory=dict)

    # -- views --------------------------------------------------------------------------------------------------
    def _fraction(self, m: float) -> float:
        span = self.full - self.empty
        return (m - self.empty) / span if faithfulness_defined(self.full, self.empty) else float("nan")

    @property
    def faithfulness(self) -> float:
        """``(M(circuit) - M(empty)) / (M(full) - M(empty))``: 1 = the full model's metric, 0 = every edge ablated;
        NaN where ablating every edge barely moves the metric (the data do not exercise what the edges do)."""
        return self._fraction(self.circuit)

    @property
    def curve(self) -> list[tuple[int, float]]:
        """``(size, faithfulness)`` of the top-k circuits."""
        return [(k, self._fraction(m)) for k, m in zip(self.curve_sizes, self.curve_values)]

    @property
    def edges(self) -> list[str]:
        """The kept edges' names, by ``|score|``."""
        names = self.graph.edge_names
        order = self.scores.abs().nan_to_num(-1).argsort(descending=True).tolist()
        return [names[i] for i in order if bool(self.kept[i])]

    @property
    def nodes(self) -> list[str]:
        """The nodes the kept edges touch (senders and the nodes of their receivers)."""
        g, out = self.graph, []
        for e in self.kept.nonzero().squeeze(-1).tolist():
            r, s = g.edges[e]
            for n in (g.senders[s], g.node_of_receiver(r)):
                if n not in out:
                    out.append(n)
        return out

    @property
    def size(self) -> int:
        return int(self.kept.sum())

    def top(self, k: int = 10) -> list[dict]:
        """The ``k`` edges of largest ``|score|``, with score and whether kept."""
        names = self.graph.edge_names
        order = self.scores.abs().nan_to_num(-1).argsort(descending=True)[:k].tolist()
        return [{"edge": names[i], "score": float(self.scores[i]), "kept": bool(self.kept[i])} for i in order]

    def score_of(self, edge: str) -> float:
        return float(self.scores[self.graph.edge_index(edge)])

    # -- protocol -----------------------------------------------------------------------------------------------
    def to_dict(self) -> dict:
        return jsonable(
            {
                "method": self.method,
                "ablation": self.ablation,
                "metric": self.metric,
                "graph": self.graph.to_dict(),
                "edges": self.graph.edge_names,
                "scores": self.scores,
                "kept": [bool(k) for k in self.kept.tolist()],
                "full": self.full,
                "empty": self.empty,
                "circuit": self.circuit,
                "faithfulness": self.faithfulness,
                "size": self.size,
                "curve_sizes": self.curve_sizes,
                "curve_values": self.curve_values,
                "n_examples": self.n_examples,
                "rule": self.rule,
                "info": self.info,
            }
        )

    @classmethod
    def from_dict(cls, d: dict) -> Circuit:
        graph = ComputationalGraph.from_dict(d["graph"])
        if graph.edge_names != d["edges"]:
            raise InterpError("the saved circuit's edges do not match its graph")
        return cls(
            graph=graph,
            scores=floats(d["scores"], torch.float32),
            kept=torch.tensor(d["kept"], dtype=torch.bool),
            method=d["method"],
            ablation=d["ablation"],
            metric=d["metric"],
            full=d["full"],
            empty=d["empty"],
            circuit=d["circuit"],
            curve_sizes=list(d["curve_sizes"]),
            curve_values=[float("nan") if v is None else v for v in d["curve_values"]],
            n_examples=d["n_examples"],
            rule=dict(d["rule"]),
            info=dict(d["info"]),
        )

    @classmethod
    def load(cls, path) -> Circuit:
        """A circuit saved with :meth:`save` (or ``interp circuit --out``)."""
        import json
        from pathlib import Path

        return cls.from_dict(json.loads(Path(path).read_text(encoding="utf-8")))

    def save(self, path) -> None:
        """Write :meth:`to_json` to ``path`` atomically."""
        from pathlib import Path

        from interp.files import AtomicFile

        text = self.to_json()
        with AtomicFile(path, "the circuit JSON") as out:
            out.commit(lambda tmp: Path(tmp).write_text(text + "\n", encoding="utf-8"))

    def text(self) -> str:
        rule = ", ".join(f"{k} {v}" for k, v in self.rule.items() if v is not None)
        lines = [
            f"circuit ({self.method}, {self.ablation} ablation, metric {self.metric}; {rule}): "
            f"{self.size} of {self.graph.n_edges} edges, {len(self.nodes)} nodes",
            f"  metric: full {self.full:.4g}, circuit {self.circuit:.4g}, empty {self.empty:.4g}; "
            f"faithfulness {self.faithfulness:.3f} ({self.n_examples} examples)",
        ]
        if not faithfulness_defined(self.full, self.empty):
            lines.append("  faithfulness undefined: ablating every edge barely moves the metric on these inputs")
        if "seconds" in self.info:
            lines.append(f"  {self.info['seconds']:.2f} s, {self.info.get('forwards', 0):.0f} forward passes")
        for r in self.top(8):
            lines.append(f"  {r['edge']}: {r['score']:+.4g}{'' if r['kept'] else ' (not kept)'}")
        return "\n".join(lines)

    def table_html(self) -> str:
        from interp.visualize import render_table

        return render_table(
            self.top(12),
            caption=f"{self.method} edge scores ({self.ablation} ablation, metric {self.metric}); faithfulness of "
            f"the {self.size}-edge circuit {self.faithfulness:.3f}",
            formats={"score": "+.4g"},
        )

    def figure(self):
        """The circuit's graph: nodes by layer, kept edges coloured by score (hover for the value)."""
        from .circuit_figure import circuit_figure

        return circuit_figure(self)

    def curve_figure(self):
        """Faithfulness against circuit size (top-k edges of the ranking)."""
        import plotly.graph_objects as go

        ks, fs = zip(*self.curve) if self.curve else ((), ())
        fig = go.Figure(go.Scatter(x=list(ks), y=list(fs), mode="lines+markers", name=self.method))
        fig.add_hline(y=1.0, line_dash="dot")
        fig.update_layout(
            title=f"Faithfulness against size ({self.method}, {self.ablation} ablation, {self.metric})",
            xaxis_title="edges kept (top-k by |score|)",
            yaxis_title="faithfulness",
            xaxis_type="log",
            template="plotly_white",
        )
        return fig


def _curve_sizes(n_edges: int, points: int = CURVE_POINTS) -> list[int]:
    grid = torch.logspace(0, torch.log10(torch.tensor(float(n_edges))), points).round().long().tolist()
    return sorted({0, *grid, n_edges})


def top_k_masks(scores: Float[Tensor, " edge"], sizes: Sequence[int]) -> Tensor:
    """``[len(sizes), edge]`` bool: the top-k edges by ``|score|`` for each k (NaN scores last)."""
    order = scores.abs().nan_to_num(-1).argsort(descending=True)
    masks = torch.zeros(len(sizes), len(scores), dtype=torch.bool)
    for i, k in enumerate(sizes):
        masks[i, order[:k]] = True
    return masks


def _smallest_reaching(ctx: Context, scores: Tensor, sizes: list[int], values: list[float], empty: float,
                       target: float) -> int:  # fmt: skip
    """The smallest k whose top-k circuit reaches faithfulness ``target``: the first curve point that does, then
    bisection between it and the point before (faithfulness need not grow with k; this finds one crossing)."""
    span = ctx.full - empty

    def ok(m: float) -> bool:
        return faithfulness_defined(ctx.full, empty) and (m - empty) / span >= target

    hits = [i for i, m in enumerate(values) if ok(m)]
    if not hits:
        return ctx.graph.n_edges
    hi = sizes[hits[0]]
    lo = sizes[hits[0] - 1] if hits[0] > 0 else -1
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if ok(float(circuit_metrics(ctx, top_k_masks(scores, [mid]))[0])):
            hi = mid
        else:
            lo = mid
    return hi


def _scores(ctx: Context, method: str, steps: int | None, tau: float | None) -> tuple[Tensor, Tensor | None]:
    if method == "patching":
        return edge_patching(ctx), None
    if method == "eap":
        return edge_attribution(ctx, 1), None
    if method == "eap-ig":
        return edge_attribution(ctx, steps if steps is not None else 5), None
    keep, effect = acdc(ctx, tau)
    return effect, keep


def discover_circuit(
    model: HookedTransformer,
    data: TaskData | Int[Tensor, "batch pos"],
    *,
    corrupted: TaskData | Int[Tensor, "batch_c pos_c"] | None = None,
    ablation: str | None = None,
    metric: str | Callable = "logit_diff",
    method: str = "eap",
    steps: int | None = None,
    top_n: int | None = None,
    threshold: float | None = None,
    tau: float | None = None,
    target: float = 0.9,
    curve_points: int = CURVE_POINTS,
    batch_size: int | None = None,
    device: str | None = None,
) -> Circuit:
    """The circuit of ``model`` on ``data`` (see the module doc).

    ``corrupted``: the corrupted run, same shape as ``data`` (default ablation then ``"patch"``; without it
    ``"mean"``). ``metric``: ``"logit_diff"`` (answer minus corrupted answer, or minus the best other logit without
    corrupted task data), ``"loss"`` or a callable ``logits [batch, pos, vocab] -> scalar``. ``method``: one of
    ``eap``, ``eap-ig`` (``steps``, default 5), ``patching``, ``acdc`` (``tau``, default 0.01 x |M(full) -
    M(empty)|... see below). Kept edges: ``top_n``, or ``|score| >= threshold``, or (neither given) the smallest
    top-k circuit of the curve with faithfulness ``>= target``; ACDC keeps what its pass keeps (``tau`` default: 1%
    of the distance between the full model's metric and the empty circuit's). ``batch_size``: sequences per stacked
    forward (``variant x example``; None = automatic). ``curve_points``: sizes on the faithfulness curve (0 = no
    curve, unless the target rule needs one; then at least 8)."""
    t0 = time.perf_counter()
    if method not in METHODS:
        raise ConfigError(f"unknown method {method!r}; expected one of {METHODS}")
    if top_n is not None and threshold is not None:
        raise ConfigError("pass top_n or threshold, not both")
    if method == "acdc" and (top_n is not None or threshold is not None):
        raise ConfigError("ACDC keeps the edges its pass keeps (set tau); top_n and threshold apply to eap, eap-ig "
                          "and patching")  # fmt: skip
    if method != "acdc" and tau is not None:
        raise ConfigError(f"tau is ACDC's tolerance; method {method!r} keeps edges by top_n, threshold or target")
    if steps is not None and method != "eap-ig":
        raise ConfigError(f"steps is EAP-IG's number of interpolations; method {method!r} takes none")
    if top_n is not None and (not isinstance(top_n, int) or isinstance(top_n, bool) or top_n < 0):
        raise ConfigError(f"top_n must be a non-negative integer, got {top_n!r}")
    if not isinstance(curve_points, int) or isinstance(curve_points, bool) or curve_points < 0:
        raise ConfigError(f"curve_points must be a non-negative integer, got {curve_points!r}")
    if not 0 < target <= 1:
        raise ConfigError(f"target faithfulness must lie in (0, 1], got {target!r}")
    ctx = prepare(model, data, corrupted=corrupted, ablation=ablation, metric=metric, batch_size=batch_size,
                  device=device)  # fmt: skip
    g = ctx.graph
    if top_n is not None and top_n > g.n_edges:
        raise ConfigError(f"top_n={top_n} is more than the graph's {g.n_edges} edges")
    empty = float(circuit_metrics(ctx, torch.zeros(1, g.n_edges, dtype=torch.bool))[0])
    if method == "acdc" and tau is None:
        tau = 0.01 * abs(ctx.full - empty)
    scores, acdc_keep = _scores(ctx, method, steps, tau)
    need = top_n is None and threshold is None and acdc_keep is None  # the target rule reads the curve
    sizes = _curve_sizes(g.n_edges, max(curve_points, 8 if need else 0)) if curve_points or need else []
    values = circuit_metrics(ctx, top_k_masks(scores, sizes)).tolist() if sizes else []
    if acdc_keep is not None:
        kept = acdc_keep
    elif top_n is not None:
        kept = top_k_masks(scores, [top_n])[0]
    elif threshold is not None:
        kept = scores.abs() >= threshold
    else:
        kept = top_k_masks(scores, [_smallest_reaching(ctx, scores, sizes, values, empty, target)])[0]
    circuit = float(circuit_metrics(ctx, kept[None])[0])
    rule = {"top_n": top_n, "threshold": threshold, "tau": tau, "steps": steps}
    if acdc_keep is None and top_n is None and threshold is None:
        rule["target"] = target
    return Circuit(
        graph=g,
        scores=scores,
        kept=kept,
        method=method,
        ablation=ctx.ablation,
        metric=ctx.metric.name,
        full=ctx.full,
        empty=empty,
        circuit=circuit,
        curve_sizes=sizes,
        curve_values=values,
        n_examples=int(ctx.tokens.shape[0]),
        rule=rule,
        info={"seconds": round(time.perf_counter() - t0, 4), "forwards": round(float(ctx.forwards), 2)},
    )


def edge_roc_auc(circuit: Circuit | Float[Tensor, " edge"], true_edges: Sequence[str], graph=None) -> float:
    """ROC AUC of ``|score|`` ranking the ``true_edges`` (names ``sender->receiver``) above the others (scikit-learn's
    ``roc_auc_score``); ``circuit`` a :class:`Circuit`, or scores with their ``graph``."""
    from sklearn.metrics import roc_auc_score

    if isinstance(circuit, Circuit):
        scores, graph = circuit.scores, circuit.graph
    else:
        scores = circuit
        if graph is None:
            raise InterpError("edge_roc_auc needs the graph of the scores: pass graph=")
    truth = torch.zeros(graph.n_edges, dtype=torch.bool)
    for name in true_edges:
        truth[graph.edge_index(name)] = True
    if truth.all() or not truth.any():
        raise InterpError("an ROC AUC needs both true and false edges; the true edges are all or none of the graph")
    return float(roc_auc_score(truth.numpy(), scores.abs().nan_to_num(0).numpy()))


__all__ = ["METHODS", "Circuit", "computational_graph", "discover_circuit", "edge_roc_auc", "top_k_masks"]
