"""The integer-addition task's own analyses (Ibrahimli 2024, Compositional Generalization in Transformers; Fraknói
2024, §4): accuracy by carry case, by answer digit and by operand length (length generalisation), per-component
ablation per answer digit and carry case, greedy decoding (the final answer of a scratchpad model), the sub-task
probes of the compositionality gap, and the task's ``analyze``/``report`` suite."""

from __future__ import annotations

from interp.errors import TaskError
from interp.tasks.integer_addition import IntegerAddition


def require_task_data(data) -> None:
    """Refuse, at once, data of another task: these analyses read integer-addition fields."""
    name = getattr(data, "task", None)
    if name != IntegerAddition.name:
        raise TaskError(
            f"this is an integer-addition analysis, but the data is of task {name!r}; "
            "use integer-addition data and an integer-addition model"
        )
