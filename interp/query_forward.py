"""An exact, query-restricted forward for one-layer attention-only HookedTransformers.

In a one-layer attention-only model the logits at position ``p`` depend only on the attention row of
query ``p``. Tasks whose loss sits on a few positions (noisy majority: the ``=`` and answer positions)
can therefore compute just those rows: ``O(batch x heads x k x T)`` instead of TransformerLens'
``O(batch x heads x T x T)`` with several materialised copies. It uses the model's own parameters and
modules (gradients flow into the HookedTransformer) and is tested equal to ``model(tokens)``.
Training and :func:`interp.evaluation.evaluate` use it when :func:`supports_query_forward` says so.

This module is also the one home of the layer-0 prelude (embedding, positions, ``ln1``: :func:`layer0_inputs`,
:func:`token_inputs`) and of the one vocabulary for choosing between the two exact ways analyses compute
(:func:`resolve_method`): ``"fast"`` (the shortcuts a one-layer attention-only model allows: this forward, or
recombining cached per-head outputs), ``"hooks"`` (TransformerLens' forward with hooks, any model) and
``"auto"`` (fast where it applies).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from jaxtyping import Float, Int
from torch import Tensor

from .dropout_masks import dropout as dropout_of
from .errors import ConfigError

if TYPE_CHECKING:
    from transformer_lens import HookedTransformer

METHODS = ("auto", "fast", "hooks")


def supports_query_forward(model: HookedTransformer) -> bool:
    from .positions import position_hook

    cfg = model.cfg
    return position_hook(model) is None and (
        cfg.n_layers == 1
        and cfg.attn_only
        and cfg.positional_embedding_type == "standard"
        and getattr(cfg, "attn_scores_soft_cap", -1.0) in (-1.0, None, 0)
        and cfg.attention_dir == "causal"
        and getattr(cfg, "n_key_value_heads", None) in (None, cfg.n_heads)
    )


def resolve_method(model: HookedTransformer, method: str) -> str:
    """``"auto"`` -> ``"fast"`` for one-layer attention-only models, else ``"hooks"``; ``"fast"`` is refused where
    it does not apply."""
    if method not in METHODS:
        raise ConfigError(f"unknown method {method!r}; expected one of {METHODS}")
    if method == "auto":
        return "fast" if supports_query_forward(model) else "hooks"
    if method == "fast" and not supports_query_forward(model):
        raise ConfigError("method='fast' needs a one-layer, attention-only, causal model; use method='hooks'")
    return method


def layer0_inputs(
    model: HookedTransformer, tokens: Int[Tensor, "batch pos"], dropout: float = 0.0
) -> tuple[Float[Tensor, "batch pos d_model"], Float[Tensor, "batch pos d_model"]]:
    """The residual stream entering layer 0 (``hook_resid_pre``: embedding plus positions, with ``dropout`` if
    > 0) and its ``ln1``-normalised form that layer 0's heads read."""
    x = model.embed(tokens) + model.pos_embed(tokens)
    if dropout:
        x = dropout_of(x, dropout)
    return x, model.blocks[0].ln1(x)


def token_inputs(model: HookedTransformer, token_ids) -> Float[Tensor, "token d_model"]:
    """``ln1(W_E[t])`` for each token: what layer 0's heads read from a token in a model without positional
    embedding, whatever its position (refused for models with one)."""
    cfg = model.cfg
    if cfg.positional_embedding_type not in ("standard", "shortformer") or bool(
        model.pos_embed.W_pos.detach().abs().max() > 0
    ):
        raise ConfigError(
            "per-token layer-0 inputs need a model without positional embedding (W_pos zero): with "
            f"a {cfg.positional_embedding_type!r} positional embedding they depend on the position"
        )
    return model.blocks[0].ln1(model.W_E[torch.as_tensor(token_ids, device=model.W_E.device)][None])[0]


def query_attention(
    model: HookedTransformer, tokens: Int[Tensor, "batch pos"], query_pos: Int[Tensor, "batch k"], dropout: float = 0.0
) -> tuple[
    Float[Tensor, "batch pos d_model"], Float[Tensor, "batch head k pos"], Float[Tensor, "batch head pos d_head"]
]:
    """The layer-0 attention inputs of the queries at ``query_pos`` only: the residual input ``x``
    (embedding, with ``dropout`` if > 0), the attention scores (``-inf`` on future keys; under an attention variant
    its pooling's logits, ``-inf`` outside its mask: :func:`interp.attention.scores_at`) and the value vectors of
    every position."""
    if not supports_query_forward(model):
        raise ConfigError(
            "the query-restricted forward needs a one-layer, attention-only, causal model with standard/no positional "
            "embedding"
        )
    from .attention import layer_attention, qkv_weights, scores_at

    attn = model.blocks[0].attn
    b, _t = tokens.shape
    x, h = layer0_inputs(model, tokens, dropout)  # [b, t, d]
    rows = torch.arange(b, device=tokens.device)[:, None]
    W_Q, W_K, W_V = qkv_weights(attn)
    q = torch.einsum("bkd,hde->bhke", h[rows, query_pos], W_Q) + attn.b_Q[None, :, None, :]
    keys = torch.einsum("btd,hde->bhte", h, W_K) + attn.b_K[None, :, None, :]
    vals = torch.einsum("btd,hde->bhte", h, W_V) + attn.b_V[None, :, None, :]
    return x, scores_at(attn, q, keys, query_pos, layer_attention(model, 0)), vals


def logits_at(
    model: HookedTransformer,
    tokens: Int[Tensor, "batch pos"],
    query_pos: Int[Tensor, "batch k"],
    dropout: float = 0.0,
    embed_dropout: bool = True,
) -> Float[Tensor, "batch k vocab_out"]:
    """Logits at ``query_pos`` of a one-layer attention-only model, exactly as ``model(tokens)`` gives them
    (with ``dropout`` > 0: dropout after the embedding, unless ``embed_dropout`` is False, and after the attention
    output, as in training)."""
    from .attention import attention_pattern

    attn = model.blocks[0].attn
    x, scores, vals = query_attention(model, tokens, query_pos, dropout if embed_dropout else 0.0)
    z = torch.einsum("bhkt,bhte->bkhe", attention_pattern(scores), vals)
    out = torch.einsum("bkhe,hed->bkd", z, attn.W_O) + attn.b_O
    if dropout:
        out = dropout_of(out, dropout)
    rows = torch.arange(tokens.shape[0], device=tokens.device)[:, None]
    resid = x[rows, query_pos] + out
    return soft_capped(model, model.unembed(model.ln_final(resid) if hasattr(model, "ln_final") else resid))


def soft_capped(model: HookedTransformer, logits: Tensor) -> Tensor:
    """The logits as the model outputs them: ``cap * tanh(logits / cap)`` where its config sets
    ``output_logits_soft_cap`` (Gemma 2's logit soft-capping, which TransformerLens' forward applies), unchanged
    otherwise. Every shortcut that unembeds by hand ends with it."""
    from transformer_lens.utilities.activation_functions import apply_softcap

    return apply_softcap(logits, getattr(model.cfg, "output_logits_soft_cap", None))


def has_soft_cap(model: HookedTransformer) -> bool:
    """Whether the model soft-caps its logits (then they are not affine in the heads' outputs)."""
    cap = getattr(model.cfg, "output_logits_soft_cap", None)
    return cap is not None and cap > 0
