"""The exact per-position forward of one-layer attention-only models with a model axis, and the batch layout and
dropout masks around it: what the solo trainer runs for the recipe's options (the language-model objective, left
padding, dropout on the attention probabilities, counter-drawn masks; see :mod:`interp.objectives` and
:mod:`interp.dropout_masks`) and what a population runs where no token-count forward applies.

The forward is TransformerLens' (``HookedTransformer`` with one attention-only layer, pre-LN and final LN where
the spec has them, dropout where the recipe puts it) restricted to the query positions that carry a loss, laid out
for few large products: all heads' queries are folded into the key matrix first (``u = q W_K^T``, one einsum for
every head), so the scores of every head and query against every position are one ``[query x head, d_model] @
[d_model, pos]`` product per sentence, and the attention-weighted residuals one ``[query x head, pos] @ [pos,
d_model]`` product before ``W_V``: no ``[pos, head, d_head]`` keys or values (d_head = 2 here) are built. Tested
equal to the HookedTransformer forward with the same masks put in by hooks (tests/test_seed_regime.py).

:func:`build_layout` lays a batch out (right or left padded, the answer positions or every position as queries)
for K models at once; :func:`draw_masks` draws its dropout masks as a solo run would (torch's generator, the solo
run's shapes, model by model) or from the counter (every model at once). The solo run is the same code with K = 1.
A population's step sorts each model's batch by length (:func:`sort_rows`) and runs the forward on slices of it
padded to their own longest sentence (:func:`cut_rows`; :func:`interp.population_paths.position_losses`).
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from jaxtyping import Bool, Float, Int
from torch import Tensor

from . import attention_native
from .attention import ADDITIVE, attention_pattern, pair_scores
from .dropout_masks import generator_mask, pattern_mask, position_mask, row_keys, run_keys
from .errors import ConfigError
from .task import IGNORE

if TYPE_CHECKING:
    from transformer_lens import HookedTransformer

    from .task import Task, TaskData

# TransformerLens normalization types a population (and this forward) covers, and their learned parameters
NORMS = {None: (), "LN": ("w", "b"), "LNPre": ()}


@dataclass(frozen=True)
class Norm:
    """How the residual stream is normalised before attention (``blocks.0.ln1``) and before the unembedding
    (``ln_final``): TransformerLens' ``normalization_type`` and ``eps``."""

    kind: str | None = None
    eps: float = 1e-5

    @classmethod
    def of(cls, model: HookedTransformer) -> Norm:
        kind = model.cfg.normalization_type
        if kind not in NORMS:
            raise ConfigError(
                f"normalization_type={kind!r} is not covered by the per-position forward; one of "
                f"{sorted(NORMS, key=str)}"
            )
        return cls(kind, float(model.cfg.eps))

    def param_names(self) -> tuple[str, ...]:
        return tuple(f"{m}.{p}" for m in ("blocks.0.ln1", "ln_final") for p in NORMS[self.kind])

    def apply(self, P: dict[str, Tensor], module: str, x: Tensor) -> Tensor:
        """TransformerLens' LayerNorm (``module``: ``blocks.0.ln1`` or ``ln_final``) of ``x`` (``[K, ..., d]``),
        with each model's weights (plain annotations: compiled steps call it)."""
        if self.kind is None:
            return x
        x = x - x.mean(-1, keepdim=True)
        x = x / (x.pow(2).mean(-1, keepdim=True) + self.eps).sqrt()
        if self.kind == "LN":
            shape = (x.shape[0],) + (1,) * (x.ndim - 2) + (x.shape[-1],)
            x = x * P[f"{module}.w"].view(shape) + P[f"{module}.b"].view(shape)
        return x


NO_NORM = Norm()


def model_params(model: HookedTransformer) -> dict[str, Tensor]:
    """A model's parameters with a model axis of one (views: gradients flow into the model's own parameters)."""
    return {n: p[None] for n, p in model.named_parameters()}


def stacked_position_logits(
    P: dict[str, Tensor],
    tokens: Int[Tensor, "K batch pos"],
    query_pos: Int[Tensor, "K batch k"],
    attn_scale: float,
    norm: Norm = NO_NORM,
    *,
    identity_w_o: bool = False,
    key_valid: Bool[Tensor, "K batch pos"] | None = None,
    emb_mask: Float[Tensor, "K batch pos d_model"] | None = None,
    pattern_mask: Float[Tensor, "K batch k heads pos"] | None = None,
    out_mask: Float[Tensor, "K batch k d_model"] | None = None,
    pooling: str = "softmax",
    native: bool = False,
) -> Float[Tensor, "K batch k vocab_out"]:
    """Logits at ``query_pos`` of K one-layer attention-only models (``P[name]`` is ``[K, ...]``, state-dict
    names). Keys are the positions at or before each query that ``key_valid`` allows (all where None). Dropout
    multipliers: ``emb_mask`` on the embedding (before ``ln1``: the residual stream keeps it too), ``pattern_mask``
    on the attention probabilities, ``out_mask`` on the attention output. ``identity_w_o``: ``W_O`` is the frozen
    identity (skipped: multiplying by it is exact anyway). ``pooling``: the models' attention pooling
    (:func:`interp.attention.pair_scores`; additive takes ``v`` from ``P``). ``native``: softmax attention without
    pattern dropout or left padding goes through the C kernel (:mod:`interp.attention_native`; equal to the torch
    products to float32 rounding); the caller has checked that the kernel takes the shape here
    (:func:`interp.attention_native.usable`)."""
    K, b, t = tokens.shape
    k = query_pos.shape[-1]
    W_Q, W_K = P["blocks.0.attn.W_Q"], P["blocks.0.attn.W_K"]
    H, d = W_Q.shape[1:3]
    W_E = P["embed.W_E"]
    # each model's embedding as one lookup in the stacked table (an index_select, whose backward is an index_add:
    # no advanced-indexing index_put, which deterministic mode makes slow)
    rows_of = (tokens + (torch.arange(K, device=tokens.device) * W_E.shape[1])[:, None, None]).flatten()
    x = W_E.reshape(-1, W_E.shape[-1]).index_select(0, rows_of).view(K, b, t, -1) + P["pos_embed.W_pos"][:, None, :t]
    if emb_mask is not None:
        x = x * emb_mask
    xn = norm.apply(P, "blocks.0.ln1", x)
    at_queries = query_pos[..., None].expand(-1, -1, -1, x.shape[-1])  # [K, b, k, d]
    q = torch.einsum("Kbkd,Khde->Kbkhe", xn.gather(2, at_queries), W_Q) + P["blocks.0.attn.b_Q"][:, None, None]
    if native and pooling == "softmax" and pattern_mask is None and key_valid is None:
        # every head's query folded into W_K and scaled, as below; the kernel skips the hidden keys itself and leaves
        # out q . b_K, a constant per query that the softmax removes
        u = torch.einsum("Kbkhe,Khde->Kbkhd", q / attn_scale, W_K).reshape(K * b, k * H, d)
        y = inspect.unwrap(attention_native.weighted_inputs)(u, xn.reshape(K * b, t, d), query_pos.reshape(K * b, k))
        return _after_attention(P, x, y.view(K, b, k, H, d), at_queries, norm, identity_w_o, out_mask)
    hidden = torch.arange(t, device=tokens.device)[None, None, None, :] > query_pos[..., None]  # [K, b, k, t]
    if key_valid is not None:
        # a query outside its model's own layout (left padding with every position a query: the positions before a
        # narrower model's offset) keeps the keys up to itself, pads all: with none its softmax was NaN, and NaN
        # times its zero gradient (its target is ignored) reached every weight. Its loss and gradient stay zero.
        inside = key_valid.gather(-1, query_pos)  # [K, b, k]
        hidden = hidden | (~key_valid[:, :, None, :] & inside[..., None])
    if pooling == "softmax":
        # every head's query folded into W_K, and the scale into the query (a [query, d_model] product, not a pass
        # over the scores); the query-key bias and the hidden keys' -inf are the input the scores' product adds to
        u = torch.einsum("Kbkhe,Khde->Kbkhd", q / attn_scale, W_K).reshape(K * b, k * H, d)
        q_bias = (q * P["blocks.0.attn.b_K"][:, None, None]).sum(-1)[..., None] / attn_scale  # [K, b, k, H, 1]
        added = q_bias + torch.zeros(hidden.shape, device=x.device).masked_fill_(hidden, float("-inf"))[:, :, :, None]
        scores = torch.baddbmm(added.view(K * b, k * H, t), u, xn.reshape(K * b, t, d).transpose(-1, -2))
        pattern = scores.view(K, b, k, H, t).softmax(-1)
    else:  # other poolings score each query against each key from the per-head keys
        keys = torch.einsum("Kbtd,Khde->Kbhte", xn, W_K) + P["blocks.0.attn.b_K"][:, None, :, None]
        additive_v = P[f"blocks.0.attn.{ADDITIVE}"][:, None] if pooling == "additive" else None  # [K, 1, H, e]
        scores = pair_scores(pooling, q.transpose(2, 3), keys, attn_scale, additive_v).transpose(2, 3)
        pattern = attention_pattern(scores.masked_fill(hidden[:, :, :, None], float("-inf")))
    if pattern_mask is not None:
        pattern = pattern * pattern_mask
    y = torch.matmul(pattern.view(K, b, k * H, t), xn).view(K, b, k, H, d)  # attention-weighted inputs
    # each query's values carry b_V weighed by its pattern's sum: 1 for a softmax (up to rounding) unless dropout
    # acts on the pattern
    sums = None if pooling == "softmax" and pattern_mask is None else pattern.sum(-1, keepdim=True)
    return _after_attention(P, x, y, at_queries, norm, identity_w_o, out_mask, sums)


def _after_attention(
    P: dict[str, Tensor],
    x: Tensor,
    y: Tensor,
    at_queries: Tensor,
    norm: Norm,
    identity_w_o: bool,
    out_mask: Tensor | None,
    pattern_sums: Tensor | None = None,
) -> Tensor:
    """The logits from the attention-weighted inputs ``y`` (``[K, b, k, H, d_model]``): values, output, the
    residual at the queries, the final norm and the unembedding. ``pattern_sums`` (``[K, b, k, H, 1]``): what each
    query's ``b_V`` is weighed by (None: 1, a softmax's pattern without dropout)."""
    K, b, k = y.shape[:3]
    b_V = P["blocks.0.attn.b_V"][:, None, None]
    z = torch.einsum("Kbkhd,Khde->Kbkhe", y, P["blocks.0.attn.W_V"]) + (
        b_V if pattern_sums is None else pattern_sums * b_V
    )
    if identity_w_o:
        out = z.reshape(K, b, k, -1) + P["blocks.0.attn.b_O"][:, None, None]
    else:
        out = torch.einsum("Kbkhe,Khed->Kbkd", z, P["blocks.0.attn.W_O"]) + P["blocks.0.attn.b_O"][:, None, None]
    if out_mask is not None:
        out = out * out_mask
    resid = norm.apply(P, "ln_final", x.gather(2, at_queries) + out)
    return torch.einsum("Kbkd,Kdv->Kbkv", resid, P["unembed.W_U"]) + P["unembed.b_U"][:, None, None]


def mean_losses(
    logits: Float[Tensor, "K batch k vocab_out"], targets: Int[Tensor, "K batch k"], dtype: torch.dtype = torch.float32
) -> Float[Tensor, " K"]:
    """Each model's mean cross-entropy over the positions of its batch that carry a target."""
    losses = F.cross_entropy(
        logits.flatten(0, 2).to(dtype), targets.flatten(), ignore_index=IGNORE, reduction="none"
    ).view(targets.shape[0], -1)
    valid = (targets != IGNORE).view(targets.shape[0], -1)
    return losses.sum(1) / valid.sum(1).clamp(min=1)


@dataclass(frozen=True)
class Layout:
    """A batch of K models laid out for :func:`stacked_position_logits`: every model's sentences padded to the
    longest of all (``pos``), right-aligned under left padding with the pads a model's own solo run would have
    (``key_valid`` hides the extra ones), the query positions and their targets, and each position's place in its
    sentence (pads negative). ``offsets`` / ``widths``: where each model's own solo layout lies along ``pos``."""

    tokens: Int[Tensor, "K batch pos"]
    query_pos: Int[Tensor, "K batch k"]
    targets: Int[Tensor, "K batch k"]
    positions: Int[Tensor, "K batch pos"]
    key_valid: Bool[Tensor, "K batch pos"] | None
    offsets: Int[Tensor, " K"]
    widths: Int[Tensor, " K"]
    all_queries: bool  # every position is a query (the language-model objective)

    @property
    def query_places(self) -> Int[Tensor, "K batch k"]:
        return self.positions.gather(-1, self.query_pos)


def build_layout(
    tokens: Int[Tensor, "K batch full"],
    targets: Int[Tensor, "K batch full"],
    lengths: Int[Tensor, "K batch"],
    objective: str,
    padding: str,
    pad_token: int | None,
) -> Layout:
    """Lay out K batches (right-padded sentences as the task gives them, with the task's targets) for the
    ``objective`` (``answer``: the target positions, the same number in every sentence; ``lm``: every position,
    next-token targets) and ``padding`` (``right``; ``left``: pads before each sentence up to its model's longest,
    which needs the task's pad token)."""
    K, b, _ = tokens.shape
    t = max(int(lengths.max()), 1)
    tokens, targets = tokens[..., :t], targets[..., :t]
    pos = torch.arange(t, device=tokens.device)
    if objective == "lm":
        nxt = torch.cat([tokens[..., 1:], tokens[..., :1]], -1)
        targets = torch.where(pos + 1 < lengths[..., None], nxt, torch.full_like(nxt, IGNORE))
    widths = lengths.amax(1)
    if padding == "left":
        if pad_token is None:
            raise ConfigError("padding='left' needs a task whose vocabulary has a pad token")
        shift = (t - lengths)[..., None]
        src = (pos - shift).clamp(min=0)
        inside = pos >= shift
        tokens = torch.where(inside, tokens.gather(-1, src), torch.full_like(tokens, pad_token))
        targets = torch.where(inside, targets.gather(-1, src), torch.full_like(targets, IGNORE))
        positions = pos - shift
        offsets = t - widths
        key_valid = (pos[None, None] >= offsets[:, None, None]).expand(K, b, t)
    else:
        positions = pos.expand(K, b, t)
        offsets = torch.zeros_like(widths)
        key_valid = None
    if objective == "lm":
        query_pos = pos.expand(K, b, t)
        q_targets = targets
    else:
        has = targets != IGNORE
        counts = has.sum(-1)
        if int(counts.min()) != int(counts.max()) or int(counts.max()) == 0:
            raise ConfigError("the answer objective's batched forward needs the same number of targets per sentence")
        query_pos = has.nonzero()[:, -1].view(K, b, -1)
        q_targets = targets.gather(-1, query_pos)
    return Layout(tokens, query_pos, q_targets, positions, key_valid, offsets, widths, objective == "lm")


def sort_rows(layout: Layout, rows: Int[Tensor, "K batch"]) -> Layout:
    """``layout`` with each model's batch in the order ``rows`` (e.g. ``lengths.argsort(1)``: sentences of similar
    length side by side, so that :func:`cut_rows` can pad each run of them to its own longest)."""

    def take(x: Tensor) -> Tensor:
        return x.gather(1, rows.view(*rows.shape, *[1] * (x.ndim - 2)).expand(-1, -1, *x.shape[2:]))

    kv = None if layout.key_valid is None else take(layout.key_valid)
    return replace(
        layout,
        tokens=take(layout.tokens),
        query_pos=take(layout.query_pos),
        targets=take(layout.targets),
        positions=take(layout.positions),
        key_valid=kv,
    )


def cut_rows(
    layout: Layout, lengths: Int[Tensor, "K batch"], start: int, stop: int, masks: Sequence[Tensor | None] = ()
) -> tuple[Layout, list[Tensor | None]]:
    """Rows ``start:stop`` of every model's batch of a right-padded ``layout`` (and of its dropout ``masks``, as
    :func:`draw_masks` gives them), cut to the longest of those sentences (``lengths``: in the layout's row order):
    nothing in a sentence looks at a position past its end (keys come before their query, and under right padding
    every target sits inside its sentence), so the cut drops only positions no loss depends on. Views, no copies."""
    if layout.key_valid is not None:
        raise ConfigError("a layout is cut to its rows' longest sentence only under right padding (left pads count)")
    w = max(int(lengths[:, start:stop].max()), 1)
    rows, q = slice(start, stop), slice(0, w) if layout.all_queries else slice(None)  # lm: queries are positions
    lay = Layout(
        layout.tokens[:, rows, :w],
        layout.query_pos[:, rows, q],
        layout.targets[:, rows, q],
        layout.positions[:, rows, :w],
        None,
        layout.offsets,
        layout.widths.clamp(max=w),
        layout.all_queries,
    )
    cuts = ((rows, slice(0, w)), (rows, q, slice(None), slice(0, w)), (rows, q))  # embedding, pattern, output
    return lay, [None if m is None else m[(slice(None), *c)] for m, c in zip(masks, cuts)]


def draw_masks(
    layout: Layout,
    sites: frozenset[str],
    p: float,
    rng: str,
    d_model: int,
    n_heads: int,
    *,
    generators: Sequence[torch.Generator | None] = (None,),
    seeds: Sequence[int] = (),
    epoch: int = 0,
    sentences: Int[Tensor, "K batch"] | None = None,
    rows: Int[Tensor, "K batch"] | None = None,
    buffers: dict[str, Tensor] | None = None,
) -> tuple[Tensor | None, Tensor | None, Tensor | None]:
    """The dropout multipliers ``(embedding, pattern, attention output)`` of a laid-out batch (None where
    dropout does not act). ``rng="torch"``: each model's masks, of its solo run's shapes (its own width; every
    position a query under the language-model objective), from its generator (``None``: torch's default), in the
    order embedding, pattern, output; placed where its layout lies. ``rng="counter"``: from each model's seed, the
    ``epoch`` and the ``sentences`` (indices into the training split), every model at once. ``rows``: the layout
    holds each model's batch in this order (:func:`sort_rows`); torch masks, drawn in the solo run's order, are put
    in it too (counter masks follow the ``sentences``, given in the layout's order). ``buffers``: where torch masks
    are written, kept by the caller from step to step (:func:`scratch`)."""
    if not sites:
        return None, None, None
    K, b, t = layout.tokens.shape
    k = layout.query_pos.shape[-1]
    dev = layout.tokens.device
    if rng == "counter":
        if sentences is None or len(seeds) != K:
            raise ConfigError("counter-drawn dropout masks need each model's seed and the batch's sentence indices")
        q_places = layout.query_places

        def rows(site):
            return row_keys(run_keys(seeds, epoch, site).to(dev), sentences.to(dev))

        emb = position_mask(rows("embedding"), layout.positions, d_model, p) if "embedding" in sites else None
        pat = pattern_mask(rows("pattern"), q_places, layout.positions, n_heads, p) if "pattern" in sites else None
        out = position_mask(rows("attention"), q_places, d_model, p) if "attention" in sites else None
        return emb, pat, out
    # the embedding mask is the largest: only the positions outside a model's own layout are zeroed (pads: finite,
    # never attended)
    emb = scratch(buffers, "embedding", (K, b, t, d_model), dev) if "embedding" in sites else None
    pat = scratch(buffers, "pattern", (K, b, k, n_heads, t), dev).zero_() if "pattern" in sites else None
    out = torch.zeros(K, b, k, d_model, device=dev) if "attention" in sites else None
    rank = (
        None
        if rows is None
        else torch.empty_like(rows).scatter_(1, rows, torch.arange(b, device=rows.device).expand(K, b))
    )
    for m, gen in enumerate(generators):
        w, o = int(layout.widths[m]), int(layout.offsets[m])
        qs = slice(o, o + w) if layout.all_queries else slice(0, k)
        nq = w if layout.all_queries else k
        if emb is not None:
            emb[m, :, :o] = 0
            emb[m, :, o + w :] = 0
            _place(emb[m, :, o : o + w], generator_mask((b, w, d_model), p, gen), rank, m)
        if pat is not None:
            _place(pat[m, :, qs, :, o : o + w], generator_mask((b, nq, n_heads, w), p, gen), rank, m)
        if out is not None:
            _place(out[m, :, qs], generator_mask((b, nq, d_model), p, gen), rank, m)
    return emb, pat, out


def scratch(
    buffers: dict[str, Tensor] | None, name: str, shape: tuple[int, ...], device, dtype: torch.dtype | None = None
) -> Tensor:
    """An uninitialised contiguous ``shape`` tensor of ``dtype`` (torch's default where None): a view of the start
    of ``buffers[name]`` (one flat buffer, kept from call to call, grown when too small), or a new tensor where
    ``buffers`` is None. Why: a step's embedding mask (``[K, batch, pos, d_model]``, 51 MB at K = 30) is larger
    than what glibc's malloc keeps on its heap, so a new one is mapped afresh from the system each step and every
    page of it faults on its first write, which cost ~10% of a per-position step. A step's backward uses the views
    it saved: writing the buffer again before that backward makes the backward raise (torch's version counter),
    never use the new masks."""
    if buffers is None:
        return torch.empty(shape, device=device, dtype=dtype)
    n, dtype = math.prod(shape), dtype or torch.get_default_dtype()
    buf = buffers.get(name)
    if buf is None or buf.device != torch.device(device) or buf.dtype != dtype or buf.numel() < n:
        buf = buffers[name] = torch.empty(n, device=device, dtype=dtype)
    return buf[:n].view(shape)


def _place(into: Tensor, mask: Tensor, rank: Tensor | None, m: int) -> None:
    """Copy a model's ``mask`` (rows in its solo run's order) into ``into``, row ``i`` to row ``rank[m, i]``."""
    if rank is None:
        into.copy_(mask)
    else:
        into.index_copy_(0, rank[m], mask.to(into.device))


def solo_batch_loss(
    model: HookedTransformer,
    batch: TaskData,
    sentences: Int[Tensor, " batch"],
    cfg,
    epoch: int,
    identity_w_o: bool,
    dtype: torch.dtype = torch.float32,
) -> Tensor:
    """A solo run's training loss on ``batch`` (the training sentences ``sentences``) under ``cfg``'s objective,
    padding and dropout: :func:`stacked_position_logits` with a model axis of one, masks as :func:`draw_masks`
    draws them for this run."""
    d, H = model.cfg.d_model, model.cfg.n_heads
    pad = batch.vocab.pad if batch.vocab is not None else None
    lay = build_layout(batch.tokens[None], batch.targets[None], batch.lengths[None], cfg.objective, cfg.padding, pad)
    masks = draw_masks(
        lay,
        cfg.dropout_sites,
        cfg.dropout,
        cfg.dropout_rng,
        d,
        H,
        seeds=[cfg.seed],
        epoch=epoch,
        sentences=sentences[None],
    )
    logits = stacked_position_logits(
        model_params(model),
        lay.tokens,
        lay.query_pos,
        float(model.blocks[0].attn.attn_scale),
        Norm.of(model),
        identity_w_o=identity_w_o,
        key_valid=lay.key_valid,
        emb_mask=masks[0],
        pattern_mask=masks[1],
        out_mask=masks[2],
    )
    return mean_losses(logits, lay.targets, dtype)[0]


@torch.no_grad()
def evaluate_left_padded(model: HookedTransformer, task: Task, data: TaskData, batch_size: int) -> dict[str, float]:
    """The task's metrics with the data left-padded in batches of ``batch_size`` consecutive sentences (what
    validation and test are under ``padding="left"``): predictions and losses at the task's target positions."""
    from .evaluation import target_positions

    task.check_data(data)
    P = model_params(model)
    scale, norm = float(model.blocks[0].attn.attn_scale), Norm.of(model)
    preds = torch.full_like(data.tokens, -1)
    loss = torch.zeros(data.tokens.shape, device=data.device)
    pad = data.vocab.pad if data.vocab is not None else None
    for start in range(0, len(data), batch_size):
        idx = torch.arange(start, min(start + batch_size, len(data)), device=data.device)
        chunk = data.select(idx)
        lay = build_layout(chunk.tokens[None], chunk.targets[None], chunk.lengths[None], "answer", "left", pad)
        logits = stacked_position_logits(P, lay.tokens, lay.query_pos, scale, norm, key_valid=lay.key_valid)[0]
        qpos = target_positions(chunk, few=False)  # a short last chunk can fail the "few" test its data passes
        rows = idx[:, None]
        preds[rows, qpos] = logits.argmax(-1)
        loss[rows, qpos] = F.cross_entropy(logits.transpose(1, 2).float(), lay.targets[0], reduction="none")
    return task.metrics(preds, loss, data)
