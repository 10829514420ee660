"""Exact evaluations over the task's whole domain (all ``p**2`` pairs): attention from ``=`` to ``a`` vs ``b``, and
accuracy with heads or MLP neurons ablated (not a sample: every input the task has)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from jaxtyping import Float
from torch import Tensor

from interp.ablation import ablation_hooks
from interp.errors import InterpError
from interp.heads import head_label, head_mask
from interp.results import Result, floats, jsonable
from interp.visualize import attention_patterns

from .fourier import all_pairs, check_model

if TYPE_CHECKING:
    from transformer_lens import HookedTransformer

    from interp.task import Task


@dataclass(eq=False)
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

    @classmethod
    def from_dict(cls, d: dict) -> AttentionSplit:
        rows = d["heads"]
        return cls(*(floats([r[k] for r in rows]) for k in ("to_a", "to_b", "to_=", "a_share_std")))

    def text(self) -> str:
        """Each head's mean attention from ``=`` to ``a``, ``b`` and ``=``."""
        lines = ["attention from '=' (mean over all pairs): head, to a, to b, to =, std of a's share"]
        lines += [
            f"  {r['head']:<8}{r['to_a']:>8.3f}{r['to_b']:>8.3f}{r['to_=']:>8.3f}{r['a_share_std']:>8.3f}"
            for r in self.rows()
        ]
        return "\n".join(lines)

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


def attention_split(model: HookedTransformer, *, task: Task, device: str | None = None) -> AttentionSplit:
    """Attention from ``=`` to ``a``, ``b`` and ``=`` of every layer-0 head over all pairs."""
    dev = check_model(model, task, device)
    pat = attention_patterns(model, all_pairs(task, dev))[:, 0, :, -1, :].double()  # [pair, head, key]
    share = pat[..., 0] / (pat[..., 0] + pat[..., 1]).clamp_min(1e-12)
    return AttentionSplit(
        pat[..., 0].mean(0).cpu(), pat[..., 1].mean(0).cpu(), pat[..., 2].mean(0).cpu(), share.std(0).cpu()
    )


def ablated_accuracy(
    model: HookedTransformer,
    *,
    task: Task,
    ablated=(),
    neurons=(),
    ablation: str = "zero",
    device: str | None = None,
) -> float:
    """Accuracy over all ``p**2`` pairs with the heads ``ablated`` (e.g. ``['L0H1']``) and MLP ``neurons`` (indices
    in layer 0) switched off: ``"zero"`` sets their outputs to 0, ``"mean"`` to their mean over all pairs at ``=``."""
    return float(
        ablated_accuracies(model, task=task, ablations=[(ablated, neurons)], ablation=ablation, device=device)[0]
    )


def ablated_accuracies(
    model: HookedTransformer, *, task: Task, ablations, ablation: str = "zero", device: str | None = None
) -> Float[Tensor, " n"]:
    """:func:`ablated_accuracy` of each ``(ablated heads, neurons)`` in ``ablations``."""
    if ablation not in ("zero", "mean"):
        raise InterpError(f"unknown ablation {ablation!r}; expected 'zero' or 'mean'")
    device = check_model(model, task, device)
    cfg = model.cfg
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
    z_ref = None
    if ablation == "mean":  # [layer, head, d_head]: each head's mean output at '='
        z_ref = torch.stack([ref[f"blocks.{l}.attn.hook_z"] for l in range(cfg.n_layers)])
    out = []
    for heads, neurons in ablations:
        keep_mask = 1 - head_mask([list(heads)], cfg.n_layers, cfg.n_heads, device)[0]  # [layer, head], 1 = kept
        picked = [int(n) for n in neurons]
        if picked and (cfg.attn_only or min(picked) < 0 or max(picked) >= cfg.d_mlp):
            raise InterpError(f"neurons must be indices in [0, {(cfg.d_mlp or 0) - 1}] of an MLP model, got {picked}")
        hooks = ablation_hooks(model, keep_mask, z_ref)
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


@dataclass(eq=False)
class AblationTable(Result):
    """Exhaustive accuracy with each head ablated, and with the neurons of each frequency cluster ablated."""

    rows_: list

    def rows(self) -> list[dict]:
        return self.rows_

    def to_dict(self) -> dict:
        return jsonable({"ablations": self.rows_})

    @classmethod
    def from_dict(cls, d: dict) -> AblationTable:
        return cls([dict(r) for r in d["ablations"]])

    def text(self) -> str:
        """Accuracy over all pairs with each component ablated."""
        lines = ["exhaustive accuracy (all pairs) with components ablated"]
        lines += [f"  {r['ablated']:<36}{r['accuracy']:>8.4f} ({r['ablation']})" for r in self.rows_]
        return "\n".join(lines)


def ablation_table(
    model: HookedTransformer,
    *,
    task: Task,
    neuron_frequencies=None,
    ablation: str = "mean",
    device: str | None = None,
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
    acc = ablated_accuracies(
        model, task=task, ablations=[(h, n) for _, h, n in items], ablation=ablation, device=device
    )
    return AblationTable(
        [{"ablated": name, "accuracy": float(a), "ablation": ablation} for (name, _, _), a in zip(items, acc)]
    )
