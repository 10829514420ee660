"""Which batched forward trains a population, and the steps of the two that :mod:`interp.population` delegates
here: the prefix-count step of the language-model objective (:mod:`interp.prefix_counts`) and the per-position step
(:mod:`interp.position_forward`).

The forward is a function of the recipe (:func:`forward_of`), recorded in each checkpoint
(``population.forward``):

- ``token counts``: the task's target positions (the answer objective) of models without positional embedding,
  where nothing position-dependent comes before attention (dropout on the attention output only, or none): the
  query token and the counts of the tokens before it suffice (``interp.population.stacked_count_logits``); a pad
  attended under left padding is one more token to count.
- ``prefix counts``: the same at every position (the language-model objective), right padding, dropout on the
  attention output drawn by the counter (or none).
- ``positions``: everything else (dropout on the embedding or the attention probabilities, positional embeddings,
  the language-model objective with torch-drawn masks or left padding): the per-position forward, vectorised over
  the models, with each model's masks as its solo run draws them; on the CPU its softmax attention goes through a C
  kernel where it applies (:mod:`interp.attention_native`, :data:`NATIVE_ATTENTION`).
"""

from __future__ import annotations

import inspect
from collections.abc import Sequence

import torch
from jaxtyping import Float, Int
from torch import Tensor

from . import attention_native
from .configs import ModelSpec, TrainConfig
from .dropout_masks import run_keys
from .position_forward import (
    Layout,
    Norm,
    cut_rows,
    draw_masks,
    mean_losses,
    sort_rows,
    stacked_position_logits,
)
from .prefix_counts import PrefixRows, pack, prefix_count_losses
from .task import IGNORE

# train the per-position forward's softmax attention through the C kernel where it applies (interp.attention_native:
# the answer objective, right padding, no dropout on the pattern, the CPU; False: torch's products everywhere)
NATIVE_ATTENTION = True


def forward_of(spec: ModelSpec, cfg: TrainConfig) -> str:
    """The batched forward a population of ``spec`` trained by ``cfg`` goes through (see the module's text)."""
    sites = cfg.dropout_sites
    no_positions = spec.positional == "none"
    if no_positions and sites <= {"attention"}:
        if cfg.objective == "answer":
            return "token counts"
        if cfg.padding == "right" and (not sites or cfg.dropout_rng == "counter"):
            return "prefix counts"
    return "positions"


def prefix_step(
    P: dict[str, Tensor],
    rows: PrefixRows,
    idx: Int[Tensor, "K b"],
    seeds: Sequence[int],
    epoch: int,
    cfg: TrainConfig,
    attn_scale: float,
    norm: Norm,
    identity_w_o: bool,
    losses_fn=prefix_count_losses,
    widths: Sequence[int] | None = None,
) -> Float[Tensor, " K"]:
    """Each model's language-model loss on its batch ``idx`` through the prefix-count forward (dropout on the
    attention output drawn by the counter, as the solo run draws it; blocks ``widths`` wide, see
    :func:`prefix_widths`)."""
    packed = pack(rows, idx, widths)
    keys = run_keys(seeds, epoch, "attention").to(idx.device) if cfg.dropout else None
    return losses_fn(P, rows, packed, attn_scale, norm, identity_w_o, keys, float(cfg.dropout))


def _position_losses(
    P: dict[str, Tensor],
    tokens,
    query_pos,
    targets,
    attn_scale: float,
    norm: Norm,
    identity_w_o: bool,
    key_valid,
    emb_mask,
    pattern_mask,
    out_mask,
    pooling: str = "softmax",
    native: bool = False,
) -> Float[Tensor, " K"]:
    logits = inspect.unwrap(stacked_position_logits)(
        P,
        tokens,
        query_pos,
        attn_scale,
        norm,
        identity_w_o=identity_w_o,
        key_valid=key_valid,
        emb_mask=emb_mask,
        pattern_mask=pattern_mask,
        out_mask=out_mask,
        pooling=pooling,
        native=native,
    )
    return inspect.unwrap(mean_losses)(logits, targets)


# runs of sentences (by length) a right-padded per-position step is cut into (see :func:`position_losses`)
LENGTH_CHUNKS = 8


def position_losses(
    P: dict[str, Tensor],
    layout: Layout,
    cfg: TrainConfig,
    d_model: int,
    n_heads: int,
    attn_scale: float,
    norm: Norm,
    identity_w_o: bool,
    *,
    generators: Sequence[torch.Generator],
    seeds: Sequence[int],
    epoch: int,
    sentences: Int[Tensor, "K b"],
    lengths: Int[Tensor, "K b"] | None = None,
    losses_fn=_position_losses,
    pooling: str = "softmax",
    buffers: dict[str, Tensor] | None = None,
) -> Float[Tensor, " K"]:
    """Each model's loss on its laid-out batch through the per-position forward, with its solo run's masks
    (:func:`interp.position_forward.draw_masks`).

    Under right padding with the sentences' ``lengths`` given, each model's batch is sorted by length
    (:func:`interp.position_forward.sort_rows`) and cut into :data:`LENGTH_CHUNKS` runs of consecutive ranks
    (:func:`interp.position_forward.cut_rows`), each padded to its own longest sentence rather than the step's:
    about half the positions of a batch of noisy-majority sentences are pads, and the forward's cost is
    proportional to the width. Torch-drawn masks are drawn for the whole batch first (each model's in its solo
    run's shapes and order, then put in the sorted order), then cut with it; counter masks are drawn per run of
    rows (they depend on the training run's seed, the epoch, the site, the sentence, the position in it and the
    unit, not on the batch's order or width). A model's loss is its runs' losses weighed by their targets: its mean
    over the batch, up to float rounding. ``buffers``: where the torch masks are written, kept by the caller from
    step to step (:func:`interp.position_forward.scratch`)."""
    sites, p, rng = cfg.dropout_sites, float(cfg.dropout), cfg.dropout_rng
    mask_kw = dict(generators=generators, seeds=seeds, epoch=epoch, buffers=buffers)

    W_Q = P["blocks.0.attn.W_Q"]

    def losses(lay, masks):
        k = lay.query_pos.shape[-1]
        native = (  # the C kernel (decided here, outside compiled code: its first use builds and checks it)
            NATIVE_ATTENTION
            and pooling == "softmax"
            and "pattern" not in sites
            and lay.key_valid is None
            and not lay.all_queries
            and attention_native.usable(k * n_heads, d_model, k, W_Q.device, W_Q.dtype)
        )
        return losses_fn(
            P,
            lay.tokens,
            lay.query_pos,
            lay.targets,
            attn_scale,
            norm,
            identity_w_o,
            lay.key_valid,
            *masks,
            pooling,
            native,
        )

    if lengths is None or layout.key_valid is not None:
        return losses(layout, draw_masks(layout, sites, p, rng, d_model, n_heads, sentences=sentences, **mask_kw))
    order = lengths.argsort(dim=1, stable=True)
    layout, lengths, sentences = sort_rows(layout, order), lengths.gather(1, order), sentences.gather(1, order)
    full = draw_masks(layout, sites, p, rng, d_model, n_heads, rows=order, **mask_kw) if rng != "counter" else ()
    total = counted = 0
    for chunk in torch.arange(lengths.shape[1]).tensor_split(min(LENGTH_CHUNKS, lengths.shape[1])):
        start, stop = int(chunk[0]), int(chunk[-1]) + 1
        lay, masks = cut_rows(layout, lengths, start, stop, full)
        if rng == "counter":
            masks = draw_masks(lay, sites, p, rng, d_model, n_heads, sentences=sentences[:, start:stop], **mask_kw)
        n = (lay.targets != IGNORE).flatten(1).sum(1)
        total = total + losses(lay, masks) * n
        counted = counted + n
    return total / counted.clamp(min=1)


def prefix_widths(
    rows: PrefixRows, seeds: Sequence[int], n: int, batch_size: int, epochs: int
) -> dict[int, tuple[int, ...]]:
    """For each batch size a run's steps have (full batches, and the last one of an epoch), the most rows any
    model has in each block of :class:`interp.prefix_counts.PrefixRows` in any step of the whole run: every
    epoch's data order replayed from generators seeded as the models' own (so a resumed run gets the same widths),
    so every step is padded to the same shapes and a compiled step compiles once per batch size."""
    gens = [torch.Generator().manual_seed(int(s)) for s in seeds]
    most: dict[int, Tensor] = {}
    starts = range(0, n, batch_size)
    for _ in range(epochs):
        perms = torch.stack([torch.randperm(n, generator=g) for g in gens])  # [K, n]
        per_block = torch.stack([blk.length[perms] for blk in rows.blocks], -1)  # [K, n, blocks]
        for start in starts:
            b = min(batch_size, n - start)
            m = per_block[:, start : start + b].sum(1).amax(0)
            most[b] = m if b not in most else torch.maximum(most[b], m)
    return {b: tuple(int(x) for x in m) for b, m in most.items()}
