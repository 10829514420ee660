"""What models learn: one module per task, the registry of tasks by name, and the trained checkpoints that ship
with the project (:func:`load_checkpoint` opens a checkpoint by path or by a shipped name)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from interp.errors import CheckpointError, TaskError

if TYPE_CHECKING:
    from transformer_lens import HookedTransformer

    from interp.checkpoint import Checkpoint
    from interp.task import Task

__all__ = [
    "CHECKPOINT_ALIASES",
    "CHECKPOINT_DIR",
    "TASKS",
    "checkpoint_file",
    "get_task",
    "load",
    "load_checkpoint",
    "read_metadata",
    "shipped_checkpoints",
    "task_names",
]

CHECKPOINT_DIR = Path(__file__).parent / "checkpoints"


# A new task: its module here (one class implementing interp.task.Task) and one line in this table.
TASKS = {
    "noisy-majority": "interp.tasks.noisy_majority:NoisyMajority",
    "repeated-tokens": "interp.tasks.repeated_tokens:RepeatedTokens",
    "modular-addition": "interp.tasks.modular_addition:ModularAddition",
    "integer-addition": "interp.tasks.integer_addition:IntegerAddition",
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


def get_task(name: str, **params: Any) -> Task:
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


def checkpoint_file(path_or_name) -> Path:
    """A checkpoint file's path, or the name of a shipped checkpoint (``noisy-majority``, or an old name such as
    ``induction``) -> its file; a CheckpointError naming the shipped ones otherwise."""
    p = Path(path_or_name)
    if p.is_file():
        return p
    shipped = shipped_checkpoints(aliases=True)
    if str(path_or_name) in shipped:
        return shipped[str(path_or_name)]
    if p.exists():
        raise CheckpointError(f"checkpoint {p} is not a regular file")
    names = ", ".join(shipped) or "none"
    raise CheckpointError(
        f"no checkpoint file {str(path_or_name)!r}, and no shipped checkpoint of that name (shipped: {names})"
    )


def load_checkpoint(
    path_or_name, device: str | None = None, expect_task: str | None = None, task_params: dict[str, Any] | None = None
) -> Checkpoint:
    """Load a checkpoint by path or shipped name onto ``device`` (default: CUDA if present, else CPU), its task
    built from this registry (:func:`interp.checkpoint.read_checkpoint` does the reading and the checks).

    ``task_params`` override the task's saved parameters (e.g. ``{"test_lengths": [201, 400]}`` to test length
    generalisation); a model without positional embedding then takes the longer sequences."""
    from interp.checkpoint import read_checkpoint

    return read_checkpoint(
        checkpoint_file(path_or_name), get_task, device=device, expect_task=expect_task, task_params=task_params
    )


def load(path_or_name, device: str | None = None) -> tuple[HookedTransformer, Task]:
    """``model, task = interp.load("noisy-majority")``: a HookedTransformer and its task."""
    ckpt = load_checkpoint(path_or_name, device=device)
    return ckpt.model, ckpt.task


def read_metadata(path_or_name) -> dict[str, Any]:
    """The parsed, validated metadata of a checkpoint (by path or shipped name); no weights are read."""
    from interp.checkpoint import read_metadata as read

    return read(checkpoint_file(path_or_name))
