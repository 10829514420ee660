"""Per-task analysis suites: what ``interp analyze`` prints and what ``interp report`` draws for a task.

A suite module provides:

- ``analyze(ckpt, device=None) -> dict``: a JSON-serialisable summary (``interp analyze --json``);
- ``format_summary(summary: dict) -> str``: the same as a human-readable table (``interp analyze``);
- ``add_report_sections(ckpt, report, progress) -> None``: sections of the HTML report, added through
  the methods of :class:`interp.report.Report`.
"""

from __future__ import annotations

import importlib

from interp.errors import TaskError

SUITES = {
    "noisy-majority": "analyses.suites.noisy_majority",
    "repeated-tokens": "analyses.suites.induction",
}


def get_suite(task_name: str):
    """The suite module for a task, or a TaskError naming the tasks that have one."""
    module = SUITES.get(task_name)
    if module is None:
        raise TaskError(f"no analysis suite for task {task_name!r}; suites exist for: {', '.join(SUITES)}")
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as e:
        if e.name == module:
            raise TaskError(f"the analysis suite for task {task_name!r} is not installed ({module})") from None
        raise
