"""Torch's CPU dropout draws for many generators at once, replayed in C, bit for bit.

A population equals its solo runs because each model draws its dropout masks from a generator in its solo run's
state, as ``bernoulli_(1 - p)`` would (:func:`interp.dropout_masks.generator_mask`). Torch draws such a mask one
number at a time, under a lock, from one generator per call: ~7-14 ns a number on this project's CPUs, 100 calls
per step for a population of 100, and the largest single part of a small model's training step.

:class:`DropoutGenerators` holds the K generators' states and draws all K masks in one call of a small C function
that does what torch's CPU kernel does for each number (``bernoulli_distribution<double>``, torch's
``aten/src/ATen/core/DistributionsHelper.h``): two outputs of the generator's MT19937 engine (Matsumoto and
Nishimura, "Mersenne twister", 1998) make a 64-bit integer, its low 53 bits ``m`` a uniform ``m / 2^53``, and the
number is kept when that is below ``1 - p``; a kept number is ``1 / (1 - p)`` in float32, what ``div_`` gives.
The generator states are read from and written back to torch's own state bytes, so a generator afterwards is in
the state ``bernoulli_`` would have left it in.

That holds for the CPU kernel torch runs here, not for every build: on an Intel CPU with MKL, torch may draw
``bernoulli_`` through MKL's own stream instead. So the replay is used only after a self-check has compared it
with ``bernoulli_`` (masks and final states, fresh and part-used generators, masks that cross the engine's
624-number blocks) in this process; where that check fails, or no C compiler is installed, the masks come from
``bernoulli_`` one generator at a time, as before. :func:`replay_status` says which and why.
"""

from __future__ import annotations

import ctypes
import functools
import math
import threading
from collections.abc import Sequence

import torch
from jaxtyping import Float
from torch import Tensor

from .native import build, pointer

_STATE_BYTES = 5056  # torch's CPUGeneratorImplState: seed, left, seeded, next, 624 words as uint64, normal caches
_SOURCE = r"""

#include <stdint.h>
#include <string.h>
#define N 624
#define M 397
#ifdef __cplusplus
extern "C" {
#endif
static void twist(uint32_t *s) {
  int i;
  for (i = 0; i < N - M; i++) {
    uint32_t y = (s[i] & 0x80000000u) | (s[i + 1] & 0x7fffffffu);
    s[i] = s[i + M] ^ (y >> 1) ^ ((0u - (y & 1u)) & 0x9908b0dfu);
  }
  for (; i < N - 1; i++) {
    uint32_t y = (s[i] & 0x80000000u) | (s[i + 1] & 0x7fffffffu);
    s[i] = s[i + M - N] ^ (y >> 1) ^ ((0u - (y & 1u)) & 0x9908b0dfu);
  }
  uint32_t y = (s[N - 1] & 0x80000000u) | (s[0] & 0x7fffffffu);
  s[N - 1] = s[M - 1] ^ (y >> 1) ^ ((0u - (y & 1u)) & 0x9908b0dfu);
}
static void temper(const uint32_t *s, uint32_t *t) {
  for (int i = 0; i < N; i++) {
    uint32_t y = s[i];
    y ^= y >> 11;
    y ^= (y << 7) & 0x9d2c5680u;
    y ^= (y << 15) & 0xefc60000u;
    t[i] = y ^ (y >> 18);
  }
}
/* Draws from consecutive word pairs (hi, lo): kept where ((hi & (2^21 - 1)) << 32 | lo) < threshold, compared
   as two 32-bit halves so the loop vectorises. */
static void draw_pairs(const uint32_t *t, int64_t pairs, float *o, uint32_t thr_hi, uint32_t thr_lo, float kept) {
  for (int64_t i = 0; i < pairs; i++) {
    int32_t hi = (int32_t)(t[2 * i] & 0x1fffffu);
    int32_t lo = (int32_t)(t[2 * i + 1] ^ 0x80000000u);
    int keep = (hi < (int32_t)thr_hi) | ((hi == (int32_t)thr_hi) & (lo < (int32_t)(thr_lo ^ 0x80000000u)));
    o[i] = keep ? kept : 0.0f;
  }
}
/* states: K blobs of torch's generator state (stride bytes apart); out: K rows of n floats. */
void replay_bernoulli(int64_t K, int64_t n, uint8_t *states, int64_t stride, uint64_t threshold, float kept,
                      float *out) {
  uint32_t s[N], t[N];
  uint32_t thr_hi = (uint32_t)(threshold >> 32), thr_lo = (uint32_t)threshold;
  for (int64_t k = 0; k < K; k++) {
    uint8_t *b = states + k * stride;
    int32_t left;
    memcpy(&left, b + 8, 4);
    for (int i = 0; i < N; i++) {
      uint64_t w;
      memcpy(&w, b + 24 + 8 * i, 8);
      s[i] = (uint32_t)w;
    }
    int64_t pos = 625 - left; /* words of the current block already used, 1..624 */
    temper(s, t);
    float *o = out + k * n;
    int64_t j = 0;
    while (j < n) {
      if (pos == N) { twist(s); temper(s, t); pos = 0; }
      if (pos == N - 1) { /* a pair across two blocks */
        uint32_t hi = t[pos];
        twist(s); temper(s, t); pos = 0;
        uint32_t pair[2] = {hi, t[pos++]};
        draw_pairs(pair, 1, o + j++, thr_hi, thr_lo, kept);
        continue;
      }
      int64_t pairs = (N - pos) / 2;
      if (pairs > n - j) pairs = n - j;
      draw_pairs(t + pos, pairs, o + j, thr_hi, thr_lo, kept);
      pos += 2 * pairs;
      j += pairs;
    }
    left = (int32_t)(625 - pos);
    uint64_t next = (uint64_t)pos;
    memcpy(b + 8, &left, 4);
    memcpy(b + 16, &next, 8);
    for (int i = 0; i < N; i++) {
      uint64_t w = s[i];
      memcpy(b + 24 + 8 * i, &w, 8);
    }
  }
}
#ifdef __cplusplus
}
#endif
"""
_LOCK = threading.RLock()  # a replay reads, advances and writes back generator states: one at a time


def _threshold(p: float) -> int:
    """The 53-bit integers ``m`` that ``bernoulli_(1 - p)`` keeps are those below this (``m / 2^53 < 1 - p``,
    exact: ``(1 - p) * 2^53`` is a double scaled by a power of two)."""
    return math.ceil((1.0 - p) * 2.0**53)


def _kept(p: float) -> float:
    """A kept number's multiplier, ``1 / (1 - p)`` as float32 ``div_`` computes it."""
    return float(torch.ones((), dtype=torch.float32, device="cpu").div_(1 - p))


def _replay(states: Tensor, n: int, p: float, out: Tensor | None = None) -> Float[Tensor, "K n"]:
    """Replays ``n`` draws of each generator whose state bytes are a row of ``states`` (advanced in place); float32
    on the CPU, whatever torch's defaults; into ``out`` (``[K, n]``, contiguous) where given."""
    if out is None:
        out = torch.empty(states.shape[0], n, dtype=torch.float32, device="cpu")
    if n and states.shape[0]:
        _library().replay_bernoulli(
            ctypes.c_int64(states.shape[0]),
            ctypes.c_int64(n),
            pointer(states),
            ctypes.c_int64(states.stride(0)),
            ctypes.c_uint64(_threshold(p)),
            ctypes.c_float(_kept(p)),
            pointer(out),
        )
    return out


@functools.cache
def _library() -> ctypes.CDLL:
    lib = build(_SOURCE, "replay")
    lib.replay_bernoulli.restype = None
    return lib


@functools.cache
def replay_status() -> str:
    """``"replay"`` where the C replay is built and equals ``bernoulli_`` here, else why not (the masks then come
    from ``bernoulli_``)."""
    try:
        _library()
    except OSError as e:
        return f"bernoulli_: {e}"
    for seed, used, n, p in ((0, 0, 5, 0.1), (1, 37, 1000, 0.5), (2, 623, 2000, 1 / 3), (3, 1247, 625, 0.9)):
        g = torch.Generator().manual_seed(seed)
        torch.empty(used, dtype=torch.float32, device="cpu").bernoulli_(0.5, generator=g)  # part-used
        states = torch.stack([g.get_state()])
        want = torch.empty(n, dtype=torch.float32, device="cpu").bernoulli_(1 - p, generator=g).div_(1 - p)
        if states.shape[1] != _STATE_BYTES:
            return f"bernoulli_: torch's generator state has {states.shape[1]} bytes, the replay reads {_STATE_BYTES}"
        got = _replay(states, n, p)[0]
        if not (torch.equal(got, want) and torch.equal(states[0], g.get_state())):
            return "bernoulli_: the C replay differs from this torch build's bernoulli_ (an MKL or newer kernel)"
    return "replay"


def checked_shape(shape: Sequence[int]) -> tuple[int, ...]:
    """``shape`` as a tuple of sizes, each a non-negative integer, else a ValueError naming it."""
    try:
        sizes = tuple(int(s) for s in shape)
        if any(s < 0 or s != float(x) for s, x in zip(sizes, shape)):
            raise ValueError
    except (TypeError, ValueError):
        raise ValueError(f"a dropout mask's shape must be sizes >= 0, got {shape!r}") from None
    return sizes


def checked_probability(p) -> float:
    """``p`` as the double ``F.dropout`` takes (a one-number tensor too), else a ValueError naming it."""
    try:
        q = float(p)
    except (TypeError, ValueError, RuntimeError):
        raise ValueError(f"a dropout probability must be a number in [0, 1], got {p!r}") from None
    if not 0 <= q <= 1:  # NaN fails too
        raise ValueError(f"a dropout probability must be in [0, 1], got {q!r}")
    return q


class DropoutGenerators:
    """K dropout generators whose masks are drawn all at once (the C replay, where :func:`replay_status` allows)
    or one by one (``bernoulli_``). The states live here between draws; :meth:`generators` writes them back into
    the torch generators, and must be called before anything else draws from them (a direct draw from a generator
    given here would otherwise repeat numbers this object has drawn)."""

    def __init__(self, generators: Sequence[torch.Generator]):
        self._gens = list(generators)
        if len({id(g) for g in self._gens}) != len(self._gens):
            raise ValueError("DropoutGenerators got the same generator twice: give each model its own")
        self._states: Tensor | None = None  # [K, state bytes] while the replay's copy is the newer one

    def __len__(self) -> int:
        return len(self._gens)

    def generators(self) -> list[torch.Generator]:
        """The torch generators, in the state every draw so far has left them in."""
        with _LOCK:
            if self._states is not None:
                for g, st in zip(self._gens, self._states):
                    g.set_state(st.clone())  # a row view would crash set_state (it reads from the storage's start)
                self._states = None
        return self._gens

    def states(self) -> Tensor:
        """Each generator's state bytes, ``[K, bytes]`` (what a resume file stores)."""
        return _stacked_states(self.generators())

    def load(self, states: Tensor) -> None:
        """Put each generator in a stored state (:meth:`states`): all of them, or none where one is refused."""
        if not isinstance(states, Tensor) or states.dtype != torch.uint8 or states.ndim != 2:
            raise ValueError(f"generator states must be a [K, bytes] uint8 tensor, got {_describe(states)}")
        if states.shape[0] != len(self._gens):
            raise ValueError(f"got {states.shape[0]} generator states for {len(self._gens)} generators")
        before = [g.get_state() for g in self.generators()]
        try:
            for g, st in zip(self._gens, states):
                g.set_state(st.clone())
        except RuntimeError as e:
            for g, st in zip(self._gens, before):
                g.set_state(st)
            raise ValueError(f"a generator state was refused, none loaded: {e}") from None

    def masks(
        self, shape: Sequence[int], p: float | Tensor, *, replay: bool = True, out: Tensor | None = None
    ) -> Float[Tensor, "K ..."]:
        """Each generator's dropout multipliers for a tensor of ``shape``, what ``F.dropout`` multiplies by on the
        CPU: ``[K, *shape]``, row k equal to ``torch.empty(shape).bernoulli_(1 - p, generator=g_k).div_(1 - p)``
        for 0 < p < 1; ones (p = 0) or zeros (p = 1) with no draw, as ``F.dropout`` draws none. By the C replay
        where :func:`replay_status` allows and torch's default dtype is float32 (the replay writes float32), unless
        ``replay=False``; else by ``bernoulli_``. ``out``: a contiguous CPU tensor of torch's default dtype and
        shape ``[K, *shape]`` to write them into (and return), e.g. a buffer kept from step to step: a new tensor
        of a few MB is mapped afresh from the system at each call, and faulting its pages in costs more than the
        draws."""
        shape, p = checked_shape(shape), checked_probability(p)
        K, n = len(self._gens), math.prod(shape)
        if out is not None:
            _check_out(out, (K, *shape))
        if p in (0, 1) or n == 0:
            if out is None:
                return torch.full((K, *shape), 1.0 - p, device="cpu")
            return out.fill_(1.0 - p)
        with _LOCK:
            if not replay or replay_status() != "replay" or torch.get_default_dtype() != torch.float32:
                out = torch.empty(K, *shape, device="cpu") if out is None else out
                for m, g in enumerate(self.generators()):
                    out[m].bernoulli_(1 - p, generator=g)
                return out.div_(1 - p)
            if self._states is None:
                self._states = _stacked_states(self._gens)
            return _replay(self._states, n, p, None if out is None else out.view(K, n)).view(K, *shape)


def _check_out(out, shape: tuple[int, ...]) -> None:
    """A ValueError unless ``out`` is a contiguous CPU tensor of torch's default dtype and ``shape`` (the masks'
    ``out``: the replay writes it as one dense block)."""
    ok = (
        isinstance(out, Tensor)
        and out.device.type == "cpu"
        and out.dtype == torch.get_default_dtype()
        and tuple(out.shape) == shape
        and out.is_contiguous()
    )
    if not ok:
        raise ValueError(
            f"out must be a contiguous CPU {torch.get_default_dtype()} tensor of shape {list(shape)}; got "
            f"{_describe(out)}" + ("" if not isinstance(out, Tensor) or out.is_contiguous() else " (not contiguous)")
        )


def mask_from(
    gen: torch.Generator, shape: Sequence[int], p: float | Tensor, *, replay: bool = True
) -> Float[Tensor, ...]:
    """One generator's :meth:`DropoutGenerators.masks`, its state written back before any other thread's replay
    reads it."""
    with _LOCK:
        one = DropoutGenerators([gen])
        mask = one.masks(shape, p, replay=replay)[0]
        one.generators()
    return mask


def _stacked_states(gens: Sequence[torch.Generator]) -> Tensor:
    """The generators' state bytes as one ``[K, bytes]`` tensor (K may be 0)."""
    return torch.stack([g.get_state() for g in gens]) if gens else torch.empty(0, _STATE_BYTES, dtype=torch.uint8)


def _describe(x) -> str:
    return f"a {x.dtype} tensor of shape {list(x.shape)}" if isinstance(x, Tensor) else type(x).__name__
