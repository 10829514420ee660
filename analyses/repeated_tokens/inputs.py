"""Repeated tokens' inputs for the explorer (its suite's hooks): typed sequences, the ``key`` / ``query`` /
``answer`` pairs of :func:`corrupted_pair` (each drawn with its clean input), and the ``[BOS] R R`` probe sequences
of the head scores."""

from __future__ import annotations

from functools import partial
from typing import TYPE_CHECKING

import torch

from interp.errors import TokenError
from interp.suite import Corruption
from interp.task import IGNORE, TaskData

from .corrupt import corrupted_pair
from .probe import probe_tokens

if TYPE_CHECKING:
    from jaxtyping import Int
    from torch import Tensor

    from interp.tasks.repeated_tokens import RepeatedTokens

PROBE_SEQS = 32  # probe sequences of the explorer's head scores
ABOUT = {
    "key": "the query token's earlier occurrence trades places with an earlier token (the key path)",
    "query": "the query token becomes another token of the first copy (the query path)",
    "answer": "the token after the earlier occurrence, the answer, becomes a new symbol (the value path)",
}


def typed_example(task: RepeatedTokens, toks: list[str]) -> TaskData:
    """Repeated tokens as typed (``[BOS]`` added when missing): every position predicts the next token, the answer
    is the last token (read at the position before it), and ``repeat_len`` is the shortest period of the symbols."""
    ids = [task.vocab.index[t] for t in toks]
    if ids[0] != task.bos:
        ids = [task.bos] + ids
    if task.bos in ids[1:]:
        raise TokenError("[BOS] may only start the sequence")
    if len(ids) < 3:
        raise TokenError("type at least two symbols (after the optional [BOS])")
    body = ids[1:]
    period = next(n for n in range(1, len(body) + 1) if all(body[i] == body[i - n] for i in range(n, len(body))))
    tokens = torch.tensor([ids])
    targets = torch.cat([tokens[:, 1:], torch.full((1, 1), IGNORE)], 1)
    t = len(ids)
    return TaskData(
        task=task.name,
        tokens=tokens,
        targets=targets,
        answer_pos=torch.tensor([t - 2]),
        labels=torch.tensor([ids[-1]]),
        lengths=torch.tensor([t]),
        fields={"repeat_len": torch.tensor([period])},
        vocab=task.vocab,
    )


def _pair(task: RepeatedTokens, seed: int, kind: str) -> tuple[TaskData, TaskData]:
    return corrupted_pair(task, n_seqs=1, kind=kind, seed=seed)


def corruptions(task: RepeatedTokens) -> dict[str, Corruption]:
    """``key``, ``query`` and ``answer``: a clean ``[BOS] R R`` drawn with its corruption (:func:`corrupted_pair`)."""
    return {
        kind: Corruption(partial(_pair, kind=kind), pair=True, about=ABOUT[kind]) for kind in ("key", "query", "answer")
    }


def probes(task: RepeatedTokens) -> Int[Tensor, "batch pos"]:
    """``PROBE_SEQS`` of the task's own ``[BOS] R R`` probe sequences (:func:`probe_tokens`)."""
    return probe_tokens(task, n_seqs=PROBE_SEQS)
