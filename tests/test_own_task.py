"""The worked example of ``docs/own-task.md`` (balanced parentheses, ``examples/own_task/``), executed as the page
writes it: its ``python`` blocks in this process (the task registered with ``interp.register_task``), its ``bash``
blocks in a subprocess whose ``PYTHONPATH`` holds a folder with the example's module and a real
``interp_parens-0.1.0.dist-info`` (``METADATA`` and ``entry_points.txt``), so ``importlib.metadata`` finds the entry
point exactly as after ``pip install -e examples/own_task``, with nothing installed into the environment.

The default run trains for fewer epochs on fewer examples (the page's numbers are replaced, below); the slow run
executes the page as written and checks the accuracy it states. (``py`` blocks are excerpts, not executed.)
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "docs" / "own-task.md"
EXAMPLE = ROOT / "examples" / "own_task"
FAST = [  # the page's text -> the default run's (a few epochs on a few hundred strings)
    ('"epochs": 20', '"epochs": 2'),
    ('interp.get_task("balanced-parens")', 'interp.get_task("balanced-parens", train_size=256, test_size=100)'),
    ("--epochs 20", "--epochs 2 --set train_size=256 --set test_size=100"),
    ("--seeds 0..1", "--seeds 0"),
]


def blocks(language: str, fast: bool) -> list[str]:
    """The page's fenced blocks of ``language``, in order, with the default run's numbers where ``fast``."""
    text = PAGE.read_text()
    if fast:
        for a, b in FAST:
            assert a in text, f"docs/own-task.md no longer says {a!r}: update FAST in this test"
            text = text.replace(a, b)
    return re.findall(rf"^```{language}\n(.*?)^```$", text, flags=re.S | re.M)


@pytest.fixture
def workdir(tmp_path, monkeypatch):
    """A fresh working folder with ``examples/own_task`` in it (as at the repository root) and a folder
    ``site/`` that is what ``pip install -e examples/own_task`` makes importable: the module and its dist-info."""
    (tmp_path / "examples").mkdir()
    shutil.copytree(EXAMPLE, tmp_path / "examples" / "own_task")
    site = tmp_path / "site"
    site.mkdir()
    shutil.copy(EXAMPLE / "parens_task.py", site)
    info = site / "interp_parens-0.1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: interp-parens\nVersion: 0.1.0\n")
    (info / "entry_points.txt").write_text("[interp.tasks]\nbalanced-parens = parens_task:PLUGIN\n")
    monkeypatch.chdir(tmp_path)
    yield tmp_path
    from interp import registry

    if "balanced-parens" in registry._registered:
        registry.unregister_task("balanced-parens")
    sys.modules.pop("parens_task", None)


def run_python(fast: bool) -> dict:
    """The page's python blocks, in one namespace, in this process."""
    ns: dict = {"__name__": "own_task_page"}
    path = list(sys.path)
    try:
        for i, code in enumerate(blocks("python", fast)):
            exec(compile(code, f"<docs/own-task.md, python block {i + 1}>", "exec"), ns)
    finally:
        sys.path[:] = path
    return ns


def run_bash(workdir: Path, fast: bool) -> list[subprocess.CompletedProcess]:
    """The page's bash lines, each in a subprocess (``interp`` is ``python -m interp.app``); ``pip install`` is what
    the fixture's ``site/`` folder stands for."""
    env = {**os.environ, "PYTHONPATH": str(workdir / "site"), "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    out = []
    for code in blocks("bash", fast):
        for line in code.splitlines():
            words = shlex.split(line, comments=True)
            if not words or words[:2] == ["pip", "install"]:
                continue
            assert words[0] == "interp", line
            done = subprocess.run(
                [sys.executable, "-m", "interp.app", *words[1:], *(["--threads", "1"] if _threads(words) else [])],
                cwd=workdir,
                env=env,
                capture_output=True,
                text=True,
                timeout=600,
            )
            assert done.returncode == 0, f"{line}\n{done.stderr}"
            out.append(done)
    return out


def _threads(words: list[str]) -> bool:
    return words[1] in ("train", "eval", "analyze", "report", "shapley", "sweep") and "--threads" not in words


def check_python(ns: dict, workdir: Path) -> None:
    import torch

    import interp

    task, model, w = ns["task"], ns["model"], ns["w"]
    assert task.name == "balanced-parens" and (workdir / "parens.safetensors").is_file()
    assert ns["metrics"] == interp.evaluate(model, task, task.dataset("test"))
    # the typed string went through the task's suite: the answer computed, '=' and the answer appended
    assert w.tokens == ["[BOS]", "(", "(", ")", "(", ")", ")", "=", "yes"] and w.prediction.answer["target"] == "yes"
    assert w.corrupted_tokens[1:7] == list("))()((") and w.info["corruptions"] == ["nested", "resample", "typed"]
    assert w.ablated == ["L1H0"] and torch.equal(w.mask[1], torch.tensor([0.0, 1, 1, 1]))
    assert "generic suite" in ns["summary"].text() and "Heads alone" in (workdir / "parens.html").read_text()
    # the suite's analysis is the toolkit's own: each head alone, as the page computed it
    assert ns["summary"].learned_alone == ns["alone"].accuracy.tolist()


def test_the_page_in_python(workdir):
    """Register in Python, train (2 epochs), evaluate, analyse, report, explore: the page's python blocks."""
    check_python(run_python(fast=True), workdir)


@pytest.mark.slow
def test_the_page_on_the_command_line(workdir):
    """The entry point found through a real dist-info folder: list, train, eval, analyze, report, shapley, sweep,
    table, each a subprocess."""
    done = run_bash(workdir, fast=True)
    listed = done[0].stdout
    assert "balanced-parens" in listed and "entry point parens_task:PLUGIN of interp-parens 0.1.0" in listed
    assert (workdir / "parens-cli.safetensors").is_file() and (workdir / "parens-cli.html").is_file()
    assert "balanced-parens" in done[2].stdout and "generic suite" in done[3].stdout
    assert (workdir / "sweeps" / "parens" / "results.jsonl").is_file()


@pytest.mark.slow
def test_the_page_as_written(workdir):
    """The page's own numbers: 20 epochs in Python, and the command line as written (a sweep of two seeds)."""
    ns = run_python(fast=False)
    check_python(ns, workdir)
    stated = re.search(r"`metrics\[\"accuracy\"\]` =\s+([0-9.]+) in our run", PAGE.read_text())
    assert stated is not None
    assert abs(ns["metrics"]["accuracy"] - float(stated.group(1))) < 0.01, ns["metrics"]
    run_bash(workdir, fast=False)


@pytest.mark.slow
def test_ray_workers_find_the_task_by_its_entry_point(workdir):
    """``interp sweep --backend ray`` on the example task: each Ray worker (a process of a local Ray instance) builds
    the task from its entry point, and the runs equal the local backend's."""
    pytest.importorskip("ray")
    import json

    env = {**os.environ, "PYTHONPATH": str(workdir / "site"), "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    small = ["--set", "train_size=64", "--set", "val_size=16", "--set", "test_size=32", "--epochs", "1"]
    for backend in ("local", "ray"):
        args = ["sweep", "balanced-parens", "--seeds", "0,1", *small, "--threads", "1", "--backend", backend]
        done = subprocess.run(
            [sys.executable, "-m", "interp.app", *args, "--out", f"sweep-{backend}", "--quiet"],
            cwd=workdir,
            env=env,
            capture_output=True,
            text=True,
            timeout=600,
        )
        assert done.returncode == 0, done.stderr
    rows = {
        b: [json.loads(x) for x in (workdir / f"sweep-{b}" / "results.jsonl").read_text().splitlines()]
        for b in ("local", "ray")
    }
    assert len(rows["ray"]) == 2 and {r["task"] for r in rows["ray"]} == {"balanced-parens"}
    assert [r["accuracy"] for r in rows["ray"]] == [r["accuracy"] for r in rows["local"]]
