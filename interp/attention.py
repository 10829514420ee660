"""Attention variants inside a plain ``HookedTransformer``: the masks, kernels, pooling scores and Q/K/V constraints
that :func:`interp.model.build_model` installs from ``ModelSpec.attention`` / ``ModelSpec.qkv`` (spellings in
:mod:`interp.variants`; Conti, *The Math behind transformers*, §2.1 and §3).

Every variant keeps TransformerLens' forward and its standard hook names, so every analysis that reads or patches
``hook_q``/``hook_k``/``hook_v``, ``hook_attn_scores``, ``hook_pattern`` or ``hook_z`` sees the real attention:

- **Poolings** are scores in softmax-logit space, which TransformerLens' own softmax then normalises. The model's
  attention modules get an instance ``calculate_attention_scores`` (TransformerLens' own extension point, the one
  grouped-query attention overrides) that returns, for ``linear:φ``, ``log(φ(q)·φ(k))`` (so the softmax gives
  exactly ``φ(q_i)·φ(k_j) / Σ_{j'≤i} φ(q_i)·φ(k_j')``, Katharopoulos et al. 2020, *Transformers are RNNs*; a zero
  kernel is ``-inf``: no weight) and, for ``additive``, ``v_h·tanh(q_i + k_j)`` (Bahdanau et al. 2015; ``v_h`` is
  the parameter ``blocks.L.attn.additive_v [n_heads, d_head]``, saved beside TransformerLens' own). So
  ``hook_attn_scores`` holds the pooling's logits and ``hook_pattern`` the normalised pattern. A row whose keys all
  weigh zero (a ``relu`` query with no positive feature, a sparse mask with no key) attends to nothing, as
  TransformerLens treats a fully masked row (its NaN -> 0): that head writes 0 there.
- **Sparse masks** (Beltagy et al. 2020, *Longformer*; Zaheer et al. 2020, *Big Bird*): a lone ``window:W`` is
  TransformerLens' own local attention (``use_local_attn``, ``window_size``; plain TransformerLens rebuilds it from
  the checkpoint's ``tl_config``); every other mask is a forward hook on ``hook_attn_scores`` (installed with the
  model, like :mod:`interp.positions`) that puts ``-inf`` on the keys outside the mask, before the softmax (user
  hooks on ``hook_attn_scores`` see the masked scores, as they see TransformerLens' causal mask).
- **Q/K/V constraints**: an instance ``calculate_qkv_matrices`` that projects with the constrained matrices
  (``W * mask`` for ``diagonal`` and ``sparse:F``, so the fixed zeros get no gradient and stay exactly zero;
  ``A @ B`` for ``lowrank:R``, from the parameters ``blocks.L.attn.lowrank_{Q,K,V}_{A,B}``), then fires
  ``hook_q``/``hook_k``/``hook_v`` as TransformerLens does. TransformerLens' ``W_Q``/``W_K``/``W_V`` hold the
  constrained matrices themselves (for ``lowrank`` a frozen copy of ``A @ B``, refreshed before every forward, at
  load and at save), so circuits and every weight-based analysis read them unchanged.

:func:`layer_attention` says what a layer computes (also for a plain TransformerLens model, where it is softmax,
perhaps with TransformerLens' local window); :func:`pair_scores`, :func:`key_mask` and :func:`attention_pattern`
are the one implementation of scores, masks and the pattern that the hand-written forwards (the query-restricted
forward, the population trainer, the fast paths of :mod:`interp.fast_attention`) share with the hooked one.
"""

from __future__ import annotations

import hashlib
import random
from dataclasses import dataclass
from functools import lru_cache
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from jaxtyping import Bool, Float, Int
from torch import Tensor

from .errors import CheckpointError, ConfigError
from .variants import Mask, parse_attention, parse_qkv

if TYPE_CHECKING:
    from transformer_lens import HookedTransformer

    from .configs import ModelSpec

QKV_NAMES = ("Q", "K", "V")
ADDITIVE = "additive_v"  # the additive pooling's parameter, per layer: blocks.L.attn.additive_v [n_heads, d_head]


def lowrank_names(which: str) -> tuple[str, str]:
    """The factor parameters of ``W_<which>`` under ``lowrank:R``: ``lowrank_<which>_A`` ``[d_model, R]`` and
    ``lowrank_<which>_B`` ``[R, n_heads * d_head]``."""
    return f"lowrank_{which}_A", f"lowrank_{which}_B"


# -- scores ---------------------------------------------------------------------------------------------------------
def features(pooling: str, x: Float[Tensor, "*any"]) -> Float[Tensor, "*any"]:
    """The feature map ``φ`` of linear attention: ``elu(x) + 1`` (``linear:elu``) or ``relu(x)`` (``linear:relu``)."""
    if pooling == "linear:elu":
        return F.elu(x) + 1
    if pooling == "linear:relu":
        return F.relu(x)
    raise ConfigError(f"{pooling!r} has no feature map; linear attention is linear:elu or linear:relu")


def log_kernel(kernel: Float[Tensor, "*any"]) -> Float[Tensor, "*any"]:
    """``log`` of a non-negative kernel with ``-inf`` where it is 0 (and no gradient there: no NaN from ``1/0``)."""
    return torch.where(kernel > 0, kernel.clamp_min(torch.finfo(kernel.dtype).tiny).log(), float("-inf"))


def pair_scores(
    pooling: str,
    q: Float[Tensor, "*batch query d_head"],
    k: Float[Tensor, "*batch key d_head"],
    attn_scale: float,
    additive_v: Float[Tensor, "*vbatch d_head"] | None = None,
) -> Float[Tensor, "*batch query key"]:
    """Scores (softmax logits) of every query against every key under ``pooling``; leading axes broadcast (heads
    among them). ``additive_v`` is ``v`` with leading axes that broadcast against ``batch`` (``[heads, d_head]`` for
    ``[batch, heads, pos, d_head]`` inputs)."""
    if pooling == "softmax":
        return q @ k.transpose(-1, -2) / attn_scale
    if pooling in ("linear:elu", "linear:relu"):
        return log_kernel(features(pooling, q) @ features(pooling, k).transpose(-1, -2))
    if pooling == "additive":
        if additive_v is None:
            raise ConfigError("additive pooling needs its parameter v (blocks.L.attn.additive_v)")
        return (torch.tanh(q[..., :, None, :] + k[..., None, :, :]) * additive_v[..., None, None, :]).sum(-1)
    raise ConfigError(f"unknown pooling {pooling!r}")


def attention_pattern(scores: Float[Tensor, "*any key"]) -> Float[Tensor, "*any key"]:
    """``softmax`` over keys with TransformerLens' convention for a row with no key (all ``-inf``): zeros."""
    pattern = scores.softmax(-1)
    return torch.where(torch.isnan(pattern), torch.zeros_like(pattern), pattern)


# -- masks ----------------------------------------------------------------------------------------------------------
def _random_keys(seed: int, layer: int, i: int, r: int) -> list[int]:
    """``min(r, i)`` distinct keys among ``0 .. i-1`` for query ``i``: drawn per query from ``(seed, layer, i)``, so
    a query's keys do not depend on the sequence length."""
    return random.Random(f"interp-random-keys/{seed}/{layer}/{i}").sample(range(i), min(r, i))


@lru_cache(maxsize=64)
def _key_lists(masks: tuple[Mask, ...], n: int, seed: int, layer: int) -> tuple[Tensor, Tensor]:
    idx = []
    for m in masks:
        if m.kind == "window":
            idx.append(torch.arange(n)[:, None] - torch.arange(m.args[0])[None])
        elif m.kind == "dilated":
            w, d = m.args
            idx.append(torch.arange(n)[:, None] - d * torch.arange(w)[None])
        elif m.kind == "global":
            idx.append(torch.arange(m.args[0]).expand(n, -1))
        elif m.kind == "random":
            r = m.args[0]
            rows = [_random_keys(seed, layer, i, r) for i in range(n)]
            idx.append(torch.tensor([row + [-1] * (r - len(row)) for row in rows], dtype=torch.long).view(n, r))
        else:
            raise ConfigError(f"unknown mask {m}")
    keys = torch.cat(idx, 1) if idx else torch.empty(n, 0, dtype=torch.long)
    keys = torch.where((keys >= 0) & (keys <= torch.arange(n)[:, None]), keys, -1)
    keys = keys.sort(1, descending=True).values  # duplicates become neighbours; -1 (no key) go last
    dup = torch.zeros_like(keys, dtype=torch.bool)
    dup[:, 1:] = keys[:, 1:] == keys[:, :-1]
    keys = torch.where(dup, -1, keys).sort(1, descending=True).values
    width = int((keys >= 0).sum(1).max()) if n else 0
    keys = keys[:, : max(width, 1)]
    return keys, keys >= 0


def key_lists(
    masks: tuple[Mask, ...], n: int, seed: int = 0, layer: int = 0, device=None
) -> tuple[Int[Tensor, "query slot"], Bool[Tensor, "query slot"]]:
    """The keys each of ``n`` queries sees under the union of ``masks`` (causal: never a later key), as index lists
    ``keys[i, s]`` with ``valid[i, s]`` (unused slots hold key 0): ``O(n x keys per query)``, the form of the fast
    sparse forward. Deterministic (random keys from ``seed`` and ``layer``)."""
    keys, valid = _key_lists(tuple(masks), int(n), int(seed), int(layer))
    return keys.clamp(min=0).to(device), valid.to(device)


def key_mask(
    masks: tuple[Mask, ...], n_query: int, n_key: int | None = None, seed: int = 0, layer: int = 0, device=None
) -> Bool[Tensor, "query key"]:
    """``allowed[i, j]``: whether query ``i`` may see key ``j`` (causal, and inside the masks' union; with no mask
    every earlier key). Queries are the last ``n_query`` of ``n_key`` positions (as with a key-value cache)."""
    n_key = n_query if n_key is None else n_key
    causal = torch.ones(n_key, n_key, dtype=torch.bool, device=device).tril()
    if masks:
        keys, valid = _key_lists(tuple(masks), int(n_key), int(seed), int(layer))
        allowed = torch.zeros(n_key, n_key + 1, dtype=torch.bool)
        allowed.scatter_(1, torch.where(valid, keys, n_key), True)  # unused slots write to the extra column
        causal = causal & allowed[:, :n_key].to(device)
    return causal[n_key - n_query :]


class MaskHook:
    """The forward hook on ``blocks.L.attn.hook_attn_scores`` that puts ``-inf`` on the keys outside the layer's
    sparse mask (``torch.where``: no gradient reaches a masked score, so an empty row never sends NaN back)."""

    def __init__(self, masks: tuple[Mask, ...], seed: int, layer: int):
        self.masks, self.seed, self.layer = tuple(masks), int(seed), int(layer)

    def __call__(self, module, args, output):
        allowed = key_mask(self.masks, output.shape[-2], output.shape[-1], self.seed, self.layer, output.device)
        return torch.where(allowed, output, torch.full((), float("-inf"), dtype=output.dtype, device=output.device))


class PoolingScores:
    """An attention module's ``calculate_attention_scores`` under a pooling other than softmax (see the module doc);
    same inputs and output as TransformerLens' own: ``q [batch, query, head, d_head]``, ``k [batch, key, head,
    d_head]`` -> ``[batch, head, query, key]``."""

    def __init__(self, attn, pooling: str):
        self.attn, self.pooling = attn, pooling

    def __call__(self, q, k):
        a = self.attn
        v = getattr(a, ADDITIVE) if self.pooling == "additive" else None
        return pair_scores(self.pooling, q.transpose(1, 2), k.transpose(1, 2), a.attn_scale, v)


class ConstrainedQKV:
    """An attention module's ``calculate_qkv_matrices`` with constrained ``W_Q``/``W_K``/``W_V`` (see the module doc):
    TransformerLens' projection and hooks, with :func:`qkv_weights` for the matrices."""

    def __init__(self, attn, kind: str):
        self.attn, self.kind = attn, kind

    def __call__(self, query_input, key_input, value_input):
        from transformer_lens.utilities.attention import complex_attn_linear, simple_attn_linear

        a = self.attn
        fn = complex_attn_linear if a.cfg.use_split_qkv_input or a.cfg.use_attn_in else simple_attn_linear
        W_Q, W_K, W_V = qkv_weights(a)
        if self.kind == "lowrank":
            _mirror(a, (W_Q, W_K, W_V))
        q = a.hook_q(fn(query_input, W_Q, a.b_Q))
        k = a.hook_k(fn(key_input, W_K, a.b_K))
        v = a.hook_v(fn(value_input, W_V, a.b_V))
        return q, k, v


def _mirror(attn, weights) -> None:
    """Copy the low-rank products into TransformerLens' (frozen) ``W_Q``/``W_K``/``W_V``."""
    with torch.no_grad():
        for which, w in zip(QKV_NAMES, weights):
            getattr(attn, f"W_{which}").copy_(w.detach())


def _factor_product(A: Tensor, B: Tensor, n_heads: int) -> Tensor:
    """``A @ B`` (``[..., d_model, R] @ [..., R, n_heads * d_head]``) as TransformerLens' ``[..., n_heads, d_model,
    d_head]``."""
    W = A @ B
    return W.unflatten(-1, (n_heads, -1)).movedim(-2, -3)


def qkv_weights(attn) -> tuple[Tensor, Tensor, Tensor]:
    """The matrices ``W_Q, W_K, W_V`` ``[n_heads, d_model, d_head]`` a layer projects with, differentiable in the
    parameters that are trained (masked for ``diagonal``/``sparse``, the factors' product for ``lowrank``)."""
    impl = attn.__dict__.get("calculate_qkv_matrices")
    out = []
    for which in QKV_NAMES:
        W = getattr(attn, f"W_{which}")
        if isinstance(impl, ConstrainedQKV):
            if impl.kind == "lowrank":
                a, b = (getattr(attn, n) for n in lowrank_names(which))
                W = _factor_product(a, b, attn.cfg.n_heads)
            else:
                W = W * getattr(attn, f"qkv_mask_{which}")
        out.append(W)
    return tuple(out)


def stacked_qkv(P: dict[str, Tensor], n_heads: int, masks: dict[str, Tensor] | None, layer: int = 0) -> dict:
    """``P`` (parameters by state-dict name, with any leading axes such as a population's) with ``W_Q``, ``W_K``,
    ``W_V`` of ``layer`` replaced by the matrices the layer projects with: ``masks`` (``{"Q": mask, ...}``, see
    :func:`qkv_masks`) multiplied in, or the product of the low-rank factors where ``P`` holds them."""
    out = dict(P)
    for which in QKV_NAMES:
        name = f"blocks.{layer}.attn.W_{which}"
        a, b = (f"blocks.{layer}.attn.{n}" for n in lowrank_names(which))
        if a in P:
            out[name] = _factor_product(P[a], P[b], n_heads)
        elif masks:
            out[name] = P[name] * masks[which].to(P[name].dtype)
    return out


def qkv_masks(model: HookedTransformer, layer: int = 0) -> dict[str, Tensor] | None:
    """``{"Q"|"K"|"V": [n_heads, d_model, d_head]}``, 1 for the free entries, where the layer's Q/K/V are
    ``diagonal`` or ``sparse``; None otherwise."""
    attn = model.blocks[layer].attn
    impl = attn.__dict__.get("calculate_qkv_matrices")
    if not isinstance(impl, ConstrainedQKV) or impl.kind == "lowrank":
        return None
    return {w: getattr(attn, f"qkv_mask_{w}") for w in QKV_NAMES}


# -- what a layer computes --------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class LayerAttention:
    """What one attention layer computes: its pooling, its sparse masks (TransformerLens' local window included, as
    ``window:W``; empty: dense causal), the seed and layer its random keys come from, and its Q/K/V shape."""

    pooling: str = "softmax"
    masks: tuple[Mask, ...] = ()
    seed: int = 0
    layer: int = 0
    qkv: str = "full"

    @property
    def is_softmax(self) -> bool:
        """Plain dense causal softmax attention (the Q/K/V shape aside)."""
        return self.pooling == "softmax" and not self.masks

    def allowed(self, n_query: int, n_key: int | None = None, device=None) -> Bool[Tensor, "query key"]:
        return key_mask(self.masks, n_query, n_key, self.seed, self.layer, device)


def layer_attention(model: HookedTransformer, layer: int = 0) -> LayerAttention:
    """What layer ``layer`` of ``model`` computes (any HookedTransformer: a plain one is softmax)."""
    attn = model.blocks[layer].attn
    scores = attn.__dict__.get("calculate_attention_scores")
    pooling = scores.pooling if isinstance(scores, PoolingScores) else "softmax"
    hooks = [h for h in attn.hook_attn_scores._forward_hooks.values() if isinstance(h, MaskHook)]
    masks, seed = (hooks[0].masks, hooks[0].seed) if hooks else ((), 0)
    if getattr(attn, "attn_type", "global") == "local":
        masks = (Mask("window", (int(model.cfg.window_size),)), *masks)
    qkv = attn.__dict__.get("calculate_qkv_matrices")
    return LayerAttention(pooling, masks, seed, layer, qkv.kind if isinstance(qkv, ConstrainedQKV) else "full")


def attention_of(model: HookedTransformer) -> list[LayerAttention]:
    return [layer_attention(model, l) for l in range(model.cfg.n_layers)]


def is_variant(model: HookedTransformer) -> bool:
    """Whether any layer computes something other than dense causal softmax attention (Q/K/V shapes aside)."""
    return not all(a.is_softmax for a in attention_of(model))


def is_plain(model: HookedTransformer) -> bool:
    """Whether every layer is TransformerLens' own attention: dense causal softmax with full Q/K/V matrices."""
    return all(a.is_softmax and a.qkv == "full" for a in attention_of(model))


def refuse_pooling(model: HookedTransformer, what: str, layers=None) -> None:
    """One ConfigError where a layer's pooling is not a bilinear ``q·k`` score, for analyses that read it as one
    (QK circuits, Q/K-composition): linear and additive scores are no ``W_E W_QK W_Eᵀ``."""
    for l in range(model.cfg.n_layers) if layers is None else layers:
        pooling = layer_attention(model, l).pooling
        if pooling != "softmax":
            why = (
                "its weights are φ(q)·φ(k), normalised, not exp(q·k)"
                if pooling.startswith("linear")
                else "its scores are v·tanh(q + k), not q·k"
            )
            raise ConfigError(
                f"{what} is a bilinear q·k score, undefined for layer {l}'s {pooling} pooling ({why}); the OV "
                "circuit, patterns and patching are defined"
            )


def scores_at(
    attn,
    q: Float[Tensor, "*batch head query d_head"],
    k: Float[Tensor, "*batch head key d_head"],
    query_pos: Int[Tensor, "*qbatch query"],
    spec: LayerAttention,
) -> Float[Tensor, "*batch head query key"]:
    """The layer's scores (softmax logits, ``-inf`` on later keys and outside the masks) of the queries at
    ``query_pos`` against every key ``0 .. key-1``: what ``hook_attn_scores`` holds in those rows."""
    v = getattr(attn, ADDITIVE) if spec.pooling == "additive" else None
    scores = pair_scores(spec.pooling, q, k, attn.attn_scale, v)
    t = k.shape[-2]
    allowed = spec.allowed(t, t, q.device)[query_pos]  # [*qbatch, query, key]
    return scores.masked_fill(~allowed.unsqueeze(-3), float("-inf"))


# -- building ---------------------------------------------------------------------------------------------------------
def _generator(*parts) -> torch.Generator:
    digest = hashlib.sha256("/".join(map(str, ("interp-attention", *parts))).encode()).hexdigest()
    return torch.Generator().manual_seed(int(digest[:15], 16))


def free_entries(
    kind: str, d_model: int, n_heads: int, d_head: int, fraction: float | None, seed: int, layer: int, which: str
) -> Bool[Tensor, "head d_model d_head"]:
    """The free-entry mask ``[n_heads, d_model, d_head]`` of one Q/K/V matrix under ``diagonal`` or ``sparse:F``."""
    width = n_heads * d_head
    if kind == "diagonal":
        full = torch.arange(d_model)[:, None] == (torch.arange(width)[None] % d_model)
    else:
        n_free = max(1, round(fraction * d_model * width))
        order = torch.randperm(d_model * width, generator=_generator("sparse", seed, layer, which))
        full = torch.zeros(d_model * width, dtype=torch.bool)
        full[order[:n_free]] = True
        full = full.view(d_model, width)
    return full.view(d_model, n_heads, d_head).transpose(0, 1).contiguous()


def install(model: HookedTransformer, spec: ModelSpec) -> None:
    """Give a freshly built ``model`` the attention variant of ``spec`` (see the module doc); the draws of new
    parameters (additive ``v``, low-rank factors) come from generators seeded by ``spec.init_seed`` and the layer."""
    att, qkv = parse_attention(spec.attention), parse_qkv(spec.qkv)
    for l, block in enumerate(model.blocks):
        attn = block.attn
        dev, dtype = attn.W_Q.device, attn.W_Q.dtype
        if att.pooling != "softmax":
            if att.pooling == "additive":
                v = torch.randn(spec.n_heads, spec.d_head, generator=_generator("additive", spec.init_seed, l))
                attn.register_parameter(ADDITIVE, torch.nn.Parameter((v / spec.d_head**0.5).to(dev, dtype)))
            attn.calculate_attention_scores = PoolingScores(attn, att.pooling)
        if att.hooked_masks:
            attn.hook_attn_scores.register_forward_hook(MaskHook(att.hooked_masks, spec.attention_seed, l))
        if qkv.kind == "full":
            continue
        with torch.no_grad():
            for which in QKV_NAMES:
                W = getattr(attn, f"W_{which}")
                if qkv.kind == "lowrank":
                    r = qkv.rank
                    std = (model.cfg.initializer_range / r**0.5) ** 0.5
                    g = _generator("lowrank", spec.init_seed, l, which)
                    shapes = ((spec.d_model, r), (r, spec.n_heads * spec.d_head))
                    for name, shape in zip(lowrank_names(which), shapes):
                        factor = torch.randn(*shape, generator=g) * std
                        attn.register_parameter(name, torch.nn.Parameter(factor.to(dev, dtype)))
                    W.requires_grad_(False)
                else:
                    m = free_entries(
                        qkv.kind, spec.d_model, spec.n_heads, spec.d_head, qkv.fraction, spec.attention_seed, l, which
                    )
                    attn.register_buffer(f"qkv_mask_{which}", m.to(dev, dtype), persistent=False)
                    W.mul_(m.to(dev, dtype))
        attn.calculate_qkv_matrices = ConstrainedQKV(attn, qkv.kind)
        if qkv.kind == "lowrank":
            _mirror(attn, qkv_weights(attn))
            attn.register_load_state_dict_post_hook(_sync_after_load)


def _sync_after_load(module, incompatible_keys) -> None:
    sync(module)


def sync(attn_or_model) -> None:
    """Refresh the frozen copies ``W_Q``/``W_K``/``W_V`` of low-rank factors (a no-op elsewhere)."""
    attns = [b.attn for b in attn_or_model.blocks] if hasattr(attn_or_model, "blocks") else [attn_or_model]
    for a in attns:
        impl = a.__dict__.get("calculate_qkv_matrices")
        if isinstance(impl, ConstrainedQKV) and impl.kind == "lowrank":
            _mirror(a, qkv_weights(a))


def extra_parameters(model: HookedTransformer) -> list[str]:
    """State-dict names of the variant's parameters beyond TransformerLens' own (additive ``v``, low-rank factors)."""
    return [
        n
        for n, _ in model.named_parameters()
        if n.rsplit(".", 1)[-1] == ADDITIVE or n.rsplit(".", 1)[-1].startswith("lowrank_")
    ]


def has_factors(model: HookedTransformer) -> bool:
    return any(n.rsplit(".", 1)[-1].startswith("lowrank_") for n in extra_parameters(model))


# -- parameter counts and checkpoint checks ----------------------------------------------------------------------------
def qkv_parameter_count(spec: ModelSpec) -> int:
    """Free parameters of one layer's ``W_Q``, ``W_K`` and ``W_V`` together under ``spec.qkv``."""
    qkv = parse_qkv(spec.qkv)
    d, width = spec.d_model, spec.n_heads * spec.d_head
    per = {
        "full": d * width,
        "diagonal": width,
        "sparse": max(1, round((qkv.fraction or 0) * d * width)),
        "lowrank": (qkv.rank or 0) * (d + width),
    }[qkv.kind]
    return 3 * per


def parameter_counts(model: HookedTransformer, spec: ModelSpec | None = None) -> dict[str, int]:
    """What the model card shows: the free parameters (trainable entries that are not fixed zeros), those of the
    attention's Q/K/V per layer, and the variant's extra parameters."""
    masked = 0
    for l in range(model.cfg.n_layers):
        m = qkv_masks(model, l)
        if m:
            masked += sum(int((x == 0).sum()) for x in m.values())
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    extra = sum(p.numel() for n, p in model.named_parameters() if n in set(extra_parameters(model)))
    out = {"free parameters": trainable - masked}
    if spec is not None:
        out["free Q/K/V entries per layer"] = qkv_parameter_count(spec)
        out["dense Q/K/V entries per layer"] = 3 * spec.d_model * spec.n_heads * spec.d_head
    out["variant's extra parameters"] = extra
    return out


def verify_tensors(
    path, tensors: dict[str, Tensor], spec: ModelSpec, why: str = "the file is corrupt or was edited"
) -> None:
    """One CheckpointError, naming the tensor, where a checkpoint's weights break its attention variant: an entry
    that ``diagonal``/``sparse`` fixes at zero that is not zero, or a ``W_Q``/``W_K``/``W_V`` that is not the product
    of its low-rank factors (``why`` ends the message: what that means where the check runs)."""
    qkv = parse_qkv(spec.qkv)
    if qkv.kind == "full":
        return
    for l in range(spec.n_layers):
        for which in QKV_NAMES:
            name = f"blocks.{l}.attn.W_{which}"
            W = tensors.get(name)
            if W is None:
                continue
            if qkv.kind == "lowrank":
                a, b = (tensors.get(f"blocks.{l}.attn.{n}") for n in lowrank_names(which))
                if a is None or b is None:
                    raise CheckpointError(f"{path}: the low-rank factors of {name} are missing")
                if not torch.allclose(
                    W.float(), _factor_product(a.float(), b.float(), spec.n_heads), atol=1e-6, rtol=1e-4
                ):
                    raise CheckpointError(
                        f"{path}: tensor {name} is not the product of its low-rank factors (qkv={spec.qkv!r}): {why}"
                    )
            else:
                free = free_entries(
                    qkv.kind, spec.d_model, spec.n_heads, spec.d_head, qkv.fraction, spec.attention_seed, l, which
                )
                if bool((W[~free] != 0).any()):
                    raise CheckpointError(
                        f"{path}: tensor {name} has non-zero entries where qkv={spec.qkv!r} fixes zeros: {why}"
                    )
