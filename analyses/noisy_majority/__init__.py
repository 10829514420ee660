"""The noisy-majority task's own analyses (Fraknói 2024, §5.3-5.4): attention ratios w01/w02, head outputs (Figure 6),
attention interventions (Figure 8), the head summary with its pair tables (Figures 4, 5, 7), hand-built models
(the §5.3 minimal transformer, hand-set preference heads), and the task's ``analyze``/``report`` suite."""

from __future__ import annotations

from interp.errors import TaskError
from interp.tasks.noisy_majority import NoisyMajority


def require_task_data(data) -> None:
    """Refuse, at once, data (or an answer cache) of another task: these analyses read noisy-majority tokens."""
    name = getattr(data, "task", None)
    if name != NoisyMajority.name:
        raise TaskError(
            f"this is a noisy-majority analysis, but the data is of task {name!r}; "
            "use noisy-majority data and a noisy-majority model"
        )
