"""The token-count training step's rows in C: every model's losses and their gradients in one pass over its rows.

A training step through the token-count forward in weights form (:func:`interp.population._weighted_count_logits`)
spends most of its time in batched matrix products whose inner or outer dimensions are tiny (d_head 2, one head
after halving, 8 output tokens, 3 query tokens): MKL runs each of the K models' small products apart, at a few
GFLOP/s, and every product writes its ``[K, rows, d_model]`` result to memory and reads it back. Here each row goes
through the whole step at once, its activations in registers and L1:

- forward: the row's weighted values and denominators from its counts and its query token's table (``both``), the
  attention output ``z`` (their ratio), ``out = z W_O + b_O`` (or ``z + b_O`` under an identity W_O), dropout's
  mask, the logits ``TE[query] + b_U + W_U^T (mask * out)`` (``TE = W_E[queries] W_U``: without a LayerNorm the
  query's own embedding enters the logits linearly, so it is folded into a ``[query token, vocab]`` table), the
  cross-entropy;
- backward, in the same pass: every parameter's gradient for a unit gradient of each model's mean loss, accumulated
  over the rows (the upstream gradient only scales them, :class:`CountStep`).

The tables themselves (``table``, ``TE``) are made from the parameters in C too, with softmax pooling
(:func:`count_tables_native`: the projections of the query and present tokens, the scores, their weights, and in
the backward every gradient back to ``W_E``, ``W_Q``, ``W_K``, ``W_V``, their biases and ``W_U``). In torch they
are a dozen batched products of a hundred tiny matrices per step: forward and backward of 100 models at d_model 32
measured 1.28 ms a step compiled, against 0.78 ms here (autograd's bookkeeping included in both). Each parameter is
read where a population's flat buffer keeps it (:data:`TABLE_LAYOUTS`): copying the strided views out first cost
more than the tables themselves (0.30 ms a step). Additive pooling keeps its tables in torch.

Float32 throughout, as the torch step; the sums run in another order, so the losses and gradients equal the torch
step's to float32 rounding (the self-check, :func:`status`, holds them within 1e-5 relative before the population
uses the kernel). Built with the machine's C compiler (:func:`interp.native.build`); the CPU only; where no compiler
builds it or the self-check fails, the torch step is used.
"""

from __future__ import annotations

import ctypes
import functools

import torch
from jaxtyping import Bool, Float, Int
from torch import Tensor
from torch.autograd.function import once_differentiable

from .errors import InterpError
from .native import VECTORS, build, pointer

_SOURCE = (
    r"""
#include <math.h>
#include <stdint.h>
#include <string.h>
#ifdef __cplusplus
#define restrict __restrict__
extern "C" {
#endif
/* The shapes are compile-time constants (the source is built once per shape): Q query tokens, Vp present tokens, H
   heads of e columns, d = d_model and Vo output tokens, both multiples of 8 (vectors of 8 floats: DV and VV of
   them), IDENTITY (1: no W_O, H e = d). A row's activations live in vector registers: accumulating into arrays in
   memory instead makes each sum a chain of stores and reloads (measured 2x slower). */
#define HE (H * e)
#define J (HE + H)
#define DV (d / 8)
#define VV (Vo / 8)
#define IB (HE % 2 == 0 && DV <= 4 ? 2 : 1) /* rows of W_O's gradient summed at once */
#define RB 8 /* rows in flight at once (rows below) */
"""
    + VECTORS
    + r"""
static const i8 IOTA = {0, 1, 2, 3, 4, 5, 6, 7}; /* each lane's place in its vector */
#if defined(__clang__) || __GNUC__ >= 12
#define SWAP(x, a, b, c, d, e, f, g, h) __builtin_shufflevector(x, x, a, b, c, d, e, f, g, h)
#else
#define SWAP(x, a, b, c, d, e, f, g, h) __builtin_shuffle(x, (i8){a, b, c, d, e, f, g, h})
#endif
/* the larger of each pair of lanes, and the largest lane (max is exact: any order gives the same number) */
static inline v8 vmax(v8 a, v8 b) { const i8 gt = a > b; return (v8)(((i8)a & gt) | ((i8)b & ~gt)); }
static inline float hmax(v8 x) {
  x = vmax(x, SWAP(x, 4, 5, 6, 7, 0, 1, 2, 3));
  x = vmax(x, SWAP(x, 2, 3, 0, 1, 6, 7, 4, 5));
  x = vmax(x, SWAP(x, 1, 0, 3, 2, 5, 4, 7, 6));
  return x[0];
}
/* Rows n0 .. n0 + R - 1 of model k, their losses added to total and prod, their gradients to the g* buffers and
   their activations kept in A, G, Z, GO for the outer products after the rows. Each stage runs over the R rows
   before the next: a row is one long chain of dependent operations (from its counts to its table's gradient), the
   rows' chains are independent, and so the core overlaps them; one row at a time it waits on each stage's latency
   (measured 1.6-1.7x slower at R = 1 than at R = 8, on d_model 8 and 32). Every sum over rows still adds the rows in
   order. */
static inline __attribute__((always_inline)) void rows(
    const int R, const int64_t k, const int64_t n0, const int64_t N, const float invN, const float *restrict T,
    const float *restrict WO, const float *restrict bO, const float *restrict TEk, const float *restrict WU,
    const float *restrict WUt, const float *restrict bU, const int64_t *restrict qidx, const float *restrict counts,
    const float *restrict mask, const int64_t *restrict targets, float *restrict gT, float *restrict gbO,
    float *restrict gTE, float *restrict gbU, float *restrict A, float *restrict G, float *restrict Z,
    float *restrict GO, double *total, double *prod) {
  int64_t q[R], t[R];
  const float *c[R], *m[R], *Tq[R];
  float both[R][J], z[R][HE], a[R][d], gl[R][Vo], gz[R][HE], gboth[R][J], mx[R], sum[R], lt[R];
  v8 out[R][DV], lg[R][VV], ga[R][DV];
  for (int r = 0; r < R; r++) {
    const int64_t row = k * N + n0 + r;
    q[r] = qidx[row];
    t[r] = targets[row];
    c[r] = counts + row * Vp;
    m[r] = mask ? mask + row * d : NULL;
    Tq[r] = T + q[r] * Vp * J;
  }
  /* forward: each head's weighted values and denominator, its output z, out = z W_O + b_O, the mask */
  for (int r = 0; r < R; r++) {
    for (int64_t j = 0; j < J; j++) both[r][j] = 0.0f;
    for (int64_t v = 0; v < Vp; v++) /* zero counts too: exact (0 x a finite entry), and no unpredictable branch */
      for (int64_t j = 0; j < J; j++) both[r][j] += c[r][v] * Tq[r][v * J + j];
  }
  for (int r = 0; r < R; r++)
    for (int64_t h = 0; h < H; h++)
      for (int64_t i = 0; i < e; i++) z[r][h * e + i] = both[r][h * e + i] / both[r][HE + h];
  for (int r = 0; r < R; r++) {
    for (int u = 0; u < DV; u++) out[r][u] = IDENTITY ? ld(z[r] + 8 * u) + ld(bO + 8 * u) : ld(bO + 8 * u);
    if (!IDENTITY)
      for (int64_t i = 0; i < HE; i++)
        for (int u = 0; u < DV; u++) out[r][u] += z[r][i] * ld(WO + i * d + 8 * u);
    for (int u = 0; u < DV; u++) st(a[r] + 8 * u, m[r] ? out[r][u] * ld(m[r] + 8 * u) : out[r][u]);
  }
  /* the logits TE[q] + b_U + W_U^T a, four accumulators per vector (no chain of dependent additions) */
  for (int r = 0; r < R; r++)
    for (int w = 0; w < VV; w++) {
      v8 l0 = {0}, l1 = {0}, l2 = {0}, l3 = {0};
      for (int64_t j = 0; j < d; j += 4) {
        l0 += a[r][j] * ld(WU + j * Vo + 8 * w);
        l1 += a[r][j + 1] * ld(WU + (j + 1) * Vo + 8 * w);
        l2 += a[r][j + 2] * ld(WU + (j + 2) * Vo + 8 * w);
        l3 += a[r][j + 3] * ld(WU + (j + 3) * Vo + 8 * w);
      }
      lg[r][w] = ((l0 + l1) + (l2 + l3)) + (ld(TEk + q[r] * Vo + 8 * w) + ld(bU + 8 * w));
    }
  v8 pv[R][VV];
  for (int r = 0; r < R; r++) {
    v8 mv = lg[r][0];
    for (int w = 1; w < VV; w++) mv = vmax(mv, lg[r][w]);
    mx[r] = hmax(mv);
    lt[r] = lg[r][t[r] / 8][t[r] % 8]; /* the target's logit */
    v8 sv = {0};
    for (int w = 0; w < VV; w++) {
      pv[r][w] = exp8(lg[r][w] - mx[r]);
      sv += pv[r][w];
    }
    sum[r] = hsum(sv);
  }
  /* the loss sums mx - logit[t] + log(sum) over the rows; the sums (each in [1, Vo]: the largest term is exp(0))
     are multiplied in double and their log taken once the product nears double's range, not once per row */
  for (int r = 0; r < R; r++) {
    *total += (double)(mx[r] - lt[r]);
    *prod *= (double)sum[r];
    if (*prod > 1e280) {
      *total += log(*prod);
      *prod = 1.0;
    }
  }
  /* backward: the gradient of this model's mean loss, softmax minus the target, over N */
  for (int r = 0; r < R; r++) {
    const float scale = invN / sum[r];
    for (int w = 0; w < VV; w++) {
      const i8 hit = (IOTA + 8 * w) == (int32_t)t[r];
      const v8 g = pv[r][w] * scale - (v8)((i8)(invN + (v8){0}) & hit);
      st(gl[r] + 8 * w, g);
      st(gTE + q[r] * Vo + 8 * w, ld(gTE + q[r] * Vo + 8 * w) + g);
      st(gbU + 8 * w, ld(gbU + 8 * w) + g);
    }
    memcpy(A + (n0 + r) * d, a[r], sizeof(float) * d); /* W_U's gradient sums a x gl over the rows: after them */
    memcpy(G + (n0 + r) * Vo, gl[r], sizeof(float) * Vo);
  }
  for (int r = 0; r < R; r++) {
    for (int u = 0; u < DV; u++) ga[r][u] = (v8){0};
    for (int64_t v = 0; v < Vo; v++)
      for (int u = 0; u < DV; u++) ga[r][u] += gl[r][v] * ld(WUt + v * d + 8 * u);
  }
  for (int r = 0; r < R; r++)
    for (int u = 0; u < DV; u++) {
      if (m[r]) ga[r][u] *= ld(m[r] + 8 * u); /* now the gradient of out */
      st(gbO + 8 * u, ld(gbO + 8 * u) + ga[r][u]);
    }
  for (int r = 0; r < R; r++) {
    if (IDENTITY) {
      for (int u = 0; u < DV; u++) st(gz[r] + 8 * u, ga[r][u]);
    } else {
      for (int64_t i = 0; i < HE; i++) {
        v8 s = {0};
        for (int u = 0; u < DV; u++) s += ld(WO + i * d + 8 * u) * ga[r][u];
        gz[r][i] = hsum(s);
      }
      memcpy(Z + (n0 + r) * HE, z[r], sizeof(float) * HE); /* W_O's gradient sums z x gout over the rows */
      for (int u = 0; u < DV; u++) st(GO + (n0 + r) * d + 8 * u, ga[r][u]);
    }
  }
  /* through the ratio z = values / denominator, into the table */
  for (int r = 0; r < R; r++)
    for (int64_t h = 0; h < H; h++) {
      const float den = both[r][HE + h];
      float s = 0.0f;
      for (int64_t i = 0; i < e; i++) {
        gboth[r][h * e + i] = gz[r][h * e + i] / den;
        s += gz[r][h * e + i] * z[r][h * e + i];
      }
      gboth[r][HE + h] = -s / den;
    }
  for (int r = 0; r < R; r++) {
    float *gTq = gT + q[r] * Vp * J;
    for (int64_t v = 0; v < Vp; v++)
      for (int64_t j = 0; j < J; j++) gTq[v * J + j] += c[r][v] * gboth[r][j];
  }
}

/* Each model k's mean cross-entropy over its N rows (losses[k]) and its gradient (into the g_* buffers, written
   whole). Per model: table [Q Vp][J] (each head's weighted values, then its denominator, per query token and present
   token), W_O [HE][d] (ignored under IDENTITY), b_O [d], TE [Q][Vo], W_U [d][Vo], W_Ut [Vo][d] (W_U transposed),
   b_U [Vo]; per row: qidx (the query token's place), counts [Vp], mask [d] (NULL: no dropout), target. work:
   N (2 d + Vo + HE) floats. */
void count_step(int64_t K, int64_t N, const float *restrict table, const float *restrict W_O,
                const float *restrict b_O, const float *restrict TE, const float *restrict W_U,
                const float *restrict W_Ut, const float *restrict b_U, const int64_t *restrict qidx,
                const float *restrict counts, const float *restrict mask, const int64_t *restrict targets,
                float *restrict losses, float *restrict g_table, float *restrict g_W_O, float *restrict g_b_O,
                float *restrict g_TE, float *restrict g_W_U, float *restrict g_b_U, float *restrict work) {
  const float invN = 1.0f / (float)N;
  float *restrict A = work, *restrict G = A + N * d, *restrict Z = G + N * Vo, *restrict GO = Z + N * HE;
  for (int64_t k = 0; k < K; k++) {
    const float *T = table + k * Q * Vp * J, *WO = W_O + (IDENTITY ? 0 : k * HE * d), *bO = b_O + k * d;
    const float *TEk = TE + k * Q * Vo, *WU = W_U + k * d * Vo, *WUt = W_Ut + k * Vo * d, *bU = b_U + k * Vo;
    float *gT = g_table + k * Q * Vp * J, *gWO = g_W_O + (IDENTITY ? 0 : k * HE * d), *gbO = g_b_O + k * d;
    float *gTE = g_TE + k * Q * Vo, *gWU = g_W_U + k * d * Vo, *gbU = g_b_U + k * Vo;
    memset(gT, 0, sizeof(float) * Q * Vp * J);
    memset(gbO, 0, sizeof(float) * d);
    memset(gTE, 0, sizeof(float) * Q * Vo);
    memset(gbU, 0, sizeof(float) * Vo);
    double total = 0.0, prod = 1.0;
    int64_t n = 0;
    for (; n + RB <= N; n += RB)
      rows(RB, k, n, N, invN, T, WO, bO, TEk, WU, WUt, bU, qidx, counts, mask, targets, gT, gbO, gTE, gbU, A, G, Z, GO,
           &total, &prod);
    for (; n < N; n++)
      rows(1, k, n, N, invN, T, WO, bO, TEk, WU, WUt, bU, qidx, counts, mask, targets, gT, gbO, gTE, gbU, A, G, Z, GO,
           &total, &prod);
    losses[k] = (float)((total + log(prod)) / (double)N);
    /* the outer products summed over the rows, blocks of each output held in registers while the rows stream by:
       8 rows of W_U's gradient (d is a multiple of 8), IB rows of W_O's */
    for (int64_t j = 0; j < d; j += 8)
      for (int w = 0; w < VV; w++) {
        v8 acc[8];
        for (int jj = 0; jj < 8; jj++) acc[jj] = (v8){0};
        for (int64_t n = 0; n < N; n++) {
          const v8 g = ld(G + n * Vo + 8 * w);
          for (int jj = 0; jj < 8; jj++) acc[jj] += A[n * d + j + jj] * g;
        }
        for (int jj = 0; jj < 8; jj++) st(gWU + (j + jj) * Vo + 8 * w, acc[jj]);
      }
    if (!IDENTITY)
      for (int64_t i = 0; i < HE; i += IB) {
        v8 acc[IB][DV];
        for (int ii = 0; ii < IB; ii++)
          for (int u = 0; u < DV; u++) acc[ii][u] = (v8){0};
        for (int64_t n = 0; n < N; n++)
          for (int u = 0; u < DV; u++) {
            const v8 g = ld(GO + n * d + 8 * u);
            for (int ii = 0; ii < IB; ii++) acc[ii][u] += Z[n * HE + i + ii] * g;
          }
        for (int ii = 0; ii < IB; ii++)
          for (int u = 0; u < DV; u++) st(gWO + (i + ii) * d + 8 * u, acc[ii][u]);
      }
  }
}
/* The weights form's tables from the parameters, and their gradients back to the parameters: what the torch step
   computes with a dozen small batched products per step (interp.population._native_tables), here one pass per model
   over data that fits in L1. Softmax pooling, no LayerNorm. Each parameter is read where it lies, model k at
   k x stride[i] (strides: W_E, W_Q, W_K, W_V, b_Q, b_K, b_V, W_U), in the layouts a population's flat buffer keeps:
   W_E [V][d], W_Q, W_K and W_V [d][HE] (heads x d_head on the last axis), biases [HE], W_U [Vo][d]. So every inner
   loop runs along a contiguous axis of constant length, which the compiler vectorises; the only sums across lanes
   are over d_head within a head, and TE's over d. Saved per model for the backward: X [Q + Vp][d] (the query
   tokens' embeddings, then the present tokens'), QKV (q [Q][HE], then keys and values [Vp][2 HE]) and EW
   [Q][Vp][HE] (each head's weight, repeated over its d_head columns). */
#define S_X ((Q + Vp) * d)
#define S_QKV ((Q + 2 * Vp) * HE)
#define S_EW (Q * Vp * HE)
#define SAVED (S_X + S_QKV + S_EW)
#define NS ((Q * Vp * H + 7) / 8 * 8) /* the scores, padded to whole vectors for exp8 */

/* Per model: table [Q Vp][J] and TE [Q][Vo] as count_step takes them, and saved [SAVED]; *inexact set to 1 where
   some model's head and query token has its best counted score (the query token itself, and the always-counted
   tokens) gap or more below its best score (the condition of interp.population.weights_are_exact), else left.
   work: NS floats. */
void count_tables(int64_t K, int64_t V, const float *restrict W_E, const float *restrict W_Q,
                  const float *restrict W_K, const float *restrict W_V, const float *restrict b_Q,
                  const float *restrict b_K, const float *restrict b_V, const float *restrict W_U,
                  const int64_t *restrict stride, const int64_t *restrict queries, const int64_t *restrict present,
                  const uint8_t *restrict always, const float scale, const float gap, float *restrict table,
                  float *restrict TE, float *restrict saved, int64_t *restrict inexact, float *restrict S) {
  for (int64_t k = 0; k < K; k++) {
    float *restrict X = saved + k * SAVED, *restrict QKV = X + S_X, *restrict EW = QKV + S_QKV;
    const float *E = W_E + k * stride[0], *WQ = W_Q + k * stride[1], *WK = W_K + k * stride[2];
    const float *WV = W_V + k * stride[3], *bQ = b_Q + k * stride[4], *bK = b_K + k * stride[5];
    const float *bV = b_V + k * stride[6], *UT = W_U + k * stride[7];
    for (int64_t i = 0; i < Q; i++) memcpy(X + i * d, E + queries[i] * d, sizeof(float) * d);
    for (int64_t p = 0; p < Vp; p++) memcpy(X + (Q + p) * d, E + present[p] * d, sizeof(float) * d);
    /* q = x W_Q + b_Q for each query token; keys and values for each present token (the bias added last, as torch) */
    for (int64_t i = 0; i < Q; i++) {
      float acc[HE] = {0};
      for (int64_t j = 0; j < d; j++)
        for (int64_t c = 0; c < HE; c++) acc[c] += X[i * d + j] * WQ[j * HE + c];
      for (int64_t c = 0; c < HE; c++) QKV[i * HE + c] = acc[c] + bQ[c];
    }
    for (int64_t p = 0; p < Vp; p++) {
      float ak[HE] = {0}, av[HE] = {0};
      for (int64_t j = 0; j < d; j++) {
        const float x = X[(Q + p) * d + j];
        for (int64_t c = 0; c < HE; c++) {
          ak[c] += x * WK[j * HE + c];
          av[c] += x * WV[j * HE + c];
        }
      }
      float *kv = QKV + Q * HE + p * 2 * HE;
      for (int64_t c = 0; c < HE; c++) {
        kv[c] = ak[c] + bK[c];
        kv[HE + c] = av[c] + bV[c];
      }
    }
    /* scores S [Q][Vp][H], each query token's best per head, the exactness condition, the weights exp(S - best) */
    for (int64_t i = 0; i < Q; i++)
      for (int64_t p = 0; p < Vp; p++) {
        const float *q = QKV + i * HE, *key = QKV + Q * HE + p * 2 * HE;
        float prod[HE];
        for (int64_t c = 0; c < HE; c++) prod[c] = q[c] * key[c];
        for (int64_t h = 0; h < H; h++) {
          float s = 0.0f;
          for (int64_t c = 0; c < e; c++) s += prod[h * e + c];
          S[(i * Vp + p) * H + h] = s / scale;
        }
      }
    for (int64_t t = Q * Vp * H; t < NS; t++) S[t] = 0.0f;
    for (int64_t i = 0; i < Q; i++) {
      float best[H], counted[H];
      for (int64_t h = 0; h < H; h++) best[h] = counted[h] = -INFINITY;
      for (int64_t p = 0; p < Vp; p++) {
        const int take = present[p] == queries[i] || always[p];
        for (int64_t h = 0; h < H; h++) {
          const float s = S[(i * Vp + p) * H + h];
          best[h] = s > best[h] ? s : best[h];
          if (take) counted[h] = s > counted[h] ? s : counted[h];
        }
      }
      for (int64_t h = 0; h < H; h++)
        if (!(counted[h] - best[h] > -gap)) *inexact = 1;
      for (int64_t p = 0; p < Vp; p++)
        for (int64_t h = 0; h < H; h++) S[(i * Vp + p) * H + h] -= best[h];
    }
    for (int64_t t = 0; t < NS; t += 8) st(S + t, exp8(ld(S + t)));
    /* the table: each head's values times its weight, then the weights */
    float *T = table + k * Q * Vp * J;
    for (int64_t i = 0; i < Q; i++)
      for (int64_t p = 0; p < Vp; p++) {
        const float *w = S + (i * Vp + p) * H, *val = QKV + Q * HE + p * 2 * HE + HE;
        float *ew = EW + (i * Vp + p) * HE, *row = T + (i * Vp + p) * J;
        for (int64_t h = 0; h < H; h++)
          for (int64_t c = 0; c < e; c++) ew[h * e + c] = w[h];
        for (int64_t c = 0; c < HE; c++) row[c] = ew[c] * val[c];
        for (int64_t h = 0; h < H; h++) row[HE + h] = w[h];
      }
    /* TE = W_E[queries] W_U: dot products along d (d a multiple of 8) */
    for (int64_t i = 0; i < Q; i++)
      for (int64_t o = 0; o < Vo; o++) {
        v8 acc = {0};
        for (int u = 0; u < d / 8; u++) acc += ld(X + i * d + 8 * u) * ld(UT + o * d + 8 * u);
        TE[(k * Q + i) * Vo + o] = hsum(acc);
      }
  }
}

/* The gradients of the parameters from those of table and TE (g_table, g_TE), with what count_tables saved and the
   parameters it read (W_Q, W_K, W_V, W_U where they lie, as there); every output written whole, contiguous per model
   in the parameters' layouts (g_W_E [V][d], zero where no query or present token reads it; g_W_Q, g_W_K, g_W_V
   [d][HE]; the biases' [HE]; g_W_U [Vo][d]). work: S_EW + 3 HE d + S_QKV floats. */
void count_tables_backward(int64_t K, int64_t V, const float *restrict W_Q, const float *restrict W_K,
                           const float *restrict W_V, const float *restrict W_U, const int64_t *restrict stride,
                           const float *restrict saved, const int64_t *restrict queries,
                           const int64_t *restrict present, const float scale, const float *restrict g_table,
                           const float *restrict g_TE, float *restrict g_W_E, float *restrict g_W_Q,
                           float *restrict g_W_K, float *restrict g_W_V, float *restrict g_b_Q,
                           float *restrict g_b_K, float *restrict g_b_V, float *restrict g_W_U,
                           float *restrict work) {
  for (int64_t k = 0; k < K; k++) {
    const float *X = saved + k * SAVED, *QKV = X + S_X, *EW = QKV + S_QKV;
    const float *WQ = W_Q + k * stride[1], *WK = W_K + k * stride[2], *WV = W_V + k * stride[3];
    const float *UT = W_U + k * stride[7];
    const float *gT = g_table + k * Q * Vp * J, *gTE = g_TE + k * Q * Vo;
    float *restrict GS = work, *restrict WB = GS + S_EW, *restrict GQKV = WB + d * 3 * HE;
    /* through the table: each value's gradient, and each score's (through exp(S - best); best is a constant) */
    memset(GQKV, 0, sizeof(float) * S_QKV);
    for (int64_t i = 0; i < Q; i++)
      for (int64_t p = 0; p < Vp; p++) {
        const float *g = gT + (i * Vp + p) * J, *ew = EW + (i * Vp + p) * HE;
        const float *val = QKV + Q * HE + p * 2 * HE + HE;
        float *gval = GQKV + Q * HE + p * 2 * HE + HE, *gs = GS + (i * Vp + p) * HE, prod[HE];
        for (int64_t c = 0; c < HE; c++) {
          gval[c] += g[c] * ew[c];
          prod[c] = g[c] * val[c];
        }
        for (int64_t h = 0; h < H; h++) {
          float s = g[HE + h];
          for (int64_t c = 0; c < e; c++) s += prod[h * e + c];
          s = s * ew[h * e] / scale;
          for (int64_t c = 0; c < e; c++) gs[h * e + c] = s;
        }
      }
    /* through the scores q . key: q's gradient and each key's */
    for (int64_t i = 0; i < Q; i++)
      for (int64_t p = 0; p < Vp; p++) {
        const float *gs = GS + (i * Vp + p) * HE, *q = QKV + i * HE, *key = QKV + Q * HE + p * 2 * HE;
        float *gq = GQKV + i * HE, *gkey = GQKV + Q * HE + p * 2 * HE;
        for (int64_t c = 0; c < HE; c++) {
          gq[c] += gs[c] * key[c];
          gkey[c] += gs[c] * q[c];
        }
      }
    /* the biases */
    float *gbQ = g_b_Q + k * HE, *gbK = g_b_K + k * HE, *gbV = g_b_V + k * HE;
    for (int64_t c = 0; c < HE; c++) gbQ[c] = gbK[c] = gbV[c] = 0.0f;
    for (int64_t i = 0; i < Q; i++)
      for (int64_t c = 0; c < HE; c++) gbQ[c] += GQKV[i * HE + c];
    for (int64_t p = 0; p < Vp; p++)
      for (int64_t c = 0; c < HE; c++) {
        gbK[c] += GQKV[Q * HE + p * 2 * HE + c];
        gbV[c] += GQKV[Q * HE + p * 2 * HE + HE + c];
      }
    /* W_Q, W_K, W_V: sums over the tokens of x^T times the projection's gradient */
    float *gWQ = g_W_Q + k * d * HE, *gWK = g_W_K + k * d * HE, *gWV = g_W_V + k * d * HE;
    for (int64_t j = 0; j < d; j++) {
      float aq[HE] = {0}, akv[2 * HE] = {0};
      for (int64_t i = 0; i < Q; i++)
        for (int64_t c = 0; c < HE; c++) aq[c] += X[i * d + j] * GQKV[i * HE + c];
      for (int64_t p = 0; p < Vp; p++)
        for (int64_t c = 0; c < 2 * HE; c++) akv[c] += X[(Q + p) * d + j] * GQKV[Q * HE + p * 2 * HE + c];
      memcpy(gWQ + j * HE, aq, sizeof(float) * HE);
      memcpy(gWK + j * HE, akv, sizeof(float) * HE);
      memcpy(gWV + j * HE, akv + HE, sizeof(float) * HE);
    }
    /* W_U from TE = x W_U, in W_U's layout [Vo][d] */
    float *gWU = g_W_U + k * Vo * d;
    for (int64_t o = 0; o < Vo; o++) {
      float acc[d] = {0};
      for (int64_t i = 0; i < Q; i++)
        for (int64_t j = 0; j < d; j++) acc[j] += gTE[i * Vo + o] * X[i * d + j];
      memcpy(gWU + o * d, acc, sizeof(float) * d);
    }
    /* W_E: each query token's row gets W_Q's and W_U's share, each present token's W_K's and W_V's (a token can be
       both), with W_Q, W_K and W_V transposed ([3 HE][d]: every sum runs along d) */
    for (int64_t j = 0; j < d; j++)
      for (int64_t c = 0; c < HE; c++) {
        WB[c * d + j] = WQ[j * HE + c];
        WB[(HE + c) * d + j] = WK[j * HE + c];
        WB[(2 * HE + c) * d + j] = WV[j * HE + c];
      }
    float *gE = g_W_E + k * V * d;
    memset(gE, 0, sizeof(float) * V * d);
    for (int64_t i = 0; i < Q; i++) {
      float acc[d] = {0};
      for (int64_t c = 0; c < HE; c++)
        for (int64_t j = 0; j < d; j++) acc[j] += GQKV[i * HE + c] * WB[c * d + j];
      for (int64_t o = 0; o < Vo; o++)
        for (int64_t j = 0; j < d; j++) acc[j] += gTE[i * Vo + o] * UT[o * d + j];
      float *row = gE + queries[i] * d;
      for (int64_t j = 0; j < d; j++) row[j] += acc[j];
    }
    for (int64_t p = 0; p < Vp; p++) {
      float acc[d] = {0};
      for (int64_t c = 0; c < 2 * HE; c++)
        for (int64_t j = 0; j < d; j++) acc[j] += GQKV[Q * HE + p * 2 * HE + c] * WB[(HE + c) * d + j];
      float *row = gE + present[p] * d;
      for (int64_t j = 0; j < d; j++) row[j] += acc[j];
    }
  }
}
#ifdef __cplusplus
}
#endif
"""
)


@functools.cache
def library(Q: int, Vp: int, H: int, e: int, d: int, Vo: int, identity: bool) -> ctypes.CDLL:
    """The kernel built for one shape (its loops' bounds compile-time constants, so the compiler unrolls and
    vectorises them); ``OSError`` saying why where no compiler builds it."""
    sizes = (("Q", Q), ("Vp", Vp), ("H", H), ("e", e), ("d", d), ("Vo", Vo), ("IDENTITY", int(identity)))
    lib = build("".join(f"#define {n} {v}\n" for n, v in sizes) + _SOURCE, "count_step")
    lib.count_step.restype = None
    return lib


def count_step_native(
    table: Float[Tensor, "K QVp J"],
    W_O: Float[Tensor, "K He d"] | None,
    b_O: Float[Tensor, "K d"],
    TE: Float[Tensor, "K Q Vo"],
    W_U: Float[Tensor, "K d Vo"],
    b_U: Float[Tensor, "K Vo"],
    query_idx: Int[Tensor, "K N"],
    counts: Float[Tensor, "K N Vp"],
    mask: Float[Tensor, "K N d"] | None,
    targets: Int[Tensor, "K N"],
    n_heads: int,
) -> tuple[Tensor, tuple[Tensor, ...]]:
    """Each model's mean loss ``[K]`` and the gradients of that mean with respect to ``table, W_O, b_O, TE, W_U,
    b_U`` (an empty tensor for ``W_O``'s under an identity W_O, ``W_O=None``): the kernel on contiguous float32
    CPU copies."""
    _check(table, W_O, b_O, TE, W_U, b_U, query_idx, counts, mask, targets, n_heads)
    K, N, Vp = counts.shape
    Q, J = TE.shape[1], table.shape[-1]
    d, Vo = W_U.shape[1:]
    e = (J - n_heads) // n_heads
    f = [
        x.detach().contiguous() if x is not None else None
        for x in (table, W_O, b_O, TE, W_U, W_U.transpose(1, 2), b_U, counts, mask)
    ]
    qidx, tgt = query_idx.contiguous(), targets.contiguous()  # held: the kernel reads them
    grads = [torch.empty_like(x) if x is not None else torch.zeros(0) for x in (f[0], f[1], f[2], f[3], f[4], f[6])]
    losses = torch.empty(K)
    work = torch.empty(N * (2 * d + Vo + (table.shape[-1] - n_heads)))
    library(Q, Vp, n_heads, e, d, Vo, W_O is None).count_step(
        ctypes.c_int64(K),
        ctypes.c_int64(N),
        *(pointer(x) for x in f[:7]),
        pointer(qidx),
        pointer(f[7]),
        pointer(f[8]),
        pointer(tgt),
        pointer(losses),
        *(pointer(g) for g in grads),
        pointer(work),
    )
    return losses, tuple(grads)


def _check(table, W_O, b_O, TE, W_U, b_U, query_idx, counts, mask, targets, n_heads) -> None:
    """The kernel reads raw memory: every argument's device, dtype and shape checked first (a clear error, not a
    crash or a wrong number)."""
    if isinstance(n_heads, bool) or not isinstance(n_heads, int) or n_heads < 1:
        raise InterpError(f"n_heads must be a positive int; got {n_heads!r}")
    dims = {"table": (table, 3), "TE": (TE, 3), "W_U": (W_U, 3), "counts": (counts, 3), "query_idx": (query_idx, 2)}
    for name, (x, ndim) in dims.items():
        if not isinstance(x, Tensor) or x.dim() != ndim:
            got = f"shape {list(x.shape)}" if isinstance(x, Tensor) else type(x).__name__
            raise InterpError(f"the C token-count step takes {name} with {ndim} dimensions; got {got}")
    if counts.shape[0] < 1:
        raise InterpError("the C token-count step needs at least one model (K = 0 given)")
    K, N, Vp = counts.shape
    Q, Vo = TE.shape[1:]
    d = W_U.shape[1]
    J = table.shape[-1]
    e = (J - n_heads) // n_heads if n_heads > 0 else 0
    want = {
        "table": (table, (K, Q * Vp, J)),
        "W_O": (W_O, (K, n_heads * e, d)),
        "b_O": (b_O, (K, d)),
        "TE": (TE, (K, Q, Vo)),
        "W_U": (W_U, (K, d, Vo)),
        "b_U": (b_U, (K, Vo)),
        "mask": (mask, (K, N, d)),
    }
    if n_heads < 1 or e < 1 or n_heads * (e + 1) != J:
        raise InterpError(
            f"the token-count table has {J} columns; expected n_heads x (d_head + 1) with {n_heads} heads"
        )
    if not shape_supported(d, Vo):
        raise InterpError(f"the C token-count step takes d_model and d_vocab_out multiples of 8; got {d} and {Vo}")
    if W_O is None and n_heads * e != d:
        raise InterpError(f"an identity W_O needs n_heads x d_head = d_model; got {n_heads * e} and {d}")
    for name, (x, shape) in want.items():
        if x is None:
            continue
        if x.device.type != "cpu" or x.dtype != torch.float32 or tuple(x.shape) != shape:
            raise InterpError(
                f"the C token-count step takes {name} as a float32 CPU tensor of shape {list(shape)}; got "
                f"{x.dtype} on {x.device}, shape {list(x.shape)}"
            )
    if counts.dtype != torch.float32 or counts.device.type != "cpu":
        raise InterpError(f"counts must be a float32 CPU tensor; got {counts.dtype} on {counts.device}")
    for name, x in (("query_idx", query_idx), ("targets", targets)):
        if x.dtype != torch.int64 or x.device.type != "cpu" or tuple(x.shape) != (K, N):
            raise InterpError(
                f"{name} must be an int64 CPU tensor of shape {[K, N]}; got {x.dtype} on {x.device}, shape "
                f"{list(x.shape)}"
            )
    for name, x, top in (("query_idx", query_idx, Q), ("targets", targets, Vo)):
        low, high = (int(v) for v in torch.aminmax(x)) if N else (0, 0)  # one pass over the indices
        if low < 0 or high >= top:
            raise InterpError(f"{name} must lie in 0..{top - 1}; got values {low}..{high}")


class CountStep(torch.autograd.Function):
    """:func:`count_step_native` as an autograd function: the forward computes the gradients of each model's mean
    loss along with it, and the backward scales them by that model's upstream gradient (each model's loss is a
    function of its own parameters alone, and every gradient is linear in the upstream one). First derivatives only
    (``once_differentiable``: a second backward, e.g. for a Hessian, is refused with torch's own error)."""

    @staticmethod
    def forward(table, W_O, b_O, TE, W_U, b_U, query_idx, counts, mask, targets, n_heads):
        losses, grads = count_step_native(table, W_O, b_O, TE, W_U, b_U, query_idx, counts, mask, targets, n_heads)
        return losses, *grads

    @staticmethod
    def setup_context(ctx, inputs, output):
        ctx.grads = output[1:]
        ctx.mark_non_differentiable(*output[1:])

    @staticmethod
    @once_differentiable
    def backward(ctx, g, *_):
        def scaled(x):
            return None if not x.numel() else x * g.view(-1, *([1] * (x.dim() - 1)))

        return (*(scaled(x) for x in ctx.grads), None, None, None, None, None)


def count_losses_native(table, W_O, b_O, TE, W_U, b_U, query_idx, counts, mask, targets, n_heads):
    """Each model's mean loss ``[K]``, differentiable with respect to the tables and parameters (:class:`CountStep`)."""
    return CountStep.apply(table, W_O, b_O, TE, W_U, b_U, query_idx, counts, mask, targets, n_heads)[0]


def _table_sizes(Q: int, Vp: int, H: int, e: int, d: int, Vo: int) -> tuple[int, int, int]:
    """Floats per model that ``count_tables`` saves for the backward (SAVED in the C source), and floats of the
    forward's and the backward's work buffers."""
    HE = H * e
    saved = (Q + Vp) * d + (Q + 2 * Vp) * HE + Q * Vp * HE
    return saved, -(-Q * Vp * H // 8) * 8, Q * Vp * HE + 3 * HE * d + (Q + 2 * Vp) * HE


# The memory order of each table parameter's dimensions after the model axis, as the C tables read them and as a
# population's flat buffer keeps them (interp.population._Adam): W_Q, W_K, W_V [d_model][head][d_head], W_U
# [vocab_out][d_model]; the rest row-major. The model axis may have any stride.
TABLE_LAYOUTS = ((0, 1), (1, 0, 2), (1, 0, 2), (1, 0, 2), (0, 1), (0, 1), (0, 1), (1, 0))


def _in_layout(x: Tensor, order: tuple[int, ...]) -> Tensor:
    """``x`` ``[K, ...]`` itself where its dimensions after the model axis lie in memory in ``order`` (each row-major
    block at any model stride), else a copy laid out so."""
    stored = x.permute(0, *(o + 1 for o in order))
    expect = 1
    for size, step in reversed(list(zip(stored.shape[1:], stored.stride()[1:]))):
        if size > 1 and step != expect:
            return stored.contiguous().permute(0, *(order.index(j) + 1 for j in range(len(order))))
        expect *= size
    return x


def _new_in_layout(shape: tuple[int, ...], order: tuple[int, ...]) -> Tensor:
    """An uninitialised float32 tensor of ``shape`` ``[K, ...]`` whose dimensions after the model axis lie in memory
    in ``order``, each model's block contiguous."""
    stored = torch.empty(shape[0], *(shape[o + 1] for o in order))
    return stored.permute(0, *(order.index(j) + 1 for j in range(len(order))))


def _check_tables(W_E, W_Q, W_K, W_V, b_Q, b_K, b_V, W_U, queries, present, always) -> None:
    """Every argument of the C tables checked before the kernel reads raw memory (a clear error, not a crash)."""
    if not isinstance(W_E, Tensor) or W_E.dim() != 3 or not isinstance(W_Q, Tensor) or W_Q.dim() != 4:
        raise InterpError("the C token-count tables take W_E [K, d_vocab, d_model] and W_Q [K, heads, d_model, d_head]")
    K, V, d = W_E.shape
    H, e = W_Q.shape[1], W_Q.shape[3]
    Vo = W_U.shape[-1] if isinstance(W_U, Tensor) else 0
    want = {"W_E": (W_E, (K, V, d)), "W_U": (W_U, (K, d, Vo))}
    want.update({n: (x, (K, H, d, e)) for n, x in (("W_Q", W_Q), ("W_K", W_K), ("W_V", W_V))})
    want.update({n: (x, (K, H, e)) for n, x in (("b_Q", b_Q), ("b_K", b_K), ("b_V", b_V))})
    for name, (x, shape) in want.items():
        if not isinstance(x, Tensor) or x.device.type != "cpu" or x.dtype != torch.float32 or tuple(x.shape) != shape:
            got = f"{x.dtype} on {x.device}, shape {list(x.shape)}" if isinstance(x, Tensor) else type(x).__name__
            raise InterpError(
                f"the C token-count tables take {name} as a float32 CPU tensor of shape {list(shape)}; got {got}"
            )
    if not shape_supported(d, Vo):
        raise InterpError(f"the C token-count tables take d_model and d_vocab_out multiples of 8; got {d} and {Vo}")
    for name, x in (("queries", queries), ("present", present)):
        if not isinstance(x, Tensor) or x.dtype != torch.int64 or x.device.type != "cpu" or x.dim() != 1 or not len(x):
            raise InterpError(f"{name} must be a non-empty 1-dimensional int64 CPU tensor of token ids")
        low, high = (int(v) for v in torch.aminmax(x))
        if low < 0 or high >= V:
            raise InterpError(f"{name} must lie in 0..{V - 1} (the embedding's tokens); got values {low}..{high}")
    if not isinstance(always, Tensor) or always.dtype != torch.bool or tuple(always.shape) != tuple(present.shape):
        raise InterpError(f"always must be a bool tensor shaped like present ({list(present.shape)})")


class CountTables(torch.autograd.Function):
    """The weights form's tables from the parameters in C (``count_tables``), each parameter read where it lies
    (:data:`TABLE_LAYOUTS`; a copy only of one laid out otherwise): the forward returns ``table``, ``TE``, a 0-dim
    int64 tensor (1 where the weights form is not exact for some model,
    :func:`interp.population.weights_are_exact`) and what the backward reads; the backward
    (``count_tables_backward``) takes the tables' gradients to the parameters', each in its parameter's layout (so
    autograd adds it into a population's flat gradient without reordering). First derivatives only."""

    @staticmethod
    def forward(W_E, W_Q, W_K, W_V, b_Q, b_K, b_V, W_U, queries, present, always, attn_scale, gap):
        _check_tables(W_E, W_Q, W_K, W_V, b_Q, b_K, b_V, W_U, queries, present, always)
        K, V, d = W_E.shape
        H, e, Q, Vp, Vo = W_Q.shape[1], W_Q.shape[3], len(queries), len(present), W_U.shape[-1]
        f = [_in_layout(x.detach(), o) for x, o in zip((W_E, W_Q, W_K, W_V, b_Q, b_K, b_V, W_U), TABLE_LAYOUTS)]
        strides = torch.tensor([x.stride(0) for x in f], dtype=torch.int64)
        qi, pi, al = queries.contiguous(), present.contiguous(), always.to(torch.uint8)
        n_saved, n_work, _ = _table_sizes(Q, Vp, H, e, d, Vo)
        table, TE = torch.empty(K, Q * Vp, H * e + H), torch.empty(K, Q, Vo)
        saved, work, inexact = torch.empty(K * n_saved), torch.empty(n_work), torch.zeros((), dtype=torch.int64)
        library(Q, Vp, H, e, d, Vo, False).count_tables(
            ctypes.c_int64(K),
            ctypes.c_int64(V),
            *(pointer(x, torch.float32, strided=True) for x in f),
            pointer(strides),
            pointer(qi),
            pointer(pi),
            pointer(al),
            ctypes.c_float(attn_scale),
            ctypes.c_float(gap),
            pointer(table),
            pointer(TE),
            pointer(saved),
            pointer(inexact),
            pointer(work),
        )
        return table, TE, inexact, saved

    @staticmethod
    def setup_context(ctx, inputs, output):
        ctx.save_for_backward(output[3], *(inputs[i] for i in (1, 2, 3, 7, 8, 9)))
        ctx.sizes = (*inputs[0].shape, inputs[1].shape[1], inputs[1].shape[3], inputs[7].shape[-1])
        ctx.scale = inputs[11]
        ctx.mark_non_differentiable(*output[2:])

    @staticmethod
    @once_differentiable
    def backward(ctx, g_table, g_TE, *_):
        saved, *W, queries, present = ctx.saved_tensors
        W = [_in_layout(x.detach(), TABLE_LAYOUTS[i]) for x, i in zip(W, (1, 2, 3, 7))]  # as the forward read them
        strides = torch.tensor([0, *(x.stride(0) for x in W[:3]), 0, 0, 0, W[3].stride(0)], dtype=torch.int64)
        queries, present = queries.contiguous(), present.contiguous()
        K, V, d, H, e, Vo = ctx.sizes
        Q, Vp = len(queries), len(present)
        g_table = torch.zeros(K, Q * Vp, H * e + H) if g_table is None else g_table.contiguous()
        g_TE = torch.zeros(K, Q, Vo) if g_TE is None else g_TE.contiguous()
        shapes = ((K, V, d), *[(K, H, d, e)] * 3, *[(K, H, e)] * 3, (K, d, Vo))
        grads = [_new_in_layout(s, o) for s, o in zip(shapes, TABLE_LAYOUTS)]
        work = torch.empty(_table_sizes(Q, Vp, H, e, d, Vo)[2])  # held, as every tensor below: the kernel reads them
        library(Q, Vp, H, e, d, Vo, False).count_tables_backward(
            ctypes.c_int64(K),
            ctypes.c_int64(V),
            *(pointer(x, torch.float32, strided=True) for x in W),
            pointer(strides),
            pointer(saved),
            pointer(queries),
            pointer(present),
            ctypes.c_float(ctx.scale),
            pointer(g_table),
            pointer(g_TE),
            *(pointer(g, torch.float32, strided=True) for g in grads),
            pointer(work),
        )
        return (*grads, None, None, None, None, None)


def count_tables_native(
    W_E: Float[Tensor, "K vocab d"],
    W_Q: Float[Tensor, "K H d e"],
    W_K: Float[Tensor, "K H d e"],
    W_V: Float[Tensor, "K H d e"],
    b_Q: Float[Tensor, "K H e"],
    b_K: Float[Tensor, "K H e"],
    b_V: Float[Tensor, "K H e"],
    W_U: Float[Tensor, "K d Vo"],
    queries: Int[Tensor, " Q"],
    present: Int[Tensor, " Vp"],
    always: Bool[Tensor, " Vp"],
    attn_scale: float,
    gap: float,
) -> tuple[Tensor, Tensor, bool]:
    """The weights form's ``table`` ``[K, Q x Vp, H x (d_head + 1)]`` and ``TE = W_E[queries] W_U`` ``[K, Q, Vo]``
    (what :func:`count_losses_native` takes; :func:`interp.population._native_tables` in torch), differentiable
    with respect to the parameters (:class:`CountTables`), and whether the weights form is exact for every model
    (no head's best counted score ``gap`` or more below its best, :func:`interp.population.weights_are_exact`).
    Softmax pooling (scores ``q . k / attn_scale``), no LayerNorm; float32 on the CPU."""
    table, TE, inexact, *_ = CountTables.apply(
        W_E, W_Q, W_K, W_V, b_Q, b_K, b_V, W_U, queries, present, always, attn_scale, gap
    )
    return table, TE, not bool(inexact)


def shape_supported(d_model: int, d_vocab_out: int) -> bool:
    """Whether the kernel takes this shape: d_model and the output vocabulary multiples of 8 (whole vectors)."""
    return d_model % 8 == 0 and d_vocab_out % 8 == 0


def _reference_losses(table, W_O, b_O, TE, W_U, b_U, query_idx, counts, mask, targets, n_heads):
    """The kernel's arithmetic in plain torch (float64 where given float64): the self-check's reference."""
    K, N, Vp = counts.shape
    J = table.shape[-1]
    e = (J - n_heads) // n_heads
    rows = table.view(K, -1, Vp, J).gather(1, query_idx[..., None, None].expand(K, N, Vp, J))  # [K, N, Vp, J]
    both = (counts[..., None] * rows).sum(2)  # [K, N, J]
    He = n_heads * e
    z = (both[..., :He].view(K, N, n_heads, e) / both[..., He:, None]).view(K, N, He)
    out = (z if W_O is None else torch.bmm(z, W_O)) + b_O[:, None]
    a = out if mask is None else out * mask
    logits = torch.bmm(a, W_U) + b_U[:, None] + TE.gather(1, query_idx[..., None].expand(K, N, TE.shape[-1]))
    return (
        torch.nn.functional.cross_entropy(logits.flatten(0, 1), targets.flatten(), reduction="none").view(K, N).mean(1)
    )


def _reference_tables(W_E, W_Q, W_K, W_V, b_Q, b_K, b_V, W_U, queries, present, always, attn_scale, gap):
    """:func:`count_tables_native`'s arithmetic in plain torch (float64 where given float64): the self-check's
    reference."""
    q = torch.einsum("kid,khde->khie", W_E[:, queries], W_Q) + b_Q[:, :, None]  # [K, H, Q, e]
    keys = torch.einsum("kpd,khde->khpe", W_E[:, present], W_K) + b_K[:, :, None]  # [K, H, Vp, e]
    vals = torch.einsum("kpd,khde->khpe", W_E[:, present], W_V) + b_V[:, :, None]
    S = (q[:, :, :, None] * keys[:, :, None]).sum(-1) / attn_scale  # [K, H, Q, Vp]
    counted = (present[None] == queries[:, None]) | always[None]
    exact = bool(((S.masked_fill(~counted, float("-inf")).amax(-1) - S.amax(-1)) > -gap).all())
    Ew = (S - S.amax(-1, keepdim=True).detach()).exp()
    K, H, Q, Vp = Ew.shape
    numer = (Ew[..., None] * vals[:, :, None]).permute(0, 2, 3, 1, 4).reshape(K, Q * Vp, -1)
    table = torch.cat([numer, Ew.permute(0, 2, 3, 1).reshape(K, Q * Vp, H)], -1)
    return table, W_E[:, queries] @ W_U, exact


def tables_status(Q: int, Vp: int, H: int, e: int, d: int, Vo: int) -> str:
    """``"c"`` where :func:`count_tables_native` of this shape agrees with its float64 torch reference
    (:func:`_reference_tables`) on a small random problem (tables and every parameter's gradient within 1e-5 of
    their largest value, the exactness flag equal), with the parameters laid out as a population keeps them
    (:data:`TABLE_LAYOUTS`, read in place) and row-major (copied), else why not."""
    g = torch.Generator().manual_seed(1)
    K, V = 2, Q + Vp
    queries, present = torch.arange(Q), torch.arange(Q - 1, V)[:Vp]  # token Q - 1 both a query and present
    always = torch.zeros(Vp, dtype=torch.bool)
    always[-1] = True
    shapes = ((K, V, d), *[(K, H, d, e)] * 3, *[(K, H, e)] * 3, (K, d, Vo))
    base = [torch.randn(*s, generator=g) * 0.5 for s in shapes]
    g_table, g_TE = torch.randn(K, Q * Vp, H * e + H, generator=g), torch.randn(K, Q, Vo, generator=g)
    ref = None
    for layout in ("population", "row-major", "float64"):
        if layout == "population":
            leaves = [_new_in_layout(s, o).copy_(x) for s, o, x in zip(shapes, TABLE_LAYOUTS, base)]
        else:
            leaves = [x.clone().double() if layout == "float64" else x.clone() for x in base]
        leaves = [x.requires_grad_() for x in leaves]
        fn = _reference_tables if layout == "float64" else count_tables_native
        try:
            table, TE, exact = fn(*leaves, queries, present, always, 2.0**0.5, 60.0)
        except OSError as err:
            return f"torch: {err}"
        ((table * g_table.to(table.dtype)).sum() + (TE * g_TE.to(TE.dtype)).sum()).backward()
        got = [table.detach().double(), TE.detach().double(), *(x.grad.double() for x in leaves)]
        if layout == "population":
            ref, flag = got, exact
        elif layout == "row-major" and not all(torch.equal(a, b) for a, b in zip(got, ref)):
            return "torch: the C token-count tables differ between parameter layouts here"
    if exact != flag:
        return "torch: the C token-count tables' exactness flag differs from its reference here"
    names = ("table", "TE", "W_E", "W_Q", "W_K", "W_V", "b_Q", "b_K", "b_V", "W_U")
    for n, a, b in zip(names, ref, got):
        gap = float((a - b).abs().max() / b.abs().max().clamp_min(1e-30))
        if not gap <= 1e-5:
            return f"torch: the C token-count tables differ from their reference here ({n}: {gap:.1e} apart)"
    return "c"


@functools.cache
def shape_status(Q: int, Vp: int, H: int, e: int, d: int, Vo: int, identity: bool) -> str:
    """``"c"`` where the kernel of this shape (:func:`library`) builds here and agrees with its float64 torch
    reference (:func:`_reference_losses`) on a small random problem of the shape (losses and every gradient within
    1e-5 of their largest value, with and without dropout's mask, upstream gradients other than 1) and so do its
    tables (:func:`tables_status`), else why not: the population then trains this shape by the torch step. Each
    shape is its own build, so each is checked."""
    if not shape_supported(d, Vo) or min(Q, Vp, H, e) < 1 or (identity and H * e != d):
        return f"torch: the kernel does not take this shape (d_model {d}, {Vo} outputs, {H} heads of {e})"
    g = torch.Generator().manual_seed(0)
    K, N = 2, 13
    for with_mask in (True, False):
        x = {
            "table": torch.rand(K, Q * Vp, H * e + H, generator=g) + 0.1,
            "W_O": None if identity else torch.randn(K, H * e, d, generator=g) / (H * e) ** 0.5,
            "b_O": torch.randn(K, d, generator=g),
            "TE": torch.randn(K, Q, Vo, generator=g),
            "W_U": torch.randn(K, d, Vo, generator=g) / d**0.5,
            "b_U": torch.randn(K, Vo, generator=g),
        }
        rows = dict(
            query_idx=torch.randint(0, Q, (K, N), generator=g),
            counts=torch.randint(0, 4, (K, N, Vp), generator=g).float() + 1,
            mask=(torch.rand(K, N, d, generator=g) > 0.2).float() / 0.8 if with_mask else None,
            targets=torch.randint(0, Vo, (K, N), generator=g),
        )
        up = torch.rand(K, generator=g) + 0.5  # an upstream gradient other than 1
        got, want = {}, {}
        for into, dtype in ((got, torch.float32), (want, torch.float64)):
            leaves = {n: v.to(dtype).clone().requires_grad_() for n, v in x.items() if v is not None}
            r = {n: (v.to(dtype) if v is not None and v.is_floating_point() else v) for n, v in rows.items()}
            fn = count_losses_native if dtype == torch.float32 else _reference_losses
            try:
                losses = fn(**{n: leaves.get(n) for n in x}, **r, n_heads=H)
            except OSError as err:
                return f"torch: {err}"
            (losses * up.to(dtype)).sum().backward()
            into.update({"losses": losses.detach().double(), **{n: v.grad.double() for n, v in leaves.items()}})
        for n, w in want.items():
            gap = float((got[n] - w).abs().max() / w.abs().max().clamp_min(1e-30))
            if not gap <= 1e-5:
                return f"torch: the C token-count step differs from its reference here ({n}: {gap:.1e} apart)"
    return tables_status(Q, Vp, H, e, d, Vo)


@functools.cache
def status() -> str:
    """``"c"`` where the kernel builds here and passes :func:`shape_status` on two small shapes (with and without
    ``W_O``), else why not (populations then use the torch step everywhere; where it passes, each population shape
    is checked again by :func:`shape_status` before its first step)."""
    for identity in (False, True):
        why = shape_status(3, 5, 2, 4, 8, 8, identity)
        if why != "c":
            return why
    return "c"
