"""The rules that keep the layout (issue 8), checked on the source: no attribute of ours on a HookedTransformer, no
task named in code of a generic module, ``interp`` wired to ``analyses`` only by the CLI and the report, and one
public API (``import analyses`` names every analysis; ``dir(interp)`` the entry points)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
GENERIC = sorted([*ROOT.glob("interp/*.py"), *ROOT.glob("analyses/*.py")])
WIRING = {"interp/cli.py", "interp/report.py"}  # the only places interp may reach analyses


def _rel(p: Path) -> str:
    return p.relative_to(ROOT).as_posix()


def _code_strings(tree: ast.AST) -> list[str]:
    """String constants that are not docstrings."""
    docs = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                docs.add(id(first.value))
    return [n.value for n in ast.walk(tree)
            if isinstance(n, ast.Constant) and isinstance(n.value, str) and id(n) not in docs]


def test_no_attributes_of_ours_on_models():
    pattern = re.compile(r"\binterp_(task|checkpoint|spec)\b")
    hits = [f"{_rel(p)}:{i}" for p in [*ROOT.rglob("*.py"), *ROOT.rglob("*.ipynb")]
            if ".venv" not in p.parts and p.name != "test_layout.py"
            for i, line in enumerate(p.read_text().splitlines(), 1) if pattern.search(line)]
    assert not hits


def test_generic_modules_name_no_task():
    from tasks import TASKS

    names = {*TASKS, *(n.replace("-", "_") for n in TASKS)}  # (old checkpoint aliases such as "induction" are
    # also the name of a pattern score, so they are not searched for)
    for path in GENERIC:
        if path.name == "__init__.py" and path.parent.name == "analyses":
            continue  # the lazy public API lists the task packages' names
        tree = ast.parse(path.read_text())
        bad = [s for s in _code_strings(tree) if any(n in s for n in names)]
        assert not bad, f"{_rel(path)} names a task in code: {bad}"
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module:
                assert not any(node.module.startswith(f"{pkg}.") for pkg in ("tasks", "analyses.noisy_majority",
                                                                            "analyses.repeated_tokens")), \
                    f"{_rel(path)} imports a task module ({node.module})"


def test_interp_reaches_analyses_only_through_the_cli_and_report():
    for path in ROOT.glob("interp/*.py"):
        tree = ast.parse(path.read_text())
        imports = [n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module]
        imports += [a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names]
        if any(m == "analyses" or m.startswith("analyses.") for m in imports):
            assert _rel(path) in WIRING, f"{_rel(path)} imports analyses"


def test_no_hasattr_on_tasks():
    for path in GENERIC:
        assert "hasattr(task" not in path.read_text(), _rel(path)


def test_public_api():
    import analyses
    import interp

    for name in analyses.__all__:
        assert getattr(analyses, name) is not None, name
        assert name in dir(analyses)
    for name in ["learned_accuracy", "separation_accuracy", "head_scores", "composition_scores", "full_qk_circuit",
                 "attention_ratios", "head_summary", "probe_tokens", "minimal_majority_transformer", "suite_for"]:
        assert name in analyses.__all__, name
    for name in ["load", "get_task", "train", "TrainConfig", "ModelSpec", "build_model", "evaluate", "Checkpoint",
                 "attention_view", "Result"]:
        assert name in dir(interp) and getattr(interp, name) is not None, name
    with pytest.raises(AttributeError):
        interp.no_such_name  # noqa: B018
