"""What models learn: one module per task, each defining its task class and its registration ``PLUGIN`` (an
:class:`interp.registry.TaskPlugin`, found through this distribution's entry points in the group ``interp.tasks``,
exactly as a user's task is found through theirs), and the trained checkpoints that ship with the project.

The registry itself is the core's (:mod:`interp.registry`); the names below are the same functions, kept here
where they were before (``from interp.tasks import get_task, load_checkpoint`` still works).
"""

from __future__ import annotations

from pathlib import Path

from interp.errors import removed_names
from interp.loading import checkpoint_aliases, checkpoint_file, load, load_checkpoint, read_metadata
from interp.registry import get_task, task_names

__all__ = [
    "CHECKPOINT_DIR",
    "checkpoint_aliases",
    "checkpoint_file",
    "get_task",
    "load",
    "load_checkpoint",
    "read_metadata",
    "shipped_checkpoints",
    "task_names",
]

__getattr__ = removed_names(
    "interp.tasks",
    {
        "TASKS": "a task registers with an entry point in the group 'interp.tasks' of its package, or with "
        "interp.register_task(YourTask) in Python (docs/own-task.md); the registered names are interp.registry."
        "task_names()",
        "CHECKPOINT_ALIASES": "each task's TaskPlugin(aliases=...); all of them: interp.loading.checkpoint_aliases() "
        "(also interp.tasks.checkpoint_aliases())",
    },
)

CHECKPOINT_DIR = Path(__file__).parent / "checkpoints"  # the shipped tasks' checkpoints folder (their PLUGINs')


def shipped_checkpoints(aliases: bool = False) -> dict[str, Path]:
    """Names of the checkpoints that ship with the project -> their files (with ``aliases``: old names too). Every
    registered task's checkpoints, a user's included, are :func:`interp.loading.checkpoint_names`."""
    files = sorted(p for p in CHECKPOINT_DIR.glob("*.safetensors") if not p.name.endswith(".resume.safetensors"))
    out = {p.name.removesuffix(".safetensors"): p for p in files}
    if aliases:
        out.update({old: out[new] for old, new in checkpoint_aliases().items() if new in out})
    return out
