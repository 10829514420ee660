"""The explorer's circuit view: the computational graph of the model (:mod:`interp.analyses.circuit_graph`: the
input, every head's q / k / v inputs, the MLPs, the logits) on the current input and its corruption, every edge
scored by edge attribution patching (Syed, Rager and Conmy 2023, *Attribution Patching Outperforms Automated
Circuit Discovery*), and the model with some edges switched off: its prediction at the answer position, its logit
difference, and the faithfulness of what is left (``(M(left) - M(empty)) / (M(full) - M(empty))``, as
:class:`interp.analyses.Circuit` defines it).

Nothing is scored or run here: the scores are :func:`analyses.circuit_scores.edge_attribution` (what
``discover_circuit(method="eap")`` returns), the edge-ablation forward is
:func:`analyses.circuit_scores.circuit_metrics` (a removed edge carries the corrupted run's sender output, the
``"patch"`` ablation), and the faithfulness is :attr:`analyses.Circuit.faithfulness`. This module only caches them
per input pair and reads the answer position's logits out of that forward.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

import torch
from torch import Tensor

from interp.analyses.circuit_discovery import Circuit
from interp.analyses.circuit_graph import ComputationalGraph, computational_graph
from interp.analyses.circuit_scores import Context, circuit_metrics, edge_attribution, prepare
from interp.analyses.patching import VariantMetric
from interp.errors import InterpError

from .compute import TOP_K, finite_or_none

if TYPE_CHECKING:
    from transformer_lens import HookedTransformer

    from interp.task import TaskData

MAX_EDGES = 400  # edges drawn at most (the largest |score| first; every edge switched off is drawn too)


def parse_edges(graph: ComputationalGraph, value: object) -> list[int]:
    """Edge indices from a list of names (``'L0H1->L1H0.k'``; one name alone also works), sorted and unique; an
    InterpError naming the first unknown edge otherwise."""
    if isinstance(value, str):
        value = [value]
    try:
        names = list(value)
    except TypeError:
        raise InterpError(
            f"edges_off must be a list of edge names (sender->receiver, e.g. {graph.edge_names[0]!r}), got {value!r}"
        ) from None
    out = set()
    for name in names:
        if not isinstance(name, str):
            raise InterpError(f"an edge is named sender->receiver (e.g. {graph.edge_names[0]!r}), got {name!r}")
        out.add(graph.edge_index(name))
    return sorted(out)


class CircuitSession:
    """The circuit view of one input pair: the EAP scores of every edge and the empty circuit's metric (computed
    once per pair), and the run with the edges in ``off`` removed."""

    def __init__(self, model: HookedTransformer, clean: TaskData, corrupted: TaskData):
        self.model = model
        self.clean, self.corrupted = clean, corrupted
        self.ctx: Context = prepare(model, clean, corrupted=corrupted, ablation="patch", metric="logit_diff")
        self.graph = self.ctx.graph
        self.scores = edge_attribution(self.ctx, 1)
        n = self.graph.n_edges
        self.full = self.ctx.full  # the model's own metric on the input (prepare's clean run)
        self.empty, _ = self.run(torch.zeros(n, dtype=torch.bool))
        _, self.full_logits = self.run(torch.ones(n, dtype=torch.bool))

    def run(self, keep: Tensor) -> tuple[float, Tensor]:
        """The metric (logit difference of the clean and corrupted answers) and the answer position's logits
        (``[vocab_out]``) with the edges where ``keep`` is False removed: one run of
        :func:`analyses.circuit_scores.circuit_metrics`, whose metric also hands its logits here."""
        base = self.ctx.metric
        seen: dict[str, Tensor] = {}

        def fn(at: Tensor) -> Tensor:
            seen["logits"] = at.detach().float().cpu()
            return base.fn(at)

        ctx = dataclasses.replace(self.ctx, metric=VariantMetric(base.name, fn, base.positions))
        m = float(circuit_metrics(ctx, keep[None])[0])
        self.ctx.forwards = ctx.forwards
        return m, seen["logits"][0, 0]

    def circuit(self, off: list[int]) -> tuple[Circuit, Tensor]:
        """The :class:`analyses.Circuit` of the edges left on (its ``circuit`` metric and ``faithfulness``), and the
        answer position's logits with ``off`` removed."""
        keep = torch.ones(self.graph.n_edges, dtype=torch.bool)
        keep[off] = False
        m, logits = (self.full, self.full_logits) if not off else self.run(keep)
        c = Circuit(
            graph=self.graph,
            scores=self.scores,
            kept=keep,
            method="eap",
            ablation="patch",
            metric=self.ctx.metric.name,
            full=self.full,
            empty=self.empty,
            circuit=m,
            n_examples=1,
            rule={"edges_off": len(off)},
        )
        return c, logits


def top_tokens(logits: Tensor, names: list[str], label: int) -> dict:
    """The top ``TOP_K`` tokens and probabilities of one position's logits, the argmax and whether it is
    ``label``."""
    probs = logits.softmax(-1)
    top = probs.topk(min(TOP_K, probs.shape[-1]))
    best = int(top.indices[0])
    return {
        "top": [[names[int(i)], float(p)] for i, p in zip(top.indices, top.values)],
        "argmax": names[best],
        "correct": best == label,
    }


def circuit_page(cs: CircuitSession, c: Circuit, logits: Tensor, off: list[int], names: list[str]) -> dict:
    """What the page draws: the nodes (name, layer, kind), the receivers (their node and input), the edges drawn
    (sender, receiver, score, off; at most ``MAX_EDGES`` by ``|score|``, plus every edge off), and the numbers of
    the panel (the metric of the full model, of what is left and of the empty circuit, the faithfulness, and the
    prediction with and without the edges off): ``c`` and ``logits`` are :meth:`CircuitSession.circuit`'s."""
    g = cs.graph
    label, bad = int(cs.clean.labels[0]), int(cs.corrupted.labels[0])
    order = cs.scores.abs().nan_to_num(-1).argsort(descending=True).tolist()
    drawn = sorted(set(order[:MAX_EDGES]) | set(off))
    offs = set(off)
    nodes: list[dict] = [{"name": s, "layer": l, "kind": _kind(s)} for s, l in zip(g.senders, g.sender_layer)]
    known = {n["name"] for n in nodes}
    for r, rl in zip(g.receivers, g.receiver_layer):
        node = r.split(".")[0]
        if node not in known:  # the logits, and grouped-query attention's key/value heads
            nodes.append({"name": node, "layer": rl, "kind": _kind(node)})
            known.add(node)
    return {
        "nodes": nodes,
        "receivers": [{"node": r.split(".")[0], "input": r.split(".")[1] if "." in r else ""} for r in g.receivers],
        "senders": list(g.senders),
        "edges": [
            {
                "name": f"{g.senders[g.edges[e][1]]}->{g.receivers[g.edges[e][0]]}",
                "s": g.edges[e][1],
                "r": g.edges[e][0],
                "score": finite_or_none(cs.scores[e]),
                "off": e in offs,
            }
            for e in drawn
        ],
        "n_edges": g.n_edges,
        "n_off": len(off),
        "metric": c.metric,
        "full": finite_or_none(c.full),
        "empty": finite_or_none(c.empty),
        "left": finite_or_none(c.circuit),
        "faithfulness": finite_or_none(c.faithfulness),
        "clean_label": names[label],
        "corrupted_label": names[bad],
        "prediction": top_tokens(logits, names, label),
        "full_prediction": top_tokens(cs.full_logits, names, label),
    }


def _kind(node: str) -> str:
    if node in ("input", "logits"):
        return node
    return "mlp" if node.startswith("MLP") else "head"


def graph_of(model: HookedTransformer) -> ComputationalGraph:
    """The model's computational graph (to check edge names before any input pair is scored)."""
    return computational_graph(model)
