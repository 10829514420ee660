"""Integer addition's hypotheses: the carry into each digit and each sum digit (Quirke and Barez 2024,
*Understanding Addition in Transformers*: base add, make carry 1, make sum 9 and their cascades).

The causal model of digit ``k`` (place value ``10**k``, units first): carries ``carry1 .. carryk`` with
``carry{i} = (a_{i-1} + b_{i-1} + carry{i-1} >= 10)`` (``carry0 = 0``), and the output ``digit{k} = (a_k + b_k +
carry{k}) mod 10`` (the leading digit ``n`` is ``carry{n}``), read where the model predicts that digit (teacher
forced: the earlier answer digits in the input are the base's). ``carry{k}``: interchange the carry into digit
``k``; ``digit{k}``: interchange the output digit itself (which site decides it). Sites: every head and the
residual stream between the layers at the digit's prediction position, each layer's attention and MLP outputs there,
and the residual stream at the previous answer position. Pairs share their operand length.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from interp.analyses.hypotheses import CausalModel, Hypothesis, Variable
from interp.heads import head_label
from interp.tasks.integer_addition import answer_positions

if TYPE_CHECKING:
    from transformer_lens import HookedTransformer

    from interp.task import Task, TaskData


def _carry(i: int):
    def carry(a, b, prev=None):
        s = a[:, i - 1] + b[:, i - 1] + (0 if prev is None else prev)
        return (s >= 10).long()

    return carry


def _digit(k: int, n: int):
    def digit(a, b, carry):
        if k >= n:
            return carry
        return (a[:, k] + b[:, k] + carry) % 10

    return digit


def positions(n: int) -> dict:
    """Named positions: ``out{k}`` where answer digit ``k`` is predicted (``k = 0 .. n``)."""

    def out(k: int):
        return lambda data: answer_positions(data)[:, k]

    return {f"out{k}": out(k) for k in range(n + 1)}


def digit_model(k: int, n: int) -> CausalModel:
    """The causal model of answer digit ``k`` of ``n``-digit sums (see the module docstring)."""
    variables: dict[str, Variable] = {}
    for i in range(1, k + 1):
        parents = ("a", "b") if i == 1 else ("a", "b", f"carry{i - 1}")
        variables[f"carry{i}"] = Variable(_carry(i), parents=parents)
    if k == 0:
        variables["digit0"] = Variable(lambda a, b: (a[:, 0] + b[:, 0]) % 10, parents=("a", "b"))
    else:
        variables[f"digit{k}"] = Variable(_digit(k, n), parents=("a", "b", f"carry{k}"))
    return CausalModel(
        variables,
        output=f"digit{k}",
        readout=f"out{k}",
        positions=positions(n),
        name=f"digit {k}",
        about=f"answer digit {k} is (a_{k} + b_{k} + carry into {k}) mod 10, the carry rippling from the units",
    )


def _sites(k: int):
    def sites(model: HookedTransformer) -> list[str]:
        cfg = model.cfg
        at = f"@out{k}"
        out = [f"{head_label(layer, h)}{at}" for layer in range(cfg.n_layers) for h in range(cfg.n_heads)]
        for layer in range(cfg.n_layers):
            out += [f"attn_out.{layer}{at}"] + ([] if cfg.attn_only else [f"mlp_out.{layer}{at}"])
            out.append(f"resid_post.{layer}{at}")
        if k > 0:
            out.append(f"resid_post.{cfg.n_layers - 1}@out{k - 1}")
        return out

    return sites


def _das_site(k: int):
    return lambda model: f"resid_post.{max(model.cfg.n_layers - 2, 0)}@out{k}"


def hypotheses(task: Task) -> dict[str, Hypothesis]:
    n = task.test_range[1]
    out: dict[str, Hypothesis] = {}
    for k in range(1, n + 1):
        cm = digit_model(k, n)
        out[f"carry{k}"] = Hypothesis(
            cm, f"carry{k}", _sites(k), _das_site(k), about=f"the carry into digit {k}", same=("n_digits",)
        )
    for k in range(n + 1):
        cm = digit_model(k, n)
        out[f"digit{k}"] = Hypothesis(
            cm, f"digit{k}", _sites(k), _das_site(k), about=f"answer digit {k} itself", same=("n_digits",)
        )
    return out


def data_of_length(data: TaskData, n: int) -> TaskData:
    """The examples of ``data`` with ``n``-digit operands (the hypotheses' positions assume one length)."""
    return data.select(data.fields["n_digits"] == n)
