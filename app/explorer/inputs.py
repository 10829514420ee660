"""The explorer's inputs: examples typed as tokens (built by each task's own data builders, so their targets and
answers are the task's), and the corrupted inputs that patching compares an input against (the task's own helpers,
another example of the split, or typed tokens)."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import torch

from interp.errors import TaskError, TokenError
from interp.task import IGNORE, TaskData
from interp.tasks.integer_addition import make_sums
from interp.tasks.modular_addition import make_pairs
from interp.tasks.noisy_majority import make_sentences

if TYPE_CHECKING:
    from interp.task import Task, Vocab
    from interp.tasks.integer_addition import IntegerAddition
    from interp.tasks.modular_addition import ModularAddition
    from interp.tasks.noisy_majority import NoisyMajority
    from interp.tasks.repeated_tokens import RepeatedTokens

PAIR_KINDS = {"repeated-tokens": ("key", "query", "answer")}  # corruptions whose helper draws its own clean input
OWN_KINDS = {"noisy-majority": ("flip",)}  # corruptions of the current input by the task's own helper
SHOWN_TOKENS = 14  # vocabulary tokens an unknown-token message lists


def token_strings(vocab: Vocab, text: object) -> list[str]:
    """Token strings from typed text (whitespace-separated; a run of one-character tokens may be typed without
    spaces, ``0112``) or from a list of token strings. ``text`` is user input, so anything else is a TokenError, as
    is an unknown token (the message names the first one and the vocabulary)."""
    if isinstance(text, (list, tuple)):
        raw = [str(t) for t in text]
    elif isinstance(text, str):
        raw = text.split()
    else:
        raise TokenError(f"tokens must be a string or a list of token strings, got {type(text).__name__}")
    idx = vocab.index
    out: list[str] = []
    for piece in raw:
        if piece in idx:
            out.append(piece)
        elif piece and all(ch in idx for ch in piece):
            out.extend(piece)
        else:
            shown = ", ".join(repr(t) for t in vocab.tokens[:SHOWN_TOKENS]) + (
                f", ... ({len(vocab)} tokens)" if len(vocab) > SHOWN_TOKENS else ""
            )
            raise TokenError(f"unknown token {piece!r}; the vocabulary is {shown}")
    if not out:
        raise TokenError("no tokens were typed")
    return out


def noisy_majority_example(task: NoisyMajority, toks: list[str]) -> TaskData:
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


def repeated_tokens_example(task: RepeatedTokens, toks: list[str]) -> TaskData:
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


def modular_addition_example(task: ModularAddition, toks: list[str]) -> TaskData:
    """Modular addition from ``a b`` (an optional trailing ``=``); the answer ``(a + b) mod p`` is computed."""
    if toks[-1] == "=":
        toks = toks[:-1]
    if len(toks) != 2 or "=" in toks:
        raise TokenError(f"modular-addition input is two numbers 'a b' (0..{task.p - 1}), optionally followed by '='")
    a, b = (int(t) for t in toks)
    return make_pairs([a], [b], task.p)


def integer_addition_example(task: IntegerAddition, toks: list[str]) -> TaskData:
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
    return make_sums(
        torch.tensor([a]),
        torch.tensor([b]),
        torch.tensor([n]),
        reverse_answer=task.reverse_answer,
        reverse_operands=task.reverse_operands,
    )


TYPED: dict[str, Callable[..., TaskData]] = {
    "noisy-majority": noisy_majority_example,
    "repeated-tokens": repeated_tokens_example,
    "modular-addition": modular_addition_example,
    "integer-addition": integer_addition_example,
}  # the tasks whose examples can be typed, and their builders


def typed_example(task: Task, text: object, n_ctx: int | None = None) -> TaskData:
    """One example of ``task``'s data from typed tokens (a string such as ``"0 1 1 2"`` or ``"[BOS] 0 1 = 4"``, or a
    list of token strings), its answer and targets as the task defines them: noisy majority takes the digits (the
    answer is computed), repeated tokens the sequence itself, modular addition ``a b``, integer addition ``a + b``.
    Raises a TokenError (one line) for a token outside the vocabulary, input of the wrong shape, or more than
    ``n_ctx`` tokens, and a TaskError for a task without a builder here."""
    build = TYPED.get(task.name)
    if build is None:
        raise TaskError(
            f"typed input is not available for task {task.name!r} (the explorer builds typed examples "
            f"of {', '.join(sorted(TYPED))}); pick an example of a split instead"
        )
    data = build(task, token_strings(task.vocab, text))
    if n_ctx is not None and data.tokens.shape[1] > n_ctx:
        raise TokenError(f"the input has {data.tokens.shape[1]} tokens; the model's context is n_ctx={n_ctx}")
    return data


def corruption_kinds(task: Task) -> tuple[str, ...]:
    """The corrupted inputs the explorer offers for ``task``: the task's own helpers (noisy majority's ``flip``: the
    fewest 0/1 swaps that flip the answer; repeated tokens' ``key``/``query``/``answer`` pairs), ``resample`` (the
    next example of the split with the same length and a different answer) and ``typed``."""
    return (
        OWN_KINDS.get(task.name, ())
        + PAIR_KINDS.get(task.name, ())
        + ("resample",)
        + (("typed",) if task.name in TYPED else ())
    )


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
