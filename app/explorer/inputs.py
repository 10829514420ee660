"""The explorer's inputs: examples typed as tokens (built by the task's suite, :meth:`interp.suite.Suite.typed_example`,
so their targets and answers are the task's), and the corrupted inputs that patching compares an input against (the
task's own, from its suite's :meth:`~interp.suite.Suite.corruptions`; another example of the split; or typed tokens).
Nothing here names a task."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from interp.errors import TaskError, TokenError, removed_names
from interp.typed_input import token_strings

if TYPE_CHECKING:
    from interp.suite import Suite
    from interp.task import Task, TaskData

__all__ = ["check_lined_up", "corruption_kinds", "resample", "token_strings", "typed_example"]

_TYPED = (
    "each task's suite types its own input (interp.analyses.<task>.inputs.typed_example); "
    "interp.app.explorer.inputs.typed_example(task, text) asks the task's suite"
)
_KINDS = (
    "each task's suite lists its corruptions (Suite.corruptions(task)); "
    "interp.app.explorer.inputs.corruption_kinds(task) names them"
)
__getattr__ = removed_names(
    "interp.app.explorer.inputs",
    {
        "TYPED": _TYPED,
        "PAIR_KINDS": _KINDS,
        "OWN_KINDS": _KINDS,
    },
)
EVERY_TASK = ("resample", "typed")  # the corruptions the explorer offers every task, after the task's own


def _suite(task: Task, suite: Suite | None) -> Suite:
    from interp.analyses import suite_for

    return suite_for(task) if suite is None else suite


def typed_example(task: Task, text: object, n_ctx: int | None = None, *, suite: Suite | None = None) -> TaskData:
    """One example of ``task``'s data from typed tokens (a string such as ``"0 1 1 2"`` or ``"[BOS] 0 1 = 4"``, or a
    list of token strings), its answer and targets as the task's suite defines them (``suite``, default
    ``interp.analyses.suite_for(task)``; a task without a suite of its own: the tokens as typed, the answer the last
    one). Raises a TokenError (one line) for a token outside the vocabulary, input of the wrong shape, or more than
    ``n_ctx`` tokens."""
    data = _suite(task, suite).typed_example(task, text)
    if n_ctx is not None and data.tokens.shape[1] > n_ctx:
        raise TokenError(f"the input has {data.tokens.shape[1]} tokens; the model's context is n_ctx={n_ctx}")
    return data


def corruption_kinds(task: Task, suite: Suite | None = None) -> tuple[str, ...]:
    """The corrupted inputs the explorer offers for ``task``: the task's own (its suite's corruptions, e.g. a
    corruption of the input shown, or a clean input drawn with its corruption), then ``resample`` (the next example
    of the split with the same length and a different answer) and ``typed``."""
    return (*_suite(task, suite).corruptions(task), *EVERY_TASK)


def resample(data: TaskData, clean: TaskData, start: int = 0) -> int:
    """Index of the first example of ``data`` (from ``start``, wrapping) with ``clean``'s length and answer position
    and another answer: a corrupted input drawn from the task's own distribution."""
    n = len(data)
    order = (torch.arange(n) + start) % n
    same = (
        (data.lengths.cpu() == int(clean.lengths[0]))
        & (data.answer_pos.cpu() == int(clean.answer_pos[0]))
        & (data.labels.cpu() != int(clean.labels[0]))
    )
    hits = order[same[order]]
    if len(hits) == 0:
        raise TaskError(
            "no example of the split has this input's length and answer position with another "
            "answer; type a corrupted input instead"
        )
    return int(hits[0])


def check_lined_up(clean: TaskData, corrupted: TaskData) -> None:
    """A TokenError unless ``corrupted`` has ``clean``'s length and answer position: patching swaps activations
    position by position."""
    if corrupted.tokens.shape != clean.tokens.shape or int(corrupted.answer_pos[0]) != int(clean.answer_pos[0]):
        raise TokenError(
            f"the corrupted input ({corrupted.tokens.shape[1]} tokens, answer at position "
            f"{int(corrupted.answer_pos[0])}) must line up with the clean one "
            f"({clean.tokens.shape[1]} tokens, answer at {int(clean.answer_pos[0])})"
        )
