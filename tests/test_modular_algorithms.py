"""Clock or Pizza (Zhong et al. 2023): the two diagnostics against plain loops and hand-built logit functions and
models whose answer is known."""

from __future__ import annotations

import math

import pytest
import torch

from interp.analyses.modular_addition.algorithms import (
    AlgorithmDiagnostics,
    PopulationAlgorithms,
    algorithm_diagnostics,
    classify,
    correct_logits,
    distance_irrelevance,
    embedding_gradients,
    gradient_symmetricity,
    population_algorithms,
    triples_for,
)
from interp.errors import ConfigError, InterpError
from interp.model import ModelSpec, build_model
from interp.tasks import get_task


def small_model(task, seed=0, **kw):
    spec = ModelSpec(**{**task.default_spec(), "d_model": 16, "n_heads": 2, "d_head": 8, "d_mlp": 32, **kw})
    torch.manual_seed(seed)
    return build_model(spec, device="cpu")


def plain_distance_irrelevance(table):
    """Zhong et al.'s loop: L[(a + b) % p][(a - b) % p], then mean over d of the std over s, over the std of all."""
    p = len(table)
    L = [[0.0] * p for _ in range(p)]
    for a in range(p):
        for b in range(p):
            L[(a + b) % p][(a - b) % p] = float(table[a][b])

    def std(xs):
        m = sum(xs) / len(xs)
        return math.sqrt(sum((x - m) ** 2 for x in xs) / len(xs))

    within = sum(std([L[s][d] for s in range(p)]) for d in range(p)) / p
    return within / std([v for row in L for v in row])


def plain_by_difference(table):
    """The definition for any modulus: for each d the p pairs (a, b) with (a - b) mod p = d; the mean over d of
    their std, over the std of all pairs."""
    p = len(table)

    def std(xs):
        m = sum(xs) / len(xs)
        return math.sqrt(sum((x - m) ** 2 for x in xs) / len(xs))

    groups = [[float(table[a][b]) for a in range(p) for b in range(p) if (a - b) % p == d] for d in range(p)]
    return sum(std(g) for g in groups) / p / std([float(v) for row in table for v in row])


def test_distance_irrelevance_matches_a_plain_loop_batched():
    tables = torch.randn(3, 7, 7, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    got = distance_irrelevance(tables)
    assert got.shape == (3,)
    for i in range(3):
        assert float(got[i]) == pytest.approx(plain_distance_irrelevance(tables[i].tolist()), abs=1e-12)


def test_distance_irrelevance_of_known_tables():
    p = 11
    a = torch.arange(p, dtype=torch.float64)
    w = 2 * math.pi * 3 / p
    s, d = (a[:, None] + a[None, :]) % p, (a[:, None] - a[None, :]) % p
    # a correct logit that depends on a + b only (a Clock whose confidence varies with the sum): exactly 1
    assert float(distance_irrelevance(torch.sin(w * s) + 0.3 * s)) == pytest.approx(1.0, abs=1e-12)
    # the Pizza's correct logit |cos(w (a - b) / 2)| depends on a - b only: exactly 0
    pizza = torch.cos(w * (a[:, None] - a[None, :]) / 2).abs()
    assert float(distance_irrelevance(pizza)) == pytest.approx(0.0, abs=1e-12)
    assert float(distance_irrelevance(d * 1.0)) == pytest.approx(0.0, abs=1e-12)
    # the pure Clock's correct logit cos(0) is the same for every pair: undefined
    assert math.isnan(float(distance_irrelevance(torch.ones(p, p))))
    for q in (4, 6, 7):  # any modulus: the std over the pairs of each difference, written as a loop
        t = torch.randn(q, q, generator=torch.Generator().manual_seed(q), dtype=torch.float64)
        assert float(distance_irrelevance(t)) == pytest.approx(plain_by_difference(t.tolist()), abs=1e-12)
    with pytest.raises(InterpError, match=r"\[\.\.\., p, p\]"):
        distance_irrelevance(torch.randn(4, 5))


def circle(x, w):
    return torch.stack([torch.cos(w * x), torch.sin(w * x)], -1)


def grads_of(logit_fn, triples, w):
    """Gradients of a hand-written logit function of the two embeddings (points on the circle) by autograd."""
    a, b, c = triples.double().unbind(1)
    ea, eb = circle(a, w).requires_grad_(True), circle(b, w).requires_grad_(True)
    ga, gb = torch.autograd.grad(logit_fn(ea, eb, c).sum(), (ea, eb))
    return ga, gb


def clock(ea, eb, c, w):
    """cos(w (a + b - c)) by multiplying the rotations of a and b (the Clock)."""
    re = ea[:, 0] * eb[:, 0] - ea[:, 1] * eb[:, 1]
    im = ea[:, 0] * eb[:, 1] + ea[:, 1] * eb[:, 0]
    return re * torch.cos(w * c) + im * torch.sin(w * c)


def pizza(ea, eb, c, w):
    """|cos(w (a - b) / 2)| cos(w (a + b - c)) from the midpoint of the two embeddings only (the Pizza)."""
    m = (ea + eb) / 2
    u = circle(c, w)
    return (m * u).sum(-1) * 2 * torch.relu(m * u).sum(-1)  # any function of ea + eb gives the same gradients


def test_gradient_symmetricity_of_a_hand_written_clock_and_pizza():
    p, k = 13, 2
    w = 2 * math.pi * k / p
    triples = triples_for(p, seed=1)
    a, b = triples[:, 0].double(), triples[:, 1].double()
    ga, gb = grads_of(lambda ea, eb, c: clock(ea, eb, c, w), triples, w)
    # per triple the cosine is cos(w (a - b)) (derived by hand), so over every pair the mean is 0
    per = torch.stack([gradient_symmetricity(ga[i : i + 1], gb[i : i + 1]) for i in range(len(ga))])
    torch.testing.assert_close(per, torch.cos(w * (a - b)), atol=1e-12, rtol=0)
    assert float(gradient_symmetricity(ga, gb)) == pytest.approx(0.0, abs=1e-12)
    ga, gb = grads_of(lambda ea, eb, c: pizza(ea, eb, c, w), triples, w)
    assert float(gradient_symmetricity(ga, gb)) == pytest.approx(1.0, abs=1e-12)
    # zero gradients are left out, all zero is NaN, shapes must agree
    z = torch.zeros_like(ga)
    assert float(gradient_symmetricity(torch.cat([ga, z]), torch.cat([gb, z]))) == pytest.approx(1.0, abs=1e-12)
    assert math.isnan(float(gradient_symmetricity(z, z)))
    with pytest.raises(InterpError, match="one shape"):
        gradient_symmetricity(ga, gb[:3])


def test_classify_by_the_midpoint_thresholds():
    assert classify(0.02, 0.97) == "clock"
    assert classify(0.99, 0.1) == "pizza"
    assert classify(0.9, 0.9) == "neither" and classify(0.1, 0.1) == "neither"
    assert classify(math.nan, 0.9) == "neither"
    assert classify(0.6, 0.3, {"gradient_symmetricity": 0.7}) == "neither"


def test_embedding_gradients_match_a_plain_loop_on_a_trained_shape():
    task = get_task("modular-addition", p=7, fraction=0.5)
    model = small_model(task, seed=3)
    triples = triples_for(7, seed=2)[::8]
    ga, gb = embedding_gradients(model, triples, p=7, batch_size=4)  # several batches
    for i, (a, b, c) in enumerate(triples.tolist()):
        tok = torch.tensor([[a, b, 7]])
        resid = (model.embed(tok) + model.pos_embed(tok)).detach().requires_grad_(True)
        logit = model(resid, start_at_layer=0)[0, -1, c]
        (g,) = torch.autograd.grad(logit, resid)
        torch.testing.assert_close(ga[i], g[0, 0], atol=1e-6, rtol=1e-5)
        torch.testing.assert_close(gb[i], g[0, 1], atol=1e-6, rtol=1e-5)


def test_constant_attention_model_is_exactly_symmetric():
    """Zero queries and keys: '=' attends to a, b and '=' equally (Zhong et al.'s Model A), so the output is a function
    of E_a + E_b and the two gradients are equal: gradient symmetricity 1 whatever the other weights."""
    task = get_task("modular-addition", p=11, fraction=0.5)
    model = small_model(task, seed=4, positional="none")
    with torch.no_grad():
        model.blocks[0].attn.W_Q.zero_()
        model.blocks[0].attn.W_K.zero_()
    r = algorithm_diagnostics(model, task=task)
    assert r.gradient_symmetricity == pytest.approx(1.0, abs=1e-5)
    assert r.n_triples == 121
    assert r.distance_irrelevance == pytest.approx(plain_distance_irrelevance(correct_logits(model, task)), abs=1e-9)
    back = AlgorithmDiagnostics.from_dict(r.to_dict())
    assert back.to_dict() == r.to_dict() and r.algorithm in r.text()
    assert r.figure() is not None


def test_population_equals_each_model_alone():
    task = get_task("modular-addition", p=7, fraction=0.5)
    models = [small_model(task, seed=s) for s in range(2)]
    pop = population_algorithms(models, task=task)
    assert all(isinstance(k, list) for k in pop.key_frequencies)
    for i, m in enumerate(models):
        one = algorithm_diagnostics(m, task=task)
        assert float(pop.gradient_symmetricity[i]) == pytest.approx(one.gradient_symmetricity, abs=1e-9)
        assert float(pop.distance_irrelevance[i]) == pytest.approx(one.distance_irrelevance, abs=1e-9)
        assert pop.algorithms[i] == one.algorithm
    back = PopulationAlgorithms.from_dict(pop.to_dict())
    assert back.to_dict() == pop.to_dict()
    c = pop.counts()
    assert sum(row["runs"] for row in c["per_algorithm"].values()) == 2
    lo, hi = c["per_algorithm"]["neither"]["share_wilson95"]
    assert 0 <= lo <= c["per_algorithm"]["neither"]["share"] <= hi <= 1
    assert pop.figure() is not None and "algorithms of 2 runs" in pop.text()
    with pytest.raises(ConfigError, match="task="):
        population_algorithms(models)
    with pytest.raises(ConfigError, match="different widths"):
        population_algorithms([models[0], small_model(task, d_model=8, d_head=4)], task=task)


def test_circuit_profiles_compared_between_named_groups():
    """compare_groups on hand-set circuits: runs 0-2 keep one edge class, runs 3-5 another, so the groups differ
    (between-minus-within distance 2; exactly 2 of the 20 labelings of 6 runs split 3/3 reach it, this one and its
    mirror, so the permutation p-value is 0.1 up to Monte Carlo error: 3 standard errors of 2000 draws, 0.02)."""
    from interp.analyses.circuit_graph import computational_graph
    from interp.analyses.circuit_population import PopulationCircuits, edge_class

    task = get_task("modular-addition", p=7, fraction=0.5)
    graph = computational_graph(small_model(task))
    classes = [edge_class(graph, e) for e in range(graph.n_edges)]
    e1 = classes.index("input -> logits")
    e2 = next(i for i, c in enumerate(classes) if c.startswith("MLP"))
    kept = torch.zeros(6, graph.n_edges, dtype=torch.bool)
    kept[:3, e1] = True
    kept[3:, e2] = True
    pop = PopulationCircuits(graph, [f"r{i}" for i in range(6)], list(range(6)), [1.0] * 3 + [0.5] * 3, kept,
                             kept.float(), [1.0] * 6, "patching", "patch", "logit_diff")  # fmt: skip
    out = pop.compare_groups([True] * 3 + [False] * 3, ("clock", "pizza"), permutations=2000)
    assert out["clock"] == 3 and out["pizza"] == 3
    assert out["distance_between_minus_within"] == pytest.approx(2.0)
    assert out["permutation_p"] == pytest.approx(0.1, abs=0.02)
    assert pop.compare(1.0, permutations=200)["distance_between_minus_within"] == pytest.approx(2.0)
    with pytest.raises(ConfigError, match="one group"):
        pop.compare_groups([True] * 6)


def test_bad_input_is_refused_in_one_line(tmp_path):
    """A trial's findings: another task's model, a name instead of a model, a float seed, unknown or non-numeric
    thresholds, a min_accuracy outside [0, 1], an unknown split, a path that is not a sweep directory and a source
    that is neither were deep tracebacks or silently accepted; an even modulus was refused (it is defined)."""
    import interp
    from interp.errors import TaskError

    task = get_task("modular-addition", p=6, fraction=0.5)
    model = small_model(task)
    res = algorithm_diagnostics(model, task=task)  # an even modulus: both diagnostics
    assert math.isfinite(res.gradient_symmetricity) and math.isfinite(res.distance_irrelevance)
    assert res.figure() is not None and res == AlgorithmDiagnostics.from_dict(res.to_dict())
    nm_model, nm_task = interp.load("noisy-majority", device="cpu")
    with pytest.raises(TaskError, match="modular-addition task"):
        algorithm_diagnostics(nm_model, task=nm_task)
    with pytest.raises(InterpError, match="expected a HookedTransformer"):
        algorithm_diagnostics("modular-addition", task=task)
    with pytest.raises(ConfigError, match="seed must be an integer"):
        algorithm_diagnostics(model, task=task, seed=1.5)
    with pytest.raises(ConfigError, match="unknown threshold 'gs'"):
        algorithm_diagnostics(model, task=task, thresholds={"gs": 0.1})
    with pytest.raises(ConfigError, match="finite number"):
        algorithm_diagnostics(model, task=task, thresholds={"gradient_symmetricity": "x"})
    pop = population_algorithms([model], task=task)
    for bad in (1.5, -1, float("nan"), True):
        with pytest.raises(ConfigError, match=r"min_accuracy must be None or a number in \[0, 1\]"):
            pop.counts(bad)
    assert "1 run (" in pop.text() and pop == PopulationAlgorithms.from_dict(pop.to_dict())
    with pytest.raises(ConfigError, match="not a sweep directory"):
        population_algorithms(tmp_path / "nothing here")
    with pytest.raises(ConfigError, match="sweep directory or a list of models"):
        population_algorithms(123, task=task)
    with pytest.raises(ConfigError, match="not a HookedTransformer"):
        population_algorithms([model, "x"], task=task)
    with pytest.raises(TaskError, match="modular-addition task"):
        population_algorithms([nm_model], task=nm_task)
