"""Modular addition's hypotheses: the operands ``a`` and ``b`` and the answer ``(a + b) mod p``.

``a`` (and ``b``): where does the model hold the first (second) operand on its way to the answer? Interchanging
``a`` gives the counterfactual answer ``(a_source + b_base) mod p``; the sites are each head's output at '=', the
attention and MLP outputs there and the residual stream after the layer (the embedding of ``a`` at its own position
carries it trivially). Nanda et al. 2023 (*Progress Measures for Grokking via Mechanistic Interpretability*) find the
operands mixed into Fourier features by the attention layer, so no single head need carry one operand alone.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from interp.analyses.hypotheses import CausalModel, Hypothesis
from interp.heads import head_label

if TYPE_CHECKING:
    from transformer_lens import HookedTransformer

    from interp.task import Task


def sum_model(p: int) -> CausalModel:
    return CausalModel(
        {"a": lambda a: a, "b": lambda b: b, "answer": lambda a, b: (a + b) % p},
        output="answer",
        name="modular sum",
        about=f"the answer is (a + b) mod {p}",
    )


def _sites(model: HookedTransformer) -> list[str]:
    cfg = model.cfg
    out = [f"{head_label(layer, h)}@answer" for layer in range(cfg.n_layers) for h in range(cfg.n_heads)]
    for layer in range(cfg.n_layers):
        out += [f"attn_out.{layer}@answer"] + ([] if cfg.attn_only else [f"mlp_out.{layer}@answer"])
        out.append(f"resid_post.{layer}@answer")
    return out


def hypotheses(task: Task) -> dict[str, Hypothesis]:
    cm = sum_model(task.p)
    return {
        "a": Hypothesis(cm, "a", _sites, "attn_out.0@answer", about="the first operand"),
        "b": Hypothesis(cm, "b", _sites, "attn_out.0@answer", about="the second operand"),
    }
