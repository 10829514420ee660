"""QK and OV circuits of heads (through TransformerLens' ``FactoredMatrix``), copying scores, the direct
path (zero-layer bigram table) and the per-head decomposition of the logits (Elhage et al. 2021 and Li, *A
Mathematical Framework for Transformer Circuits*, §4.1-4.3).

In TransformerLens' row-vector convention a head reads ``x @ W_Q``, ``x @ W_K``, ``x @ W_V`` and writes
``z @ W_O``; ``model.QK[l, h] = W_Q W_Kᵀ`` and ``model.OV[l, h] = W_V W_O``. So:

- full QK circuit ``W_E W_QK W_Eᵀ`` ``[query token, key token]``: attention score (before the
  ``1/sqrt(d_head)`` scale) between tokens through the direct path;
- positional QK circuit ``W_pos W_QK W_posᵀ`` ``[query pos, key pos]``;
- full OV circuit ``W_E W_OV W_U`` ``[source token, output logit]``: what attending to a token does to the logits;
- K-composition circuit ``W_E W_QK^B (W_OV^A)ᵀ W_Eᵀ`` ``[query token, key token]``: the score head ``B`` gives a
  key whose *earlier-layer head ``A``* moved token ``k`` there (Elhage et al. 2021 and Li, *A Mathematical Framework
  for Transformer Circuits*, §4.3).

Circuits use raw weights (no LayerNorm folding, no biases), as TransformerLens' ``QK``/``OV`` do.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from jaxtyping import Float, Int
from torch import Tensor

from interp.attention import refuse_pooling
from interp.device import model_device
from interp.errors import ConfigError, InterpError, TokenError
from interp.evaluation import check_tokens
from interp.heads import head_label, parse_head
from interp.results import Result, jsonable
from interp.task import TaskData

if TYPE_CHECKING:
    from transformer_lens import HookedTransformer


def _token_labels(vocab, n: int) -> list[str]:
    """Token names from the task's vocabulary when given, else the ids."""
    if vocab is not None and len(vocab) >= n:
        return list(vocab.tokens[:n])
    return [str(i) for i in range(n)]


@dataclass
class Circuit(Result):
    """A circuit as a ``FactoredMatrix`` (``.matrix``), with labels for its rows and columns. ``causal``: entries
    above the diagonal (key after query) are never used and are left out of the figure."""

    name: str
    matrix: object  # transformer_lens.FactoredMatrix
    row_labels: list[str]
    col_labels: list[str]
    row_title: str = ""
    col_title: str = ""
    causal: bool = False

    def dense(self) -> Float[Tensor, "rows cols"]:
        """The full matrix (``FactoredMatrix.AB``), detached from the model's parameters."""
        return self.matrix.AB.detach()

    def to_dict(self) -> dict:
        m = self.dense().float().cpu()
        if self.causal:
            m = m.masked_fill(torch.ones_like(m, dtype=torch.bool).triu(1), float("nan"))
        return jsonable(
            {
                "name": self.name,
                "rows": self.row_labels,
                "cols": self.col_labels,
                "row_title": self.row_title,
                "col_title": self.col_title,
                "matrix": m,
            }
        )

    def figure(self, max_size: int = 80):
        """Heatmap of the matrix (its top-left ``max_size`` corner for big vocabularies)."""
        from interp.visualize import heatmap

        m = self.dense()[:max_size, :max_size].detach().float().cpu()
        if self.causal:
            m = m.masked_fill(torch.ones_like(m, dtype=torch.bool).triu(1), float("nan"))
        return heatmap(
            m,
            self.col_labels[: m.shape[1]],
            self.row_labels[: m.shape[0]],
            title=self.name,
            x_title=self.col_title,
            y_title=self.row_title,
        )


def full_qk_circuit(model: HookedTransformer, head, vocab=None) -> Circuit:
    """``W_E W_QK W_Eᵀ`` of one head ``[query token, key token]`` (tokens named by ``vocab`` if given)."""
    l, h = parse_head(head, model.cfg.n_layers, model.cfg.n_heads)
    refuse_pooling(model, "the QK circuit", [l])
    labels = _token_labels(vocab, model.cfg.d_vocab)
    fm = model.W_E @ model.QK[l, h] @ model.W_E.T
    return Circuit(f"full QK circuit of {head_label(l, h)}", fm, labels, labels, "query token", "key token")


def positional_qk_circuit(model: HookedTransformer, head, n_pos: int | None = None) -> Circuit:
    """``W_pos W_QK W_posᵀ`` of one head ``[query pos, key pos]`` (first ``n_pos`` positions); entries with
    key > query never matter (causal mask)."""
    l, h = parse_head(head, model.cfg.n_layers, model.cfg.n_heads)
    refuse_pooling(model, "the positional QK circuit", [l])
    if model.cfg.positional_embedding_type not in ("standard", "shortformer"):
        raise ConfigError(
            f"positional QK circuit needs a learned W_pos, this model uses {model.cfg.positional_embedding_type!r}"
        )
    if not bool(model.W_pos.detach().abs().max() > 0):
        raise ConfigError(
            "this model has no positional embedding (W_pos is zero): its positional QK circuit is zero "
            "and attention cannot depend on position"
        )
    n_pos = n_pos or model.cfg.n_ctx
    w_pos = model.W_pos[:n_pos]
    labels = [str(i) for i in range(w_pos.shape[0])]
    fm = w_pos @ model.QK[l, h] @ w_pos.T
    return Circuit(
        f"positional QK circuit of {head_label(l, h)}",
        fm,
        labels,
        labels,
        "query position",
        "key position",
        causal=True,
    )


def full_ov_circuit(model: HookedTransformer, head, vocab=None) -> Circuit:
    """``W_E W_OV W_U`` of one head ``[source token, output logit]``."""
    l, h = parse_head(head, model.cfg.n_layers, model.cfg.n_heads)
    fm = model.W_E @ model.OV[l, h] @ model.W_U
    return Circuit(
        f"full OV circuit of {head_label(l, h)}",
        fm,
        _token_labels(vocab, model.cfg.d_vocab),
        _token_labels(vocab, model.cfg.d_vocab_out),
        "source token",
        "output logit",
    )


def k_composition_circuit(model: HookedTransformer, earlier, later, vocab=None) -> Circuit:
    """``W_E W_QK^later (W_OV^earlier)ᵀ W_Eᵀ`` ``[query token, key-side token moved by the earlier head]``."""
    la, ha = parse_head(earlier, model.cfg.n_layers, model.cfg.n_heads)
    lb, hb = parse_head(later, model.cfg.n_layers, model.cfg.n_heads)
    if lb <= la:
        raise InterpError(
            f"K-composition needs the later head in a later layer, got {head_label(la, ha)} -> {head_label(lb, hb)}"
        )
    refuse_pooling(model, "the K-composition circuit (through the later head's QK circuit)", [lb])
    labels = _token_labels(vocab, model.cfg.d_vocab)
    fm = model.W_E @ model.QK[lb, hb] @ model.OV[la, ha].T @ model.W_E.T
    return Circuit(
        f"K-composition circuit {head_label(la, ha)} -> {head_label(lb, hb)}",
        fm,
        labels,
        labels,
        "query token",
        f"key token (moved by {head_label(la, ha)})",
    )


@dataclass
class OVCopying(Result):
    """Copying scores of every head's full OV circuit restricted to the tokens that are both inputs and outputs.

    ``copying_score`` = Σ Re(λ) / Σ |λ| over the eigenvalues λ of ``W_E W_OV W_U`` (Elhage et al.): +1 for a
    head that raises the logit of the token it attends to, -1 for one that lowers it. ``top1``/``topk``: the
    fraction of source tokens whose own logit is the largest / among the ``k`` largest in their row."""

    copying_score: Float[Tensor, "layer head"]
    top1: Float[Tensor, "layer head"]
    topk: Float[Tensor, "layer head"]
    k: int

    def rows(self) -> list[dict]:
        L, H = self.copying_score.shape
        return [
            {
                "head": head_label(l, h),
                "copying_score": float(self.copying_score[l, h]),
                "top1": float(self.top1[l, h]),
                f"top{self.k}": float(self.topk[l, h]),
            }
            for l in range(L)
            for h in range(H)
        ]

    def figure(self):
        from interp.visualize import heatmap

        L, H = self.copying_score.shape
        z = torch.stack([self.copying_score.flatten(), self.top1.flatten(), self.topk.flatten()]).cpu()
        return heatmap(
            z,
            [head_label(l, h) for l in range(L) for h in range(H)],
            ["copying score", "top-1", f"top-{self.k}"],
            title="OV circuit copying",
            zmin=-1,
            zmax=1,
            zmid=None,
            text_fmt=".2f",
        )

    def to_dict(self) -> dict:
        return jsonable({"k": self.k, "heads": self.rows()})

    def table_html(self) -> str:
        from interp.visualize import render_table

        return render_table(self.rows(), ["head", "copying_score", "top1", f"top{self.k}"], float_format=".3f")


def ov_copying(model: HookedTransformer, k: int = 5) -> OVCopying:
    """Copying score and top-1/top-``k`` diagonal accuracy of every head's full OV circuit, batched over heads."""
    from transformer_lens import FactoredMatrix

    n = min(model.cfg.d_vocab, model.cfg.d_vocab_out)
    if not 1 <= k <= n:
        raise InterpError(f"k must lie in [1, {n}], got {k}")
    with torch.inference_mode():
        ov = FactoredMatrix(model.W_E[:n] @ model.W_V, model.W_O @ model.W_U[:, :n])  # [L, H, n, n], rank d_head
        ev = ov.eigenvalues  # the nonzero eigenvalues, from the d_head x d_head product BA
        score = ev.real.sum(-1) / ev.abs().sum(-1).clamp(min=1e-30)
        dense = ov.AB
        own = dense.diagonal(dim1=-2, dim2=-1)[..., None]  # [L, H, n, 1]
        rank = (dense > own).sum(-1)  # how many outputs beat the token's own logit
        top1 = (rank == 0).float().mean(-1)
        topk = (rank < k).float().mean(-1)
    return OVCopying(copying_score=score.float(), top1=top1, topk=topk, k=k)


def bigram_table(model: HookedTransformer, vocab=None) -> Circuit:
    """The direct path ``W_E W_U`` ``[token, next-token logit]``: what a zero-layer model predicts (plus ``b_U``)."""
    from transformer_lens import FactoredMatrix

    fm = FactoredMatrix(model.W_E, model.W_U)
    return Circuit(
        "direct path W_E W_U (bigram table)",
        fm,
        _token_labels(vocab, model.cfg.d_vocab),
        _token_labels(vocab, model.cfg.d_vocab_out),
        "current token",
        "next-token logit",
    )


@dataclass
class LogitDecomposition(Result):
    """``logits = direct + bias + Σ heads``: the direct path (embedding, and positions when they enter the
    residual stream, through ``W_U``), the biases (``Σ b_O`` through ``W_U``, plus ``b_U``) and each head's
    output through ``W_U``. Parts sum to the model's logits exactly (up to float error).

    ``answer_pos``/``labels`` (from task data) say where the task's answer is read: :meth:`contributions` and
    :meth:`logit_difference` then look there only; without them, at every position whose next token is an output."""

    tokens: Int[Tensor, "batch pos"]
    direct: Float[Tensor, "batch pos vocab"]
    bias: Float[Tensor, " vocab"]
    heads: Float[Tensor, "layer head batch pos vocab"]
    answer_pos: Int[Tensor, " batch"] | None = None
    labels: Int[Tensor, " batch"] | None = None

    @property
    def part_names(self) -> list[str]:
        L, H = self.heads.shape[:2]
        return ["direct"] + [head_label(l, h) for l in range(L) for h in range(H)]

    def total(self) -> Float[Tensor, "batch pos vocab"]:
        return self.direct + self.bias + self.heads.sum((0, 1))

    def _parts(self) -> Float[Tensor, "part batch pos vocab"]:
        return torch.cat([self.direct[None], self.heads.flatten(0, 1)])

    def contributions(self) -> Float[Tensor, " parts"]:
        """Each part's mean contribution (direct path, then every head ``L0H0, L0H1, ...``) to the logit of the
        right answer at the answer positions (task data), or of the actual next token at every position whose next
        token is an output token (plain tokens)."""
        parts = self._parts()
        if self.answer_pos is not None:
            rows = torch.arange(parts.shape[1], device=parts.device)
            at = parts[:, rows, self.answer_pos]  # [part, batch, vocab]
            return at.gather(-1, self.labels[None, :, None].expand(len(parts), -1, 1))[..., 0].mean(-1)
        tgt = self.tokens[:, 1:]
        V = self.direct.shape[-1]
        valid = (tgt < V).float()
        idx = tgt.clamp(max=V - 1)[None, ..., None].expand(len(parts), *tgt.shape, 1)
        g = parts[:, :, :-1].gather(-1, idx)[..., 0]
        return (g * valid).sum((-2, -1)) / valid.sum().clamp(min=1)

    def logit_difference(self, good: int, bad: int) -> Float[Tensor, " parts"]:
        """Direct logit attribution at the answer: each part's mean contribution to ``logit[good] - logit[bad]`` at
        the answer positions (needs task data), e.g. ``'5' - '4'`` in noisy majority."""
        if self.answer_pos is None:
            raise InterpError("logit_difference needs the answer positions: build the decomposition from task data")
        V = self.direct.shape[-1]
        for t in (good, bad):
            if not (isinstance(t, int) and 0 <= t < V):
                raise TokenError(f"logit_difference needs output token ids in [0, {V - 1}], got {t!r}")
        parts = self._parts()
        rows = torch.arange(parts.shape[1], device=parts.device)
        at = parts[:, rows, self.answer_pos]
        return (at[..., good] - at[..., bad]).mean(-1)

    def to_dict(self) -> dict:
        return jsonable(
            {
                "parts": self.part_names,
                "contributions": self.contributions(),
                "at": "answer positions" if self.answer_pos is not None else "every next-token position",
            }
        )

    def figure(self):
        """Bar chart: mean contribution of each part to the right token's logit."""
        import plotly.graph_objects as go

        where = "the right answer at the answer position" if self.answer_pos is not None else "the correct next token"
        fig = go.Figure(go.Bar(x=self.part_names, y=self.contributions().cpu().tolist()))
        fig.update_layout(title=f"Contribution to the logit of {where}", yaxis_title="logit", template="plotly_white")
        return fig


def logit_decomposition(model: HookedTransformer, data: TaskData | Tensor) -> LogitDecomposition:
    """Split an attention-only, LayerNorm-free model's logits into direct path + per-head terms, on task data
    (contributions then read at its answer positions) or on a token tensor.

    For one layer this is the thesis's ``T = Id ⊗ W_U W_E + Σ_h A^h ⊗ W_U W_OV^h W_E`` (transposed to
    TransformerLens' row convention); for more layers each head's term is its output through ``W_U``."""
    cfg = model.cfg
    if not cfg.attn_only or cfg.normalization_type is not None:
        raise ConfigError(
            "logit_decomposition needs an attention-only model without LayerNorm (normalization None); "
            f"this model has attn_only={cfg.attn_only}, normalization={cfg.normalization_type!r}"
        )
    answer_pos = labels = None
    if isinstance(data, TaskData):
        tokens, answer_pos, labels = data.tokens, data.answer_pos, data.labels
    else:
        tokens = data
    if not isinstance(tokens, Tensor):
        raise TokenError(f"logit_decomposition takes task data or a tensor of token ids, got {type(tokens).__name__}")
    dev = model_device(model)
    tokens = tokens.to(dev)
    check_tokens(model, tokens)
    with torch.inference_mode():
        _, cache = model.run_with_cache(
            tokens, names_filter=lambda n: n in ("hook_embed", "hook_pos_embed") or n.endswith("hook_z")
        )
        resid0 = cache["hook_embed"]
        if cfg.positional_embedding_type == "standard":
            resid0 = resid0 + cache["hook_pos_embed"]
        direct = resid0 @ model.W_U
        bias = model.b_O.sum(0) @ model.W_U + model.b_U
        heads = torch.stack(
            [torch.einsum("bphe,hed,dv->hbpv", cache["z", l], model.W_O[l], model.W_U) for l in range(cfg.n_layers)]
        )
    return LogitDecomposition(
        tokens=tokens,
        direct=direct,
        bias=bias,
        heads=heads,
        answer_pos=None if answer_pos is None else answer_pos.to(dev),
        labels=None if labels is None else labels.to(dev),
    )
