"""Modular addition's typed examples for the explorer (its suite's hook): ``a b``, the answer computed."""

from __future__ import annotations

from typing import TYPE_CHECKING

from interp.errors import TokenError
from interp.tasks.modular_addition import make_pairs

if TYPE_CHECKING:
    from interp.task import TaskData
    from interp.tasks.modular_addition import ModularAddition


def typed_example(task: ModularAddition, toks: list[str]) -> TaskData:
    """Modular addition from ``a b`` (an optional trailing ``=``); the answer ``(a + b) mod p`` is computed."""
    if toks[-1] == "=":
        toks = toks[:-1]
    if len(toks) != 2 or "=" in toks:
        raise TokenError(f"modular-addition input is two numbers 'a b' (0..{task.p - 1}), optionally followed by '='")
    a, b = (int(t) for t in toks)
    return make_pairs([a], [b], task.p)
