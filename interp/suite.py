"""The suite protocol: what a task's analyses offer the command line, the reports and the explorer (as
:class:`interp.task.Task` is what a task offers the trainer).

A task's registration names its suite (:class:`interp.registry.TaskPlugin`'s ``suite``; the shipped tasks' are
``SUITE`` in ``analyses/<task module>/suite.py``), an object with the methods below (a :class:`FunctionSuite` of the
suite module's functions); ``interp.analyses.suite_for(task)`` finds it, and gives the generic suite
(``interp.analyses.generic_suite``) to a task that registered none. The app layer calls the methods and nothing
else: no suite is asked for an attribute it may lack, and the app names no task.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from .typed_input import answer_last_example, token_strings

if TYPE_CHECKING:
    from torch import Tensor

    from .checkpoint import Checkpoint
    from .report_page import Report
    from .results import Result
    from .task import Task, TaskData


@dataclass(frozen=True)
class Corruption:
    """A corrupted input that patching compares the input shown against (the explorer's "corrupted input"): by
    default a corruption *of* that input, ``make(clean, seed) -> corrupted`` (one example each, lined up position by
    position); with ``pair=True`` a clean input drawn together with its corruption, ``make(task, seed) -> (clean,
    corrupted)``, which then replaces the input shown. ``about`` says what it changes, in words."""

    make: Callable[..., Any]
    pair: bool = False
    about: str = ""


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

    def typed_example(self, task: Task, text: object) -> TaskData:
        """One example of ``task`` from typed tokens (a string such as ``"0 1 1 2"``, or a list of token strings), its
        answer and targets as the task defines them; a TokenError (one line) for input it cannot read."""

    def corruptions(self, task: Task) -> dict[str, Corruption]:
        """The task's own corrupted inputs for patching, by name (the explorer adds ``resample``, another example of
        the split, and ``typed``, for every task)."""

    def probe_tokens(self, task: Task) -> Tensor | None:
        """The task's own sequences for the induction / previous-token head scores, or None where it has none (the
        explorer then uses repeated random tokens where the context holds a repeat)."""

    def hypotheses(self, task: Task) -> dict[str, Any]:
        """The task's hypotheses for ``interp hypothesis`` (:class:`interp.analyses.hypotheses.Hypothesis` by name:
        a causal model, the variable, the sites to look at); empty where it ships none."""


@dataclass(frozen=True)
class FunctionSuite:
    """A :class:`Suite` made of a task's analysis functions. A suite without population analyses says so in a
    sweep report; one that does nothing with snapshots returns None from ``finish_run``.

    ``hypotheses_fn(task)`` gives the task's hypotheses by name (none by default). The explorer's hooks default to
    what every task has: typed input read as vocabulary tokens with the answer the
    last token (:func:`interp.typed_input.answer_last_example`), no corruptions of its own, no probe sequences.
    ``typed_fn(task, tokens)`` gets the typed token strings (already checked against the vocabulary),
    ``corruptions_fn(task)`` returns the task's :class:`Corruption` by name and ``probes_fn(task)`` its probe
    tokens."""

    name: str
    analyze_fn: Callable[[Checkpoint], Result]
    report_fn: Callable[[Checkpoint, Report, bool], None]
    sweep_fn: Callable[[Path, Report, bool], None] | None = None
    finish_fn: Callable[..., dict[str, Any]] | None = None
    typed_fn: Callable[[Task, list[str]], TaskData] | None = None
    corruptions_fn: Callable[[Task], dict[str, Corruption]] | None = None
    probes_fn: Callable[[Task], Tensor | None] | None = None
    hypotheses_fn: Callable[[Task], dict[str, Any]] | None = None

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

    def typed_example(self, task: Task, text: object) -> TaskData:
        return (self.typed_fn or answer_last_example)(task, token_strings(task.vocab, text))

    def corruptions(self, task: Task) -> dict[str, Corruption]:
        return {} if self.corruptions_fn is None else dict(self.corruptions_fn(task))

    def probe_tokens(self, task: Task) -> Tensor | None:
        return None if self.probes_fn is None else self.probes_fn(task)

    def hypotheses(self, task: Task) -> dict[str, Any]:
        return {} if self.hypotheses_fn is None else dict(self.hypotheses_fn(task))
