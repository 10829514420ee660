"""Positional schemes beyond TransformerLens' own (Ibrahimli 2024, §2.1.4), through a forward hook on ``pos_embed``.

``ModelSpec.positional`` chooses the scheme; what each needs:

- ``standard`` (learned absolute), ``shortformer``: TransformerLens' ``positional_embedding_type``, nothing else;
- ``none`` (NoPE): ``W_pos`` zeroed and frozen (:mod:`interp.model`);
- ``rotary``: ``positional_embedding_type="rotary"`` (``rotary_dim = d_head``); the model has no ``W_pos``;
- ``random`` (randomised positions, Ruoss et al. 2023): a learned ``W_pos`` of ``n_ctx`` rows; while the model is
  in training mode each sequence of ``T`` tokens reads the rows of a sorted random subset of ``range(n_ctx)``
  (so rows far beyond ``T`` get trained); in eval mode it reads rows ``0 .. T-1`` (deterministic);
- ``abacus`` (McLeish et al. 2024): a learned ``W_pos``; a token in ``digit_tokens`` reads row ``offset + i`` where
  ``i`` (1-based) is its index within its run of consecutive digit tokens, every other token reads row 0; in
  training mode ``offset`` is drawn per sequence from ``0 .. max_position_offset`` (so longer numbers' rows get
  trained), in eval mode it is 0. Digits of the same place value share a row when numbers are written units first.

The last two replace ``pos_embed``'s output by ``W_pos[position_ids]`` in a PyTorch forward hook on the
``pos_embed`` module (it sees the tokens; ``hook_pos_embed`` still sees the result). The hook is part of the model
built from the spec (:func:`interp.model.build_model`, so checkpoints load back with it); a plain
TransformerLens load of such a checkpoint has the same weights but reads rows ``0 .. T-1``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from jaxtyping import Int
from torch import Tensor

from .errors import ConfigError, TokenError

if TYPE_CHECKING:
    from transformer_lens import HookedTransformer

INDEXED = ("random", "abacus")


def run_index(tokens: Int[Tensor, "batch pos"], digit_tokens) -> Int[Tensor, "batch pos"]:
    """1-based index of each token within its run of consecutive ``digit_tokens``; 0 for other tokens."""
    is_digit = torch.isin(tokens, torch.as_tensor(list(digit_tokens), device=tokens.device))
    count = is_digit.long().cumsum(1)
    last = torch.where(is_digit, torch.zeros_like(count), count).cummax(1).values
    return (count - last) * is_digit


def position_ids(
    tokens: Int[Tensor, "batch pos"],
    scheme: str,
    n_ctx: int,
    *,
    training: bool = False,
    digit_tokens=(),
    max_offset: int = 0,
    generator: torch.Generator | None = None,
) -> Int[Tensor, "batch pos"]:
    """The ``W_pos`` row each token reads under ``scheme`` (``standard``/``none``: ``0 .. T-1``)."""
    bsz, t = tokens.shape
    dev = tokens.device
    if scheme == "random" and training:
        if t > n_ctx:
            raise TokenError(f"sequences of {t} tokens are longer than the position range n_ctx={n_ctx}")
        keys = torch.rand(bsz, n_ctx, generator=generator).to(dev)
        return keys.topk(t, dim=1).indices.sort(1).values
    if scheme == "abacus":
        offset = torch.zeros(bsz, 1, dtype=torch.long, device=dev)
        if training and max_offset > 0:
            offset = torch.randint(0, max_offset + 1, (bsz, 1), generator=generator).to(dev)
        idx = run_index(tokens, digit_tokens)
        pos = torch.where(idx > 0, idx + offset, torch.zeros_like(idx))
        if pos.numel() and int(pos.max()) >= n_ctx:
            raise TokenError(
                f"a number of {int(idx.max())} digits (+ offset {int(offset.max())}) needs Abacus position "
                f"{int(pos.max())}, beyond the model's {n_ctx} position rows"
            )
        return pos
    return torch.arange(t, device=dev).expand(bsz, t)


class PositionHook:
    """The forward hook on ``model.pos_embed`` that makes it read ``W_pos[position_ids(tokens)]``."""

    def __init__(self, scheme: str, digit_tokens=(), max_offset: int = 0):
        if scheme not in INDEXED:
            raise ConfigError(f"position hooks exist for {INDEXED}, not {scheme!r}")
        if scheme == "abacus" and not digit_tokens:
            raise ConfigError("positional='abacus' needs digit_tokens: the token ids whose runs are numbers")
        self.scheme, self.digit_tokens, self.max_offset = scheme, tuple(digit_tokens), int(max_offset)

    def __call__(self, module, args, output):
        tokens = args[0]
        pos = position_ids(
            tokens,
            self.scheme,
            module.W_pos.shape[0],
            training=module.training,
            digit_tokens=self.digit_tokens,
            max_offset=self.max_offset,
        )
        return module.W_pos[pos]


def install(model: HookedTransformer, scheme: str, digit_tokens=(), max_offset: int = 0) -> None:
    """Register the position hook of ``scheme`` on ``model.pos_embed`` (once)."""
    if position_hook(model) is not None:
        raise ConfigError("the model already has a position hook")
    model.pos_embed.register_forward_hook(PositionHook(scheme, digit_tokens, max_offset))


def position_hook(model: HookedTransformer) -> PositionHook | None:
    """The model's position hook, or None (TransformerLens' own positions)."""
    pe = getattr(model, "pos_embed", None)
    if pe is None:
        return None
    return next((h for h in pe._forward_hooks.values() if isinstance(h, PositionHook)), None)
