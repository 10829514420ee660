"""Noisy majority's hypotheses (Fraknói 2024, §5): the model counts, ``diff = n0 - n1``, and answers its sign.

``diff``: the variable ``diff = n0 - n1`` and the output ``answer = '4' if diff >= 0 else '5'``, looked for in each
head's output at the '=' position alone, in every head of the last layer together, and in the residual stream
after each layer there; DAS looks for it in a subspace of the last layer's heads together. ``sign``: the same with
the variable ``sign = (diff >= 0)``. Under interchange the two give the same counterfactual output (the answer reads
only the sign), so their IIA is equal at every site: whether a site carries the magnitude too is a different
question (docs/hypotheses.md answers it on the shipped model with the DAS direction's coordinate).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from interp.analyses.hypotheses import CausalModel, Hypothesis
from interp.heads import head_label
from interp.tasks.noisy_majority import FIVE, FOUR

if TYPE_CHECKING:
    from transformer_lens import HookedTransformer

    from interp.task import Task


def diff_model() -> CausalModel:
    """``diff = n0 - n1``; ``answer = '4' if diff >= 0 else '5'`` (ties go to '4', as the task's labels do)."""
    return CausalModel(
        {"diff": lambda n0, n1: n0 - n1, "answer": lambda diff: torch.where(diff >= 0, FOUR, FIVE)},
        output="answer",
        name="diff",
        about="the heads carry the count difference n0 - n1 at '=', and the answer is its sign",
    )


def sign_model() -> CausalModel:
    """``sign = (n0 - n1 >= 0)``; ``answer = '4' if sign else '5'``."""
    return CausalModel(
        {"sign": lambda n0, n1: (n0 >= n1).long(), "answer": lambda sign: torch.where(sign > 0, FOUR, FIVE)},
        output="answer",
        name="sign",
        about="the heads carry only which count is larger",
    )


def head_sites(model: HookedTransformer) -> list[str]:
    """Each head alone at '=', every head of the last layer together, the residual stream after each layer."""
    cfg = model.cfg
    last = cfg.n_layers - 1
    heads = [f"{head_label(layer, h)}@answer" for layer in range(cfg.n_layers) for h in range(cfg.n_heads)]
    return [*heads, f"L{last}H*@answer", *(f"resid_post.{layer}@answer" for layer in range(cfg.n_layers))]


def all_heads(model: HookedTransformer) -> str:
    return f"L{model.cfg.n_layers - 1}H*@answer"


def hypotheses(task: Task) -> dict[str, Hypothesis]:
    return {
        "diff": Hypothesis(diff_model(), "diff", head_sites, all_heads, about=diff_model().about),
        "sign": Hypothesis(sign_model(), "sign", head_sites, all_heads, about=sign_model().about),
    }
