"""The exact prefix-count forward: every position's logits of one-layer attention-only models without positional
embedding, for K models at once, in ``O(present tokens)`` per position (what the language-model objective needs:
a loss at every position of the sentence, not two).

In such a model the logits at position ``t`` depend only on the token at ``t`` and on how often each token occurs
at positions ``<= t``: attention to a token is the same at each of its occurrences, so a head's output is
``z = sum_k c_k w_k v_k / sum_k c_k w_k`` over the tokens ``k`` with counts ``c_k`` (prefix counts: a cumulative
sum of one-hot tokens), ``w_k = exp(score(query token, k))``. The rows of a split (:class:`PrefixRows`) are its
(sentence, position) pairs that carry a target, each with its query token and its counts.

Two ways through, both exact up to float rounding:

- **Dense groups** (query token and set of present tokens shared by many rows: on noisy majority, a digit
  after every digit has occurred) use that form directly. Per group and model a table ``[present, head x (d_head +
  1)]`` holds ``w_k v_k`` and ``w_k`` with ``w`` shifted by the group's largest score among its present tokens (so
  every ``w <= 1`` and the denominator is at least 1: no overflow, no underflow), and all of a group's rows are one
  ``[rows, present] @ [present, head x (d_head + 1)]`` product: no softmax, no exponential per row.
- **Every other row** (rare patterns: the first digits, ``[BOS]``, ``=``, the answer) goes through a softmax over
  the present tokens with ``log c_k`` added to the scores, as :func:`interp.population.stacked_count_logits` does.

Dropout after the attention output (``TrainConfig.dropout_at="attention"``) multiplies each row's output by its
mask; masks drawn by the counter (:mod:`interp.dropout_masks`) are the solo run's, entry for entry.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from jaxtyping import Float, Int
from torch import Tensor

from .dropout_masks import MAX_UNITS, OFFSET, keep_multiplier, row_keys
from .errors import ConfigError
from .position_forward import NO_NORM, Norm
from .task import IGNORE

DENSE_SHARE = 0.05  # a (query token, present tokens) group with at least this share of the rows is dense


@dataclass(frozen=True)
class Block:
    """The rows of one dense group (``query`` token, its ``keys``: the present columns, all with counts) or, with
    ``query`` -1, every other row: row indices sorted by sentence, and where each sentence's lie (``start`` /
    ``length``, indexed by sentence)."""

    query: int
    keys: tuple[int, ...]
    rows: Int[Tensor, " rows"]
    start: Int[Tensor, " sentences"]
    length: Int[Tensor, " sentences"]


@dataclass(frozen=True)
class PrefixRows:
    """The target rows of a split: sentence (index in the split), position in it, query token, target, and the
    counts of each ``present`` token at or before the position, in blocks
    (:class:`Block`: the dense groups, then the rest)."""

    sentence: Int[Tensor, " rows"]
    position: Int[Tensor, " rows"]
    query: Int[Tensor, " rows"]
    target: Int[Tensor, " rows"]
    counts: Float[Tensor, "rows present"]
    present: Int[Tensor, " present"]
    blocks: tuple[Block, ...]


def prefix_rows(tokens: Int[Tensor, "n pos"], targets: Int[Tensor, "n pos"], d_vocab: int) -> PrefixRows:
    """:class:`PrefixRows` of the positions of ``tokens`` whose ``targets`` are not ``IGNORE``."""
    n = tokens.shape[0]
    sent, pos = (targets != IGNORE).nonzero(as_tuple=True)
    counts = F.one_hot(tokens, d_vocab).cumsum(1)[sent, pos]  # [rows, vocab]
    present = (counts > 0).any(0).nonzero().flatten()
    counts = counts[:, present]
    query = tokens[sent, pos]
    width = len(present)
    key = query * (1 << width) + ((counts > 0).long() << torch.arange(width, device=counts.device)).sum(1)
    uniq, inverse, sizes = torch.unique(key, return_inverse=True, return_counts=True)
    dense = (sizes >= DENSE_SHARE * len(sent)).tolist()
    blocks = []

    def block(q: int, keys: tuple[int, ...], members: Tensor) -> Block:
        rows = members.nonzero().flatten()
        length = torch.bincount(sent[rows], minlength=n)
        return Block(q, keys, rows, torch.cumsum(length, 0) - length, length)

    for u, is_dense in enumerate(dense):
        if is_dense:
            k = int(uniq[u])
            blocks.append(block(k >> width, tuple(c for c in range(width) if k >> c & 1), inverse == u))
    others = ~torch.tensor(dense, dtype=torch.bool, device=inverse.device)[inverse]
    if bool(others.any()):
        blocks.append(block(-1, tuple(range(width)), others))
    return PrefixRows(sent, pos, query, targets[sent, pos], counts.float(), present, tuple(blocks))


@dataclass(frozen=True)
class PackedBlock:
    """One block's rows of one step for K models, gathered into contiguous ``[K, ..., width]`` tensors (rows on
    the last axis; padding slots repeat a row of the block and are not ``valid``)."""

    counts: Float[Tensor, "K keys width"]  # counts of the block's key tokens
    query: Int[Tensor, "K width"]
    target: Int[Tensor, "K width"]
    sentence: Int[Tensor, "K width"]
    position: Int[Tensor, "K width"]
    valid: Float[Tensor, "K width"]


@dataclass(frozen=True)
class Packed:
    """One step's rows for K models, per block of :class:`PrefixRows`, and each model's number of rows."""

    blocks: tuple[PackedBlock, ...]
    n_rows: Int[Tensor, " K"]


def pack(rows: PrefixRows, idx: Int[Tensor, "K b"], widths: Sequence[int] | None = None) -> Packed:
    """Lay out the rows of each model's sentences ``idx`` (vectorised over the models; no sort), each block
    ``widths[i]`` columns wide (at least as many as any model has rows in it; the most any model has where None).
    Fixed widths give every step the same shapes, which a compiled step needs to compile once."""
    K, b = idx.shape
    dev = idx.device
    blocks, n_rows = [], torch.zeros(K, dtype=torch.long, device=dev)
    for i, blk in enumerate(rows.blocks):
        lens = blk.length[idx]  # [K, b]
        per_model = lens.sum(1)
        most = int(per_model.max())
        width = most if widths is None else int(widths[i])
        if width < most:
            raise ConfigError(f"block {i} of the prefix rows needs {most} columns, got {width}")
        flat = lens.flatten()
        seg = torch.repeat_interleave(torch.arange(K * b, device=dev), flat)
        step = torch.arange(len(seg), device=dev)
        src = blk.start[idx].flatten()[seg] + step - (torch.cumsum(flat, 0) - flat)[seg]
        model = seg // b
        dest = model * width + step - (torch.cumsum(per_model, 0) - per_model)[model]
        layout = torch.full((K * width,), int(blk.rows[0]), dtype=torch.long, device=dev)
        valid = torch.zeros(K * width, dtype=torch.bool, device=dev)
        layout[dest] = blk.rows[src]
        valid[dest] = True
        counts = rows.counts.index_select(0, layout)[:, list(blk.keys)]  # [K x width, keys]
        blocks.append(
            PackedBlock(
                counts.view(K, width, len(blk.keys)).transpose(1, 2).contiguous(),  # width 0: no model has a row
                rows.query.index_select(0, layout).view(K, width),
                rows.target.index_select(0, layout).view(K, width),
                rows.sentence.index_select(0, layout).view(K, width),
                rows.position.index_select(0, layout).view(K, width),
                valid.view(K, width).to(rows.counts.dtype),
            )
        )
        n_rows += per_model
    return Packed(tuple(blocks), n_rows)


def prefix_count_losses(
    P: dict[str, Tensor],
    rows: PrefixRows,
    packed: Packed,
    attn_scale: float,
    norm: Norm = NO_NORM,
    identity_w_o: bool = False,
    mask_keys: Int[Tensor, " K"] | None = None,
    p: float = 0.0,
) -> Float[Tensor, " K"]:
    """Each model's mean cross-entropy over its packed rows (the language-model loss of its batch), with dropout
    ``p`` on the attention output drawn by the counter from ``mask_keys`` (:func:`interp.dropout_masks.run_keys`
    of the models' seeds, the epoch and the attention site: the masks of their solo runs). Rows lie on the last
    axis throughout, so every per-row operation runs along contiguous memory and every reduction (over tokens, over
    the vocabulary) over a short middle axis; compiled (``torch.compile``), gathers, hash and arithmetic fuse into
    a few loops per block."""
    W_E, W_Q, W_K, W_V = (P[n] for n in ("embed.W_E", "blocks.0.attn.W_Q", "blocks.0.attn.W_K", "blocks.0.attn.W_V"))
    K, V = W_E.shape[:2]
    H, d, e = W_Q.shape[1:]
    present = rows.present
    n_p = present.shape[0]
    E_in = norm.apply(P, "blocks.0.ln1", W_E)  # [K, vocab, d]: what attention reads from each token
    q = torch.einsum("Kvd,Khde->Khve", E_in, W_Q) + P["blocks.0.attn.b_Q"][:, :, None]
    E_keys = E_in[:, present]
    keys = torch.einsum("Kvd,Khde->Khve", E_keys, W_K) + P["blocks.0.attn.b_K"][:, :, None]
    vals = torch.einsum("Kvd,Khde->Khve", E_keys, W_V) + P["blocks.0.attn.b_V"][:, :, None]  # [K, H, present, e]
    S = torch.matmul(q, keys.transpose(-1, -2)) / attn_scale  # [K, H, vocab (query), present (key)]
    W_Ut = P["unembed.W_U"].transpose(1, 2)  # [K, vocab_out, d]
    total = torch.zeros(K, device=W_E.device)
    for blk, pb in zip(rows.blocks, packed.blocks):
        counts = pb.counts
        width = counts.shape[-1]
        if blk.query >= 0:  # dense: z = ([w v | w]^T @ C) split
            kc = list(blk.keys)
            s = S[:, :, blk.query, kc]  # [K, H, n]
            w = (s - s.amax(-1, keepdim=True).detach()).exp()  # the shift cancels: no gradient through it
            table = torch.cat([vals[:, :, kc] * w[..., None], w[..., None]], -1)  # [K, H, n, e + 1]
            nd = torch.bmm(table.permute(0, 1, 3, 2).reshape(K, H * (e + 1), len(kc)), counts)
            nd = nd.view(K, H, e + 1, width)
            z = nd[:, :, :e] / nd[:, :, e:]  # [K, H, e, w]
            resid_in = W_E[:, blk.query, :, None]  # [K, d, 1]
        else:  # the rest: softmax over present tokens of score + log count, tokens on the middle axis
            onehot = F.one_hot(pb.query, V).to(W_E.dtype).transpose(1, 2)  # [K, vocab, w]
            sc = torch.bmm(S.permute(0, 1, 3, 2).reshape(K, H * n_p, V), onehot).view(K, H, n_p, width)
            attn = (sc + counts.log().clamp(min=-1e30)[:, None]).softmax(-2)
            z = torch.matmul(vals.transpose(-1, -2), attn)  # [K, H, e, w]
            resid_in = torch.bmm(W_E.transpose(1, 2), onehot)  # [K, d, w]
        if identity_w_o:
            out = z.reshape(K, H * e, width) + P["blocks.0.attn.b_O"][:, :, None]
        else:
            W_O = P["blocks.0.attn.W_O"].reshape(K, H * e, d).transpose(1, 2)
            out = torch.bmm(W_O, z.reshape(K, H * e, width)) + P["blocks.0.attn.b_O"][:, :, None]
        if mask_keys is not None and p > 0:
            base = row_keys(mask_keys, pb.sentence) + (pb.position + OFFSET) * MAX_UNITS  # [K, w]
            out = out * keep_multiplier(base[:, None, :] + torch.arange(d, device=W_E.device)[:, None], p)
        resid = resid_in + out  # [K, d, w]
        if norm.kind is not None:
            resid = norm.apply(P, "ln_final", resid.transpose(1, 2)).transpose(1, 2)
        logits = torch.baddbmm(P["unembed.b_U"][:, :, None], W_Ut, resid)  # [K, vocab_out, w]
        top = logits.detach().amax(1, keepdim=True)
        lse = (logits - top).exp().sum(1).log() + top[:, 0]
        ce = lse - logits.gather(1, pb.target[:, None])[:, 0]
        total = total + (ce * pb.valid).sum(1)
    return total / packed.n_rows.clamp(min=1)
