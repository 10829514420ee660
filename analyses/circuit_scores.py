"""Edge scores on the computational graph (:mod:`interp.analyses.circuit_graph`), and the forward that runs a
circuit: what :func:`interp.analyses.circuit_discovery.discover_circuit` is made of.

- :func:`edge_patching`: the exact effect of patching each edge alone (its sender's reference output replaces its
  clean output in that receiver's input only), every edge of a receiver layer stacked along the batch axis and run
  from that layer on (the clean residual stream entering it is cached).
- :func:`edge_attribution`: EAP (Syed, Rager and Conmy 2023, *Attribution Patching Outperforms Automated Circuit
  Discovery*): ``(ref_s - out_s) . dM/d(input_r)``, summed over positions, for every edge at once from one clean
  forward and backward and one reference forward; with ``steps`` it is EAP-IG (Hanna, Pezzelle and Belinkov 2024,
  *Have Faith in Faithfulness*): the gradients averaged over inputs interpolated from the reference input to the
  clean one (``alpha = k / steps``, ``k = 1..steps``, so one step is EAP exactly).
- :func:`circuit_metrics`: the metric of many circuits (edge masks, 1 = kept) in one stacked forward, every
  ablated edge patched with the sender's reference output minus its output *in that run* (upstream ablations
  change it), as ACDC and auto-circuit do.

**Ablations** (the reference a removed edge carries; Miller, Chughtai and Saunders 2024, *Transformer Circuit
Faithfulness Metrics are not Robust*, show circuit metrics depend on it): ``"patch"`` (the sender's output on the
corrupted input, example by example), ``"mean"`` (its mean over the data's examples at each position), ``"zero"``.

Every score is the metric's change, ``M(edge removed) - M(clean)``, or its first-order estimate (EAP): negative when
removing the edge lowers the metric.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from jaxtyping import Bool, Float
from torch import Tensor

from interp.device import check_device, model_device
from interp.errors import ConfigError, InterpError, TaskError, TokenError
from interp.evaluation import check_batch_size, check_finite_parameters, check_tokens
from interp.task import TaskData

from .circuit_graph import ComputationalGraph, check_graph_model, computational_graph
from .patching import VariantMetric, _query_rows_apply, _rows_per_chunk, _stacked_run

if TYPE_CHECKING:
    from transformer_lens import HookedTransformer

ABLATIONS = ("patch", "mean", "zero")
LIGHT_ROWS = 4096  # variant x example rows of one stacked chunk on the answer-row paths (per-edge patching)
METRICS = ("logit_diff", "loss")


# -- inputs, metric, reference -------------------------------------------------------------------------------------


def circuit_metric(metric, data, corrupted=None) -> VariantMetric:
    """The metric of stacked runs (``[variant, batch, vocab]`` at the answer positions -> ``[variant]``):

    - ``"logit_diff"``: the answer's logit minus the corrupted answer's (with corrupted task data), else minus the
      largest other logit (the answer's margin), averaged over examples;
    - ``"loss"``: the answer's cross-entropy, averaged;
    - a callable ``logits [batch, pos, vocab] -> scalar`` (differentiable, for EAP), applied to each run."""
    if callable(metric):
        name = getattr(metric, "__name__", "metric")

        def per_variant(logits: Tensor) -> Tensor:
            return torch.stack([torch.as_tensor(metric(x)).float().reshape(()) for x in logits])

        return VariantMetric(name, per_variant)
    if metric not in METRICS:
        raise ConfigError(f"unknown metric {metric!r}; expected one of {METRICS} or a callable logits -> scalar")
    if not isinstance(data, TaskData):
        raise TaskError(
            f"metric {metric!r} reads the answer from task data: pass data as TaskData (interp.task_data builds it "
            "from tokens), or pass a callable metric on logits"
        )
    bad = corrupted.labels if isinstance(corrupted, TaskData) else None
    return _builtin(metric, data.labels, bad, data.answer_pos)


def _builtin(metric: str, good: Tensor, bad: Tensor | None, positions: Tensor) -> VariantMetric:
    """A built-in metric of the examples whose answers are ``good`` (and corrupted answers ``bad``) at
    ``positions``."""

    def fn(at: Float[Tensor, "variant batch vocab"]) -> Float[Tensor, " variant"]:
        at = at.float()
        b = torch.arange(at.shape[1], device=at.device)
        g = good.to(at.device)
        if metric == "loss":
            return -at.log_softmax(-1)[:, b, g].mean(-1)
        if bad is not None:
            return (at[:, b, g] - at[:, b, bad.to(at.device)]).mean(-1)
        other = at.clone()
        other[:, b, g] = float("-inf")
        return (at[:, b, g] - other.max(-1).values).mean(-1)

    out = VariantMetric(metric + ("" if bad is not None or metric == "loss" else "_margin"), fn, positions)
    out.parts = (metric, good, bad)  # what a chunk of the examples needs (:func:`chunk_metric`)
    return out


def chunk_metric(vm: VariantMetric, idx: Tensor) -> VariantMetric:
    """The built-in metric ``vm`` of the examples ``idx`` alone."""
    metric, good, bad = vm.parts
    dev = good.device
    i = idx.to(dev)
    out = _builtin(metric, good[i], None if bad is None else bad.to(dev)[i], vm.positions.to(dev)[i])
    out.name = vm.name
    return out


def _tokens(x, what: str) -> Tensor:
    if isinstance(x, TaskData):
        return x.tokens
    if isinstance(x, Tensor):
        return x
    raise TaskError(
        f"{what} must be task data (interp.TaskData) or a token tensor [batch, pos], got {type(x).__name__}"
    )


@dataclass
class Context:
    """What every score and circuit run of one call shares: the graph, the clean tokens, the metric, the clean run's
    residual stream entering each layer (and leaving the last), every sender's clean and reference output
    (``[batch, pos, sender, d_model]``; the reference broadcasts over batch for mean and zero ablation) and the clean
    metric. ``forwards`` counts the model forwards (one sequence batch each) spent so far."""

    model: HookedTransformer
    graph: ComputationalGraph
    tokens: Tensor
    metric: VariantMetric
    ablation: str
    resid: list[Tensor]
    clean_out: Tensor
    ref_out: Tensor
    ref_input: Tensor
    full: float
    batch_size: int | None
    forwards: float = 0
    resid_mid: Tensor | None = None  # the last layer's residual stream after attention (models with an MLP)
    last: tuple = ()  # the last layer's clean q, k, v and z (the answer-row path of edge_patching)

    @property
    def delta(self) -> Tensor:
        return self.ref_out - self.clean_out


def _sender_outputs(model: HookedTransformer, graph: ComputationalGraph, cache) -> Tensor:
    """``[batch, pos, sender, d_model]``: the input, each head's ``z_h W_O[h]`` and each MLP's output."""
    outs = [cache["blocks.0.hook_resid_pre"][:, :, None]]
    for l in range(graph.n_layers):
        outs.append(torch.einsum("bphe,hed->bphd", cache[f"blocks.{l}.attn.hook_z"], model.W_O[l]))
        if graph.has_mlp:
            outs.append(cache[f"blocks.{l}.hook_mlp_out"][:, :, None])
    return torch.cat(outs, 2)


def _cache_names(graph: ComputationalGraph) -> set[str]:
    L = graph.n_layers
    names = {f"blocks.{l}.hook_resid_pre" for l in range(L)} | {f"blocks.{L - 1}.hook_resid_post"}
    names |= {f"blocks.{l}.attn.hook_z" for l in range(L)}
    if graph.has_mlp:
        names |= {f"blocks.{l}.hook_mlp_out" for l in range(L)}
        if not graph.parallel:
            names.add(f"blocks.{L - 1}.hook_resid_mid")
    return names | {f"blocks.{L - 1}.attn.hook_{x}" for x in "qkv"}


def prepare(
    model: HookedTransformer,
    data,
    *,
    corrupted=None,
    ablation: str | None = None,
    metric: str | Callable = "logit_diff",
    batch_size: int | None = None,
    device: str | None = None,
) -> Context:
    """Check the arguments once and run the clean and reference forwards (see :class:`Context`)."""
    from .answer_cache import check_model_data

    check_device(model, device)
    check_batch_size(batch_size)
    check_graph_model(model)
    ablation = ablation or ("patch" if corrupted is not None else "mean")
    if ablation not in ABLATIONS:
        raise ConfigError(f"unknown ablation {ablation!r}; expected one of {ABLATIONS}")
    if ablation == "patch" and corrupted is None:
        raise TaskError(
            "ablation='patch' needs the corrupted run: pass corrupted=... (task data or tokens shaped like data), "
            "or ablation='mean' / 'zero'"
        )
    if ablation != "patch" and corrupted is not None:
        raise ConfigError(f"ablation={ablation!r} does not use corrupted data; pass ablation='patch' to patch from it")
    if isinstance(data, TaskData):
        check_model_data(model, data)
    dev = model_device(model)
    tokens = _tokens(data, "data").to(dev)
    check_tokens(model, tokens)
    check_finite_parameters(model)
    corr_tokens = None
    if corrupted is not None:
        if isinstance(corrupted, TaskData) and isinstance(data, TaskData):
            if corrupted.task != data.task:
                raise TaskError(f"data is of task {data.task!r} but corrupted data of task {corrupted.task!r}")
            if not torch.equal(corrupted.answer_pos.to(dev), data.answer_pos.to(dev)):
                raise TaskError("data and corrupted data must have their answers at the same positions")
        corr_tokens = _tokens(corrupted, "corrupted").to(dev)
        check_tokens(model, corr_tokens)
        if corr_tokens.shape != tokens.shape:
            raise TokenError(
                f"data and corrupted tokens must have the same shape, got {tuple(tokens.shape)} and "
                f"{tuple(corr_tokens.shape)}"
            )
    vm = circuit_metric(metric, data, corrupted)
    if vm.positions is not None and model.cfg.attention_dir == "causal":  # later positions cannot reach the answer
        keep_to = int(vm.positions.max()) + 1
        tokens = tokens[:, :keep_to]
        corr_tokens = None if corr_tokens is None else corr_tokens[:, :keep_to]
    graph = computational_graph(model)
    names = _cache_names(graph)
    with torch.inference_mode():
        logits, cache = model.run_with_cache(tokens, names_filter=lambda n: n in names)
        clean_out = _sender_outputs(model, graph, cache)
        resid = [cache[f"blocks.{l}.hook_resid_pre"] for l in range(graph.n_layers)]
        resid.append(cache[f"blocks.{graph.n_layers - 1}.hook_resid_post"])
        full = float(vm.of_logits(logits))
        forwards = 1
        if ablation == "patch":
            _, ccache = model.run_with_cache(corr_tokens, names_filter=lambda n: n in names)
            ref_out = _sender_outputs(model, graph, ccache)
            forwards += 1
        elif ablation == "mean":
            ref_out = clean_out.mean(0, keepdim=True)
        else:
            ref_out = torch.zeros_like(clean_out[:1])
    ref_input = ref_out[:, :, 0].expand_as(resid[0]).clone()
    mid = cache.cache_dict.get(f"blocks.{graph.n_layers - 1}.hook_resid_mid")
    return Context(
        model, graph, tokens, vm, ablation, resid, clean_out.clone(), ref_out.clone(), ref_input, full, batch_size,
        forwards, None if mid is None else mid.clone(),
        tuple(cache[f"blocks.{graph.n_layers - 1}.attn.hook_{x}"].clone() for x in "qkvz"),
    )  # fmt: skip


class _Flags:
    """Turn on TransformerLens' split q/k/v inputs and ``hook_mlp_in`` for the call, and back afterwards."""

    def __init__(self, model: HookedTransformer):
        self.model = model

    def __enter__(self):
        cfg = self.model.cfg
        self.was = (cfg.use_split_qkv_input, cfg.use_hook_mlp_in)
        cfg.use_split_qkv_input = True
        if not cfg.attn_only:
            cfg.use_hook_mlp_in = True
        return self

    def __exit__(self, *exc):
        self.model.cfg.use_split_qkv_input, self.model.cfg.use_hook_mlp_in = self.was


def _chunk(ctx: Context) -> int:
    """Variants per stacked chunk: ``batch_size`` sequences (or the automatic budget) over the batch."""
    B, T = ctx.tokens.shape
    return max(1, _rows_per_chunk(ctx.model, T, ctx.batch_size) // B)


# -- exact per-edge patching ---------------------------------------------------------------------------------------


def edge_patching(ctx: Context) -> Float[Tensor, " edge"]:
    """``M(edge e patched alone) - M(clean)`` for every edge, exactly: the edges into the receivers of each layer
    are stacked along the batch axis (``batch_size`` sequences per chunk) and run from that layer on, each adding
    ``ref_s - out_s`` to its receiver's input alone."""
    g, model = ctx.graph, ctx.model
    B, T = ctx.tokens.shape
    H, K, d = g.n_heads, g.n_kv_heads, model.cfg.d_model
    delta = ctx.delta.expand(B, -1, -1, -1) if ctx.delta.shape[0] != B else ctx.delta
    r_idx, s_idx = g.edge_tensor(ctx.tokens.device)
    layer_of = torch.tensor(g.receiver_layer, device=ctx.tokens.device)[r_idx]
    out = torch.full((g.n_edges,), float("nan"), device=ctx.tokens.device)
    chunk = _chunk(ctx)
    with _Flags(model), torch.inference_mode():
        rows_ok = ctx.metric.positions is not None and _query_rows_apply(model, split_ok=True)
        for l in range(g.n_layers + 1):
            edges = (layer_of == l).nonzero().squeeze(-1)
            slots = g.receiver_slots(l) if l < g.n_layers else {}
            # the answer-row paths (the logits; the last layer) hold [variant, batch, pos, d_model] at most
            light = l == g.n_layers or (l == g.n_layers - 1 and rows_ok)
            step = max(1, (ctx.batch_size or LIGHT_ROWS) // B) if light else chunk
            for c in range(0, len(edges), step):
                part = edges[c : c + step]
                n = len(part)
                dv = delta[:, :, s_idx[part]].permute(2, 0, 1, 3)  # [n, batch, pos, d_model]
                if l == g.n_layers:  # the logits: the last residual stream plus the change, then unembed
                    resid = (ctx.resid[-1][None] + dv).reshape(n * B, T, d)
                    vals = _stacked_run(model, resid, ctx.tokens, l, [], ctx.metric, n)
                elif l == g.n_layers - 1 and rows_ok:  # the last layer: the answer rows only
                    vals = _last_layer_edges(ctx, part, dv, slots, r_idx)
                else:
                    hooks = []
                    for letter, width in (("q", H), ("k", K), ("v", K)):
                        add = _slot_add(r_idx[part], dv, slots[letter][0], width)
                        if add is not None:
                            hooks.append(
                                (f"blocks.{l}.hook_{letter}_input", lambda x, hook, a=add: x + a.flatten(0, 1))
                            )
                    if slots["mlp"]:
                        sel = r_idx[part] == slots["mlp"][0]
                        if sel.any():
                            add = torch.where(sel[:, None, None, None], dv, 0.0)
                            hooks.append((f"blocks.{l}.hook_mlp_in", lambda x, hook, a=add: x + a.flatten(0, 1)))
                    resid = ctx.resid[l].repeat(n, 1, 1)
                    vals = _stacked_run(model, resid, ctx.tokens, l, hooks, ctx.metric, n)
                ctx.forwards += n
                out[part] = vals.float().to(out.device) - ctx.full
    return out.cpu()


def _slot_add(r: Tensor, dv: Tensor, base: int, width: int) -> Tensor | None:
    """``[n, batch, pos, width, d_model]``: each variant's change in the slot of its receiver among ``base ..
    base + width - 1`` (zero for the variants whose receiver is elsewhere), or None when no variant's is there."""
    sel = (r >= base) & (r < base + width)
    if not sel.any():
        return None
    n, B, T, d = dv.shape
    add = torch.zeros(n, B, T, width, d, device=dv.device, dtype=dv.dtype)
    v = sel.nonzero().squeeze(-1)
    add[v, :, :, r[v] - base] = dv[v]
    return add


def _last_layer_edges(ctx: Context, part: Tensor, dv: Tensor, slots: dict, r_idx: Tensor) -> Tensor:
    """The metric of edges into the last layer's receivers, computing only the answer rows (exact for the plain
    softmax attention of :func:`interp.analyses.patching._query_rows_apply`): the q/k/v inputs through the
    query-row forward of :mod:`interp.analyses.patching` (keys and values at every position, the query and the
    attention row at the answer only), the MLP input at the answer row (the MLP acts per position)."""
    model, g = ctx.model, ctx.graph
    n, B, _T, _d = dv.shape
    L = g.n_layers - 1
    r = r_idx[part]
    vals = torch.empty(n, device=dv.device)
    mlp = r == slots["mlp"][0] if slots["mlp"] else torch.zeros_like(r, dtype=torch.bool)
    attn = (~mlp).nonzero().squeeze(-1)
    if len(attn):
        vals[attn] = _last_layer_heads(ctx, r[attn], dv[attn], slots)
    if mlp.any():
        idx = mlp.nonzero().squeeze(-1)
        at = ctx.metric.positions.to(dv.device)
        b = torch.arange(B, device=dv.device)
        mid = ctx.resid_mid[b, at]  # [batch, d_model]: the last layer's clean residual stream after attention
        x = mid[None] + dv[idx][:, b, at]
        blk = model.blocks[L]
        out = mid[None] + blk.mlp(blk.ln2(x))
        vals[idx] = _unembed_rows(model, out, ctx.metric)
    return vals


def _last_layer_heads(ctx: Context, r: Tensor, dv: Tensor, slots: dict) -> Tensor:
    """The metric of edges into a q, k or v input of a last-layer head: only that head's output changes, and only
    the answer row is read, so each variant recomputes one head's query at the answer (or its keys or values at every
    position) and one attention row, and adds the change of that head's output to the cached clean row."""
    model, g = ctx.model, ctx.graph
    blk, a = model.blocks[-1], model.blocks[-1].attn
    n, B, T, _d = dv.shape
    H = g.n_heads
    dev = dv.device
    at = ctx.metric.positions.to(dev)
    b = torch.arange(B, device=dev)
    q_c, k_c, v_c, z_c = ctx.last  # clean q, k, v, z of the last layer: [batch, pos, head, d_head]
    letter = torch.full((n,), 0, dtype=torch.long, device=dev)
    head = r - slots["q"][0]
    is_k = (r >= slots["k"][0]) & (r < slots["k"][0] + H)
    is_v = r >= slots["v"][0]
    letter[is_k], letter[is_v] = 1, 2
    head = torch.where(is_k, r - slots["k"][0], torch.where(is_v, r - slots["v"][0], head))
    spe = model.pos_embed(ctx.tokens) if model.cfg.positional_embedding_type == "shortformer" else None
    x = ctx.resid[g.n_layers - 1]  # the residual stream entering the last layer
    h_in = blk.ln1(x[None] + dv)  # [n, batch, pos, d_model]: the patched input, normalised
    h_qk = h_in + spe[None] if spe is not None else h_in
    q = q_c[:, :, head].permute(2, 0, 1, 3).clone()  # [n, batch, pos, d_head]
    k = k_c[:, :, head].permute(2, 0, 1, 3).clone()
    v = v_c[:, :, head].permute(2, 0, 1, 3).clone()
    for which, W, bias, src in ((0, a.W_Q, a.b_Q, h_qk), (1, a.W_K, a.b_K, h_qk), (2, a.W_V, a.b_V, h_in)):
        sel = (letter == which).nonzero().squeeze(-1)
        if len(sel):
            new = torch.einsum("nbpd,nde->nbpe", src[sel], W[head[sel]]) + bias[head[sel]][:, None, None]
            (q, k, v)[which][sel] = new
    q_row = q[:, b, at]  # [n, batch, d_head]
    scores = torch.einsum("nbe,nbte->nbt", q_row, k) / a.attn_scale
    future = torch.arange(T, device=dev)[None, :] > at[:, None]
    pattern = scores.masked_fill(future[None], float("-inf")).softmax(-1)
    z = torch.einsum("nbt,nbte->nbe", pattern, v)
    dz = z - z_c[b, at][:, head].permute(1, 0, 2)  # [n, batch, d_head]
    change = torch.einsum("nbe,ned->nbd", dz, a.W_O[head])
    if model.cfg.attn_only:
        return _unembed_rows(model, ctx.resid[-1][b, at][None] + change, ctx.metric)
    mid = ctx.resid_mid[b, at][None] + change
    return _unembed_rows(model, mid + blk.mlp(blk.ln2(mid)), ctx.metric)


def _unembed_rows(model: HookedTransformer, rows: Float[Tensor, "n batch d_model"], metric: VariantMetric) -> Tensor:
    """The metric of residual streams leaving the model at the answer rows."""
    from transformer_lens.utilities.activation_functions import apply_softcap

    x = rows[:, :, None]
    if model.cfg.normalization_type is not None:
        x = model.ln_final(x)
    logits = apply_softcap(model.unembed(x), model.cfg.output_logits_soft_cap)[:, :, 0]
    return metric(logits).float()


# -- EAP and EAP-IG ------------------------------------------------------------------------------------------------


def edge_attribution(ctx: Context, steps: int = 1) -> Float[Tensor, " edge"]:
    """EAP (``steps=1``) or EAP-IG (``steps > 1``) scores of every edge (see the module doc): the gradient of the
    metric at each receiver's input, averaged over the interpolated inputs ``ref + k/steps (clean - ref)`` (``k =
    1..steps``), dotted with each sender's ``ref_s - out_s`` and summed over positions. Examples are chunked by
    ``batch_size`` for the built-in metrics (means over examples, so the chunks' gradients add up exactly); a
    callable metric gets the whole batch at once."""
    if not isinstance(steps, int) or isinstance(steps, bool) or steps < 1:
        raise ConfigError(f"steps must be a positive integer (1 = EAP, more = EAP-IG), got {steps!r}")
    g, model = ctx.graph, ctx.model
    B, T = ctx.tokens.shape
    d = model.cfg.d_model
    chunks = [torch.arange(B, device=ctx.tokens.device)]
    if ctx.metric.positions is not None:
        rows = ctx.batch_size or _rows_per_chunk(model, T, None)
        chunks = list(torch.arange(B, device=ctx.tokens.device).split(max(1, rows)))
    per = torch.zeros(g.n_receivers, g.n_senders, device=ctx.tokens.device)
    clean_in, ref_in = ctx.resid[0], ctx.ref_input
    delta = ctx.delta.expand(B, -1, -1, -1)
    with _Flags(model):
        for idx in chunks:
            grads = torch.zeros(len(idx), T, g.n_receivers, d, device=ctx.tokens.device)
            for k in range(1, steps + 1):
                alpha = k / steps
                grads += _receiver_grads(ctx, idx, ref_in[idx] + alpha * (clean_in[idx] - ref_in[idx]), B)
                ctx.forwards += len(idx) / B
            per += torch.einsum("bprd,bpsd->rs", grads / steps, delta[idx])
    r, s = g.edge_tensor(per.device)
    return per[r, s].detach().float().cpu()


def _receiver_grads(ctx: Context, idx: Tensor, first: Tensor, B: int) -> Tensor:
    """``[chunk, pos, receiver, d_model]``: the gradient of the metric (weighted by the chunk's share of the data)
    at every receiver's input, in a forward whose residual stream entering layer 0 is ``first``."""
    g, model = ctx.graph, ctx.model
    n, T = len(idx), ctx.tokens.shape[1]
    H, K, d = g.n_heads, g.n_kv_heads, model.cfg.d_model
    zeros: dict[str, Tensor] = {}
    hooks = [("blocks.0.hook_resid_pre", lambda x, hook: first.to(x.dtype))]
    for l in range(g.n_layers):
        for letter, width in (("q", H), ("k", K), ("v", K)):
            zeros[f"{l}{letter}"] = torch.zeros(n, T, width, d, device=first.device, requires_grad=True)
            hooks.append((f"blocks.{l}.hook_{letter}_input", lambda x, hook, z=zeros[f"{l}{letter}"]: x + z))
        if g.has_mlp:
            zeros[f"{l}mlp"] = torch.zeros(n, T, d, device=first.device, requires_grad=True)
            hooks.append((f"blocks.{l}.hook_mlp_in", lambda x, hook, z=zeros[f"{l}mlp"]: x + z))
    zeros["logits"] = torch.zeros(n, T, d, device=first.device, requires_grad=True)
    hooks.append((f"blocks.{g.n_layers - 1}.hook_resid_post", lambda x, hook: x + zeros["logits"]))
    with torch.enable_grad():
        logits = model.run_with_hooks(ctx.tokens[idx], fwd_hooks=hooks)
        m = ctx.metric
        if m.positions is not None:
            at = logits[torch.arange(n, device=logits.device), m.positions.to(logits.device)[idx]]
            value = chunk_metric(m, idx).fn(at[None])[0] * (n / B)
        else:
            value = m.fn(logits[None])[0]
        keys = list(zeros)
        got = torch.autograd.grad(value, [zeros[k] for k in keys], allow_unused=True)
    grad = dict(zip(keys, got))
    parts = []
    for l in range(g.n_layers):
        for letter in "qkv":
            gq = grad[f"{l}{letter}"]
            parts.append(torch.zeros_like(zeros[f"{l}{letter}"]) if gq is None else gq)
        if g.has_mlp:
            gm = grad[f"{l}mlp"]
            parts.append((torch.zeros_like(zeros[f"{l}mlp"]) if gm is None else gm)[:, :, None])
    gl = grad["logits"]
    parts.append((torch.zeros_like(zeros["logits"]) if gl is None else gl)[:, :, None])
    return torch.cat(parts, 2).detach()


# -- circuits: many edge masks in one stacked forward ------------------------------------------------------------


def circuit_metrics(ctx: Context, keep: Bool[Tensor, "n edge"], start: int = 0) -> Float[Tensor, " n"]:
    """The metric of each circuit (``keep[i]``: 1 = edge kept, 0 = patched with the sender's reference output minus
    its output in that run), stacked along the batch axis in chunks of ``batch_size`` sequences. ``start``: the
    first layer whose receivers lose an edge (the run starts there from the clean residual stream, every earlier
    sender at its clean output); every circuit must keep every edge into an earlier layer (refused otherwise)."""
    g = ctx.graph
    keep = torch.as_tensor(keep, dtype=torch.bool, device=ctx.tokens.device)
    if keep.ndim == 1:
        keep = keep[None]
    if keep.ndim != 2 or keep.shape[1] != g.n_edges:
        raise InterpError(f"keep must be [n, {g.n_edges}] (one row per circuit, one column per edge), got "
                          f"{tuple(keep.shape)}")  # fmt: skip
    r_idx, _ = g.edge_tensor(keep.device)
    layer_of = torch.tensor(g.receiver_layer, device=keep.device)[r_idx]
    if start > 0 and not bool(keep[:, layer_of < start].all()):
        raise InterpError(f"internal: a circuit removes an edge into a layer before start={start}")
    out = []
    chunk = _chunk(ctx)
    with _Flags(ctx.model), torch.inference_mode():
        for c in range(0, keep.shape[0], chunk):
            out.append(_masked_run(ctx, keep[c : c + chunk], start))
    return torch.cat(out).float().cpu()


def _masked_run(ctx: Context, keep: Tensor, start: int) -> Tensor:
    g, model = ctx.graph, ctx.model
    n = keep.shape[0]
    B, T = ctx.tokens.shape
    H, _K, d, L = g.n_heads, g.n_kv_heads, model.cfg.d_model, g.n_layers
    ablate = g.matrix((~keep).to(ctx.clean_out.dtype))  # [n, receiver, sender]
    sl = torch.tensor(g.sender_layer, device=keep.device)
    diff = (ctx.delta * (sl < start)[:, None].to(ctx.delta.dtype)).expand(B, -1, -1, -1)
    diff = diff[None].repeat(n, 1, 1, 1, 1)  # [n, batch, pos, sender, d_model]: reference minus output in this run
    ref = ctx.ref_out

    def record_heads(l):
        ids = [g.sender_index(l, h) for h in range(H)]

        def hook(z, hook):
            o = torch.einsum("bphe,hed->bphd", z, model.W_O[l]).view(n, B, T, H, d)
            diff[:, :, :, ids] = ref[None, :, :, ids] - o
            return z

        return hook

    def record_mlp(l):
        i = g.sender_index(l)

        def hook(x, hook):
            diff[:, :, :, i] = ref[None, :, :, i] - x.view(n, B, T, d)
            return x

        return hook

    def add(rows, per_slot: bool):
        A = ablate[:, rows]  # [n, slot, sender]

        def hook(x, hook):
            if per_slot:
                return x + torch.einsum("nhs,nbpsd->nbphd", A, diff).flatten(0, 1)
            return x + torch.einsum("ns,nbpsd->nbpd", A[:, 0], diff).flatten(0, 1)

        return hook

    ctx.forwards += n
    logits_row = g.n_receivers - 1
    if start >= L:
        resid = (ctx.resid[-1][None] + torch.einsum("ns,nbpsd->nbpd", ablate[:, logits_row], diff)).flatten(0, 1)
        return _stacked_run(model, resid, ctx.tokens, L, [], ctx.metric, n)
    hooks = []
    for l in range(start, L):
        slots = g.receiver_slots(l)
        for letter in "qkv":
            hooks.append((f"blocks.{l}.hook_{letter}_input", add(slots[letter], True)))
        hooks.append((f"blocks.{l}.attn.hook_z", record_heads(l)))
        if g.has_mlp:
            hooks.append((f"blocks.{l}.hook_mlp_in", add(slots["mlp"], False)))
            hooks.append((f"blocks.{l}.hook_mlp_out", record_mlp(l)))
    hooks.append((f"blocks.{L - 1}.hook_resid_post", add([logits_row], False)))
    resid = ctx.resid[start].repeat(n, 1, 1)
    return _stacked_run(model, resid, ctx.tokens, start, hooks, ctx.metric, n)


# -- ACDC ----------------------------------------------------------------------------------------------------------


def acdc(ctx: Context, tau: float) -> tuple[Tensor, Tensor]:
    """ACDC's greedy pass (Conmy et al. 2023): receivers from the logits back to layer 0, each one's incoming edges
    from the latest sender back; an edge is removed for good when removing it moves the metric's distance from the
    full model's, ``|M(circuit) - M(full)|``, by less than ``tau``. Returns ``(keep [edge], effect [edge])``, the
    effect being the change of that distance when the edge was tested (what the decision compared with ``tau``).
    One forward per edge, each started at its receiver's layer (every earlier edge is still in place then)."""
    if not isinstance(tau, (int, float)) or isinstance(tau, bool) or not tau >= 0:
        raise ConfigError(
            f"tau must be a non-negative number (the largest change of the metric tolerated), got {tau!r}"
        )
    g = ctx.graph
    keep = torch.ones(g.n_edges, dtype=torch.bool, device=ctx.tokens.device)
    effect = torch.full((g.n_edges,), float("nan"))
    by_receiver: dict[int, list[int]] = {}
    for e, (r, _s) in enumerate(g.edges):
        by_receiver.setdefault(r, []).append(e)
    order = sorted(by_receiver, key=lambda r: (-g.receiver_layer[r], -r))
    current = 0.0
    for r in order:
        start = g.receiver_layer[r]
        for e in sorted(by_receiver[r], key=lambda e: -g.edges[e][1]):
            trial = keep.clone()
            trial[e] = False
            m = float(circuit_metrics(ctx, trial[None], start)[0])
            dist = abs(m - ctx.full)
            effect[e] = dist - current
            if dist - current < tau:
                keep, current = trial, dist
    return keep.cpu(), effect
