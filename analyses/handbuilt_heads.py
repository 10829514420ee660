"""Hand-built noisy-majority heads whose attention and values are set by hand: ground truth for the head
analyses (a head that weighs 0s and 1s alike and ignores 2s must separate the answers; one that sees only
0s must not) and a teaching aid.

The model has one-hot embeddings (``d_model = len(vocab)``), no positional embedding, ``d_head = 2`` and one
layer. Head ``h``'s ``=`` query gives token ``t`` the attention score ``scores[h][t]`` exactly (other queries
attend uniformly), and its value for ``t`` is ``values[h][t]``. ``W_O`` and the unembedding are zero: the
model's own predictions are meaningless; only its head outputs are of interest.
"""

from __future__ import annotations

import math
from typing import Mapping, Sequence

import torch

from interp.errors import ConfigError
from interp.model import ModelSpec, build_model

DEFAULT_VALUES = {"0": (1.0, 0.0), "1": (0.0, 1.0), "2": (-1.0, -1.0)}
IGNORED = -1e4  # a score this low gets attention exp(-1e4) = 0 in float32


def attention_preference_model(scores: Sequence[Mapping[str, float]], values: Sequence[Mapping[str, Sequence[float]]] | None = None,
                               task=None, device: str | None = None):
    """One head per entry of ``scores`` (token string -> score of the ``=`` query; unnamed tokens get
    :data:`IGNORED`); ``values`` per head (token -> 2-vector; default :data:`DEFAULT_VALUES`, others 0)."""
    if task is None:
        from tasks import get_task

        task = get_task("noisy-majority")
    vocab = task.vocab
    if not scores:
        raise ConfigError("at least one head is needed: scores is empty")
    values = values if values is not None else [DEFAULT_VALUES] * len(scores)
    if len(values) != len(scores):
        raise ConfigError(f"{len(scores)} heads have scores but {len(values)} have values")
    V = len(vocab)
    spec = ModelSpec(d_vocab=V, d_vocab_out=vocab.n_out, n_ctx=task.n_ctx, n_layers=1, d_model=V, n_heads=len(scores),
                     d_head=2, positional="none", output_matrix="learned")
    model = build_model(spec, device=device)
    eq = vocab.index["="]
    with torch.no_grad():
        model.embed.W_E.copy_(torch.eye(V))
        attn = model.blocks[0].attn
        for p in (attn.W_Q, attn.W_K, attn.W_V, attn.W_O, model.unembed.W_U, model.unembed.b_U):
            p.zero_()
        for h, (sc, val) in enumerate(zip(scores, values)):
            unknown = (set(sc) | set(val)) - set(vocab.index)
            if unknown:
                raise ConfigError(f"unknown token(s) {sorted(unknown)}; the vocabulary is {list(vocab.tokens)}")
            attn.W_Q[h, eq, 0] = math.sqrt(spec.d_head)  # q_= = (sqrt(d_head), 0): score = k[0]
            for tok, i in vocab.index.items():
                attn.W_K[h, i, 0] = float(sc.get(tok, IGNORED))
                attn.W_V[h, i] = torch.tensor([float(x) for x in val.get(tok, (0.0, 0.0))])
    model.eval()
    model.interp_task = task
    return model
