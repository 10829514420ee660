"""Modular addition (Nanda et al. 2023, Fraknói 2024, §4): ``a b =`` -> ``(a + b) mod p``.

One token per number (ids ``0 .. p-1``) plus ``=`` (id ``p``); the model predicts the sum at the ``=`` position
(position 2) over the ``p`` number tokens only (``d_vocab_out = p``). Every pair ``(a, b)`` appears exactly once:
the ``p**2`` pairs are shuffled by a fixed seed and the first ``int(fraction * p**2)`` form the training split, the
rest the test split (3,830 / 8,939 pairs at p = 113, fraction 0.3, as in the paper). ``dataset("all")`` gives every
pair in the order ``a * p + b`` (for exhaustive evaluation; it is not one of the ``splits``).

The default model and training are the grokking recipe: one layer with an MLP, d_model 128, 4 heads of 32,
d_mlp 512, ReLU, no LayerNorm, no attention or unembedding biases; full-batch AdamW with lr 1e-3, weight decay 1.0,
betas (0.9, 0.98), 10 warmup steps, no dropout, the loss in float64, the last epoch kept.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
from jaxtyping import Float, Int
from torch import Tensor

from interp.errors import TaskError
from interp.registry import TaskPlugin
from interp.task import IGNORE, TaskData, Vocab

EQ_POS = 2  # the answer position: "a b =" -> the prediction made at "="


@dataclass(frozen=True)
class ModularAddition:
    """The task: modulus ``p`` (a prime gives the paper's Fourier structure), the training ``fraction`` of all pairs,
    and the ``seed`` of the train/test shuffle."""

    p: int = 113
    fraction: float = 0.3
    seed: int = 0

    name = "modular-addition"
    splits = ("train", "test")

    def __post_init__(self):
        if not isinstance(self.p, int) or isinstance(self.p, bool) or self.p < 2:
            raise TaskError(f"p must be an integer >= 2, got {self.p!r}")
        if isinstance(self.fraction, bool) or not isinstance(self.fraction, (int, float)) or not 0 < self.fraction < 1:
            raise TaskError(f"fraction must be a number in (0, 1), got {self.fraction!r}")
        n_train = int(self.fraction * self.p**2)
        if not 1 <= n_train < self.p**2:
            raise TaskError(f"fraction {self.fraction} of {self.p**2} pairs leaves an empty train or test split")
        if not isinstance(self.seed, int) or isinstance(self.seed, bool) or self.seed < 0:
            raise TaskError(f"seed must be a non-negative integer, got {self.seed!r}")
        object.__setattr__(self, "fraction", float(self.fraction))

    @property
    def vocab(self) -> Vocab:
        return Vocab(tokens=tuple(str(i) for i in range(self.p)) + ("=",), n_out=self.p)

    @property
    def eq(self) -> int:
        """The id of the ``=`` token."""
        return self.p

    n_ctx = 3

    @property
    def n_train(self) -> int:
        return int(self.fraction * self.p**2)

    def params(self) -> dict[str, Any]:
        return asdict(self)

    def default_spec(self) -> dict[str, Any]:
        """Nanda's grokking model (biases of attention and unembedding frozen at zero; the MLP keeps its biases)."""
        return dict(
            n_layers=1,
            d_model=128,
            n_heads=4,
            d_head=32,
            d_mlp=512,
            attn_only=False,
            act_fn="relu",
            d_vocab=self.p + 1,
            d_vocab_out=self.p,
            n_ctx=self.n_ctx,
            positional="standard",
            output_matrix="learned",
            attn_bias=False,
            unembed_bias=False,
            normalization=None,
        )

    def default_train(self) -> dict[str, Any]:
        """Full-batch AdamW as in the paper (the batch holds every training pair)."""
        return dict(
            epochs=3000,
            batch_size=self.n_train,
            lr=1e-3,
            weight_decay=1.0,
            beta1=0.9,
            beta2=0.98,
            dropout=0.0,
            warmup_steps=10,
            loss_dtype="float64",
            keep="last",
        )

    def split_index(self, split: str) -> Int[Tensor, " n"]:
        """Pair indices ``a * p + b`` of a split (``"all"``: every pair, in order)."""
        n = self.p**2
        if split == "all":
            return torch.arange(n)
        if split not in self.splits:
            raise TaskError(f"unknown split {split!r} for task {self.name}; expected one of {self.splits} (or 'all')")
        perm = torch.randperm(n, generator=torch.Generator().manual_seed(self.seed))
        return perm[: self.n_train] if split == "train" else perm[self.n_train :]

    def dataset(self, split: str, seed: int | None = None) -> TaskData:
        """The pairs of ``split`` (``seed`` replaces the task's shuffle seed)."""
        task = self if seed is None or seed == self.seed else ModularAddition(self.p, self.fraction, int(seed))
        return make_pairs(task.split_index(split) // self.p, task.split_index(split) % self.p, self.p)

    def metrics(
        self, preds: Int[Tensor, "batch pos"], loss: Float[Tensor, "batch pos"], data: TaskData
    ) -> dict[str, float]:
        """``accuracy``: the argmax at ``=`` is ``(a + b) mod p``; ``loss``: mean cross-entropy there."""
        ok = preds[:, EQ_POS] == data.labels
        return {"accuracy": ok.float().mean().item(), "loss": loss[:, EQ_POS].mean().item()}

    def check_data(self, data: TaskData) -> None:
        if data.task != self.name:
            raise TaskError(f"data of task {data.task!r} was given where {self.name!r} data is expected")
        if data.tokens.shape[1] != 3 or not {"a", "b"} <= set(data.fields):
            raise TaskError("modular-addition data must be 'a b =' rows with fields a and b (build it with make_pairs)")
        if data.vocab is not None and len(data.vocab) != self.p + 1:
            raise TaskError(f"the data is for p = {len(data.vocab) - 1}, the task has p = {self.p}")


def make_pairs(a, b, p: int) -> TaskData:
    """``a b =`` rows with the target ``(a + b) mod p`` at ``=``."""
    a = torch.as_tensor(a, dtype=torch.long).flatten()
    b = torch.as_tensor(b, dtype=torch.long).flatten()
    if a.shape != b.shape:
        raise TaskError(f"a and b must have the same length, got {len(a)} and {len(b)}")
    if a.numel() and (int(torch.minimum(a, b).min()) < 0 or int(torch.maximum(a, b).max()) >= p):
        raise TaskError(f"a and b must lie in [0, {p - 1}]")
    n = len(a)
    tokens = torch.stack([a, b, torch.full_like(a, p)], dim=1)
    labels = (a + b) % p
    targets = torch.full((n, 3), IGNORE, dtype=torch.long)
    targets[:, EQ_POS] = labels
    vocab = Vocab(tokens=tuple(str(i) for i in range(p)) + ("=",), n_out=p)
    return TaskData(
        task=ModularAddition.name,
        tokens=tokens,
        targets=targets,
        answer_pos=torch.full((n,), EQ_POS, dtype=torch.long),
        labels=labels,
        lengths=torch.full((n,), 3, dtype=torch.long),
        fields={"a": a, "b": b},
        vocab=vocab,
    )


# The registration, found through this distribution's entry point (pyproject.toml, group "interp.tasks"), as a
# user's task is found through theirs: the suite is imported only when asked for.
PLUGIN = TaskPlugin(
    name=ModularAddition.name,
    make=ModularAddition,
    suite="interp.analyses.modular_addition.suite:SUITE",
    checkpoints=Path(__file__).parent / "checkpoints",
)
