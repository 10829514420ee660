"""Many models of one shape trained as one batched computation.

``train_population(task, specs, cfgs, outs)`` trains K one-layer attention-only models (the thesis's shape) with
stacked parameters ``[K, ...]``: one batched forward, one backward and one optimiser step (AdamW, or Adam with
L2) for all K per training step. Each model gets exactly what :func:`interp.training.train` would give it alone:

- its own initialisation (``build_model(spec_k)``, seeded by ``spec_k.init_seed``),
- its own data order (``torch.randperm`` from a generator seeded by ``cfg_k.seed``, one permutation per epoch),
- its own dropout masks: the solo run draws them from the global RNG in the state ``build_model`` leaves it in;
  here each model has a generator in that same state and draws masks of the same shapes in the same order
  (``bernoulli_(1 - p) / (1 - p)``, which is what ``F.dropout`` computes on the CPU; all models' masks of a step in
  one call of the C replay of :mod:`interp.generator_replay`, the same numbers),
- its own learning rate (a ``[K]`` tensor), warmup, AdamW (the same update as ``torch.optim.AdamW``), best-epoch
  selection (higher validation accuracy, ties to lower validation loss), ``keep`` and ``patience``.

So each batched model equals the same seed trained alone to float tolerance (tests/test_population.py checks
weights and history for K = 1, 3 and 8). Each model is saved as an ordinary checkpoint (loads in plain
TransformerLens) whose provenance says it was trained in a population of K.

Only the shape the exact query-restricted forward covers is batched (one layer, attention only, no LayerNorm or
LN / LNPre):
the thesis's models, with any pooling (softmax, linear, additive: in a model without positions each scores a pair of
tokens, so the token-count forward covers them too) and any Q/K/V shape, but no sparse mask (masks depend on
positions: those models train one at a time). On CUDA the dropout masks are drawn by per-model CPU generators, as a
solo run on CUDA draws them (:func:`interp.dropout_masks.dropout`), so the numbers match a solo run on either device
up to float error. One exception to equality, where the true gradient is 0
and the computed one rounding noise, which Adam scales to full steps, so the population and the solo run drift apart
in that direction: linear attention with ``relu`` features (where a query's features have one positive coordinate
its pattern does not depend on that coordinate's size). The key bias ``b_K`` under softmax attention
(``attn_bias=True``: a per-head constant added to every key's score leaves the softmax unchanged) was the other; both
runs now set its gradient to its exact value, zero (:func:`interp.training.inert_parameters`), and it equals too.
"""

from __future__ import annotations

import inspect
import math
import time
import warnings
from collections.abc import Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F
from jaxtyping import Bool, Float, Int
from torch import Tensor
from tqdm.auto import tqdm

from . import count_native
from .attention import ADDITIVE, attention_pattern, extra_parameters, features, pair_scores, qkv_masks, stacked_qkv
from .compiled import compiled_step
from .configs import SELF_SCORED, check_snapshot_every
from .count_native import count_losses_native, count_tables_native
from .determinism import deterministic
from .device import pick_device
from .dropout_masks import position_mask, row_keys, run_keys
from .errors import ConfigError
from .evaluation import target_positions
from .files import AtomicFile
from .generator_replay import DropoutGenerators
from .halving import HEAD_PARAMS, Halving, Scorer
from .initialisation import initialise
from .loading import save_checkpoint
from .model import ModelSpec, build_model
from .objectives import check_lm_targets, eval_pads, lm_targets
from .population_paths import _position_losses, forward_of, position_losses, prefix_step
from .position_forward import NO_NORM, NORMS, Norm, build_layout, scratch, stacked_position_logits
from .prefix_counts import prefix_count_losses, prefix_rows
from .query_forward import supports_query_forward
from .resume_file import Encoded, check_identity, read_resume_file, write_resume_file
from .run_record import RunRecord, validation_split
from .schedules import warmup_factor
from .training import (
    TrainConfig,
    check_fits,
    inert_parameters,
    recipe_options,
    snapshot_directory,
    snapshot_name,
    snapshot_training,
    task_splits,
    variant_refusal,
)
from .variants import parse_attention

if TYPE_CHECKING:
    from .task import Task

# the parameters of a one-layer attention-only HookedTransformer, in state-dict names
PARAMS = (
    "embed.W_E",
    "pos_embed.W_pos",
    "blocks.0.attn.W_Q",
    "blocks.0.attn.b_Q",
    "blocks.0.attn.W_K",
    "blocks.0.attn.b_K",
    "blocks.0.attn.W_V",
    "blocks.0.attn.b_V",
    "blocks.0.attn.W_O",
    "blocks.0.attn.b_O",
    "unembed.W_U",
    "unembed.b_U",
)
# log(0) as a finite number: exp(score + ABSENT - max) underflows to exactly 0 for any score below 1e29 in size, as
# exp(-inf) does, and unlike -inf it can enter a matrix product (0 x -inf would be NaN)
ABSENT = -1e30
# what may differ between the models of one population
VARYING_CONFIG = ("seed", "lr")


def check_population(specs: Sequence[ModelSpec], cfgs: Sequence[TrainConfig]) -> None:
    """Refuse populations that are not one shape and one recipe (up to seeds and learning rates)."""
    if not specs or len(specs) != len(cfgs):
        raise ConfigError(
            f"a population needs one spec and one training config per model, got {len(specs)} specs "
            f"and {len(cfgs)} configs"
        )
    shape = {k: v for k, v in asdict(specs[0]).items() if k != "init_seed"}
    for i, s in enumerate(specs):
        diff = [k for k, v in asdict(s).items() if k != "init_seed" and shape[k] != v]
        if diff:
            raise ConfigError(f"model {i} differs from model 0 in {diff}: a population is one shape")
    recipe = {k: v for k, v in asdict(cfgs[0]).items() if k not in VARYING_CONFIG}
    for i, c in enumerate(cfgs):
        diff = [k for k, v in asdict(c).items() if k not in VARYING_CONFIG and recipe[k] != v]
        if diff:
            raise ConfigError(f"training config {i} differs from config 0 in {diff}: only {VARYING_CONFIG} may vary")
    if cfgs[0].loss_dtype != "float32":
        raise ConfigError(f"batched training computes the loss in float32; got loss_dtype={cfgs[0].loss_dtype!r}")
    s = specs[0]
    if not (s.n_layers == 1 and s.loops == 1 and s.attn_only and s.normalization in NORMS):
        raise ConfigError(
            "batched training covers one-layer attention-only models without LayerNorm or with LN / LNPre (the "
            f"thesis's shape); got n_layers={s.n_layers}, loops={s.loops}, attn_only={s.attn_only}, normalization="
            f"{s.normalization!r}: train these one at a time with `interp train`"
        )
    if cfgs[0].curriculum is not None or cfgs[0].aux_loss:
        raise ConfigError(
            "batched training draws every example each epoch with the task's loss alone; a curriculum or an "
            "auxiliary loss trains one at a time with `interp train`"
        )
    if s.positional not in ("none", "standard"):
        raise ConfigError(
            f"batched training covers positional='none' or 'standard' (positions added to the residual stream); got "
            f"positional={s.positional!r}: train these one at a time with `interp train`"
        )
    if cfgs[0].padding == "left" and s.positional != "none":
        raise ConfigError("batched training with padding='left' covers models without positional embedding")
    if parse_attention(s.attention).masks:
        raise ConfigError(
            f"batched training covers dense attention; attention={s.attention!r} masks keys by position: train "
            "these one at a time with `interp train`"
        )
    variant = parse_attention(s.attention).pooling != "softmax" or s.qkv != "full"
    if variant and recipe_options(cfgs[0]):  # as the solo run refuses them: there is no solo run to equal
        raise ConfigError(variant_refusal(recipe_options(cfgs[0]), s.attention, s.qkv))


def stacked_logits_at(
    P: dict[str, Tensor],
    tokens: Int[Tensor, "K batch pos"],
    query_pos: Int[Tensor, "K batch k"],
    attn_scale: float,
    emb_mask: Float[Tensor, "K batch pos d_model"] | None = None,
    out_mask: Float[Tensor, "K batch k d_model"] | None = None,
    pooling: str = "softmax",
) -> Float[Tensor, "K batch k vocab_out"]:
    """Logits at ``query_pos`` of K one-layer attention-only models at once (``P[name]`` is ``[K, ...]``): the
    query-restricted forward of :func:`interp.query_forward.logits_at` with a model axis. ``emb_mask`` /
    ``out_mask`` are dropout multipliers (0 or 1/(1-p)) for the embedding and the attention output; ``pooling`` is
    the models' (:func:`interp.attention.pair_scores`; additive takes ``v`` from ``P``)."""
    K, b, t = tokens.shape
    ks = torch.arange(K, device=tokens.device)[:, None, None]
    x = P["embed.W_E"][ks, tokens] + P["pos_embed.W_pos"][:, None, :t]  # [K, b, t, d]
    if emb_mask is not None:
        x = x * emb_mask
    rows = torch.arange(b, device=tokens.device)[None, :, None]
    xq = x[ks, rows, query_pos]  # [K, b, k, d]
    q = torch.einsum("Kbkd,Khde->Kbhke", xq, P["blocks.0.attn.W_Q"]) + P["blocks.0.attn.b_Q"][:, None, :, None]
    keys = torch.einsum("Kbtd,Khde->Kbhte", x, P["blocks.0.attn.W_K"]) + P["blocks.0.attn.b_K"][:, None, :, None]
    vals = torch.einsum("Kbtd,Khde->Kbhte", x, P["blocks.0.attn.W_V"]) + P["blocks.0.attn.b_V"][:, None, :, None]
    additive_v = P[f"blocks.0.attn.{ADDITIVE}"][:, None] if pooling == "additive" else None  # [K, 1, h, e]
    scores = pair_scores(pooling, q, keys, attn_scale, additive_v)
    future = torch.arange(t, device=tokens.device)[None, None, None, :] > query_pos[..., None]  # [K, b, k, t]
    scores = scores.masked_fill(future[:, :, None], float("-inf"))
    z = torch.einsum("Kbhkt,Kbhte->Kbkhe", attention_pattern(scores), vals)
    out = torch.einsum("Kbkhe,Khed->Kbkd", z, P["blocks.0.attn.W_O"]) + P["blocks.0.attn.b_O"][:, None, None]
    if out_mask is not None:
        out = out * out_mask
    resid = xq + out
    return torch.einsum("Kbkd,Kdv->Kbkv", resid, P["unembed.W_U"]) + P["unembed.b_U"][:, None, None]


@dataclass(frozen=True)
class TokenCounts:
    """What a one-layer attention-only model without positions sees at each target position of some data: the
    token there (the query) and, for every token that occurs before some target (``present``), how often it occurs
    at or before the query (0 where it does not). Tokens never present get no attention anywhere, so leaving them
    out of the softmax is exact. ``queries`` are the distinct query tokens (sorted) and ``query_idx`` each target's
    place among them; ``always`` marks the present tokens counted at every target (e.g. ``[BOS]``)."""

    query_tok: Int[Tensor, "batch k"]
    counts: Float[Tensor, "batch k present"]
    present: Int[Tensor, " present"]
    queries: Int[Tensor, " Q"]
    query_idx: Int[Tensor, "batch k"]
    always: Bool[Tensor, " present"]

    @property
    def log_counts(self) -> Float[Tensor, "batch k present"]:
        """``log`` of the counts, :data:`ABSENT` where a token does not occur."""
        return self.counts.log().clamp(min=ABSENT)

    def select(self, idx: Int[Tensor, "K b"]) -> tuple[Int[Tensor, "K b k"], Float[Tensor, "K b k present"]]:
        """Each model's rows ``idx``: the query tokens' places among :attr:`queries`, and the counts (one
        ``index_select`` each: advanced indexing with a ``[K, b]`` index is several times slower)."""
        rows = idx.flatten()
        return (
            self.query_idx.index_select(0, rows).view(*idx.shape, -1),
            self.counts.index_select(0, rows).view(*idx.shape, *self.counts.shape[1:]),
        )


def token_counts(data, d_vocab: int, pad_token: int | None = None, pads: Tensor | None = None) -> TokenCounts:
    """:class:`TokenCounts` of every target position of ``data``. A one-layer attention-only model without
    positions, with no dropout before its attention, computes its logits there from these alone. Under left
    padding (``pad_token``) the pad token is a column of its own, with ``pads`` (each sentence's pads; none
    where None) as its count."""
    qpos = target_positions(data, few=False)  # exact however many: a split of short sentences is evaluated too
    if qpos is None:
        raise ConfigError("batched training needs tasks whose rows all have the same number of targets")
    cum = F.one_hot(data.tokens, d_vocab).cumsum(1)  # [batch, pos, vocab]
    rows = torch.arange(len(data), device=data.tokens.device)[:, None]
    counts = cum[rows, qpos]  # [batch, k, vocab]
    if pad_token is not None:
        counts[..., pad_token] = 0 if pads is None else pads[:, None].to(counts.dtype)
    present = (counts > 0).flatten(0, 1).any(0)
    if pad_token is not None:
        present[pad_token] = True
    present = present.nonzero().flatten()
    counts = counts[..., present].float()
    query_tok = data.tokens.gather(1, qpos)
    queries = query_tok.unique()
    always = (counts > 0).flatten(0, 1).all(0)
    return TokenCounts(query_tok, counts, present, queries, torch.searchsorted(queries, query_tok), always)


# train the token-count forward's rows in C where the kernel takes the population (interp.count_native; False: the
# torch step everywhere, as on other devices)
NATIVE_ROWS = True

# the weights form of the token-count forward is used where, for every model, head and query token, some token that
# is counted at every such query scores at most this far below the query token's best-scoring present token: its
# denominator is then at least exp(-WEIGHT_GAP), far from float32's underflow (see weights_are_exact)
WEIGHT_GAP = 60.0
# the parameters the token-count tables are made of, in the order interp.count_native.count_tables_native takes them
TABLE_PARAMETERS = (
    "embed.W_E",
    *(f"blocks.0.attn.{n}" for n in ("W_Q", "W_K", "W_V", "b_Q", "b_K", "b_V")),
    "unembed.W_U",
)


def _count_tables(
    P: dict[str, Tensor], queries: Tensor, present: Tensor, attn_scale: float, norm: Norm, pooling: str
) -> tuple[Tensor, Tensor]:
    """The per-model tables of the token-count forwards: ``QK`` ``[K, head, query token, present token]`` (the
    pooling's score of each pair) and the values ``[K, head, present token, d_head]``. (Plain annotations: compiled
    steps trace this.)"""
    W_E, W_Q, W_K, W_V = (P[n] for n in ("embed.W_E", "blocks.0.attn.W_Q", "blocks.0.attn.W_K", "blocks.0.attn.W_V"))
    K, H, d, e = W_Q.shape
    E_in = norm.apply(P, "blocks.0.ln1", W_E)  # what attention reads from each token (pre-LN where the model has it)

    # [K, heads, d_model, d_head] -> [K, d_model, heads x d_head] (inline: the test run's type checker wraps every
    # def, nested ones too, and a compiled graph cannot trace the wrapper)
    W_Q, W_K, W_V = (W.permute(0, 2, 1, 3).reshape(K, d, H * e) for W in (W_Q, W_K, W_V))
    q = torch.bmm(E_in[:, queries], W_Q).view(K, -1, H, e).transpose(1, 2) + P["blocks.0.attn.b_Q"][:, :, None]
    kv = torch.bmm(E_in[:, present], torch.cat([W_K, W_V], 2)).view(K, -1, 2, H, e)  # keys, values
    keys = kv[:, :, 0].transpose(1, 2) + P["blocks.0.attn.b_K"][:, :, None]  # [K, H, present, e]
    vals = kv[:, :, 1].transpose(1, 2) + P["blocks.0.attn.b_V"][:, :, None]
    if pooling == "softmax":  # d_head-long dot products, as one fused pass rather than K x H tiny products
        return (q[:, :, :, None] * keys[:, :, None]).sum(-1) / attn_scale, vals
    additive_v = P[f"blocks.0.attn.{ADDITIVE}"] if pooling == "additive" else None
    return inspect.unwrap(pair_scores)(pooling, q, keys, attn_scale, additive_v), vals


_plain_count_tables = inspect.unwrap(_count_tables)  # unwrapped once: the test run's type checker wraps it


def _weights_exact(QK: Tensor, queries: Tensor, present: Tensor, always: Tensor) -> Tensor:
    """A 0-dim bool tensor: the condition of :func:`weights_are_exact` on the scores ``QK`` ``[K, head, query
    token, present token]``. (Plain annotations: compiled steps trace this.)"""
    counted = (present[None, :] == queries[:, None]) | always[None, :]  # [Q, Vp]: counted at every such query
    best_counted = QK.masked_fill(~counted, float("-inf")).amax(-1)
    return ((best_counted - QK.amax(-1)) > -WEIGHT_GAP).all()


@torch.no_grad()
def weights_are_exact(
    P: dict[str, Tensor],
    queries: Int[Tensor, " Q"],
    present: Int[Tensor, " present"],
    always: Bool[Tensor, " present"],
    attn_scale: float,
    norm: Norm = NO_NORM,
    pooling: str = "softmax",
) -> bool:
    """Whether the weights form of the token-count forward (:func:`stacked_count_logits`) computes these models'
    logits to float32 rounding: softmax or additive pooling, and for every model, head and query token, the best
    score of a token counted at every such query (the query token itself, and ``always``) at most
    :data:`WEIGHT_GAP` below the best score of any present token. Computed from the parameters alone (a few
    products of ``[head, token]`` tables)."""
    if pooling not in ("softmax", "additive"):
        return False
    QK, _ = _count_tables(P, queries, present, attn_scale, norm, pooling)  # [K, H, Q, Vp]
    return bool(_weights_exact(QK, queries, present, always))


def stacked_count_logits(
    P: dict[str, Tensor],
    query_tok: Int[Tensor, "K batch k"],
    log_counts: Float[Tensor, "K batch k present"],
    present: Int[Tensor, " present"],
    attn_scale: float,
    out_mask: Float[Tensor, "K batch k d_model"] | None = None,
    norm: Norm = NO_NORM,
    pooling: str = "softmax",
) -> Float[Tensor, "K batch k vocab_out"]:
    """The same logits as :func:`stacked_logits_at` for models without positional embedding and without dropout
    before attention, from token counts (:class:`TokenCounts`): attention to a token is shared by all its
    occurrences, so the softmax over positions is a softmax over the present tokens with ``log(count)`` added to
    the scores. Cost per query ``O(present x heads x d_head)`` instead of ``O(pos x heads x d_head)``; equal up
    to float rounding.

    Two forms, picked per call by :func:`weights_are_exact`: the weights form (:func:`_weighted_count_logits`:
    each head's attention output is a ratio of two linear functions of the counts, so no exponential is taken
    per query) where it is exact to float32 rounding, else the softmax form (:func:`_softmax_count_logits`)."""
    K = query_tok.shape[0]
    counts = torch.where(log_counts > ABSENT / 2, log_counts.exp(), torch.zeros_like(log_counts))
    queries = query_tok.unique()
    query_idx = torch.searchsorted(queries, query_tok)
    always = (counts > 0).flatten(0, 2).all(0)
    if weights_are_exact(P, queries, present, always, attn_scale, norm, pooling):
        return _weighted_count_logits(P, query_idx, counts, queries, present, attn_scale, out_mask, norm, pooling)
    return _softmax_count_logits(P, query_tok, log_counts, present, attn_scale, out_mask, norm, pooling).view(
        K, *query_tok.shape[1:], -1
    )


ROW_GRAD_D_MODEL = 32  # from this d_model on, :class:`_Unembed` writes the residual's gradient N x d_model


class _Unembed(torch.autograd.Function):
    """The token-count forward's unembedding, transposed: ``logits^T = b_U + W_U^T @ resid^T`` ``[K, vocab, N]``.
    MKL's batched product writes N-long rows 3-4x faster than the ``N x vocab`` output of ``resid @ W_U`` (vocab is
    8 or so), and W_U's gradient ``g @ resid`` ``[vocab, d_model]`` gains as much. The residual's gradient can be
    written either way round, at about the same cost for the product alone: ``W_U @ g`` (``[K, d_model, N]``, what
    autograd would do) or, with ``rows=True``, ``g^T @ W_U^T`` (``[K, N, d_model]``). The second is the layout of
    the attention output that the gradient flows back into, so the fused elementwise backward there reads it in
    order instead of transposed: measured whole steps (K = 50, one thread) 7-11% faster at d_model = 32 and 7%
    slower at d_model = 8, where the product's 8-long output rows are slow (:data:`ROW_GRAD_D_MODEL`). Both are
    exact: each entry is the same dot product over vocab."""

    @staticmethod
    def forward(resid, W_U, b_U, rows):
        return torch.baddbmm(b_U[:, :, None], W_U.transpose(1, 2), resid.transpose(1, 2))

    @staticmethod
    def setup_context(ctx, inputs, output):
        ctx.rows = inputs[3]
        ctx.save_for_backward(inputs[0], inputs[1])

    @staticmethod
    def backward(ctx, g):
        resid, W_U = ctx.saved_tensors
        if ctx.rows:
            g_resid = torch.bmm(g.transpose(1, 2), W_U.transpose(1, 2))  # [K, N, d_model]
        else:
            g_resid = torch.bmm(W_U, g).transpose(1, 2)  # [K, d_model, N], read transposed
        return g_resid, torch.bmm(g, resid).transpose(1, 2), g.sum(-1), None


def _weights_table(P, queries, present, attn_scale, norm, pooling) -> tuple[Tensor, Tensor]:
    """The scores ``QK`` ``[K, head, query token, present token]`` and the weights form's table ``[K, query token x
    present token, head x d_head + head]``: each head's values weighted by ``exp(score - the query token's best
    score)``, then the weights themselves (the denominators, once per head, not repeated over d_head), side by side
    so that one product by a row's counts gives both. (Plain annotations: compiled steps trace this.)"""
    QK, vals = _count_tables(P, queries, present, attn_scale, norm, pooling)  # [K, H, Q, Vp], [K, H, Vp, e]
    K, H, Q, Vp = QK.shape
    e = vals.shape[-1]
    # the shift cancels in every ratio, so its exact gradient is zero: detached, no rounding residue reaches the best
    # scoring token (a pad token no row counts would otherwise get a ~1e-9 gradient, which Adam scales to a step)
    Ew = (QK - QK.amax(-1, keepdim=True).detach()).exp()  # [K, H, Q, Vp], at most 1
    numer = (Ew[:, :, None] * vals.transpose(-1, -2)[:, :, :, None]).reshape(K, H * e, Q * Vp)
    return QK, torch.cat([numer, Ew.reshape(K, H, Q * Vp)], 1).transpose(1, 2)


def _native_tables(P, queries, present, attn_scale, norm, pooling, always) -> tuple[Tensor, Tensor, Tensor]:
    """What :func:`interp.count_native.count_losses_native` takes besides the rows: the weights form's table
    (:func:`_weights_table`), ``TE = W_E[queries] @ W_U`` ``[K, query token, vocab_out]`` (without a LayerNorm a
    query's own embedding enters its logits linearly) and the 0-dim bool tensor of :func:`weights_are_exact`.
    (Plain annotations: compiled steps trace this.)"""
    QK, table = _weights_table(P, queries, present, attn_scale, norm, pooling)
    TE = torch.bmm(P["embed.W_E"][:, queries], P["unembed.W_U"])
    return table, TE, _weights_exact(QK, queries, present, always)


def _weighted_count_logits(
    P,
    query_idx,
    counts,
    queries,
    present,
    attn_scale,
    out_mask=None,
    norm=NO_NORM,
    pooling="softmax",
    identity_w_o=False,
    always=None,
):
    """The token-count forward in weights form. A head attends to present token ``v`` with weight ``c_v E[v, q] /
    sum_u c_u E[u, q]``, where ``c`` are the query's counts and ``E[v, q] = exp(score(q, v) - max_u score(q, u))``
    depends on the query token ``q`` alone: one ``[head, query token, present token]`` table per model and step
    (the softmax of the query's scores plus ``log c``, rearranged). So every head's weighted values and its
    denominator are linear in the counts: two products ``[query, query token x present token] @ [query token x
    present token, head x d_head]`` per model (the left factor is the one-hot query token times the counts) give
    them, and a division the attention output; no exponential and no softmax per query. Exact to float32
    rounding where :func:`weights_are_exact` says so: with ``always`` (see :class:`TokenCounts`) given, also returns
    that condition as a 0-dim bool tensor, computed from the same tables (the caller redoes the step in softmax form
    where it is false). ``query_idx``: each query token's place in ``queries``. Plain annotations: compiled steps
    trace this."""
    K, b, k = query_idx.shape
    N = b * k
    W_E = P["embed.W_E"]
    d = W_E.shape[-1]
    QK, table = _weights_table(P, queries, present, attn_scale, norm, pooling)
    H, Q, Vp = QK.shape[1:]
    e = (table.shape[-1] - H) // H
    onehot = F.one_hot(query_idx.reshape(K, N), Q).to(counts.dtype)  # [K, N, Q]
    X = (onehot[..., None] * counts.reshape(K, N, 1, Vp)).reshape(K, N, Q * Vp)
    both = torch.bmm(X, table)  # [K, N, H x e + H]
    z = (both[..., : H * e].view(K, N, H, e) / both[..., H * e :, None]).view(K, N, H * e)
    if identity_w_o:
        out = z
    else:
        out = torch.bmm(z, P["blocks.0.attn.W_O"].reshape(K, H * e, d))
    out = (out + P["blocks.0.attn.b_O"][:, None]).view(K, b, k, d)
    if out_mask is not None:
        out = out * out_mask
    # each query's own embedding, by the one-hot product (gathering it measured faster alone, but its backward, a
    # scatter into the embedding, made whole training runs 5-12% slower)
    embedded = torch.bmm(onehot, W_E[:, queries]).view(K, b, k, d)
    resid = norm.apply(P, "ln_final", embedded + out).view(K, N, d)
    logits = _Unembed.apply(resid, P["unembed.W_U"], P["unembed.b_U"], d >= ROW_GRAD_D_MODEL)
    logits = logits.transpose(1, 2).view(K, b, k, -1)
    return (logits, _weights_exact(QK, queries, present, always)) if always is not None else logits


def _softmax_count_logits(
    P, query_tok, log_counts, present, attn_scale, out_mask=None, norm=NO_NORM, pooling="softmax"
):
    """The token-count forward in softmax form: the softmax over the present tokens of each query's scores plus
    ``log(count)``, for every pooling (linear attention: ``log φ(k)·φ(q)``, so the softmax weighs a token by
    ``count x φ(q)·φ(k)``, normalised, as the per-position forward's softmax of log-kernels does; a zero kernel is
    ABSENT, and a query whose present keys all weigh 0 attends to nothing, as there).

    Laid out for few large batched matmuls (per model) instead of many tiny ones (per model and head, inner
    dimension d_head): the query-key table ``QK[head, key token, query token]`` is built for the whole vocabulary
    and picked per query by a one-hot product, and each head's value of each token is carried through ``W_O``
    (``OV[head, key token, d_model]``), so the attention output is one ``[query, head x token] @ [head x token,
    d_model]`` product. The softmax runs over the tokens as the second-to-last axis (PyTorch's CPU softmax is ~10x
    slower over a short last axis). Plain annotations: compiled steps trace this."""
    K, b, k = query_tok.shape
    N = b * k
    W_E, W_Q, W_K, W_V, W_O = (
        P[n] for n in ("embed.W_E", "blocks.0.attn.W_Q", "blocks.0.attn.W_K", "blocks.0.attn.W_V", "blocks.0.attn.W_O")
    )
    H, d, e = W_Q.shape[1:]
    V, Vp = W_E.shape[1], len(present)

    def per_head(x, W, bias):  # [K, n, d_model] @ [K, heads, d_model, d_head] + [K, heads, d_head] -> [K, heads, n, d]
        y = torch.bmm(x, W.permute(0, 2, 1, 3).reshape(K, d, H * e))  # all heads in one product per model
        return y.view(K, -1, H, e).transpose(1, 2) + bias[:, :, None]

    E_in = norm.apply(P, "blocks.0.ln1", W_E)  # what attention reads from each token (pre-LN where the model has it)
    E_keys = E_in[:, present]  # [K, present, d]
    q = per_head(E_in, W_Q, P["blocks.0.attn.b_Q"])  # [K, H, vocab, e]
    keys = per_head(E_keys, W_K, P["blocks.0.attn.b_K"])  # [K, H, present, e]
    vals = per_head(E_keys, W_V, P["blocks.0.attn.b_V"])  # [K, H, present, e]
    if pooling.startswith("linear"):  # log φ(k)·φ(q), with ABSENT for a zero kernel (finite: see ABSENT)
        kernel = torch.matmul(features(pooling, keys), features(pooling, q).transpose(-1, -2))
        QK = torch.where(kernel > 0, kernel.clamp_min(torch.finfo(kernel.dtype).tiny).log(), ABSENT)
    elif pooling == "additive":  # [K, H, present, vocab], from the [vocab, present] table of v·tanh(q + k)
        additive_v = P[f"blocks.0.attn.{ADDITIVE}"]
        QK = inspect.unwrap(pair_scores)("additive", q, keys, attn_scale, additive_v).transpose(-1, -2)
    else:
        QK = torch.matmul(keys, q.transpose(-1, -2)) / attn_scale  # [K, H, present, vocab]
    # scores = QK picked at each query's token, plus log counts: one product [QK | I] @ [one-hot ; log counts]
    eye = torch.eye(Vp, dtype=W_E.dtype, device=W_E.device).expand(K, H, Vp, Vp)
    left = torch.cat([QK, eye], -1).reshape(K, H * Vp, V + Vp)
    onehot = torch.zeros(K, V, N, device=W_E.device, dtype=W_E.dtype).scatter_(1, query_tok.reshape(K, 1, N), 1.0)
    right = torch.cat([onehot, log_counts.reshape(K, N, Vp).transpose(1, 2)], 1)
    scores = torch.bmm(left, right).view(K, H, Vp, N)
    attn = scores.softmax(-2)  # [K, H, present, N]
    if pooling.startswith("linear"):  # a query whose present keys all weigh 0 attends to nothing
        attn = attn * (scores > ABSENT / 2).any(-2, keepdim=True)
    OV = torch.matmul(vals, W_O).reshape(K, H * Vp, d)  # [K, H x present, d]
    out = torch.baddbmm(P["blocks.0.attn.b_O"][:, :, None], OV.transpose(1, 2), attn.view(K, H * Vp, N))  # [K, d, N]
    out = out.transpose(1, 2).reshape(K, b, k, d)
    if out_mask is not None:
        out = out * out_mask
    ks = torch.arange(K, device=query_tok.device)[:, None]
    resid = norm.apply(P, "ln_final", W_E[ks, query_tok.reshape(K, N)].view(K, b, k, d) + out)
    return torch.baddbmm(P["unembed.b_U"][:, None], resid.view(K, N, d), P["unembed.W_U"]).view(K, b, k, -1)


def _mean_losses(
    logits: Float[Tensor, "K batch k vocab_out"], targets: Int[Tensor, "K batch k"]
) -> Float[Tensor, " K"]:
    """Each model's own mean cross-entropy over its batch's targets."""
    losses = F.cross_entropy(logits.flatten(0, 2).float(), targets.flatten(), reduction="none")
    return losses.view(logits.shape[0], -1).mean(1)


def _mean_losses_by_column(
    logits: Float[Tensor, "K batch k vocab_out"], targets: Int[Tensor, "K batch k"]
) -> Float[Tensor, " K"]:
    """:func:`_mean_losses` of logits that are a transposed view of ``[K, vocab, N]`` (the token-count forward's
    own layout): the softmax over that layout's second axis instead of over the view's last one. The same sums,
    each model's mean over its batch in the same order; d_model = 8 steps measured 7-13% faster so (K = 50, one
    thread)."""
    K, b, k, V = logits.shape
    by_column = logits.reshape(K, b * k, V).transpose(1, 2)
    return -by_column.float().log_softmax(1).gather(1, targets.reshape(K, 1, b * k)).squeeze(1).mean(1)


def _count_losses(
    P,
    query_idx,
    counts,
    queries,
    present,
    attn_scale,
    out_mask,
    targets,
    norm=NO_NORM,
    pooling="softmax",
    identity_w_o=False,
    always=None,
):
    """One training step's losses through the token-count forward (what ``compile=True`` compiles): in weights
    form where ``always`` is given (then also the 0-dim bool tensor that says it was exact, see
    :func:`_weighted_count_logits`), else in softmax form. The plain functions are called (``inspect.unwrap``): a
    runtime type checker's wrapper, as the test run puts on every annotated function, cannot be traced by
    ``torch.compile``."""
    if always is not None:
        logits, exact = _weighted_count_logits(
            P, query_idx, counts, queries, present, attn_scale, out_mask, norm, pooling, identity_w_o, always
        )
        return inspect.unwrap(_mean_losses_by_column)(logits, targets), exact
    log_counts = counts.log().clamp(min=ABSENT)
    logits = _softmax_count_logits(P, queries[query_idx], log_counts, present, attn_scale, out_mask, norm, pooling)
    return inspect.unwrap(_mean_losses)(logits, targets)


def _mask_heads(
    P: dict[str, Tensor], names: Sequence[str], head_on: Float[Tensor, "K n_heads"], opt=None, k: int | None = None
) -> None:
    """Zero the masked heads' parameters (``names``: per-head ``[K, n_heads, ...]`` parameters, by their short
    name) of every model, or only of model ``k`` and also its Adam moments (when its mask has just changed)."""
    with torch.no_grad():
        for short in names:
            n_ = f"blocks.0.attn.{short}"
            m = head_on.view(*head_on.shape, *[1] * (P[n_].ndim - 2)).to(P[n_].dtype)
            if k is None:
                P[n_].mul_(m)
            else:
                for t in (P[n_], opt.exp_avg[n_], opt.exp_avg_sq[n_]):
                    t[k].mul_(m[k])


# the fewest heads a model has for the token-count step to narrow to one head: measured (K = 50, one thread, 10
# epochs x 4 repeats, old and new side by side) 11% faster training at 16 heads (d = 32) and 9% slower at 4 (d = 8),
# where the product the narrowed step adds (each head's output through its rows of W_O) costs more than the heads
# it leaves out
NARROW_MIN_HEADS = 8


def one_head_each(head_on: Float[Tensor, "K n_heads"] | None) -> Int[Tensor, "K 1"] | None:
    """Each model's one active head, where every model of a population is down to one (halving's end state, and
    ``mask-all-but-one``'s from the start) and models have at least :data:`NARROW_MIN_HEADS` heads, else None: what
    :func:`narrow_heads` takes. Only that state narrows, not each intermediate head count: a compiled step compiles
    graphs per shape (seconds each), and a halving run passes through its intermediate counts in a few epochs
    (Table 1's d = 32 populations are all at one head from about epoch 45 of 900)."""
    if head_on is None or head_on.shape[1] < NARROW_MIN_HEADS or bool(((head_on > 0).sum(1) != 1).any()):
        return None
    return (head_on > 0).to(torch.int8).argmax(1, keepdim=True)


def narrow_heads(P: dict[str, Tensor], heads: Int[Tensor, "K kept"]) -> dict[str, Tensor]:
    """``P`` with each per-head parameter ``[K, n_heads, ...]`` of the attention layer narrowed to each model's
    ``heads`` (a gather: gradients flow back to the full parameters). The other heads are masked (their Q/K/V
    weights and biases zero), so they add exact zeros to every output and get zero gradients: the narrowed forward
    computes the same function with fewer heads. ``W_O`` is narrowed too, so a fixed identity ``W_O`` becomes its
    kept rows (the forward then multiplies by it instead of reading the heads' outputs as the residual: exact, one
    1 per column)."""
    K, kept = heads.shape
    out = dict(P)
    for short in (*HEAD_PARAMS, ADDITIVE):
        n = f"blocks.0.attn.{short}"
        if n in P:
            x = P[n]
            out[n] = x.gather(1, heads.view(K, kept, *[1] * (x.ndim - 2)).expand(K, kept, *x.shape[2:]))
    return out


class _Adam:
    """Adam on a population's parameters with a learning rate per model: ``torch.optim.AdamW`` (amsgrad off; weight
    decay decoupled from the gradient), or with ``decoupled=False`` ``torch.optim.Adam`` (the weight decay added to
    the gradient, L2), as ``TrainConfig.optimizer`` asks.

    All parameters live in one flat buffer ``flat`` ``[K, T]`` (model ``k``'s row holds its T trainable numbers;
    ``params[name]`` are views of it, so are the moments ``exp_avg[name]`` / ``exp_avg_sq[name]`` of their flat
    buffers, and the gradients, which autograd accumulates into ``grad``), so a step is one pass of elementwise
    operations over the whole population (:func:`_adam_update`), the same operations per number as
    ``torch.optim.Adam(W)`` applies per tensor, or one compiled kernel (``compile=True``)."""

    def __init__(
        self,
        flat: Tensor,
        views: dict[str, tuple[int, int, tuple[int, ...], tuple[int, ...]]],
        lr: Tensor,
        betas: tuple[float, float],
        weight_decay: float,
        eps: float = 1e-8,
        decoupled: bool = True,
        compile: bool = False,
    ):
        self.flat, self.lr, self.betas, self.wd, self.eps = flat, lr, betas, weight_decay, eps
        self.decoupled = decoupled
        self.grad = torch.zeros_like(flat)
        self.moments = (torch.zeros_like(flat), torch.zeros_like(flat))
        self.exp_avg, self.exp_avg_sq = ({n: _view(m, *v) for n, v in views.items()} for m in self.moments)
        self.params = {n: _view(flat, *v).requires_grad_() for n, v in views.items()}
        for n, p in self.params.items():
            p.grad = _view(self.grad, *views[n])  # autograd accumulates into the flat gradient
        self.t = 0
        self.update = compiled_step(_adam_update, dynamic=False, device=flat.device) if compile else _adam_update

    def zero_grad(self) -> None:
        self.grad.zero_()

    @torch.no_grad()
    def step(self, lr_scale: float) -> None:
        self.t += 1
        b1, b2 = self.betas
        f32 = dict(dtype=self.flat.dtype, device=self.flat.device)
        bc1, bc2_sqrt = torch.tensor(1 - b1**self.t, **f32), torch.tensor(math.sqrt(1 - b2**self.t), **f32)
        lr = (self.lr * lr_scale).view(-1, 1)
        self.update(self.flat, self.grad, *self.moments, lr, bc1, bc2_sqrt, b1, b2, self.eps, self.wd, self.decoupled)


# What autograd warns (once per process) when a parameter's gradient is strided like a view of a wider buffer
# instead of contiguous. The population's parameters and gradients are columns of flat [K, T] buffers, so each
# gradient has its parameter's own strides; autograd then adds each step's gradient in place into that view, which
# is the intent (no copy, no extra pass), so the warning's "may impair performance" does not apply and it is not
# shown.
LAYOUT_WARNING = "grad and param do not obey the gradient layout contract"


def _view(flat: Tensor, start: int, stop: int, shape: tuple[int, ...], order: tuple[int, ...]) -> Tensor:
    """Columns ``start:stop`` of a flat ``[K, T]`` buffer as ``[K, *shape]`` (a view), holding the dimensions of
    ``shape`` in the memory order ``order`` (``order[i]`` is the dimension stored ``i``-th; ``range(len(shape))``
    for the usual row-major layout)."""
    stored = flat[:, start:stop].view(flat.shape[0], *(shape[o] for o in order))
    return stored.permute(0, *(order.index(j) + 1 for j in range(len(shape))))


# The memory order of each trainable parameter in the flat buffer, by forward (interp.population_paths.forward_of;
# default row-major). The token-count forward multiplies all heads of a model at once (``[query, d_model] @
# [d_model, head x d_head]``), so the gradients of W_Q, W_K and W_V come back d_model-major ([K, d_model, head,
# d_head] in memory), and its transposed unembedding (:class:`_Unembed`) gives W_U's vocab-major. Autograd adds each
# step's gradient into the parameter's view in place; stored in the gradient's order that add runs along memory,
# where in row-major order it transposed (a strided add of 0.24 ms per step for each of W_Q, W_K, W_V at d_model =
# 32, K = 50, one thread). The same numbers either way: only where each is kept differs.
_HEADS_D_MODEL_MAJOR = (1, 0, 2)  # [head, d_model, d_head] stored as [d_model, head, d_head]
GRADIENT_ORDER: dict[str, dict[str, tuple[int, ...]]] = {
    "token counts": {
        "blocks.0.attn.W_Q": _HEADS_D_MODEL_MAJOR,
        "blocks.0.attn.W_K": _HEADS_D_MODEL_MAJOR,
        "blocks.0.attn.W_V": _HEADS_D_MODEL_MAJOR,
        "unembed.W_U": (1, 0),  # [d_model, vocab] stored as [vocab, d_model]
    }
}


def _adam_update(p, grad, exp_avg, exp_avg_sq, lr, bc1, bc2_sqrt, b1, b2, eps, wd, decoupled) -> None:
    """One Adam(W) step over flat buffers, in place, with ``lr`` ``[K, 1]`` (one rate per model) and the bias
    corrections ``bc1`` and ``sqrt(bc2)`` as 0-dim tensors (so a compiled update compiles once): the operations
    ``torch.optim.Adam(W)`` (single-tensor, amsgrad off) applies to each number, in its order."""
    if decoupled:
        p.mul_(1 - lr * wd)
    else:
        grad = grad.add(p, alpha=wd)
    exp_avg.lerp_(grad, 1 - b1)
    exp_avg_sq.mul_(b2).addcmul_(grad, grad, value=1 - b2)
    denom = (exp_avg_sq.sqrt() / bc2_sqrt).add_(eps)
    p.sub_(lr / bc1 * exp_avg / denom)


def _eval_counts(data, d_vocab: int, cfg: TrainConfig) -> TokenCounts:
    """:class:`TokenCounts` of evaluation data: under left padding with the pads of batches of ``batch_size``
    consecutive sentences, as the solo run evaluates (:func:`interp.position_forward.evaluate_left_padded`)."""
    if cfg.padding != "left":
        return token_counts(data, d_vocab)
    return token_counts(data, d_vocab, data.vocab.pad, eval_pads(data.lengths, cfg.batch_size))


def _val_metrics(
    task: Task,
    P,
    data,
    attn_scale: float,
    counted: TokenCounts | None = None,
    budget: int = 1 << 24,
    norm: Norm = NO_NORM,
    cfg: TrainConfig | None = None,
    pooling: str = "softmax",
    count_predictions=None,
    grouped_predictions=None,
) -> list[dict[str, float]]:
    """The task's metrics of each model on ``data``, as :func:`interp.evaluation.evaluate` computes them (from token
    counts when ``counted`` = :func:`token_counts` of ``data`` is given), in chunks of rows whose largest
    intermediate holds about ``budget`` numbers. Models with positions, with a LayerNorm or left-padded (``cfg``)
    are evaluated as the solo run evaluates them. Where the weights form is exact, models have no LayerNorm and the
    data at most :data:`GROUPED_QUERIES` query tokens, the rows go through :func:`_grouped_predictions` (all models
    at once), else through :func:`_count_predictions` (each model's rows apart). ``count_predictions``,
    ``grouped_predictions``: those functions or their compiled forms (the plain functions where None)."""
    count_predictions = count_predictions or _count_predictions
    grouped_predictions = grouped_predictions or _grouped_predictions
    if counted is None and cfg is not None and cfg.padding == "left":
        raise ConfigError("batched training with padding='left' covers models without positional embedding")
    K = next(iter(P.values())).shape[0]
    H, d = P["blocks.0.attn.W_Q"].shape[1:3]
    qpos = target_positions(data, few=False)  # exact however many: a split of short sentences is evaluated too
    if qpos is None:
        raise ConfigError("batched training needs tasks whose rows all have the same number of targets")
    n, k = qpos.shape
    tgt = data.targets.gather(1, qpos)
    width = H * len(counted.present) * k if counted is not None else data.tokens.shape[1] * max(d, H * k)
    rows_per_chunk = max(1, budget // max(1, K * width))
    by_weights = counted is not None and weights_are_exact(
        P, counted.queries, counted.present, counted.always, attn_scale, norm, pooling
    )
    grouped = by_weights and norm.kind is None and len(counted.queries) <= GROUPED_QUERIES
    preds = torch.empty((K, n, k), dtype=torch.long, device=data.device)
    losses = torch.empty((K, n, k), device=data.device)
    with torch.no_grad():
        for start in range(0, n, rows_per_chunk):
            idx = torch.arange(start, min(start + rows_per_chunk, n), device=data.device)
            if grouped:  # the chunk's rows, shared by every model, sorted by query token
                order, bounds = grouped_rows(counted.query_idx[idx].flatten(), len(counted.queries))
                cnt = counted.counts[idx].flatten(0, 1)[order]
                args = (P, cnt, counted.queries, counted.present, tgt[idx].flatten()[order], attn_scale, pooling)
                p_sorted, l_sorted = grouped_predictions(*args, bounds)
                p_, l_ = torch.empty_like(p_sorted), torch.empty_like(l_sorted)
                p_[:, order], l_[:, order] = p_sorted, l_sorted
                preds[:, idx], losses[:, idx] = p_.view(K, -1, k), l_.view(K, -1, k)
                continue
            if counted is not None:
                qidx, cnt = (x.expand(K, *x.shape[1:]) for x in counted.select(idx[None]))
                args = (P, qidx, cnt, counted.queries, counted.present, tgt[idx], attn_scale, norm, pooling)
                preds[:, idx], losses[:, idx] = count_predictions(*args, by_weights=by_weights)
                continue
            chunk = data.select(idx)
            tok, qp = chunk.tokens.expand(K, -1, -1), qpos[idx].expand(K, -1, -1)
            logits = (
                stacked_logits_at(P, tok, qp, attn_scale, pooling=pooling)
                if norm.kind is None
                else stacked_position_logits(P, tok, qp, attn_scale, norm, pooling=pooling)
            )
            preds[:, idx], losses[:, idx] = _predictions(logits, tgt[idx])
    # the task scores per-position predictions: one buffer, refilled at the target positions for each model
    pred_buf = torch.full(data.tokens.shape, -1, dtype=torch.long, device=data.device)
    loss_buf = torch.zeros(data.tokens.shape, device=data.device)
    rows = torch.arange(n, device=data.device)[:, None]
    metrics = []
    for m in range(K):
        pred_buf[rows, qpos], loss_buf[rows, qpos] = preds[m], losses[m]
        metrics.append(task.metrics(pred_buf, loss_buf, data))
    return metrics


def _predictions(logits, targets):
    """Each query's predicted token and its cross-entropy loss against ``targets`` ``[batch, k]``, from ``logits``
    ``[K, batch, k, vocab]``. (Plain annotations: compiled steps trace this.)"""
    K, b, k = logits.shape[:3]
    loss = F.cross_entropy(logits.flatten(0, 2).float(), targets.expand(K, -1, -1).flatten(), reduction="none")
    return logits.argmax(-1), loss.view(K, b, k)


def _count_predictions(P, query_idx, counts, queries, present, targets, attn_scale, norm, pooling, by_weights):
    """:func:`_predictions` of the token-count forward without dropout: the weights form where ``by_weights``
    (:func:`weights_are_exact`), else the softmax form. One function, so validation can run it compiled: eager, its
    elementwise passes over ``[K, rows, d_model]`` were most of an epoch's validation. (Plain annotations: compiled
    steps trace this.)"""
    if by_weights:
        logits = _weighted_count_logits(P, query_idx, counts, queries, present, attn_scale, None, norm, pooling)
    else:
        log_counts = counts.log().clamp(min=ABSENT)
        logits = _softmax_count_logits(P, queries[query_idx], log_counts, present, attn_scale, None, norm, pooling)
    return _predictions(logits, targets)


# validation's grouped form (:func:`_grouped_predictions`) loops over the query tokens in its compiled graph, one
# product each: used up to this many distinct query tokens (Table 1's noisy majority has 3), the per-model form beyond
GROUPED_QUERIES = 8


def grouped_rows(query_idx: Int[Tensor, " N"], n_queries: int) -> tuple[Tensor, tuple[int, ...]]:
    """The order that sorts rows by their query token (stable) and where each query token's rows start in it, then
    the number of rows: what :func:`_grouped_predictions` takes."""
    order = torch.sort(query_idx, stable=True).indices
    bounds = torch.bincount(query_idx, minlength=n_queries).cumsum(0).tolist()
    return order, (0, *bounds)


def _grouped_predictions(P, counts, queries, present, targets, attn_scale, pooling, bounds):
    """:func:`_count_predictions` in weights form (where :func:`weights_are_exact`) for rows that every model
    scores, as validation's are, in models without a LayerNorm: ``counts`` ``[N, present]`` and ``targets``
    ``[N]`` sorted by query token, query token ``q``'s rows ``bounds[q]:bounds[q + 1]`` (:func:`grouped_rows`).
    Predictions and losses ``[K, N]``, in that order.

    The same quantities as the per-model form, computed another way round. Every model's weighted values and
    denominators for one query token are one product ``[K x (head x d_head + head), present] @ [present, rows]``
    (the counts are the same for every model: one matrix product, not K small ones, and no one-hot factor that
    multiplies by zeros for the other query tokens), every activation is laid out ``[K, features, rows]`` (MKL
    writes long rows fast), and without a LayerNorm the logits are linear in the attention output, so ``W_U^T
    W_O^T`` (``[K, vocab, head x d_head]``) and ``W_U^T (W_E[q] + b_O) + b_U`` (per query token) are formed once per
    call instead of going through d_model per row. That reassociates the products: losses differ from the
    per-model form by float32 rounding (measured at d = 32: each row's loss within 2.6e-6
    relative, each model's mean loss within 3.4e-7). (Plain annotations: compiled steps
    trace this.)"""
    Vp = counts.shape[1]
    QK, vals = _plain_count_tables(P, queries, present, attn_scale, NO_NORM, pooling)  # [K, H, Q, Vp], [K, H, Vp, e]
    K, H, Q, _ = QK.shape
    e, d = vals.shape[-1], P["embed.W_E"].shape[-1]
    Ew = (QK - QK.amax(-1, keepdim=True)).exp()  # [K, H, Q, Vp], as _weighted_count_logits
    numer = Ew[:, :, None] * vals.transpose(-1, -2)[:, :, :, None]  # [K, H, e, Q, Vp]
    left = torch.cat([numer.reshape(K, H * e, Q, Vp), Ew], 1)  # [K, H x e + H, Q, Vp]
    W_U = P["unembed.W_U"].transpose(1, 2)  # [K, vocab, d]
    UO = torch.bmm(W_U, P["blocks.0.attn.W_O"].reshape(K, H * e, d).transpose(1, 2))  # [K, vocab, H x e]
    own = (P["embed.W_E"][:, queries] + P["blocks.0.attn.b_O"][:, None]).transpose(1, 2)  # [K, d, Q]
    bias = torch.baddbmm(P["unembed.b_U"][:, :, None], W_U, own)  # [K, vocab, Q]: each query token's logits
    preds, losses = [], []
    for q in range(Q):
        lo, hi = bounds[q], bounds[q + 1]
        if hi == lo:
            continue
        both = (left[:, :, q].reshape(K * (H * e + H), Vp) @ counts[lo:hi].T).view(K, H * e + H, hi - lo)
        z = (both[:, : H * e].view(K, H, e, -1) / both[:, H * e :, None]).view(K, H * e, -1)
        logits = torch.bmm(UO, z) + bias[:, :, q, None]  # [K, vocab, rows]
        losses.append(-logits.float().log_softmax(1).gather(1, targets[lo:hi].expand(K, 1, -1)).squeeze(1))
        preds.append(logits.argmax(1))
    return torch.cat(preds, 1), torch.cat(losses, 1)


def train_population(
    task: Task,
    specs: Sequence[ModelSpec],
    cfgs: Sequence[TrainConfig],
    outs: Sequence,
    *,
    device: str | None = None,
    progress: bool = True,
    compile: bool = False,
    head_scorer: Scorer | None = None,
    resume_file=None,
    snapshot_every: int | None = None,
) -> list[dict[str, Any]]:
    """Train ``len(specs)`` models as one batched computation; write model k to ``outs[k]`` as an ordinary
    checkpoint; return each model's provenance (the keys :func:`interp.training.train` returns, plus
    ``population``). Only ``init_seed`` (specs) and ``seed`` / ``lr`` (configs) may differ between models.
    Runs in :func:`interp.determinism.deterministic`, as :func:`interp.training.train` does (same seed, torch and
    thread count: same weights).

    ``cfg.halving`` (the same strategy for all) halves heads per model, as :func:`interp.training.train` does:
    each model has its own :class:`interp.halving.Halving` schedule and head mask (a ``[K, n_heads]`` tensor that
    zeroes the masked heads' parameters and Adam moments after every step); when a model's validation reaches the
    threshold, its current weights are scored in a HookedTransformer by ``head_scorer`` (strategies other than
    ``random`` and ``mask-all-but-one``; the CLI passes ``analyses.halving.scorer``) and half of its heads masked.

    ``resume_file``: where the whole population's state (weights, Adam moments, best and last states, random
    generators, histories, halving schedules) is saved every ``cfg.save_every`` epochs, atomically; if it exists
    when training starts, training continues from it (to the same models as an uninterrupted run: tested after
    ``kill -9``). It must belong to the same population (task, specs, configs), and is removed once every
    checkpoint is written.

    ``compile=True`` compiles the training step (whichever forward the population uses), the Adam update and the
    token-count validation with ``torch.compile``; the models equal the eager ones to float rounding. The
    token-count step (``dropout_at="attention"``) runs ~1.5x faster per step on one CPU core; the per-position step
    gains little (its time is in batched products). Compiling costs ~10-20 s per graph on an idle core with an
    empty inductor cache (minutes for a whole population on a loaded machine), so it pays only over long runs
    (Table 1's 900 epochs). The per-position step compiles one graph for every width (:mod:`interp.compiled`),
    plus one where a run of the length-sorted batch is one sentence or one position wide (torch specialises sizes 0
    and 1); the prefix-count step one per batch size.

    ``snapshot_every=N`` writes each model's current weights every N epochs as its solo run does
    (``<out>.snapshots/epoch-00000N.safetensors``, ordinary checkpoints with the epoch, seed, config and that
    epoch's history record), before any halving step of that epoch and before the resume file; a resumed
    population rewrites the snapshots of the epochs it replays with the same weights."""
    with deterministic():
        return _train_population(
            task,
            specs,
            cfgs,
            outs,
            device=device,
            progress=progress,
            compile=compile,
            head_scorer=head_scorer,
            resume_file=resume_file,
            snapshot_every=snapshot_every,
        )


class _Population:
    """K models of one shape in training: stacked parameters ``P[name]`` (``[K, ...]``), one optimiser, each model's
    generators (data order, dropout), best and last states, :class:`interp.run_record.RunRecord` and head mask.
    Everything a resume file holds (:meth:`state` / :meth:`load_state`)."""

    def __init__(self, task: Task, specs, cfgs, device: str, head_scorer: Scorer | None, compile: bool = False):
        self.task, self.specs, self.cfgs, self.device, self.head_scorer = task, specs, cfgs, device, head_scorer
        self.cfg, self.K = cfgs[0], len(specs)
        self.models, drop_gens = [], []
        for spec, cfg in zip(specs, cfgs):
            torch.manual_seed(cfg.seed)  # as train() does; build_model then seeds by spec.init_seed
            self.models.append(build_model(spec, device=device))
            g = torch.Generator()
            g.set_state(torch.get_rng_state())  # the state the solo run's dropout draws from
            drop_gens.append(g)
        self.dropout = DropoutGenerators(drop_gens)  # each model's masks drawn at once, as its generator draws them
        self.mask_buffers: dict[str, Tensor] = {}  # a step's torch masks and an epoch's rows (scratch)
        if not supports_query_forward(self.models[0]):
            raise ConfigError("batched training needs a model the exact query-restricted forward covers")
        for spec, cfg, model in zip(specs, cfgs, self.models):  # the recipe's initialisation (the global RNG untouched)
            initialise(model, spec, cfg.init, cfg.init_scale)
        self.norm = Norm.of(self.models[0])
        self.identity_w_o = specs[0].w_o == "identity"
        self.records = [RunRecord(c.keep, c.patience) for c in cfgs]
        if self.cfg.halving is not None:
            if self.cfg.halving not in SELF_SCORED and head_scorer is None:
                raise ConfigError(
                    f"halving strategy {self.cfg.halving!r} needs a head scorer: pass head_scorer="
                    "interp.analyses.halving.scorer(strategy) (interp sweep does)"
                )
            for r, s, c, m in zip(self.records, specs, cfgs, self.models):
                r.halving = Halving(c.halving, c.halving_threshold, s.n_layers, s.n_heads, c.seed)
                r.halving.start(m)  # mask-all-but-one masks all heads but one before the first step
        self.forward = forward_of(specs[0], self.cfg)
        trainable = {n for n, p in self.models[0].named_parameters() if p.requires_grad}
        # the parameters stacked, in state-dict names: TransformerLens' (LayerNorm's where the model has it), then the
        # attention variant's own (additive v, low-rank factors)
        self.names = PARAMS + self.norm.param_names() + tuple(extra_parameters(self.models[0]))
        self.pooling = parse_attention(specs[0].attention).pooling
        self.qkv_masks = qkv_masks(self.models[0])  # diagonal / sparse Q/K/V: the free entries
        sd = [m.state_dict() for m in self.models]
        stacked = {n: torch.stack([s[n] for s in sd]).detach() for n in self.names}
        # the trainable parameters in one flat [K, T] buffer (the optimiser's), each a view of its columns, laid out
        # in the memory order of the gradient its forward computes (GRADIENT_ORDER)
        orders = GRADIENT_ORDER.get(self.forward, {})
        views, start = {}, 0
        for n in self.names:
            if n in trainable:
                size = stacked[n][0].numel()
                order = orders.get(n, tuple(range(stacked[n].ndim - 1)))
                views[n], start = (start, start + size, tuple(stacked[n].shape[1:]), order), start + size
        flat = (
            torch.cat([stacked[n].permute(0, *(o + 1 for o in views[n][3])).reshape(self.K, -1) for n in views], 1)
            if views
            else torch.zeros(self.K, 0)
        )
        self.views = views  # name -> (first column, last column + 1, shape, memory order) in the flat buffer
        self.opt = _Adam(
            flat.to(device),
            views,
            torch.tensor([c.lr for c in cfgs], device=device),
            (self.cfg.beta1, self.cfg.beta2),
            self.cfg.weight_decay,
            decoupled=self.cfg.optimizer == "adamw",
            compile=compile,
        )
        self.P = {n: self.opt.params[n] if n in views else stacked[n].clone() for n in self.names}
        self.inert = [n for n in inert_parameters(self.models[0]) if n in views]  # gradients set to exactly zero
        self.data_gens = [torch.Generator().manual_seed(c.seed) for c in cfgs]
        self.best_state = {n: self.P[n].detach().clone() for n in self.names}
        self.last_state = {n: self.P[n].detach().clone() for n in self.names}
        self.masked = [short for short in HEAD_PARAMS if f"blocks.0.attn.{short}" in trainable]
        self.head_on = (
            torch.stack([r.halving.mask[0] for r in self.records]).to(device) if self.cfg.halving is not None else None
        )  # [K, n_heads], 1 for active heads
        self.one_head = one_head_each(self.head_on)  # [K, 1] where every model is down to one head, else None
        self.attn_scale = float(self.models[0].blocks[0].attn.attn_scale)
        self.epoch = self.step = 0
        self.clock: dict[str, float] = {}  # wall seconds by part of the run (the provenance's population.seconds)
        self.softmax_steps = 0  # token-count steps the weights form refused (weights_are_exact), in this process
        # the token-count step's rows in C where the kernel takes this population (interp.count_native)
        self.native_tables, self.native_refused = None, set()
        if self._native_rows():
            self.native_tables = (
                compiled_step(_native_tables, dynamic=False, device=device) if compile else _native_tables
            )

    def _native_shape(self, shape: tuple) -> bool:
        """Whether the kernel of this step's shape built and passed its check here (:func:`count_native.shape_status`,
        once per shape); where not, this shape trains by the torch step, with a warning saying why, once."""
        why = count_native.shape_status(*shape)
        if why != "c" and shape not in self.native_refused:
            self.native_refused.add(shape)
            warnings.warn(f"training this shape by the torch step: {why}", RuntimeWarning, stacklevel=3)
        return why == "c"

    def _native_rows(self) -> bool:
        """Whether training steps go through :mod:`interp.count_native`: :data:`NATIVE_ROWS`, the token-count
        forward on the CPU in float32, weights-form pooling, no LayerNorm (the embedding folded into the logits),
        a shape the kernel takes, and the kernel built and checked here."""
        W_U = self.P["unembed.W_U"]
        return (
            NATIVE_ROWS
            and self.forward == "token counts"
            and torch.device(self.device).type == "cpu"
            and W_U.dtype == torch.float32
            and self.pooling in ("softmax", "additive")
            and self.norm.kind is None
            and count_native.shape_supported(W_U.shape[1], W_U.shape[2])
            and count_native.status() == "c"
        )

    @property
    def detached(self) -> dict[str, Tensor]:
        """The parameters validation runs with (on the token-count path narrowed to each model's one head where
        every model is down to one: :func:`narrow_heads`)."""
        P = self.forward_params({n: v.detach() for n, v in self.P.items()})
        narrow = self.one_head is not None and self.forward == "token counts"
        return narrow_heads(P, self.one_head) if narrow else P

    def forward_params(self, P: dict[str, Tensor]) -> dict[str, Tensor]:
        """``P`` with the Q/K/V matrices the models project with (masked, or the low-rank factors' product)."""
        return stacked_qkv(P, self.specs[0].n_heads, self.qkv_masks)

    # -- one training step ----------------------------------------------------------------------------------------
    def epoch_rows(
        self, counted: TokenCounts, perms: Int[Tensor, "K n"], batch_size: int
    ) -> list[tuple[Tensor, Tensor, Tensor]]:
        """Each step's rows of the training data in this epoch's orders (``perms``, each model's batches of
        ``batch_size`` in turn): per step the query tokens' places, the counts and the targets, ``[K, b, ...]``,
        gathered once per epoch, so that a step's rows are ready (:meth:`count_batch`) instead of three gathers of
        scattered rows per step (each step's gathers ran at a third of their speed alone, their tables evicted from
        the cache by the step between). Gathered step by step, each step's block contiguous: the C step reads it as
        it is, where slices of model-major rows were copied at each step. Into buffers kept from epoch to epoch
        (:func:`interp.position_forward.scratch`): new ones (42 MB at K = 100 on the shipped task) were mapped
        afresh each epoch, and faulting their pages in took three quarters of the gathers' time."""
        K, n = perms.shape
        starts = range(0, n, batch_size)
        rows = torch.cat([perms[:, i : i + batch_size].flatten() for i in starts])  # step-major
        out = []
        for name, x in (("query", counted.query_idx), ("counts", counted.counts), ("targets", self.train_targets)):
            buf = scratch(self.mask_buffers, f"epoch {name}", (len(rows), *x.shape[1:]), x.device, x.dtype)
            out.append(torch.index_select(x, 0, rows, out=buf))
        steps = []
        for i in starts:
            b = min(batch_size, n - i)
            steps.append(tuple(x[K * i : K * (i + b)].view(K, b, *x.shape[1:]) for x in out))
        return steps

    def count_batch(
        self,
        counted: TokenCounts,
        train_data,
        idx: Int[Tensor, "K b"],
        count_losses,
        rows: tuple[Tensor, Tensor, Tensor],
    ) -> Float[Tensor, " K"]:
        """Each model's mean loss on its batch ``idx`` through the token-count forward (dropout on the attention
        output only, drawn per model as its solo run draws it, ``[b, k, d_model]``, or by the counter; under left
        padding each sentence's pads, up to its model's longest, counted as one more token). ``rows``: the batch's
        query places, counts and targets (a step of :meth:`epoch_rows`)."""
        qidx, cnt, targets = rows
        cfg, p, d = self.cfg, self.cfg.dropout, self.P["embed.W_E"].shape[-1]
        if cfg.padding == "left":
            lengths = train_data.lengths[idx]
            col = int((counted.present == train_data.vocab.pad).nonzero())
            cnt = cnt.clone()
            cnt[..., col] = (lengths.amax(1, keepdim=True) - lengths)[..., None].to(cnt.dtype)  # [K, b, 1]
        out_mask = None
        if p and cfg.dropout_rng == "counter":
            keys = row_keys(run_keys([c.seed for c in self.cfgs], self.epoch, "attention").to(idx.device), idx)
            out_mask = position_mask(keys, self.train_qpos[idx], d, p)
        elif p:
            # each model's own draws, what F.dropout multiplies by on the CPU
            shape = (idx.shape[1], qidx.shape[-1], d)  # into a buffer kept from step to step (scratch)
            buf = scratch(self.mask_buffers, "attention output", (len(self.cfgs), *shape), "cpu")
            out_mask = self.dropout.masks(shape, p, out=buf).to(self.device)
        P, identity_w_o = self.forward_params(self.P), self.identity_w_o
        if self.one_head is not None:  # every model down to one head: the others' exact zeros left out
            P, identity_w_o = narrow_heads(P, self.one_head), False
        args = (P, qidx, cnt, counted.queries, counted.present, self.attn_scale, out_mask, targets, self.norm)
        kw = dict(pooling=self.pooling, identity_w_o=identity_w_o)
        if self.pooling in ("softmax", "additive"):  # the weights form, where exact
            K, H, _, e = P["blocks.0.attn.W_Q"].shape
            shape = (len(counted.queries), len(counted.present), H, e, d, P["unembed.W_U"].shape[-1], identity_w_o)
            if self.native_tables is not None and self._native_shape(shape):  # the rows in C, the tables too
                if self.pooling == "softmax":
                    table, TE, exact = count_tables_native(
                        *(P[n] for n in TABLE_PARAMETERS),
                        counted.queries,
                        counted.present,
                        counted.always,
                        self.attn_scale,
                        WEIGHT_GAP,
                    )
                else:  # additive scores: the tables in torch
                    table, TE, exact = self.native_tables(
                        P, counted.queries, counted.present, self.attn_scale, self.norm, self.pooling, counted.always
                    )
                if bool(exact):
                    return count_losses_native(
                        table,
                        None if identity_w_o else P["blocks.0.attn.W_O"].reshape(K, -1, d),
                        P["blocks.0.attn.b_O"],
                        TE,
                        P["unembed.W_U"],
                        P["unembed.b_U"],
                        qidx.reshape(K, -1),
                        cnt.reshape(K, -1, cnt.shape[-1]),
                        None if out_mask is None else out_mask.reshape(K, -1, d),
                        targets.reshape(K, -1),
                        H,
                    )
            else:
                losses, exact = count_losses(*args, **kw, always=counted.always)
                if bool(exact):
                    return losses
            self.softmax_steps += 1
        return count_losses(*args, **kw)  # the softmax form: linear attention, or weights that could underflow

    def position_batch(self, data, idx: Int[Tensor, "K b"], losses_fn=None) -> Float[Tensor, " K"]:
        """Each model's mean loss on its batch ``idx`` through the per-position forward (vectorised over the
        models: one layout, all heads in one product per model), with the solo run's dropout masks: from each
        model's generator in its solo run's shapes and order (embedding ``[b, t_k, d_model]``, pattern, attention
        output), or from the counter for all models at once."""
        cfg = self.cfg
        pad = data.vocab.pad if data.vocab is not None else None
        lay = build_layout(data.tokens[idx], data.targets[idx], data.lengths[idx], cfg.objective, cfg.padding, pad)
        W_Q = self.P["blocks.0.attn.W_Q"]
        kw = {"losses_fn": losses_fn} if losses_fn is not None else {}
        return position_losses(
            self.forward_params(self.P),
            lay,
            cfg,
            W_Q.shape[2],
            W_Q.shape[1],
            self.attn_scale,
            self.norm,
            self.identity_w_o,
            generators=self.dropout.generators(),
            seeds=[c.seed for c in self.cfgs],
            epoch=self.epoch,
            sentences=idx,
            lengths=data.lengths[idx],
            pooling=self.pooling,
            buffers=self.mask_buffers,
            **kw,
        )

    def update(self, losses: Float[Tensor, " K"]) -> None:
        """One backward and one optimiser step for all models (each model's own loss drives only its parameters)."""
        self.opt.zero_grad()
        with warnings.catch_warnings():  # the flat buffer's strided views: see LAYOUT_WARNING
            warnings.filterwarnings("ignore", message=LAYOUT_WARNING)
            losses.sum().backward()
        for name in self.inert:  # exactly zero, not rounding noise, as in the solo run (inert_parameters)
            self.opt.params[name].grad.zero_()
        self.opt.step(warmup_factor(self.cfg, self.step))
        if self.head_on is not None:
            _mask_heads(self.P, self.masked, self.head_on)  # masked heads stay exactly zero
        self.step += 1

    # -- after each epoch ------------------------------------------------------------------------------------------
    def end_epoch(
        self, train_loss: Sequence[float], val: Sequence[dict[str, float]], train_data, val_data, snapshot=None
    ) -> None:
        """Per model, as the solo run does after its validation: history, best state (with halving only one-head
        states compete), ``snapshot(k)`` (where given: before halving, as the solo run writes it), a halving step
        when validation reaches the threshold, and the stop (patience or the last epoch) that freezes its last
        state."""
        self.epoch += 1
        epoch = self.epoch
        for k, r in enumerate(self.records):
            if not r.active:
                continue
            if r.end_epoch(epoch, self.step, train_loss[k], val[k]):
                self._copy_model(k, self.best_state)
            if snapshot is not None:
                tick = time.perf_counter()
                snapshot(k)
                _lap(self.clock, "snapshots", tick)
            h = r.halving
            if h is not None and not h.done and h.reached(val[k]["accuracy"], len(val_data)):
                tick = time.perf_counter()
                self._halve(k, val[k]["accuracy"], train_data, val_data)
                _lap(self.clock, "halving", tick)
            if r.should_stop(epoch) or epoch == self.cfg.epochs:
                r.active = False
                self._copy_model(k, self.last_state)

    def _copy_model(self, k: int, into: dict[str, Tensor]) -> None:
        for n in self.names:
            into[n][k] = self.P[n].detach()[k]

    def write_snapshot(self, k: int, path: Path) -> None:
        """Model ``k``'s current weights as an ordinary checkpoint, with the metadata a solo run's snapshot has."""
        model = self.models[k]
        model.load_state_dict({**model.state_dict(), **{n: self.P[n].detach()[k] for n in self.names}})
        training = snapshot_training(self.cfgs[k], self.epoch, self.records[k].history[-1])
        save_checkpoint(model, self.task, path, training=training, spec=self.specs[k])

    def _halve(self, k: int, acc: float, train_data, val_data) -> None:
        """Score model ``k``'s current weights in a HookedTransformer, as its solo run does, and mask half of its
        heads (parameters and Adam moments)."""
        r, model = self.records[k], self.models[k]
        model.load_state_dict({**model.state_dict(), **{n: self.P[n].detach()[k] for n in self.names}})
        halved = r.halving.after_validation(
            model, None, self.epoch, acc, self.task, train_data, val_data, self.head_scorer
        )
        r.note_halving(halved)
        if halved is not None:
            self.head_on[k] = r.halving.mask[0].to(self.device)
            _mask_heads(self.P, self.masked, self.head_on, self.opt, k)
            self.one_head = one_head_each(self.head_on)

    def kept(self) -> tuple[list[str], dict[str, Tensor]]:
        """Each model's kept state (``best``, or ``last`` as its config says; a halving run that never got to one
        head has no best state and keeps its last, as train() does), stacked."""
        for k, r in enumerate(self.records):
            if r.active:
                self._copy_model(k, self.last_state)
        kept = [r.kept for r in self.records]
        keep_best = torch.tensor([kp != "last" for kp in kept], device=self.device)
        return kept, {
            n: torch.where(
                keep_best.view(-1, *[1] * (self.best_state[n].ndim - 1)), self.best_state[n], self.last_state[n]
            )
            for n in self.names
        }

    # -- resume files -----------------------------------------------------------------------------------------------
    def identity(self) -> dict[str, Any]:
        return {
            "task": {"name": self.task.name, "params": self.task.params()},
            "specs": [sp.to_dict() for sp in self.specs],
            "configs": [asdict(c) for c in self.cfgs],
        }

    def state(self) -> tuple[dict[str, Tensor], dict[str, Any]]:
        """The tensors and the progress (epoch, step, Adam's count, each model's record: JSON) of a resume file."""
        tensors = {
            **{
                f"{part}.{n}": st[n]
                for part, st in (("model", self.P), ("best", self.best_state), ("last", self.last_state))
                for n in self.names
            },
            **{f"adam.exp_avg.{n}": v for n, v in self.opt.exp_avg.items()},
            **{f"adam.exp_avg_sq.{n}": v for n, v in self.opt.exp_avg_sq.items()},
            "rng.data": torch.stack([g.get_state() for g in self.data_gens]),
            "rng.dropout": self.dropout.states(),
        }
        if self.head_on is not None:
            tensors["head_on"] = self.head_on
        return tensors, {
            "epoch": self.epoch,
            "step": self.step,
            "adam_t": self.opt.t,
            "records": [Encoded(r.to_json()) for r in self.records],  # each history entry encoded once
        }

    def load_state(self, t: dict[str, Tensor], progress: dict[str, Any]) -> None:
        with torch.no_grad():
            for n in self.names:
                self.P[n].copy_(t[f"model.{n}"])
                self.best_state[n].copy_(t[f"best.{n}"])
                self.last_state[n].copy_(t[f"last.{n}"])
            for n in self.opt.params:
                self.opt.exp_avg[n].copy_(t[f"adam.exp_avg.{n}"])
                self.opt.exp_avg_sq[n].copy_(t[f"adam.exp_avg_sq.{n}"])
        for g, st in zip(self.data_gens, t["rng.data"]):
            g.set_state(st.clone())
        self.dropout.load(t["rng.dropout"])
        self.opt.t, self.step, self.epoch = progress["adam_t"], progress["step"], progress["epoch"]
        self.records = [_record_from_dict(r, c) for r, c in zip(progress["records"], self.cfgs)]
        if self.head_on is not None:
            self.head_on = t["head_on"].to(self.device)
            self.one_head = one_head_each(self.head_on)


def _train_population(
    task: Task, specs, cfgs, outs, *, device, progress, compile, head_scorer, resume_file, snapshot_every=None
) -> list[dict[str, Any]]:
    check_population(specs, cfgs)
    check_snapshot_every(snapshot_every, cfgs[0].epochs)  # the models share their epochs (check_population)
    device = pick_device(device)
    outs = [Path(o) for o in outs]
    if len(outs) != len(specs) or len(set(outs)) != len(outs):
        raise ConfigError("a population needs one distinct output path per model")
    for o in outs:
        with AtomicFile(o, "the checkpoint"):  # every output path checked before any training
            pass
    snapshot = _snapshot_writer(outs, snapshot_every)
    pop = _Population(task, specs, cfgs, device, head_scorer, compile)
    cfg, K = pop.cfg, pop.K
    splits = task_splits(task)  # built once: checked, trained on, validated on, evaluated at the end
    check_fits(pop.models[0], task, splits)
    train_data, val_data = splits["train"].to(device), splits[validation_split(task)].to(device)
    if cfg.objective == "lm":
        check_lm_targets(task, train_data)
    if cfg.objective != "lm" and target_positions(train_data) is None:
        # a solo run of such data trains through TransformerLens' forward, whose dropout masks cover every position
        raise ConfigError(
            "batched training needs tasks whose targets sit at the same few positions per row (at most a quarter of "
            "the training split's padded width; its solo runs train otherwise): train these runs one by one"
        )
    d_vocab = pop.models[0].cfg.d_vocab
    # the O(vocab) forwards where nothing position-dependent comes before attention (interp.population_paths);
    # evaluation has no dropout, so counts suffice there for every model without positions
    forward = pop.forward
    eval_counts = specs[0].positional == "none"
    pad_token = task.vocab.pad if cfg.padding == "left" else None
    if cfg.padding == "left" and pad_token is None:
        raise ConfigError(f"padding='left' needs a task with a pad token; {task.name} has none")
    if forward == "token counts":
        train_counted = token_counts(train_data, d_vocab, pad_token)
        pop.train_qpos = target_positions(train_data, few=False)
        pop.train_targets = train_data.targets.gather(1, pop.train_qpos)
        count_losses = compiled_step(_count_losses, dynamic=False, device=device) if compile else _count_losses
    elif forward == "prefix counts":
        train_rows = prefix_rows(train_data.tokens, lm_targets(train_data), d_vocab)
        prefix_losses = (
            compiled_step(prefix_count_losses, dynamic=True, device=device) if compile else prefix_count_losses
        )
    else:
        position_fn = compiled_step(_position_losses, dynamic=True, device=device, cut_views=True) if compile else None
    val_counted = _eval_counts(val_data, d_vocab, cfg) if eval_counts else None
    # the same chunks every epoch: compiled once (dynamic=False: a chunk's rows and the last chunk's)
    val_predictions = compiled_step(_count_predictions, dynamic=False, device=device) if compile else None
    val_grouped = compiled_step(_grouped_predictions, dynamic=False, device=device) if compile else None
    started = time.time()
    if resume_file is not None and Path(resume_file).is_file():
        pop.load_state(*_load_resume(Path(resume_file), pop.identity()))
    resumed_at = pop.epoch
    n = len(train_data)
    clock = pop.clock
    bar = tqdm(total=cfg.epochs, initial=pop.epoch, desc=f"train {K} x {task.name}", unit="epoch", disable=not progress)
    while pop.epoch < cfg.epochs and any(r.active for r in pop.records):
        tick = time.perf_counter()
        perms = torch.stack([torch.randperm(n, generator=g) for g in pop.data_gens]).to(device)  # [K, n]
        totals = torch.zeros(K, dtype=torch.float64)
        epoch_rows = pop.epoch_rows(train_counted, perms, cfg.batch_size) if forward == "token counts" else ()
        for start in range(0, n, cfg.batch_size):
            idx = perms[:, start : start + cfg.batch_size]  # [K, b]: each model's own batch
            if forward == "token counts":
                rows = epoch_rows[start // cfg.batch_size]
                losses = pop.count_batch(train_counted, train_data, idx, count_losses, rows)
            elif forward == "prefix counts":
                seeds = [c.seed for c in pop.cfgs]
                losses = prefix_step(
                    pop.P,
                    train_rows,
                    idx,
                    seeds,
                    pop.epoch,
                    cfg,
                    pop.attn_scale,
                    pop.norm,
                    pop.identity_w_o,
                    prefix_losses,
                )
            else:
                losses = pop.position_batch(train_data, idx, position_fn)
            pop.update(losses)
            totals += losses.detach().double().cpu() * idx.shape[1]
        tick = _lap(clock, "train", tick)
        val = _val_metrics(
            task,
            pop.detached,
            val_data,
            pop.attn_scale,
            val_counted,
            norm=pop.norm,
            cfg=cfg,
            pooling=pop.pooling,
            count_predictions=val_predictions,
            grouped_predictions=val_grouped,
        )
        tick = _lap(clock, "validation", tick)
        # snapshots before the resume file: a kill between the two replays (and rewrites) them, never skips them
        pop.end_epoch((totals / n).tolist(), val, train_data, val_data, snapshot and (lambda k: snapshot(pop, k)))
        tick = _lap(clock, "epoch_end", tick)  # records, best states, snapshots and halving (timed apart too)
        if resume_file is not None and cfg.save_every and pop.epoch % cfg.save_every == 0 and pop.epoch < cfg.epochs:
            _save_resume(Path(resume_file), pop.identity(), *pop.state())
            _lap(clock, "resume_file", tick)
        bar.update(1)
        bar.set_postfix(
            active=sum(r.active for r in pop.records),
            best=f"{min(r.best_accuracy for r in pop.records):.3f}-{max(r.best_accuracy for r in pop.records):.3f}",
            **({"one_head": sum(r.halving.done for r in pop.records)} if cfg.halving else {}),
        )
    bar.close()

    # the kept models, evaluated on every split as one batched computation (what evaluate_splits gives each)
    tick = time.perf_counter()
    _kept, final = pop.kept()
    split_metrics, examples = {}, {}
    for split in task.splits:
        data = splits[split].to(device)
        examples[split] = len(data)
        split_metrics[split] = _val_metrics(
            task,
            pop.forward_params(final),
            data,
            pop.attn_scale,
            _eval_counts(data, d_vocab, cfg) if eval_counts else None,
            norm=pop.norm,
            cfg=cfg,
            pooling=pop.pooling,
        )
    tick = _lap(clock, "final_evaluation", tick)
    results = []
    wall = time.time() - started
    seconds = {key: round(v, 3) for key, v in sorted(clock.items())}
    for k, (spec, c, model, out, r) in enumerate(zip(specs, cfgs, pop.models, outs, pop.records)):
        model.load_state_dict({**model.state_dict(), **{n_: final[n_][k].clone() for n_ in pop.names}})
        model.eval()
        metrics = {split: split_metrics[split][k] for split in task.splits}
        prov = r.provenance(
            c,
            metrics,
            device,
            wall,
            population={
                "size": K,
                "index": k,
                "forward": forward,
                "compiled": bool(compile),
                "resumed_at_epoch": resumed_at,
                "seconds": seconds,  # where the population's time went (wall seconds, all its models together)
                "softmax_form_steps": pop.softmax_steps,
            },
            examples=examples,
        )
        save_checkpoint(model, task, out, training=prov, spec=spec)
        results.append(prov)
    if resume_file is not None:
        Path(resume_file).unlink(missing_ok=True)
    return results


def _lap(clock: dict[str, float], key: str, since: float) -> float:
    """Add the wall seconds since ``since`` to ``clock[key]``; return now."""
    now = time.perf_counter()
    clock[key] = clock.get(key, 0.0) + now - since
    return now


def _snapshot_writer(outs: Sequence[Path], snapshot_every: int | None):
    """``write(pop, k)``: model ``k``'s snapshot every ``snapshot_every`` epochs (checked by
    :func:`interp.configs.check_snapshot_every`) into its solo run's folder (:func:`interp.training.snapshot_directory`
    of its checkpoint, created now), or None without snapshots."""
    if snapshot_every is None:
        return None
    folders = [snapshot_directory(o) for o in outs]
    for f in folders:
        f.mkdir(parents=True, exist_ok=True)

    def write(pop: _Population, k: int) -> None:
        if pop.epoch % snapshot_every == 0:
            pop.write_snapshot(k, folders[k] / snapshot_name(pop.epoch))

    return write


def _save_resume(path: Path, identity: dict[str, Any], tensors: dict[str, Tensor], progress: dict[str, Any]) -> None:
    write_resume_file(path, tensors, identity, "the population's resume file", progress=progress)


def _load_resume(path: Path, identity: dict[str, Any]) -> tuple[dict[str, Tensor], dict[str, Any]]:
    tensors, meta = read_resume_file(path, "population resume file", required=("identity", "progress"))
    check_identity(
        path,
        meta["identity"],
        identity,
        what="population resume file",
        owner="another population",
        fix="use the same runs or delete it",
    )
    return tensors, meta["progress"]


def _record_from_dict(d: dict[str, Any], cfg: TrainConfig) -> RunRecord:
    """A model's record from a population resume file (also one written before the run record existed, which
    held no keep and patience: they are the run's own anyway)."""
    return RunRecord.from_dict(d, cfg.keep, cfg.patience)


def seed_population(task: Task, spec: ModelSpec, cfg: TrainConfig, seeds: Sequence[int]):
    """Specs and configs for one model per seed, as ``interp train --seed S`` builds them (init seed = seed)."""
    return [replace(spec, init_seed=s) for s in seeds], [replace(cfg, seed=s) for s in seeds]
