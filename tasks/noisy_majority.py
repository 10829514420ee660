"""Noisy majority (Fraknói 2024, §5.1-5.2): do 0s or 1s form the majority, ignoring the noise digit 2?

A sentence is ``[BOS] x1 .. xn = y [EOS]`` with digits ``x_i`` in {0, 1, 2}; ``y`` is ``4`` when
``n0 >= n1`` (ties and empty inputs give ``4``) and ``5`` otherwise. The model predicts ``y`` at the
``=`` position and ``[EOS]`` at the ``y`` position. Sequences are right-padded with ``[PAD]``, an
input-only token the model never predicts.
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

TOKENS = ("[BOS]", "0", "1", "2", "=", "4", "5", "[EOS]", "[PAD]")
BOS, ZERO, ONE, TWO, EQ, FOUR, FIVE, EOS, PAD = range(len(TOKENS))
VOCAB = Vocab(tokens=TOKENS, bos=BOS, eos=EOS, pad=PAD, n_out=8)


@dataclass(frozen=True)
class NoisyMajority:
    """The task with its split sizes and digit-count ranges (inclusive). Defaults follow Fraknói 2024."""

    train_size: int = 7500
    val_size: int = 1500
    test_size: int = 1000
    train_lengths: tuple[int, int] | list[int] = (0, 100)
    val_lengths: tuple[int, int] | list[int] = (101, 150)
    test_lengths: tuple[int, int] | list[int] = (151, 200)
    seed: int = 0  # data seed: the same seed gives the same sentences

    name = "noisy-majority"
    vocab = VOCAB
    splits = ("train", "val", "test")

    def __post_init__(self):
        for split in self.splits:
            size = getattr(self, f"{split}_size")
            lengths = getattr(self, f"{split}_lengths")
            if not isinstance(size, int) or isinstance(size, bool) or size < 1:
                raise TaskError(f"{split}_size must be a positive integer, got {size!r}")
            ok = isinstance(lengths, (tuple, list)) and len(lengths) == 2 and all(isinstance(x, int) for x in lengths)
            if not ok or not (0 <= lengths[0] <= lengths[1]):
                raise TaskError(f"{split}_lengths must be [lo, hi] digit counts with 0 <= lo <= hi, got {lengths!r}")
        if not isinstance(self.seed, int) or self.seed < 0:
            raise TaskError(f"seed must be a non-negative integer, got {self.seed!r}")
        object.__setattr__(self, "train_lengths", tuple(self.train_lengths))
        object.__setattr__(self, "val_lengths", tuple(self.val_lengths))
        object.__setattr__(self, "test_lengths", tuple(self.test_lengths))

    @property
    def max_digits(self) -> int:
        return max(self.train_lengths[1], self.val_lengths[1], self.test_lengths[1])

    @property
    def n_ctx(self) -> int:
        """Context the model needs: [BOS], the digits, '=', the answer and [EOS]."""
        return self.max_digits + 4

    def params(self) -> dict[str, Any]:
        d = asdict(self)
        return {k: list(v) if isinstance(v, tuple) else v for k, v in d.items()}

    def default_spec(self) -> dict[str, Any]:
        """Fraknói 2024 (§5.2): 1 layer, attention only, no positional embedding, no output matrix (the spec takes
        the identity W_O where the heads fill the residual stream, a learned one otherwise)."""
        return dict(
            n_layers=1,
            d_model=32,
            n_heads=16,
            d_head=2,
            d_vocab=len(VOCAB),
            d_vocab_out=VOCAB.n_out,
            n_ctx=self.n_ctx,
            positional="none",
            attn_bias=False,
        )

    def default_train(self) -> dict[str, Any]:
        """``interp.training.TrainConfig`` defaults for this task (Fraknói 2024, §5.2)."""
        return dict(epochs=900, batch_size=128, lr=1e-3, weight_decay=0.01, dropout=0.1)

    def dataset(self, split: str, seed: int | None = None) -> TaskData:
        """The sentences of ``split``, generated from ``seed`` (default: the task's data seed)."""
        if split not in self.splits:
            raise TaskError(f"unknown split {split!r} for task {self.name}; expected one of {self.splits}")
        size = getattr(self, f"{split}_size")
        lo, hi = getattr(self, f"{split}_lengths")
        base = self.seed if seed is None else seed
        gen = torch.Generator().manual_seed(int(base) * 1000 + self.splits.index(split))
        n = torch.randint(lo, hi + 1, (size,), generator=gen)
        digits = torch.randint(0, 3, (size, hi), generator=gen)
        return make_sentences([digits[i, : n[i]] for i in range(size)])

    def metrics(
        self, preds: Int[Tensor, "batch pos"], loss: Float[Tensor, "batch pos"], data: TaskData
    ) -> dict[str, float]:
        """``accuracy``: the 4/5 prediction at '=' (argmax over all output tokens) is right;
        ``eos_accuracy``: [EOS] is predicted after the answer; ``loss``: mean loss on both positions."""
        rows = torch.arange(len(data), device=preds.device)
        answer_ok = preds[rows, data.answer_pos] == data.labels
        eos_ok = preds[rows, data.answer_pos + 1] == EOS
        # the two target positions of each sentence, in the row-major order of ``loss[data.targets != IGNORE]``
        # (the same numbers summed in the same order); gathered, not masked: the mask over every position cost
        # ten times the rest of this function, which a population's validation calls once per model and epoch
        at = torch.stack([loss[rows, data.answer_pos], loss[rows, data.answer_pos + 1]], 1).flatten()
        return {
            "accuracy": answer_ok.float().mean().item(),
            "eos_accuracy": eos_ok.float().mean().item(),
            "loss": (at.sum() / at.numel()).item(),
        }

    def check_data(self, data: TaskData) -> None:
        if data.task != self.name:
            raise TaskError(f"data of task {data.task!r} was given where {self.name!r} data is expected")
        missing = {"n0", "n1", "n2"} - set(data.fields)
        if missing:
            raise TaskError(f"noisy-majority data needs the fields {sorted(missing)} (build it with make_sentences)")


def make_sentences(digit_seqs: list[Tensor] | list[list[int]]) -> TaskData:
    """Build padded noisy-majority data from digit sequences (values in {0, 1, 2})."""
    seqs = [torch.as_tensor(d, dtype=torch.long).flatten() for d in digit_seqs]
    if not seqs:
        raise TaskError("no sequences were given")
    for d in seqs:
        if d.numel() and (int(d.min()) < 0 or int(d.max()) > 2):
            raise TaskError(f"digits must be 0, 1 or 2; got values {sorted(set(d.tolist()))}")
    b = len(seqs)
    n = torch.tensor([len(d) for d in seqs])
    t = int(n.max()) + 4
    tokens = torch.full((b, t), PAD, dtype=torch.long)
    targets = torch.full((b, t), IGNORE, dtype=torch.long)
    counts = torch.stack(
        [torch.bincount(d, minlength=3) if d.numel() else torch.zeros(3, dtype=torch.long) for d in seqs]
    )
    labels = torch.where(counts[:, 0] >= counts[:, 1], FOUR, FIVE)
    rows = torch.arange(b)
    tokens[:, 0] = BOS
    for i, d in enumerate(seqs):
        tokens[i, 1 : 1 + len(d)] = d + ZERO
    eq = n + 1
    tokens[rows, eq] = EQ
    tokens[rows, eq + 1] = labels
    tokens[rows, eq + 2] = EOS
    targets[rows, eq] = labels
    targets[rows, eq + 1] = EOS
    return TaskData(
        task=NoisyMajority.name,
        tokens=tokens,
        targets=targets,
        answer_pos=eq,
        labels=labels,
        lengths=n + 4,
        fields={"n0": counts[:, 0], "n1": counts[:, 1], "n2": counts[:, 2], "n_digits": n},
        vocab=VOCAB,
    )


# The registration, found through this distribution's entry point (pyproject.toml, group "interp.tasks"), as a
# user's task is found through theirs: the suite is imported only when asked for.
PLUGIN = TaskPlugin(
    name=NoisyMajority.name,
    make=NoisyMajority,
    suite="interp.analyses.noisy_majority.suite:SUITE",
    checkpoints=Path(__file__).parent / "checkpoints",
)
