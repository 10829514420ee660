"""interp: a mechanistic-interpretability toolkit on TransformerLens for small algorithmic-task models.

``model, task = interp.load("noisy-majority")`` loads a shipped checkpoint (or any checkpoint path): a plain
``transformer_lens.HookedTransformer`` and its task. Analyses (``interp.analyses``) take the model, the task's data
and, where they need task knowledge, the task itself. Heavy libraries (torch, TransformerLens) are imported only
when first needed, so ``import interp`` is instant.

This module is the lazy public face of all floors: the core (the rest of this package), the tasks (``interp.tasks``),
the analyses (``interp.analyses``) and the app (``interp.app``). It is the one module of the core that may name the
floors above it; it imports nothing until a name is asked for. No name it exports is the name of one of its
submodules, so importing a submodule never replaces an exported function.
"""

from __future__ import annotations

import importlib

__version__ = "0.2.0"

_WHERE = {
    # the core (this package)
    "Checkpoint": "interp.checkpoint",
    "save_checkpoint": "interp.loading",
    "read_checkpoint": "interp.checkpoint",
    "train": "interp.training",
    "TrainConfig": "interp.training",
    "train_population": "interp.population",
    "ModelSpec": "interp.model",
    "build_model": "interp.model",
    "extend_context": "interp.model",
    "evaluate": "interp.evaluation",
    "evaluate_splits": "interp.evaluation",
    "pick_device": "interp.device",
    "head_label": "interp.heads",
    "parse_head": "interp.heads",
    "head_mask": "interp.heads",
    "attention_view": "interp.visualize",
    "attention_patterns": "interp.visualize",
    "Result": "interp.results",
    "Task": "interp.task",
    "TaskData": "interp.task",
    "Vocab": "interp.task",
    "IGNORE": "interp.task",
    "task_data": "interp.task",
    "supports_query_forward": "interp.query_forward",
    "Suite": "interp.suite",
    "Report": "interp.report_page",
    "load_results": "interp.sweep_directory",
    # the task registry (every door finds tasks there) and checkpoints by name
    "TaskPlugin": "interp.registry",
    "register_task": "interp.registry",
    "get_task": "interp.registry",
    "task_names": "interp.registry",
    "load": "interp.loading",
    "load_checkpoint": "interp.loading",
    # the tasks: the checkpoints that ship with the project
    "shipped_checkpoints": "interp.tasks",
    # the app: whole reports and sweeps
    "write_report": "interp.app.report",
    "write_sweep_report": "interp.app.report",
    "run_sweep": "interp.app.sweeps",
    "explore": "interp.app.explorer",
}
__all__ = sorted(_WHERE)  # noqa: PLE0605 (computed from the table above)


# the floors above the core, as subpackages: ``interp.tasks``, ``interp.analyses``, ``interp.app``
_FLOORS = ("tasks", "analyses", "app")


def __getattr__(name):
    if name in _WHERE:
        return getattr(importlib.import_module(_WHERE[name]), name)
    if name in _FLOORS:
        return importlib.import_module(f"{__name__}.{name}")
    raise AttributeError(f"module 'interp' has no attribute {name!r}")


def __dir__():
    return __all__ + ["__version__"]
