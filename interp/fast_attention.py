"""Fast attention forwards that never build the ``[query, key]`` matrix: a sparse mask in ``O(n x keys per query)``
(a sliding window of ``W`` keys: ``O(n W)``, Beltagy et al. 2020, *Longformer*; any union with dilated, global and
random keys likewise, Zaheer et al. 2020, *Big Bird*) and linear attention in ``O(n)`` time and memory through the
causal prefix sums ``S_i = Σ_{j≤i} φ(k_j) v_jᵀ`` and ``z_i = Σ_{j≤i} φ(k_j)`` (Katharopoulos et al. 2020,
*Transformers are RNNs*; Conti, *The Math behind transformers*, §2.1.2).

They compute what TransformerLens' forward of the same model computes (the hooked ``O(n²)`` path, with the
variant's masks and scores of :mod:`interp.attention`), to float rounding: tests compare logits and gradients. They
are for training and inference: inside :func:`fast_attention` each attention layer computes its queries, keys and
values as TransformerLens does (``hook_q``/``hook_k``/``hook_v`` fire, Q/K/V constraints hold), then ``z`` by the
fast form (``hook_z`` and everything after it fire); ``hook_attn_scores`` and ``hook_pattern`` do not fire, since
no pattern exists. Analyses that read patterns use the hooked forward.

Dense softmax and dense additive attention have no fast form here (every key matters), so :func:`has_fast_path`
says no for a layer with neither a mask nor a linear pooling.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import TYPE_CHECKING

import torch
from jaxtyping import Float, Int
from torch import Tensor

from .attention import ADDITIVE, LayerAttention, attention_pattern, features, key_lists, layer_attention, pair_scores
from .errors import ConfigError

if TYPE_CHECKING:
    from transformer_lens import HookedTransformer


def linear_attention(
    pooling: str,
    q: Float[Tensor, "batch pos head d_head"],
    k: Float[Tensor, "batch pos head d_head"],
    v: Float[Tensor, "batch pos head d_head"],
) -> Float[Tensor, "batch pos head d_head"]:
    """Causal linear attention ``z_i = φ(q_i)ᵀ S_i / φ(q_i)ᵀ z_i`` with prefix sums over positions: ``O(n)`` time
    and memory (``O(n d_head²)``). A query whose weights are all 0 (``relu``) gets ``z = 0``, as in the hooked path."""
    fq, fk = features(pooling, q), features(pooling, k)
    state = torch.cumsum(fk[..., :, None] * v[..., None, :], dim=1)  # [b, n, h, e, e]: S_i
    norm = torch.cumsum(fk, dim=1)  # [b, n, h, e]: z_i
    num = torch.einsum("bnhe,bnhef->bnhf", fq, state)
    den = (fq * norm).sum(-1, keepdim=True)
    return torch.where(den > 0, num / den.clamp_min(torch.finfo(den.dtype).tiny), torch.zeros_like(num))


def sparse_attention(
    spec: LayerAttention,
    q: Float[Tensor, "batch pos head d_head"],
    k: Float[Tensor, "batch pos head d_head"],
    v: Float[Tensor, "batch pos head d_head"],
    attn_scale: float,
    additive_v: Float[Tensor, "head d_head"] | None = None,
) -> Float[Tensor, "batch pos head d_head"]:
    """Attention of every query over only the keys its mask lets it see (gathered: ``O(n x keys per query)``), under
    the layer's pooling."""
    n = q.shape[1]
    keys, valid = key_lists(spec.masks, n, spec.seed, spec.layer, q.device)  # [n, m]
    kg = k[:, keys].permute(0, 3, 1, 2, 4)  # [b, h, n, m, e]
    vg = v[:, keys].permute(0, 3, 1, 2, 4)
    qh = q.permute(0, 2, 1, 3)[..., None, :]  # [b, h, n, 1, e]
    av = additive_v[:, None] if additive_v is not None else None  # broadcasts against [b, h, n]
    scores = pair_scores(spec.pooling, qh, kg, attn_scale, av)  # [b, h, n, 1, m]
    scores = scores.masked_fill(~valid[:, None, :], float("-inf"))
    z = (attention_pattern(scores) @ vg)[..., 0, :]  # [b, h, n, e]
    return z.permute(0, 2, 1, 3)


def has_fast_path(model: HookedTransformer) -> bool:
    """Whether every attention layer has a fast form: a sparse mask (any pooling) or dense linear attention; and
    the model's config is one the fast forward follows (causal, no grouped heads, score caps or QK norms)."""
    cfg = model.cfg
    if (
        cfg.attention_dir != "causal"
        or getattr(cfg, "n_key_value_heads", None) not in (None, cfg.n_heads)
        or getattr(cfg, "attn_scores_soft_cap", -1.0) not in (-1.0, None, 0)
        or getattr(cfg, "use_qk_norm", False)
        or cfg.positional_embedding_type not in ("standard", "shortformer", "rotary")
    ):
        return False
    for l in range(cfg.n_layers):
        spec = layer_attention(model, l)
        if not spec.masks and not spec.pooling.startswith("linear"):
            return False
    return True


class _FastForward:
    """An attention module's forward while :func:`fast_attention` is active."""

    def __init__(self, attn, spec: LayerAttention):
        self.attn, self.spec = attn, spec

    def __call__(self, query_input, key_input, value_input, past_kv_cache_entry=None, attention_mask=None, **extra):
        a, spec = self.attn, self.spec
        if past_kv_cache_entry is not None or attention_mask is not None or any(v is not None for v in extra.values()):
            raise ConfigError("the fast attention forward takes whole sequences: no key-value cache or attention mask")
        q, k, v = a.calculate_qkv_matrices(query_input, key_input, value_input)
        if a.cfg.positional_embedding_type == "rotary":
            q = a.hook_rot_q(a.apply_rotary(q, 0, None))
            k = a.hook_rot_k(a.apply_rotary(k, 0, None))
        if spec.masks:
            av = getattr(a, ADDITIVE) if spec.pooling == "additive" else None
            z = sparse_attention(spec, q, k, v, a.attn_scale, av)
        else:
            z = linear_attention(spec.pooling, q, k, v)
        z = a.hook_z(z)
        if a.cfg.use_attn_result:
            result = a.hook_result(torch.einsum("bphe,hed->bphd", z, a.W_O))
            return result.sum(2) + a.b_O
        return torch.einsum("bphe,hed->bpd", z, a.W_O) + a.b_O


@contextmanager
def fast_attention(model: HookedTransformer):
    """Inside this block ``model``'s attention layers use the fast forwards (one ConfigError where a layer has
    none: see :func:`has_fast_path`); on exit, also after an exception, the forward from before is restored
    (TransformerLens', or an enclosing block's fast one)."""
    if not has_fast_path(model):
        raise ConfigError(
            "this model has no fast attention path: every layer needs a sparse mask (window, dilated, global, random) "
            "or linear attention (dense softmax and additive attention see every key)"
        )
    attns = [b.attn for b in model.blocks]
    before = [a.__dict__.get("forward") for a in attns]  # an enclosing fast_attention's forward, or none
    for l, a in enumerate(attns):
        a.forward = _FastForward(a, layer_attention(model, l))
    try:
        yield model
    finally:
        for a, f in zip(attns, before):
            if f is None:
                a.__dict__.pop("forward", None)
            else:
                a.forward = f


def fast_logits(model: HookedTransformer, tokens: Int[Tensor, "batch pos"]) -> Float[Tensor, "batch pos vocab_out"]:
    """``model(tokens)`` through the fast attention forwards (differentiable: training uses it)."""
    with fast_attention(model):
        return model(tokens)


PATTERN_HOOKS = ("hook_attn_scores", "hook_pattern")  # the hook points the fast forwards do not fire


def fires_on_fast_path(fwd_hooks) -> bool:
    """Whether every hook of ``fwd_hooks`` (``(name, fn)`` pairs) is on a hook point the fast forwards fire: any but
    ``hook_attn_scores`` and ``hook_pattern`` (a name filter given as a function cannot be read: no)."""
    return all(isinstance(name, str) and not name.endswith(PATTERN_HOOKS) for name, _ in fwd_hooks)


def run_with_hooks(
    model: HookedTransformer, tokens: Int[Tensor, "batch pos"], fwd_hooks=(), **kwargs
) -> Float[Tensor, "batch pos vocab_out"]:
    """``model.run_with_hooks(tokens, fwd_hooks=...)``, through the fast attention forwards where the model has them
    (:func:`has_fast_path`) and every hook fires there (:func:`fires_on_fast_path`: the ablation's ``hook_z`` hooks
    do), else TransformerLens' own. The same numbers to float rounding; ``O(n W)`` or ``O(n)`` instead of ``O(n²)``
    per layer, which is what makes the learned accuracies of a long-context variant (a report's Shapley section)
    affordable."""
    fwd_hooks = list(fwd_hooks)
    if has_fast_path(model) and fires_on_fast_path(fwd_hooks):
        with fast_attention(model):
            return model.run_with_hooks(tokens, fwd_hooks=fwd_hooks, **kwargs)
    return model.run_with_hooks(tokens, fwd_hooks=fwd_hooks, **kwargs)
