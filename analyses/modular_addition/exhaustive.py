"""Exact evaluations over the task's whole domain (all ``p**2`` pairs): attention from ``=`` to ``a`` vs ``b``, and
accuracy with heads or MLP neurons ablated (not a sample: every input the task has)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from jaxtyping import Float
from torch import Tensor

from interp.errors import InterpError
from interp.heads import head_label, head_mask
from interp.results import Result, jsonable
from interp.task import check_model_task
from interp.visualize import attention_patterns

from .fourier import all_pairs

if TYPE_CHECKING:
    from transformer_lens import HookedTransformer

    from interp.task import Task


@dataclass
class AttentionSplit(Result):
    """Mean attention of each head from ``=`` to ``a``, ``b`` and ``=`` itself over all pairs, and the spread of the
    ``a`` share (a head that adds ``a`` and ``b`` symmetrically sits near 0.5 / 0.5)."""

    to_a: Tensor  # [head]
    to_b: Tensor
    to_eq: Tensor
    a_share_std: Tensor  # [head] std over pairs of attention(a) / (attention(a) + attention(b))

    def rows(self) -> list[dict]:
        return [
            {
                "head": head_label(0, h),
                "to_a": float(self.to_a[h]),
                "to_b": float(self.to_b[h]),
                "to_=": float(self.to_eq[h]),
                "a_share_std": float(self.a_share_std[h]),
            }
            for h in range(len(self.to_a))
        ]

    def to_dict(self) -> dict:
        return jsonable({"heads": self.rows()})

    def figure(self):
        import plotly.graph_objects as go

        heads = [r["head"] for r in self.rows()]
        fig = go.Figure(
            [go.Bar(name=n, x=heads, y=v.tolist()) for n, v in (("a", self.to_a), ("b", self.to_b), ("=", self.to_eq))]
        )
        fig.update_layout(
            barmode="stack",
            title="Attention from '=' (mean over all pairs)",
            yaxis_title="attention",
            template="plotly_white",
            height=320,
            width=560,
        )
        return fig


def attention_split(model: HookedTransformer, task: Task) -> AttentionSplit:
    """Attention from ``=`` to ``a``, ``b`` and ``=`` of every layer-0 head over all pairs."""
    check_model_task(model, task)
    pat = attention_patterns(model, all_pairs(task, model.W_E.device))[:, 0, :, -1, :].double()  # [pair, head, key]
    share = pat[..., 0] / (pat[..., 0] + pat[..., 1]).clamp_min(1e-12)
    return AttentionSplit(
        pat[..., 0].mean(0).cpu(), pat[..., 1].mean(0).cpu(), pat[..., 2].mean(0).cpu(), share.std(0).cpu()
    )


def ablated_accuracy(model: HookedTransformer, task: Task, heads=(), neurons=(), ablation: str = "zero") -> float:
    """Accuracy over all ``p**2`` pairs with ``heads`` (e.g. ``['L0H1']``) and MLP ``neurons`` (indices in layer 0)
    ablated: ``"zero"`` sets their outputs to 0, ``"mean"`` to their mean over all pairs at ``=``."""
    return float(ablated_accuracies(model, task, [(heads, neurons)], ablation)[0])


def ablated_accuracies(model: HookedTransformer, task: Task, ablations, ablation: str = "zero") -> Float[Tensor, " n"]:
    """:func:`ablated_accuracy` of each ``(heads, neurons)`` in ``ablations``."""
    if ablation not in ("zero", "mean"):
        raise InterpError(f"unknown ablation {ablation!r}; expected 'zero' or 'mean'")
    check_model_task(model, task)
    cfg = model.cfg
    device = model.W_E.device
    tokens = all_pairs(task, device)
    labels = task.dataset("all").labels.to(device)
    ref = {}
    if ablation == "mean":

        def keep(x, hook):
            ref[hook.name] = x[:, -1].mean(0)

        names = [f"blocks.{l}.attn.hook_z" for l in range(cfg.n_layers)]
        names += [] if cfg.attn_only else [f"blocks.{l}.mlp.hook_post" for l in range(cfg.n_layers)]
        with torch.inference_mode():
            model.run_with_hooks(tokens, fwd_hooks=[(n, keep) for n in names], return_type=None)
    out = []
    for heads, neurons in ablations:
        hm = head_mask([list(heads)], cfg.n_layers, cfg.n_heads, device)[0]  # [layer, head]
        picked = [int(n) for n in neurons]
        if picked and (cfg.attn_only or min(picked) < 0 or max(picked) >= cfg.d_mlp):
            raise InterpError(f"neurons must be indices in [0, {(cfg.d_mlp or 0) - 1}] of an MLP model, got {picked}")
        hooks = []
        for l in range(cfg.n_layers):
            if hm[l].any():

                def z_hook(z, hook, m=hm[l]):
                    r = ref.get(hook.name)
                    keep = (1 - m)[None, None, :, None]
                    return z * keep + (0 if r is None else r[None, None] * (1 - keep))

                hooks.append((f"blocks.{l}.attn.hook_z", z_hook))
        if picked:
            idx = torch.tensor(picked, device=device)

            def n_hook(x, hook, idx=idx):
                x = x.clone()
                r = ref.get(hook.name)
                x[..., idx] = 0 if r is None else r[idx]
                return x

            hooks.append(("blocks.0.mlp.hook_post", n_hook))
        with torch.inference_mode():
            logits = model.run_with_hooks(tokens, fwd_hooks=hooks)[:, -1]
        out.append((logits.argmax(-1) == labels).float().mean())
    return torch.stack(out).cpu()


@dataclass
class AblationTable(Result):
    """Exhaustive accuracy with each head ablated, and with the neurons of each frequency cluster ablated."""

    rows_: list

    def rows(self) -> list[dict]:
        return self.rows_

    def to_dict(self) -> dict:
        return jsonable({"ablations": self.rows_})


def ablation_table(
    model: HookedTransformer, task: Task, neuron_frequencies=None, ablation: str = "mean"
) -> AblationTable:
    """Every head alone, all heads, and (given :class:`NeuronFrequencies`) each key frequency's neurons, ablated."""
    n_heads = model.cfg.n_heads
    items = [("none", (), ())] + [(head_label(0, h), [(0, h)], ()) for h in range(n_heads)]
    items.append(("all heads", [(0, h) for h in range(n_heads)], ()))
    if neuron_frequencies is not None:
        for k in neuron_frequencies.key_frequencies:
            idx = (
                torch.nonzero(
                    (neuron_frequencies.dominant == k) & (neuron_frequencies.fraction >= neuron_frequencies.threshold)
                )
                .flatten()
                .tolist()
            )
            if idx:
                items.append((f"neurons of frequency {k} ({len(idx)})", (), idx))
    acc = ablated_accuracies(model, task, [(h, n) for _, h, n in items], ablation)
    return AblationTable(
        [{"ablated": name, "accuracy": float(a), "ablation": ablation} for (name, _, _), a in zip(items, acc)]
    )
