"""interp: a mechanistic-interpretability toolkit on TransformerLens for small algorithmic-task models.

``model, task = interp.load("noisy-majority")`` loads a shipped checkpoint (or any checkpoint path): a plain
``transformer_lens.HookedTransformer`` and its task. Analyses (package ``analyses``) take the model, the task's data
and, where they need task knowledge, the task itself. Heavy libraries (torch, TransformerLens) are imported only
when first needed, so ``import interp`` is instant.
"""

from __future__ import annotations

import importlib

__version__ = "0.1.0"

_WHERE = {
    "load": "interp.checkpoint", "load_checkpoint": "interp.checkpoint", "save_checkpoint": "interp.checkpoint",
    "Checkpoint": "interp.checkpoint",
    "get_task": "tasks", "task_names": "tasks", "shipped_checkpoints": "tasks",
    "train": "interp.training", "TrainConfig": "interp.training",
    "ModelSpec": "interp.model", "build_model": "interp.model", "extend_context": "interp.model",
    "evaluate": "interp.evaluate", "evaluate_splits": "interp.evaluate",
    "pick_device": "interp.device",
    "head_label": "interp.heads", "parse_head": "interp.heads", "head_mask": "interp.heads",
    "attention_view": "interp.visualize", "attention_patterns": "interp.visualize",
    "Result": "interp.results", "Task": "interp.task", "TaskData": "interp.task", "Vocab": "interp.task",
    "IGNORE": "interp.task", "supports_query_forward": "interp.query_forward",
    "explore": "interp.app.explorer",
    "write_report": "interp.report", "write_sweep_report": "interp.report", "load_results": "interp.sweeps",
}
__all__ = sorted(_WHERE)


def __getattr__(name):
    if name in _WHERE:
        return getattr(importlib.import_module(_WHERE[name]), name)
    raise AttributeError(f"module 'interp' has no attribute {name!r}")


def __dir__():
    return __all__ + ["__version__"]
