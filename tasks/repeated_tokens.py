"""Repeated random tokens (Elhage et al. 2021 and Li, *A Mathematical Framework for Transformer Circuits*): ``[BOS] R
R (R ...)``, the task that grows induction heads.

``R`` is a sequence of ``n`` symbols drawn uniformly (with replacement, so a symbol may repeat inside
``R``) from ``n_symbols`` symbols; ``n`` is drawn per sequence from ``repeat_lengths`` and ``R`` is
repeated until the sequence has ``seq_len`` tokens after ``[BOS]``. Varying ``n`` matters: with one
fixed ``n`` a one-layer model could copy the token ``n - 1`` positions back by position alone, without
induction.

The loss is on every next-token position. Position ``p`` predicts token ``p + 1``; it is a *first
occurrence* position when that token lies in the first copy of ``R`` or is the first token of the
second copy (``p <= n``: unpredictable, chance is ``1 / n_symbols``), and a *repeat* position when
``p > n`` (predictable in context: the current token occurred ``n`` positions earlier, and the
token after it is the answer). ``accuracy`` is the accuracy on the repeat positions. (A trained model
scores above chance on the first occurrences by guessing that R restarts, i.e. predicting the token after
[BOS]: that is right at ``p = n``, one first-occurrence position in about ``n + 1``.)

Token ids: symbols are ``0 .. n_symbols - 1`` (strings ``"0"``, ``"1"``, ...); ``[BOS]`` is the last id
and input-only (the model's output vocabulary is the symbols).
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


@dataclass(frozen=True)
class RepeatedTokens:
    """The task: symbol count, sequence length, range of ``len(R)``, split sizes and data seed."""

    n_symbols: int = 64
    seq_len: int = 32  # tokens after [BOS]
    repeat_lengths: tuple[int, int] | list[int] = (6, 16)  # inclusive range of len(R)
    train_size: int = 32_000
    val_size: int = 1_000
    test_size: int = 1_000
    seed: int = 0

    name = "repeated-tokens"
    splits = ("train", "val", "test")

    def __post_init__(self):
        object.__setattr__(self, "repeat_lengths", tuple(int(x) for x in self.repeat_lengths))
        if not isinstance(self.n_symbols, int) or self.n_symbols < 2:
            raise TaskError(f"n_symbols must be an integer >= 2, got {self.n_symbols!r}")
        lo, hi = self.repeat_lengths
        if not 1 <= lo <= hi:
            raise TaskError(f"repeat_lengths must be (lo, hi) with 1 <= lo <= hi, got {(lo, hi)}")
        if 2 * hi > self.seq_len:
            raise TaskError(
                f"seq_len={self.seq_len} must hold at least two copies of the longest R "
                f"(2 * {hi} = {2 * hi}); raise seq_len or lower repeat_lengths"
            )
        for split in self.splits:
            size = getattr(self, f"{split}_size")
            if not isinstance(size, int) or size < 1:
                raise TaskError(f"{split}_size must be a positive integer, got {size!r}")

    @property
    def vocab(self) -> Vocab:
        return Vocab(
            tokens=tuple(str(i) for i in range(self.n_symbols)) + ("[BOS]",), bos=self.n_symbols, n_out=self.n_symbols
        )

    @property
    def bos(self) -> int:
        return self.n_symbols

    @property
    def n_ctx(self) -> int:
        return self.seq_len + 1

    def params(self) -> dict[str, Any]:
        d = asdict(self)
        d["repeat_lengths"] = list(self.repeat_lengths)
        return d

    def default_spec(self) -> dict[str, Any]:
        """A 2-layer attention-only model, 2 heads per layer, learned positions added to the residual stream
        (``positional="shortformer"`` puts them into queries and keys only), no LayerNorm, no biases.

        Two heads, not four: with four, layer 0 grew two redundant previous-token heads, so ablating either
        one left the induction heads half working (measured 0.84 -> 0.35 at best)."""
        return dict(
            n_layers=2,
            d_model=64,
            n_heads=2,
            d_head=16,
            d_vocab=self.n_symbols + 1,
            d_vocab_out=self.n_symbols,
            n_ctx=self.n_ctx,
            positional="standard",
            output_matrix="learned",
            attn_bias=False,
            unembed_bias=False,
            normalization=None,
        )

    def default_train(self) -> dict[str, Any]:
        """``TrainConfig`` defaults: AdamW 3e-3, weight decay 0.01, no dropout, betas (0.9, 0.98), 100 warm-up
        steps; 16 epochs of 32,000 fresh sequences = 4,000 steps of 128 (the shipped run's induction phase change
        came between steps 250 and 500: validation accuracy 0.37 -> 0.96)."""
        return dict(epochs=16, batch_size=128, lr=3e-3, weight_decay=0.01, dropout=0.0, beta2=0.98, warmup_steps=100)

    def dataset(self, split: str, seed: int | None = None) -> TaskData:
        """``{split}_size`` fresh sequences, deterministic from ``seed`` (default: the task's data seed)."""
        if split not in self.splits:
            raise TaskError(f"unknown split {split!r} for task {self.name}; expected one of {self.splits}")
        size = getattr(self, f"{split}_size")
        base = self.seed if seed is None else seed
        gen = torch.Generator().manual_seed(int(base) * 1000 + 300 + self.splits.index(split))
        lo, hi = self.repeat_lengths
        n = torch.randint(lo, hi + 1, (size,), generator=gen)
        symbols = torch.randint(0, self.n_symbols, (size, hi), generator=gen)
        return self.make_sequences(symbols, n)

    def make_sequences(self, symbols: Int[Tensor, "batch max_n"], n: Int[Tensor, " batch"] | int) -> TaskData:
        """Build ``[BOS] R R ...`` (``seq_len + 1`` tokens) with ``R = symbols[b, :n[b]]``."""
        symbols = torch.as_tensor(symbols, dtype=torch.long)
        if symbols.ndim != 2:
            raise TaskError(f"symbols must have shape [batch, max_n], got {tuple(symbols.shape)}")
        b = symbols.shape[0]
        n = (
            torch.as_tensor(n, dtype=torch.long).expand(b).clone()
            if torch.as_tensor(n).ndim == 0
            else torch.as_tensor(n, dtype=torch.long)
        )
        if n.shape != (b,) or int(n.min()) < 1 or int(n.max()) > symbols.shape[1] or 2 * int(n.max()) > self.seq_len:
            raise TaskError(
                f"each len(R) must lie in [1, min({symbols.shape[1]}, {self.seq_len // 2})], got {n.tolist()[:10]}"
            )
        if symbols.numel() and (int(symbols.min()) < 0 or int(symbols.max()) >= self.n_symbols):
            raise TaskError(
                f"symbols must lie in [0, {self.n_symbols - 1}], got min {int(symbols.min())} max {int(symbols.max())}"
            )
        j = torch.arange(self.seq_len)
        body = symbols.gather(1, j[None, :] % n[:, None])  # R repeated cyclically
        tokens = torch.cat([torch.full((b, 1), self.bos, dtype=torch.long), body], dim=1)
        targets = torch.cat([tokens[:, 1:], torch.full((b, 1), IGNORE, dtype=torch.long)], dim=1)
        last = self.seq_len - 1
        return TaskData(
            task=self.name,
            tokens=tokens,
            targets=targets,
            answer_pos=torch.full((b,), last, dtype=torch.long),
            labels=tokens[:, -1].clone(),
            lengths=torch.full((b,), self.seq_len + 1, dtype=torch.long),
            fields={"repeat_len": n},
            vocab=self.vocab,
        )

    def repeat_mask(self, data: TaskData) -> Tensor:
        """``[batch, pos]`` True at the repeat positions (``p > n``, target predictable in context)."""
        pos = torch.arange(data.tokens.shape[1], device=data.device)
        return (pos[None, :] > data.fields["repeat_len"][:, None]) & (data.targets != IGNORE)

    def metrics(
        self, preds: Int[Tensor, "batch pos"], loss: Float[Tensor, "batch pos"], data: TaskData
    ) -> dict[str, float]:
        """``accuracy``/``loss`` on the repeat positions, ``first_accuracy``/``first_loss`` on the first
        occurrences, ``answer_accuracy`` at ``answer_pos``, ``all_loss`` over every target."""
        has = data.targets != IGNORE
        rep = self.repeat_mask(data)
        first = has & ~rep
        ok = (preds == data.targets).float()
        rows = torch.arange(len(data), device=preds.device)

        def mean(x, m):
            return (x[m].sum() / m.sum().clamp(min=1)).item()

        return {
            "accuracy": mean(ok, rep),
            "loss": mean(loss, rep),
            "first_accuracy": mean(ok, first),
            "first_loss": mean(loss, first),
            "answer_accuracy": (preds[rows, data.answer_pos] == data.labels).float().mean().item(),
            "all_loss": mean(loss, has),
        }

    def check_data(self, data: TaskData) -> None:
        if data.task != self.name:
            raise TaskError(f"data of task {data.task!r} was given where {self.name!r} data is expected")
        if "repeat_len" not in data.fields:
            raise TaskError("repeated-tokens data needs the field 'repeat_len' (build it with make_sequences)")


# The registration, found through this distribution's entry point (pyproject.toml, group "interp.tasks"), as a
# user's task is found through theirs: the suite is imported only when asked for.
PLUGIN = TaskPlugin(
    name=RepeatedTokens.name,
    make=RepeatedTokens,
    suite="interp.analyses.repeated_tokens.suite:SUITE",
    checkpoints=Path(__file__).parent / "checkpoints",
    aliases={"induction": "repeated-tokens", "induction-1layer": "repeated-tokens-1layer"},  # old checkpoint names
)
