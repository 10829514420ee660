"""The shipped induction checkpoints (2-layer and 1-layer contrast) and the repeated-tokens analysis suite:
the issue's facts about the trained model, the ``interp analyze`` output, and the report sections."""

from __future__ import annotations

import json

import pytest
import torch

from analyses.composition import composition_scores
from analyses.head_scores import ablation_induction_test, head_scores, task_repeated_tokens
from analyses.suites import get_suite
from interp.checkpoint import load_checkpoint


@pytest.fixture(scope="module")
def ckpt():
    return load_checkpoint("induction", device="cpu")


@pytest.fixture(scope="module")
def ckpt1():
    return load_checkpoint("induction-1layer", device="cpu")


@pytest.fixture(scope="module")
def probe(ckpt):
    return task_repeated_tokens(ckpt.model, n_seqs=48, seed=7)


@pytest.fixture(scope="module")
def scores(ckpt, probe):
    return head_scores(ckpt.model, probe)


def test_shipped_files_are_small_and_of_the_task(ckpt, ckpt1):
    for c, layers in ((ckpt, 2), (ckpt1, 1)):
        assert c.task.name == "repeated-tokens" and c.model.cfg.n_layers == layers
        assert c.path.stat().st_size < 1_000_000
        assert c.training["accuracy"]["test"] == pytest.approx(c.metadata["training"]["metrics"]["test"]["accuracy"])


def test_two_layer_model_learned_in_context_copying(ckpt, ckpt1):
    m2, m1 = ckpt.training["metrics"]["test"], ckpt1.training["metrics"]["test"]
    assert m2["accuracy"] > 0.9 and m2["loss"] < 0.5  # repeats: predictable in context
    # first occurrences: chance is 1/64; guessing "R restarts here" (the token after BOS) is right only at p = len(R)
    assert m2["first_accuracy"] < 0.2
    assert m1["accuracy"] < 0.6  # no induction head in one layer


def test_previous_token_head_feeds_an_induction_head(ckpt, probe, scores):
    prev = scores.best("prev_token", layer=0)
    ind = scores.best("induction", layer=1)
    assert float(scores.prev_token[prev]) > 0.6
    assert float(scores.induction[ind]) > 0.8
    comp = composition_scores(ckpt.model, n_baseline=300)
    k = float(comp.K[prev + ind])
    assert k > comp.baseline_mean + 5 * comp.baseline_std and k > 1.5 * comp.baseline_mean
    test = ablation_induction_test(ckpt.model, probe, layer=0)
    assert float(test.base[ind]) == pytest.approx(float(scores.induction[ind]), abs=1e-5)
    assert float(test.ablated[prev[1]][ind]) < 0.4  # ablating the previous-token head collapses induction
    assert int(test.drop[:, ind[0], ind[1]].argmax()) == prev[1]  # and it is the head whose ablation matters most


def test_one_layer_contrast_has_no_induction_head(ckpt1):
    s = head_scores(ckpt1.model, task_repeated_tokens(ckpt1.model, n_seqs=48, seed=7))
    assert float(s.induction.max()) < 0.3


def test_analyze_json_shape(ckpt):
    suite = get_suite("repeated-tokens")
    summary = suite.analyze(ckpt)
    json.dumps(summary)  # JSON-serialisable
    heads = summary["heads"]
    assert [h["head"] for h in heads] == [f"L{l}H{h}" for l in range(2) for h in range(2)]
    assert {"induction_score", "prev_token_score", "duplicate_score", "bos_score", "copying_score"} <= set(heads[0])
    K = summary["composition"]["K"]
    assert len(K) == 4 and len(K[0]) == 4
    assert torch.allclose(torch.tensor(K).reshape(2, 2, 2, 2), ckpt.model.all_composition_scores("K"), atol=1e-6)
    assert summary["composition"]["top_K"][0]["score"] == pytest.approx(max(max(r) for r in K))
    assert len(summary["ablation"]["rows"]) == 2 * 2
    text = suite.format_summary(summary)
    assert "L1H" in text and "top K-composition pairs" in text and "causal test" in text


def test_analyze_one_layer_and_cli(ckpt1, capsys):
    from interp.cli import main

    suite = get_suite("repeated-tokens")
    summary = suite.analyze(ckpt1)
    assert summary["ablation"] is None and summary["composition"]["top_K"] == []
    assert "no head composition" in suite.format_summary(summary)
    assert main(["analyze", "induction-1layer", "--json", "--device", "cpu"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["heads"][0]["head"] == "L0H0" and "induction_score" in out["heads"][0]


def test_report_sections(ckpt, ckpt1):
    from interp.report import Report

    for c in (ckpt, ckpt1):
        report = Report("induction")
        get_suite("repeated-tokens").add_report_sections(c, report, progress=False)
        page = report.html()
        titles = [s.title for s in report.sections]
        assert "Induction and previous-token heads" in titles
        if c.model.cfg.n_layers == 2:
            assert "K-composition causal test" in titles and report.n_attention == 1 and report.n_figures >= 8
        assert "CircuitsVis" in page or c.model.cfg.n_layers == 1
