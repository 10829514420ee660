"""An exact, query-restricted forward for one-layer attention-only HookedTransformers.

In a one-layer attention-only model the logits at position ``p`` depend only on the attention row of
query ``p``. Tasks whose loss sits on a few positions (noisy majority: the ``=`` and answer positions)
can therefore compute just those rows: ``O(batch x heads x k x T)`` instead of TransformerLens'
``O(batch x heads x T x T)`` with several materialised copies. It uses the model's own parameters and
modules (gradients flow into the HookedTransformer) and is tested equal to ``model(tokens)``.
Training and :func:`interp.evaluate.evaluate` use it when :func:`supports_query_forward` says so;
analyses use the HookedTransformer forward and its hooks.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from jaxtyping import Float, Int
from torch import Tensor


def supports_query_forward(model) -> bool:
    cfg = model.cfg
    return (
        cfg.n_layers == 1 and cfg.attn_only and cfg.positional_embedding_type == "standard"
        and getattr(cfg, "attn_scores_soft_cap", -1.0) in (-1.0, None, 0)
        and cfg.attention_dir == "causal" and not getattr(cfg, "use_local_attn", False)
        and getattr(cfg, "n_key_value_heads", None) in (None, cfg.n_heads)
    )


def query_attention(model, tokens: Int[Tensor, "batch pos"], query_pos: Int[Tensor, "batch k"], dropout: float = 0.0
                    ) -> tuple[Float[Tensor, "batch pos d_model"], Float[Tensor, "batch head k pos"], Float[Tensor, "batch head pos d_head"]]:
    """The layer-0 attention inputs of the queries at ``query_pos`` only: the residual input ``x``
    (embedding, with ``dropout`` if > 0), the scaled attention scores (``-inf`` on future keys) and the
    value vectors of every position."""
    if not supports_query_forward(model):
        raise ValueError("the query-restricted forward needs a one-layer, attention-only, causal model with standard/no positional embedding")
    attn = model.blocks[0].attn
    b, t = tokens.shape
    x = model.embed(tokens) + model.pos_embed(tokens)  # [b, t, d]
    if dropout:
        x = F.dropout(x, p=dropout, training=True)
    h = model.blocks[0].ln1(x)
    rows = torch.arange(b, device=tokens.device)[:, None]
    q = torch.einsum("bkd,hde->bhke", h[rows, query_pos], attn.W_Q) + attn.b_Q[None, :, None, :]
    keys = torch.einsum("btd,hde->bhte", h, attn.W_K) + attn.b_K[None, :, None, :]
    vals = torch.einsum("btd,hde->bhte", h, attn.W_V) + attn.b_V[None, :, None, :]
    scores = torch.einsum("bhke,bhte->bhkt", q, keys) / attn.attn_scale
    future = torch.arange(t, device=tokens.device)[None, None, :] > query_pos[:, :, None]  # [b, k, t]
    return x, scores.masked_fill(future[:, None], float("-inf")), vals


def logits_at(model, tokens: Int[Tensor, "batch pos"], query_pos: Int[Tensor, "batch k"],
              dropout: float = 0.0) -> Float[Tensor, "batch k vocab_out"]:
    """Logits at ``query_pos`` of a one-layer attention-only model, exactly as ``model(tokens)`` gives them
    (with ``dropout`` > 0: dropout after the embedding and after the attention output, as in training)."""
    attn = model.blocks[0].attn
    x, scores, vals = query_attention(model, tokens, query_pos, dropout)
    z = torch.einsum("bhkt,bhte->bkhe", scores.softmax(-1), vals)
    out = torch.einsum("bkhe,hed->bkd", z, attn.W_O) + attn.b_O
    if dropout:
        out = F.dropout(out, p=dropout, training=True)
    rows = torch.arange(tokens.shape[0], device=tokens.device)[:, None]
    resid = x[rows, query_pos] + out
    return model.unembed(model.ln_final(resid) if hasattr(model, "ln_final") else resid)


def target_positions(data) -> Tensor | None:
    """``[batch, k]`` positions that carry a target when every row has the same few (else None)."""
    from .task import IGNORE

    mask = data.targets != IGNORE
    counts = mask.sum(1)
    if not len(data) or int(counts.min()) != int(counts.max()) or int(counts.max()) * 4 > data.tokens.shape[1]:
        return None
    return mask.nonzero()[:, 1].view(len(data), -1)


def sparse_predictions_and_loss(model, data, batch_size: int = 512) -> dict[str, Tensor] | None:
    """Like :func:`interp.evaluate.predictions_and_loss` (argmax and loss at target positions; ``preds``
    is -1 and ``loss`` 0 elsewhere) via :func:`logits_at`, or None where that forward does not apply."""
    from .evaluate import check_tokens

    if not supports_query_forward(model):
        return None
    device = next(model.parameters()).device
    data = data.to(device)
    check_tokens(model, data.tokens)
    if target_positions(data.select(slice(0, 1))) is None:
        return None
    preds = torch.full_like(data.tokens, -1)
    loss = torch.zeros(data.tokens.shape, device=device)
    with torch.inference_mode():
        for start in range(0, len(data), batch_size):
            idx = torch.arange(start, min(start + batch_size, len(data)), device=device)
            chunk = data.select(idx)
            qpos = target_positions(chunk)
            if qpos is None:
                return None
            logits = logits_at(model, chunk.tokens, qpos)
            rows = idx[:, None]
            preds[rows, qpos] = logits.argmax(-1)
            loss[rows, qpos] = F.cross_entropy(logits.transpose(1, 2).float(), chunk.targets.gather(1, qpos), reduction="none")
    return {"preds": preds, "loss": loss}
