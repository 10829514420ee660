"""Clean and corrupted repeated-tokens inputs for activation and path patching.

The clean input is ``[BOS] R R`` with ``len(R) = seq_len / 2`` and ``R`` drawn without repeats (so each symbol
has one earlier occurrence and the circuit's targets are unambiguous). The answer is read at the last query
position ``q`` (its token ``X`` occurred at ``q - n`` in the first copy, followed by the answer ``A`` at
``q - n + 1``). Three corruptions change the answer and little else, each through one input of the induction
head:

- ``"answer"``: ``A`` (in both copies) becomes a symbol not in ``R``: the induction head still attends to
  ``q - n + 1`` but copies the new symbol (its value / OV path). Both sequences are valid task sequences.
- ``"key"``: in the first copy, ``X`` trades places with an earlier symbol at position ``i``: the token after
  ``X``'s occurrence is now the one at ``i + 1``, so the induction head should attend there; only the
  previous-token information at the keys ``i + 1`` and ``q - n + 1`` moved (its key / K-composition path).
- ``"query"``: the query token becomes the first copy's symbol at ``i``: the induction head should attend to
  ``i + 1`` (its query path).

Only positions the answer can see change (plus, for ``"answer"``, the final token, which it cannot see).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from interp.errors import TaskError
from interp.task import IGNORE, TaskData

from .probe import PROBE_SEED

if TYPE_CHECKING:
    from interp.task import Task

KINDS = ("answer", "key", "query")


def corrupted_pair(
    task: Task, n_seqs: int = 32, kind: str = "key", seed: int = PROBE_SEED, device=None
) -> tuple[TaskData, TaskData]:
    """``(clean, corrupted)`` task data of ``n_seqs`` sequences with the ``kind`` of corruption (random choices
    drawn from ``seed``); each one's ``labels`` hold its answer at the shared ``answer_pos``."""
    if task.name != "repeated-tokens":
        raise TaskError(f"corrupted_pair builds repeated-tokens data; got a task {task.name!r}")
    if kind not in KINDS:
        raise TaskError(f"unknown corruption {kind!r}; expected one of {KINDS}")
    if n_seqs < 1:
        raise TaskError(f"n_seqs must be at least 1, got {n_seqs}")
    n = task.seq_len // 2
    if task.n_symbols <= n or n < 4:
        raise TaskError(
            f"needs len(R) = seq_len / 2 >= 4 and more symbols than that; got len(R) = {n} and {task.n_symbols} symbols"
        )
    gen = torch.Generator().manual_seed(seed)
    symbols = torch.stack([torch.randperm(task.n_symbols, generator=gen)[:n] for _ in range(n_seqs)])
    clean = task.make_sequences(symbols, n)
    toks = clean.tokens.clone()
    q = int(clean.answer_pos[0])  # = seq_len - 1
    src = q - n  # the first-copy occurrence of the query's token
    rows = torch.arange(n_seqs)
    if kind == "answer":
        new = torch.stack([_outside(symbols[b], task.n_symbols, gen) for b in range(n_seqs)])
        toks[:, src + 1] = new
        toks[:, q + 1] = new
        labels = new
    else:
        i = torch.randint(1, src - 1, (n_seqs,), generator=gen)  # i + 1 < src: a different key
        if kind == "key":
            toks[rows, src], toks[rows, i] = clean.tokens[rows, i], clean.tokens[rows, src]
        else:
            toks[:, q] = clean.tokens[rows, i]
        labels = toks[rows, i + 1]
    targets = torch.cat([toks[:, 1:], torch.full((n_seqs, 1), IGNORE, dtype=torch.long)], dim=1)
    corrupted = TaskData(
        task=clean.task,
        tokens=toks,
        targets=targets,
        answer_pos=clean.answer_pos.clone(),
        labels=labels,
        lengths=clean.lengths.clone(),
        fields={k: v.clone() for k, v in clean.fields.items()},
        vocab=clean.vocab,
    )
    return (clean.to(device), corrupted.to(device)) if device is not None else (clean, corrupted)


def _outside(r: torch.Tensor, n_symbols: int, gen) -> torch.Tensor:
    free = torch.ones(n_symbols, dtype=torch.bool)
    free[r] = False
    choices = free.nonzero().squeeze(-1)
    return choices[torch.randint(0, len(choices), (1,), generator=gen)][0]
