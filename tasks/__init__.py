"""What models learn: one module per task, plus the trained checkpoints that ship with the project."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from interp.errors import TaskError

CHECKPOINT_DIR = Path(__file__).parent / "checkpoints"


# A new task: its module here (one class implementing interp.task.Task) and one line in this table.
TASKS = {
    "noisy-majority": "tasks.noisy_majority:NoisyMajority",
    "repeated-tokens": "tasks.repeated_tokens:RepeatedTokens",
    "modular-addition": "tasks.modular_addition:ModularAddition",
    "integer-addition": "tasks.integer_addition:IntegerAddition",
}
# Old names of shipped checkpoints, still accepted.
CHECKPOINT_ALIASES = {"induction": "repeated-tokens", "induction-1layer": "repeated-tokens-1layer"}


def _registry() -> dict[str, Any]:
    import importlib

    out = {}
    for name, target in TASKS.items():
        module, cls = target.split(":")
        out[name] = getattr(importlib.import_module(module), cls)
    return out


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


def shipped_checkpoints(aliases: bool = False) -> dict[str, Path]:
    """Names of the checkpoints that ship with the project -> their files (with ``aliases``: old names too)."""
    files = sorted(p for p in CHECKPOINT_DIR.glob("*.safetensors") if not p.name.endswith(".resume.safetensors"))
    out = {p.name.removesuffix(".safetensors"): p for p in files}
    if aliases:
        out.update({old: out[new] for old, new in CHECKPOINT_ALIASES.items() if new in out})
    return out
