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
        within = [l1(prof[i], prof[j]) for g in (sorted(group), other) for i in g for j in g]
        return sum(between) / len(between) - sum(within) / len(within)

    observed = stat({0, 2})
    labellings = [set(c) for c in itertools.combinations(range(n), 2)]
    exact = sum(stat(g) >= observed - 1e-9 for g in labellings) / len(labellings)
    res = pop.compare(threshold=1.0, permutations=20000, seed=0)
    assert (res["succeeded"], res["failed"]) == (2, 3)
    assert res["distance_between_minus_within"] == pytest.approx(observed, abs=1e-5)
    se = math.sqrt(exact * (1 - exact) / 20000)
    assert abs(res["permutation_p"] - exact) <= 4 * se + 1e-4
