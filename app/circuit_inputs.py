"""The clean and corrupted inputs circuit discovery runs on for a checkpoint of any registered task (the command
line's ``interp circuit``, the report's circuit section): the task's own corruption where its suite has one
(:meth:`interp.suite.Suite.corruptions`), else mean ablation over the test split."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from interp.errors import ConfigError, TaskError
from interp.task import TaskData

if TYPE_CHECKING:
    from interp.task import Task


def concat(parts: list[TaskData]) -> TaskData:
    """One batch of task data from examples of the same length."""
    shapes = {tuple(p.tokens.shape[1:]) for p in parts}
    if len(shapes) != 1:
        raise TaskError(f"the corrupted pairs have different lengths {sorted(shapes)}; circuit discovery needs one")
    first = parts[0]
    return TaskData(
        first.task,
        torch.cat([p.tokens for p in parts]),
        torch.cat([p.targets for p in parts]),
        torch.cat([p.answer_pos for p in parts]),
        torch.cat([p.labels for p in parts]),
        torch.cat([p.lengths for p in parts]),
        {k: torch.cat([p.fields[k] for p in parts]) for k in first.fields},
        first.vocab,
    )


def circuit_inputs(
    task: Task, n: int = 128, corruption: str | None = None, ablation: str | None = None, device=None
) -> tuple[TaskData, TaskData | None, str]:
    """``(clean, corrupted or None, what)``: ``n`` examples; ``corruption`` names one of the suite's corruptions
    (default: its first, when ``ablation`` is None or ``"patch"``); ``what`` says in words what was chosen."""
    from interp.analyses import suite_for

    options = suite_for(task).corruptions(task)
    if corruption is not None and corruption not in options:
        raise ConfigError(
            f"unknown corruption {corruption!r} for {task.name}; its suite has {sorted(options) or 'none'}"
            + ("" if options else " (use --ablation mean or zero)")
        )
    if ablation in ("mean", "zero") or (ablation is None and not options):
        if ablation == "patch":
            raise ConfigError(f"{task.name} has no corruption of its own to patch from; use --ablation mean or zero")
        data = task.dataset("test")
        data = data.select(slice(0, n))
        return (
            data.to(device) if device else data,
            None,
            f"{ablation or 'mean'} ablation over {len(data)} test examples",
        )
    if not options:
        raise ConfigError(f"{task.name} has no corruption of its own to patch from; use --ablation mean or zero")
    name = corruption or next(iter(options))
    c = options[name]
    if c.pair:
        pairs = [c.make(task, seed) for seed in range(n)]
        clean, corrupted = concat([p[0] for p in pairs]), concat([p[1] for p in pairs])
    else:
        clean = task.dataset("test").select(slice(0, n))
        corrupted = c.make(clean, 0)
    what = f"patching from the task's corruption {name!r} ({c.about}), {len(clean)} pairs"
    if device:
        clean, corrupted = clean.to(device), corrupted.to(device)
    return clean, corrupted, what
