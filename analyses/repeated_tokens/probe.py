"""The probe data of the head scores: ``[BOS] R R`` with one fixed ``len(R)``, built by the task itself."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from jaxtyping import Int
from torch import Tensor

from interp.errors import TaskError

if TYPE_CHECKING:
    from interp.task import Task

PROBE_SEED = 1234  # the one default seed of the probe sequences (Python API, `interp analyze` and the report alike)


def probe_tokens(
    task: Task, n_seqs: int = 64, rep_len: int | None = None, seed: int = PROBE_SEED, device=None
) -> Int[Tensor, "batch pos"]:
    """``n_seqs`` sequences ``[BOS] R R`` of the repeated-tokens ``task`` (``task.make_sequences``) with
    ``len(R) = rep_len`` for all (default: half the sequence, so R occurs exactly twice), R uniform over the task's
    symbols (repeats inside R allowed), drawn from ``seed``."""
    if task.name != "repeated-tokens":
        raise TaskError(f"probe_tokens builds repeated-tokens data; got a task {task.name!r}")
    rep_len = rep_len or task.seq_len // 2
    if not 1 <= rep_len <= task.seq_len // 2:
        raise TaskError(
            f"rep_len must lie in [1, {task.seq_len // 2}] (two copies in {task.seq_len} tokens), got {rep_len}"
        )
    gen = torch.Generator().manual_seed(seed)
    symbols = torch.randint(0, task.n_symbols, (n_seqs, rep_len), generator=gen)
    tokens = task.make_sequences(symbols, rep_len).tokens
    return tokens.to(device) if device is not None else tokens
