"""Many linear SVCs at once: the separation value of every head coalition (Fraknói 2024, Definition 5.2) in torch.

Each coalition S has its own problem: scikit-learn's ``LinearSVC(C, loss="squared_hinge", penalty="l2",
dual=False)``, i.e. liblinear's primal L2-regularised squared-hinge SVM with the intercept as an extra feature
of value ``intercept_scaling = 1`` that is regularised like a weight:

    minimise  f(w) = 1/2 |w|^2 + C * sum_i max(0, 1 - y_i w.x_i)^2,   x_i = (1, features of S),  y_i = +-1

on the (already centred) features of S: the ``d_head`` outputs of each head of S, concatenated. f is strictly
convex, so the minimiser is unique and any exact solver gives the same separator; scikit-learn's liblinear stops
at a gradient tolerance (``tol=1e-4``, relative), this solver goes on to the exact minimiser, so the two differ
only where a test point lies within liblinear's tolerance of the boundary.

The solver is generalised Newton (f is piecewise quadratic and C^1): Hessian ``I + 2C X_A^T X_A`` over the
active samples ``A`` (margin < 1), a batched Cholesky solve, and a backtracking (Armijo) line search. What makes
2^16 fits cheap:

- each problem works in its own columns (intercept and its heads' d_head outputs), batched ``[problem, K, p]``;
- working sets: near-separable data leave a few dozen active samples of 7,500, so Newton runs on each problem's
  K samples of smallest margin (K >= twice its violators) and then every sample is checked: the restricted
  optimum is the full one exactly when no sample outside the working set violates its margin there (the two
  gradients are then equal); otherwise the working set is rebuilt and Newton goes on. Problems with many
  violators (bad heads) use all samples;
- warm starts along the subset lattice: coalitions are solved by size, and each starts from its parent (the
  coalition without its highest head): the parent's weights with zeros for the new head (so the same margins)
  and the parent's smallest-margin samples as its first working set.

Stopping rule: ``|grad f| <= tol * |grad f(0)|`` with ``tol = 1e-9`` (liblinear's is 1e-4 in the same relative sense,
scaled by the smaller class fraction), so scikit-learn's separator is the less exact of the two.

Binary labels: ``y = +1`` for the larger label (scikit-learn's ``classes_[1]``), predicted where the decision is
> 0. More than two classes: one-vs-rest (as ``LinearSVC``), the class with the largest decision.
"""

from __future__ import annotations

from contextlib import contextmanager

import torch
from jaxtyping import Float, Int
from torch import Tensor

from interp.errors import InterpError

BLOCK = 128  # problems per batched solve
K_MIN = 64  # smallest working set
FULL_FRACTION = 4  # working sets of more than N / 4 samples: all samples
FULL_ELEMS = 1 << 22  # problems x samples x columns per chunk when all samples are used


class LatticeSolver:
    """Exact squared-hinge SVCs of many coalitions over one train set, in the full feature space: features
    ``X = (1, x_1, ..., x_n)`` (``[sample, D]``, ``D = 1 + n * d_head``); a coalition's problem keeps the
    intercept and its heads' columns and fixes the other weights at 0 (its Hessian is the identity there).

    Working sets: at the solution only the samples with margin < 1 contribute (near-separable data: a few dozen
    of 7,500), so each problem runs Newton on its K samples of smallest margin (all current violators among them)
    and then checks every sample: the restricted optimum is the full optimum exactly when no sample outside the
    working set violates its margin there (both gradients are then equal); otherwise the working set is rebuilt
    around the new margins and Newton goes on. Batched as ``[problem, K, D]`` blocks."""

    def __init__(
        self,
        x: Float[Tensor, "sample player d_head"],
        y: Float[Tensor, " sample"],
        C: float,
        tol: float = 1e-9,
        max_iter: int = 100,
    ):
        N, n, e = x.shape
        self.n, self.e, self.C, self.tol, self.max_iter = n, e, float(C), tol, max_iter
        self.X = torch.cat([torch.ones(N, 1, dtype=x.dtype), x.reshape(N, n * e)], 1).contiguous()  # [N, D]
        self.D = self.X.shape[1]
        self.y = y.to(x.dtype)
        self.g0 = 2 * self.C * float(torch.linalg.vector_norm(self.y @ self.X))  # |grad f(0)| of the full problem

    def column_mask(self, masks: Int[Tensor, " problem"]) -> Float[Tensor, "problem D"]:
        bits = ((masks[:, None] >> torch.arange(self.n)) & 1).to(self.X.dtype)
        return torch.cat([torch.ones(len(masks), 1, dtype=self.X.dtype), bits.repeat_interleave(self.e, 1)], 1)

    def solve(self, masks: Tensor, w: Tensor, ws: Tensor | None = None) -> tuple[Tensor, Tensor, Tensor]:
        """The exact SVC of each coalition of ``masks`` from the weights ``w`` (``[problem, D]``) and, optionally,
        first working sets ``ws [problem, K_MIN]`` (a parent's: its margins are the child's at the start; rows of
        -1: none). Returns the weights, the Newton iterations each took (``max_iter + 1``: not converged), and
        each problem's ``K_MIN`` samples of smallest final margin (-1 where it has more violators than half of
        them: no good first working set for a child)."""
        X, y, _N = self.X, self.y, len(self.y)
        cm = self.column_mask(masks)
        w = (w * cm).clone()
        B = len(masks)
        iters = torch.zeros(B, dtype=torch.long)
        out_ws = torch.full((B, K_MIN), -1, dtype=torch.long)
        # round 0: problems with a first working set go straight to Newton; the others need their margins
        given = torch.zeros(B, dtype=torch.bool) if ws is None else ws[:, 0] >= 0
        work = [(torch.nonzero(given).flatten(), None if ws is None else ws[given])]
        rest = torch.nonzero(~given).flatten()
        if len(rest):
            work += self._working_sets(rest, y * (w[rest] @ X.T))
        for _ in range(self.max_iter + 1):
            checked = []
            for rows, idx in work:
                if len(rows) == 0:
                    continue
                budget = self.max_iter + 1 - iters[rows]
                wk, it, conv = self._run(idx, w[rows], cm[rows], budget)
                w[rows] = wk
                iters[rows] += it
                checked.append((rows, idx, conv))
            work = []
            for rows, idx, conv in checked:  # optimal iff converged on the working set and nobody outside violates
                m = y * (w[rows] @ X.T)
                viol = (m < 1).sum(-1)
                inside = viol if idx is None else (m.gather(1, idx) < 1).sum(-1)
                ok = (conv & (inside == viol)) | (iters[rows] > self.max_iter)
                good = ok & (viol <= K_MIN // 2)
                if good.any():
                    out_ws[rows[good]] = torch.topk(m[good], K_MIN, dim=-1, largest=False, sorted=False).indices
                if (~ok).any():
                    work += self._working_sets(rows[~ok], m[~ok])
            if not work:
                break
        return w, iters, out_ws

    def _run(self, idx: Tensor | None, w: Tensor, cm: Tensor, budget: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """Newton on each problem's own columns (intercept and its heads': problems of one call have the same
        number) and its working set ``idx`` (None: all samples, in chunks), weights returned in full space."""
        N = len(self.y)
        p = int(cm[0].sum())
        cols = torch.nonzero(cm)[:, 1].view(len(cm), p)  # [b, p]
        wc = w.gather(1, cols)
        if idx is not None:
            Xw = self.X[idx[:, :, None], cols[:, None, :]]  # [b, K, p]
            wc, it, conv = self._newton(Xw, self.y[idx], wc, budget)
        else:
            step = max(1, FULL_ELEMS // (N * p))
            parts = []
            for i in range(0, len(cols), step):
                Xw = self.X[:, cols[i : i + step]].permute(1, 0, 2)  # [chunk, N, p]
                parts.append(self._newton(Xw, self.y.expand(len(Xw), N), wc[i : i + step], budget[i : i + step]))
            wc, it, conv = (torch.cat(t) for t in zip(*parts))
        return torch.zeros_like(w).scatter_(1, cols, wc), it, conv

    def _working_sets(self, rows: Tensor, m: Tensor) -> list[tuple[Tensor, Tensor | None]]:
        """Group problems by working-set size (a power of two >= twice their violators; all samples beyond N / 4)
        and pick each one's samples of smallest margin."""
        N = len(self.y)
        need = (m < 1).sum(-1)
        K = (2 * need - 1).clamp_min(1).to(torch.float64).log2().ceil().exp2().long().clamp(K_MIN, N)
        K = torch.where(K >= N // FULL_FRACTION, N, K)
        out = []
        for k in torch.unique(K).tolist():
            sel = torch.nonzero(k == K).flatten()
            idx = None if k >= N else torch.topk(m[sel], k, dim=-1, largest=False, sorted=False).indices
            out.append((rows[sel], idx))
        return out

    def _newton(self, Xw: Tensor, yw: Tensor, w: Tensor, budget: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """Generalised Newton with backtracking for each problem on its own samples and columns ``Xw [b, K, p]``,
        labels ``yw [b, K]``, from ``w [b, p]``: weights, iterations, and whether the gradient reached ``tol``."""
        C = self.C
        B, _, p = Xw.shape
        w = w.clone()
        iters = torch.zeros(B, dtype=torch.long)
        conv = torch.zeros(B, dtype=torch.bool)
        live = torch.arange(B)
        eye = torch.eye(p, dtype=w.dtype)
        steps = 0.5 ** torch.arange(1, 30, dtype=w.dtype)
        for it in range(int(budget.max()) + 1):
            Xl, yl, wl = Xw[live], yw[live], w[live]
            s = torch.bmm(Xl, wl[:, :, None])[..., 0]
            viol = (1 - yl * s).clamp_min(0)
            g = wl - 2 * C * torch.bmm((yl * viol)[:, None], Xl)[:, 0]
            small = torch.linalg.vector_norm(g, dim=-1) <= self.tol * self.g0
            done = small | (it >= budget[live])
            if done.any():
                iters[live[done]] = it
                conv[live[small]] = True
                keep = ~done
                live, Xl, yl, wl, s, viol, g = (t[keep] for t in (live, Xl, yl, wl, s, viol, g))
                if len(live) == 0:
                    break
            act = (viol > 0).to(w.dtype)
            H = 2 * C * torch.bmm(Xl.transpose(1, 2), Xl * act[:, :, None]) + eye
            L, _ = torch.linalg.cholesky_ex(H)
            d = -torch.cholesky_solve(g[:, :, None], L)[..., 0]
            Xd = torch.bmm(Xl, d[:, :, None])[..., 0]
            f0 = 0.5 * (wl * wl).sum(-1) + C * (viol * viol).sum(-1)
            gd = (g * d).sum(-1)
            w1 = wl + d  # the full Newton step first (nearly always taken), backtracking where it fails
            v1 = (1 - yl * (s + Xd)).clamp_min(0)
            f1 = 0.5 * (w1 * w1).sum(-1) + C * (v1 * v1).sum(-1)
            slack = 1e-13 * f0  # rounding: near the optimum f cannot decrease measurably
            bad = torch.nonzero(f1 > f0 + 0.01 * gd + slack).flatten()
            for t in steps:
                if len(bad) == 0:
                    break
                wt = wl[bad] + t * d[bad]
                vt = (1 - yl[bad] * (s[bad] + t * Xd[bad])).clamp_min(0)
                ft = 0.5 * (wt * wt).sum(-1) + C * (vt * vt).sum(-1)
                w1[bad] = wt
                bad = bad[ft > f0[bad] + 0.01 * t * gd[bad] + slack[bad]]
            w[live] = w1
            iters[live] = it + 1
        return w, iters, conv


def _solve_lattice(
    x_tr: Float[Tensor, "sample player d_head"],
    y: Float[Tensor, " sample"],
    index: Tensor,
    C: float,
    progress: bool,
    tol: float,
    max_iter: int,
) -> tuple[Tensor, Tensor, Tensor]:
    """Weights ``[coalition, D]`` (full feature space, zeros off the coalition) for the sorted unique ``index``,
    by size, each warm-started from its parent (the coalition without its highest head) when that is in
    ``index``; returns (sorted coalitions, weights, iterations)."""
    solver = LatticeSolver(x_tr, y, C, tol, max_iter)
    n = solver.n
    index = torch.unique(index)
    size = ((index[:, None] >> torch.arange(n)) & 1).sum(-1)
    W = torch.zeros(len(index), solver.D, dtype=x_tr.dtype)
    iters = torch.zeros(len(index), dtype=torch.long)
    bar = None
    if progress:
        from tqdm.auto import tqdm

        bar = tqdm(total=len(index), desc="batched SVC fits", unit="fit")
    WS = torch.full((len(index), K_MIN), -1, dtype=torch.long)
    prev = None  # (coalitions, rows) of the previous size
    for k in torch.unique(size).tolist():
        rows = torch.nonzero(size == k).flatten()
        masks = index[rows]
        for i in range(0, len(masks), BLOCK):
            r, m = rows[i : i + BLOCK], masks[i : i + BLOCK]
            w = torch.zeros(len(m), solver.D, dtype=x_tr.dtype)
            ws = torch.full((len(m), K_MIN), -1, dtype=torch.long)
            if prev is not None and k > 0:  # warm start: the parent without the highest head (zero new weights)
                parent = m - (1 << (63 - _clz(m)))
                pm, prow = prev
                j = torch.searchsorted(pm, parent).clamp_max(len(pm) - 1)
                found = torch.nonzero(pm[j] == parent).flatten()
                w[found], ws[found] = W[prow[j[found]]], WS[prow[j[found]]]
            W[r], iters[r], WS[r] = solver.solve(m, w, ws)
            if bar is not None:
                bar.update(len(m))
        prev = (masks, rows)
    if bar is not None:
        bar.close()
    return index, W, iters


def _clz(m: Tensor) -> Tensor:
    """Leading zeros of positive int64 values (so ``63 - _clz(m)`` is the highest set bit)."""
    top = torch.zeros_like(m)
    x = m.clone()
    for shift in (32, 16, 8, 4, 2, 1):
        big = x >= (1 << shift)
        top += big * shift
        x = torch.where(big, x >> shift, x)
    return 63 - top


def svc_weights(
    x_tr: Float[Tensor, "sample player d_head"],
    y_tr: Tensor,
    index: Int[Tensor, " coalition"],
    *,
    C: float = 1000.0,
    tol: float = 1e-9,
    max_iter: int = 100,
) -> tuple[Tensor, Tensor]:
    """The binary SVC of each coalition bitmask in ``index`` (labels: +1 for the larger one): weights
    ``[coalition, 1 + n * d_head]`` (intercept first, then every player's d_head columns, zero off the
    coalition), and the Newton iterations each took."""
    classes = torch.unique(y_tr)
    if len(classes) != 2:
        raise InterpError(f"svc_weights fits binary problems; the labels hold {len(classes)} classes")
    y = torch.where(y_tr == classes[1], 1.0, -1.0).double()
    index = torch.as_tensor(index, dtype=torch.long)
    with one_thread():
        uniq, W, iters = _solve_lattice(x_tr.double(), y, index, C, False, tol, max_iter)
    pos = torch.searchsorted(uniq, index)
    return W[pos], iters[pos]


def _decisions(x_te: Float[Tensor, "test player d_head"], W: Tensor) -> Tensor:
    M, n, e = x_te.shape
    xf = torch.cat([torch.ones(M, 1, dtype=x_te.dtype), x_te.reshape(M, n * e)], 1)
    return W @ xf.T


def svc_test_accuracy(
    x_tr: Float[Tensor, "sample player d_head"],
    y_tr: Int[Tensor, " sample"],
    x_te: Float[Tensor, "test player d_head"],
    y_te: Int[Tensor, " test"],
    index: Int[Tensor, " coalition"],
    *,
    C: float = 1000.0,
    tol: float = 1e-9,
    max_iter: int = 100,
    progress: bool = False,
    return_iters: bool = False,
):
    """Test accuracy of the exact LinearSVC (see the module doc) of every coalition bitmask in ``index``:
    features of coalition S are ``x[:, i, :]`` for the players ``i`` in S (centre them first, as the probes do)."""
    index = torch.as_tensor(index, dtype=torch.long)
    uniq, inverse = torch.unique(index, return_inverse=True)
    classes = torch.unique(y_tr)
    if len(classes) < 2:
        raise InterpError(f"the train labels contain one class only ({classes.tolist()}); a separator needs two")
    x_tr, x_te = x_tr.double(), x_te.double()
    with one_thread():
        return _svc_test_accuracy(
            x_tr, y_tr, x_te, y_te, uniq, inverse, classes, C, tol, max_iter, progress, return_iters
        )


@contextmanager
def one_thread():
    """Run torch on one intra-op thread inside (restored after): the solver's operations are small, and with two
    threads on a loaded two-core machine all 2^16 fits took 277 s instead of 34 s (thread synchronisation)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def _svc_test_accuracy(x_tr, y_tr, x_te, y_te, uniq, inverse, classes, C, tol, max_iter, progress, return_iters):
    iters = []
    weights = []
    for c in classes[1:] if len(classes) == 2 else classes:  # binary: one problem; else one-vs-rest
        y = torch.where(y_tr == c, 1.0, -1.0).double()
        _, W, it = _solve_lattice(x_tr, y, uniq, C, progress, tol, max_iter)
        weights.append(W)
        iters.append(it)
    acc_u = torch.empty(len(uniq), dtype=torch.float64)
    step = max(1, (1 << 22) // max(1, len(y_te)))  # decisions [coalition, test] a block at a time
    for i in range(0, len(uniq), step):
        decs = [_decisions(x_te, W[i : i + step]) for W in weights]
        if len(classes) == 2:
            pred = torch.where(decs[0] > 0, classes[1], classes[0])
        else:
            pred = classes[torch.stack(decs, -1).argmax(-1)]
        acc_u[i : i + step] = (pred == y_te[None]).double().mean(-1)
    acc = acc_u[inverse]
    if return_iters:
        return acc, torch.cat(iters)
    return acc
