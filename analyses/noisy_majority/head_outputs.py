"""Value vectors and head outputs (Fraknói 2024, §5.4, Figure 6).

For a head with ``d_head = 2`` the answer query's output ``z`` is a point in the plane: a convex combination
of the value vectors of the tokens it attends to. A good counting head puts its outputs on the segment
between ``v_0`` and ``v_1`` (ignoring 2s) at a place set by the share of 1s, so the answers ('4' blue, '5'
red) fall on two sides of a line; a bad one collapses them or mixes in ``v_2``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from jaxtyping import Float, Int
from torch import Tensor

from interp.attention import sync
from interp.device import check_device
from interp.errors import ConfigError, InterpError
from interp.heads import head_label, one_head
from interp.query_forward import token_inputs
from interp.results import Result, floats, jsonable
from interp.task import TaskData
from interp.tasks.noisy_majority import VOCAB

from ..answer_cache import AnswerCache, as_cache, check_inputs
from . import require_task_data
from .attention_ratios import DIGITS, task_token_ids

if TYPE_CHECKING:
    from transformer_lens import HookedTransformer


def value_vectors(
    model: HookedTransformer, *, heads: object, tokens=DIGITS, vocab=None, device: str | None = None
) -> Float[Tensor, "token d_head"]:
    """``v_t = ln1(W_E[t]) W_V + b_V`` of one layer-0 head (``heads="L0H3"``) for each token (exact for one-layer
    models without positional embedding, where a token's value does not depend on its position; refused
    otherwise)."""
    check_device(model, device)
    cfg = model.cfg
    layer, h = one_head(heads, cfg.n_layers, cfg.n_heads, "value_vectors")
    if layer != 0:
        raise ConfigError(f"value vectors per token exist only for layer-0 heads; got {head_label(layer, h)}")
    ids = task_token_ids(vocab or VOCAB, tuple(tokens))
    sync(model)  # a low-rank W_V from its current factors
    attn = model.blocks[0].attn
    with torch.inference_mode():
        return token_inputs(model, ids) @ attn.W_V[h] + attn.b_V[h]


@dataclass(eq=False)
class HeadOutputs(Result):
    """One head's outputs at the answer position on data, its value vectors and the right answers."""

    head: str
    outputs: Float[Tensor, "batch d_head"]
    labels: Int[Tensor, " batch"]
    values: Float[Tensor, "token d_head"] | None
    value_tokens: tuple[str, ...]
    label_names: dict[int, str]

    def figure(self, max_points: int = 2000):
        """Figure 6: the outputs coloured by the right answer, with the value vectors of 0, 1, 2."""
        import plotly.graph_objects as go

        if self.outputs.shape[1] != 2:
            raise InterpError(
                f"the Figure 6 scatter needs d_head = 2; head {self.head} has d_head = {self.outputs.shape[1]}"
            )
        out, lab = self.outputs[:max_points].float().cpu(), self.labels[:max_points].cpu()
        colors = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd"]
        fig = go.Figure()
        for i, cls in enumerate(sorted(set(lab.tolist()))):
            sel = lab == cls
            fig.add_trace(
                go.Scatter(
                    x=out[sel, 0].tolist(),
                    y=out[sel, 1].tolist(),
                    mode="markers",
                    marker=dict(size=5, opacity=0.6, color=colors[i % len(colors)]),
                    name=f"answer {self.label_names.get(cls, cls)}",
                )
            )
        if self.values is not None:
            v = self.values.float().cpu()
            fig.add_trace(
                go.Scatter(
                    x=v[:, 0].tolist(),
                    y=v[:, 1].tolist(),
                    mode="markers+text",
                    text=[f"v_{t}" for t in self.value_tokens],
                    textposition="top right",
                    marker=dict(size=13, symbol="x", color="black"),
                    name="value vectors",
                )
            )
        fig.update_layout(
            title=f"Head {self.head}: outputs at '=' and value vectors (Figure 6)",
            xaxis_title="z[0]",
            yaxis_title="z[1]",
            template="plotly_white",
            width=560,
            height=480,
        )
        return fig

    def to_dict(self) -> dict:
        return jsonable(
            {
                "head": self.head,
                "outputs": self.outputs,
                "labels": self.labels,
                "values": self.values,
                "value_tokens": self.value_tokens,
                "label_names": {str(k): v for k, v in self.label_names.items()},
            }
        )

    @classmethod
    def from_dict(cls, d: dict) -> HeadOutputs:
        return cls(
            d["head"],
            floats(d["outputs"]),
            torch.tensor(d["labels"], dtype=torch.long),
            None if d["values"] is None else floats(d["values"]),
            tuple(d["value_tokens"]),
            {int(k): v for k, v in d["label_names"].items()},
        )

    def text(self) -> str:
        """The mean output per right answer, and the value vectors."""
        lines = [f"head {self.head}: outputs at the answer position of {len(self.labels)} examples"]
        for cls in sorted(set(self.labels.tolist())):
            mean = self.outputs[self.labels == cls].float().mean(0)
            name = self.label_names.get(cls, cls)
            lines.append(f"  answer {name}: mean output {[round(x, 4) for x in mean.tolist()]}")
        if self.values is not None:
            for t, v in zip(self.value_tokens, self.values.float().tolist()):
                lines.append(f"  value vector v_{t}: {[round(x, 4) for x in v]}")
        return "\n".join(lines)


def head_outputs(
    model: HookedTransformer,
    data: TaskData | AnswerCache,
    *,
    heads: object,
    batch_size: int | None = None,
    device: str | None = None,
) -> HeadOutputs:
    """The outputs ``z`` of one head (``heads="L0H3"`` or ``(0, 3)``) at the answer position of every example."""
    cfg = model.cfg
    layer, h = one_head(heads, cfg.n_layers, cfg.n_heads, "head_outputs")
    require_task_data(data)
    check_inputs(model, data, device=device, batch_size=batch_size)
    cache = as_cache(model, data, attention=False, batch_size=batch_size)
    vocab = cache.vocab or VOCAB
    try:
        values = value_vectors(model, heads=(layer, h), vocab=vocab)
    except ConfigError:
        values = None
    names = dict(enumerate(vocab.tokens))
    return HeadOutputs(head_label(layer, h), cache.z[:, layer, h], cache.labels, values, DIGITS, names)
