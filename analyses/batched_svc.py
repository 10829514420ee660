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
active samples ``A`` (margin < 1), a batched Cholesky solve, and an exact line search (f along the step is a convex
piecewise quadratic), as in Keerthi and DeCoste's modified finite Newton method ("A modified finite Newton method
for fast solution of large scale linear SVMs", 2005). What makes 2^16 fits cheap:

- each problem works in its own columns (intercept and its heads' d_head outputs), batched ``[problem, K, p]``;
- working sets: near-separable data leave a few dozen active samples of 7,500, so Newton runs on each problem's
  K samples of smallest margin (K >= twice its violators) and then every sample is checked: the restricted
  optimum is the full one exactly when no sample outside the working set violates its margin there (the two
  gradients are then equal); otherwise the working set is rebuilt and Newton goes on. Problems with many
  violators (bad heads) use all samples, in the full feature space: their Hessians' active sums
  ``sum_i x_ij x_ik`` are one matrix product of the active indicators with a table of every sample's pairwise
  products, instead of a copy of each problem's columns of all samples (a third of all 2^16 fits' time went there);
- warm starts along the subset lattice: coalitions are solved by size, and each starts from its parent (the
  coalition without its highest head): the parent's weights with zeros for the new head (so the same margins)
  and, as its first working set, the smallest-margin part of the parent's last one (all the parent's violators,
  so all the child's at the start). Models that are not yet near-separable (halving's, at 95% validation accuracy)
  have a hundred or more violators per coalition, so working sets of up to 512 are handed on.

Stopping rule: ``|grad f(w)| <= tol * max(1, |w|)`` with ``tol = 1e-9``, or the Newton step as short, where
rounding keeps the gradient above that (a large C makes its terms large). f is 1-strongly convex, so the first puts
the weights within ``tol`` of the minimiser's, relative to their size, whatever C and whatever the warm start;
liblinear's is ``|grad f| <= 1e-4 * |grad f(0)|`` (scaled by the smaller class fraction), so scikit-learn's
separator is the less exact of the two. A fit that reaches ``max_iter`` Newton steps first is reported (a
``RuntimeWarning``), not passed off as a minimiser.

Two engines run this method: the C one (:mod:`analyses.svc_native`: one coalition at a time, depth first, each
starting from its parent's final margins; ~4x faster on one thread for Table 1's 65,536 coalitions, where torch's
batching costs more than the arithmetic), used wherever a C compiler builds it and it passes its self-check, and the
batched torch one here, the reference and the fallback (``engine=`` chooses). Both stop within ``tol`` of the same
minimiser, so their test accuracies differ only for a test point that close to a boundary.

Binary labels: ``y = +1`` for the larger label (scikit-learn's ``classes_[1]``), predicted where the decision is
> 0. More than two classes: one-vs-rest (as ``LinearSVC``), the class with the largest decision.
"""

from __future__ import annotations

import functools
import math
import warnings
from contextlib import contextmanager
from numbers import Integral, Real

import torch
from jaxtyping import Float, Int
from torch import Tensor

from interp.errors import InterpError

BLOCK = 128  # problems per batched Newton on working sets (and per margin check)
FULL_BLOCK = 256  # problems per batched Newton on all samples
LEVEL_BLOCK = 4096  # coalitions of one size per call of LatticeSolver.solve (gathers the all-sample problems)
K_MIN = 64  # smallest working set
PASS_MAX = 512  # largest working set handed on to a child as its first
FULL_FRACTION = 4  # working sets of more than N / 4 samples: all samples
FULL_ELEMS = 1 << 22  # problems x samples x columns per chunk when all samples are used
LINE_STEPS = 60  # Newton or bisection steps of one line search at most
ENGINES = ("auto", "c", "torch")
MAX_ITER = 1_000_000  # Newton steps at most (a bound, so a huge max_iter is refused rather than looping for ever)
OUTER_ELEMS = 1 << 23  # samples x D (D + 1) / 2 at most for the table of products that all-sample Hessians read


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
        self._outer: Tensor | None = None  # [N, D (D + 1) / 2]: each sample's x_j x_k, j <= k (built when needed)
        self._pairs = torch.triu_indices(self.D, self.D)  # its (j, k)

    def column_mask(self, masks: Int[Tensor, " problem"]) -> Float[Tensor, "problem D"]:
        bits = ((masks[:, None] >> torch.arange(self.n)) & 1).to(self.X.dtype)
        return torch.cat([torch.ones(len(masks), 1, dtype=self.X.dtype), bits.repeat_interleave(self.e, 1)], 1)

    def solve(self, masks: Tensor, w: Tensor, ws: Tensor | None = None) -> tuple[Tensor, Tensor, Tensor]:
        """The exact SVC of each coalition of ``masks`` from the weights ``w`` (``[problem, D]``) and, optionally,
        first working sets ``ws [problem, PASS_MAX]`` (a parent's: its margins are the child's at the start; -1
        pads, rows of -1: none). Returns the weights, the Newton iterations each took (``max_iter + 1``: not
        converged), and each problem's last working set in the same form (-1 where it was solved on all samples or
        has more violators than half of it: no good first working set for a child)."""
        X, y = self.X, self.y
        cm = self.column_mask(masks)
        w = (w * cm).clone()
        B = len(masks)
        iters = torch.zeros(B, dtype=torch.long)
        out_ws = torch.full((B, PASS_MAX), -1, dtype=torch.long)
        # round 0: problems with a first working set go straight to Newton; the others need their margins
        width = torch.zeros(B, dtype=torch.long) if ws is None else (ws >= 0).sum(-1)
        work = []
        for k in width.unique().tolist():
            if k:
                rows = torch.nonzero(width == k).flatten()
                work.append((rows, ws[rows, :k]))
        rest = torch.nonzero(width == 0).flatten()
        for i in range(0, len(rest), BLOCK):
            r = rest[i : i + BLOCK]
            work += self._working_sets(r, y * (w[r] @ X.T))
        for _ in range(self.max_iter + 1):
            checked = []
            for rows, idx in _by_size(work):
                step = max(1, min(FULL_BLOCK, FULL_ELEMS // len(y))) if idx is None else BLOCK  # [b, N] bounded
                for i in range(0, len(rows), step):
                    r, ix = rows[i : i + step], None if idx is None else idx[i : i + step]
                    wk, it, conv = self._run(ix, w[r], cm[r], self.max_iter + 1 - iters[r])
                    w[r] = wk
                    iters[r] += it
                    checked.append((r, ix, conv))
            work = []
            for rows, idx, conv in checked:  # optimal iff converged on the working set and nobody outside violates
                m = y * (w[rows] @ X.T)
                viol = (m < 1).sum(-1)
                inside = viol if idx is None else (m.gather(1, idx) < 1).sum(-1)
                ok = (conv & (inside == viol)) | (iters[rows] > self.max_iter)
                if idx is not None and idx.shape[1] <= PASS_MAX:  # a child's first: the smallest margins of idx
                    good = torch.nonzero(ok & (viol <= idx.shape[1] // 2)).flatten()
                    size = _ws_size(viol[good], K_MIN, idx.shape[1])
                    for k in size.unique().tolist():
                        sel = good[size == k]
                        near = torch.topk(m[sel].gather(1, idx[sel]), k, dim=-1, largest=False, sorted=False).indices
                        out_ws[rows[sel], :k] = idx[sel].gather(1, near)
                if (~ok).any():
                    work += self._working_sets(rows[~ok], m[~ok])
            if not work:
                break
        return w, iters, out_ws

    def _run(self, idx: Tensor | None, w: Tensor, cm: Tensor, budget: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """Newton on each problem's own columns (intercept and its heads': problems of one call have the same
        number) and its working set ``idx`` (None: all samples, in chunks), weights returned in full space."""
        N = len(self.y)
        if idx is None and N * self.D * (self.D + 1) // 2 <= OUTER_ELEMS:
            return self._newton_full(w, cm, budget)
        p = int(cm[0].sum())
        cols = torch.nonzero(cm)[:, 1].view(len(cm), p)  # [b, p]
        wc = w.gather(1, cols)
        if idx is not None:
            Xw = torch.take(self.X, (idx * self.D)[:, :, None] + cols[:, None, :])  # [b, K, p]; 2x X[idx, cols]
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
        K = _ws_size((m < 1).sum(-1), K_MIN, N)
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
        for it in range(int(budget.max()) + 1):
            Xl, yl, wl = Xw[live], yw[live], w[live]
            s = torch.bmm(wl[:, None], Xl.transpose(1, 2))[:, 0]  # row times matrix: MKL's batched X @ w is 4x slower
            viol = (1 - yl * s).clamp_min(0)
            g = wl - 2 * C * torch.bmm((yl * viol)[:, None], Xl)[:, 0]
            small = self._converged(g, wl)
            done = small | (it >= budget[live])
            if done.any():
                live, Xl, yl, wl, s, viol, g = _retire(it, done, small, iters, conv, live, Xl, yl, wl, s, viol, g)
                if len(live) == 0:
                    break
            act = (viol > 0).to(w.dtype)
            H = 2 * C * torch.bmm(Xl.transpose(1, 2), Xl * act[:, :, None]) + eye
            d = -torch.cholesky_solve(g[:, :, None], torch.linalg.cholesky_ex(H)[0])[..., 0]
            tiny = self._converged(d, wl)  # the step itself is negligible (the gradient at its rounding floor)
            if tiny.any():
                live, Xl, yl, wl, s, viol, g, d = _retire(it, tiny, tiny, iters, conv, live, Xl, yl, wl, s, viol, g, d)
                if len(live) == 0:
                    break
            Xd = torch.bmm(d[:, None], Xl.transpose(1, 2))[:, 0]
            w[live] = self._line_search(wl, yl, s, viol, g, d, Xd)
            iters[live] = it + 1
        return w, iters, conv

    def _newton_full(self, w: Tensor, cm: Tensor, budget: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """The same Newton on all samples, in the full feature space (weights ``w [b, D]``, zero off each problem's
        columns ``cm``): no per-problem copy of the samples. Margins and gradients are ``[b, N] x [N, D]`` products;
        the Hessian's active sums ``sum_i act_i x_ij x_ik`` are one product of the active indicators with the table
        of every sample's ``x_ij x_ik`` (``j <= k``), kept on the problem's columns with the identity elsewhere, so
        the step is zero off them. For problems with many margin violators (bad coalitions), whose all-sample
        Newton was two thirds of the 2^16 fits' time when each problem gathered its own ``[N, p]`` columns."""
        C, X, y = self.C, self.X, self.y
        B, D = w.shape
        j, k = self._pairs
        if self._outer is None:
            self._outer = (X[:, j] * X[:, k]).contiguous()
        pair_mask = cm[:, j] * cm[:, k]  # [B, P]: pairs of the problem's own columns
        w = w.clone()
        iters = torch.zeros(B, dtype=torch.long)
        conv = torch.zeros(B, dtype=torch.bool)
        live = torch.arange(B)
        eye = torch.eye(D, dtype=w.dtype)
        for it in range(int(budget.max()) + 1):
            wl, cl = w[live], cm[live]
            s = wl @ X.T  # [b, N]
            viol = (1 - y * s).clamp_min(0)
            g = (wl - 2 * C * ((y * viol) @ X)) * cl
            small = self._converged(g, wl)
            done = small | (it >= budget[live])
            if done.any():
                live, wl, s, viol, g = _retire(it, done, small, iters, conv, live, wl, s, viol, g)
                if len(live) == 0:
                    break
            act = (viol > 0).to(w.dtype)
            packed = 2 * C * (act @ self._outer) * pair_mask[live]  # [b, P]
            H = eye.repeat(len(live), 1, 1)
            H[:, j, k] += packed
            H[:, k, j] = H[:, j, k]
            d = -torch.cholesky_solve(g[:, :, None], torch.linalg.cholesky_ex(H)[0])[..., 0]
            tiny = self._converged(d, wl)
            if tiny.any():
                live, wl, s, viol, g, d = _retire(it, tiny, tiny, iters, conv, live, wl, s, viol, g, d)
                if len(live) == 0:
                    break
            w[live] = self._line_search(wl, y.expand_as(s), s, viol, g, d, d @ X.T)
            iters[live] = it + 1
        return w, iters, conv

    def _converged(self, v: Tensor, w: Tensor) -> Tensor:
        """``|v| <= tol * max(1, |w|)``, for the gradient or the Newton step ``v`` at ``w``. The gradient: f is
        1-strongly convex (its ``|w|^2 / 2``), so ``|w - w*| <= |grad f(w)|``: the weights are within ``tol`` of the
        minimiser's, relative to their size, whatever C and whatever the start. The step: where rounding keeps the
        gradient above that (a large C makes its terms large), a negligible Newton step ``H^-1 grad f`` says the
        same, since f is quadratic between changes of its active samples."""
        return torch.linalg.vector_norm(v, dim=-1) <= self.tol * torch.linalg.vector_norm(w, dim=-1).clamp_min(1)

    def _line_search(self, w: Tensor, y: Tensor, s: Tensor, viol: Tensor, g: Tensor, d: Tensor, Xd: Tensor) -> Tensor:
        """The exact minimiser of f along the Newton step, as in Keerthi and DeCoste's modified finite Newton method
        ("A modified finite Newton method for fast solution of large scale linear SVMs", 2005): ``f(w + t d)`` is a
        convex piecewise quadratic in t, so Newton on its derivative (continuous, piecewise linear, nondecreasing)
        from t = 1 finds the root exactly once it stays in one piece; each step is kept inside the bracket where the
        derivative changes sign (bisection, or doubling while there is no upper end, where it leaves it).
        ``s``: the scores at ``w``, ``Xd``: the step's. Backtracking to a sufficient decrease (Armijo) instead took
        tiny steps on separable data with a large C (the full step overshoots as inactive samples become active)
        and stopped at ``max_iter`` far from the minimiser."""
        C = self.C
        r, q = 1 - y * s, y * Xd  # the slack at t = 0 and its rate of decrease
        wd, dd = (w * d).sum(-1), (d * d).sum(-1)
        t = torch.ones_like(wd)
        lo, hi = torch.zeros_like(wd), torch.full_like(wd, float("inf"))
        live = torch.nonzero(dd > 0).flatten()
        for _ in range(LINE_STEPS):
            tl, ql = t[live], q[live]
            rl = r[live] - tl[:, None] * ql
            aq = (rl > 0).to(w.dtype) * ql
            terms = 2 * C * aq * rl
            dphi = wd[live] + tl * dd[live] - terms.sum(-1)
            d2 = dd[live] + 2 * C * (aq * ql).sum(-1)
            exact = dphi.abs() <= 1e-13 * (wd[live].abs() + tl * dd[live] + terms.abs().sum(-1))
            up = dphi > 0
            hl = torch.where(up, torch.minimum(hi[live], tl), hi[live])
            ll = torch.where(up, lo[live], torch.maximum(lo[live], tl))
            tn = tl - dphi / d2
            inside = (tn > ll) & (tn < hl)
            tn = torch.where(inside, tn, torch.where(torch.isinf(hl), 2 * tl, 0.5 * (ll + hl)))
            hi[live], lo[live] = hl, ll
            t[live] = torch.where(exact, tl, tn)
            live = live[~(exact | (tn == tl))]
            if len(live) == 0:
                break
        return w + t[:, None] * d


def _solve_lattice(
    x_tr: Float[Tensor, "sample player d_head"],
    y: Float[Tensor, " sample"],
    index: Tensor,
    C: float,
    progress: bool,
    tol: float,
    max_iter: int,
    engine: str = "auto",
) -> tuple[Tensor, Tensor, Tensor]:
    """Weights ``[coalition, D]`` (full feature space, zeros off the coalition) for the sorted unique ``index``,
    by size, each warm-started from its parent (the coalition without its highest head) when that is in
    ``index``; returns (sorted coalitions, weights, iterations). ``engine``: ``"c"`` the same method one coalition
    at a time in C (:mod:`analyses.svc_native`, ~4x faster on one thread), ``"torch"`` batched here, ``"auto"``
    the C one where it is built and passed its self-check in this process."""
    from .svc_native import solve_lattice_native, without_highest

    _check_engine(engine)
    if engine == "c" or (engine == "auto" and engine_status() == "c"):
        return solve_lattice_native(x_tr, y, index, C, progress, tol, max_iter)
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
    prev = None  # the previous size's coalitions and rows, and their last working sets
    for k in torch.unique(size).tolist():
        rows = torch.nonzero(size == k).flatten()
        masks = index[rows]
        level_ws = torch.full((len(masks), PASS_MAX), -1, dtype=torch.int32)  # int32: half the memory
        for i in range(0, len(masks), LEVEL_BLOCK):
            r, m = rows[i : i + LEVEL_BLOCK], masks[i : i + LEVEL_BLOCK]
            w = torch.zeros(len(m), solver.D, dtype=x_tr.dtype)
            ws = torch.full((len(m), PASS_MAX), -1, dtype=torch.long)
            if prev is not None and k > 0:  # warm start: the parent without the highest head (zero new weights)
                parent = without_highest(m)
                pm, prow, pws = prev
                j = torch.searchsorted(pm, parent).clamp_max(len(pm) - 1)
                found = torch.nonzero(pm[j] == parent).flatten()
                w[found], ws[found] = W[prow[j[found]]], pws[j[found]].long()
            W[r], iters[r], level_ws[i : i + LEVEL_BLOCK] = solver.solve(m, w, ws)  # long -> int32: N < 2^31
            if bar is not None:
                bar.update(len(m))
        prev = (masks, rows, level_ws)
    if bar is not None:
        bar.close()
    return index, W, iters


def _retire(it: int, done: Tensor, converged: Tensor, iters: Tensor, conv: Tensor, live: Tensor, *rows: Tensor):
    """Finish the live problems ``done`` after ``it`` Newton steps (``converged``: those that met the stopping rule)
    and return the others' indices and rows of ``rows``."""
    iters[live[done]] = it
    conv[live[converged]] = True
    keep = ~done
    return (live[keep], *(t[keep] for t in rows))


def _ws_size(violators: Tensor, low: int, high: int) -> Tensor:
    """Working-set sizes: the power of two >= twice the violators, within ``[low, high]``."""
    return (2 * violators - 1).clamp_min(1).to(torch.float64).log2().ceil().exp2().long().clamp(low, high)


def _by_size(work: list[tuple[Tensor, Tensor | None]]) -> list[tuple[Tensor, Tensor | None]]:
    """Working sets of the same size merged into one batch (``None``: all samples), so that problems from many
    checks run their Newton together."""
    groups: dict[int, list[tuple[Tensor, Tensor | None]]] = {}
    for rows, idx in work:
        if len(rows):
            groups.setdefault(-1 if idx is None else idx.shape[1], []).append((rows, idx))
    return [
        (torch.cat([r for r, _ in g]), None if k < 0 else torch.cat([i for _, i in g]))  # type: ignore[misc]
        for k, g in groups.items()
    ]


def _checked(x_tr, y_tr, index, C, tol, max_iter, x_te=None, y_te=None) -> tuple[Tensor, Tensor, Tensor | None]:
    """Refuse what would give a silent wrong number: shapes, non-finite features or labels, bitmasks outside the
    players, a C or tol that is not a finite positive number, a max_iter outside 1 .. MAX_ITER, an empty test set.
    Returns the features as float64 and the bitmasks as int64."""
    x_tr = torch.as_tensor(x_tr)
    if x_tr.dim() != 3:
        raise InterpError(f"x_tr must be [sample, player, d_head]; got shape {tuple(x_tr.shape)}")
    N, n, e = x_tr.shape
    y_tr = torch.as_tensor(y_tr)
    if y_tr.shape != (N,):
        raise InterpError(f"y_tr must hold one label per train sample ({N}); got shape {tuple(y_tr.shape)}")
    if x_te is not None:
        x_te = torch.as_tensor(x_te)
        if x_te.dim() != 3 or x_te.shape[1:] != (n, e):
            raise InterpError(f"x_te must be [test, {n}, {e}] like x_tr's players and d_head; got {tuple(x_te.shape)}")
        if torch.as_tensor(y_te).shape != (len(x_te),):
            raise InterpError(f"y_te must hold one label per test sample ({len(x_te)}); got {tuple(y_te.shape)}")
    for name, x in (("x_tr", x_tr), ("x_te", x_te)):
        if x is not None and not bool(torch.isfinite(x).all()):
            raise InterpError(f"{name} holds NaN or infinite values; a separator needs finite features")
    index = torch.as_tensor(index)
    if index.is_floating_point() or index.dtype == torch.bool or index.dim() != 1:
        raise InterpError(
            f"index must be a 1-D tensor of integer bitmasks; got {index.dtype} of shape {tuple(index.shape)}"
        )
    index = index.long().contiguous()
    if len(index) and (int(index.min()) < 0 or int(index.max()) >= 1 << n):
        raise InterpError(
            f"index holds bitmasks outside 0 .. 2^{n} - 1 ({n} players): {int(index.min())} .. {int(index.max())}"
        )
    numbers = all(isinstance(v, Real) and not isinstance(v, bool) for v in (C, tol)) and (
        isinstance(max_iter, Integral) and not isinstance(max_iter, bool)
    )  # NumPy's scalars are Real / Integral too
    if not (numbers and math.isfinite(C) and math.isfinite(tol) and C > 0 and tol > 0 and 1 <= max_iter <= MAX_ITER):
        raise InterpError(
            f"C and tol must be finite positive numbers and max_iter an integer from 1 to {MAX_ITER:,}; got "
            f"C={C!r}, tol={tol!r}, max_iter={max_iter!r}"
        )
    if y_tr.is_floating_point() and not bool(torch.isfinite(y_tr).all()):
        raise InterpError("y_tr holds NaN or infinite labels")
    if x_te is not None and len(x_te) == 0:
        raise InterpError("the test set is empty; a test accuracy needs test samples")
    return x_tr.double(), index, (None if x_te is None else x_te.double())


@functools.cache
def engine_status() -> str:
    """``"c"`` where the C solver is built and agrees with the torch solver here (weights within 1e-7 of their norm
    on every coalition of a small lattice, at two C's), else why not (the torch solver is then used)."""
    from .svc_native import library, solve_lattice_native

    try:
        library()
    except OSError as e:
        return f"torch: {e}"
    g = torch.Generator().manual_seed(0)
    N, n, e = 300, 4, 2
    labels = torch.randint(0, 2, (N,), generator=g)
    x = torch.randn(N, n, e, generator=g, dtype=torch.float64) + 0.8 * torch.randn(2, n, e, generator=g)[labels]
    x = x - x.mean(0)
    y = torch.where(labels == 1, 1.0, -1.0).double()
    index = torch.arange(1 << n)
    for C in (1.0, 1000.0):
        _, want, _ = _solve_lattice(x, y, index, C, False, 1e-9, 100, engine="torch")
        try:
            _, got, it = solve_lattice_native(x, y, index, C, False, 1e-9, 100)
        except (InterpError, MemoryError) as err:
            return f"torch: the C solver failed its self-check here ({err})"
        gap = float(((got - want).norm(dim=-1) / want.norm(dim=-1).clamp_min(1)).max())
        if not (gap <= 1e-7 and int(it.max()) <= 100 and int(it.min()) >= 0):
            return f"torch: the C solver differs from the torch solver here (weights {gap:.1e} apart at C = {C:g})"
    return "c"


def _check_engine(engine: str) -> None:
    """An unknown engine, or ``"c"`` where the C solver is not built or failed its self-check here: a clear error."""
    if engine not in ENGINES:
        raise InterpError(f"unknown SVC engine {engine!r}; expected one of {', '.join(ENGINES)}")
    if engine == "c" and engine_status() != "c":
        raise InterpError(f"the C SVC solver is not available here ({engine_status()}); use engine='torch'")


def _warn_unconverged(iters: Tensor, max_iter: int) -> None:
    bad = int((iters > max_iter).sum())
    if bad:
        warnings.warn(
            f"{bad} of {iters.numel()} SVC fits did not converge in max_iter={max_iter} Newton steps; their "
            "accuracies are of weights short of the minimiser (raise max_iter)",
            RuntimeWarning,
            stacklevel=3,
        )


def svc_weights(
    x_tr: Float[Tensor, "sample player d_head"],
    y_tr: Tensor,
    index: Int[Tensor, " coalition"],
    *,
    C: float = 1000.0,
    tol: float = 1e-9,
    max_iter: int = 100,
    engine: str = "auto",
) -> tuple[Tensor, Tensor]:
    """The binary SVC of each coalition bitmask in ``index`` (labels: +1 for the larger one): weights
    ``[coalition, 1 + n * d_head]`` (intercept first, then every player's d_head columns, zero off the
    coalition), and the Newton iterations each took. ``engine``: ``"auto"`` (the C solver where it is available),
    ``"c"`` or ``"torch"`` (see :func:`_solve_lattice`)."""
    x_tr, index, _ = _checked(x_tr, y_tr, index, C, tol, max_iter)
    _check_engine(engine)
    classes = torch.unique(torch.as_tensor(y_tr))
    if len(classes) != 2:
        raise InterpError(f"svc_weights fits binary problems; the labels hold {len(classes)} classes")
    y = torch.where(torch.as_tensor(y_tr) == classes[1], 1.0, -1.0).double()
    with one_thread():
        uniq, W, iters = _solve_lattice(x_tr, y, index, C, False, tol, max_iter, engine)
    _warn_unconverged(iters, max_iter)
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
    engine: str = "auto",
):
    """Test accuracy of the exact LinearSVC (see the module doc) of every coalition bitmask in ``index``:
    features of coalition S are ``x[:, i, :]`` for the players ``i`` in S (centre them first, as the probes do).
    ``engine``: which solver (see :func:`_solve_lattice`); every one gives the same minimiser within ``tol``.
    ``return_iters``: also the Newton steps of each entry of ``index`` (``[coalition]``; one-vs-rest: ``[class,
    coalition]``, the classes in sorted order)."""
    x_tr, index, x_te = _checked(x_tr, y_tr, index, C, tol, max_iter, x_te, y_te)
    _check_engine(engine)
    y_tr, y_te = torch.as_tensor(y_tr), torch.as_tensor(y_te)
    if len(x_tr) == 0:
        raise InterpError("the train set is empty; a separator needs samples of two classes")
    uniq, inverse = torch.unique(index, return_inverse=True)
    classes = torch.unique(y_tr)
    if len(classes) < 2:
        raise InterpError(f"the train labels contain one class only ({classes.tolist()}); a separator needs two")
    with one_thread():
        acc, iters = _svc_test_accuracy(
            x_tr, y_tr, x_te, y_te, uniq, inverse, classes, C, tol, max_iter, progress, engine
        )
    _warn_unconverged(iters, max_iter)
    if len(classes) == 2:
        iters = iters[0]
    return (acc, iters[..., inverse]) if return_iters else acc


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


def _svc_test_accuracy(x_tr, y_tr, x_te, y_te, uniq, inverse, classes, C, tol, max_iter, progress, engine):
    iters = []
    weights = []
    for c in classes[1:] if len(classes) == 2 else classes:  # binary: one problem; else one-vs-rest
        y = torch.where(y_tr == c, 1.0, -1.0).double()
        _, W, it = _solve_lattice(x_tr, y, uniq, C, progress, tol, max_iter, engine)
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
    return acc_u[inverse], torch.stack(iters)  # iterations [problem, unique coalition]
