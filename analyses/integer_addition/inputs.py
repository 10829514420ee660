"""Integer addition's typed examples for the explorer (its suite's hook): ``a + b`` in digits, the answer
computed."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from interp.errors import TokenError

if TYPE_CHECKING:
    from interp.task import TaskData
    from interp.tasks.integer_addition import IntegerAddition


def typed_example(task: IntegerAddition, toks: list[str]) -> TaskData:
    """Integer addition from ``a + b`` in digits, written as the task writes its operands (an optional leading
    ``[BOS]``, and ``=`` with whatever follows it, are dropped); the shorter operand is padded with zeros and the
    answer is computed."""
    if toks[0] == "[BOS]":
        toks = toks[1:]
    if "=" in toks:
        toks = toks[: toks.index("=")]
    if toks.count("+") != 1:
        raise TokenError(
            "integer-addition input is 'a + b' in digits (e.g. 12345 + 678), optionally with '=' and the answer"
        )
    cut = toks.index("+")
    ops = [toks[:cut], toks[cut + 1 :]]
    if not all(ops) or any(t not in "0123456789" for op in ops for t in op):
        raise TokenError("integer-addition operands are digits 0..9 on both sides of '+'")
    n = max(len(ops[0]), len(ops[1]))
    units = [[int(t) for t in (op if task.reverse_operands else op[::-1])] for op in ops]  # units first
    a, b = ([u[i] if i < len(u) else 0 for i in range(n)] for u in units)
    return task.sums(torch.tensor([a]), torch.tensor([b]), torch.tensor([n]))
