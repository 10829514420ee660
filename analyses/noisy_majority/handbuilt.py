"""Hand-built noisy-majority models whose answers are known: ground truth for tests and for teaching.

**The minimal transformer** (:func:`minimal_majority_transformer`) is Fraknói 2024, §5.3's minimal theoretical
transformer: d_model = d_head = 1, one head, ``W_Q = W_K = W_V = 1``, no positional embedding, ``W_O = 1``. The
seed's printed ``W_E`` column is garbled (nine entries for eight tokens); from its attention formula
``y_= = (v_BOS + n0 e^N v_0 + n1 e^(N+1) v_1 + n2 v_2 + e v_=) / (1 + n0 e^N + n1 e^(N+1) + n2 + e)``
the ``=`` query scores ``x_= x_t`` must be 0, N, N+1, 0, 1 for [BOS], 0, 1, 2, =, so

    x_[BOS] = 0, x_0 = N, x_1 = N + 1, x_2 = 0, x_= = 1, x_4 = x_5 = N^2, x_[EOS] = 0 (x_[PAD] = 0).

Then ``y_= ~ N + n1 e / (n0 + n1 e)`` grows with the share of 1s, and ``n0 >= n1`` iff ``y_= <= a`` with
``a = N + e / (1 + e)`` (the thesis's ``(e(N+1) + N) / (1 + e)``). The thesis's printed ``W_out`` (+1 on '4',
-1 on '5') would predict '4' exactly when the 1s win, so the signs are flipped here: logit('4') =
a' - y, logit('5') = y - a' (with y the head output; the bias also cancels the residual's x_= = 1). At a tie
``y_= = a`` exactly, so the threshold ``a'`` sits a small ``tie_margin`` above ``a`` (a quarter of the gap to the
nearest non-tie value for inputs of up to ``max_digits`` digits) to send ties to '4' despite float rounding.
'[EOS]' gets ``4 (x + y) - 12 (N + 1)``: negative at '=', about ``8 N^2`` after '4'/'5'.

**Preference heads** (:func:`attention_preference_model`): heads whose attention and values are set by hand (a
head that weighs 0s and 1s alike and ignores 2s must separate the answers; one that sees only 0s must not).

The model has one-hot embeddings (``d_model = len(vocab)``), no positional embedding, ``d_head = 2`` and one
layer. Head ``h``'s ``=`` query gives token ``t`` the attention score ``scores[h][t]`` exactly (other queries
attend uniformly), and its value for ``t`` is ``values[h][t]``. ``W_O`` and the unembedding are zero: the
model's own predictions are meaningless; only its head outputs are of interest.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

import torch

from interp.errors import ConfigError
from interp.model import ModelSpec, build_model
from interp.tasks.noisy_majority import NoisyMajority

if TYPE_CHECKING:
    from interp.task import Task

DEFAULT_VALUES = {"0": (1.0, 0.0), "1": (0.0, 1.0), "2": (-1.0, -1.0)}
IGNORED = -1e4  # a score this low gets attention exp(-1e4) = 0 in float32


def attention_preference_model(
    scores: Sequence[Mapping[str, float]],
    values: Sequence[Mapping[str, Sequence[float]]] | None = None,
    task: Task | None = None,
    device: str | None = None,
):
    """One head per entry of ``scores`` (token string -> score of the ``=`` query; unnamed tokens get
    :data:`IGNORED`); ``values`` per head (token -> 2-vector; default :data:`DEFAULT_VALUES`, others 0)."""
    task = task or NoisyMajority()
    vocab = task.vocab
    if not scores:
        raise ConfigError("at least one head is needed: scores is empty")
    values = values if values is not None else [DEFAULT_VALUES] * len(scores)
    if len(values) != len(scores):
        raise ConfigError(f"{len(scores)} heads have scores but {len(values)} have values")
    V = len(vocab)
    spec = ModelSpec(
        d_vocab=V,
        d_vocab_out=vocab.n_out,
        n_ctx=task.n_ctx,
        n_layers=1,
        d_model=V,
        n_heads=len(scores),
        d_head=2,
        positional="none",
        output_matrix="learned",
    )
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
    return model


def minimal_majority_transformer(
    task: Task | None = None, N: float = 30.0, max_digits: int | None = None, device: str | None = None
):
    """Fraknói 2024, §5.3's one-head, one-dimensional transformer for noisy majority, as a HookedTransformer.

    It predicts every sequence with ``n0 + n1 > 0`` correctly (up to ``max_digits`` digits, default the
    task's longest), and '[EOS]' after the answer."""
    task = task or NoisyMajority()
    v = task.vocab.index
    max_digits = max_digits or task.max_digits
    spec = ModelSpec(
        d_vocab=len(task.vocab),
        d_vocab_out=task.vocab.n_out,
        n_ctx=max_digits + 4,
        n_layers=1,
        d_model=1,
        n_heads=1,
        d_head=1,
        positional="none",
        output_matrix="identity",
    )
    model = build_model(spec, device=device)
    e = math.e
    a = N + e / (1 + e)
    # smallest y-gap between a tie and its neighbour n1 = n0 + 1 (n0 up to max_digits / 2)
    n0 = max_digits // 2
    gap = e / ((1 + e) * (n0 + (n0 + 1) * e))
    threshold = a + gap / 4
    emb = {"[BOS]": 0.0, "0": N, "1": N + 1, "2": 0.0, "=": 1.0, "4": N * N, "5": N * N, "[EOS]": 0.0, "[PAD]": 0.0}
    with torch.no_grad():
        for tok, val in emb.items():
            model.embed.W_E[v[tok], 0] = val
        attn = model.blocks[0].attn
        attn.W_Q.fill_(1.0)
        attn.W_K.fill_(1.0)
        attn.W_V.fill_(1.0)
        model.unembed.W_U.zero_()
        model.unembed.b_U.zero_()
        model.unembed.W_U[0, v["4"]] = -1.0
        model.unembed.W_U[0, v["5"]] = 1.0
        model.unembed.W_U[0, v["[EOS]"]] = 4.0
        # the residual at '=' is x_= + y_= = 1 + y_=, hence the +1 (the thesis's b_out has it too)
        model.unembed.b_U[v["4"]] = threshold + 1
        model.unembed.b_U[v["5"]] = -threshold - 1
        model.unembed.b_U[v["[EOS]"]] = -12.0 * (N + 1)
    model.eval()
    return model
