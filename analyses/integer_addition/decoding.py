"""Greedy decoding of an addition model: the model writes its own answer (and its own scratchpad, where the task
has one) token by token, and the final answer is scored.

Without a scratchpad, teacher-forced exact match (the task's ``accuracy``) equals greedy decoding's: if every answer
digit is right given the right earlier digits, greedy decoding writes exactly those digits, and the first wrong one
is written wrong either way. With a scratchpad (Lee et al. 2023, *Teaching Arithmetic to Small Transformers*) the
answer is read after steps the model wrote itself: a wrong step may still lead to a right answer, and a teacher-forced
answer after the right steps is no test of the model at all. So the final answer is scored here after greedy
decoding (exact match on the answer digits only, as Ibrahimli 2024 scores a scratchpad model), beside whether the
decoded steps were right.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from jaxtyping import Int
from torch import Tensor

from interp.device import check_device, model_device
from interp.evaluation import check_batch_size
from interp.results import Result, jsonable
from interp.task import IGNORE, TaskData
from interp.tasks.integer_addition import answer_positions

from ..answer_cache import check_model_data
from . import require_task_data

if TYPE_CHECKING:
    from transformer_lens import HookedTransformer


@dataclass(eq=False)
class GreedyDecoding(Result):
    """Exact match of the greedily decoded final answer, overall and per operand length, and how often the decoded
    scratchpad (where there is one) was right, and right answers after wrong steps."""

    exact_match: float
    steps_right: float | None  # None without a scratchpad
    right_after_wrong_steps: int  # answers right although a decoded step was wrong
    by_length: dict  # "n" -> {"exact_match", "steps_right", "n"}
    n: int

    def to_dict(self) -> dict:
        return jsonable(
            {
                "exact_match": self.exact_match,
                "steps_right": self.steps_right,
                "right_after_wrong_steps": self.right_after_wrong_steps,
                "by_length": self.by_length,
                "n": self.n,
            }
        )

    @classmethod
    def from_dict(cls, d: dict) -> GreedyDecoding:
        return cls(d["exact_match"], d["steps_right"], d["right_after_wrong_steps"], d["by_length"], d["n"])

    def text(self) -> str:
        steps = "" if self.steps_right is None else f"; scratchpad steps right {self.steps_right:.4f}"
        lengths = " ".join(f"{k}:{v['exact_match']:.4f}" for k, v in self.by_length.items())
        return (
            f"greedy decoding: final-answer exact match {self.exact_match:.4f} on {self.n} sums{steps}; right answers "
            f"after a wrong step: {self.right_after_wrong_steps}; by operand digits {lengths}"
        )

    def figure(self):
        import plotly.graph_objects as go

        keys = list(self.by_length)
        fig = go.Figure(go.Bar(x=keys, y=[self.by_length[k]["exact_match"] for k in keys], name="exact match"))
        fig.update_layout(
            xaxis_title="operand digits",
            yaxis_title="greedy exact match",
            yaxis_range=[0, 1.02],
            template="plotly_white",
            height=340,
            width=520,
        )
        return fig


def greedy_tokens(
    model: HookedTransformer, data: TaskData, *, batch_size: int | None = None, device: str | None = None
) -> Int[Tensor, "b p"]:
    """``data``'s tokens with every token the model writes (every target position's next token) replaced, in order,
    by the model's own argmax given what it wrote before: one forward per written token, ``batch_size`` sentences at a
    time (default: all)."""
    check_device(model, device)
    check_batch_size(batch_size)
    device = model_device(model)
    data = data.to(device)
    written = data.targets != IGNORE  # the positions whose prediction the model writes next
    order = torch.where(written, torch.arange(written.shape[1], device=device)[None], written.shape[1])
    order = order.sort(1).values  # per row: its written positions, then sentinels
    steps = int(written.sum(1).max())
    out = data.tokens.clone()
    size = batch_size or len(data)
    with torch.inference_mode():
        for start in range(0, len(data), size):
            rows = torch.arange(start, min(start + size, len(data)), device=device)
            tokens = out[rows]
            width = int(data.lengths[rows].max())
            tokens = tokens[:, :width]
            for k in range(steps):
                pos = order[rows, k]
                live = pos < written.shape[1]
                if not bool(live.any()):
                    break
                logits = model(tokens)
                at = pos.clamp(max=width - 2)
                pred = logits[torch.arange(len(rows), device=device), at].argmax(-1)
                r = live.nonzero().squeeze(1)
                tokens[r, at[r] + 1] = pred[r]
            out[rows, :width] = tokens
    return out


def greedy_exact_match(
    model: HookedTransformer, data: TaskData, *, batch_size: int | None = None, device: str | None = None
) -> GreedyDecoding:
    """Exact match of the final answer after greedy decoding (:func:`greedy_tokens`), per operand length, with how
    often the decoded scratchpad steps were right."""
    require_task_data(data)
    check_device(model, device)
    check_batch_size(batch_size)
    check_model_data(model, data)
    tokens = greedy_tokens(model, data, batch_size=batch_size).cpu()
    data = data.to("cpu")
    pos = answer_positions(data) + 1  # where answer digit 10**i is written
    case = data.fields["digit_case"][:, : pos.shape[1]]
    valid = case >= 0
    got = tokens.gather(1, pos.clamp(max=tokens.shape[1] - 1))
    right = ((got == data.fields["answer"][:, : pos.shape[1]]) | ~valid).all(1)
    first, start = data.fields["scratch_start"], data.fields["answer_start"]
    has_steps = bool((start > first).any())
    cols = torch.arange(tokens.shape[1])[None]
    in_steps = (cols >= first[:, None]) & (cols < start[:, None])
    steps_ok = ((tokens == data.tokens) | ~in_steps).all(1)
    n_digits = data.fields["n_digits"]
    by_length = {}
    for m in sorted(set(n_digits.tolist())):
        rows = n_digits == m
        by_length[str(m)] = {
            "exact_match": right[rows].float().mean().item(),
            "steps_right": steps_ok[rows].float().mean().item() if has_steps else None,
            "n": int(rows.sum()),
        }
    return GreedyDecoding(
        exact_match=right.float().mean().item(),
        steps_right=steps_ok.float().mean().item() if has_steps else None,
        right_after_wrong_steps=int((right & ~steps_ok).sum()),
        by_length=by_length,
        n=len(data),
    )
