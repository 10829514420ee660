"""The compositionality gap of an addition model: how well it solves each sub-task of addition, read from its
residual stream by linear probes, against how well it solves the whole task.

Ibrahimli 2024 (*Compositional Generalization in Transformers*, chapter 4) splits integer addition into digit
alignment, digit-wise modular addition and carries, and defines the compositionality gap as the difference between
the performance on the sub-tasks and on the full task (after Press et al. 2023, *Measuring and Narrowing the
Compositionality Gap in Language Models*: how often every sub-problem is solved but the composed answer is wrong).
Here, at the position where the model predicts answer digit ``i`` (place value ``10**i``), a logistic-regression
probe per sub-task and residual-stream layer reads:

- ``alignment``: what the answer needs from the digit pair of place ``i``, its sum ``a_i + b_i`` (19 classes: the
  right pair was brought to the position and added; the digits themselves need not be kept);
- ``digit_sum``: the digit-wise sum without carries, ``(a_i + b_i) mod 10``;
- ``carry_detection``: whether the pair below makes a carry, ``a_{i-1} + b_{i-1} >= 10``;
- ``carry_in``: the carry into place ``i`` (made below, or passed on by a run of sum-9 pairs);
- ``carry_propagation``: the same probe, scored on the digits whose carry arrives through a sum-9 run (US9).

Each probe is fitted on ``train`` (70% of its digits; the layer with the best accuracy on the other 30% is kept) and
scored on ``data``; the embedding (``blocks.0.hook_resid_pre``) and every block's ``hook_resid_post`` are the layers
tried (each iteration of a looped model is a layer). Places without the sub-task (``alignment`` and ``digit_sum`` at
the leading carry digit, carries at the units) are left out of that sub-task. The answer digit is
``(digit_sum + carry_in) mod 10``, so where both probes are right the parts of the answer are in the residual stream:
the **gap** is the share of such digits that the model predicts wrong (teacher-forced), beside the share it predicts
right although a part is not linearly readable. A probe's accuracy is a lower bound on what the model represents
(a nonlinear code is missed), so a gap here means "the parts are readable, the answer is still wrong".
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from torch import Tensor

from interp.device import check_device
from interp.evaluation import check_batch_size, map_chunks
from interp.results import Result, jsonable
from interp.task import TaskData
from interp.tasks.integer_addition import answer_positions

from ..answer_cache import check_model_data
from . import require_task_data

if TYPE_CHECKING:
    from transformer_lens import HookedTransformer

SUBTASKS = ("alignment", "digit_sum", "carry_detection", "carry_in", "carry_propagation")
FIT_SHARE = 0.7  # of the train digits: fitted; the rest chooses the layer


@dataclass(eq=False)
class SubtaskProbes(Result):
    """Per sub-task: the held-out accuracy on ``data`` (overall and per operand length), the layer read and its
    selection accuracy; the model's own digit accuracy and exact match; and the compositionality gap."""

    subtasks: dict  # name -> {"accuracy", "layer", "select_accuracy", "n", "by_length": {n: accuracy}}
    digit_accuracy: float
    exact_match: float
    by_length: dict  # "n" -> {"digit_accuracy", "exact_match", "n"}
    gap: dict  # {"parts_right", "wrong_given_parts_right", "right_given_part_wrong", "n_digits"}
    layers: list

    def to_dict(self) -> dict:
        return jsonable(
            {
                "subtasks": self.subtasks,
                "digit_accuracy": self.digit_accuracy,
                "exact_match": self.exact_match,
                "by_length": self.by_length,
                "gap": self.gap,
                "layers": self.layers,
            }
        )

    @classmethod
    def from_dict(cls, d: dict) -> SubtaskProbes:
        return cls(d["subtasks"], d["digit_accuracy"], d["exact_match"], d["by_length"], d["gap"], d["layers"])

    def text(self) -> str:
        parts = ", ".join(f"{k} {v['accuracy']:.3f} ({v['layer']})" for k, v in self.subtasks.items())
        g = self.gap
        return (
            f"sub-task probes: {parts}; the model: digit accuracy {self.digit_accuracy:.3f}, exact match "
            f"{self.exact_match:.3f}; gap: of the {g['n_digits']} digits, {g['parts_right']:.3f} have digit sum and "
            f"carry readable, and the model gets {g['wrong_given_parts_right']:.3f} of those wrong; it gets "
            f"{g['right_given_part_wrong']:.3f} of the others right"
        )

    def figure(self):
        import plotly.graph_objects as go

        lengths = list(self.by_length)
        fig = go.Figure()
        for name, v in self.subtasks.items():
            fig.add_scatter(x=lengths, y=[v["by_length"].get(k) for k in lengths], mode="lines+markers", name=name)
        fig.add_scatter(
            x=lengths,
            y=[self.by_length[k]["digit_accuracy"] for k in lengths],
            mode="lines+markers",
            name="model: digit accuracy",
            line=dict(color="black", dash="dash"),
        )
        fig.update_layout(
            xaxis_title="operand digits",
            yaxis_title="accuracy",
            yaxis_range=[0, 1.02],
            template="plotly_white",
            height=380,
            width=640,
        )
        return fig


def _layer_names(model: HookedTransformer) -> list[tuple[str, str]]:
    names = [("embed", "blocks.0.hook_resid_pre")]
    return names + [(f"L{l}", f"blocks.{l}.hook_resid_post") for l in range(model.cfg.n_layers)]


def _features(model: HookedTransformer, data: TaskData, batch_size: int | None) -> tuple[Tensor, Tensor]:
    """``[layer, example, digit, d_model]`` residual streams at the positions predicting each answer digit, and the
    model's teacher-forced argmax there ``[example, digit]``."""
    sites = [name for _, name in _layer_names(model)]
    width = int(data.fields["n_digits"].max()) + 1

    def fn(chunk: TaskData) -> dict[str, Tensor]:
        pos = answer_positions(chunk)  # a chunk's columns beyond its longest answer repeat the last position
        pos = torch.cat([pos, pos[:, -1:].expand(-1, width - pos.shape[1])], 1)
        with torch.inference_mode():
            logits, cache = model.run_with_cache(chunk.tokens, names_filter=lambda n: n in sites)
        rows = torch.arange(len(chunk), device=pos.device)[:, None]
        feats = torch.stack([cache[s][rows, pos] for s in sites], 1)  # [b, layer, digit, d]
        return {"features": feats, "preds": logits.argmax(-1)[rows, pos]}

    out = map_chunks(model, data, fn, batch_size=batch_size)
    return out["features"].transpose(0, 1).float().cpu(), out["preds"].cpu()


def _labels(data: TaskData) -> dict[str, tuple[Tensor, Tensor]]:
    """Per sub-task: labels ``[example, digit]`` and where they apply ``[example, digit]`` (bool)."""
    f = {k: v.cpu() for k, v in data.fields.items()}
    width = int(f["n_digits"].max()) + 1
    place = torch.arange(width)[None]
    n = f["n_digits"][:, None]
    a = torch.nn.functional.pad(f["a"], (0, max(0, width - f["a"].shape[1])))[:, :width]
    b = torch.nn.functional.pad(f["b"], (0, max(0, width - f["b"].shape[1])))[:, :width]
    below = torch.nn.functional.pad(a + b, (1, 0))[:, :width]  # the pair sum of place i - 1
    operand = place < n
    carried = (place >= 1) & (place <= n)
    carry_in = f["carries"][:, :width]
    return {
        "alignment": (a + b, operand),
        "digit_sum": ((a + b) % 10, operand),
        "carry_detection": ((below >= 10).long(), carried),
        "carry_in": (carry_in, carried),
    }


def _fit_layers(x_fit: Tensor, y_fit: Tensor, x_sel: Tensor, y_sel: Tensor):
    """The logistic-regression probe of each layer (features ``[layer, rows, d]``), and the layer whose probe is most
    accurate on the selection rows: ``(probes, best layer index, its selection accuracy)``."""
    import warnings

    from sklearn.exceptions import ConvergenceWarning
    from sklearn.linear_model import LogisticRegression
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    probes, scores = [], []
    for layer in range(x_fit.shape[0]):
        if len(torch.unique(y_fit)) < 2:  # one class only: the probe is that class
            probes.append(int(y_fit[0]))
            scores.append(float((y_sel == int(y_fit[0])).float().mean()) if len(y_sel) else 0.0)
            continue
        probe = make_pipeline(StandardScaler(), LogisticRegression(max_iter=500))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ConvergenceWarning)
            probe.fit(x_fit[layer].numpy(), y_fit.numpy())
        probes.append(probe)
        scores.append(float((torch.as_tensor(probe.predict(x_sel[layer].numpy())) == y_sel).float().mean()))
    best = max(range(len(scores)), key=lambda i: (scores[i], -i))  # ties: the earlier layer
    return probes, best, scores[best]


def _predict(probe, x: Tensor) -> Tensor:
    if isinstance(probe, int):
        return torch.full((x.shape[0],), probe)
    return torch.as_tensor(probe.predict(x.numpy()))


def subtask_probes(
    model: HookedTransformer,
    data: TaskData,
    *,
    train: TaskData,
    batch_size: int | None = None,
    device: str | None = None,
) -> SubtaskProbes:
    """Sub-task accuracies read by linear probes (fitted on ``train``, scored on ``data``), the model's own accuracy,
    and the compositionality gap (see the module's docstring). ``data`` may hold operand lengths ``train`` does not:
    the probes then test whether the sub-tasks stay readable at unseen lengths."""
    require_task_data(data)
    require_task_data(train)
    check_device(model, device)
    check_batch_size(batch_size)
    check_model_data(model, data)
    check_model_data(model, train)
    names = [label for label, _ in _layer_names(model)]
    x_train, _ = _features(model, train, batch_size)
    x_data, preds = _features(model, data, batch_size)
    y_train, y_data = _labels(train.to("cpu")), _labels(data.to("cpu"))
    gen = torch.Generator().manual_seed(0)
    fit_rows = torch.rand(x_train.shape[1], generator=gen) < FIT_SHARE  # by sum, so a sum's digits stay together
    n_data = data.fields["n_digits"].cpu()
    right: dict[str, Tensor] = {}  # per probe: [example, digit] bool, right where it applies
    chosen: dict[str, tuple[str, float]] = {}
    for key, (y_tr, m_tr) in y_train.items():
        y_da, m_da = y_data[key]
        w = min(m_tr.shape[1], x_train.shape[2])
        fit = m_tr[:, :w] & fit_rows[:, None]
        sel = m_tr[:, :w] & ~fit_rows[:, None]
        x_fit, x_sel = x_train[:, :, :w][:, fit], x_train[:, :, :w][:, sel]
        probes, best, score = _fit_layers(x_fit, y_tr[:, :w][fit], x_sel, y_tr[:, :w][sel])
        got = torch.zeros_like(m_da)
        where = m_da.nonzero(as_tuple=True)
        got[where] = _predict(probes[best], x_data[best][where]) == y_da[where]
        right[key] = got
        chosen[key] = (names[best], score)
    _, m_operand = y_data["digit_sum"]
    _, m_carried = y_data["carry_in"]
    case = data.fields["digit_case"].cpu()[:, : m_operand.shape[1]]
    valid = case >= 0
    width = valid.shape[1]
    model_right = (preds[:, :width] == data.fields["answer"].cpu()[:, :width]) & valid
    oks = {
        "alignment": (right["alignment"], m_operand),
        "digit_sum": (right["digit_sum"], m_operand),
        "carry_detection": (right["carry_detection"], y_data["carry_detection"][1]),
        "carry_in": (right["carry_in"], m_carried),
        "carry_propagation": (right["carry_in"], m_carried & (case >= 2)),
    }
    probe_of = {"carry_propagation": "carry_in"}
    subtasks = {}
    lengths = sorted(set(n_data.tolist()))
    for name, (ok, mask) in oks.items():
        layer, score = chosen[probe_of.get(name, name)]
        by_length = {}
        for m in lengths:
            rows = (n_data == m)[:, None] & mask
            by_length[str(m)] = ok[rows].float().mean().item() if bool(rows.any()) else None
        subtasks[name] = {
            "accuracy": ok[mask].float().mean().item() if bool(mask.any()) else None,
            "layer": layer,
            "select_accuracy": score,
            "n": int(mask.sum()),
            "by_length": by_length,
        }
    # the parts of an answer digit: its digit sum (not at the leading digit) and its carry in (not at the units)
    parts = (right["digit_sum"] | ~m_operand) & (right["carry_in"] | ~m_carried) & valid
    exact = (model_right | ~valid).all(1)
    wrong_given = (~model_right & parts).sum() / parts.sum().clamp(min=1)
    others = valid & ~parts
    right_given = (model_right & others).sum() / others.sum().clamp(min=1)
    gap = {
        "parts_right": (parts.sum() / valid.sum()).item(),
        "wrong_given_parts_right": wrong_given.item(),
        "right_given_part_wrong": right_given.item(),
        "n_digits": int(valid.sum()),
    }
    by_length = {}
    for m in lengths:
        rows = n_data == m
        by_length[str(m)] = {
            "digit_accuracy": model_right[rows][valid[rows]].float().mean().item(),
            "exact_match": exact[rows].float().mean().item(),
            "n": int(rows.sum()),
        }
    return SubtaskProbes(
        subtasks=subtasks,
        digit_accuracy=model_right[valid].float().mean().item(),
        exact_match=exact.float().mean().item(),
        by_length=by_length,
        gap=gap,
        layers=names,
    )
