"""The rules that keep the layout, checked on the source.

Floors, from the bottom (imports only go down; function-local imports count):

1. the core, ``interp`` (task protocol, model specs, checkpoint format, training, run record, the results-directory
   format of sweeps, the report page builder, visualisation);
2. ``interp.tasks`` (what models learn; the registry; the shipped checkpoints);
3. ``interp.analyses`` (what we compute about trained models; each task's suite);
4. the app, ``interp.app`` (the command line, whole reports, sweep orchestration).

Only ``interp/__init__.py``, the lazy public face, names every floor. No module imports itself back through a
circle, no exported name is the name of a submodule of the same package (importing the submodule would replace the
export), no attribute of ours is set on a HookedTransformer, and generic modules name no task.
"""

from __future__ import annotations

import ast
import importlib
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# folder -> the subpackage of the one import name it holds (pyproject.toml's package-dir)
FOLDERS = {"interp": "interp", "tasks": "interp.tasks", "analyses": "interp.analyses", "app": "interp.app"}
FACE = {"interp/__init__.py"}
GENERIC = sorted(
    p
    for p in [
        *ROOT.glob("interp/**/*.py"),
        *ROOT.glob("analyses/*.py"),
        *ROOT.glob("analyses/hypotheses/*.py"),  # generic too: a subpackage of the generic analyses
        *ROOT.glob("app/**/*.py"),
    ]
)


def floor_of(module: str) -> int | None:
    """1 core, 2 tasks, 3 analyses, 4 app; None for other packages (``tasks`` or ``analyses`` at the top level are
    not ours: a user's own modules may have those names)."""
    for prefix, floor in (("interp.app", 4), ("interp.analyses", 3), ("interp.tasks", 2), ("interp", 1)):
        if module == prefix or module.startswith(prefix + "."):
            return floor
    return None


def _rel(p: Path) -> str:
    return p.relative_to(ROOT).as_posix()


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join([FOLDERS[parts[0]], *parts[1:]])


def _folder_of(module: str) -> Path:
    parts = module.split(".")
    for folder, package in sorted(FOLDERS.items(), key=lambda kv: -len(kv[1])):
        pkg = package.split(".")
        if parts[: len(pkg)] == pkg:
            return ROOT.joinpath(folder, *parts[len(pkg) :])
    return ROOT.joinpath(*parts)


def our_sources() -> list[Path]:
    return sorted(p for folder in FOLDERS for p in (ROOT / folder).rglob("*.py"))


def imports_of(path: Path) -> list[tuple[str, int]]:
    """``(module, line)`` of every import in the file, function-local ones included, relative ones resolved;
    ``from pkg import name`` counts as an import of ``pkg.name`` where that is a module of ours."""
    tree = ast.parse(path.read_text())
    here = _module_name(path).split(".")
    package = here if path.name == "__init__.py" else here[:-1]
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [(a.name, node.lineno) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[: len(package) - node.level + 1]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            out.append((module, node.lineno))
            for a in node.names:
                sub = f"{module}.{a.name}"
                if _is_our_module(sub):
                    out.append((sub, node.lineno))
    return out


def _is_our_module(name: str) -> bool:
    path = _folder_of(name)
    return (floor_of(name) is not None and path.with_suffix(".py").is_file()) or (path / "__init__.py").is_file()


def test_floor_map_covers_every_module():
    for path in our_sources():
        assert floor_of(_module_name(path)) is not None, _rel(path)


def test_imports_only_go_down():
    """No module imports a floor above its own (function-local imports included); the face is exempt."""
    bad = []
    for path in our_sources():
        if _rel(path) in FACE:
            continue
        own = floor_of(_module_name(path))
        for module, line in imports_of(path):
            target = floor_of(module)
            if target is not None and target > own:
                bad.append(f"{_rel(path)}:{line} (floor {own}) imports {module} (floor {target})")
    assert not bad, "imports that run up a floor:\n" + "\n".join(bad)


def test_no_circles():
    """No circle among our modules, counting function-local imports (the face, which imports nothing until a name
    is asked for, and package inits that only name their submodules lazily are nodes like any other)."""
    graph: dict[str, set[str]] = {}
    for path in our_sources():
        name = _module_name(path)
        graph[name] = {m for m, _ in imports_of(path) if floor_of(m) is not None and m != name and _is_our_module(m)}
    index, low, stack, on_stack, circles = {}, {}, [], set(), []
    counter = [0]

    def visit(v: str) -> None:  # Tarjan's strongly connected components
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                circles.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    assert not circles, f"import circles: {circles}"


def _packages() -> list[str]:
    return sorted(_module_name(p.parent / "__init__.py") for f in FOLDERS for p in (ROOT / f).rglob("__init__.py"))


@pytest.mark.parametrize("package", _packages())
def test_no_export_is_a_submodule_name(package):
    """``interp.evaluate`` must stay the function after ``interp.evaluation`` is imported, and so on: no name a
    package exports (its ``__all__``) is the name of one of its submodules."""
    pkg = importlib.import_module(package)
    folder = _folder_of(package)
    submodules = {p.stem for p in folder.glob("*.py") if p.stem != "__init__"}
    submodules |= {p.parent.name for p in folder.glob("*/__init__.py")}
    exported = set(getattr(pkg, "__all__", []))
    assert not exported & submodules, f"{package} exports names of its submodules: {sorted(exported & submodules)}"


def test_exports_survive_importing_every_submodule():
    """The flip itself: after every module of ours is imported, the faces still hand out functions, not modules."""
    import types

    import interp
    from interp import analyses

    for path in our_sources():
        if path.name != "__main__.py":
            importlib.import_module(_module_name(path))
    for face in (interp, analyses):
        modules = [n for n in face.__all__ if isinstance(getattr(face, n), types.ModuleType)]
        assert not modules, f"{face.__name__} hands out modules for {modules}"
    assert callable(interp.evaluate) and callable(analyses.repeated_random_tokens)


@pytest.mark.slow
def test_no_attributes_of_ours_on_models():
    pattern = re.compile(r"\binterp_(task|checkpoint|spec)\b")
    hits = [
        f"{_rel(p)}:{i}"
        for p in [*ROOT.rglob("*.py"), *ROOT.rglob("*.ipynb")]
        if ".venv" not in p.parts and p.name != "test_layout.py"
        for i, line in enumerate(p.read_text().splitlines(), 1)
        if pattern.search(line)
    ]
    assert not hits


def _code_strings(tree: ast.AST) -> list[str]:
    """String constants that are not docstrings."""
    docs = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                docs.add(id(first.value))
    return [
        n.value
        for n in ast.walk(tree)
        if isinstance(n, ast.Constant) and isinstance(n.value, str) and id(n) not in docs
    ]


def shipped_task_names() -> list[str]:
    """The names the shipped tasks register under: this distribution's entry points (pyproject.toml)."""
    import tomllib

    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    return sorted(config["project"]["entry-points"]["interp.tasks"])


def test_generic_modules_name_no_task():
    """No generic module (the core, the generic analyses, the app) names a task in code or imports a task's module:
    every door finds tasks through the registry."""
    tasks = shipped_task_names()
    names = {*tasks, *(n.replace("-", "_") for n in tasks)}  # (old checkpoint aliases such as "induction" are
    # also the name of a pattern score, so they are not searched for)
    for path in GENERIC:
        if path.name == "__init__.py" and path.parent.name == "analyses":
            continue  # the lazy public API lists the task packages' names
        tree = ast.parse(path.read_text())
        bad = [s for s in _code_strings(tree) if any(n in s for n in names)]
        assert not bad, f"{_rel(path)} names a task in code: {bad}"
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module:
                assert not any(
                    node.module.startswith(f"{pkg}.")
                    for pkg in ("tasks", "interp.tasks", *(f"interp.analyses.{n}" for n in names))
                ), f"{_rel(path)} imports a task module ({node.module})"


def test_no_hasattr_or_getattr_default_on_tasks_and_suites():
    for path in GENERIC:
        text = path.read_text()
        assert "hasattr(task" not in text and "getattr(suite" not in text, _rel(path)


def test_suites_follow_the_protocol():
    from interp.analyses import suite_for
    from interp.analyses.generic_suite import SUITE
    from interp.registry import task_names
    from interp.suite import Suite

    assert set(shipped_task_names()) <= set(task_names())
    for name in shipped_task_names():
        assert isinstance(suite_for(name), Suite) and suite_for(name) is not SUITE, name
    assert isinstance(SUITE, Suite)


def test_public_api():
    import interp
    from interp import analyses

    for name in analyses.__all__:
        assert getattr(analyses, name) is not None, name
        assert name in dir(analyses)
    for name in [
        "learned_accuracy",
        "separation_accuracy",
        "head_scores",
        "composition_scores",
        "full_qk_circuit",
        "attention_ratios",
        "head_summary",
        "probe_tokens",
        "minimal_majority_transformer",
        "suite_for",
        "population_table",
    ]:
        assert name in analyses.__all__, name
    for name in [
        "load",
        "get_task",
        "train",
        "TrainConfig",
        "ModelSpec",
        "build_model",
        "evaluate",
        "Checkpoint",
        "attention_view",
        "Result",
        "load_checkpoint",
        "write_report",
        "Suite",
    ]:
        assert name in dir(interp) and getattr(interp, name) is not None, name
    with pytest.raises(AttributeError):
        interp.no_such_name


def test_the_test_run_checks_shapes_at_call_time():
    """The suite runs with jaxtyping's import hook on our packages (pyproject.toml): a tensor of the wrong rank is
    caught at the call, by the annotation alone."""
    import jaxtyping
    import torch

    from interp.evaluation import per_position_loss

    with pytest.raises(jaxtyping.TypeCheckError):
        per_position_loss(torch.zeros(2, 3), torch.zeros(2, 3, dtype=torch.long))


def test_one_import_name():
    """The distribution installs ``interp`` alone: its tasks, analyses and app are subpackages of it, so generic
    top-level names such as ``tasks`` are never taken from a user."""
    import tomllib

    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    assert {p.split(".")[0] for p in config["packages"]} == {"interp"}
    assert config["package-dir"] == {package: folder for folder, package in FOLDERS.items()}
    listed = set(config["packages"])
    on_disk = {_module_name(p.parent / "__init__.py") for f in FOLDERS for p in (ROOT / f).rglob("__init__.py")}
    assert listed == on_disk, f"packages on disk but not in pyproject.toml: {sorted(on_disk - listed)}"
    for path in our_sources():
        for module, line in imports_of(path):
            top = module.split(".")[0]
            assert top not in {"tasks", "analyses", "app"}, f"{_rel(path)}:{line} imports {module}, not interp.{module}"


@pytest.mark.slow
def test_a_users_tasks_py_and_analyses_py_do_not_shadow_the_toolkit(tmp_path):
    """A notebook folder holding its own ``tasks.py`` and ``analyses.py`` (common names): the toolkit still loads,
    from Python and from the command line."""
    import os
    import subprocess
    import sys

    (tmp_path / "tasks.py").write_text("raise RuntimeError('the user tasks.py was imported')\n")
    (tmp_path / "analyses.py").write_text("raise RuntimeError('the user analyses.py was imported')\n")
    (tmp_path / "app.py").write_text("raise RuntimeError('the user app.py was imported')\n")
    code = (
        "import interp\n"
        "model, task = interp.load('noisy-majority', device='cpu')\n"
        "from interp.analyses import learned_accuracy\n"
        "print(task.name, interp.analyses.suite_for(task).name)\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=300, env=env
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["noisy-majority", "noisy-majority"]
    cli = subprocess.run(
        [sys.executable, "-m", "interp.app", "list"], cwd=tmp_path, capture_output=True, text=True, timeout=300, env=env
    )
    assert cli.returncode == 0, cli.stderr
    assert "noisy-majority" in cli.stdout
