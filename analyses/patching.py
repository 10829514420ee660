"""Activation patching and path patching, batched: every patched variant of a sweep stacked along the batch axis.

Activation patching runs the model on one input (the *base*) while replacing one activation by its value on
another input (the *source*), and measures a metric of the output:

- ``direction="denoising"``: base = corrupted, source = clean (TransformerLens' ``patching.get_act_patch_*``
  convention: which activations, restored, bring the clean answer back?);
- ``direction="noising"``: base = clean, source = corrupted (which activations, spoiled, break it?).

TransformerLens' functions run one forward pass and one ``.item()`` per patched index. Here all patched
variants of a layer (every head x position, every head, every position, ...) are stacked along the batch axis
(``variant x example`` rows, chunked to bound memory), and each pass starts at the patched layer from the base
run's cached residual stream (``start_at_layer``), so a full sweep of a small model is a few forward passes.
The values are equal to TransformerLens' to float tolerance (tested). Exact savings on top: a patched ``z`` of an
attention-only layer is added to that layer's cached output (``z W_O``) instead of running the layer; a variant
that patches nothing that differs between the runs, or only positions the metric cannot see (after the answer
with causal attention; in the last layer, a row-local activation away from the answer), is the base run and is
not run; with a built-in metric only the answer positions are unembedded and, when nothing is hooked there, the
last layer computes only the answer's attention row, with keys and values recomputed only where a variant's input
differs from the base run (``benchmarks/patching.py`` times all this against TransformerLens).

Path patching (:func:`path_patching`) patches a sender head's output (source minus base, ``z W_O``) only into
a later receiver head's query, key or value input (TransformerLens' split Q/K/V inputs, ``hook_q_input`` etc.,
before ``ln1``), leaving every other path from the sender at its base value: the causal form of Q-, K- and
V-composition.

Metrics: ``"logit_diff"`` (clean answer's logit minus the corrupted answer's, at each example's answer position),
``"loss"`` (cross-entropy of the clean answer there), ``"accuracy"`` (argmax is the clean answer), each averaged
over the examples; these need :class:`interp.task.TaskData` inputs. Or any callable ``logits [batch, pos,
vocab] -> scalar`` (TransformerLens' ``patching_metric``), which also takes plain token tensors.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from contextlib import nullcontext
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch
from jaxtyping import Float, Int
from torch import Tensor

from interp.attention import is_variant
from interp.device import check_device, model_device
from interp.errors import HeadError, InterpError, TaskError, TokenError
from interp.evaluation import DEFAULT_BUDGET, check_batch_size, check_tokens
from interp.heads import head_label, one_set
from interp.looping import embedded_input, injected_input, injects_input
from interp.results import Result, floats, head_of, jsonable
from interp.task import TaskData

if TYPE_CHECKING:
    from transformer_lens import HookedTransformer

HEAD_SITES = ("z", "q", "k", "v")  # [batch, pos, head, d_head]
POS_SITES = ("resid_pre", "resid_mid", "resid_post", "attn_out", "mlp_out")  # [batch, pos, d_model]
SITES = HEAD_SITES + ("pattern",) + POS_SITES
PER = {"head": ("head_pos", "head", "layer"), "pattern": ("head_pos", "head", "layer"), "pos": ("pos", "layer")}
DIRECTIONS = ("denoising", "noising")
METRICS = ("logit_diff", "loss", "accuracy")
QKV = ("q", "k", "v")
CPU_CHUNK_ELEMENTS = 1 << 17  # floats of the largest per-row activation in one CPU chunk (~0.5 MB)


def _kind(where: str) -> str:
    return "head" if where in HEAD_SITES else "pattern" if where == "pattern" else "pos"


def hook_name(where: str, layer: int) -> str:
    """TransformerLens' hook point of ``where`` in ``layer``."""
    if where in HEAD_SITES or where == "pattern":
        return f"blocks.{layer}.attn.hook_{where}"
    return f"blocks.{layer}.hook_{where}"


# -- inputs and metrics ------------------------------------------------------------------------------------------


def _tokens(x, what: str) -> Tensor:
    if isinstance(x, TaskData):
        return x.tokens
    if isinstance(x, Tensor):
        return x
    raise TaskError(
        f"{what} must be task data (interp.task.TaskData) or a token tensor [batch, pos], got {type(x).__name__}"
    )


def _check_inputs(
    model: HookedTransformer, clean, corrupted, device=None, batch_size: object = None
) -> tuple[Tensor, Tensor]:
    """Both inputs' tokens on the model's device, after refusing: another ``device`` than the model's, a
    ``batch_size`` that is not a positive integer, data the model cannot take (tokens out of its vocabulary or
    context, task data of a task whose vocabulary does not fit it, empty data), clean and corrupted data of different
    tasks or shapes, and answers at different positions."""
    from .answer_cache import check_model_data

    check_device(model, device)
    check_batch_size(batch_size)
    if corrupted is None:
        raise TaskError("patching needs the corrupted run: pass corrupted=... (task data or tokens like data)")

    if isinstance(clean, TaskData) and isinstance(corrupted, TaskData):
        if clean.task != corrupted.task:
            raise TaskError(f"clean data is of task {clean.task!r} but corrupted data of task {corrupted.task!r}")
        if clean.vocab is not None:
            check_model_data(model, clean)
            check_model_data(model, corrupted)
    dev = model_device(model)
    a, b = _tokens(clean, "clean").to(dev), _tokens(corrupted, "corrupted").to(dev)
    check_tokens(model, a)
    check_tokens(model, b)
    if a.shape != b.shape:
        raise TokenError(
            f"clean and corrupted tokens must have the same shape, got {tuple(a.shape)} and {tuple(b.shape)}"
        )
    both_task_data = isinstance(clean, TaskData) and isinstance(corrupted, TaskData)
    if both_task_data and not torch.equal(clean.answer_pos.to(dev), corrupted.answer_pos.to(dev)):
        raise TaskError("clean and corrupted data must have their answers at the same positions (answer_pos differs)")
    return a, b


@dataclass
class VariantMetric:
    """A metric of many stacked variants. ``positions`` (``[batch]``, or None for all) are the positions whose
    logits it reads; ``fn`` maps those logits (``[variant, batch, vocab]`` at ``positions``, else ``[variant,
    batch, pos, vocab]``) to ``[variant]``."""

    name: str
    fn: Callable[[Tensor], Tensor]
    positions: Tensor | None = None

    def __call__(self, logits: Tensor) -> Tensor:
        return self.fn(logits)

    def of_logits(self, logits: Float[Tensor, "batch pos vocab"]) -> Float[Tensor, ""]:
        """The metric of one ordinary run's full logits (a 0-d tensor: TransformerLens' ``patching_metric``)."""
        if self.positions is not None:
            logits = logits[torch.arange(logits.shape[0], device=logits.device), self.positions.to(logits.device)]
        return self.fn(logits[None])[0]


def variant_metric(metric, clean, corrupted) -> VariantMetric:
    """The metric of stacked variants: a built-in name (reads the answer position of the clean / corrupted task
    data) or a callable ``logits [batch, pos, vocab] -> scalar`` applied to each variant in turn."""
    if callable(metric):
        name = getattr(metric, "__name__", "metric")
        return VariantMetric(
            name, lambda logits: torch.stack([torch.as_tensor(metric(x)).float().reshape(()).cpu() for x in logits])
        )
    if metric not in METRICS:
        raise InterpError(f"unknown metric {metric!r}; expected one of {METRICS} or a callable logits -> scalar")
    if not (isinstance(clean, TaskData) and isinstance(corrupted, TaskData)):
        raise TaskError(
            f"metric {metric!r} reads the answer from task data: pass clean and corrupted as TaskData "
            "(or pass a callable metric on logits)"
        )
    good, bad = clean.labels, corrupted.labels

    def fn(at: Float[Tensor, "variant batch vocab"]) -> Float[Tensor, " variant"]:
        at = at.float()
        b = torch.arange(at.shape[1], device=at.device)
        g, w = good.to(at.device), bad.to(at.device)
        if metric == "logit_diff":
            return (at[:, b, g] - at[:, b, w]).mean(-1)
        if metric == "loss":
            return -at.log_softmax(-1)[:, b, g].mean(-1)
        return (at.argmax(-1) == g).float().mean(-1)

    return VariantMetric(metric, fn, clean.answer_pos)


def _runs(model: HookedTransformer, base: Tensor, source: Tensor, names: set[str]):
    """Logits of the base and the source runs and their activations at ``names``."""
    with torch.inference_mode():
        base_logits, base_cache = model.run_with_cache(base, names_filter=lambda n: n in names)
        src_logits, src_cache = model.run_with_cache(source, names_filter=lambda n: n in names)
    return base_logits, base_cache, src_logits, src_cache


def _stacked_run(
    model: HookedTransformer,
    resid: Tensor,
    tokens: Tensor,
    start: int,
    hooks,
    metric: VariantMetric,
    n: int,
    last: tuple | None = None,
    adds: dict[str, Tensor] | None = None,
) -> Tensor:
    """The metric of ``n`` stacked variants of the base run (``resid``: their residual stream entering layer
    ``start``, ``[n * batch, pos, d_model]``; ``tokens``: the base run's), with ``hooks``. Reads the logits
    only at the metric's positions where it has them (``ln_final`` and the unembedding act per position), and then,
    when no hook sits in the last layer, computes that layer's attention for those query rows only (``last``: the
    base run's input, keys and values of the last layer, so only the positions where a variant differs from the base
    run get new keys and values)."""
    from transformer_lens.utilities.activation_functions import apply_softcap

    cfg = model.cfg
    B, L = tokens.shape[0], cfg.n_layers
    rows_only = (
        metric.positions is not None
        and start < L
        and _query_rows_apply(model, split_ok=adds is not None)
        and not any(name.startswith(f"blocks.{L - 1}.") for name, _ in hooks)
    )
    if adds is not None and not (rows_only and start == L - 1):
        raise InterpError("internal: per-head input additions need the query-row path of the last layer")
    spe = model.pos_embed(tokens).repeat(n, 1, 1) if cfg.positional_embedding_type == "shortformer" else None
    # a looped model with input injection adds the embedding to every iteration's input: the base run's, per variant
    inject = (
        injected_input(model, embedded_input(model, tokens).repeat(n, 1, 1)) if injects_input(model) else nullcontext()
    )
    with torch.inference_mode(), inject:
        stop = L - 1 if rows_only else L
        if start < stop:
            kw = {"shortformer_pos_embed": spe} if spe is not None else {}
            resid = model.run_with_hooks(resid, start_at_layer=start, stop_at_layer=stop, fwd_hooks=hooks, **kw)
        if metric.positions is not None:
            rows = torch.arange(n * B, device=resid.device)
            at = metric.positions.to(resid.device).repeat(n)
            resid = _last_layer_rows(model, resid, at, spe, last, adds) if rows_only else resid[rows, at]
            resid = resid[:, None]  # [n * batch, 1, d_model]
        if cfg.normalization_type is not None:
            resid = model.ln_final(resid)
        logits = apply_softcap(model.unembed(resid), cfg.output_logits_soft_cap)
    return metric(logits.view(n, B, *logits.shape[1:]) if metric.positions is None else logits.view(n, B, -1))


def _query_rows_apply(model: HookedTransformer, split_ok: bool = False) -> bool:
    """Whether :func:`_last_layer_rows` computes this model's last layer exactly: plain causal softmax attention
    with learned or shortformer positions (no rotary, ALiBi, grouped or local attention, score caps, QK norm,
    post-norms, parallel MLP or attention variant of :mod:`interp.attention` other than a Q/K/V shape)."""
    cfg = model.cfg
    return bool(
        cfg.positional_embedding_type in ("standard", "shortformer")
        and cfg.attention_dir == "causal"
        and (split_ok or not cfg.use_split_qkv_input)
        and not cfg.use_attn_result
        and not getattr(cfg, "use_attn_in", False)
        and not cfg.use_normalization_before_and_after
        and not getattr(cfg, "parallel_attn_mlp", False)
        and not getattr(cfg, "use_local_attn", False)
        and not getattr(cfg, "use_qk_norm", False)
        and getattr(cfg, "n_key_value_heads", None) in (None, cfg.n_heads)
        and getattr(cfg, "attn_scores_soft_cap", -1.0) in (-1.0, None, 0)
        and getattr(cfg, "original_architecture", None) not in _post_norm_architectures()
        and not is_variant(model)  # sparse masks, linear or additive pooling: the hooked forward computes them
    )


def _post_norm_architectures() -> tuple:
    try:
        from transformer_lens.components.transformer_block import POST_NORM_ARCHITECTURES
    except ImportError:  # pragma: no cover - older TransformerLens: no post-norm models
        return ()
    return tuple(POST_NORM_ARCHITECTURES)


def _last_layer_rows(
    model: HookedTransformer,
    resid: Float[Tensor, "row pos d_model"],
    at: Int[Tensor, " row"],
    shortformer: Tensor | None,
    base: tuple | None = None,
    adds: dict[str, Tensor] | None = None,
) -> Float[Tensor, "row d_model"]:
    """The last block's output at one query position per row, from the model's own modules and weights: keys and
    values at every position, the query and the attention row only at ``at`` (``O(pos)`` instead of ``O(pos^2)``).
    With ``base = (resid, k, v)`` of the base run (``[batch, ...]``; rows are ``variant x batch``), keys and values
    are recomputed only where a row's input differs from the base run's. ``adds`` (``{"q"|"k"|"v": [row, pos,
    head, d_model]}``) are added to each head's own query / key / value input, as TransformerLens' split inputs
    ``hook_q_input`` etc. would be. Tested equal to TransformerLens' forward."""
    blk = model.blocks[-1]
    a = blk.attn
    R, _T, _ = resid.shape
    rows = torch.arange(R, device=resid.device)
    if adds:
        return _last_layer_rows_split(model, resid, at, shortformer, adds)
    if base is None:
        h = blk.ln1(resid)
        qk = h + shortformer if shortformer is not None else h
        k = torch.einsum("rtd,hde->rthe", qk, a.W_K) + a.b_K
        v = torch.einsum("rtd,hde->rthe", h, a.W_V) + a.b_V
    else:
        b_resid, b_k, b_v = base
        n = R // b_resid.shape[0]
        k, v = b_k.repeat(n, 1, 1, 1), b_v.repeat(n, 1, 1, 1)
        changed = (resid != b_resid.repeat(n, 1, 1)).any(-1).nonzero(as_tuple=True)  # (row, pos) pairs
        if len(changed[0]):
            hc = blk.ln1(resid[changed][:, None])[:, 0]
            qkc = hc + shortformer[changed] if shortformer is not None else hc
            k[changed] = torch.einsum("md,hde->mhe", qkc, a.W_K) + a.b_K
            v[changed] = torch.einsum("md,hde->mhe", hc, a.W_V) + a.b_V
    hq = blk.ln1(resid[rows, at][:, None])[:, 0]
    q = torch.einsum("rd,hde->rhe", hq + shortformer[rows, at] if shortformer is not None else hq, a.W_Q) + a.b_Q
    return _attend_from_row(model, resid, at, q, k, v)


def _last_layer_rows_split(model: HookedTransformer, resid, at, shortformer, adds) -> Tensor:
    """:func:`_last_layer_rows` with a separate query, key and value input per head (``resid`` plus ``adds``)."""
    blk, a = model.blocks[-1], model.blocks[-1].attn
    R, T, _ = resid.shape
    H = model.cfg.n_heads
    rows = torch.arange(R, device=resid.device)
    x = resid[:, :, None, :].expand(R, T, H, resid.shape[-1])
    inp = {k: x + adds[k] if k in adds else x for k in QKV}  # [row, pos, head, d_model]
    sf = shortformer[:, :, None, :] if shortformer is not None else 0.0
    hq = blk.ln1(inp["q"][rows, at]) + (sf[rows, at] if shortformer is not None else 0.0)
    q = torch.einsum("rhd,hde->rhe", hq, a.W_Q) + a.b_Q
    k = torch.einsum("rthd,hde->rthe", blk.ln1(inp["k"]) + sf, a.W_K) + a.b_K
    v = torch.einsum("rthd,hde->rthe", blk.ln1(inp["v"]), a.W_V) + a.b_V
    return _attend_from_row(model, resid, at, q, k, v)


def _attend_from_row(
    model: HookedTransformer,
    resid: Float[Tensor, "row pos d_model"],
    at: Int[Tensor, " row"],
    q: Float[Tensor, "row head d_head"],
    k: Float[Tensor, "row pos head d_head"],
    v: Float[Tensor, "row pos head d_head"],
) -> Float[Tensor, "row d_model"]:
    """The last layer's output at position ``at`` of each row from its query there and every key and value:
    causal attention, W_O, the residual, and the MLP when the model has one."""
    blk, a = model.blocks[-1], model.blocks[-1].attn
    rows = torch.arange(resid.shape[0], device=resid.device)
    scores = torch.einsum("rhe,rthe->rht", q, k) / a.attn_scale
    future = torch.arange(resid.shape[1], device=resid.device)[None, :] > at[:, None]
    pattern = scores.masked_fill(future[:, None, :], float("-inf")).softmax(-1)
    z = torch.einsum("rht,rthe->rhe", pattern, v)
    out = resid[rows, at] + torch.einsum("rhe,hed->rd", z, a.W_O) + a.b_O
    if not model.cfg.attn_only:
        out = out + blk.mlp(blk.ln2(out[:, None]))[:, 0]
    return out


def _rows_per_chunk(model: HookedTransformer, T: int, batch_size: int | None) -> int:
    """Rows (``variant x example`` sequences) of a stacked chunk: ``batch_size`` where given; else, on CPU, small
    enough that a row block's activations stay in cache (measured: 64 rows of the shipped induction model ran 2x
    faster per row than 512), elsewhere ``DEFAULT_BUDGET`` rows x pos x pos."""
    cfg = model.cfg
    if batch_size is not None:
        return batch_size
    if model_device(model).type == "cpu":
        per_row = T * max(cfg.d_model, cfg.n_heads * T, 0 if cfg.attn_only else (cfg.d_mlp or 0))
        return max(1, CPU_CHUNK_ELEMENTS // per_row)
    return max(1, DEFAULT_BUDGET // (T * T))


# -- activation patching -----------------------------------------------------------------------------------------


@dataclass(eq=False)
class ActivationPatching(Result):
    """Patched metric per index: ``values`` with ``dims`` (``("layer", "head", "pos")``, ``("layer", "head")``,
    ``("layer", "pos")`` or ``("layer",)``); ``layers`` are the model layers of the first axis. ``clean`` and
    ``corrupted`` are the metric of the unpatched runs; :attr:`normalized` is ``(values - corrupted) / (clean -
    corrupted)``: 1 = the clean metric, 0 = the corrupted one (denoising: how much the patch restores; noising:
    how much of the clean metric survives it)."""

    values: Tensor
    dims: tuple[str, ...]
    where: str
    per: str
    direction: str
    metric: str
    clean: float
    corrupted: float
    layers: list[int]
    pos_labels: list[str] = field(default_factory=list)
    n_examples: int = 0
    kv_heads: bool = False  # the head axis counts key/value heads (k or v under grouped-query attention)

    @property
    def normalized(self) -> Tensor:
        span = self.clean - self.corrupted
        return (
            (self.values - self.corrupted) / span if abs(span) > 1e-12 else torch.full_like(self.values, float("nan"))
        )

    def _label(self, idx: tuple[int, ...]) -> dict:
        out = {}
        for d, i in zip(self.dims, idx):
            if d == "layer":
                out["layer"] = self.layers[i]
            elif d == "head":
                out["head"] = self._head_name(self.layers[idx[0]], i)
            else:
                out["pos"] = i
                if self.pos_labels:
                    out["token"] = self.pos_labels[i]
        return out

    def _head_name(self, layer: int, i: int) -> str:
        """``L0H3``, or ``L0KV1`` for a key/value head of grouped-query attention."""
        return f"L{layer}KV{i}" if self.kv_heads else head_label(layer, i)

    def top(self, k: int = 10) -> list[dict]:
        """The ``k`` indices whose patch moves the metric most (by ``|normalized|``, else ``|values - base|``)."""
        score = self.normalized
        if torch.isnan(score).all():
            base = self.corrupted if self.direction == "denoising" else self.clean
            score = self.values - base
        flat = score.flatten().nan_to_num(0).abs()
        order = flat.argsort(descending=True)[:k]
        rows = []
        for i in order.tolist():
            idx = tuple(int(x) for x in torch.unravel_index(torch.tensor(i), self.values.shape))
            rows.append(
                {**self._label(idx), "value": float(self.values[idx]), "normalized": float(self.normalized[idx])}
            )
        return rows

    def to_dict(self) -> dict:
        return jsonable(
            {
                "where": self.where,
                "per": self.per,
                "direction": self.direction,
                "metric": self.metric,
                "clean": self.clean,
                "corrupted": self.corrupted,
                "n_examples": self.n_examples,
                "dims": list(self.dims),
                "layers": self.layers,
                "pos_labels": self.pos_labels,
                "values": self.values,
                "normalized": self.normalized,
                "top": self.top(10),
                "kv_heads": self.kv_heads,
            }
        )

    @classmethod
    def from_dict(cls, d: dict) -> ActivationPatching:
        return cls(
            values=floats(d["values"], torch.float32),  # float32, as computed: normalized and top are recomputed
            dims=tuple(d["dims"]),
            where=d["where"],
            per=d["per"],
            direction=d["direction"],
            metric=d["metric"],
            clean=d["clean"],
            corrupted=d["corrupted"],
            layers=list(d["layers"]),
            pos_labels=list(d["pos_labels"]),
            n_examples=d["n_examples"],
            kv_heads=d.get("kv_heads", False),
        )

    def text(self) -> str:
        lines = [
            f"activation patching ({self.direction}) at {self.where} per {self.per}, metric {self.metric}: "
            f"clean {self.clean:.4g}, corrupted {self.corrupted:.4g} ({self.n_examples} examples)"
        ]
        if self.kv_heads:
            lines.append("  (grouped-query attention: one value per key/value head LxKVy, shared by its query heads)")
        for r in self.top(5):
            where = " ".join(f"{k} {v}" for k, v in r.items() if k not in ("value", "normalized"))
            lines.append(f"  {where}: {r['value']:.4g} (normalized {r['normalized']:.3f})")
        return "\n".join(lines)

    def table_html(self) -> str:
        from interp.visualize import render_table

        return render_table(
            self.top(10),
            caption=f"largest effects ({self.direction}, metric {self.metric}; "
            f"normalized: 1 = clean {self.clean:.3g}, 0 = corrupted {self.corrupted:.3g})",
            formats={"value": ".4g", "normalized": ".3f"},
        )

    def figure(self):
        """Heatmap of the normalized metric: heads (or layers) by positions (or heads)."""
        from interp.visualize import heatmap

        z = self.normalized.detach().cpu()
        pos = [f"{p} {t}".strip() for p, t in zip(range(z.shape[-1]), self.pos_labels or [""] * z.shape[-1])]
        n_heads = z.shape[1] if len(self.dims) > 1 and self.dims[1] == "head" else 0
        if self.dims == ("layer", "head", "pos"):
            rows = [self._head_name(l, h) for l in self.layers for h in range(n_heads)]
            z, x, y = z.reshape(-1, z.shape[-1]), pos, rows
        elif self.dims == ("layer", "head"):
            x, y = [f"{'KV' if self.kv_heads else 'H'}{h}" for h in range(n_heads)], [f"L{l}" for l in self.layers]
        elif self.dims == ("layer", "pos"):
            x, y = pos, [f"L{l}" for l in self.layers]
        else:
            z, x, y = z[:, None], ["all positions"], [f"L{l}" for l in self.layers]
        what = {"denoising": "clean patched into corrupted", "noising": "corrupted patched into clean"}[self.direction]
        return heatmap(
            z,
            x,
            y,
            title=f"Activation patching at {self.where} ({what})<br><sup>normalized {self.metric}: "
            f"1 = clean {self.clean:.3g}, 0 = corrupted {self.corrupted:.3g}</sup>",
            colorscale="RdBu",
            zmid=0.0,
            x_title="position" if "pos" in self.dims else "head",
            y_title="",
        )


def _variant_masks(kind: str, per: str, n_heads: int, n_pos: int, device) -> tuple[Tensor, tuple[int, ...]]:
    """``[variant, *index]`` boolean masks of what each variant patches (index: ``[pos, head]`` for head vectors,
    ``[head, query]`` for patterns, ``[pos]`` for the residual stream), and the result shape of one layer."""
    if kind == "pos":
        if per == "pos":
            return torch.eye(n_pos, dtype=torch.bool, device=device), (n_pos,)
        return torch.ones(1, n_pos, dtype=torch.bool, device=device), ()
    if per == "layer":  # every head at every position (or every query row) at once
        return torch.ones(
            1, *((n_pos, n_heads) if kind == "head" else (n_heads, n_pos)), dtype=torch.bool, device=device
        ), ()
    if per == "head_pos":  # variant (h, p) -> result [h, p]
        m = torch.eye(n_heads * n_pos, dtype=torch.bool, device=device).view(n_heads * n_pos, n_heads, n_pos)
        return (m.transpose(1, 2) if kind == "head" else m), (n_heads, n_pos)
    m = torch.eye(n_heads, dtype=torch.bool, device=device)[:, :, None].expand(n_heads, n_heads, n_pos)
    return (m.transpose(1, 2) if kind == "head" else m), (n_heads,)


def _patch_hook(masks: Tensor, source: Tensor, kind: str):
    """A hook that, in ``variant x example`` rows, replaces the activation by ``source`` where ``masks`` says."""
    n = masks.shape[0]
    m = masks[:, None, ..., None] if kind in ("head", "pattern") else masks[:, None, :, None]

    def hook(act, hook):
        a = act.reshape(n, -1, *act.shape[1:])
        return torch.where(m, source[None].to(act.dtype), a).reshape(act.shape)

    return hook


def activation_patching(
    model: HookedTransformer,
    data: TaskData | Int[Tensor, "batch pos"],
    *,
    corrupted: TaskData | Int[Tensor, "batch_c pos_c"],
    metric: str | Callable = "logit_diff",
    where: str = "z",
    per: str | None = None,
    layers: Sequence[int] | None = None,
    direction: str = "denoising",
    batch_size: int | None = None,
    device: str | None = None,
) -> ActivationPatching:
    """Patch ``where`` from the source run into the base run at every index of ``per`` in ``layers`` (default all)
    and measure ``metric``; ``data`` is the clean run and ``corrupted`` the corrupted one (``direction`` says which
    is patched into which). All variants of a layer are stacked along the batch axis, in chunks of ``batch_size``
    sequences (``variant x example``; default: cache-sized chunks on CPU, ``interp.evaluation.DEFAULT_BUDGET``
    attention entries elsewhere).

    ``where``: ``"z"`` (head outputs; also ``"q"``, ``"k"``, ``"v"``), ``"pattern"`` (attention patterns),
    ``"resid_pre"`` (also ``"resid_mid"``, ``"resid_post"``, ``"attn_out"``, ``"mlp_out"``). ``per``: for head
    sites and patterns ``"head_pos"`` (each head at each position; for patterns each query row: a ``[layer, head,
    pos]`` result), ``"head"`` (each head at all positions: ``[layer, head]``) or ``"layer"`` (every head at every
    position: ``[layer]``); for residual sites ``"pos"``
    (``[layer, pos]``) or ``"layer"`` (all positions at once: ``[layer]``). Equal to TransformerLens'
    ``get_act_patch_attn_head_out_by_pos`` (transposed to ``[layer, head, pos]``), ``..._all_pos``,
    ``get_act_patch_resid_pre``, ``get_act_patch_attn_head_pattern_by_pos`` etc."""
    if where not in SITES:
        raise InterpError(f"unknown activation {where!r}; expected one of {SITES}")
    kind = _kind(where)
    per = per or PER[kind][0]
    if per not in PER[kind]:
        raise InterpError(f"per={per!r} does not apply to {where!r}; expected one of {PER[kind]}")
    if direction not in DIRECTIONS:
        raise InterpError(f"unknown direction {direction!r}; expected one of {DIRECTIONS}")
    if where in ("mlp_out", "resid_mid") and model.cfg.attn_only:
        raise InterpError(f"{where!r} does not exist in an attention-only model (it has no MLP)")
    if where == "resid_mid" and getattr(model.cfg, "parallel_attn_mlp", False):
        raise InterpError(
            "'resid_mid' does not exist in a parallel attention + MLP block (parallel_attn_mlp=True: attention and "
            "MLP both read resid_pre); patch 'resid_pre', 'attn_out', 'mlp_out' or 'resid_post'"
        )
    n_layers, n_heads = model.cfg.n_layers, model.cfg.n_heads
    kv_heads = where in ("k", "v") and _kv_heads(model) != n_heads  # grouped-query: one key/value head per group
    if kv_heads:
        n_heads = _kv_heads(model)
    layers = list(range(n_layers)) if layers is None else [int(l) for l in layers]
    if not layers:
        raise HeadError(f"layers=[] names no layer to patch; give at least one of 0..{n_layers - 1}, or None for all")
    bad = [l for l in layers if not 0 <= l < n_layers]
    if bad:
        raise HeadError(f"layers {bad} are out of range; this model has layers 0..{n_layers - 1}")
    clean = data
    clean_t, corr_t = _check_inputs(model, clean, corrupted, device, batch_size)
    metric = variant_metric(metric, clean, corrupted)
    base, source = (corr_t, clean_t) if direction == "denoising" else (clean_t, corr_t)
    B, T = base.shape
    # z enters the residual stream linearly: skip layer l (not where the next block reads more than l's output)
    shortcut = where == "z" and _linear_z(model) and not injects_input(model)
    L = n_layers - 1
    last_names = [f"blocks.{L}.hook_resid_pre", f"blocks.{L}.attn.hook_k", f"blocks.{L}.attn.hook_v"]
    names = (
        {hook_name(where, l) for l in layers}
        | {f"blocks.{l}.hook_resid_pre" for l in layers}
        | {f"blocks.{l}.hook_resid_post" for l in layers if shortcut}
        | set(last_names)
    )
    base_logits, base_cache, src_logits, src_cache = _runs(model, base, source, names)
    clean_logits, corr_logits = (src_logits, base_logits) if direction == "denoising" else (base_logits, src_logits)
    clean_m, corr_m = float(metric.of_logits(clean_logits)), float(metric.of_logits(corr_logits))
    base_m = corr_m if direction == "denoising" else clean_m
    last = tuple(base_cache[n] for n in last_names)

    dev = base.device
    masks, shape = _variant_masks(kind, per, n_heads, T, dev)
    chunk = max(1, _rows_per_chunk(model, T, batch_size) // B)
    out = []
    for l in layers:
        src, act = src_cache[hook_name(where, l)], base_cache[hook_name(where, l)]
        live = _live_variants(masks, src, act, kind, metric, model, where, l)
        vals = torch.full(
            (masks.shape[0],), base_m, device=dev
        )  # a variant that changes nothing the metric sees: the base run
        idx = live.nonzero().squeeze(-1)
        for s in range(0, len(idx), chunk):
            part = idx[s : s + chunk]
            m, n = masks[part], len(part)
            if shortcut:  # z enters the residual stream linearly: add the patched heads' change of output, skip layer l
                dz = torch.einsum("nph,bphe,hed->nbpd", m.to(src.dtype), src - act, model.W_O[l])
                resid = (base_cache[f"blocks.{l}.hook_resid_post"][None] + dz).reshape(n * B, T, -1)
                vals[part] = _stacked_run(model, resid, base, l + 1, [], metric, n, last).float().to(dev)
            elif where == "resid_pre":  # the patched residual stream is the input of layer l: no hook needed
                resid = torch.where(m[:, None, :, None], src[None], act[None]).reshape(n * B, T, -1)
                vals[part] = _stacked_run(model, resid, base, l, [], metric, n, last).float().to(dev)
            else:
                resid = base_cache[f"blocks.{l}.hook_resid_pre"].repeat(n, 1, 1)
                hooks = [(hook_name(where, l), _patch_hook(m, src, kind))]
                vals[part] = _stacked_run(model, resid, base, l, hooks, metric, n, last).float().to(dev)
        out.append(vals.reshape(shape))
    values = torch.stack(out).float().cpu()
    dims = ("layer",) + {"head_pos": ("head", "pos"), "head": ("head",), "pos": ("pos",), "layer": ()}[per]
    return ActivationPatching(
        values=values,
        dims=dims,
        where=where,
        per=per,
        direction=direction,
        metric=metric.name,
        clean=clean_m,
        corrupted=corr_m,
        layers=layers,
        pos_labels=_pos_labels(clean, clean_t),
        n_examples=B,
        kv_heads=kv_heads,
    )


def _kv_heads(model: HookedTransformer) -> int:
    """The key/value heads of each layer: ``n_key_value_heads`` under grouped-query attention, else ``n_heads``."""
    return getattr(model.cfg, "n_key_value_heads", None) or model.cfg.n_heads


def _linear_z(model: HookedTransformer) -> bool:
    """Whether a layer's output is ``resid_pre + sum_h z_h W_O[h] + b_O`` exactly (attention-only blocks without
    normalisation after attention), so a patched ``z`` can be added to the cached ``resid_post`` instead of running
    the layer again."""
    cfg = model.cfg
    return bool(
        cfg.attn_only
        and not cfg.use_normalization_before_and_after
        and not cfg.use_attn_result
        and not getattr(cfg, "parallel_attn_mlp", False)
    )


ROW_LOCAL = ("z", "q", "pattern", "attn_out", "resid_mid", "mlp_out", "resid_post")  # in the last layer: one position


def _live_variants(
    masks: Tensor, src: Tensor, act: Tensor, kind: str, metric: VariantMetric, model, where: str, layer: int
) -> Tensor:
    """``[variant]``: does the variant patch an entry where source and base differ, at a position the metric can
    see? With causal attention nothing after the last position it reads can matter; in the last layer a
    row-local activation (a head's output, query or attention row, the layer's output) at position ``p`` only
    changes the logits at ``p``. The other variants equal the base run and are not run."""
    diff = (src != act).any(-1).any(0)  # [pos, head] for head vectors, [head, query] for patterns, [pos] else
    if metric.positions is not None:
        n_pos = diff.shape[1] if kind == "pattern" else diff.shape[0]
        pos = torch.arange(n_pos, device=diff.device)
        seen = torch.ones(n_pos, dtype=torch.bool, device=diff.device)
        if model.cfg.attention_dir == "causal":
            seen &= pos <= int(metric.positions.max())
        if layer == model.cfg.n_layers - 1 and where in ROW_LOCAL:
            seen &= torch.isin(pos, metric.positions.to(diff.device))
        diff = diff & (seen[None] if kind == "pattern" else seen[:, None] if kind == "head" else seen)
    return (masks & diff).flatten(1).any(1)


def _pos_labels(data, tokens: Tensor) -> list[str]:
    """The token at each position where every example has the same one (``[BOS]``, ``=``), else ``""``."""
    vocab = data.vocab if isinstance(data, TaskData) else None
    if vocab is None:
        return []
    same = (tokens == tokens[:1]).all(0)
    names = vocab.decode(tokens[0].cpu())
    return [n if s else "" for n, s in zip(names, same.tolist())]


# -- path patching -----------------------------------------------------------------------------------------------


@dataclass(eq=False)
class PathPatching(Result):
    """Patched metric ``values[sender, receiver, qkv]``: the sender head's output patched only into the receiver's
    query, key or value input (NaN where the receiver is not in a later layer than the sender). ``clean`` /
    ``corrupted`` and :attr:`normalized` as in :class:`ActivationPatching`."""

    values: Tensor
    senders: list[tuple[int, int]]
    receivers: list[tuple[int, int]]
    direction: str
    metric: str
    clean: float
    corrupted: float
    qkv: tuple[str, ...] = QKV
    n_examples: int = 0
    kv_group: int = 1  # query heads per key/value head (grouped-query attention); their k and v inputs are shared

    @property
    def normalized(self) -> Tensor:
        span = self.clean - self.corrupted
        return (
            (self.values - self.corrupted) / span if abs(span) > 1e-12 else torch.full_like(self.values, float("nan"))
        )

    def _receiver(self, r: tuple[int, int], q: str) -> str:
        """The receiving input's head: the query head, or (grouped-query attention) ``LxKVy`` for k and v."""
        return head_label(*r) if q == "q" or self.kv_group == 1 else f"L{r[0]}KV{r[1] // self.kv_group}"

    def rows(self) -> list[dict]:
        """One row per (sender, receiving head, input); under grouped-query attention one per key/value head for
        the k and v inputs (the query heads of a group share it)."""
        n = self.normalized
        out, done = [], set()
        for i, s in enumerate(self.senders):
            for j, r in enumerate(self.receivers):
                for k, q in enumerate(self.qkv):
                    name = self._receiver(r, q)
                    if torch.isnan(self.values[i, j, k]) or (i, name, q) in done:
                        continue
                    done.add((i, name, q))
                    out.append(
                        {
                            "sender": head_label(*s),
                            "receiver": name,
                            "input": q,
                            "value": float(self.values[i, j, k]),
                            "normalized": float(n[i, j, k]),
                        }
                    )
        return out

    def top(self, k: int = 5) -> list[dict]:
        base = self.corrupted if self.direction == "denoising" else self.clean
        return sorted(self.rows(), key=lambda r: -abs(r["value"] - base))[:k]

    def to_dict(self) -> dict:
        return jsonable(
            {
                "direction": self.direction,
                "metric": self.metric,
                "clean": self.clean,
                "corrupted": self.corrupted,
                "n_examples": self.n_examples,
                "qkv": list(self.qkv),
                "senders": [head_label(*s) for s in self.senders],
                "receivers": [head_label(*r) for r in self.receivers],
                "kv_group": self.kv_group,
                "rows": self.rows(),
            }
        )

    @classmethod
    def from_dict(cls, d: dict) -> PathPatching:
        senders, receivers, qkv = [head_of(h) for h in d["senders"]], [head_of(h) for h in d["receivers"]], d["qkv"]
        values = torch.full((len(senders), len(receivers), len(qkv)), float("nan"))
        res = cls(values, senders, receivers, d["direction"], d["metric"], d["clean"], d["corrupted"], tuple(qkv))
        res.kv_group = d.get("kv_group", 1)
        s_at = {head_label(*h): i for i, h in enumerate(senders)}
        for r in d["rows"]:
            k = qkv.index(r["input"])
            for j, h in enumerate(receivers):  # every receiving head the row stands for (a group shares k and v)
                if res._receiver(h, r["input"]) == r["receiver"]:
                    values[s_at[r["sender"]], j, k] = r["value"]
        return cls(
            values=values,
            senders=senders,
            receivers=receivers,
            direction=d["direction"],
            metric=d["metric"],
            clean=d["clean"],
            corrupted=d["corrupted"],
            qkv=tuple(qkv),
            n_examples=d["n_examples"],
            kv_group=res.kv_group,
        )

    def text(self) -> str:
        lines = [
            f"path patching ({self.direction}), metric {self.metric}: clean {self.clean:.4g}, corrupted "
            f"{self.corrupted:.4g} ({self.n_examples} examples)"
        ]
        for r in self.top(5):
            lines.append(
                f"  {r['sender']} -> {r['receiver']}.{r['input']}: {r['value']:.4g} (normalized {r['normalized']:.3f})"
            )
        return "\n".join(lines)

    def table_html(self) -> str:
        from interp.visualize import render_table

        return render_table(
            self.rows(),
            ["sender", "receiver", "input", "value", "normalized"],
            caption=f"path patching ({self.direction}, metric {self.metric}; normalized: 1 = clean "
            f"{self.clean:.3g}, 0 = corrupted {self.corrupted:.3g})",
            formats={"value": ".4g", "normalized": ".3f"},
        )

    def figure(self):
        """Heatmap: sender (rows) by receiver input (columns), normalized metric."""
        from interp.visualize import heatmap

        z = self.normalized.detach().cpu().reshape(len(self.senders), -1)
        x = [f"{head_label(*r)}.{q}" for r in self.receivers for q in self.qkv]
        what = {
            "denoising": "clean sender output patched into the corrupted run",
            "noising": "corrupted sender output patched into the clean run",
        }[self.direction]
        return heatmap(
            z,
            x,
            [head_label(*s) for s in self.senders],
            colorscale="RdBu",
            zmid=0.0,
            text_fmt=".2f",
            title=f"Path patching: sender -> receiver input ({what})<br><sup>normalized {self.metric}: "
            f"1 = clean {self.clean:.3g}, 0 = corrupted {self.corrupted:.3g}</sup>",
            x_title="receiver head . input",
            y_title="sender head",
        )


def path_patching(
    model: HookedTransformer,
    data: TaskData | Int[Tensor, "batch pos"],
    *,
    corrupted: TaskData | Int[Tensor, "batch_c pos_c"],
    metric: str | Callable = "logit_diff",
    senders: object = None,
    receivers: object = None,
    qkv: Sequence[str] = QKV,
    direction: str = "denoising",
    batch_size: int | None = None,
    device: str | None = None,
) -> PathPatching:
    """For every sender head, receiver head in a later layer and input in ``qkv``: the metric when the sender's
    output ``z W_O`` on the source run replaces its base-run output in that input of that receiver only (all
    variants stacked along the batch axis, ``batch_size`` sequences per chunk). ``data`` is the clean run,
    ``corrupted`` the corrupted one. Defaults: senders = the heads of layer 0, receivers = every head of the later
    layers (``senders``/``receivers``: a head or a list of heads)."""
    n_layers, n_heads = model.cfg.n_layers, model.cfg.n_heads
    if n_layers < 2:
        raise HeadError("path patching needs a later layer to receive the sender's output; this model has one layer")
    if direction not in DIRECTIONS:
        raise InterpError(f"unknown direction {direction!r}; expected one of {DIRECTIONS}")
    qkv = tuple(qkv)
    if not qkv or any(q not in QKV for q in qkv) or len(set(qkv)) != len(qkv):
        raise InterpError(f"qkv must be distinct inputs among {QKV}, got {qkv}")
    senders = (
        [(0, h) for h in range(n_heads)] if senders is None else one_set(senders, n_layers, n_heads, name="senders")
    )
    s_min = min(l for l, _ in senders)
    receivers = (
        [(l, h) for l in range(s_min + 1, n_layers) for h in range(n_heads)]
        if receivers is None
        else one_set(receivers, n_layers, n_heads, name="receivers")
    )
    clean = data
    clean_t, corr_t = _check_inputs(model, clean, corrupted, device, batch_size)
    metric = variant_metric(metric, clean, corrupted)
    base, source = (corr_t, clean_t) if direction == "denoising" else (clean_t, corr_t)
    B, T = base.shape
    s_layers = sorted({l for l, _ in senders})
    r_layers = sorted({l for l, _ in receivers})
    names = {f"blocks.{l}.attn.hook_z" for l in s_layers} | {f"blocks.{l}.hook_resid_pre" for l in r_layers}
    base_logits, base_cache, src_logits, src_cache = _runs(model, base, source, names)
    clean_logits, corr_logits = (src_logits, base_logits) if direction == "denoising" else (base_logits, src_logits)
    clean_m, corr_m = float(metric.of_logits(clean_logits)), float(metric.of_logits(corr_logits))
    base_m = corr_m if direction == "denoising" else clean_m
    with torch.inference_mode():  # each sender's change of output: [sender, batch, pos, d_model]
        delta = torch.stack(
            [
                torch.einsum(
                    "bpe,ed->bpd",
                    (src_cache[f"blocks.{l}.attn.hook_z"][:, :, h] - base_cache[f"blocks.{l}.attn.hook_z"][:, :, h]),
                    model.W_O[l, h],
                )
                for l, h in senders
            ]
        )
    seen = delta
    if metric.positions is not None and model.cfg.attention_dir == "causal":
        seen = delta[:, :, : int(metric.positions.max()) + 1]
    moves = (seen != 0).flatten(1).any(1)  # a sender whose output does not change where the metric sees changes nothing

    values = torch.full((len(senders), len(receivers), len(qkv)), float("nan"))
    chunk = max(1, _rows_per_chunk(model, T, batch_size) // B)
    was = model.cfg.use_split_qkv_input
    model.set_use_split_qkv_input(True)
    rows_last = metric.positions is not None and _query_rows_apply(model, split_ok=True)
    group = n_heads // _kv_heads(model)  # query heads per key/value head (grouped-query attention; 1 otherwise)

    def slot(j: int, letter: str) -> int:
        """The head of the receiver's ``letter`` input: its own query head, its group's key/value head."""
        return receivers[j][1] if letter == "q" else receivers[j][1] // group

    try:
        for rl in r_layers:  # stacked runs per receiver layer, each started there
            variants, same = [], {}  # same: a key/value head's variant, shared by the query heads of its group
            for i, (sl, _) in enumerate(senders):
                for j, (l, _) in enumerate(receivers):
                    for k, letter in enumerate(qkv):
                        if l != rl or sl >= rl:
                            continue
                        if not moves[i]:
                            values[i, j, k] = base_m
                            continue
                        key = (i, slot(j, letter), k)
                        if letter != "q" and key in same:
                            same[key].append((i, j, k))
                            continue
                        same[key] = [(i, j, k)]
                        variants.append((i, j, k))
            for s in range(0, len(variants), chunk):
                part = variants[s : s + chunk]
                n = len(part)
                adds = {}
                for k, letter in enumerate(qkv):
                    width = n_heads if letter == "q" else n_heads // group
                    add = torch.zeros(n, B, T, width, model.cfg.d_model, device=base.device, dtype=delta.dtype)
                    for v, (i, j, kk) in enumerate(part):
                        if kk == k:
                            add[v, :, :, slot(j, letter)] = delta[i]
                    adds[letter] = add.reshape(n * B, T, width, -1)
                resid = base_cache[f"blocks.{rl}.hook_resid_pre"].repeat(n, 1, 1)
                if rows_last and rl == n_layers - 1:  # the receivers' layer is the last: its answer rows only
                    vals = _stacked_run(model, resid, base, rl, [], metric, n, adds=adds).float().cpu()
                else:
                    hooks = [
                        (f"blocks.{rl}.hook_{letter}_input", lambda x, hook, add=add: x + add.to(x.dtype))
                        for letter, add in adds.items()
                    ]
                    vals = _stacked_run(model, resid, base, rl, hooks, metric, n).float().cpu()
                for v, (i, j, k) in enumerate(part):
                    for ii, jj, kk in same.get((i, slot(j, qkv[k]), k), [(i, j, k)]):
                        values[ii, jj, kk] = vals[v]
    finally:
        model.set_use_split_qkv_input(was)
    return PathPatching(
        values=values,
        senders=senders,
        receivers=receivers,
        direction=direction,
        metric=metric.name,
        clean=clean_m,
        corrupted=corr_m,
        qkv=qkv,
        n_examples=B,
        kv_group=group,
    )
