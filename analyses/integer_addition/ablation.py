"""Which component matters for which answer digit and carry case: mean-ablation of each attention head and of each
group of MLP neurons, scored per answer digit (place value) and per carry case.

A head is mean-ablated through its output ``z`` (``hook_z``, before ``W_O``: :func:`interp.ablation.ablation_hooks`),
a group of neurons through their activations (``hook_post``); the mean is taken
over the data at each position (Quirke's mean ablation), so the data must hold sums of one operand length. Runs
through TransformerLens hooks, so any depth, MLPs and positional scheme work.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from torch import Tensor

from interp.ablation import ablation_hooks
from interp.device import check_device
from interp.errors import TaskError
from interp.evaluation import check_batch_size, predictions_and_loss
from interp.heads import head_label, head_mask
from interp.results import Result, floats, jsonable
from interp.task import TaskData
from interp.tasks.integer_addition import case_name, digit_correct

from ..answer_cache import check_model_data
from . import require_task_data

if TYPE_CHECKING:
    from transformer_lens import HookedTransformer


@dataclass(eq=False)
class DigitAblation(Result):
    """Accuracy per answer digit ``[component, digit]`` and per carry case ``[component, case]`` with each component
    mean-ablated (row names in ``components``; ``base`` rows: the intact model)."""

    components: list
    digit_accuracy: Tensor  # [component, digit]
    case_accuracy: Tensor  # [component, case]
    cases: list
    base_digit: Tensor  # [digit]
    base_case: Tensor  # [case]
    n: int

    def to_dict(self) -> dict:
        return jsonable(
            {
                "n": self.n,
                "cases": self.cases,
                "base": {"digit_accuracy": self.base_digit, "case_accuracy": self.base_case},
                "components": [
                    {"component": c, "digit_accuracy": d, "case_accuracy": k}
                    for c, d, k in zip(self.components, self.digit_accuracy, self.case_accuracy)
                ],
            }
        )

    @classmethod
    def from_dict(cls, d: dict) -> DigitAblation:
        rows = d["components"]
        return cls(
            [r["component"] for r in rows],
            floats([r["digit_accuracy"] for r in rows]),
            floats([r["case_accuracy"] for r in rows]),
            list(d["cases"]),
            floats(d["base"]["digit_accuracy"]),
            floats(d["base"]["case_accuracy"]),
            d["n"],
        )

    def drops(self) -> Tensor:
        """``[component, digit]`` accuracy lost by ablating each component."""
        return self.base_digit[None] - self.digit_accuracy

    def figure(self):
        from interp.visualize import heatmap

        return heatmap(
            self.drops(),
            [f"digit {i}" for i in range(self.drops().shape[1])],
            self.components,
            title="accuracy drop per answer digit (0 = units) when a component is mean-ablated",
            colorscale="Reds",
            zmid=None,
            zmin=0,
            zmax=1,
            text_fmt=".2f",
        )

    def case_figure(self):
        from interp.visualize import heatmap

        drop = self.base_case[None] - self.case_accuracy
        return heatmap(
            drop,
            self.cases,
            self.components,
            title="accuracy drop per carry case when a component is mean-ablated",
            colorscale="Reds",
            zmid=None,
            zmin=0,
            zmax=1,
            text_fmt=".2f",
        )

    def text(self, top: int = 6) -> str:
        drops = self.drops()
        order = drops.max(1).values.argsort(descending=True)[:top].tolist()
        lines = [
            f"mean-ablation on {self.n} sums; intact digit accuracy "
            + " ".join(f"{v:.3f}" for v in self.base_digit.tolist())
        ]
        for i in order:
            lines.append(
                f"  {self.components[i]:<10} digit accuracy "
                + " ".join(f"{v:.3f}" for v in self.digit_accuracy[i].tolist())
                + "  | by case "
                + ", ".join(f"{c} {v:.2f}" for c, v in zip(self.cases, self.case_accuracy[i].tolist()))
            )
        return "\n".join(lines)


def _scores(model: HookedTransformer, data: TaskData, hooks, case: Tensor, codes: list[int], batch_size=None):
    preds = predictions_and_loss(model, data, fwd_hooks=hooks, batch_size=batch_size)["preds"]
    ok = digit_correct(preds, data.to(preds.device)).cpu().float()
    valid = case >= 0
    digit = torch.stack([ok[valid[:, i], i].mean() for i in range(ok.shape[1])])
    by_case = torch.stack([ok[case == c].mean() for c in codes])
    return digit, by_case


def component_ablation(
    model: HookedTransformer,
    data: TaskData,
    *,
    neuron_groups: int = 4,
    batch_size: int | None = None,
    device: str | None = None,
) -> DigitAblation:
    """Mean-ablate every head (:func:`interp.ablation.ablation_hooks` with each head's mean output per position),
    and every MLP layer's neurons in ``neuron_groups`` equal groups, one at a time."""
    require_task_data(data)
    device = check_device(model, device)
    check_batch_size(batch_size)
    check_model_data(model, data)
    n = data.fields["n_digits"]
    if int(n.min()) != int(n.max()):
        raise TaskError(
            "component_ablation needs sums of one operand length (means are taken per position); "
            f"got lengths {sorted(set(n.tolist()))}"
        )
    cfg = model.cfg
    L, H = cfg.n_layers, cfg.n_heads
    data = data.to(device)
    names = [f"blocks.{l}.attn.hook_z" for l in range(L)] + (
        [] if cfg.attn_only else [f"blocks.{l}.mlp.hook_post" for l in range(L)]
    )
    with torch.inference_mode():
        _, cache = model.run_with_cache(data.tokens, names_filter=lambda name: name in names)
    means = {k: cache[k].mean(0) for k in names}  # [pos, head, d_head] / [pos, d_mlp]
    case = data.fields["digit_case"][:, : int(n.max()) + 1].cpu()
    codes = sorted(set(case[case >= 0].tolist()))
    base_digit, base_case = _scores(model, data, [], case, codes, batch_size)
    keep = 1 - head_mask([[(l, h)] for l in range(L) for h in range(H)], L, H, device=device)  # [component, L, H]
    z_means = torch.stack([means[f"blocks.{l}.attn.hook_z"] for l in range(L)])  # [layer, pos, head, d_head]

    def neuron_hook(lo, hi):
        def hook(post, hook):
            post = post.clone()
            post[..., lo:hi] = means[hook.name][None, :, lo:hi]
            return post

        return hook

    components, digit_rows, case_rows = [], [], []
    for i, (l, h) in enumerate((l, h) for l in range(L) for h in range(H)):
        d, c = _scores(model, data, ablation_hooks(model, keep[i], z_means), case, codes, batch_size)
        components.append(head_label(l, h))
        digit_rows.append(d)
        case_rows.append(c)
    if not cfg.attn_only:
        bounds = torch.linspace(0, cfg.d_mlp, neuron_groups + 1).round().long().tolist()
        for l in range(L):
            for g in range(neuron_groups):
                lo, hi = bounds[g], bounds[g + 1]
                hooks = [(f"blocks.{l}.mlp.hook_post", neuron_hook(lo, hi))]
                d, c = _scores(model, data, hooks, case, codes, batch_size)
                components.append(f"L{l}MLP[{lo}:{hi}]")
                digit_rows.append(d)
                case_rows.append(c)
    return DigitAblation(
        components,
        torch.stack(digit_rows),
        torch.stack(case_rows),
        [case_name(c) for c in codes],
        base_digit,
        base_case,
        len(data),
    )
