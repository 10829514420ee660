"""Attention interventions (Fraknói 2024, §5.4, Figure 8): set the ``=`` query's attention by hand and ask how well
each head's output then separates the answers.

The intervened attention row gives every token ``c`` in {0, 1, 2} the weight ``c_0 = w01``, ``c_1 = 1``,
``c_2 = w01 / w02`` (0 when ``w02 = inf``), normalised, and 0 to every other token ([BOS], '='), so that
``A(=->0)/A(=->1) = w01`` and ``A(=->0)/A(=->2) = w02`` exactly. A row with no weighted token (no 0s or 1s and
``w02 = inf``) attends to [BOS]. The head's output is then ``z = sum_t A(t) v(t)`` with its own value vectors.

- ``method="hooks"``: a ``hook_pattern`` hook replaces the answer row of the layer's pattern for a batch
  repeated once per setting, and ``hook_z`` is read at the answer position (any number of layers);
- ``method="fast"`` (exact; ``"auto"`` takes it): the answer row only mixes the layer's values ``v``, which the
  intervention does not change, so ``z' = A' v`` from one pass (``v`` straight from the model's modules
  for one-layer attention-only models, else ``run_with_cache``). Tested equal to ``"hooks"``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from jaxtyping import Float, Int
from torch import Tensor

from interp.device import check_device
from interp.errors import InterpError
from interp.evaluation import check_batch_size, map_chunks
from interp.heads import head_label
from interp.query_forward import layer0_inputs, supports_query_forward
from interp.results import Result, floats, jsonable
from interp.task import TaskData
from interp.tasks.noisy_majority import VOCAB

from ..answer_cache import check_model_data
from ..separation_accuracies import fit_separator
from . import require_task_data
from .attention_ratios import task_token_ids

if TYPE_CHECKING:
    from transformer_lens import HookedTransformer

    from interp.task import Task

W01_VALUES = (1 / 16, 1 / 4, 1 / 2, 1.0, 2.0, 4.0, 16.0)
W02_VALUES = (1 / 4, 1.0, 4.0, 16.0, 64.0, 256.0, math.inf)


def _check_settings(settings) -> list[tuple[float, float]]:
    out = []
    for s in settings:
        try:
            w01, w02 = (float(x) for x in s)
        except (TypeError, ValueError):
            raise InterpError(f"an intervention setting must be a pair (w01, w02), got {s!r}") from None
        if not (0 < w01 < math.inf) or not (0 < w02 <= math.inf):
            raise InterpError(f"intervention needs 0 < w01 < inf and 0 < w02 <= inf, got w01={w01}, w02={w02}")
        out.append((w01, w02))
    if not out:
        raise InterpError("no intervention settings were given; expected (w01, w02) pairs")
    return out


def intervention_rows(
    tokens: Int[Tensor, "batch pos"],
    answer_pos: Int[Tensor, " batch"],
    settings: Sequence[tuple[float, float]],
    token_ids: Sequence[int],
    bos_pos: int = 0,
) -> Float[Tensor, "setting batch pos"]:
    """The hand-set attention rows of the answer query, one per ``(w01, w02)`` setting (see module doc)."""
    zero, one, two = token_ids[:3]
    t = tokens.shape[1]
    before = torch.arange(t, device=tokens.device)[None] < answer_pos[:, None]
    rows = []
    for w01, w02 in settings:
        w = torch.zeros(tokens.shape, device=tokens.device)
        w = torch.where((tokens == zero) & before, w01, w)
        w = torch.where((tokens == one) & before, 1.0, w)
        w = torch.where((tokens == two) & before, 0.0 if math.isinf(w02) else w01 / w02, w)
        empty = w.sum(-1) == 0
        w[empty, bos_pos] = 1.0
        rows.append(w / w.sum(-1, keepdim=True))
    return torch.stack(rows)


def intervened_head_outputs(
    model: HookedTransformer,
    data: TaskData,
    *,
    settings,
    layer: int = 0,
    method: str = "auto",
    task: Task | None = None,
    batch_size: int | None = None,
    device: str | None = None,
) -> Float[Tensor, "setting batch head d_head"]:
    """Every head's output ``z`` at the answer position of layer ``layer`` under each intervention setting
    (``(w01, w02)`` pairs); ``batch_size``: examples per forward (the hook method repeats each once per setting)."""
    require_task_data(data)
    check_device(model, device)
    check_batch_size(batch_size)
    check_model_data(model, data, task)
    return _intervened(model, data, settings, layer, method, batch_size)


def _intervened(model: HookedTransformer, data: TaskData, settings, layer: int, method: str, batch_size) -> Tensor:
    settings = _check_settings(settings)
    if not (isinstance(layer, int) and 0 <= layer < model.cfg.n_layers):
        raise InterpError(f"layer must be in [0, {model.cfg.n_layers - 1}], got {layer!r}")
    if method not in ("auto", "fast", "hooks"):
        raise InterpError(f"unknown method {method!r}; expected 'auto', 'fast' or 'hooks'")
    ids = task_token_ids(data.vocab or VOCAB)
    fn = _hooks_chunk if method == "hooks" else _fast_chunk

    def one(chunk: TaskData) -> dict[str, Tensor]:
        rows = intervention_rows(chunk.tokens, chunk.answer_pos, settings, ids)
        with torch.inference_mode():
            return {"z": fn(model, chunk, rows, layer).transpose(0, 1)}  # [b, K, h, e]

    if batch_size is not None and method == "hooks":  # the hook path runs each example once per setting
        batch_size = max(1, batch_size // len(settings))
    return map_chunks(model, data, one, batch_size=batch_size)["z"].transpose(0, 1)


def _fast_chunk(model: HookedTransformer, chunk: TaskData, rows, layer: int):
    if layer == 0 and supports_query_forward(model):
        attn = model.blocks[0].attn
        _, h = layer0_inputs(model, chunk.tokens)
        v = torch.einsum("btd,hde->bthe", h, attn.W_V) + attn.b_V
    else:
        name = f"blocks.{layer}.attn.hook_v"
        _, cache = model.run_with_cache(chunk.tokens, names_filter=[name])
        v = cache[name]
    return torch.einsum("kbt,bthe->kbhe", rows.to(v.dtype), v)


def _hooks_chunk(model: HookedTransformer, chunk: TaskData, rows, layer: int):
    K, b, t = rows.shape
    idx = torch.arange(K * b, device=rows.device)
    ap = chunk.answer_pos.repeat(K)
    flat = rows.reshape(K * b, t)
    got = {}

    def set_row(pattern, hook):
        pattern = pattern.clone()
        pattern[idx, :, ap] = flat[:, None, :].to(pattern.dtype)
        return pattern

    def read_z(z, hook):
        got["z"] = z[idx, ap]

    model.run_with_hooks(
        chunk.tokens.repeat(K, 1),
        fwd_hooks=[(f"blocks.{layer}.attn.hook_pattern", set_row), (f"blocks.{layer}.attn.hook_z", read_z)],
    )
    return got["z"].view(K, b, *got["z"].shape[1:])


@dataclass(eq=False)
class InterventionSweep(Result):
    """Separation accuracy of every head of ``layer`` under hand-set attention: ``w01_accuracy[k, h]`` with
    ``w02 = inf`` and ``w01 = w01_values[k]``; ``w02_accuracy[k, h]`` with ``w01 = 1`` and ``w02 = w02_values[k]``."""

    w01_values: list[float]
    w02_values: list[float]
    w01_accuracy: Float[Tensor, "w01_setting head"]
    w02_accuracy: Float[Tensor, "w02_setting head"]
    n_train: int
    n_test: int
    layer: int = 0

    @property
    def w01_mean(self) -> Tensor:
        return self.w01_accuracy.mean(1)

    @property
    def w02_mean(self) -> Tensor:
        return self.w02_accuracy.mean(1)

    def to_dict(self) -> dict:
        H = self.w01_accuracy.shape[1]
        return jsonable(
            {
                "heads": [head_label(self.layer, h) for h in range(H)],
                "n_train": self.n_train,
                "n_test": self.n_test,
                "w02_inf": {
                    "w01": self.w01_values,
                    "mean_accuracy": self.w01_mean.tolist(),
                    "accuracy": self.w01_accuracy.tolist(),
                },
                "w01_one": {
                    "w02": [None if math.isinf(w) else w for w in self.w02_values],
                    "mean_accuracy": self.w02_mean.tolist(),
                    "accuracy": self.w02_accuracy.tolist(),
                },
                "layer": self.layer,
            }
        )

    @classmethod
    def from_dict(cls, d: dict) -> InterventionSweep:
        return cls(
            list(d["w02_inf"]["w01"]),
            [math.inf if w is None else w for w in d["w01_one"]["w02"]],
            floats(d["w02_inf"]["accuracy"], torch.float32),  # float32, as computed: the means are recomputed
            floats(d["w01_one"]["accuracy"], torch.float32),
            d["n_train"],
            d["n_test"],
            d.get("layer", 0),
        )

    def text(self) -> str:
        """The mean separation accuracy over the heads under each setting."""
        lines = [
            f"attention interventions on layer {self.layer} ({self.n_train} train / {self.n_test} test): mean "
            "separation accuracy over its heads"
        ]
        lines += [f"  w02 = inf, w01 = {w:g}: {float(a):.4f}" for w, a in zip(self.w01_values, self.w01_mean)]
        lines += [f"  w01 = 1, w02 = {w:g}: {float(a):.4f}" for w, a in zip(self.w02_values, self.w02_mean)]
        return "\n".join(lines)

    def figure(self):
        """The thesis's Figure 8: mean separation accuracy over heads against w01 (w02 = inf) and against w02 (w01 =
        1)."""
        import plotly.graph_objects as go
        from plotly.subplots import make_subplots

        fig = make_subplots(
            rows=1, cols=2, subplot_titles=("w02 = ∞ (2s ignored)", "w01 = 1 (0s and 1s weighted equally)")
        )
        fig.add_trace(
            go.Scatter(x=self.w01_values, y=self.w01_mean.tolist(), mode="lines+markers", name="w02 = ∞"), 1, 1
        )
        finite = [w for w in self.w02_values if not math.isinf(w)]
        top = max(finite) * 4 if finite else 1.0
        xs = [top if math.isinf(w) else w for w in self.w02_values]
        fig.add_trace(
            go.Scatter(
                x=xs,
                y=self.w02_mean.tolist(),
                mode="lines+markers",
                name="w01 = 1",
                text=["∞" if math.isinf(w) else f"{w:g}" for w in self.w02_values],
            ),
            1,
            2,
        )
        fig.update_xaxes(type="log", title_text="w01", row=1, col=1)
        fig.update_xaxes(type="log", title_text="w02 (rightmost point: ∞)", row=1, col=2)
        fig.update_yaxes(title_text="mean separation accuracy over heads", range=[0.4, 1.02])
        fig.update_layout(
            title=f"Attention interventions (Figure 8): {self.n_train} train / {self.n_test} test sequences",
            template="plotly_white",
            showlegend=False,
            width=900,
            height=420,
        )
        return fig


def attention_intervention_sweep(
    model: HookedTransformer,
    data: TaskData,
    *,
    train: TaskData | None = None,
    w01_values=W01_VALUES,
    w02_values=W02_VALUES,
    layer: int = 0,
    C: float = 1000.0,
    standardize: bool = False,
    center: bool = True,
    task: Task | None = None,
    batch_size: int | None = None,
    device: str | None = None,
) -> InterventionSweep:
    """Figure 8: the separation accuracy of each head of ``layer`` under each hand-set attention, separators fitted
    on ``train`` (default ``task.dataset("train")``) and scored on ``data``."""
    if train is None:
        if task is None:
            raise InterpError("the sweep fits its separators on a train split: pass train=... or task=...")
        train = task.dataset("train")
    for split in (train, data):
        require_task_data(split)
        check_model_data(model, split, task)
    check_device(model, device)
    check_batch_size(batch_size)
    test = data
    w01_values, w02_values = [float(w) for w in w01_values], [float(w) for w in w02_values]
    settings = [(w, math.inf) for w in w01_values] + [(1.0, w) for w in w02_values]
    z_tr = _intervened(model, train, settings, layer, "auto", batch_size).float().cpu()  # sklearn boundary
    z_te = _intervened(model, test, settings, layer, "auto", batch_size).float().cpu()
    y_tr, y_te = train.labels.cpu().numpy(), test.labels.cpu().numpy()
    H = z_tr.shape[2]
    acc = torch.tensor(
        [
            [
                fit_separator(
                    z_tr[k, :, h].numpy(),
                    y_tr,
                    z_te[k, :, h].numpy(),
                    y_te,
                    C=C,
                    standardize=standardize,
                    center=center,
                )["accuracy"]
                for h in range(H)
            ]
            for k in range(len(settings))
        ]
    )
    n1 = len(w01_values)
    return InterventionSweep(w01_values, w02_values, acc[:n1], acc[n1:], len(train), len(test), layer)
