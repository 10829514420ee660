"""Balanced parentheses, a task written outside the toolkit (docs/own-task.md walks through it).

A sentence is ``[BOS] s1 .. sn = y`` with each ``s_i`` ``(`` or ``)``; ``y`` is ``yes`` when the string is balanced
(every prefix opens at least as many as it closes, and the whole string closes all it opens) and ``no`` otherwise.
The model predicts ``y`` at the ``=`` position. Sentences are right-padded with ``[PAD]``, an input-only token.

The package registers it by an entry point (``pyproject.toml`` beside this file: the group ``interp.tasks``,
``balanced-parens = "parens_task:PLUGIN"``); in a notebook ``interp.register_task(BalancedParens, suite=make_suite)``
does the same for one process.
"""

from __future__ import annotations

import random
from dataclasses import asdict, dataclass
from typing import Any

import torch
from jaxtyping import Float, Int
from torch import Tensor

from interp.errors import TaskError, TokenError
from interp.registry import TaskPlugin
from interp.task import IGNORE, TaskData, Vocab

TOKENS = ("[BOS]", "(", ")", "=", "yes", "no", "[PAD]")
BOS, OPEN, CLOSE, EQ, YES, NO, PAD = range(len(TOKENS))
VOCAB = Vocab(tokens=TOKENS, bos=BOS, pad=PAD, n_out=6)  # [PAD] (the last token) is never predicted


def is_balanced(s: str) -> bool:
    """Every prefix of ``s`` opens at least as many parentheses as it closes, and ``s`` closes all it opens."""
    depth = 0
    for ch in s:
        depth += 1 if ch == "(" else -1
        if depth < 0:
            return False
    return depth == 0


def make_strings(strings: list[str]) -> TaskData:
    """Padded task data from strings of ``(`` and ``)``: ``[BOS] s = y``, the answer ``y`` computed."""
    if not strings:
        raise TaskError("no strings were given")
    bad = [s for s in strings if set(s) - {"(", ")"}]
    if bad:
        raise TaskError(f"strings hold only '(' and ')'; got {bad[0]!r}")
    b, n = len(strings), torch.tensor([len(s) for s in strings])
    t = int(n.max()) + 3
    tokens = torch.full((b, t), PAD, dtype=torch.long)
    targets = torch.full((b, t), IGNORE, dtype=torch.long)
    labels = torch.tensor([YES if is_balanced(s) else NO for s in strings])
    min_depth = torch.zeros(b, dtype=torch.long)
    tokens[:, 0] = BOS
    for i, s in enumerate(strings):
        ids = torch.tensor([OPEN if ch == "(" else CLOSE for ch in s], dtype=torch.long)
        tokens[i, 1 : 1 + len(s)] = ids
        if len(s):
            min_depth[i] = int(torch.where(ids == OPEN, 1, -1).cumsum(0).min().clamp(max=0))
    rows = torch.arange(b)
    eq = n + 1  # the '=' position: the answer is predicted there
    tokens[rows, eq] = EQ
    tokens[rows, eq + 1] = labels
    targets[rows, eq] = labels
    return TaskData(
        task=BalancedParens.name,
        tokens=tokens,
        targets=targets,
        answer_pos=eq,
        labels=labels,
        lengths=n + 3,
        fields={
            "n_open": (tokens == OPEN).sum(1),
            "n_close": (tokens == CLOSE).sum(1),
            "min_depth": min_depth,  # the lowest depth of a prefix: < 0 where a ')' closes nothing
        },
        vocab=VOCAB,
    )


@dataclass(frozen=True)
class BalancedParens:
    """The task with its split sizes, the longest string and the data seed."""

    train_size: int = 2000
    val_size: int = 200
    test_size: int = 500
    max_len: int = 12
    seed: int = 0

    name = "balanced-parens"
    vocab = VOCAB
    splits = ("train", "val", "test")

    def __post_init__(self):
        for what in ("train_size", "val_size", "test_size", "max_len"):
            value = getattr(self, what)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise TaskError(f"{what} must be a positive integer, got {value!r}")
        if self.max_len < 2:
            raise TaskError(f"max_len must be at least 2 (the shortest balanced string is '()'), got {self.max_len}")

    @property
    def n_ctx(self) -> int:
        """The context a model needs: [BOS], the string, '=' and the answer."""
        return self.max_len + 3

    def params(self) -> dict[str, Any]:
        return asdict(self)

    def default_spec(self) -> dict[str, Any]:
        """Two attention-only layers with learned positions: counting alone cannot tell ')(' from '()'."""
        return dict(
            n_layers=2,
            d_model=32,
            n_heads=4,
            d_head=8,
            d_vocab=len(VOCAB),
            d_vocab_out=VOCAB.n_out,
            n_ctx=self.n_ctx,
            positional="standard",
        )

    def default_train(self) -> dict[str, Any]:
        return dict(epochs=40, batch_size=64, lr=3e-3, weight_decay=0.01, dropout=0.0)

    def dataset(self, split: str, seed: int | None = None) -> TaskData:
        """The strings of ``split``, from ``seed`` (default: the task's data seed): half balanced, a quarter with as
        many ')' as '(' but a prefix that closes too many, a quarter drawn uniformly (mostly unequal counts)."""
        if split not in self.splits:
            raise TaskError(f"unknown split {split!r} for task {self.name}; expected one of {self.splits}")
        rng = random.Random(((self.seed if seed is None else seed) * 1000) + self.splits.index(split))
        pairs = self.max_len // 2
        strings = []
        for i in range(getattr(self, f"{split}_size")):
            kind = i % 4
            if kind in (0, 1, 2):  # equal counts: shuffled until balanced (kinds 0 and 1) or not (kind 2)
                k = rng.randint(1, pairs)
                while True:
                    s = "".join(rng.sample("(" * k + ")" * k, 2 * k))
                    if is_balanced(s) == (kind != 2):
                        break
            else:
                s = "".join(rng.choice("()") for _ in range(rng.randint(1, self.max_len)))
            strings.append(s)
        return make_strings(strings)

    def metrics(
        self, preds: Int[Tensor, "batch pos"], loss: Float[Tensor, "batch pos"], data: TaskData
    ) -> dict[str, float]:
        """``accuracy``: the yes/no prediction at '=' is right; ``loss``: its cross-entropy."""
        rows = torch.arange(len(data), device=preds.device)
        return {
            "accuracy": (preds[rows, data.answer_pos] == data.labels).float().mean().item(),
            "loss": loss[rows, data.answer_pos].mean().item(),
        }

    def check_data(self, data: TaskData) -> None:
        if data.task != self.name:
            raise TaskError(f"data of task {data.task!r} was given where {self.name!r} data is expected")


# -- an optional suite: the generic suite's analyses, with typed input and a corruption of this task's own -----------


def typed_example(task: BalancedParens, toks: list[str]) -> TaskData:
    """A typed string of parentheses (``[BOS]`` and ``=`` with what follows are optional): the answer is computed."""
    if toks[0] == "[BOS]":
        toks = toks[1:]
    if "=" in toks:
        toks = toks[: toks.index("=")]
    if not toks or set(toks) - {"(", ")"}:
        raise TokenError("type a string of '(' and ')', e.g. ( ( ) )")
    return make_strings(["".join(toks)])


def nested(clean: TaskData, seed: int = 0) -> TaskData:
    """The input with its answer flipped at the same length: a balanced string reversed (it then starts with ')'),
    an unbalanced one of even length replaced by nested parentheses ``((..))``. Odd lengths are never balanced."""
    strings = []
    for row, n in zip(clean.tokens.tolist(), (clean.answer_pos - 1).tolist()):
        s = "".join("(" if t == OPEN else ")" for t in row[1 : 1 + n])
        if n % 2:
            raise TaskError(f"a string of odd length ({n}) is never balanced: no string of its length flips it")
        strings.append(s[::-1] if is_balanced(s) else "(" * (n // 2) + ")" * (n // 2))
    return make_strings(strings)


def make_suite():
    """The suite, built when first asked for (``interp analyze``, ``interp report``, the explorer)."""
    from interp.analyses.generic_suite import add_report_sections, analyze
    from interp.suite import Corruption, FunctionSuite

    def corruptions(task):
        return {"nested": Corruption(nested, about="the same length with the answer flipped")}

    return FunctionSuite(
        "balanced-parens", analyze, add_report_sections, typed_fn=typed_example, corruptions_fn=corruptions
    )


PLUGIN = TaskPlugin(name=BalancedParens.name, make=BalancedParens, suite=make_suite)
