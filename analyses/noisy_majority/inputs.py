"""Noisy majority's inputs for the explorer (its suite's hooks): typed examples from their digits, and ``flip``, the
corruption that flips the answer with the fewest 0 <-> 1 swaps."""

from __future__ import annotations

from typing import TYPE_CHECKING

from interp.errors import TokenError
from interp.suite import Corruption
from interp.tasks.noisy_majority import make_sentences

from .corrupt import flip_answer

if TYPE_CHECKING:
    from interp.task import Task, TaskData


def typed_example(task: Task, toks: list[str]) -> TaskData:
    """Noisy majority from its digits (an optional leading ``[BOS]``, and ``=`` with whatever follows it, are
    dropped): the answer is computed from the digits, not read from what was typed."""
    if toks[0] == "[BOS]":
        toks = toks[1:]
    if "=" in toks:
        toks = toks[: toks.index("=")]
    bad = [t for t in toks if t not in ("0", "1", "2")]
    if bad:
        raise TokenError(f"noisy-majority input is digits 0, 1, 2 (then '=' and the answer, optional); got {bad[0]!r}")
    return make_sentences([[int(t) for t in toks]])


def corruptions(task: Task) -> dict[str, Corruption]:
    """``flip``: the input with its answer flipped by the fewest 0 <-> 1 swaps (:func:`flip_answer`)."""
    return {"flip": Corruption(flip_answer, about="the fewest 0 <-> 1 swaps that flip the answer")}
