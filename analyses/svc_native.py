"""The exact squared-hinge SVCs of a coalition lattice, one coalition at a time, in C.

The same problem and the same method as :mod:`analyses.batched_svc` (generalised Newton with working sets and an
exact line search, Keerthi and DeCoste, "A modified finite Newton method for fast solution of large scale linear
SVMs", 2005; the same stopping rule, so the same minimiser within ``tol``), for where torch's batching costs more
than the arithmetic: Table 1's halving scores 65,536 coalitions of at most 33 columns each, and the batched solver
spends most of its ~40 s per model in hundreds of thousands of small tensor operations (indexing, ``bmm`` of 33-wide
matrices, per-step bookkeeping) rather than in floating point. Here each coalition is one plain loop:

- its margins over all samples from the features stored column by column (one ``axpy`` per column of the
  coalition), warm-started at its parent's weights (the coalition without its highest player, solved earlier:
  coalitions go in increasing bitmask order), with the new player's weights at 0, so at the parent's margins;
- a working set of the samples of smallest margin (a power of two at least twice the violators, at least 64;
  all samples beyond a quarter of them), Newton on it (Hessian ``I + 2C sum_active x x^T``, Cholesky) with the
  exact line search along each step, then every sample checked: the restricted optimum is the full one exactly
  when no sample outside the working set violates its margin there; otherwise the working set is rebuilt.

It is built with the machine's C compiler (:func:`interp.native.build`); :mod:`analyses.batched_svc` uses it only
after a self-check in this process has compared it with the torch solver on a small lattice (weights within 1e-7 of
their norm; ``engine_status()`` says whether and why not). The torch solver stays the reference and the fallback.
"""

from __future__ import annotations

import ctypes
import functools

import torch
from jaxtyping import Float, Int
from torch import Tensor

from interp.errors import InterpError
from interp.native import build, pointer

_SOURCE = r"""
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#ifdef __cplusplus
extern "C" {
#endif

static double norm2(const double *a, int64_t n) {
  double s = 0.0;
  for (int64_t i = 0; i < n; i++) s += a[i] * a[i];
  return sqrt(s);
}

/* a.b with eight partial sums (no chain of dependent additions, so the compiler can use vector registers) */
static double dot(const double *a, const double *b, int64_t n) {
  double s[8] = {0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0};
  int64_t k = 0;
  for (; k + 8 <= n; k += 8)
    for (int u = 0; u < 8; u++) s[u] += a[k + u] * b[k + u];
  double total = ((s[0] + s[4]) + (s[1] + s[5])) + ((s[2] + s[6]) + (s[3] + s[7]));
  for (; k < n; k++) total += a[k] * b[k];
  return total;
}

/* the k-th smallest (0-based) of a[0..n), reordering a (Hoare's selection) */
static double kth_smallest(double *a, int64_t n, int64_t k) {
  int64_t lo = 0, hi = n - 1;
  while (lo < hi) {
    double x = a[lo], m = a[(lo + hi) / 2], z = a[hi], pivot;
    if (x < m) pivot = m < z ? m : (x < z ? z : x);
    else pivot = x < z ? x : (m < z ? z : m);
    int64_t i = lo, j = hi;
    while (i <= j) {
      while (a[i] < pivot) i++;
      while (a[j] > pivot) j--;
      if (i <= j) { double t = a[i]; a[i] = a[j]; a[j] = t; i++; j--; }
    }
    if (k <= j) hi = j;
    else if (k >= i) lo = i;
    else return a[k];
  }
  return a[k];
}

/* the exact minimiser of f(w + t d) over t (a convex piecewise quadratic), as the torch solver's line search */
static double line_search(const double *w, const double *d, const double *r, const double *q, int64_t K, int64_t p,
                          double C) {
  double wd = 0.0, dd = 0.0;
  for (int64_t j = 0; j < p; j++) { wd += w[j] * d[j]; dd += d[j] * d[j]; }
  double t = 1.0, lo = 0.0, hi = INFINITY;
  if (!(dd > 0.0)) return t;
  for (int step = 0; step < 60; step++) {
    double S = 0.0, Sabs = 0.0, S2 = 0.0;
    for (int64_t k = 0; k < K; k++) {
      double rl = r[k] - t * q[k];
      if (rl > 0.0) {
        double term = 2.0 * C * q[k] * rl;
        S += term;
        Sabs += fabs(term);
        S2 += q[k] * q[k];
      }
    }
    double dphi = wd + t * dd - S, d2 = dd + 2.0 * C * S2;
    if (fabs(dphi) <= 1e-13 * (fabs(wd) + t * dd + Sabs)) break;
    if (dphi > 0.0) { if (t < hi) hi = t; } else { if (t > lo) lo = t; }
    double tn = t - dphi / d2;
    if (!(tn > lo && tn < hi)) tn = isinf(hi) ? 2.0 * t : 0.5 * (lo + hi);
    if (tn == t) break;
    t = tn;
  }
  return t;
}

/* Newton on K samples Xw [p][K] (column by column), labels yw, from w (updated): the steps taken (at most budget);
   *conv is 1 where the gradient, or the step, reached tol * max(1, |w|). work: 3 K + 2 p + p p + p K doubles and K
   indices. */
static int64_t newton(const double *Xw, const double *yw, int64_t K, int64_t p, double *w, double C, double tol,
                      int64_t budget, int *conv, double *work, int64_t *act) {
  double *r = work, *q = r + K, *c = q + K, *g = c + K, *d = g + p, *H = d + p, *A = H + p * p;
  *conv = 0;
  for (int64_t it = 0;; it++) {
    for (int64_t k = 0; k < K; k++) r[k] = w[0] * Xw[k];
    for (int64_t j = 1; j < p; j++) {
      const double *x = Xw + j * K;
      double wj = w[j];
      for (int64_t k = 0; k < K; k++) r[k] += wj * x[k];
    }
    int64_t na = 0;
    for (int64_t k = 0; k < K; k++) {
      r[k] = 1.0 - yw[k] * r[k]; /* the slack */
      c[k] = r[k] > 0.0 ? yw[k] * r[k] : 0.0;
      if (r[k] > 0.0) act[na++] = k;
    }
    for (int64_t j = 0; j < p; j++) {
      g[j] = w[j] - 2.0 * C * dot(c, Xw + j * K, K);
    }
    double wn = norm2(w, p), bound = tol * (wn > 1.0 ? wn : 1.0);
    if (norm2(g, p) <= bound) { *conv = 1; return it; }
    if (it >= budget) return it;
    for (int64_t j = 0; j < p; j++) { /* the active samples' columns, packed */
      const double *x = Xw + j * K;
      double *a = A + j * na;
      for (int64_t k = 0; k < na; k++) a[k] = x[act[k]];
    }
    for (int64_t i = 0; i < p; i++) { /* H = I + 2C A^T A, lower triangle */
      const double *ai = A + i * na;
      for (int64_t j = 0; j <= i; j++) {
        H[i * p + j] = 2.0 * C * dot(ai, A + j * na, na) + (i == j ? 1.0 : 0.0);
      }
    }
    for (int64_t j = 0; j < p; j++) { /* Cholesky, lower triangle in place */
      double s = H[j * p + j];
      for (int64_t k = 0; k < j; k++) s -= H[j * p + k] * H[j * p + k];
      double l = sqrt(s);
      H[j * p + j] = l;
      for (int64_t i = j + 1; i < p; i++) {
        double v = H[i * p + j];
        for (int64_t k = 0; k < j; k++) v -= H[i * p + k] * H[j * p + k];
        H[i * p + j] = v / l;
      }
    }
    for (int64_t i = 0; i < p; i++) { /* L z = g, then L^T d = z, then d = -d */
      double v = g[i];
      for (int64_t k = 0; k < i; k++) v -= H[i * p + k] * d[k];
      d[i] = v / H[i * p + i];
    }
    for (int64_t i = p - 1; i >= 0; i--) {
      double v = d[i];
      for (int64_t k = i + 1; k < p; k++) v -= H[k * p + i] * d[k];
      d[i] = v / H[i * p + i];
    }
    for (int64_t j = 0; j < p; j++) d[j] = -d[j];
    if (norm2(d, p) <= bound) { *conv = 1; return it; }
    for (int64_t k = 0; k < K; k++) q[k] = d[0] * Xw[k];
    for (int64_t j = 1; j < p; j++) {
      const double *x = Xw + j * K;
      double dj = d[j];
      for (int64_t k = 0; k < K; k++) q[k] += dj * x[k];
    }
    for (int64_t k = 0; k < K; k++) q[k] *= yw[k];
    double t = line_search(w, d, r, q, K, p, C);
    for (int64_t j = 0; j < p; j++) w[j] += t * d[j];
  }
}

#define BLK 512  /* samples per block of the margin pass (its margins stay in L1 while the columns stream past) */
#define RUNGS 8
static const double LADDER[RUNGS] = {1.0, 1.25, 1.5, 2.0, 3.0, 5.0, 9.0, INFINITY};

/* every sample's margin y_i w.x_i on the columns cols[0..p) of XT [D][N] (cols[0] = 0, the ones), and how many
   fall below each rung of LADDER (below[0]: the violators); returns 0, or -1 where a margin is not finite */
static int margins(const double *XT, const double *y, int64_t N, const int64_t *cols, int64_t p, const double *w,
                   double *m, int64_t *below) {
  double total = 0.0;
  for (int r = 0; r < RUNGS; r++) below[r] = 0;
  for (int64_t i0 = 0; i0 < N; i0 += BLK) {
    int64_t i1 = i0 + BLK < N ? i0 + BLK : N;
    for (int64_t i = i0; i < i1; i++) m[i] = w[0];
    for (int64_t j = 1; j < p; j++) {
      const double *x = XT + cols[j] * N;
      double wj = w[j];
      for (int64_t i = i0; i < i1; i++) m[i] += wj * x[i];
    }
    for (int64_t i = i0; i < i1; i++) {
      m[i] *= y[i];
      total += m[i];
    }
    for (int r = 0; r < RUNGS - 1; r++) {
      int64_t c = 0;
      for (int64_t i = i0; i < i1; i++) c += m[i] < LADDER[r];
      below[r] += c;
    }
  }
  below[RUNGS - 1] = N;
  return isfinite(total) ? 0 : -1;
}

/* a working set of at least K samples holding every sample of margin below that of the K-th smallest: the samples
   below the first rung of LADDER that holds K, cut to the K smallest where that is more than twice K; returns its
   size */
static int64_t working_set(const double *m, int64_t N, int64_t K, const int64_t *below, int64_t *ws, double *tmp) {
  int r = 0;
  while (below[r] < K) r++;
  double cut = LADDER[r];
  int64_t c = 0;
  for (int64_t i = 0; i < N; i++)
    if (m[i] < cut) ws[c++] = i;
  if (c <= 2 * K) return c;
  for (int64_t k = 0; k < c; k++) tmp[k] = m[ws[k]];
  double thr = kth_smallest(tmp, c, K - 1);
  int64_t k = 0;
  for (int64_t i = 0; i < c; i++)
    if (m[ws[i]] < thr) ws[k++] = ws[i];
  for (int64_t i = 0; i < N && k < K; i++) /* the ties at the threshold, to K */
    if (m[i] == thr) ws[k++] = i;
  return k;
}

/* The SVC of each coalition masks[b], in an order where each one's parent (row parent[b], the coalition without its
   highest player, -1: none) and the parent's own subtree come first (depth-first: row b's margins are kept in
   stack[popcount][.] until the next coalition of that size, so a child starts from its parent's final margins).
   Weights go to row row0 + b of W [.][D] (zero off the coalition, intercept first), Newton steps to iters
   (max_iter + 1: not converged, -1: a margin became non-finite). X [N][D] row-major and XT [D][N] hold the same
   features. Returns 0, or 1 where memory ran out. */
int svc_lattice(int64_t N, int64_t D, int64_t n, int64_t e, const double *XT, const double *X, const double *y,
                int64_t B, const int64_t *masks, const int64_t *parent, double C, double tol, int64_t max_iter,
                int64_t k_min, int64_t full_div, int64_t row0, double *W, int64_t *iters, double *stack) {
  int64_t *cols = (int64_t *)malloc(sizeof(int64_t) * D);
  int64_t *ws = (int64_t *)malloc(sizeof(int64_t) * N);
  double *w = (double *)malloc(sizeof(double) * D);
  double *tmp = (double *)malloc(sizeof(double) * N);
  double *yw = (double *)malloc(sizeof(double) * N);
  double *Xw = (double *)malloc(sizeof(double) * N * D);
  double *work = (double *)malloc(sizeof(double) * (3 * N + 2 * D + D * D + D * N));
  int64_t *act = (int64_t *)malloc(sizeof(int64_t) * N);
  int status = 0;
  if (!cols || !ws || !w || !tmp || !yw || !Xw || !work || !act) { status = 1; goto done; }
  for (int64_t b = 0; b < B; b++) {
    int64_t mask = masks[b], p = 0, depth = 0, below[RUNGS];
    cols[p++] = 0;
    for (int64_t i = 0; i < n; i++)
      if ((mask >> i) & 1) {
        depth++;
        for (int64_t j = 0; j < e; j++) cols[p++] = 1 + i * e + j;
      }
    double *m = stack + depth * N;
    int bad = 0;
    if (parent[b] >= 0) { /* the parent's weights, the new player's at 0: the parent's final margins */
      for (int64_t j = 0; j < p; j++) w[j] = W[parent[b] * D + cols[j]];
      memcpy(m, stack + (depth - 1) * N, sizeof(double) * N);
      for (int r = 0; r < RUNGS; r++) below[r] = 0;
      for (int64_t i = 0; i < N; i++)
        for (int r = 0; r < RUNGS - 1; r++) below[r] += m[i] < LADDER[r];
      below[RUNGS - 1] = N;
    } else {
      for (int64_t j = 0; j < p; j++) w[j] = 0.0;
      bad = margins(XT, y, N, cols, p, w, m, below);
    }
    int64_t total = 0;
    int ok = 0;
    for (int64_t round = 0; round <= max_iter && !bad; round++) {
      int64_t v = below[0], K = 2 * v > k_min ? 2 * v : k_min, size;
      if (K >= N / full_div || K >= N) {
        size = N;
        for (int64_t i = 0; i < N; i++) ws[i] = i;
      } else {
        size = working_set(m, N, K, below, ws, tmp);
      }
      for (int64_t k = 0; k < size; k++) { /* the working set's columns */
        const double *x = X + ws[k] * D;
        for (int64_t j = 0; j < p; j++) Xw[j * size + k] = x[cols[j]];
        yw[k] = y[ws[k]];
      }
      int conv;
      total += newton(Xw, yw, size, p, w, C, tol, max_iter + 1 - total, &conv, work, act);
      bad = margins(XT, y, N, cols, p, w, m, below);
      int64_t inside = 0;
      for (int64_t k = 0; k < size; k++) inside += m[ws[k]] < 1.0;
      if (total > max_iter) break;
      if (conv && inside == below[0]) { ok = 1; break; }
    }
    iters[row0 + b] = bad ? -1 : (ok ? total : max_iter + 1);
    double *out = W + (row0 + b) * D;
    for (int64_t j = 0; j < D; j++) out[j] = 0.0;
    for (int64_t j = 0; j < p; j++) out[cols[j]] = w[j];
  }
done:
  free(cols); free(ws); free(w); free(tmp); free(yw); free(Xw); free(work); free(act);
  return status;
}
#ifdef __cplusplus
}
#endif
"""

CHUNK = 4096  # coalitions per call (a progress bar's step; parents always come from earlier calls or this one)


@functools.cache
def library() -> ctypes.CDLL:
    """The built C solver (``OSError`` saying why where no compiler builds it)."""
    lib = build(_SOURCE, "lattice_svc")
    lib.svc_lattice.restype = ctypes.c_int
    return lib


def without_highest(masks: Tensor) -> Tensor:
    """Non-negative int64 bitmasks without their highest set bit (a coalition's parent; 0 stays 0)."""
    high = torch.zeros_like(masks)
    x = masks.clone()
    for shift in (32, 16, 8, 4, 2, 1):
        big = x >= (1 << shift)
        high += big * shift
        x = torch.where(big, x >> shift, x)
    return masks - torch.where(masks > 0, torch.ones_like(masks) << high, torch.zeros_like(masks))


def parents(index: Tensor) -> Tensor:
    """For the bitmasks ``index``: the row of each one's parent (itself without its highest bit) in ``index``, or
    -1 where that is not there (and for the empty coalition)."""
    parent = without_highest(index)
    index = index.contiguous()
    order = torch.argsort(index)
    j = order[torch.searchsorted(index[order], parent).clamp_max(max(len(index) - 1, 0))]
    found = (index > 0) & (index[j] == parent) if len(index) else torch.zeros(0, dtype=torch.bool)
    return torch.where(found, j, torch.full_like(j, -1))


def depth_first(index: Int[Tensor, " coalition"], n: int) -> Int[Tensor, " coalition"]:
    """The order that visits each coalition after its parent and before any other coalition of its parent's size
    outside its parent's subtree: the players of each, in increasing order, compared lexicographically (a prefix
    first), i.e. the depth-first preorder of the tree in which a coalition's parent is it without its highest
    player. Returns positions into ``index``."""
    import numpy as np

    bits = ((index[:, None] >> torch.arange(n)) & 1).bool()
    rank = bits.long().cumsum(1) - 1  # each player's place among the coalition's players
    seq = torch.full((len(index), n), -1, dtype=torch.long)  # the players in order, -1 after the last
    rows, players = torch.nonzero(bits, as_tuple=True)
    seq[rows, rank[rows, players]] = players
    return torch.from_numpy(np.lexsort(seq.numpy().T[::-1].copy())).long() if n else torch.arange(len(index))


def solve_lattice_native(
    x_tr: Float[Tensor, "sample player d_head"],
    y: Float[Tensor, " sample"],
    index: Tensor,
    C: float,
    progress: bool,
    tol: float,
    max_iter: int,
    *,
    k_min: int = 64,
    full_fraction: int = 4,
) -> tuple[Tensor, Tensor, Tensor]:
    """What :func:`analyses.batched_svc._solve_lattice` returns (the sorted unique coalitions, their weights
    ``[coalition, 1 + n * d_head]`` and Newton steps), solved by the C loop, depth first; float64 on the CPU."""
    N, n, e = x_tr.shape
    index = torch.unique(index.cpu().long()).contiguous()  # C reads int64 bitmasks
    X = torch.cat([torch.ones(N, 1, dtype=torch.float64), x_tr.cpu().double().reshape(N, n * e)], 1).contiguous()
    XT = X.T.contiguous()
    yv = y.cpu().double().contiguous()
    D = X.shape[1]
    order = depth_first(index, n)
    masks = index[order].contiguous()
    par = parents(masks).contiguous()
    W = torch.zeros(len(index), D, dtype=torch.float64)
    iters = torch.zeros(len(index), dtype=torch.long)
    stack = torch.empty(n + 1, N, dtype=torch.float64)  # the latest margins of each coalition size
    bar = None
    if progress:
        from tqdm.auto import tqdm

        bar = tqdm(total=len(index), desc="SVC fits (C)", unit="fit")
    lib = library()
    for i in range(0, len(index), CHUNK):
        j = min(len(index), i + CHUNK)
        rc = lib.svc_lattice(
            ctypes.c_int64(N),
            ctypes.c_int64(D),
            ctypes.c_int64(n),
            ctypes.c_int64(e),
            pointer(XT, torch.float64),
            pointer(X, torch.float64),
            pointer(yv, torch.float64),
            ctypes.c_int64(j - i),
            pointer(masks[i:j], torch.int64),
            pointer(par[i:j], torch.int64),
            ctypes.c_double(C),
            ctypes.c_double(tol),
            ctypes.c_int64(max_iter),
            ctypes.c_int64(k_min),
            ctypes.c_int64(full_fraction),
            ctypes.c_int64(i),
            pointer(W, torch.float64),
            pointer(iters, torch.int64),
            pointer(stack, torch.float64),
        )
        if rc:
            raise MemoryError(f"the C SVC solver could not allocate its buffers for {N} samples x {D} columns")
        if bar is not None:
            bar.update(j - i)
    if bar is not None:
        bar.close()
    if bool((iters < 0).any()):
        raise InterpError(
            f"{int((iters < 0).sum())} SVC fits met non-finite margins: their Newton steps overflowed float64 at "
            f"C={C:g} (features far from centred, nearly collinear or very large make the problem that ill-"
            "conditioned): centre and scale the features, or lower C"
        )
    back = torch.empty_like(order)
    back[order] = torch.arange(len(order))
    return index, W[back], iters[back]
