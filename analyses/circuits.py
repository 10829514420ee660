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

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch
from jaxtyping import Float, Int
from torch import Tensor

from interp.attention import refuse_pooling, sync
from interp.device import check_device
from interp.errors import ConfigError, InterpError, TokenError
from interp.evaluation import check_tokens
from interp.heads import head_label, is_head, one_set, parse_head
from interp.results import Result, floats, head_of, jsonable
from interp.task import TaskData

if TYPE_CHECKING:
    from transformer_lens import HookedTransformer


def _token_labels(vocab, n: int) -> list[str]:
    """Token names from the task's vocabulary when given, else the ids."""
    if vocab is not None and len(vocab) >= n:
        return list(vocab.tokens[:n])
    return [str(i) for i in range(n)]


@dataclass(eq=False)
class CircuitMatrix(Result):
    """A circuit as a ``FactoredMatrix`` (``.matrix``), with labels for its rows and columns: ``[rows, cols]`` for
    one head (or the direct path), ``[head, rows, cols]`` for several, ``heads`` naming the leading axis (one per
    head, or per sender -> receiver pair). ``causal``: entries above the diagonal (key after query) are never used
    and are left out of the figure. ``note``: what the circuit leaves out, where that matters (said in its text)."""

    name: str
    matrix: object  # transformer_lens.FactoredMatrix
    row_labels: list[str]
    col_labels: list[str]
    row_title: str = ""
    col_title: str = ""
    causal: bool = False
    heads: list[str] = field(default_factory=list)  # the leading axis of a circuit of several heads
    note: str = ""

    @property
    def batched(self) -> bool:
        return len(self.matrix.shape) == 3

    def dense(self) -> Float[Tensor, "*head rows cols"]:
        """The full matrix (``FactoredMatrix.AB``), detached from the model's parameters."""
        return self.matrix.AB.detach()

    def __getitem__(self, head) -> CircuitMatrix:
        """The circuit of one head of a circuit of several (``'L0H3'``, ``(0, 3)``; a pair ``'L0H0 -> L1H1'``)."""
        if not self.batched:
            raise InterpError(f"{self.name} is the circuit of one head; index a circuit of several heads")
        key = head if isinstance(head, str) and "->" in head else head_label(*parse_head(head, 10**6, 10**6))
        if key not in self.heads:
            raise InterpError(f"{key} is not one of this circuit's heads ({', '.join(self.heads)})")
        i = self.heads.index(key)
        from transformer_lens import FactoredMatrix

        fm = FactoredMatrix(self.matrix.A[i], self.matrix.B[i])
        return CircuitMatrix(
            f"{self.name.split(' of ')[0]}{' ' if '->' in key else ' of '}{key}",
            fm,
            self.row_labels,
            self.col_labels,
            self.row_title,
            self.col_title,
            self.causal,
            [],
            self.note,
        )

    def _masked(self, m: Tensor) -> Tensor:
        if self.causal:
            m = m.masked_fill(torch.ones(m.shape[-2:], dtype=torch.bool).triu(1), float("nan"))
        return m

    def to_dict(self) -> dict:
        return jsonable(
            {
                "name": self.name,
                "rows": self.row_labels,
                "cols": self.col_labels,
                "row_title": self.row_title,
                "col_title": self.col_title,
                "causal": self.causal,
                "heads": self.heads,
                "note": self.note,
                "matrix": self._masked(self.dense().float().cpu()),
            }
        )

    @classmethod
    def from_dict(cls, d: dict) -> CircuitMatrix:
        """The circuit ``to_dict`` wrote (its matrix as a product with the identity: the factors are not stored)."""
        from transformer_lens import FactoredMatrix

        m = floats(d["matrix"]).nan_to_num(0.0)  # the causal entries left out (None) are masked again on output
        eye = torch.eye(m.shape[-1], dtype=m.dtype).expand(*m.shape[:-2], m.shape[-1], m.shape[-1])
        return cls(
            d["name"],
            FactoredMatrix(m, eye),
            list(d["rows"]),
            list(d["cols"]),
            d.get("row_title", ""),
            d.get("col_title", ""),
            bool(d.get("causal", False)),
            list(d.get("heads", [])),
            d.get("note", ""),
        )

    def text(self) -> str:
        """Its name, shape and, per head, the largest entries."""
        m = self._masked(self.dense().float().cpu())
        mats = list(zip(self.heads, m)) if self.batched else [("", m)]
        lines = [f"{self.name}: [{self.row_title or 'rows'}, {self.col_title or 'cols'}] {tuple(m.shape)}"]
        if self.note:
            lines.append(f"note: {self.note}")
        for label, x in mats:
            flat = x.nan_to_num(float("-inf")).flatten()
            top = flat.topk(min(3, flat.numel())).indices.tolist()
            cells = ", ".join(
                f"({self.row_labels[i // x.shape[1]]}, {self.col_labels[i % x.shape[1]]}) {float(flat[i]):.3g}"
                for i in top
            )
            lines.append(f"  {label + ': ' if label else ''}largest {cells}")
        return "\n".join(lines)

    def figure(self, max_size: int = 80, max_heads: int = 16):
        """Heatmap of the matrix (its top-left ``max_size`` corner for big vocabularies); one panel per head (the
        first ``max_heads``) for a circuit of several heads."""
        from interp.visualize import heatmap

        m = self._masked(self.dense()[..., :max_size, :max_size].detach().float().cpu())
        cols, rows = self.col_labels[: m.shape[-1]], self.row_labels[: m.shape[-2]]
        if not self.batched:
            return heatmap(m, cols, rows, title=self.name, x_title=self.col_title, y_title=self.row_title)
        from plotly.subplots import make_subplots

        n = min(len(m), max_heads)
        width = min(n, 4)
        fig = make_subplots(rows=(n + width - 1) // width, cols=width, subplot_titles=self.heads[:n])
        lim = float(m[:n].nan_to_num(0).abs().max()) or 1.0
        for i in range(n):
            panel = heatmap(m[i], cols, rows, zmin=-lim, zmax=lim)
            trace = panel.data[0]
            trace.showscale = i == 0
            fig.add_trace(trace, i // width + 1, i % width + 1)
        fig.update_yaxes(autorange="reversed")
        fig.update_layout(title=self.name, template="plotly_white", height=300 * ((n + width - 1) // width))
        return fig


def _position_note(model: HookedTransformer) -> str:
    """What a token QK circuit leaves out under the model's positional scheme (empty where it leaves out nothing
    that the scores depend on beyond positions added to the residual stream)."""
    kind = model.cfg.positional_embedding_type
    if kind == "rotary":
        return (
            "rotary positions: the model rotates q and k by their positions before the score, so the score of two "
            "tokens depends on their distance; this token circuit is the score at distance 0 (no rotation) and "
            "leaves the rotation out"
        )
    if kind == "alibi":
        return "ALiBi: the model adds a distance penalty to every score, which this token circuit leaves out"
    return ""


def _circuit_heads(model: HookedTransformer, heads: object) -> tuple[list[tuple[int, int]], bool]:
    """The heads ``heads=`` names and whether it named one head (a ``[rows, cols]`` circuit) rather than a set
    (``[head, rows, cols]``; None: every head). Low-rank Q/K/V matrices are refreshed from their factors first
    (:func:`interp.attention.sync`), so a circuit reads the current weights, also after the factors were edited
    without a forward pass."""
    sync(model)
    cfg = model.cfg
    if heads is not None and is_head(heads):
        return [parse_head(heads, cfg.n_layers, cfg.n_heads)], True
    return one_set(heads, cfg.n_layers, cfg.n_heads), False


def _stacked(heads: list[tuple[int, int]], weight: Tensor) -> Tensor:
    """``weight[l, h]`` of each head, stacked: ``[head, ...]``."""
    idx = torch.tensor(heads, device=weight.device)
    return weight[idx[:, 0], idx[:, 1]]


def _circuit(name: str, heads, single: bool, A: Tensor, B: Tensor, *labels, causal: bool = False, note: str = ""):
    from transformer_lens import FactoredMatrix

    names = [head_label(*h) for h in heads]
    if single:
        return CircuitMatrix(f"{name} of {names[0]}", FactoredMatrix(A[0], B[0]), *labels, causal=causal, note=note)
    return CircuitMatrix(
        f"{name} of {len(names)} heads", FactoredMatrix(A, B), *labels, causal=causal, heads=names, note=note
    )


def full_qk_circuit(
    model: HookedTransformer, *, heads: object = None, vocab=None, device: str | None = None
) -> CircuitMatrix:
    """``W_E W_QK W_Eᵀ`` ``[query token, key token]`` of one head (``heads="L0H3"``), or ``[head, query token, key
    token]`` of a set of heads (default: every head), batched over the heads; tokens named by ``vocab`` if given.
    Under rotary positions (or ALiBi) the score also depends on the distance between the tokens, which this circuit
    leaves out: its ``note`` (and text) says so."""
    check_device(model, device)
    hs, single = _circuit_heads(model, heads)
    refuse_pooling(model, "the QK circuit", sorted({l for l, _ in hs}))
    labels = _token_labels(vocab, model.cfg.d_vocab)
    with torch.no_grad():
        A = model.W_E @ _stacked(hs, model.W_Q)  # [head, vocab, d_head]
        B = _stacked(hs, model.W_K).transpose(-1, -2) @ model.W_E.T  # [head, d_head, vocab]
    return _circuit(
        "full QK circuit", hs, single, A, B, labels, labels, "query token", "key token", note=_position_note(model)
    )


def positional_qk_circuit(
    model: HookedTransformer, *, heads: object = None, n_pos: int | None = None, device: str | None = None
) -> CircuitMatrix:
    """``W_pos W_QK W_posᵀ`` ``[query pos, key pos]`` of one head, or ``[head, query pos, key pos]`` of a set of
    heads (default every head), for the first ``n_pos`` positions; entries with key > query never matter (causal
    mask)."""
    check_device(model, device)
    hs, single = _circuit_heads(model, heads)
    refuse_pooling(model, "the positional QK circuit", sorted({l for l, _ in hs}))
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
    with torch.no_grad():
        A = w_pos @ _stacked(hs, model.W_Q)
        B = _stacked(hs, model.W_K).transpose(-1, -2) @ w_pos.T
    return _circuit(
        "positional QK circuit", hs, single, A, B, labels, labels, "query position", "key position", causal=True
    )


def full_ov_circuit(
    model: HookedTransformer, *, heads: object = None, vocab=None, device: str | None = None
) -> CircuitMatrix:
    """``W_E W_OV W_U`` ``[source token, output logit]`` of one head, or ``[head, source token, output logit]`` of a
    set of heads (default every head)."""
    check_device(model, device)
    hs, single = _circuit_heads(model, heads)
    with torch.no_grad():
        A = model.W_E @ _stacked(hs, model.W_V)
        B = _stacked(hs, model.W_O) @ model.W_U
    return _circuit(
        "full OV circuit",
        hs,
        single,
        A,
        B,
        _token_labels(vocab, model.cfg.d_vocab),
        _token_labels(vocab, model.cfg.d_vocab_out),
        "source token",
        "output logit",
    )


def k_composition_circuit(
    model: HookedTransformer,
    *,
    senders: object,
    receivers: object,
    vocab=None,
    device: str | None = None,
) -> CircuitMatrix:
    """``W_E W_QK^receiver (W_OV^sender)ᵀ W_Eᵀ`` ``[query token, key-side token moved by the sender head]``: the
    score a later head (receiver) gives a key whose earlier-layer head (sender) moved token ``k`` there. One sender
    and one receiver head: ``[rows, cols]``; sets of heads: ``[pair, rows, cols]`` over every sender -> receiver pair
    (every receiver must sit in a later layer than every sender)."""
    check_device(model, device)
    cfg = model.cfg
    s_heads, s_single = _circuit_heads(model, senders)
    r_heads, r_single = _circuit_heads(model, receivers)
    pairs = [(a, b) for a in s_heads for b in r_heads]
    bad = [(a, b) for a, b in pairs if b[0] <= a[0]]
    if bad:
        a, b = bad[0]
        raise InterpError(
            f"K-composition needs the receiver in a later layer than the sender, got {head_label(*a)} -> "
            f"{head_label(*b)}"
        )
    refuse_pooling(
        model, "the K-composition circuit (through the receiver's QK circuit)", sorted({b[0] for b in r_heads})
    )
    labels = _token_labels(vocab, cfg.d_vocab)
    with torch.no_grad():
        sa, rb = [a for a, _ in pairs], [b for _, b in pairs]
        A = model.W_E @ _stacked(rb, model.W_Q)  # [pair, vocab, d_head]
        qk_ov = _stacked(rb, model.W_K).transpose(-1, -2) @ _stacked(sa, model.W_O).transpose(-1, -2)
        B = qk_ov @ _stacked(sa, model.W_V).transpose(-1, -2) @ model.W_E.T  # [pair, d_head, vocab]
    names = [f"{head_label(*a)} -> {head_label(*b)}" for a, b in pairs]
    if s_single and r_single:
        from transformer_lens import FactoredMatrix

        return CircuitMatrix(
            f"K-composition circuit {names[0]}",
            FactoredMatrix(A[0], B[0]),
            labels,
            labels,
            "query token",
            f"key token (moved by {head_label(*pairs[0][0])})",
            note=_position_note(model),
        )
    from transformer_lens import FactoredMatrix

    return CircuitMatrix(
        f"K-composition circuit of {len(pairs)} sender -> receiver pairs",
        FactoredMatrix(A, B),
        labels,
        labels,
        "query token",
        "key token (moved by the sender)",
        heads=names,
        note=_position_note(model),
    )


@dataclass(eq=False)
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

    @classmethod
    def from_dict(cls, d: dict) -> OVCopying:
        heads = [head_of(r["head"]) for r in d["heads"]]
        shape = (max(l for l, _ in heads) + 1, max(h for _, h in heads) + 1)
        out = {}
        for key in ("copying_score", "top1", f"top{d['k']}"):
            t = torch.full(shape, float("nan"), dtype=torch.float64)
            for (l, h), r in zip(heads, d["heads"]):
                t[l, h] = float("nan") if r[key] is None else r[key]
            out[key] = t
        return cls(out["copying_score"], out["top1"], out[f"top{d['k']}"], d["k"])

    def text(self) -> str:
        """Every head's copying score and top-1 / top-k diagonal accuracy, most copying first."""
        rows = sorted(self.rows(), key=lambda r: -r["copying_score"])
        lines = [f"OV circuit copying of {len(rows)} heads (copying score in [-1, 1]; top-1, top-{self.k})"]
        lines += [f"  {r['head']:<8}{r['copying_score']:>8.3f}{r['top1']:>8.3f}{r[f'top{self.k}']:>8.3f}" for r in rows]
        return "\n".join(lines)

    def table_html(self) -> str:
        from interp.visualize import render_table

        return render_table(self.rows(), ["head", "copying_score", "top1", f"top{self.k}"], float_format=".3f")


def ov_copying(model: HookedTransformer, *, k: int = 5, device: str | None = None) -> OVCopying:
    """Copying score and top-1/top-``k`` diagonal accuracy of every head's full OV circuit, batched over heads."""
    from transformer_lens import FactoredMatrix

    check_device(model, device)
    sync(model)  # low-rank W_V from its current factors
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


def bigram_table(model: HookedTransformer, *, vocab=None, device: str | None = None) -> CircuitMatrix:
    """The direct path ``W_E W_U`` ``[token, next-token logit]``: what a zero-layer model predicts (plus ``b_U``)."""
    from transformer_lens import FactoredMatrix

    check_device(model, device)
    fm = FactoredMatrix(model.W_E, model.W_U)
    return CircuitMatrix(
        "direct path W_E W_U (bigram table)",
        fm,
        _token_labels(vocab, model.cfg.d_vocab),
        _token_labels(vocab, model.cfg.d_vocab_out),
        "current token",
        "next-token logit",
    )


@dataclass(eq=False)
class LogitDecomposition(Result):
    """``logits = direct + bias + Σ heads``: the direct path (embedding, and positions when they enter the
    residual stream, through ``W_U``), the biases (``Σ b_O`` through ``W_U``, plus ``b_U``) and each head's
    output through ``W_U``. Parts sum to the model's logits exactly (up to float error).

    ``answer_pos``/``labels`` (from task data) say where the task's answer is read: :meth:`contributions` and
    :meth:`logit_difference` then look there only; without them, at every position whose next token is an output.

    A decomposition read back by :meth:`from_dict` holds what ``to_dict`` wrote (the parts' mean contributions) in
    ``summary`` and no tensors: :meth:`contributions`, the text and the figure work, the per-example parts do not."""

    tokens: Int[Tensor, "batch pos"] | None
    direct: Float[Tensor, "batch pos vocab"] | None
    bias: Float[Tensor, " vocab"] | None
    heads: Float[Tensor, "layer head batch pos vocab"] | None
    answer_pos: Int[Tensor, " batch"] | None = None
    labels: Int[Tensor, " batch"] | None = None
    summary: dict = field(default_factory=dict)  # parts, contributions and where (a result read back)

    @property
    def part_names(self) -> list[str]:
        if self.heads is None:
            return list(self.summary["parts"])
        L, H = self.heads.shape[:2]
        return ["direct"] + [head_label(l, h) for l in range(L) for h in range(H)]

    @property
    def at(self) -> str:
        if self.heads is None:
            return self.summary["at"]
        return "answer positions" if self.answer_pos is not None else "every next-token position"

    def total(self) -> Float[Tensor, "batch pos vocab"]:
        self._parts()  # refuses a decomposition read back without its tensors
        return self.direct + self.bias + self.heads.sum((0, 1))

    def _parts(self) -> Float[Tensor, "part batch pos vocab"]:
        if self.heads is None:
            raise InterpError(
                "this logit decomposition was read back from its to_dict(): it holds the parts' mean contributions "
                "only; compute it again with logit_decomposition(model, data) for the per-example parts"
            )
        return torch.cat([self.direct[None], self.heads.flatten(0, 1)])

    def contributions(self) -> Float[Tensor, " parts"]:
        """Each part's mean contribution (direct path, then every head ``L0H0, L0H1, ...``) to the logit of the
        right answer at the answer positions (task data), or of the actual next token at every position whose next
        token is an output token (plain tokens)."""
        if self.heads is None:
            return floats(self.summary["contributions"])
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
        parts = self._parts()
        V = self.direct.shape[-1]
        for t in (good, bad):
            if not (isinstance(t, int) and 0 <= t < V):
                raise TokenError(f"logit_difference needs output token ids in [0, {V - 1}], got {t!r}")
        rows = torch.arange(parts.shape[1], device=parts.device)
        at = parts[:, rows, self.answer_pos]
        return (at[..., good] - at[..., bad]).mean(-1)

    def to_dict(self) -> dict:
        return jsonable({"parts": self.part_names, "contributions": self.contributions(), "at": self.at})

    @classmethod
    def from_dict(cls, d: dict) -> LogitDecomposition:
        return cls(None, None, None, None, summary={k: d[k] for k in ("parts", "contributions", "at")})

    def text(self) -> str:
        """Each part's mean contribution to the right token's logit, largest first."""
        c = self.contributions().tolist()
        order = sorted(range(len(c)), key=lambda i: -abs(c[i]))
        lines = [f"logit decomposition: mean contribution to the right token's logit at {self.at}"]
        lines += [f"  {self.part_names[i]:<8}{c[i]:>10.4f}" for i in order]
        return "\n".join(lines)

    def figure(self):
        """Bar chart: mean contribution of each part to the right token's logit."""
        import plotly.graph_objects as go

        where = "the right answer at the answer position" if self.at == "answer positions" else "the correct next token"
        fig = go.Figure(go.Bar(x=self.part_names, y=self.contributions().cpu().tolist()))
        fig.update_layout(title=f"Contribution to the logit of {where}", yaxis_title="logit", template="plotly_white")
        return fig


def logit_decomposition(
    model: HookedTransformer, data: TaskData | Tensor, *, device: str | None = None
) -> LogitDecomposition:
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
    dev = check_device(model, device)
    if isinstance(data, TaskData):
        from .answer_cache import check_model_data

        check_model_data(model, data)
        tokens, answer_pos, labels = data.tokens.to(dev), data.answer_pos, data.labels
    elif isinstance(data, Tensor):
        tokens = data.to(dev)
        check_tokens(model, tokens)
    else:
        raise TokenError(f"logit_decomposition takes task data or a tensor of token ids, got {type(data).__name__}")
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
