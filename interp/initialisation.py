"""Initialisations of a model's trainable parameters other than TransformerLens' own (``TrainConfig.init``).

TransformerLens (``init="tl"``, the default) draws every weight matrix from N(0, 0.8 / sqrt(d_model)) and zeroes
the biases. A transformer written by hand in PyTorch (``init="torch"``) gets the defaults of its modules instead:
``nn.Embedding`` draws N(0, 1), ``nn.Linear(fan_in, fan_out)`` draws weights and biases uniform in
``+-1/sqrt(fan_in)`` (its Kaiming-uniform with ``a = sqrt(5)``). The queries, keys and values are one
``nn.Linear(d_model, n_heads * d_head)`` each (fan-in d_model), the output matrix ``nn.Linear(n_heads * d_head,
d_model)``, the unembedding ``nn.Linear(d_model, d_vocab_out)``. Fraknói 2024 (*Solving Mathematical Problems with
Transformers*, §2.7) states its own (``init="thesis"``): W_E ~ N(0, 1/d); W_Q, W_K (and here W_V), W_O ~ N(0,
(2/3) sqrt(l) / d) with l layers; the MLP's inner matrices with 2/d in place of 1/d; the output layer, which the
thesis leaves out of the list, N(0, 1/d) like the embedding.

``init_scale`` multiplies every initial weight matrix (biases and LayerNorm parameters are left alone).

Only trainable parameters are redrawn: what the spec fixes (a zero ``W_pos``, the identity ``W_O``, zero biases)
stays fixed. The draws come from a generator of their own seeded by the model's ``init_seed``, so the global RNG
(which the solo run's dropout draws from) is untouched, and a model built in a population gets the same numbers.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import torch

from .attention import is_plain
from .configs import ModelSpec
from .errors import ConfigError

if TYPE_CHECKING:
    from transformer_lens import HookedTransformer

# per-parameter short names (the last part of the state-dict name) and the fan-in they are drawn for
_WEIGHTS = ("W_E", "W_pos", "W_Q", "W_K", "W_V", "W_O", "W_U", "W_in", "W_out")


def _fan_in(name: str, p: torch.Tensor, spec: ModelSpec) -> int:
    short = name.rsplit(".", 1)[-1]
    if short in ("W_Q", "W_K", "W_V", "b_Q", "b_K", "b_V", "W_U", "b_U", "W_in", "b_in"):
        return spec.d_model
    if short in ("W_O", "b_O"):
        return spec.n_heads * spec.d_head
    if short in ("W_out", "b_out"):
        return p.shape[-2] if short == "W_out" else (spec.d_mlp or 4 * spec.d_model)
    return spec.d_model


def initialise(model: HookedTransformer, spec: ModelSpec, init: str = "tl", scale: float = 1.0) -> None:
    """Redraw ``model``'s trainable parameters by ``init`` and multiply its weight matrices by ``scale`` (in place;
    ``init="tl"`` with ``scale=1`` leaves the model as TransformerLens built it)."""
    if init == "tl" and scale == 1.0:
        return
    if not is_plain(model):
        raise ConfigError(
            f"init={init!r} / init_scale={scale} redraws TransformerLens' parameters only; attention variants "
            f"(attention={spec.attention!r}, qkv={spec.qkv!r}) have their own: use init='tl' and init_scale=1"
        )
    gen = torch.Generator().manual_seed(0x5EED_0000 + int(spec.init_seed))
    layers = spec.n_layers
    with torch.no_grad():
        for name, p in model.named_parameters():
            if not p.requires_grad:
                continue
            short = name.rsplit(".", 1)[-1]
            is_weight = short in _WEIGHTS
            if short in ("w", "b") and ".ln" in f".{name}":  # LayerNorm weights and biases: 1 and 0 in every scheme
                continue
            if init == "torch":
                if short in ("W_E", "W_pos"):
                    new = torch.randn(p.shape, generator=gen)
                else:
                    bound = 1 / math.sqrt(_fan_in(name, p, spec))
                    new = (torch.rand(p.shape, generator=gen) * 2 - 1) * bound
            elif init == "thesis":
                if not is_weight:
                    new = torch.zeros(p.shape)
                elif short in ("W_E", "W_pos", "W_U"):
                    new = torch.randn(p.shape, generator=gen) / math.sqrt(spec.d_model)
                elif short == "W_in":
                    new = torch.randn(p.shape, generator=gen) * math.sqrt(2 / 3 * math.sqrt(layers) * 2 / spec.d_model)
                else:
                    new = torch.randn(p.shape, generator=gen) * math.sqrt(2 / 3 * math.sqrt(layers) / spec.d_model)
            else:
                new = p.detach().cpu().clone()
            if is_weight:
                new = new * scale
            p.copy_(new.to(p.device, p.dtype))
