"""The spectrum of attention patterns: is attention low-rank, as Wang et al. 2020 (*Linformer: Self-Attention with
Linear Complexity*) found for BERT and RoBERTa, in the small models we train? (Conti, *The Math behind
transformers*, §2.1.3.)

:func:`attention_spectrum` takes each head's attention matrix ``P`` (``hook_pattern``, ``[query, key]`` over the
``T`` real tokens of an input) on a task's inputs and reports

- its singular values ``σ_1 >= σ_2 >= ..``, as the normalised cumulative energy ``E_k = Σ_{i<=k} σ_i² / Σ_i σ_i²``
  (the share of ``‖P‖_F²`` its best rank-``k`` approximation keeps, Eckart-Young), averaged over the inputs;
- the rank that holds 90% of the energy (the smallest ``k`` with ``E_k >= 0.9``), per input, averaged, and as a
  fraction of ``T``;
- the causal test: every head's ``P`` replaced at ``hook_pattern`` by its best rank-``k`` approximation (truncated
  SVD of the ``T x T`` block of each input; padding rows untouched), projected back onto the patterns the layer can
  produce (:func:`project_pattern`: a rank-``k`` approximation of a causal or masked pattern is neither causal nor
  masked, nor non-negative, and without the projection it puts weight on future keys and on keys a sparse mask
  hides, up to most of a row under ``window:16+random:4``), for ``k = 1, 2, 4, ..`` up to the longest input (where
  it is ``P`` itself), and the task metric measured under each: how much rank the task needs, which the energy
  alone does not say (a pattern can keep 99% of its energy and lose the one entry that matters).

Works on any model and any attention variant of :mod:`interp.attention` (the pattern is whatever ``hook_pattern``
holds: sparse masks' holes, linear and additive poolings included). Causal patterns are lower-triangular with rows
summing to 1, so ``P`` has full rank ``T`` whenever its diagonal is positive; a low 90%-rank means the energy is
concentrated, not that ``P`` is singular.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch
from jaxtyping import Bool, Float
from torch import Tensor

from interp.device import check_device, model_device
from interp.errors import InterpError
from interp.evaluation import DEFAULT_BUDGET, check_batch_size, map_chunks, per_position_loss
from interp.heads import head_label
from interp.results import Result, floats, jsonable
from interp.task import IGNORE, TaskData

from .answer_cache import check_model_data

if TYPE_CHECKING:
    from transformer_lens import HookedTransformer

    from interp.task import Task

ENERGY = 0.9


@dataclass(eq=False)
class AttentionSpectrum(Result):
    """Singular-value energy of every head's attention pattern and the rank-``k`` causal test (module doc).

    ``energy[l, h, k-1]``: mean over inputs of ``E_k`` (1 beyond an input's length). ``rank90[l, h]``: mean rank
    holding :data:`ENERGY` of the energy; ``rank90_fraction[l, h]``: the same over ``T``. ``ks`` and
    ``accuracy[i]`` / ``loss[i]``: the task metric with every head at rank ``ks[i]``; ``full_accuracy`` without
    intervention; ``per_head_accuracy[l, h, i]`` (when asked): only head ``(l, h)`` at rank ``ks[i]``."""

    energy: Float[Tensor, "layer head rank"]
    rank90: Float[Tensor, "layer head"]
    rank90_fraction: Float[Tensor, "layer head"]
    mean_length: float
    n_inputs: int
    ks: list[int] = field(default_factory=list)
    accuracy: Float[Tensor, " k"] | None = None
    loss: Float[Tensor, " k"] | None = None
    full_accuracy: float | None = None
    full_loss: float | None = None
    per_head_accuracy: Float[Tensor, "layer head k"] | None = None
    metric: str = "accuracy"

    def rank_needed(self, tolerance: float = 0.0) -> int | None:
        """The smallest tested ``k`` whose accuracy is within ``tolerance`` of the unmodified model's (None if none
        is, or no causal test was run)."""
        if self.accuracy is None or self.full_accuracy is None:
            return None
        ok = [k for k, a in zip(self.ks, self.accuracy.tolist()) if a >= self.full_accuracy - tolerance]
        return min(ok) if ok else None

    def rows(self) -> list[dict]:
        L, H = self.rank90.shape
        out = []
        for l in range(L):
            for h in range(H):
                e = self.energy[l, h]
                row = {
                    "head": head_label(l, h),
                    "rank90": float(self.rank90[l, h]),
                    "rank90_fraction": float(self.rank90_fraction[l, h]),
                    "energy_k1": float(e[0]),
                    "energy_k2": float(e[min(1, len(e) - 1)]),
                    "energy_k4": float(e[min(3, len(e) - 1)]),
                }
                if self.per_head_accuracy is not None:
                    for i, k in enumerate(self.ks):
                        row[f"accuracy_k{k}"] = float(self.per_head_accuracy[l, h, i])
                out.append(row)
        return out

    def to_dict(self) -> dict:
        return jsonable(
            {
                "n_inputs": self.n_inputs,
                "mean_length": self.mean_length,
                "energy_threshold": ENERGY,
                "metric": self.metric,
                "energy": self.energy,
                "heads": self.rows(),
                "causal_test": None
                if self.accuracy is None
                else {
                    "ks": self.ks,
                    self.metric: self.accuracy,
                    "loss": self.loss,
                    f"full_{self.metric}": self.full_accuracy,
                    "full_loss": self.full_loss,
                    "rank_needed": self.rank_needed(),
                    "rank_within_0.01": self.rank_needed(0.01),
                },
            }
        )

    @classmethod
    def from_dict(cls, d: dict) -> AttentionSpectrum:
        rows, f32 = d["heads"], torch.float32  # float32, as computed: the rows are recomputed from the tensors
        energy = floats(d["energy"], f32)
        L, H = energy.shape[:2]
        res = cls(
            energy=energy,
            rank90=floats([r["rank90"] for r in rows], f32).view(L, H),
            rank90_fraction=floats([r["rank90_fraction"] for r in rows], f32).view(L, H),
            mean_length=d["mean_length"],
            n_inputs=d["n_inputs"],
            metric=d.get("metric", "accuracy"),
        )
        test = d["causal_test"]
        if test is not None:
            res.ks = list(test["ks"])
            res.accuracy, res.loss = floats(test[res.metric], f32), floats(test["loss"], f32)
            res.full_accuracy, res.full_loss = test[f"full_{res.metric}"], test["full_loss"]
            if "accuracy_k" + str(res.ks[0]) in rows[0]:
                per = [[r[f"accuracy_k{k}"] for k in res.ks] for r in rows]
                res.per_head_accuracy = floats(per, f32).view(L, H, len(res.ks))
        return res

    def text(self) -> str:
        """The rank holding 90% of each head's pattern energy and, with the causal test, the metric per rank."""
        lines = [
            f"attention spectrum on {self.n_inputs} inputs of mean length {self.mean_length:.1f}: rank holding "
            f"{ENERGY:.0%} of each head's pattern energy"
        ]
        lines += [
            f"  {r['head']:<8}{r['rank90']:>8.2f} ({r['rank90_fraction']:.2f} of the length)" for r in self.rows()
        ]
        if self.accuracy is not None:
            lines.append(
                f"{self.metric} with every head at rank k (full {self.full_accuracy:.4f}): "
                + ", ".join(f"k={k} {a:.4f}" for k, a in zip(self.ks, self.accuracy.tolist()))
            )
        return "\n".join(lines)

    def table_html(self) -> str:
        from interp.visualize import render_table

        cols = ["head", "rank90", "rank90_fraction", "energy_k1", "energy_k2", "energy_k4"]
        return render_table(
            self.rows(),
            cols,
            float_format=".3f",
            caption=f"{self.n_inputs} inputs of mean length {self.mean_length:.1f}: the rank that holds "
            f"{ENERGY:.0%} of each head's pattern energy, and the energy of its best rank-1, 2 and 4 approximations",
        )

    def figure(self):
        import plotly.graph_objects as go
        from plotly.subplots import make_subplots

        L, H, R = self.energy.shape
        test = self.accuracy is not None
        fig = make_subplots(
            rows=1,
            cols=2 if test else 1,
            subplot_titles=[
                "normalised cumulative energy of P",
                *([f"{self.metric} with every head's P at rank k"] if test else []),
            ],
        )
        ks = list(range(1, R + 1))
        for l in range(L):
            for h in range(H):
                fig.add_trace(
                    go.Scatter(
                        x=ks,
                        y=self.energy[l, h].tolist(),
                        mode="lines",
                        name=head_label(l, h),
                        legendgroup="energy",
                        showlegend=L * H <= 16,
                    ),
                    row=1,
                    col=1,
                )
        fig.add_hline(y=ENERGY, line_dash="dot", line_color="grey", row=1, col=1)
        fig.update_xaxes(type="log", title_text="rank k", row=1, col=1)
        fig.update_yaxes(range=[0, 1.02], row=1, col=1)
        if test:
            fig.add_trace(
                go.Scatter(x=self.ks, y=self.accuracy.tolist(), mode="lines+markers", name=f"{self.metric} at rank k"),
                row=1,
                col=2,
            )
            if self.full_accuracy is not None:
                fig.add_hline(y=self.full_accuracy, line_dash="dot", line_color="black", row=1, col=2)
            fig.update_xaxes(type="log", title_text="rank k", row=1, col=2)
        fig.update_layout(
            title="Attention spectrum (Wang et al. 2020, Linformer)",
            template="plotly_white",
            width=980 if test else 560,
            height=420,
        )
        return fig


def _valid_block(pattern: Tensor, lengths: Tensor) -> Tensor:
    """``pattern`` ``[b, h, T, T]`` with the rows and columns of padding (beyond each input's length) zeroed: its
    singular values are those of the ``T_b x T_b`` block, plus zeros."""
    t = pattern.shape[-1]
    real = torch.arange(t, device=pattern.device)[None, :] < lengths[:, None]  # [b, t]
    keep = real[:, None, :, None] & real[:, None, None, :]
    return pattern.masked_fill(~keep, 0.0)


def _svd(pattern: Tensor, lengths: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    return torch.linalg.svd(_valid_block(pattern.float(), lengths))


def project_pattern(
    approx: Float[Tensor, "batch head query key"],
    allowed: Bool[Tensor, "batch head query key"],
    total: Float[Tensor, "batch head query 1"],
) -> Float[Tensor, "batch head query key"]:
    """``approx`` (e.g. a rank-``k`` approximation of attention patterns) projected onto the patterns a layer can
    produce: entries on keys the query may not see (``allowed`` False: later keys, keys outside a sparse mask,
    padding) and negative entries set to 0, then each row rescaled to sum to ``total`` (the original row's sum: 1, or
    0 for a row that attends to nothing). A row left with no positive weight on an allowed key attends to nothing
    (all zeros), as a fully masked row does in TransformerLens. This is the simple projection (clip and renormalise),
    not the Euclidean projection onto the simplex; on an exact pattern (``approx`` = the pattern) it is the identity."""
    kept = approx.masked_fill(~allowed, 0.0).clamp_min(0.0)
    s = kept.sum(-1, keepdim=True)
    return torch.where(s > 0, kept * (total / s.clamp_min(torch.finfo(s.dtype).tiny)), torch.zeros_like(kept))


def _low_rank(pattern: Tensor, lengths: Tensor, k: int, svd=None, allowed: Tensor | None = None) -> Tensor:
    """Each input's ``T_b x T_b`` block replaced by its best rank-``k`` approximation, projected back onto the keys
    the query may see (``allowed`` ``[query, key]``, the layer's causal and sparse mask; :func:`project_pattern`);
    padding rows unchanged (``svd``: the block's ``(U, S, Vh)`` where already known)."""
    U, S, Vh = svd if svd is not None else _svd(pattern, lengths)
    k = min(k, S.shape[-1])
    approx = (U[..., :k] * S[..., None, :k]) @ Vh[..., :k, :]
    t = pattern.shape[-1]
    real = torch.arange(t, device=pattern.device)[None, :] < lengths[:, None]  # [b, t]
    ok = real[:, None, None, :] & (
        torch.ones(t, t, dtype=torch.bool, device=pattern.device).tril() if allowed is None else allowed
    )
    total = _valid_block(pattern.float(), lengths).sum(-1, keepdim=True)
    approx = project_pattern(approx, ok.expand_as(approx), total)
    real_rows = real[:, None, :, None]
    return torch.where(real_rows, approx.to(pattern.dtype), pattern)


def _rank_list(max_len: int) -> list[int]:
    ks = [2**i for i in range(int(math.log2(max_len)) + 1) if 2**i < max_len]
    return [*ks, max_len]


def attention_spectrum(
    model: HookedTransformer,
    data: TaskData,
    *,
    task: Task | None = None,
    n_inputs: int = 32,
    ks: list[int] | None = None,
    causal: bool = True,
    per_head: bool = False,
    batch_size: int | None = None,
    device: str | None = None,
) -> AttentionSpectrum:
    """The spectrum of every head's attention pattern on the first ``n_inputs`` examples of ``data``, and (with
    ``causal``) the rank-``k`` causal test on them for ``ks`` (default ``1, 2, 4, ..`` and the longest input). The
    metric is ``task.metrics(...)["accuracy"]`` when the task is given, else the accuracy of the argmax at every
    target position. ``per_head=True`` also runs the test with one head at a time at rank ``k``. ``batch_size``:
    inputs per forward (None: from the memory budget)."""
    if not isinstance(data, TaskData):
        raise InterpError(f"attention_spectrum takes task data (interp.task.TaskData), got {type(data).__name__}")
    if not isinstance(n_inputs, int) or n_inputs < 1:
        raise InterpError(f"n_inputs must be a positive integer, got {n_inputs!r}")
    check_device(model, device)
    check_batch_size(batch_size)
    check_model_data(model, data, task)
    data = data.select(slice(0, min(n_inputs, len(data)))).to(model_device(model))
    L, H = model.cfg.n_layers, model.cfg.n_heads
    budget = max(1, DEFAULT_BUDGET // max(H, 1))
    max_len = int(data.lengths.max())
    if ks is None:
        ks = _rank_list(max_len)
    if not ks or any(not isinstance(k, int) or k < 1 for k in ks):
        raise InterpError(f"ks must be positive integers, got {ks!r}")

    def spectra(chunk: TaskData) -> dict[str, Tensor]:
        from interp.visualize import attention_patterns

        pats = attention_patterns(model, chunk.tokens)  # [b, layer, head, q, k]
        b, _, _, t, _ = pats.shape
        block = _valid_block(pats.flatten(1, 2).float(), chunk.lengths).view(b, L, H, t, t)
        s2 = torch.linalg.svdvals(block).square()  # [b, L, H, t]
        energy = s2.cumsum(-1) / s2.sum(-1, keepdim=True).clamp_min(1e-30)
        energy = torch.nn.functional.pad(energy, (0, max_len - t), value=1.0)
        rank = (energy < ENERGY - 1e-6).sum(-1).float() + 1  # smallest k with E_k >= 0.9
        return {"energy": energy, "rank": rank, "fraction": rank / chunk.lengths[:, None, None].float()}

    with torch.inference_mode():
        out = map_chunks(model, data, spectra, budget=budget, batch_size=batch_size)
    result = AttentionSpectrum(
        energy=out["energy"].mean(0),
        rank90=out["rank"].mean(0),
        rank90_fraction=out["fraction"].mean(0),
        mean_length=float(data.lengths.float().mean()),
        n_inputs=len(data),
    )
    if not causal:
        return result
    budget = (budget, batch_size)
    metric = _metric(model, data, task, lambda chunk: [], budget)
    result.full_accuracy, result.full_loss = metric
    result.ks = list(ks)
    cache: dict = {}
    rows = [_metric(model, data, task, _rank_hooks(model, None, k, cache), budget) for k in ks]
    cache.clear()
    result.accuracy = torch.tensor([r[0] for r in rows])
    result.loss = torch.tensor([r[1] for r in rows])
    if per_head:
        per = torch.zeros(L, H, len(ks))
        for l in range(L):
            for h in range(H):
                for i, k in enumerate(ks):
                    per[l, h, i] = _metric(model, data, task, _rank_hooks(model, (l, h), k), budget)[0]
        result.per_head_accuracy = per
    return result


CACHE_LIMIT = 1 << 24  # numbers of layer-0 SVDs kept between ranks (about 200 MB)


def _rank_hooks(model: HookedTransformer, head: tuple[int, int] | None, k: int, cache: dict | None = None):
    """``chunk -> fwd_hooks`` putting every head's (or only ``head``'s) pattern at rank ``k`` on that chunk, projected
    onto the keys each layer lets a query see (:func:`project_pattern`). Layer 0's patterns do not depend on any
    intervention, so their SVDs are kept in ``cache`` (per chunk) for the next rank, within :data:`CACHE_LIMIT`."""
    from interp.attention import layer_attention

    n_layers = model.cfg.n_layers
    specs = [layer_attention(model, l) for l in range(n_layers)]

    def hooks(chunk: TaskData):
        key = (chunk.tokens.shape, chunk.tokens.cpu().numpy().tobytes())

        def at_rank(pattern, hook):
            t = pattern.shape[-1]
            allowed = specs[hook.layer()].allowed(t, t, pattern.device)
            if head is not None:
                out = pattern.clone()
                one = pattern[:, head[1] : head[1] + 1]
                out[:, head[1]] = _low_rank(one, chunk.lengths, k, allowed=allowed)[:, 0]
                return out
            svd = cache.get(key) if cache is not None and hook.layer() == 0 else None
            if svd is None:
                svd = _svd(pattern, chunk.lengths)
                if (
                    cache is not None
                    and hook.layer() == 0
                    and pattern.numel() <= CACHE_LIMIT - sum(u.numel() for u, _, _ in cache.values())
                ):
                    cache[key] = svd
            return _low_rank(pattern, chunk.lengths, k, svd, allowed)

        layers = range(n_layers) if head is None else [head[0]]
        return [(f"blocks.{l}.attn.hook_pattern", at_rank) for l in layers]

    return hooks


def _metric(model, data: TaskData, task, hooks_for, budget: tuple[int, int | None]) -> tuple[float, float]:
    """(accuracy, mean loss) with the chunk's hooks: the task's metrics when given, else at every target."""

    def one(chunk: TaskData) -> dict[str, Tensor]:
        with torch.inference_mode():
            logits = model.run_with_hooks(chunk.tokens, fwd_hooks=hooks_for(chunk))
        return {"preds": logits.argmax(-1), "loss": per_position_loss(logits, chunk.targets)}

    out = map_chunks(model, data, one, budget=budget[0], batch_size=budget[1])
    if task is not None:
        m = task.metrics(out["preds"], out["loss"], data)
        return float(m["accuracy"]), float(m.get("loss", float("nan")))
    has = data.targets != IGNORE
    return float((out["preds"] == data.targets)[has].float().mean()), float(out["loss"][has].mean())
