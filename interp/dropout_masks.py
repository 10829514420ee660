"""Dropout masks that do not depend on how models are batched (``TrainConfig.dropout_rng="counter"``), and the
torch-generator masks of the default.

With ``dropout_rng="torch"`` (the default) a solo run's masks come from torch's generator in the order its forward
applies dropout, and a population reproduces them by drawing each model's masks, of its solo run's shapes, from a
generator in its solo run's state: ``bernoulli_`` draws ~7-14 ns a number on this project's CPUs, the C replay of
:mod:`interp.generator_replay` the same numbers ~7x faster (both measured by ``benchmarks/population.py``).

With ``dropout_rng="counter"`` a mask entry is a function of where it is: the run's seed, the epoch, the site
(embedding, attention output, attention pattern), the sentence (its index in the training split), the position in
the sentence (counted from its first token, so padding moves nothing) and the unit (a residual dimension, or a head
and a key position). The function is a 32-bit integer hash (two rounds of multiply-xorshift, Wellons' "lowbias32"
shape with multipliers below 2^31 so that every product fits in int64 exactly): a unit is dropped when the hash's
top 24 bits fall below ``round(p * 2^24)``, so the drop probability is ``p`` to 2^-24. The same entries come out
whether a model trains alone or in a population, for every model of a population in one vectorised call (compiled
by ``torch.compile`` where a C++ compiler is present; integer arithmetic, so compiled and eager agree bit for bit),
with no generator state to carry.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import no_type_check

import torch
from jaxtyping import Float, Int
from torch import Tensor

from .compiled import compiled_or_plain
from .errors import ConfigError
from .generator_replay import checked_shape, mask_from

SITES = {"embedding": 1, "attention": 2, "pattern": 3}
M32 = 0xFFFFFFFF
OFFSET = 4096  # added to positions in a sentence (pads are negative) before they enter the hash
MAX_UNITS = 1024  # residual dimensions a position mask can index
MAX_HEADS = 64
REPLAY_MIN = 4096  # numbers in a generator mask from which the C replay draws it


# The hash helpers below are ``no_type_check``: compiled steps (torch.compile) call them, and a runtime shape
# checker's wrapper (jaxtyping's import hook, as the test run installs on every function it is not told to skip) is
# not traceable by every torch (2.11's compiler fails on beartype's wrapper of ``_keep_mask``; 2.13's traces it).
@no_type_check
def mix32(x: Tensor) -> Tensor:
    """A bijective 32-bit mix of int64 values in [0, 2^32) (every product below 2^63: exact)."""
    x = x ^ (x >> 16)
    x = (x * 0x7FEB352D) & M32
    x = x ^ (x >> 15)
    x = (x * 0x2C1B3C6D) & M32
    return x ^ (x >> 16)


def run_keys(seeds: Sequence[int], epoch: int, site: str) -> Int[Tensor, " K"]:
    """One key per model: its run's seed, the epoch and the site, mixed."""
    s = torch.tensor([int(x) & M32 for x in seeds], dtype=torch.int64)
    return mix32(mix32(mix32(s) ^ (int(epoch) & M32)) ^ SITES[site])


@no_type_check
def row_keys(keys: Tensor, sentences: Tensor) -> Tensor:
    """One key per model (``keys``, ``[K]``) and sentence (``sentences``, ``[K, ...]``: indices into the training
    split)."""
    k = keys.to(sentences.device).view(-1, *[1] * (sentences.ndim - 1))
    return mix32(mix32(k ^ (sentences & M32)) ^ 0x9E3779B9)


@no_type_check
def keep_multiplier(h: Tensor, p: float) -> Tensor:
    """The dropout multiplier (0 or ``1 / (1 - p)``) of hash input ``h`` (what every counter mask is made of;
    plain tensor operations, so a compiled caller fuses it into its own loops)."""
    return _keep_mask(h, round(p * (1 << 24)), 1.0 / (1.0 - p))


@no_type_check
def _keep_mask(h: Tensor, threshold: int, scale: float) -> Tensor:
    return (mix32(h & M32) >> 8 >= threshold).to(torch.float32) * scale


@no_type_check
def _keep_mask_of(base: Tensor, units: int, threshold: int, scale: float) -> Tensor:
    return _keep_mask(base[..., None] + torch.arange(units, device=base.device), threshold, scale)


def _mask(h: Int[Tensor, "*shape"], p: float, units: int | None = None) -> Float[Tensor, "*shape ..."]:
    """:func:`keep_multiplier` of the hash inputs ``h``; with ``units``, of ``h + unit`` for every ``unit <
    units`` (a new last axis), formed inside the compiled loop rather than as an int64 tensor of the mask's size (8
    bytes a number, built and read back: a third of the counter masks' time)."""
    threshold, scale = round(p * (1 << 24)), 1.0 / (1.0 - p)
    fn, args = (_keep_mask, (h,)) if units is None else (_keep_mask_of, (h, units))
    if h.device.type == "cpu":
        fn = compiled_or_plain(fn, dynamic=True)
    return fn(*args, threshold, scale)


def position_mask(
    rows: Int[Tensor, "K b"], positions: Int[Tensor, "K b t"], units: int, p: float
) -> Float[Tensor, "K b t units"]:
    """Multipliers (0 or ``1 / (1 - p)``) for ``units`` residual dimensions at each position (in its sentence,
    pads negative) of each sentence (``rows``: :func:`row_keys`)."""
    if units > MAX_UNITS:
        raise ConfigError(f"dropout_rng='counter' indexes at most {MAX_UNITS} residual dimensions, got {units}")
    return _mask(rows[:, :, None] + (positions + OFFSET) * MAX_UNITS, p, units)


def pattern_mask(
    rows: Int[Tensor, "K b"],
    query_positions: Int[Tensor, "K b k"],
    key_positions: Int[Tensor, "K b t"],
    heads: int,
    p: float,
) -> Float[Tensor, "K b k heads t"]:
    """Multipliers for the attention probabilities of each head from each query to each key (positions in the
    sentence), laid out ``[model, sentence, query, head, key]``."""
    if heads > MAX_HEADS:
        raise ConfigError(f"dropout_rng='counter' indexes at most {MAX_HEADS} heads in a pattern mask, got {heads}")
    qk = ((query_positions + OFFSET) * 8192)[..., None] + (key_positions + OFFSET)[:, :, None, :]  # [K, b, k, t]
    idx = qk[:, :, :, None] * MAX_HEADS + torch.arange(heads, device=rows.device)[:, None]  # [K, b, k, H, t]
    return _mask(rows[:, :, None, None, None] + idx, p)


def dropout(x: Tensor, p: float) -> Tensor:
    """``F.dropout(x, p, training=True)`` with the mask drawn by torch's CPU generator on every device, so that a
    run on CUDA draws the numbers a CPU run of the same seed draws and trains the same model (to float rounding),
    and equals its population (which draws each model's masks from a CPU generator in its solo run's state). On
    the CPU this is ``F.dropout`` itself; elsewhere the mask ``F.dropout`` would multiply by on the CPU
    (:func:`generator_mask` for float32, ``bernoulli_`` in ``x``'s dtype otherwise) is drawn there and moved."""
    if x.device.type == "cpu":
        return torch.nn.functional.dropout(x, p=p, training=True)
    if x.dtype == torch.float32:
        mask = generator_mask(x.shape, p)
    elif p in {0, 1}:  # F.dropout draws nothing for these
        mask = torch.full(x.shape, 1.0 - p, dtype=x.dtype)
    else:
        mask = torch.empty(x.shape, dtype=x.dtype).bernoulli_(1 - p).div_(1 - p)
    return x * mask.to(x.device)


def generator_mask(shape: Sequence[int], p: float | Tensor, gen: torch.Generator | None = None) -> Float[Tensor, ...]:
    """What ``F.dropout(x, p)`` multiplies ``x`` by on the CPU, ``bernoulli(1 - p) / (1 - p)`` (ones for p = 0 and
    zeros for p = 1, with no draw, as ``F.dropout`` draws none), drawn from ``gen`` (torch's default generator when
    None) as it would draw it: by the C replay of :mod:`interp.generator_replay` from ``REPLAY_MIN`` numbers on
    (below, reading and writing the generator's state costs about what the draws do), by ``bernoulli_`` below it."""
    shape = checked_shape(shape)
    gen = gen if gen is not None else torch.default_generator
    return mask_from(gen, shape, p, replay=math.prod(shape) >= REPLAY_MIN)
