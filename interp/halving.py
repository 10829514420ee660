"""Halving heads (Fraknói 2024, §5.5): training with a persistent head mask that halves when validation is good.

A masked head is exactly absent. Masking zeroes the head's own trainable parameters (``W_Q``, ``W_K``, ``W_V``,
their biases, and ``W_O`` where it is trained) and its optimizer moments, and :meth:`HeadMask.apply` zeroes them
again after every optimizer step. With ``W_V`` and ``b_V`` zero the head's values are zero, so its ``hook_z`` is
exactly zero in every forward: TransformerLens' own, the hook path with dropout, and the exact query-restricted
forward training uses for one-layer models (which has no hooks, so a mask applied by hooks would miss it). Its
gradients are then exactly zero too (every path into them goes through a zero factor), and a checkpoint of the
model, loaded in plain TransformerLens, computes the masked model. A frozen ``W_O`` (the thesis's identity output
matrix) is left as it is: the head's output ``z @ W_O`` is zero anyway.

The schedule (:class:`Halving`): after each epoch's validation, if its accuracy reaches ``threshold`` (default 0.95;
compared on counts of correct validation examples, :mod:`interp.thresholds`) and more than one head is active,
the active heads are scored by the run's strategy and the best ``ceil(n / 2)`` kept (ties go to the lower head
index); repeat until one head is left. ``mask-all-but-one`` (the seed's baseline) masks ``a - 1`` heads before the
first step, keeping one head drawn with the run's seed.
Strategies that need analyses (``svc``, ``learned``, ``shapley-svc``, ``shapley-learned``) score through a
callable passed in by the caller (``interp.analyses.halving`` has them; ``interp`` never imports ``interp.analyses``);
``random`` and ``mask-all-but-one`` need none.

Everything here is plain data that round-trips through JSON (:meth:`Halving.to_dict`), so a resumed run continues
mid-halving with the same mask and history, and the random strategy draws from a generator seeded by the run's
seed and the step number (no shared RNG state to save).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch

from .configs import SELF_SCORED, check_strategy
from .device import model_device
from .errors import ConfigError
from .heads import Head, all_heads, head_label, head_mask, parse_head
from .thresholds import reaches

if TYPE_CHECKING:
    from transformer_lens import HookedTransformer

    from .task import Task

HEAD_PARAMS = ("W_Q", "W_K", "W_V", "W_O", "b_Q", "b_K", "b_V")  # per-head parameters of an attention layer

# scorer(model, task, heads, train, val) -> one score per head (higher is kept)
Scorer = Callable[[Any, Any, Sequence[Head], Any, Any], Sequence[float]]


def keep_best(heads: Sequence[Head], scores: Sequence[float], keep: int) -> list[Head]:
    """The ``keep`` heads with the highest scores (ties: the lower head first), in head order. Scores are compared
    rounded to 9 decimals, so that values equal but for floating-point noise (Shapley values of saturated
    separation accuracies, summed in different orders) count as ties instead of being ranked by that noise."""
    if len(scores) != len(heads):
        raise ConfigError(f"a halving scorer returned {len(scores)} scores for {len(heads)} heads")
    order = sorted(range(len(heads)), key=lambda i: (-round(float(scores[i]), 9), heads[i]))
    return sorted(heads[i] for i in order[:keep])


def random_scores(n: int, seed: int, step: int) -> list[float]:
    """The ``random`` strategy's scores: uniform draws from a generator seeded by the run's seed and the step."""
    g = torch.Generator().manual_seed(int(seed) * 1_000_003 + int(step))
    return torch.rand(n, generator=g).tolist()


def _per_head_params(model: HookedTransformer):
    """``(parameter, layer)`` for every per-head attention parameter ``[n_heads, ...]`` of ``model``."""
    for layer, block in enumerate(model.blocks):
        attn = block.attn
        for name in HEAD_PARAMS:
            p = getattr(attn, name, None)
            if isinstance(p, torch.nn.Parameter) and p.dim() >= 2 and p.shape[0] == model.cfg.n_heads:
                yield name, p, layer


@dataclass
class Halving:
    """The state of a halving run: which heads are active, and every step taken so far.

    ``steps``: ``{"epoch", "val_accuracy", "before", "kept", "masked", "scores"}`` per halving (heads as
    ``'L0H3'``; ``scores`` per head of ``before``; epoch 0 with ``val_accuracy`` None for ``mask-all-but-one``)."""

    strategy: str
    threshold: float
    n_layers: int
    n_heads: int
    seed: int = 0
    active: list[Head] = field(default_factory=list)
    steps: list[dict[str, Any]] = field(default_factory=list)

    def __post_init__(self):
        check_strategy(self.strategy, self.threshold)
        if not self.active and not self.steps:
            self.active = all_heads(self.n_layers, self.n_heads)

    # -- the mask -------------------------------------------------------------------------------------------------
    @property
    def mask(self) -> torch.Tensor:
        """``[n_layers, n_heads]``, 1 for active heads."""
        return head_mask([self.active], self.n_layers, self.n_heads)[0]

    @property
    def done(self) -> bool:
        return len(self.active) <= 1

    @property
    def last_epoch(self) -> int:
        return self.steps[-1]["epoch"] if self.steps else 0

    @torch.no_grad()
    def apply(self, model: HookedTransformer, optimizer=None) -> None:
        """Zero the masked heads' parameters (and, with ``optimizer``, their Adam moments)."""
        if len(self.active) == self.n_layers * self.n_heads:
            return
        mask = self.mask.to(model_device(model))
        for name, p, layer in _per_head_params(model):
            if not p.requires_grad and name == "W_O":
                continue  # a frozen output matrix stays as the spec fixes it; z is zero anyway
            m = mask[layer].to(p.dtype).view(-1, *([1] * (p.dim() - 1)))
            p.mul_(m)
            if optimizer is not None:
                for v in optimizer.state.get(p, {}).values():
                    if torch.is_tensor(v) and v.shape == p.shape:
                        v.mul_(m)

    # -- the schedule ---------------------------------------------------------------------------------------------
    def reached(self, val_accuracy: float, examples: int | None) -> bool:
        """Whether ``val_accuracy`` (a share of ``examples`` validation examples) reaches the threshold, compared on
        counts of correct examples (:func:`interp.thresholds.reaches`: 1,425 of 1,500 reaches 0.95, although its
        float32 accuracy reads 0.94999999)."""
        return reaches(val_accuracy, self.threshold, examples)

    def start(self, model: HookedTransformer, optimizer=None) -> None:
        """Before the first epoch: ``mask-all-but-one`` keeps one head drawn with the seed."""
        from .attention import has_factors

        if has_factors(model):
            raise ConfigError(
                "halving heads zeroes a head's own W_Q, W_K, W_V; under qkv='lowrank:R' the heads share the low-rank "
                "factors: train without halving, or with another qkv shape"
            )
        if self.strategy == "mask-all-but-one" and not self.steps and len(self.active) > 1:
            scores = random_scores(len(self.active), self.seed, 0)
            self._record(0, None, scores, keep_best(self.active, scores, 1))
        self.apply(model, optimizer)

    def after_validation(
        self,
        model: HookedTransformer,
        optimizer,
        epoch: int,
        val_accuracy: float,
        task: Task | None = None,
        train=None,
        val=None,
        scorer: Scorer | None = None,
        *,
        examples: int | None = None,
    ) -> dict[str, Any] | None:
        """Halve if ``val_accuracy`` reached the threshold and more than one head is active; return the step.
        ``examples``: how many validation examples the accuracy is a share of (default ``len(val)``), so the
        threshold is compared on counts (:meth:`reached`)."""
        if examples is None and val is not None:
            examples = len(val)
        if self.done or not self.reached(val_accuracy, examples):
            return None
        before = list(self.active)
        if self.strategy in SELF_SCORED:
            scores = random_scores(len(before), self.seed, len(self.steps) + 1)
        else:
            if scorer is None:
                raise ConfigError(
                    f"halving strategy {self.strategy!r} needs a scorer: train through "
                    "interp.analyses.halving.train_halving, or pass head_scorer=interp.analyses.halving.scorer(...)"
                )
            was_training = model.training
            model.eval()
            scores = [float(s) for s in scorer(model, task, before, train, val)]
            model.train(was_training)
        step = self._record(epoch, val_accuracy, scores, keep_best(before, scores, (len(before) + 1) // 2))
        self.apply(model, optimizer)
        return step

    def _record(self, epoch, val_accuracy, scores, kept) -> dict[str, Any]:
        before = list(self.active)
        step = {
            "epoch": int(epoch),
            "val_accuracy": val_accuracy,
            "before": [head_label(*h) for h in before],
            "kept": [head_label(*h) for h in kept],
            "masked": [head_label(*h) for h in before if h not in kept],
            "scores": {head_label(*h): float(s) for h, s in zip(before, scores)},
        }
        self.steps.append(step)
        self.active = list(kept)
        return step

    def summary(self) -> dict[str, Any]:
        """What goes in the checkpoint's training metadata: the schedule, the final mask, success."""
        return {
            "strategy": self.strategy,
            "threshold": self.threshold,
            "active": [head_label(*h) for h in self.active],
            "mask": self.mask.tolist(),
            "success": self.done,
            "n_steps": len(self.steps),
            "steps": self.steps,
        }

    # -- JSON round trip (resume files) ---------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        return {
            "strategy": self.strategy,
            "threshold": self.threshold,
            "n_layers": self.n_layers,
            "n_heads": self.n_heads,
            "seed": self.seed,
            "active": [head_label(*h) for h in self.active],
            "steps": self.steps,
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Halving:
        h = cls(
            d["strategy"],
            d["threshold"],
            d["n_layers"],
            d["n_heads"],
            d.get("seed", 0),
            active=[parse_head(s, d["n_layers"], d["n_heads"]) for s in d["active"]],
            steps=list(d["steps"]),
        )
        return h
