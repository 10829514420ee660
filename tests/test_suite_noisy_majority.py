"""The noisy-majority suite: ``interp analyze noisy-majority --json`` end to end (one subprocess), its text
form, and its report sections built with the real report builder."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]


def _strict(name):
    raise ValueError(f"non-standard JSON constant {name}")


@pytest.fixture(scope="module")
def summary(nm_ckpt):
    out = subprocess.run(
        [sys.executable, "-m", "interp.app", "analyze", "noisy-majority", "--json", "--device", "cpu"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout, parse_constant=_strict)


@pytest.mark.slow
def test_analyze_json(summary, nm_ckpt):
    from interp.analyses.noisy_majority.attention_ratios import exact_attention_ratios
    from interp.evaluation import evaluate

    assert summary["task"] == "noisy-majority" and summary["n_train"] == 7500 and summary["n_test"] == 1000
    heads = summary["heads"]
    assert [h["head"] for h in heads] == [f"L0H{i}" for i in range(16)]
    for h in heads:
        assert {"learned_accuracy", "separation_accuracy", "roc_auc", "w01", "w02", "verdict"} <= set(h)
        assert 0 <= h["learned_accuracy"] <= 1 and 0 <= h["separation_accuracy"] <= 1
        assert h["verdict"].split(" ")[0] in ("good", "partial", "bad")
        grade = "good" if h["separation_accuracy"] >= 0.95 else "partial" if h["separation_accuracy"] >= 0.70 else "bad"
        assert h["verdict"].startswith(grade) and h["grade"] == grade
    # the whole model: the task's accuracy on the test split
    acc = evaluate(nm_ckpt.model, nm_ckpt.task, nm_ckpt.task.dataset("test"))["accuracy"]
    assert summary["accuracy"] == pytest.approx(acc, abs=1e-6)
    # w01 / w02: measured on the test split, equal to the exact QK values (relative 1e-3)
    w01, w02 = exact_attention_ratios(nm_ckpt.model)
    for i, h in enumerate(heads):
        assert h["w01"] == pytest.approx(float(w01[0, i]), rel=1e-3)
        assert h["w02"] == pytest.approx(float(w02[0, i]), rel=1e-3)
        assert h["exact_w01"] == pytest.approx(float(w01[0, i]), rel=1e-6)
    # pair tables: symmetric, singles on the diagonal
    pairs = summary["pairs"]
    assert pairs["heads"] == [h["head"] for h in heads]
    for key, col in (("learned_accuracy", "learned_accuracy"), ("separation_accuracy", "separation_accuracy")):
        m = torch.tensor(pairs[key])
        assert m.shape == (16, 16) and torch.equal(m, m.T)
        assert torch.allclose(m.diagonal(), torch.tensor([h[col] for h in heads]))


def test_format_summary(nm_ckpt):
    from interp.analyses import suite_for
    from interp.checkpoint import Checkpoint
    from interp.tasks import get_task

    small = Checkpoint(nm_ckpt.model, get_task("noisy-majority", train_size=300, val_size=10, test_size=100))
    text = suite_for("noisy-majority").analyze(small).text()
    assert all(f"L0H{i} " in text for i in range(16))
    assert "best pairs by learned accuracy" in text and "verdict" in text


@pytest.mark.slow
def test_report_sections(nm_ckpt):
    """The suite's sections on a small copy of the task (400 train, 150 test sequences) with the real builder."""
    from interp.analyses import suite_for
    from interp.checkpoint import Checkpoint
    from interp.report_page import Report
    from interp.tasks import get_task

    task = get_task("noisy-majority", train_size=400, val_size=10, test_size=150)
    ckpt = Checkpoint(model=nm_ckpt.model, task=task, path=nm_ckpt.path, metadata=nm_ckpt.metadata)
    report = Report()
    suite_for("noisy-majority").add_report_sections(ckpt, report, progress=False)
    titles = [s.title for s in report.sections]
    assert titles == [
        "Heads: learned and separation accuracy",
        "Heads: Shapley values",
        "Head pairs",
        "Attention ratios",
        "Head outputs",
        "Attention interventions",
        "Activation patching",
    ]
    assert report.n_figures == 9
    page = report.html()
    assert "Figure 8" in page and "L0H15" in page and "400 train and 150 test" in page
