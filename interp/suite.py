"""The suite protocol: what a task's analyses offer the command line and the reports (as :class:`interp.task.Task`
is what a task offers the trainer).

A task's suite lives in ``analyses/<task module>/suite.py`` as ``SUITE``, an object with these four methods (a
:class:`FunctionSuite` of the module's functions); ``interp.analyses.suite_for(task)`` finds it. The app layer calls the
methods and nothing else: no suite is asked for an attribute it may lack.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

if TYPE_CHECKING:
    from .checkpoint import Checkpoint
    from .report_page import Report
    from .results import Result


@runtime_checkable
class Suite(Protocol):
    """A task's analyses, as the command line (``interp analyze``, ``interp train --snapshots``) and the reports
    (``interp report CHECKPOINT``, ``interp report DIR``) use them."""

    def analyze(self, ckpt: Checkpoint) -> Result:
        """The task's summary of one model (``interp analyze``): ``to_dict()`` is its JSON, ``text()`` its table."""

    def add_report_sections(self, ckpt: Checkpoint, report: Report, progress: bool = False) -> None:
        """The task's sections of a model's report (the report adds the model card and the attention views)."""

    def add_sweep_sections(self, directory: Path, report: Report, progress: bool = False) -> None:
        """The task's sections of a sweep directory's report (after Table 1 and the accuracy figures); a suite
        without population analyses says so in one line."""

    def finish_run(self, out: Path, snapshot_dir: Path, device: str | None = None) -> dict[str, Any] | None:
        """After ``interp train ... --snapshots N``: work on the run's snapshots (e.g. progress measures into the
        checkpoint's history), or None where the suite does none."""


@dataclass(frozen=True)
class FunctionSuite:
    """A :class:`Suite` made of a task's analysis functions. A suite without population analyses says so in a
    sweep report; one that does nothing with snapshots returns None from ``finish_run``."""

    name: str
    analyze_fn: Callable[[Checkpoint], Result]
    report_fn: Callable[[Checkpoint, Report, bool], None]
    sweep_fn: Callable[[Path, Report, bool], None] | None = None
    finish_fn: Callable[..., dict[str, Any]] | None = None

    def analyze(self, ckpt: Checkpoint) -> Result:
        return self.analyze_fn(ckpt)

    def add_report_sections(self, ckpt: Checkpoint, report: Report, progress: bool = False) -> None:
        self.report_fn(ckpt, report, progress)

    def add_sweep_sections(self, directory: Path, report: Report, progress: bool = False) -> None:
        if self.sweep_fn is None:
            report.section("Population analyses", "")
            report.text(f"The {self.name} suite has no population sections.")
            return
        self.sweep_fn(Path(directory), report, progress)

    def finish_run(self, out: Path, snapshot_dir: Path, device: str | None = None) -> dict[str, Any] | None:
        return None if self.finish_fn is None else self.finish_fn(out, snapshot_dir, device=device)
