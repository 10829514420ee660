"""Hand-built models whose answers are known: ground truth for tests and for teaching.

``minimal_majority_transformer`` is seed 000 §5.3's minimal theoretical transformer: d_model = d_head = 1,
one head, ``W_Q = W_K = W_V = 1``, no positional embedding, ``W_O = 1``. The seed's printed ``W_E`` column is
garbled (nine entries for eight tokens); from its attention formula
``y_= = (v_BOS + n0 e^N v_0 + n1 e^(N+1) v_1 + n2 v_2 + e v_=) / (1 + n0 e^N + n1 e^(N+1) + n2 + e)``
the ``=`` query scores ``x_= x_t`` must be 0, N, N+1, 0, 1 for [BOS], 0, 1, 2, =, so

    x_[BOS] = 0, x_0 = N, x_1 = N + 1, x_2 = 0, x_= = 1, x_4 = x_5 = N^2, x_[EOS] = 0 (x_[PAD] = 0).

Then ``y_= ~ N + n1 e / (n0 + n1 e)`` grows with the share of 1s, and ``n0 >= n1`` iff ``y_= <= a`` with
``a = N + e / (1 + e)`` (the seed's ``(e(N+1) + N) / (1 + e)``). The seed's printed ``W_out`` (+1 on '4',
-1 on '5') would predict '4' exactly when the 1s win, so the signs are flipped here: logit('4') =
a' - y, logit('5') = y - a' (with y the head output; the bias also cancels the residual's x_= = 1). At a tie ``y_= = a`` exactly, so the threshold ``a'`` sits a small
``tie_margin`` above ``a`` (a quarter of the gap to the nearest non-tie value for inputs of up to
``max_digits`` digits) to send ties to '4' despite float rounding. '[EOS]' gets
``4 (x + y) - 12 (N + 1)``: negative at '=', about ``8 N^2`` after '4'/'5'.
"""

from __future__ import annotations

import math

import torch

from .model import ModelSpec, build_model


def minimal_majority_transformer(task=None, N: float = 30.0, max_digits: int | None = None, device: str | None = None):
    """Seed 000 §5.3's one-head, one-dimensional transformer for noisy majority, as a HookedTransformer.

    It predicts every sequence with ``n0 + n1 > 0`` correctly (up to ``max_digits`` digits, default the
    task's longest), and '[EOS]' after the answer."""
    if task is None:
        from tasks import get_task

        task = get_task("noisy-majority")
    v = task.vocab.index
    max_digits = max_digits or getattr(task, "max_digits", 200)
    spec = ModelSpec(d_vocab=len(task.vocab), d_vocab_out=task.vocab.n_out, n_ctx=max_digits + 4, n_layers=1,
                     d_model=1, n_heads=1, d_head=1, positional="none", output_matrix="identity")
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
        # the residual at '=' is x_= + y_= = 1 + y_=, hence the +1 (the seed's b_out has it too)
        model.unembed.b_U[v["4"]] = threshold + 1
        model.unembed.b_U[v["5"]] = -threshold - 1
        model.unembed.b_U[v["[EOS]"]] = -12.0 * (N + 1)
    model.eval()
    model.interp_task = task
    return model
