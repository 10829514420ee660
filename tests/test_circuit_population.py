"""The circuits of a population (``interp.analyses.circuit_population``) against independent computations: each
run's circuit equals :func:`discover_circuit` on that run's checkpoint loaded alone, the per-class profile equals a
count written here from the edge names, and the permutation test's p-value agrees with the exact p-value of every
relabelling of a five-run population (Monte Carlo error stated)."""

from __future__ import annotations

import itertools
import json
import math
import re

import pytest
import torch

from interp.analyses.circuit_discovery import discover_circuit
from interp.analyses.circuit_population import population_circuits
from interp.checkpoint import save_checkpoint
from interp.loading import load_checkpoint

pytestmark = pytest.mark.slow  # five checkpoints and their circuits: ~20 s idle

ACCURACY = [1.0, 0.9, 1.0, 0.8, 0.7]  # runs 0 and 2 "succeed" at threshold 1.0


@pytest.fixture(scope="module")
def population(tmp_path_factory):
    from interp.analyses.repeated_tokens import corrupted_pair

    ck = load_checkpoint("repeated-tokens", device="cpu")
    clean, corrupted = corrupted_pair(ck.task, 6, kind="key")
    sweep = tmp_path_factory.mktemp("sweep")
    (sweep / "runs").mkdir()
    rows = []
    for seed, acc in enumerate(ACCURACY):  # the shipped model with its heads' outputs rescaled differently per run
        m = load_checkpoint("repeated-tokens", device="cpu").model
        gen = torch.Generator().manual_seed(seed)
        with torch.no_grad():
            m.W_O.mul_(0.5 + torch.rand(m.W_O.shape[:2] + (1, 1), generator=gen))
        path = save_checkpoint(m, ck.task, sweep / "runs" / f"r{seed}.safetensors")
        rows.append({"name": f"r{seed}", "seed": seed, "checkpoint": f"runs/{path.name}", "accuracy": {"test": acc}})
    (sweep / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    pop = population_circuits(sweep, clean, corrupted=corrupted, method="eap", top_n=4)
    return sweep, clean, corrupted, pop


def test_each_run_is_its_circuit_discovered_alone(population):
    sweep, clean, corrupted, pop = population
    assert pop.names == [f"r{i}" for i in range(5)] and pop.accuracy == ACCURACY
    for i in range(5):
        model = load_checkpoint(sweep / "runs" / f"r{i}.safetensors", device="cpu").model
        alone = discover_circuit(model, clean, corrupted=corrupted, method="eap", top_n=4, curve_points=0)
        assert torch.equal(pop.kept[i], alone.kept)
        assert torch.equal(pop.scores[i], alone.scores)
        assert pop.faithfulness[i] == pytest.approx(alone.faithfulness, rel=0, abs=0) or (
            math.isnan(pop.faithfulness[i]) and math.isnan(alone.faithfulness)
        )
    assert pop.sizes == [4] * 5


def test_the_profile_counts_kept_edges_by_class(population):
    """The class of an edge written independently: head indices dropped from 'L1H0.k', 'L0H1' (regex here)."""
    _, _, _, pop = population

    def cls(name: str) -> str:
        return re.sub(r"^L(\d+)H\d+", r"L\1 head", name)

    names = pop.graph.edge_names  # "sender->receiver"
    classes = sorted({" -> ".join(cls(p) for p in n.split("->")) for n in names})
    assert pop.classes == classes
    for i in range(5):
        counts = dict.fromkeys(classes, 0)
        for e, name in enumerate(names):
            if pop.kept[i, e]:
                counts[" -> ".join(cls(p) for p in name.split("->"))] += 1
        assert pop.profile[i].tolist() == [counts[c] for c in classes]
    assert pop.edge_frequency.tolist() == pytest.approx(pop.kept.float().mean(0).tolist())


def test_the_permutation_test_agrees_with_every_relabelling(population):
    """Five runs, two succeeding: the exact p-value over all 10 relabellings, from the between-minus-within L1
    distance computed with plain loops; the Monte Carlo p (20,000 permutations) within 4 standard errors of it."""
    _, _, _, pop = population
    prof = pop.profile.tolist()
    n = len(prof)

    def l1(a, b):
        return sum(abs(x - y) for x, y in zip(a, b))

    def stat(group: set[int]) -> float:
        other = [j for j in range(n) if j not in group]
        between = [l1(prof[i], prof[j]) for i in group for j in other]
        within = [l1(prof[i], prof[j]) for g in (sorted(group), other) for i in g for j in g if i != j]
        return sum(between) / len(between) - sum(within) / len(within)

    observed = stat({0, 2})
    labellings = [set(c) for c in itertools.combinations(range(n), 2)]
    exact = sum(stat(g) >= observed - 1e-9 for g in labellings) / len(labellings)
    res = pop.compare(threshold=1.0, permutations=20000, seed=0)
    assert (res["succeeded"], res["failed"]) == (2, 3)
    assert res["distance_between_minus_within"] == pytest.approx(observed, abs=1e-5)
    se = math.sqrt(exact * (1 - exact) / 20000)
    assert abs(res["permutation_p"] - exact) <= 4 * se + 1e-4


def test_the_group_statistic_on_three_hand_written_profiles():
    """Run 0 against runs 1 and 2, by hand: between (d01 + d02) / 2, within d12 (the one pair of two different
    runs). A trial found the within mean counting each run's zero distance to itself as a pair (its profiles with
    d01 = 5, d02 = 3, d12 = 6 read +1.6 instead of -2). Bad groups, labels and permutation counts are refused."""
    from interp.analyses.circuit_graph import ComputationalGraph
    from interp.analyses.circuit_population import PopulationCircuits
    from interp.errors import ConfigError

    graph = ComputationalGraph.build(n_layers=1, n_heads=2, n_kv_heads=2, has_mlp=False, parallel=False)
    kept = torch.zeros(3, graph.n_edges, dtype=torch.bool)
    kept[0, :5] = True
    kept[1, 4] = True
    kept[2, 1:8] = True
    pop = PopulationCircuits(graph=graph, names=["a", "b", "c"], seeds=[0, 1, 2], accuracy=[1.0, 0.5, 0.5],
                             kept=kept, scores=kept.float(), faithfulness=[1.0, 1.0, 1.0], method="eap",
                             ablation="patch", metric="logit_diff")  # fmt: skip
    P = pop.profile
    d = lambda i, j: float((P[i] - P[j]).abs().sum())  # noqa: E731
    between, within = (d(0, 1) + d(0, 2)) / 2, d(1, 2)
    res = pop.compare_groups([True, False, False], permutations=50)
    assert res["distance_between_minus_within"] == pytest.approx(between - within, abs=1e-12)
    assert pop.compare(1.0, permutations=50)["distance_between_minus_within"] == pytest.approx(between - within)
    for bad, match in ((None, "one true/false per run"), ("TFF", "one true/false per run"), ([True], "1 entries")):
        with pytest.raises(ConfigError, match=match):
            pop.compare_groups(bad)
    with pytest.raises(ConfigError, match="two names"):
        pop.compare_groups([True, False, False], labels=("x",))
    with pytest.raises(ConfigError, match="positive integer"):
        pop.compare_groups([True, False, False], permutations=0)
