"""Clean and corrupted noisy-majority inputs for activation and path patching.

The corruption flips the answer with the fewest changes: 0s become 1s (an answer 4, ``n0 >= n1``) or 1s become 0s
(an answer 5) at random positions, as few as flip the majority; lengths and the 2s stay. Near a tie one digit is
enough. When there are no 0s or 1s to swap (an answer 4 with ``n0 = n1 = 0``) a 2 becomes a 1.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from interp.errors import TaskError
from interp.task import IGNORE, TaskData
from interp.tasks.noisy_majority import ONE, PAD, TWO, ZERO, make_sentences

if TYPE_CHECKING:
    from interp.task import Task


def flip_answer(data: TaskData, seed: int = 0) -> TaskData:
    """``data`` with each example's answer flipped by the fewest 0 <-> 1 swaps (positions drawn from ``seed``)."""
    if data.task != "noisy-majority":
        raise TaskError(f"flip_answer takes noisy-majority data; got {data.task!r} data")
    gen = torch.Generator().manual_seed(seed)
    tokens = data.tokens.cpu()
    n_digits = (data.answer_pos - 1).cpu()
    out = []
    for b in range(len(data)):
        d = tokens[b, 1 : 1 + int(n_digits[b])] - ZERO
        n0, n1 = int((d == 0).sum()), int((d == 1).sum())
        if n0 >= n1:  # answer 4: make n1 > n0
            frm, to, k = 0, 1, (n0 - n1) // 2 + 1
        else:  # answer 5: make n0 >= n1
            frm, to, k = 1, 0, (n1 - n0 + 1) // 2
        where = (d == frm).nonzero().squeeze(-1)
        if len(where) < k:  # only happens for n0 = n1 = 0
            where = (d == TWO - ZERO).nonzero().squeeze(-1)
            if len(where) == 0:
                raise TaskError(f"example {b} has no digits to change, so its answer cannot be flipped")
            to = ONE - ZERO
        pick = where[torch.randperm(len(where), generator=gen)[:k]]
        d = d.clone()
        d[pick] = to
        out.append(d)
    flipped = make_sentences(out)
    extra = data.tokens.shape[1] - flipped.tokens.shape[1]
    if extra > 0:  # keep the input's padded width, so that clean and corrupted tokens line up
        flipped.tokens = torch.cat([flipped.tokens, torch.full((len(data), extra), PAD, dtype=torch.long)], 1)
        flipped.targets = torch.cat([flipped.targets, torch.full((len(data), extra), IGNORE, dtype=torch.long)], 1)
    return flipped.to(data.device)


def corrupted_pair(
    task: Task, n_seqs: int = 32, n_digits: int = 40, seed: int = 0, device=None
) -> tuple[TaskData, TaskData]:
    """``(clean, corrupted)`` noisy-majority data for ``task``: ``n_seqs`` sequences of ``n_digits`` digits with
    ``|n0 - n1| <= 1`` (near a tie, so one swap flips the answer; half of them answer 4), and the same with the
    answer flipped by :func:`flip_answer`. All have the same length, so positions line up across examples."""
    if task.name != "noisy-majority":
        raise TaskError(f"corrupted_pair builds noisy-majority data; got a task {task.name!r}")
    if n_seqs < 1 or n_digits < 1:
        raise TaskError(f"n_seqs and n_digits must be at least 1, got {n_seqs} and {n_digits}")
    gen = torch.Generator().manual_seed(seed)
    kept: list[torch.Tensor] = []
    want = {4: (n_seqs + 1) // 2, 5: n_seqs // 2}
    for _ in range(1000):
        cand = torch.randint(0, 3, (8 * n_seqs, n_digits), generator=gen)
        gap = (cand == 0).sum(1) - (cand == 1).sum(1)
        for row, g in zip(cand, gap.tolist()):
            label = 4 if g >= 0 else 5
            if abs(g) <= 1 and want[label] > 0:
                kept.append(row)
                want[label] -= 1
        if not any(want.values()):
            break
    else:
        raise TaskError(f"could not draw {n_seqs} near-tie sequences of {n_digits} digits")
    if n_digits + 4 > task.n_ctx:
        raise TaskError(f"{n_digits} digits need a context of {n_digits + 4} tokens; the task's is {task.n_ctx}")
    clean = make_sentences(kept)
    corrupted = flip_answer(clean, seed=seed)
    return (clean.to(device), corrupted.to(device)) if device is not None else (clean, corrupted)
