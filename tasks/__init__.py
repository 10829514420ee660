"""What models learn: one module per task, plus the trained checkpoints that ship with the project."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from interp.errors import TaskError

CHECKPOINT_DIR = Path(__file__).parent / "checkpoints"


def _registry() -> dict[str, Any]:
    from .noisy_majority import NoisyMajority

    tasks = {NoisyMajority.name: NoisyMajority}
    try:
        from .induction import RepeatedTokens
    except ImportError:  # pragma: no cover - the induction task is optional until it lands
        pass
    else:
        tasks[RepeatedTokens.name] = RepeatedTokens
    return tasks


def task_names() -> list[str]:
    return sorted(_registry())


def get_task(name: str, **params):
    """Build a task by name, e.g. ``get_task("noisy-majority", test_size=200)``."""
    registry = _registry()
    if name not in registry:
        raise TaskError(f"unknown task {name!r}; known tasks: {', '.join(sorted(registry))}")
    try:
        return registry[name](**params)
    except TypeError as e:
        raise TaskError(f"bad parameters for task {name!r}: {e}") from None


def shipped_checkpoints() -> dict[str, Path]:
    """Names of the checkpoints that ship with the project -> their files."""
    files = sorted(p for p in CHECKPOINT_DIR.glob("*.safetensors") if not p.name.endswith(".resume.safetensors"))
    return {p.name.removesuffix(".safetensors"): p for p in files}
