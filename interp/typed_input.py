"""Typed input: token strings from what a user types (the explorer's input box, ``w.tokens = "0 1 1 2"``), and the
example every task can build from them (the answer is the last token). A task's suite may build its own examples
from the same token strings (``FunctionSuite(typed_fn=...)``)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from .errors import TokenError
from .task import IGNORE, TaskData

if TYPE_CHECKING:
    from .task import Task, Vocab

SHOWN_TOKENS = 14  # vocabulary tokens an unknown-token message lists


def splits_unambiguously(vocab: Vocab) -> bool:
    """Whether a run of one-character tokens typed without spaces (``0112``) can only mean those tokens: no token of
    the vocabulary is itself a run of one-character tokens. True for noisy majority's digits ``0 1 2`` and integer
    addition's ``0``-``9 + =``; false where ``10`` is a token as well as ``1`` and ``0`` (repeated tokens, modular
    addition), where ``64`` may be a typo for a symbol and must not silently become ``6 4``."""
    idx = vocab.index
    return not any(len(t) > 1 and all(ch in idx for ch in t) for t in vocab.tokens)


def token_strings(vocab: Vocab, text: object) -> list[str]:
    """Token strings from typed text (whitespace-separated; where the vocabulary allows it unambiguously
    (:func:`splits_unambiguously`), a run of one-character tokens may be typed without spaces, ``0112``) or from a
    list of token strings. ``text`` is user input, so anything else is a TokenError, as is an unknown token: one line
    naming it and the vocabulary (a piece is never split into single characters where that could change its
    meaning)."""
    if isinstance(text, (list, tuple)):
        raw = [str(t) for t in text]
    elif isinstance(text, str):
        raw = text.split()
    else:
        raise TokenError(f"tokens must be a string or a list of token strings, got {type(text).__name__}")
    idx = vocab.index
    split = isinstance(text, str) and splits_unambiguously(vocab)
    out: list[str] = []
    for piece in raw:
        if piece in idx:
            out.append(piece)
        elif split and piece and all(ch in idx for ch in piece):
            out.extend(piece)
        else:
            shown = ", ".join(repr(t) for t in vocab.tokens[:SHOWN_TOKENS]) + (
                f", ... ({len(vocab)} tokens)" if len(vocab) > SHOWN_TOKENS else ""
            )
            raise TokenError(f"unknown token {piece!r}; the vocabulary is {shown}")
    if not out:
        raise TokenError("no tokens were typed")
    return out


def answer_last_example(task: Task, toks: list[str]) -> TaskData:
    """The example any task can build from typed tokens: the sequence as typed (``[BOS]`` put first where the
    vocabulary has one and it is missing), its last token the answer, predicted at the position before it (the
    only target). A TokenError unless there are at least two tokens and the last is one the model can predict."""
    vocab = task.vocab
    ids = [vocab.index[t] for t in toks]
    if vocab.bos is not None and ids[0] != vocab.bos:
        ids = [vocab.bos, *ids]
    if len(ids) < 2:
        raise TokenError("type at least two tokens: the input, then its answer (the last token)")
    if ids[-1] >= vocab.n_out:
        raise TokenError(
            f"the last token is the answer, so it must be one the model predicts; {toks[-1]!r} is input-only"
        )
    t = len(ids)
    tokens = torch.tensor([ids])
    targets = torch.full((1, t), IGNORE, dtype=torch.long)
    targets[0, t - 2] = ids[-1]
    return TaskData(
        task=task.name,
        tokens=tokens,
        targets=targets,
        answer_pos=torch.tensor([t - 2]),
        labels=torch.tensor([ids[-1]]),
        lengths=torch.tensor([t]),
        vocab=vocab,
    )
