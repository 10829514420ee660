"""Causal softmax attention of one layer's queries over their sentence in C: the scores, softmax and weighted inputs
of each sentence in one pass, forward and backward, for the per-position forward (:mod:`interp.position_forward`).

That forward folds every head's query into ``W_K`` (``u = q W_K^T / scale``), so a sentence's attention is a
``[rows, d_model] @ [d_model, pos]`` product, a softmax over each row's keys and a ``[rows, pos] @ [pos, d_model]``
product (rows: query x head). Under torch these are batched products of a few dozen rows each (MKL runs them at
about a third of the machine's rate), a ``-inf`` mask of the hidden keys, the softmax and their backward, each a
pass over ``[rows, pos]`` in memory. Here a sentence goes through all of it at once, its scores in L1, the rows as
vectors of 8 floats (so the softmax's max and sum over keys are vertical), and only the keys each query sees are
visited (positions up to the query's own; the rest of a padded width is skipped).

The key bias ``b_K`` does not enter: under softmax it adds one constant to every score of a query, which the softmax
removes, so its exact gradient is zero (:func:`interp.training.inert_parameters`). Float32 throughout; the sums run
in another order than torch's, so the results equal the torch forward's to float32 rounding (the self-check,
:func:`shape_status`, holds them within 1e-5 relative of a float64 reference before a population uses the kernel).
Built with the machine's C compiler (:func:`interp.native.build`); the CPU only; first derivatives only. Where no
compiler builds it or its check fails, the torch forward is used.
"""

from __future__ import annotations

import ctypes
import functools
import warnings

import torch
from jaxtyping import Float, Int
from torch import Tensor

from .errors import InterpError
from .native import VECTORS, build, pointer, unfilled

# the most rows (query x head) per sentence and the widest d_model the kernel takes: its per-sentence arrays live on
# the C stack (2 x rows x d_model floats) and its accumulators in vector registers
MAX_ROWS, MAX_D = 64, 512

_SOURCE = (
    r"""
#include <math.h>
#include <stdint.h>
#include <string.h>
#ifdef __cplusplus
#define restrict __restrict__
extern "C" {
#endif
/* Compile-time shapes (built once per shape): R rows per sentence (KQ queries x R / KQ heads, row r = j (R / KQ) + h)
   and D = d_model, both multiples of 8. Positions are the runtime T. */
"""
    + VECTORS
    + r"""
#define RV (R / 8)
#define DV (D / 8)
#define HQ (R / KQ)
static inline v8 bc(float a) { return (v8){0} + a; }
static inline v8 sel(i8 m, v8 a, v8 b) { return (v8)(((i8)a & m) | ((i8)b & ~m)); }
/* each row's key count (its query's position + 1, at most T) and the largest */
static int64_t lengths(const int64_t *restrict qp, int64_t T, i8 len[RV]) {
  int32_t l[R];
  int64_t L = 0;
  for (int r = 0; r < R; r++) {
    int64_t q = qp[r / HQ] + 1;
    q = q < 0 ? 0 : (q > T ? T : q);
    l[r] = (int32_t)q;
    L = q > L ? q : L;
  }
  memcpy(len, l, sizeof l);
  return L;
}
#define BLOCK(NV) ((NV) >= 12 ? 1 : 12 / (NV))
/* out[a][:] = sum_c A[a sa + c sc] M[c][:] (plus the same of A2 and M2 where A2 is not NULL) for the B rows a0 .. a0 +
   B - 1 of out, whose rows (and M's) are NV vectors: the B x NV sums stay in registers (12 of them where NV allows,
   enough independent chains to keep both FMA units busy) while c runs */
static inline __attribute__((always_inline)) void combine(const int B, const int NV, const int64_t a0,
                                                          const int64_t nc, const float *restrict A, const int64_t sa,
                                                          const int64_t sc, const float *restrict M,
                                                          const float *restrict A2, const float *restrict M2,
                                                          float *restrict out) {
  v8 acc[64], m[64];
  for (int k = 0; k < B * NV; k++) acc[k] = (v8){0};
  for (int64_t c = 0; c < nc; c++) {
    for (int v = 0; v < NV; v++) m[v] = ld(M + (c * NV + v) * 8);
    for (int j = 0; j < B; j++) {
      const v8 f = bc(A[(a0 + j) * sa + c * sc]);
      for (int v = 0; v < NV; v++) acc[j * NV + v] += f * m[v];
    }
  }
  if (A2)
    for (int64_t c = 0; c < nc; c++) {
      for (int v = 0; v < NV; v++) m[v] = ld(M2 + (c * NV + v) * 8);
      for (int j = 0; j < B; j++) {
        const v8 f = bc(A2[(a0 + j) * sa + c * sc]);
        for (int v = 0; v < NV; v++) acc[j * NV + v] += f * m[v];
      }
    }
  for (int j = 0; j < B; j++)
    for (int v = 0; v < NV; v++) st(out + ((a0 + j) * NV + v) * 8, acc[j * NV + v]);
}
/* combine for the rows 0 .. na - 1 of out */
static inline __attribute__((always_inline)) void combine_rows(const int NV, const int64_t na, const int64_t nc,
                                                               const float *restrict A, const int64_t sa,
                                                               const int64_t sc, const float *restrict M,
                                                               const float *restrict A2, const float *restrict M2,
                                                               float *restrict out) {
  int64_t a = 0;
  for (; a + BLOCK(NV) <= na; a += BLOCK(NV)) combine(BLOCK(NV), NV, a, nc, A, sa, sc, M, A2, M2, out);
  for (; a < na; a++) combine(1, NV, a, nc, A, sa, sc, M, A2, M2, out);
}
static void transpose(const float *restrict a, float *restrict b) { /* a [R][D] -> b [D][R] */
  for (int r = 0; r < R; r++)
    for (int i = 0; i < D; i++) b[i * R + r] = a[r * D + i];
}
/* out[t][r] = sum_i x[t][i] a[r][i] for the keys t < L of a sentence (a: [R][D], rows of the queries or of their
   gradient), and each row's key count (len); returns L, the most keys any row has */
static int64_t against_keys(const float *restrict a, const float *restrict x, const int64_t *restrict qp, int64_t T,
                            i8 len[RV], float *restrict out) {
  float aT[D * R];
  const int64_t L = lengths(qp, T, len);
  transpose(a, aT);
  combine_rows(RV, L, D, x, D, 1, aT, NULL, NULL, out);
  return L;
}
/* Forward, per sentence s of n: scores of each row's query against its keys (t <= its query's position), the
   softmax over them (P [T][R], zero past each row's keys) and the weighted inputs y [R][D]. u [R][D] (the queries
   folded into W_K, scaled), x [T][D] (the normalised residual stream), qpos [KQ]. */
void attend(int64_t n, int64_t T, const float *restrict u, const float *restrict x, const int64_t *restrict qpos,
            float *restrict P, float *restrict y) {
  for (int64_t s = 0; s < n; s++) {
    const float *us = u + s * R * D, *xs = x + s * T * D;
    float *Ps = P + s * T * R;
    i8 len[RV];
    const int64_t L = against_keys(us, xs, qpos + s * KQ, T, len, Ps); /* scores [t][r] */
    for (int v = 0; v < RV; v++) {
      v8 m = bc(-3.0e38f), sum = (v8){0};
      for (int64_t t = 0; t < L; t++) {
        const v8 c = ld(Ps + t * R + v * 8);
        m = sel(((i8){0} + (int32_t)t < len[v]) & (c > m), c, m);
      }
      for (int64_t t = 0; t < L; t++) {
        const i8 ok = (i8){0} + (int32_t)t < len[v];
        const v8 e = (v8)((i8)exp8(sel(ok, ld(Ps + t * R + v * 8) - m, bc(-100.0f))) & ok);
        sum += e;
        st(Ps + t * R + v * 8, e);
      }
      const v8 inv = 1.0f / sum;
      for (int64_t t = 0; t < L; t++) st(Ps + t * R + v * 8, ld(Ps + t * R + v * 8) * inv);
    }
    memset(Ps + L * R, 0, sizeof(float) * (T - L) * R);
    combine_rows(DV, R, L, Ps, 1, R, xs, NULL, NULL, y + s * R * D); /* y [r][i] = sum_t P[t][r] x[t][i] */
  }
}
/* Backward, per sentence: from gy [R][D] (the gradient of y), the gradients of u and x (gu [R][D], gx [T][D]) through
   the softmax (dS = P (dP - sum_t P dP), dP = gy x^T). work: T R floats. */
void attend_backward(int64_t n, int64_t T, const float *restrict u, const float *restrict x,
                     const int64_t *restrict qpos, const float *restrict P, const float *restrict gy,
                     float *restrict gu, float *restrict gx, float *restrict work) {
  for (int64_t s = 0; s < n; s++) {
    const float *us = u + s * R * D, *xs = x + s * T * D, *Ps = P + s * T * R, *gys = gy + s * R * D;
    float *gxs = gx + s * T * D;
    i8 len[RV];
    const int64_t L = against_keys(gys, xs, qpos + s * KQ, T, len, work); /* dP [t][r] */
    for (int v = 0; v < RV; v++) {
      v8 c = (v8){0};
      for (int64_t t = 0; t < L; t++) c += ld(Ps + t * R + v * 8) * ld(work + t * R + v * 8);
      for (int64_t t = 0; t < L; t++)
        st(work + t * R + v * 8, ld(Ps + t * R + v * 8) * (ld(work + t * R + v * 8) - c));
    }
    combine_rows(DV, R, L, work, 1, R, xs, NULL, NULL, gu + s * R * D); /* gu [r][i] = sum_t dS[t][r] x[t][i] */
    combine_rows(DV, L, R, work, R, 1, us, Ps, gys, gxs); /* gx [t][i] = sum_r dS[t][r] u[r][i] + P[t][r] gy[r][i] */
    memset(gxs + L * D, 0, sizeof(float) * (T - L) * D);
  }
}
#ifdef __cplusplus
}
#endif
"""
)


@functools.cache
def library(R: int, D: int, KQ: int) -> ctypes.CDLL:
    """The kernel built for ``R`` rows of ``KQ`` queries and ``D`` = d_model; ``OSError`` saying why where no
    compiler builds it."""
    lib = build(f"#define R {R}\n#define D {D}\n#define KQ {KQ}\n" + _SOURCE, "attend")
    i64, ptr = ctypes.c_int64, ctypes.c_void_p
    lib.attend.argtypes = [i64, i64] + [ptr] * 5
    lib.attend_backward.argtypes = [i64, i64] + [ptr] * 8
    lib.attend.restype = lib.attend_backward.restype = None
    return lib


def shape_supported(rows: int, d_model: int, queries: int) -> bool:
    """Whether the kernel takes ``rows`` (query x head) per sentence of ``queries`` queries at this d_model."""
    return (
        0 < rows <= MAX_ROWS
        and rows % 8 == 0
        and 0 < d_model <= MAX_D
        and d_model % 8 == 0
        and queries > 0
        and rows % queries == 0
    )


def _check(u: Tensor, x: Tensor, qpos: Tensor) -> None:
    """Refuse what the kernel cannot take, naming it (never a wrong number from C)."""
    if u.ndim != 3 or x.ndim != 3 or qpos.ndim != 2:
        raise InterpError(
            f"the C attention takes u [n, rows, d_model], x [n, pos, d_model] and qpos [n, queries]; got shapes "
            f"{list(u.shape)}, {list(x.shape)} and {list(qpos.shape)}"
        )
    (n, R, D), T, KQ = u.shape, x.shape[1], qpos.shape[1]
    if T == 0:
        raise InterpError(f"the C attention needs at least one position; x has none (shape {list(x.shape)})")
    if x.shape[0] != n or x.shape[2] != D or qpos.shape[0] != n:
        raise InterpError(
            f"the C attention's inputs disagree: u {list(u.shape)}, x {list(x.shape)}, qpos {list(qpos.shape)}"
        )
    if not shape_supported(R, D, KQ):
        raise InterpError(
            f"the C attention takes rows and d_model multiples of 8 (at most {MAX_ROWS} and {MAX_D}) and rows a "
            f"multiple of the queries; got {R} rows, d_model {D}, {KQ} queries"
        )
    for name, t in (("u", u), ("x", x)):
        if t.device.type != "cpu" or t.dtype != torch.float32:
            raise InterpError(f"the C attention takes {name} as a float32 CPU tensor; got {t.dtype} on {t.device}")
    if qpos.device.type != "cpu" or qpos.dtype != torch.int64:
        raise InterpError(f"qpos must be an int64 CPU tensor; got {qpos.dtype} on {qpos.device}")
    if qpos.numel():
        low, high = (int(v) for v in torch.aminmax(qpos))
        if low < 0 or high >= T:
            raise InterpError(f"qpos must lie in 0..{T - 1} (the positions); got values {low}..{high}")


@torch.library.custom_op(
    "interp::attend", mutates_args=(), schema="(Tensor u, Tensor x, Tensor qpos) -> (Tensor, Tensor)"
)
def _attend(u: Tensor, x: Tensor, qpos: Tensor) -> tuple[Tensor, Tensor]:
    """``(y, P)``: the weighted inputs ``[n, rows, d_model]`` and the pattern ``[n, pos, rows]`` (kept for the
    backward; not differentiable). Keys after a row's query are never read, so a NaN there does not reach the row,
    where torch's masked product (``0 x NaN``) would."""
    _check(u, x, qpos)
    u, x, qpos = u.contiguous(), x.contiguous(), qpos.contiguous()
    (n, R, D), T = u.shape, x.shape[1]
    with unfilled():
        y, P = u.new_empty(n, R, D), u.new_empty(n, T, R)
    if n:  # T >= 1 (checked); with no sentence both outputs are empty
        library(R, D, qpos.shape[1]).attend(n, T, *(pointer(t) for t in (u, x, qpos, P, y)))
    return y, P


@_attend.register_fake
def _(u, x, qpos):
    return u.new_empty(u.shape), u.new_empty(u.shape[0], x.shape[1], u.shape[1])


@torch.library.custom_op(
    "interp::attend_backward",
    mutates_args=(),
    schema="(Tensor u, Tensor x, Tensor qpos, Tensor P, Tensor gy) -> (Tensor, Tensor)",
)
def _attend_backward(u: Tensor, x: Tensor, qpos: Tensor, P: Tensor, gy: Tensor) -> tuple[Tensor, Tensor]:
    """The gradients of ``u`` and ``x`` for the gradient ``gy`` of :func:`_attend`'s ``y``, from its pattern ``P``
    (contiguous whatever the inputs' layout: the fake implementation below says so to compiled code)."""
    _check(u, x, qpos)
    (n, R, D), T = u.shape, x.shape[1]
    for name, t, shape in (("P", P, (n, T, R)), ("gy", gy, (n, R, D))):
        if t.device.type != "cpu" or t.dtype != torch.float32 or tuple(t.shape) != shape:
            raise InterpError(
                f"the C attention's backward takes {name} as a float32 CPU tensor of shape {list(shape)}; got "
                f"{t.dtype} on {t.device}, shape {list(t.shape)}"
            )
    u, x, qpos, P, gy = u.contiguous(), x.contiguous(), qpos.contiguous(), P.contiguous(), gy.contiguous()
    with unfilled():
        gu, gx, work = u.new_empty(u.shape), x.new_empty(x.shape), u.new_empty(T * R)
    if n:  # T >= 1 (checked); with no sentence both gradients are empty
        library(R, D, qpos.shape[1]).attend_backward(n, T, *(pointer(t) for t in (u, x, qpos, P, gy, gu, gx, work)))
    return gu, gx


@_attend_backward.register_fake
def _(u, x, qpos, P, gy):
    return u.new_empty(u.shape), x.new_empty(x.shape)  # contiguous, as the kernel's


def _setup_context(ctx, inputs, output):
    ctx.save_for_backward(*inputs, output[1])
    ctx.mark_non_differentiable(output[1])  # the pattern is kept for the backward, not a result to differentiate


def _backward(ctx, gy, _gP):
    u, x, qpos, P = ctx.saved_tensors
    if gy is None:
        return None, None, None
    gu, gx = _attend_backward(u, x, qpos, P, gy)
    return gu, gx, None


_attend.register_autograd(_backward, setup_context=_setup_context)


def weighted_inputs(
    u: Float[Tensor, "n rows d_model"], x: Float[Tensor, "n pos d_model"], qpos: Int[Tensor, "n queries"]
) -> Float[Tensor, "n rows d_model"]:
    """``softmax(u x^T) x`` per sentence, each row's softmax over the positions up to its query's (row ``r`` is
    query ``r // (rows // queries)``): the attention-weighted inputs of the per-position forward, differentiable with
    respect to ``u`` and ``x``."""
    return _weighted(u, x, qpos)


def _weighted(u: Tensor, x: Tensor, qpos: Tensor) -> Tensor:
    """:func:`weighted_inputs` unannotated: what compiled code calls (jaxtyping's test-time checks of annotated
    functions are not traced by ``torch.compile``)."""
    return _attend(u, x, qpos)[0]


def _reference(u: Tensor, x: Tensor, qpos: Tensor) -> Tensor:
    """The kernel's arithmetic in plain torch (float64 where given float64): the self-check's reference."""
    heads = u.shape[1] // qpos.shape[1]
    hidden = torch.arange(x.shape[1])[None, None, :] > qpos.repeat_interleave(heads, 1)[..., None]
    scores = torch.bmm(u, x.transpose(1, 2)).masked_fill(hidden, float("-inf"))
    return torch.bmm(scores.softmax(-1), x)


@functools.cache
def shape_status(R: int, D: int, KQ: int) -> str:
    """``"c"`` where the kernel of this shape builds here and agrees with its float64 reference (:func:`_reference`)
    on a small random problem (the weighted inputs and both gradients within 1e-5 of their largest value, for a
    random upstream gradient; widths with and without an odd tail of keys), else why not, with a warning, once per
    shape: the caller then uses the torch forward."""
    if not shape_supported(R, D, KQ):
        return f"the C attention does not take this shape ({R} rows of {KQ} queries, d_model {D})"
    why = "c"
    g = torch.Generator().manual_seed(0)
    for T in (7, 12):
        if why != "c":
            break
        u = torch.randn(5, R, D, generator=g) / D**0.25
        x = torch.randn(5, T, D, generator=g)
        qpos = torch.randint(0, T, (5, KQ), generator=g)
        qpos[0] = T - 1
        gy = torch.randn(5, R, D, generator=g)
        got, want = [], []
        for into, dtype, fn in ((got, torch.float32, _weighted), (want, torch.float64, _reference)):
            leaves = [v.to(dtype).clone().requires_grad_() for v in (u, x)]
            try:
                y = fn(*leaves, qpos)
            except OSError as err:
                why = f"no C compiler built it ({err})"
                break
            y.backward(gy.to(dtype))
            into += [y.detach().double(), leaves[0].grad.double(), leaves[1].grad.double()]
        for name, a, b in zip(("weighted inputs", "gradient of u", "gradient of x"), got, want):
            gap = float((a - b).abs().max() / b.abs().max().clamp_min(1e-30))
            if why == "c" and not gap <= 1e-5:
                why = f"the C attention differs from its reference here ({name}: {gap:.1e} apart)"
    if why != "c":
        warnings.warn(f"attention by torch's products: {why}", RuntimeWarning, stacklevel=2)
    return why


def usable(rows: int, d_model: int, queries: int, device: torch.device | str, dtype: torch.dtype) -> bool:
    """Whether :func:`weighted_inputs` takes sentences of ``rows`` (query x head) of ``queries`` queries at this
    d_model, ``dtype`` and ``device`` here: float32 on the CPU, a shape the kernel takes (others go through torch's
    products without a word), and the kernel of that shape built and checked (:func:`shape_status`, which warns
    where not). Decided outside compiled code: the check builds C and runs it."""
    return (
        torch.device(device).type == "cpu"
        and dtype == torch.float32
        and shape_supported(rows, d_model, queries)
        and shape_status(rows, d_model, queries) == "c"
    )
