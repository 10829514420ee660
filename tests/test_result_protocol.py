"""One result protocol: every result type subclasses interp.results.Result, and each one, computed here on
a small model, has a ``to_dict()`` that survives a strict JSON round trip and that ``from_dict()`` reads back to the
same dict, a non-empty ``text()`` (what the command line prints), a ``figure()`` (plotly or None), and a rich notebook
display (``_repr_html_``) that is real HTML. The list below must name every Result subclass in ``interp.analyses``: a
new result type without an entry here fails ``test_every_result_type_is_covered``."""

from __future__ import annotations

import importlib
import inspect
import json
import pkgutil

import pytest

from interp import analyses
from interp.checkpoint import Checkpoint
from interp.model import ModelSpec, build_model
from interp.results import Result
from interp.tasks import get_task, load_checkpoint


@pytest.fixture(scope="module")
def nm():
    task = get_task(
        "noisy-majority",
        train_size=200,
        val_size=20,
        test_size=80,
        train_lengths=[0, 20],
        val_lengths=[21, 25],
        test_lengths=[26, 30],
    )
    spec = ModelSpec(**{**task.default_spec(), "d_model": 8, "n_heads": 4, "d_head": 2})
    return Checkpoint(build_model(spec, device="cpu"), task, spec=spec)


@pytest.fixture(scope="module")
def rt():
    return load_checkpoint("repeated-tokens", device="cpu")


def _nm_results(ck):
    from interp.analyses.learned_accuracies import learned_accuracy
    from interp.analyses.noisy_majority.attention_ratios import attention_ratios
    from interp.analyses.noisy_majority.head_outputs import head_outputs
    from interp.analyses.noisy_majority.head_summary import head_summary
    from interp.analyses.noisy_majority.interventions import attention_intervention_sweep
    from interp.analyses.separation_accuracies import separation_accuracy

    m, t = ck.model, ck.task
    tr, te = t.dataset("train"), t.dataset("test")
    summary = head_summary(m, te, train=tr)
    from interp.analyses.coalitions import coalition_values

    values = coalition_values(m, te, value="learned-accuracy", task=t)
    import tempfile

    from interp.analyses.halving import halving_history, train_halving
    from interp.training import TrainConfig

    with tempfile.TemporaryDirectory() as tmp:  # a short run that halves (threshold 0.01: at the first validation)
        cfg = TrainConfig(epochs=3, batch_size=64, lr=1e-2, warmup_steps=5, halving="random", halving_threshold=0.01)
        halved = train_halving(t, ck.spec, cfg, f"{tmp}/h.safetensors", device="cpu", progress=False)
    return {
        "HalvingHistory": halving_history(halved),
        "CoalitionValues": values,
        "ShapleyResult": values.shapley(),
        "LearnedAccuracy": learned_accuracy(m, te, heads=[["L0H0"], ["L0H1", "L0H2"]]),
        "SeparationAccuracy": separation_accuracy(m, te, train=tr, heads=[["L0H0"]]),
        "AttentionRatios": attention_ratios(m, te),
        "HeadOutputs": head_outputs(m, te, heads="L0H1"),
        "InterventionSweep": attention_intervention_sweep(m, te, train=tr, w01_values=[1.0, 4.0], w02_values=[1.0]),
        "HeadSummary": summary,
        "PairMatrix": summary.learned_pairs,
    }


def _rt_results(ck):
    from interp.analyses.circuits import full_qk_circuit, logit_decomposition, ov_copying
    from interp.analyses.composition import composition_scores
    from interp.analyses.patching import activation_patching, path_patching
    from interp.analyses.pattern_scores import ablation_induction_test, head_scores
    from interp.analyses.repeated_tokens import corrupted_pair, probe_tokens
    from interp.analyses.repeated_tokens.suite import analyze
    from interp.analyses.spectrum import attention_spectrum

    toks = probe_tokens(ck.task, n_seqs=8)
    clean, corrupted = corrupted_pair(ck.task, 4, kind="key")
    return {
        "ActivationPatching": activation_patching(
            ck.model, clean, corrupted=corrupted, metric="logit_diff", where="z", per="head"
        ),
        "PathPatching": path_patching(ck.model, clean, corrupted=corrupted),
        "HeadScores": head_scores(ck.model, toks),
        "AblationTest": ablation_induction_test(ck.model, toks, path="key"),
        "CircuitMatrix": full_qk_circuit(ck.model, heads="L1H0", vocab=ck.task.vocab),
        "OVCopying": ov_copying(ck.model),
        "LogitDecomposition": logit_decomposition(ck.model, ck.task.dataset("test").select(slice(0, 4))),
        "CompositionScores": composition_scores(ck.model, n_baseline=50),
        "InductionAnalysis": analyze(ck),
        "AttentionSpectrum": attention_spectrum(
            ck.model, ck.task.dataset("test"), task=ck.task, n_inputs=4, per_head=True
        ),
    }


def _ma_results():
    from interp.analyses.modular_addition.algorithms import algorithm_diagnostics, population_algorithms
    from interp.analyses.modular_addition.exhaustive import ablation_table, attention_split
    from interp.analyses.modular_addition.fourier import embedding_norms, neuron_frequencies, neuron_logit_map
    from interp.analyses.modular_addition.progress import find_phases
    from interp.analyses.modular_addition.suite import analyze

    ck = load_checkpoint("modular-addition", device="cpu")
    m, t = ck.model, ck.task
    nf = neuron_frequencies(m, task=t)
    small_task = get_task("modular-addition", p=7, fraction=0.5)
    small = build_model(
        ModelSpec(**{**small_task.default_spec(), "d_model": 8, "n_heads": 2, "d_head": 4}), device="cpu"
    )
    return {
        "FrequencyNorms": embedding_norms(m, task=t),
        "NeuronFrequencies": nf,
        "NeuronLogitMap": neuron_logit_map(m, task=t),
        "AttentionSplit": attention_split(m, task=t),
        "AblationTable": ablation_table(m, task=t, neuron_frequencies=nf),
        "Phases": find_phases(ck.training["history"]),
        "ModularAdditionAnalysis": analyze(ck),
        "AlgorithmDiagnostics": algorithm_diagnostics(m, task=t),
        "PopulationAlgorithms": population_algorithms([small, small], task=small_task),
    }


def _ia_results():
    from interp.analyses.integer_addition.ablation import component_ablation
    from interp.analyses.integer_addition.accuracy import accuracy_by_case, accuracy_by_length
    from interp.analyses.integer_addition.decoding import greedy_exact_match
    from interp.analyses.integer_addition.subtasks import subtask_probes
    from interp.analyses.integer_addition.suite import analyze

    task = get_task("integer-addition", digits=[3, 3], train_size=64, val_size=16, test_size=64, cascades_size=32)
    spec = ModelSpec(**{**task.default_spec(), "d_model": 16, "n_heads": 2, "d_head": 8, "d_mlp": 32})
    ck = Checkpoint(build_model(spec, device="cpu"), task, spec=spec)
    test = task.dataset("test")
    return {
        "CaseAccuracy": accuracy_by_case(ck.model, test),
        "LengthAccuracy": accuracy_by_length(ck.model, task=task, lengths=[1, 2, 3], n=16),
        "DigitAblation": component_ablation(ck.model, test),
        "AdditionAnalysis": analyze(ck),
        "GreedyDecoding": greedy_exact_match(ck.model, test),
        "SubtaskProbes": subtask_probes(ck.model, test, train=task.dataset("train")),
    }


def _hypothesis_results(ck):
    """Interchange interventions and DAS of the noisy-majority hypothesis ``diff`` on the small model."""
    from interp.analyses import suite_for
    from interp.analyses.hypotheses import evaluate_hypothesis

    hyp = suite_for(ck.task).hypotheses(ck.task)["diff"]
    res = evaluate_hypothesis(ck.model, ck.task.dataset("test"), hypothesis=hyp, das=1, pairs=20, steps=3)
    return {"CausalAbstraction": res}


def _explorer_results(ck):
    """The explorer's two results (interp.app.explorer.results): the prediction under the mask and the view."""
    import interp

    w = interp.explore(ck.model, ck.task, batch_size=16)
    w.ablated = ["L0H1"]
    return {"Prediction": w.prediction, "ExplorerState": w.state()}


def _result_classes() -> set[str]:
    names = set()
    for info in pkgutil.walk_packages(analyses.__path__, "interp.analyses."):
        module = importlib.import_module(info.name)
        for name, obj in vars(module).items():
            if inspect.isclass(obj) and issubclass(obj, Result) and obj is not Result and obj.__module__ == info.name:
                names.add(name)
    return names


def _population_results(ck):
    """The sweep summaries (analyses.population_figures) on hand-written rows, and a census entry of a small model."""
    from interp.analyses.noisy_majority.census import Census, run_heads
    from interp.analyses.population_figures import accuracy_survival, grid_accuracy, lr_accuracy
    from interp.sweep_directory import results_frame

    rows = [
        {
            "name": f"r{i}",
            "d_model": d,
            "n_heads": h,
            "lr": lr,
            "strategy": "normal",
            "seed": i,
            "metrics": {"test": {"accuracy": acc}},
        }
        for i, (d, h, lr, acc) in enumerate(
            [(8, 4, 1e-3, 1.0), (8, 4, 3e-3, 0.9), (2, 1, 1e-3, 0.6), (2, 1, 3e-3, float("nan"))]
        )
    ]
    frame = results_frame(rows)
    census = Census(
        [
            {
                "name": "r0",
                "d_model": 8,
                "n_heads": 4,
                "strategy": "normal",
                "seed": 0,
                "test_accuracy": 0.5,
                **run_heads(ck, 200, 80),
            }
        ],
        200,
        80,
    )
    from interp.analyses.noisy_majority.training_census import TrainingCensus, _summarise, snapshot_entry

    snap = snapshot_entry(ck, 200, 80)
    run = {"name": "r0", "seed": 0, "configuration": "all runs", "d_model": 8, "n_heads": 4, "normalization": None}
    training = TrainingCensus(
        [_summarise({**run, "test_accuracy": 0.5, "kept_epoch": 2, "snapshots": [snap, {**snap, "epoch": 2}]})]
    )
    return {
        "Survival": accuracy_survival(frame),
        "GridAccuracy": grid_accuracy(frame),
        "LearningRateAccuracy": lr_accuracy(frame),
        "Census": census,
        "TrainingCensus": training,
    }


def _circuit_results(ck, tmp_path_factory):
    import torch

    from interp.analyses.circuit_discovery import discover_circuit
    from interp.analyses.circuit_graph import computational_graph
    from interp.analyses.circuit_population import population_circuits
    from interp.analyses.repeated_tokens import corrupted_pair
    from interp.checkpoint import save_checkpoint

    clean, corrupted = corrupted_pair(ck.task, 4, kind="key")
    sweep = tmp_path_factory.mktemp("sweep")
    (sweep / "runs").mkdir()
    rows = []
    for seed in (0, 1):  # a two-run sweep directory of the shipped model and a perturbed copy
        m = load_checkpoint("repeated-tokens", device="cpu").model
        with torch.no_grad():
            m.W_O.mul_(1.0 + 0.1 * seed)
        path = save_checkpoint(m, ck.task, sweep / "runs" / f"r{seed}.safetensors")
        rows.append({"name": f"r{seed}", "seed": seed, "checkpoint": f"runs/{path.name}",
                     "accuracy": {"test": 1.0 - 0.1 * seed}})  # fmt: skip
    (sweep / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return {
        "Circuit": discover_circuit(ck.model, clean, corrupted=corrupted, method="eap", curve_points=6),
        "ComputationalGraph": computational_graph(ck.model),
        "PopulationCircuits": population_circuits(sweep, clean, corrupted=corrupted, method="eap", top_n=4),
    }


@pytest.fixture(scope="module")
def results(nm, rt, tmp_path_factory):
    from interp.analyses.generic_suite import analyze as generic_analyze

    return {
        **_nm_results(nm),
        **_rt_results(rt),
        **_ma_results(),
        **_ia_results(),
        **_population_results(nm),
        **_explorer_results(nm),
        **_hypothesis_results(nm),
        **_circuit_results(rt, tmp_path_factory),
        "TaskSummary": generic_analyze(nm),  # the generic suite's, as for a task that registered no suite
    }


def test_every_result_type_is_covered(results):
    assert _result_classes() | {"Prediction", "ExplorerState"} <= set(results), "add the new result type to this test"


def test_to_dict_round_trips_through_strict_json(results):
    for name, res in results.items():
        assert type(res).__name__ == name and isinstance(res, Result)
        d = res.to_dict()
        text = json.dumps(d, allow_nan=False)  # strict JSON: NaN and inf must have become null
        assert json.loads(text) == d, name
        assert json.loads(res.to_json()) == d, name


def test_from_dict_reads_back_what_to_dict_wrote(results):
    for name, res in results.items():
        d = res.to_dict()
        back = type(res).from_dict(json.loads(json.dumps(d, allow_nan=False)))  # as read from a saved JSON file
        assert type(back) is type(res), name
        assert back.to_dict() == d, name
        assert back == res, name  # `==` compares what they write (it raised on tensor fields)
        assert res != object() and res is not None, name


def test_text_is_what_the_command_line_prints(results):
    for name, res in results.items():
        for r in (res, type(res).from_dict(res.to_dict())):  # a result read back prints too
            text = r.text()
            assert isinstance(text, str) and text.strip(), name


def test_rich_display_and_figures(results):
    import plotly.graph_objects as go

    from interp.visualize import forget_notebook_scripts

    forget_notebook_scripts()
    pages = []
    for name, res in results.items():
        fig = res.figure()
        assert fig is None or isinstance(fig, go.Figure), name
        html = res._repr_html_()
        assert isinstance(html, str) and html.lstrip().startswith("<") and len(html) > 50, name
        if fig is not None:
            assert "Plotly.newPlot" in html or "plotly" in html.lower(), name
        pages.append(html)
    # the plotly bundle is inlined once per kernel, not once per result
    from plotly.offline import get_plotlyjs

    assert "".join(pages).count(get_plotlyjs()[:300]) == 1
