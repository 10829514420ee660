"""Many linear SVCs at once: the separation value of every head coalition (seed 000 Definition 5.2) in torch.

Each coalition S has its own problem: scikit-learn's ``LinearSVC(C, loss="squared_hinge", penalty="l2",
dual=False)``, i.e. liblinear's primal L2-regularised squared-hinge SVM with the intercept as an extra feature
of value ``intercept_scaling = 1`` that is regularised like a weight:

    minimise  f(w) = 1/2 |w|^2 + C * sum_i max(0, 1 - y_i w.x_i)^2,   x_i = (1, features of S),  y_i = +-1

on the (already centred) features of S: the ``d_head`` outputs of each head of S, concatenated. f is strictly
convex, so the minimiser is unique and any exact solver gives the same separator; scikit-learn's liblinear stops
at a gradient tolerance (``tol=1e-4``, relative), this solver goes on to the exact minimiser, so the two differ
only where a test point lies within liblinear's tolerance of the boundary.

The solver is generalised Newton (f is piecewise quadratic and C^1): Hessian ``I + 2C X_A^T X_A`` over the
active samples ``A`` (margin < 1), a batched Cholesky solve, and a backtracking (Armijo) line search evaluated for
all step sizes at once. Problems are batched by coalition size (same feature count), and each coalition starts
from the solution of its parent (the coalition without its highest head, zero weights for the new head), which is
solved first: warm starts along the subset lattice. Converged problems leave the batch.

Binary labels: ``y = +1`` for the larger label (scikit-learn's ``classes_[1]``), predicted where the decision is
> 0. More than two classes: one-vs-rest (as ``LinearSVC``), the class with the largest decision.
"""

from __future__ import annotations

import torch
from jaxtyping import Float, Int
from torch import Tensor

from interp.errors import InterpError

MAX_ELEMS = 1 << 23  # batch x train x features per gathered block (float64: 64 MiB)


def _gather(x: Float[Tensor, "sample feature"], cols: Int[Tensor, "problem p"]) -> Float[Tensor, "problem sample p"]:
    return x[:, cols].permute(1, 0, 2)


def newton_svc(X: Float[Tensor, "problem sample p"], y: Float[Tensor, "sample"], w0: Float[Tensor, "problem p"],
               C: float, tol: float = 1e-9, max_iter: int = 100) -> tuple[Tensor, Tensor]:
    """Minimise f(w) above for every problem of the batch (same samples and labels, own features), from ``w0``.
    Returns the weights ``[problem, p]`` (the first feature is the intercept's column of ones) and the
    number of Newton iterations each took (``max_iter`` + 1 where it did not reach ``tol``)."""
    B, N, p = X.shape
    w = w0.clone()
    iters = torch.full((B,), max_iter + 1, dtype=torch.long)
    live = torch.arange(B)
    eye = torch.eye(p, dtype=X.dtype)
    steps = 0.5 ** torch.arange(0, 30, dtype=X.dtype)  # line-search step sizes, all tried at once
    g0 = 2 * C * torch.linalg.vector_norm(torch.einsum("bnp,n->bp", X, y), dim=-1)  # |grad f(0)|
    for it in range(max_iter + 1):
        Xl, wl = X[live], w[live]
        s = torch.bmm(Xl, wl[:, :, None])[..., 0]  # [b, N]
        viol = (1 - y * s).clamp_min(0)
        g = wl - 2 * C * torch.einsum("bnp,bn->bp", Xl, y * viol)
        done = torch.linalg.vector_norm(g, dim=-1) <= tol * g0[live].clamp_min(1e-300)
        if it == max_iter:
            break
        if done.any():
            iters[live[done]] = it
            keep = ~done
            live, Xl, wl, s, viol, g = live[keep], Xl[keep], wl[keep], s[keep], viol[keep], g[keep]
            if len(live) == 0:
                break
        act = (viol > 0).to(X.dtype)
        H = eye + 2 * C * torch.bmm(Xl.transpose(1, 2), Xl * act[:, :, None])
        L, info = torch.linalg.cholesky_ex(H)
        d = -torch.cholesky_solve(g[:, :, None], L)[..., 0]
        Xd = torch.bmm(Xl, d[:, :, None])[..., 0]  # [b, N]
        f0 = 0.5 * (wl * wl).sum(-1) + C * (viol * viol).sum(-1)
        gd = (g * d).sum(-1)
        wt = wl[:, None] + steps[None, :, None] * d[:, None]  # [b, T, p]
        vt = (1 - y * (s[:, None] + steps[None, :, None] * Xd[:, None])).clamp_min(0)  # [b, T, N]
        ft = 0.5 * (wt * wt).sum(-1) + C * (vt * vt).sum(-1)
        ok = ft <= f0[:, None] + 0.01 * steps[None] * gd[:, None]
        first = torch.where(ok.any(-1), ok.float().argmax(-1), torch.full_like(gd, len(steps) - 1, dtype=torch.long))
        w[live] = wl + steps[first][:, None] * d
    return w, iters


def _solve_lattice(x_tr: Float[Tensor, "sample player d_head"], y: Float[Tensor, "sample"], index: Tensor, C: float,
                   progress: bool, tol: float, max_iter: int) -> tuple[dict[int, Tensor], dict[int, Tensor], Tensor]:
    """Weights for every coalition of ``index``, by size, warm-started from parents. Returns per size k:
    the coalitions (sorted), their weights ``[count, 1 + k*e]``, and the iteration counts of all."""
    N, n, e = x_tr.shape
    xf = torch.cat([torch.ones(N, 1, dtype=x_tr.dtype), x_tr.reshape(N, n * e)], 1)  # intercept column first
    size = ((index[:, None] >> torch.arange(n)) & 1).sum(-1)
    order = torch.argsort(index)
    index, size = index[order], size[order]
    pos = {}  # size -> (sorted masks, weights)
    masks_by, w_by = {}, {}
    iters_all = []
    sizes = torch.unique(size).tolist()
    bar = None
    if progress:
        from tqdm.auto import tqdm

        bar = tqdm(total=len(index), desc="batched SVC fits", unit="fit")
    for k in sizes:
        masks = index[size == k]
        p = 1 + k * e
        bits = (masks[:, None] >> torch.arange(n)) & 1
        players = torch.nonzero(bits)[:, 1].view(len(masks), k)  # ascending players per coalition
        cols = torch.cat([torch.zeros(len(masks), 1, dtype=torch.long),
                          (1 + players[:, :, None] * e + torch.arange(e)).reshape(len(masks), k * e)], 1)
        w0 = torch.zeros(len(masks), p, dtype=x_tr.dtype)
        if k - 1 in masks_by and k > 0:  # warm start: the parent without the highest head
            top = players[:, -1]
            parent = masks - (1 << top)
            pm, pw = masks_by[k - 1], w_by[k - 1]
            j = torch.searchsorted(pm, parent).clamp_max(len(pm) - 1)
            found = pm[j] == parent
            w0[found, : p - e] = pw[j[found]]
        W = torch.empty_like(w0)
        step = max(1, MAX_ELEMS // (N * p))
        for i in range(0, len(masks), step):
            X = _gather(xf, cols[i : i + step])
            W[i : i + step], it = newton_svc(X, y, w0[i : i + step], C, tol, max_iter)
            iters_all.append(it)
            if bar is not None:
                bar.update(len(it))
        masks_by[k], w_by[k] = masks, W
    if bar is not None:
        bar.close()
    return masks_by, w_by, torch.cat(iters_all) if iters_all else torch.zeros(0, dtype=torch.long)


def svc_weights(x_tr: Float[Tensor, "sample player d_head"], y_tr: Tensor, index: Int[Tensor, "coalition"], *,
                C: float = 1000.0, tol: float = 1e-9, max_iter: int = 100) -> tuple[list[Tensor], Tensor]:
    """The binary SVC of each coalition bitmask in ``index`` (labels: +1 for the larger one): per coalition its
    weights ``(intercept, features of its heads in ascending order)``, and the Newton iterations taken."""
    classes = torch.unique(y_tr)
    if len(classes) != 2:
        raise InterpError(f"svc_weights fits binary problems; the labels hold {len(classes)} classes")
    y = torch.where(y_tr == classes[1], 1.0, -1.0).to(x_tr.dtype)
    masks_by, w_by, iters = _solve_lattice(x_tr, y, torch.as_tensor(index, dtype=torch.long), C, False, tol, max_iter)
    where = {int(m): (k, i) for k, ms in masks_by.items() for i, m in enumerate(ms.tolist())}
    return [w_by[where[int(m)][0]][where[int(m)][1]] for m in index], iters


def _decisions(x_te, masks_by, w_by, index) -> Tensor:
    """Test decisions ``[coalition (in index order), test sample]``."""
    M, n, e = x_te.shape
    xf = torch.cat([torch.ones(M, 1, dtype=x_te.dtype), x_te.reshape(M, n * e)], 1)
    out = torch.empty(len(index), M, dtype=x_te.dtype)
    rank = torch.argsort(index)
    sorted_index = index[rank]
    for k, masks in masks_by.items():
        p = 1 + k * e
        bits = (masks[:, None] >> torch.arange(n)) & 1
        players = torch.nonzero(bits)[:, 1].view(len(masks), k)
        cols = torch.cat([torch.zeros(len(masks), 1, dtype=torch.long),
                          (1 + players[:, :, None] * e + torch.arange(e)).reshape(len(masks), k * e)], 1)
        rows = rank[torch.searchsorted(sorted_index, masks)]
        step = max(1, MAX_ELEMS // (M * p))
        for i in range(0, len(masks), step):
            X = _gather(xf, cols[i : i + step])
            out[rows[i : i + step]] = torch.bmm(X, w_by[k][i : i + step, :, None])[..., 0]
    return out


def svc_test_accuracy(x_tr: Float[Tensor, "sample player d_head"], y_tr: Int[Tensor, "sample"],
                      x_te: Float[Tensor, "test player d_head"], y_te: Int[Tensor, "test"], index: Int[Tensor, "coalition"],
                      *, C: float = 1000.0, tol: float = 1e-9, max_iter: int = 100, progress: bool = False,
                      return_iters: bool = False):
    """Test accuracy of the exact LinearSVC (see the module doc) of every coalition bitmask in ``index``:
    features of coalition S are ``x[:, i, :]`` for the players ``i`` in S (centre them first, as the probes do)."""
    index = torch.as_tensor(index, dtype=torch.long)
    uniq, inverse = torch.unique(index, return_inverse=True)
    classes = torch.unique(y_tr)
    if len(classes) < 2:
        raise InterpError(f"the train labels contain one class only ({classes.tolist()}); a separator needs two")
    x_tr, x_te = x_tr.double(), x_te.double()
    iters = []
    if len(classes) == 2:
        y = torch.where(y_tr == classes[1], 1.0, -1.0).double()
        masks_by, w_by, it = _solve_lattice(x_tr, y, uniq, C, progress, tol, max_iter)
        dec = _decisions(x_te, masks_by, w_by, uniq)
        pred = torch.where(dec > 0, classes[1], classes[0])
        iters.append(it)
    else:  # one-vs-rest, as LinearSVC
        decs = []
        for c in classes:
            y = torch.where(y_tr == c, 1.0, -1.0).double()
            masks_by, w_by, it = _solve_lattice(x_tr, y, uniq, C, progress, tol, max_iter)
            decs.append(_decisions(x_te, masks_by, w_by, uniq))
            iters.append(it)
        pred = classes[torch.stack(decs, -1).argmax(-1)]
    acc = (pred == y_te[None]).double().mean(-1)[inverse]
    if return_iters:
        return acc, torch.cat(iters)
    return acc
