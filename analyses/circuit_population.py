"""Circuits of a population: every run of a sweep directory (``interp sweep``), one circuit each, compared.

:func:`population_circuits` discovers each run's circuit on the same clean / corrupted data (one
:func:`interp.analyses.circuit_discovery.discover_circuit` per checkpoint: the runs are separate models, so they are
looped, each run's edges batched as usual) and returns per-edge frequencies, each run's size and faithfulness, and a
grouping of runs by circuit.

Heads of one layer are interchangeable between seeds (seed 3's ``L0H1`` need not do what seed 7's ``L0H1`` does), so
per-edge frequencies by head index say little across seeds. Runs are compared by a head-permutation-invariant
**edge profile**: for each edge class (sender kind and layer -> receiver kind, layer and input, e.g. ``L0 head ->
L1 head .k``) the number of kept edges of that class. Runs with the same profile use the same circuit up to a
renaming of heads; :meth:`PopulationCircuits.compare` asks whether runs that reach an accuracy and runs that do not
use different profiles (a permutation test on the mean profile distance between the groups, plus each class's mean
count in each group with bootstrap intervals).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from jaxtyping import Int
from torch import Tensor

from interp.errors import ConfigError
from interp.results import Result, floats, jsonable
from interp.task import TaskData

from .circuit_discovery import discover_circuit
from .circuit_graph import ComputationalGraph

if TYPE_CHECKING:
    pass


def edge_class(graph: ComputationalGraph, e: int) -> str:
    """The class of edge ``e`` with head indices dropped: ``input -> L0 head.v``, ``L0 head -> logits``."""
    r, s = graph.edges[e]

    def kind(name: str) -> str:
        if name in ("input", "logits") or name.startswith("MLP"):
            return name
        node, _, letter = name.partition(".")
        layer = node[1:].replace("KV", "H").split("H")[0]
        return f"L{layer} head" + (f".{letter}" if letter else "")

    return f"{kind(graph.senders[s])} -> {kind(graph.receivers[r])}"


@dataclass(eq=False)
class PopulationCircuits(Result):
    """Each run's circuit: ``kept [run, edge]``, ``scores [run, edge]``, ``faithfulness [run]``, with the runs'
    ``names``, ``seeds`` and test ``accuracy``; ``classes`` the edge classes and ``profile [run, class]`` the kept
    edges per class (see the module doc)."""

    graph: ComputationalGraph
    names: list[str]
    seeds: list[int]
    accuracy: list[float]
    kept: Tensor
    scores: Tensor
    faithfulness: list[float]
    method: str
    ablation: str
    metric: str
    info: dict = field(default_factory=dict)

    @property
    def classes(self) -> list[str]:
        return sorted({edge_class(self.graph, e) for e in range(self.graph.n_edges)})

    @property
    def profile(self) -> Tensor:
        cls = self.classes
        idx = torch.tensor([cls.index(edge_class(self.graph, e)) for e in range(self.graph.n_edges)])
        out = torch.zeros(len(self.names), len(cls))
        out.index_add_(1, idx, self.kept.float())
        return out

    @property
    def edge_frequency(self) -> Tensor:
        """The share of runs whose circuit keeps each edge (by head index: see the module doc)."""
        return self.kept.float().mean(0)

    @property
    def sizes(self) -> list[int]:
        return self.kept.sum(1).tolist()

    def circuit_types(self) -> list[dict]:
        """Runs grouped by identical profile, largest group first: the profile, the runs, their share."""
        groups: dict[tuple, list[int]] = {}
        for i, row in enumerate(self.profile.long().tolist()):
            groups.setdefault(tuple(row), []).append(i)
        out = []
        for prof, runs in sorted(groups.items(), key=lambda kv: -len(kv[1])):
            out.append(
                {
                    "profile": {c: n for c, n in zip(self.classes, prof) if n},
                    "runs": len(runs),
                    "seeds": [self.seeds[i] for i in runs],
                    "mean_accuracy": sum(self.accuracy[i] for i in runs) / len(runs),
                }
            )
        return out

    def compare(self, threshold: float = 1.0, permutations: int = 10000, seed: int = 0) -> dict:
        """Runs with test accuracy ``>= threshold`` (``succeeded``) against the others (``failed``):
        :meth:`compare_groups`, with the threshold recorded."""
        ok = [a >= threshold for a in self.accuracy]
        if all(ok) or not any(ok):
            raise ConfigError(f"every run is on one side of accuracy {threshold}: nothing to compare")
        out = self.compare_groups(ok, ("succeeded", "failed"), permutations=permutations, seed=seed)
        return {"threshold": threshold, **out}

    def compare_groups(self, group: Any, labels: Any = ("in", "out"), permutations: Any = 10000, seed: int = 0) -> dict:
        """Runs where ``group`` (one truth value per run: a list, a numpy array or a tensor) is true against the
        others (named by ``labels``): the mean L1 distance between the two groups' profiles minus the mean distance
        between two different runs of one group, its permutation p-value (labels shuffled), and per class
        the mean kept count in each group with 95% bootstrap intervals; sizes and faithfulness likewise."""
        if group is None or isinstance(group, (str, bytes)) or not hasattr(group, "__len__"):
            raise ConfigError(f"group must be one true/false per run ({len(self.names)}), got {group!r}")
        if len(group) != len(self.names):
            raise ConfigError(f"group has {len(group)} entries for {len(self.names)} runs")
        if isinstance(labels, str) or len(labels) != 2 or not all(isinstance(x, str) for x in labels):
            raise ConfigError(f"labels must be two names, one per group, got {labels!r}")
        if isinstance(permutations, bool) or not isinstance(permutations, int) or permutations < 1:
            raise ConfigError(f"permutations must be a positive integer, got {permutations!r}")
        ok = torch.tensor([bool(g) for g in group])
        if ok.all() or not ok.any():
            raise ConfigError(f"every run is in one group ({labels[0] if ok.all() else labels[1]}): nothing to compare")
        if len(ok) < 3:
            raise ConfigError("two runs, one per group, have no pair within a group to measure: compare three or more")
        yes, no = labels
        P = self.profile
        D = torch.cdist(P.double(), P.double(), p=1)  # integer distances: every sum below is exact in float64

        def stat(masks: Tensor) -> Tensor:
            """``[m]`` between-group minus within-group mean distance of each labelling ``masks [m, run]``, all
            labellings in one product. Within means pairs of two different runs of one group (a run's zero distance
            to itself is not a pair; with three runs or more a labelling always has one)."""
            a = masks.double()
            b = 1.0 - a
            na, nb = a.sum(1), b.sum(1)
            aD, bD = a @ D, b @ D
            between = (aD * b).sum(1) / (na * nb)
            within = ((aD * a).sum(1) + (bD * b).sum(1)) / (na * (na - 1) + nb * (nb - 1))
            return between - within

        gen = torch.Generator().manual_seed(seed)
        observed = float(stat(ok[None])[0])
        shuffled = torch.stack([ok[torch.randperm(len(ok), generator=gen)] for _ in range(permutations)])
        null = stat(shuffled)
        p = (1 + int((null >= observed).sum())) / (1 + permutations)

        def boot(values: Tensor) -> tuple[float, float, float]:
            idx = torch.randint(0, len(values), (2000, len(values)), generator=gen)
            means = values[idx].float().mean(1)
            return float(values.float().mean()), float(means.quantile(0.025)), float(means.quantile(0.975))

        per_class = []
        for j, c in enumerate(self.classes):
            per_class.append({"class": c, yes: boot(P[ok, j]), no: boot(P[~ok, j])})
        faith = torch.tensor(self.faithfulness)
        sizes = torch.tensor(self.sizes)
        return {
            yes: int(ok.sum()),
            no: int((~ok).sum()),
            "distance_between_minus_within": observed,
            "permutation_p": p,
            "permutations": permutations,
            "per_class": per_class,
            "size": {yes: boot(sizes[ok]), no: boot(sizes[~ok])},
            "faithfulness": {yes: boot(faith[ok]), no: boot(faith[~ok])},
        }

    def to_dict(self) -> dict:
        return jsonable(
            {
                "method": self.method,
                "ablation": self.ablation,
                "metric": self.metric,
                "graph": self.graph.to_dict(),
                "edges": self.graph.edge_names,
                "names": self.names,
                "seeds": self.seeds,
                "accuracy": self.accuracy,
                "kept": self.kept.int(),
                "scores": self.scores,
                "faithfulness": self.faithfulness,
                "edge_frequency": self.edge_frequency,
                "classes": self.classes,
                "profile": self.profile,
                "info": self.info,
            }
        )

    @classmethod
    def from_dict(cls, d: dict) -> PopulationCircuits:
        return cls(
            graph=ComputationalGraph.from_dict(d["graph"]),
            names=list(d["names"]),
            seeds=list(d["seeds"]),
            accuracy=list(d["accuracy"]),
            kept=torch.tensor(d["kept"], dtype=torch.bool),
            scores=floats(d["scores"], torch.float32),
            faithfulness=[math.nan if f is None else f for f in d["faithfulness"]],
            method=d["method"],
            ablation=d["ablation"],
            metric=d["metric"],
            info=dict(d["info"]),
        )

    def text(self) -> str:
        lines = [
            f"circuits of {len(self.names)} runs ({self.method}, {self.ablation} ablation, metric {self.metric}): "
            f"size {sum(self.sizes) / len(self.names):.1f} edges on average of {self.graph.n_edges}, faithfulness "
            f"{sum(self.faithfulness) / len(self.names):.3f} on average"
        ]
        for t in self.circuit_types()[:6]:
            prof = ", ".join(f"{c}: {n}" for c, n in t["profile"].items())
            lines.append(f"  {t['runs']} runs (mean accuracy {t['mean_accuracy']:.4f}): {prof}")
        return "\n".join(lines)

    def figure(self):
        """Runs (rows, sorted by accuracy) x edge classes: kept edges per class."""
        from interp.visualize import heatmap

        order = sorted(range(len(self.names)), key=lambda i: self.accuracy[i])
        z = self.profile[order]
        y = [f"seed {self.seeds[i]} ({self.accuracy[i]:.3f})" for i in order]
        return heatmap(
            z,
            self.classes,
            y,
            title=f"Kept edges per class, each run's {self.method} circuit (rows by test accuracy)",
            colorscale="Blues",
            zmid=None,
            zmin=0,  # counts: white is none kept (centred at 0 the scale ran from -max to max)
            x_title="edge class",
            y_title="run",
        )


def population_circuits(
    directory,
    data: TaskData | Int[Tensor, "batch pos"],
    *,
    corrupted: TaskData | Int[Tensor, "batch_c pos_c"] | None = None,
    ablation: str | None = None,
    metric: str | Callable = "logit_diff",
    method: str = "patching",
    top_n: int | None = None,
    target: float = 0.9,
    split: str = "test",
    batch_size: int | None = None,
    device: str | None = None,
    progress: bool = False,
) -> PopulationCircuits:
    """The circuit of every run in the sweep ``directory`` on ``data`` (and ``corrupted``), with the kept-edge rule
    of :func:`discover_circuit` (``top_n`` or the ``target`` faithfulness); ``split``: whose accuracy is recorded."""
    from tqdm import tqdm

    from interp.loading import load_checkpoint
    from interp.sweep_directory import checkpoint_path, read_results

    rows = read_results(Path(directory))
    if not rows:
        raise ConfigError(f"{directory} has no finished runs (results.jsonl is empty)")
    circuits, names, seeds, acc = [], [], [], []
    for row in tqdm(rows, desc="circuits", disable=not progress):
        ck = load_checkpoint(checkpoint_path(directory, row), device=device)
        c = discover_circuit(ck.model, data, corrupted=corrupted, ablation=ablation, metric=metric, method=method,
                             top_n=top_n, target=target, curve_points=0, batch_size=batch_size)  # fmt: skip
        circuits.append(c)
        names.append(row.get("name", ""))
        seeds.append(int(row.get("seed", len(seeds))))
        acc.append(float(row["accuracy"][split]))
    graph = circuits[0].graph
    if any(c.graph.edge_names != graph.edge_names for c in circuits):
        raise ConfigError("the runs have different architectures; compare circuits of one configuration at a time")
    return PopulationCircuits(
        graph=graph,
        names=names,
        seeds=seeds,
        accuracy=acc,
        kept=torch.stack([c.kept for c in circuits]),
        scores=torch.stack([c.scores for c in circuits]),
        faithfulness=[c.faithfulness for c in circuits],
        method=method,
        ablation=circuits[0].ablation,
        metric=circuits[0].metric,
        info={"directory": str(directory), "rule": circuits[0].rule, "examples": circuits[0].n_examples},
    )
