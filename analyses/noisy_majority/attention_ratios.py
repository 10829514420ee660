"""Attention ratios of the answer query (Fraknói 2024, §5.4): ``w01 = A(= -> 0) / A(= -> 1)`` and
``w02 = A(= -> 0) / A(= -> 2)`` per head.

Measured on data (:func:`measured_attention_ratios`), precisely: for sequence ``b`` and head ``h`` let
``Abar_c(b)`` be the *mean attention per token* that the ``=`` query gives to the tokens ``c`` it can see
(``sum over positions t holding c of A(= -> t)``, divided by the number ``n_c`` of such tokens). Then
``w01(b) = Abar_0(b) / Abar_1(b)`` for every sequence with ``n0, n1 > 0`` (``w02`` likewise with
``n0, n2 > 0``), and the reported ``w01`` is their geometric mean over those sequences,
``exp(mean_b log w01(b))`` (ratios are multiplicative, and the geometric mean keeps ``w`` and ``1/w``
symmetric); ``n01``/``n02`` count them. Everything is computed in log space from ``log_softmax`` of the
attention scores, so ratios like ``e^30`` do not overflow or underflow.

Under a sparse mask (:mod:`interp.attention`: a window, dilated, global or random keys) the ``=`` query sees only
some positions, so "the tokens ``c`` it can see" are those at the positions its layer's mask lets it see, and a
sequence whose mask hides every 0 (or every 1) from the query has no ``w01(b)``: it is left out of the mean (it
would give ``log 0``, and one such sequence made the mean NaN), and ``n01`` says how many sequences remain, per
layer. Without a mask every token before the query is seen, and nothing changes.

In a one-layer model without positional embedding every ``0`` token gets the same score from the ``=``
query, so ``w01(b)`` is the same for every sequence and equals the exact value from the QK circuit
(:func:`exact_attention_ratios`): ``score(=, t) = (x_= W_Q + b_Q) . (x_t W_K + b_K) / sqrt(d_head)`` with
``x = ln1(W_E[token])``, and ``w01 = exp(score(=, 0) - score(=, 1))``. The exact form is refused for models
where it does not hold (more than one layer, or a positional embedding).
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from jaxtyping import Bool, Float, Int
from torch import Tensor

from interp.attention import ADDITIVE, layer_attention, pair_scores, sync
from interp.device import check_device
from interp.errors import ConfigError, TaskError
from interp.heads import all_heads, head_label
from interp.query_forward import token_inputs
from interp.results import Result, floats, head_of, jsonable
from interp.task import TaskData
from interp.tasks.noisy_majority import VOCAB

from ..answer_cache import AnswerCache, as_cache, check_inputs
from . import require_task_data

if TYPE_CHECKING:
    from transformer_lens import HookedTransformer

DIGITS = ("0", "1", "2")
QUERY = "="


def task_token_ids(vocab, tokens=DIGITS + (QUERY,)) -> list[int]:
    """Ids of the tokens the ratios need, or a TaskError naming the vocabulary."""
    missing = [t for t in tokens if t not in vocab.index]
    if missing:
        raise TaskError(
            f"attention ratios need the tokens {list(tokens)} (noisy majority); this vocabulary "
            f"{list(vocab.tokens)} lacks {missing}"
        )
    return [vocab.index[t] for t in tokens]


@dataclass(eq=False)
class AttentionRatios(Result):
    """``w01[l, h]``, ``w02[l, h]`` measured on data (geometric means) and, where it exists, exactly from QK.
    ``log_w01``/``log_w02`` are the per-sequence natural logs (NaN where undefined); ``n01[l, h]``/``n02[l, h]`` the
    number of sequences each geometric mean is over (those in which the ``=`` query sees both classes; fewer than
    ``n_sequences`` only under a sparse mask, see the module doc)."""

    w01: Float[Tensor, "layer head"]
    w02: Float[Tensor, "layer head"]
    log_w01: Float[Tensor, "batch layer head"]
    log_w02: Float[Tensor, "batch layer head"]
    exact_w01: Float[Tensor, "layer head"] | None = None
    exact_w02: Float[Tensor, "layer head"] | None = None
    n01: Int[Tensor, "layer head"] | None = None
    n02: Int[Tensor, "layer head"] | None = None
    n_sequences: int | None = None

    @property
    def heads(self) -> list[str]:
        L, H = self.w01.shape
        return [head_label(l, h) for l, h in all_heads(L, H)]

    def to_dict(self) -> dict:
        d = {
            "heads": self.heads,
            "w01": self.w01.flatten(),
            "w02": self.w02.flatten(),
            "exact": self.exact_w01 is not None,
        }
        if self.n01 is not None:
            d.update(n01=self.n01.flatten(), n02=self.n02.flatten(), n_sequences=self.n_sequences)
        if self.exact_w01 is not None:
            d.update(
                exact_w01=self.exact_w01.flatten(),
                exact_w02=self.exact_w02.flatten(),
                max_relative_difference=self.max_relative_difference(),
            )
        return jsonable(d)

    @classmethod
    def from_dict(cls, d: dict) -> AttentionRatios:
        """The ratios ``to_dict`` wrote (not the per-sequence logs: ``log_w01``/``log_w02`` are empty)."""
        heads = [head_of(h) for h in d["heads"]]
        shape = (max(l for l, _ in heads) + 1, max(h for _, h in heads) + 1)
        res = cls(
            floats(d["w01"]).view(shape),
            floats(d["w02"]).view(shape),
            torch.zeros(0, *shape),
            torch.zeros(0, *shape),
        )
        if d["exact"]:
            res.exact_w01, res.exact_w02 = floats(d["exact_w01"]).view(shape), floats(d["exact_w02"]).view(shape)
        if "n01" in d:
            res.n01 = torch.tensor(d["n01"], dtype=torch.long).view(shape)
            res.n02 = torch.tensor(d["n02"], dtype=torch.long).view(shape)
            res.n_sequences = d["n_sequences"]
        return res

    def text(self) -> str:
        """``w01`` and ``w02`` per head (and the exact values where they exist)."""
        lines = ["attention ratios of the '=' query, per head: w01 = A(0)/A(1), w02 = A(0)/A(2) (measured"]
        lines[0] += "; exact from the QK circuit)" if self.exact_w01 is not None else ")"
        for i, name in enumerate(self.heads):
            line = f"  {name:<8}{float(self.w01.flatten()[i]):>12.4g}{float(self.w02.flatten()[i]):>12.4g}"
            if self.exact_w01 is not None:
                line += f"{float(self.exact_w01.flatten()[i]):>12.4g}{float(self.exact_w02.flatten()[i]):>12.4g}"
            lines.append(line)
        if self.n01 is not None and (
            bool((self.n01 < self.n_sequences).any()) or bool((self.n02 < self.n_sequences).any())
        ):
            for l in range(self.n01.shape[0]):
                lines.append(
                    f"  layer {l}: w01 over {int(self.n01[l, 0])} of {self.n_sequences} sequences, w02 over "
                    f"{int(self.n02[l, 0])} (the others hide a class from the '=' query under the sparse mask)"
                )
        return "\n".join(lines)

    def max_relative_difference(self) -> float | None:
        """Largest ``|measured / exact - 1|`` over heads and both ratios (None without exact values)."""
        if self.exact_w01 is None:
            return None
        rel = torch.cat(
            [
                (self.w01.double() / self.exact_w01.double() - 1).abs().flatten(),
                (self.w02.double() / self.exact_w02.double() - 1).abs().flatten(),
            ]
        )
        rel = rel[torch.isfinite(rel)]
        return float(rel.max()) if len(rel) else None

    def figure(self, separation: Float[Tensor, "layer head"] | Float[Tensor, " heads"] | None = None, title: str = ""):
        """The thesis's Figure 7: ``w01`` against ``w02`` per head on log axes, coloured by separation accuracy."""
        return ratio_figure(
            self.w01.flatten(),
            self.w02.flatten(),
            self.heads,
            None if separation is None else torch.as_tensor(separation).flatten(),
            title,
        )


def ratio_figure(w01, w02, names, color=None, title: str = ""):
    import plotly.graph_objects as go

    w01 = torch.as_tensor(w01).double().cpu()
    w02 = torch.as_tensor(w02).double().cpu()
    # log axes cannot show 0 or inf: clip to a finite range and say so in the hover text
    clip = lambda w: w.clamp(1e-12, 1e12).nan_to_num(1.0)  # noqa: E731
    hover = [
        f"{n}<br>w01 = {a:.3g}<br>w02 = {b:.3g}" + (f"<br>separation = {float(c):.3f}" if color is not None else "")
        for n, a, b, c in zip(
            names, w01.tolist(), w02.tolist(), color.tolist() if color is not None else [None] * len(names)
        )
    ]
    marker = dict(size=12, line=dict(width=1, color="black"))
    if color is not None:
        marker.update(
            color=torch.as_tensor(color).float().tolist(),
            colorscale="Viridis",
            cmin=0.5,
            cmax=1.0,
            colorbar=dict(title="separation<br>accuracy"),
        )
    # many heads crowd each other's labels: beyond 8, name only the best (by ``color``) and leave the rest to hover
    labelled = set(range(len(names)))
    if len(names) > 8:
        rank = sorted(range(len(names)), key=lambda i: -float(color[i])) if color is not None else range(8)
        labelled = set(list(rank)[:8])
    text = [n if i in labelled else "" for i, n in enumerate(names)]
    positions = ["top center", "bottom center", "middle right", "middle left"]
    fig = go.Figure(
        go.Scatter(
            x=clip(w01).tolist(),
            y=clip(w02).tolist(),
            mode="markers+text",
            text=text,
            textposition=[positions[i % 4] for i in range(len(names))],
            hovertext=hover,
            hoverinfo="text",
            marker=marker,
        )
    )
    fig.update_layout(
        title=title
        or (
            "Attention ratios of the '=' query per head (Figure 7)"
            + ("<br><sup>labels: the 8 best heads; hover for the rest</sup>" if len(names) > 8 else "")
        ),
        xaxis_title="w01 = A(=→0) / A(=→1)",
        yaxis_title="w02 = A(=→0) / A(=→2)",
        template="plotly_white",
        width=640,
        height=520,
    )
    fig.update_xaxes(type="log")
    fig.update_yaxes(type="log")
    return fig


def class_log_attention(
    cache: AnswerCache, token_ids: list[int], visible: Bool[Tensor, "batch layer key"] | None = None
) -> tuple[Tensor, Tensor]:
    """``log Abar_c[b, l, h, c]`` (log mean attention per seen token of each class ``c``; -inf when absent) and the
    counts ``n[b, l, c]`` of each class the answer query sees: the tokens before it, or, with ``visible`` (the keys
    each layer's mask lets the query see, :func:`visible_keys`), those it may see."""
    if cache.log_attn is None:
        raise TaskError("the cache has no attention rows; build it with attention=True")
    t = cache.log_attn.shape[-1]
    tokens = cache.tokens[:, :t]
    before = torch.arange(t, device=tokens.device)[None] <= cache.answer_pos[:, None]  # [b, t]
    seen = before[:, None, :].expand(-1, cache.log_attn.shape[1], -1) if visible is None else visible & before[:, None]
    out, counts = [], []
    for tok in token_ids:
        is_c = (tokens == tok)[:, None, :] & seen  # [b, l, t]
        n = is_c.sum(-1)  # [b, l]
        la = cache.log_attn.masked_fill(~is_c[:, :, None, :], float("-inf")).logsumexp(-1)
        out.append(la - n.clamp(min=1).log()[:, :, None].to(la.dtype))
        counts.append(n)
    return torch.stack(out, -1), torch.stack(counts, -1)


def visible_keys(model: HookedTransformer, cache: AnswerCache) -> Bool[Tensor, "batch layer key"] | None:
    """Whether each sequence's answer query sees key ``t`` under each layer's sparse mask (causal and inside the
    mask; :meth:`interp.attention.LayerAttention.allowed`), or None where no layer has a mask (every key before the
    query is seen)."""
    layers = [layer_attention(model, l) for l in range(model.cfg.n_layers)]
    if not any(a.masks for a in layers):
        return None
    t = cache.log_attn.shape[-1]
    pos = cache.answer_pos.to(cache.log_attn.device)
    return torch.stack([a.allowed(t, t, cache.log_attn.device)[pos] for a in layers], 1)


def measured_attention_ratios(
    model: HookedTransformer,
    data: TaskData | AnswerCache,
    *,
    batch_size: int | None = None,
    device: str | None = None,
) -> AttentionRatios:
    """``w01``, ``w02`` per head measured from the answer query's attention on ``data`` (see module doc)."""
    require_task_data(data)
    check_inputs(model, data, device=device, batch_size=batch_size)
    return _measured(model, data, batch_size)


def _measured(model: HookedTransformer, data, batch_size: int | None = None) -> AttentionRatios:
    cache = as_cache(model, data, attention=True, batch_size=batch_size)
    ids = task_token_ids(cache.vocab or VOCAB)
    _, present = class_log_attention(cache, ids[:3])  # every token before the query: what the data holds
    if not bool(((present[..., 0] > 0) & (present[..., 1] > 0)).any()) or not bool(
        ((present[..., 0] > 0) & (present[..., 2] > 0)).any()
    ):
        raise TaskError("the data has no sequence with both 0s and 1s (or 0s and 2s); ratios are undefined")
    la, n = class_log_attention(cache, ids[:3], visible_keys(model, cache))
    nan = torch.tensor(float("nan"), device=la.device, dtype=la.dtype)
    ok01 = ((n[..., 0] > 0) & (n[..., 1] > 0))[:, :, None].expand(la.shape[:3])  # [b, l, h]
    ok02 = ((n[..., 0] > 0) & (n[..., 2] > 0))[:, :, None].expand(la.shape[:3])
    log_w01 = torch.where(ok01, la[..., 0] - la[..., 1], nan)
    log_w02 = torch.where(ok02, la[..., 0] - la[..., 2], nan)
    return AttentionRatios(
        w01=log_w01.nanmean(0).exp(),
        w02=log_w02.nanmean(0).exp(),
        log_w01=log_w01,
        log_w02=log_w02,
        n01=ok01.sum(0).cpu(),
        n02=ok02.sum(0).cpu(),
        n_sequences=int(la.shape[0]),
    )


def query_key_scores(model: HookedTransformer, *, vocab=None) -> Float[Tensor, "head vocab"]:
    """Exact attention scores of the ``=`` query to every token, for a one-layer model without positional
    embedding and without a sparse mask (refused otherwise): ``(x_= W_Q + b_Q) . (x_t W_K + b_K) / attn_scale``,
    ``x = ln1(W_E)``; under another pooling its scores of the same ``q`` and ``k`` (:func:`interp.attention.
    pair_scores`: the log of linear attention's kernel, additive pooling's ``v·tanh(q + k)``), whose softmax the
    attention is."""
    cfg = model.cfg
    if cfg.n_layers != 1:
        raise ConfigError(
            f"exact attention ratios need a one-layer model (the scores of later layers depend on "
            f"earlier heads); this model has {cfg.n_layers} layers: use measured_attention_ratios"
        )
    pos_type = cfg.positional_embedding_type
    has_pos = pos_type not in ("standard", "shortformer") or bool(model.pos_embed.W_pos.detach().abs().max() > 0)
    if has_pos:
        raise ConfigError(
            f"exact attention ratios need a model without positional embedding (scores would depend "
            f"on positions); this model has a {pos_type!r} positional embedding: use measured_attention_ratios"
        )
    layer = layer_attention(model, 0)
    if layer.masks:
        raise ConfigError(
            f"exact attention ratios hold where every token of a kind gets the same weight; this model's sparse mask "
            f"({'+'.join(map(str, layer.masks))}) hides tokens by position: use measured_attention_ratios"
        )
    vocab = vocab or VOCAB
    eq = task_token_ids(vocab)[3]
    sync(model)  # low-rank W_Q/W_K from their current factors
    attn = model.blocks[0].attn
    with torch.inference_mode():
        x = token_inputs(model, list(range(model.cfg.d_vocab)))  # [vocab, d]
        q = torch.einsum("d,hde->he", x[eq], attn.W_Q) + attn.b_Q  # [h, e]
        k = torch.einsum("vd,hde->hve", x, attn.W_K) + attn.b_K[:, None]  # [h, vocab, e]
        # the pooling's scores (softmax logits): q·k / sqrt(d_head), or log φ(q)·φ(k), or v·tanh(q + k)
        v = getattr(attn, ADDITIVE) if layer.pooling == "additive" else None
        return pair_scores(layer.pooling, q[:, None], k, attn.attn_scale, v)[:, 0]


def exact_attention_ratios(
    model: HookedTransformer, *, vocab=None, device: str | None = None
) -> tuple[Float[Tensor, "layer head"], Float[Tensor, "layer head"]]:
    """``(w01, w02)`` per head from the QK circuit of a one-layer model without positional embedding."""
    check_device(model, device)
    vocab = vocab or VOCAB
    z, o, t = task_token_ids(vocab)[:3]
    s = query_key_scores(model, vocab=vocab).double()
    return (s[:, z] - s[:, o]).exp()[None], (s[:, z] - s[:, t]).exp()[None]


def attention_ratios(
    model: HookedTransformer,
    data: TaskData | AnswerCache,
    *,
    batch_size: int | None = None,
    device: str | None = None,
) -> AttentionRatios:
    """Measured ratios, plus the exact ones when the model is one-layer without positional embedding."""
    require_task_data(data)
    check_inputs(model, data, device=device, batch_size=batch_size)
    res = _measured(model, data, batch_size)
    with contextlib.suppress(ConfigError):
        res.exact_w01, res.exact_w02 = exact_attention_ratios(model)
    return res
