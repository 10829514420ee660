"""A hand-built 2-layer induction circuit whose scores are known: ground truth for the head-score,
composition and circuit analyses (the construction of Elhage et al., written out in weights).

Residual stream (``d_model = 2 (V + 1) + n_ctx``): a token block (one-hot of the current token), a
previous-token block (written by L0H0) and a position block (``W_pos`` one-hot; with ``shortformer``
positions enter only the queries and keys, never the residual stream).

- L0H0, previous-token head: its QK circuit matches query position ``i`` with key position ``i - 1``;
  its OV circuit copies the key's token into the previous-token block.
- L1H0, induction head: its QK circuit matches the query's token block with the key's previous-token
  block (K-composition with L0H0); its OV circuit copies the key's token to the logits.

Token ids: symbols ``0 .. V-1`` and [BOS] = ``V`` (the ``repeated-tokens`` layout). ``sharpness`` is the
attention score (after TransformerLens' ``1/sqrt(d_head)``) of a matching key over a non-matching one.
"""

from __future__ import annotations

import torch

from interp.model import ModelSpec, build_model


def induction_circuit_model(
    n_symbols: int = 12,
    n_ctx: int = 25,
    sharpness: float = 30.0,
    copy_gain: float = 10.0,
    induction: bool = True,
    device: str | None = None,
):
    """The hand-built model; ``induction=False`` zeroes L1H0's QK circuit (a layer-1 head that attends
    uniformly), leaving only the previous-token head."""
    V = n_symbols + 1  # with BOS
    d_model = 2 * V + n_ctx
    d_head = max(V, n_ctx)
    spec = ModelSpec(
        d_vocab=V,
        d_vocab_out=n_symbols,
        n_ctx=n_ctx,
        n_layers=2,
        d_model=d_model,
        n_heads=1,
        d_head=d_head,
        positional="shortformer",
        output_matrix="learned",
        attn_bias=False,
        unembed_bias=False,
        normalization=None,
    )
    model = build_model(spec, device=device)
    tok, prev, pos = 0, V, 2 * V  # block offsets
    c = (sharpness * d_head**0.5) ** 0.5
    with torch.no_grad():
        for p in model.parameters():
            p.zero_()
        model.embed.W_E[:, tok : tok + V] = torch.eye(V)
        model.pos_embed.W_pos[:, pos : pos + n_ctx] = torch.eye(n_ctx)
        a0, a1 = model.blocks[0].attn, model.blocks[1].attn
        for i in range(n_ctx):  # previous-token QK: query i <-> key i - 1
            a0.W_Q[0, pos + i, i] = c
            if i + 1 < n_ctx:
                a0.W_K[0, pos + i, i + 1] = c
        for t in range(V):
            a0.W_V[0, tok + t, t] = 1.0
            a0.W_O[0, t, prev + t] = 1.0  # write the previous token into the previous-token block
            if induction:
                a1.W_Q[0, tok + t, t] = c
                a1.W_K[0, prev + t, t] = c
            a1.W_V[0, tok + t, t] = 1.0
            a1.W_O[0, t, tok + t] = copy_gain
        model.unembed.W_U[tok : tok + n_symbols, :] = torch.eye(n_symbols)
    model.eval()
    return model
