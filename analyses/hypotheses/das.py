"""Distributed alignment search (DAS; Geiger et al. 2024, *Finding Alignments Between Interpretable Causal Variables
and Distributed Neural Representations*).

A variable need not sit in whole neurons or heads: it may be a direction, or a ``k``-dimensional subspace, of a
site. DAS learns an orthogonal change of basis of the site (``torch.nn.utils.parametrizations.orthogonal``) and
interchanges only the first ``k`` rotated coordinates, training the rotation by gradient descent on the
cross-entropy of the counterfactual output over training pairs. Only the first ``k`` rows of the rotation act, so it
is parametrised as a ``[k, dim]`` matrix with orthonormal rows (pyvene's low-rank rotated space), and the
interchange is ``x_base + B Bᵀ (x_source - x_base)`` with ``B`` its transpose.

Reported as causalab reports it: IIA on held-out pairs with the learned subspace, beside the same IIA for random
subspaces of the same ``k`` (the control: a subspace that fits by chance scores like these) and for the whole site,
and the IIA on the training pairs apart.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import Tensor

from interp.device import model_device
from interp.errors import ConfigError, TaskError
from interp.task import TaskData

from .causal_model import CausalModel
from .engine import Engine, Patch
from .interchange import check_inputs, describe_pairs, draw_pairs, run_alignments
from .pairs import Pairs
from .result import CausalAbstraction
from .sites import parse_site, resolve_positions

if TYPE_CHECKING:
    from transformer_lens import HookedTransformer


@contextlib.contextmanager
def frozen(model: HookedTransformer):
    """The model's parameters without gradients for the duration (restored after): DAS trains only its rotation."""
    flags = [(p, p.requires_grad) for p in model.parameters()]
    try:
        for p, _ in flags:
            p.requires_grad_(False)
        yield
    finally:
        for p, flag in flags:
            p.requires_grad_(flag)


def random_bases(dim: int, k: int, n: int, seed: int, device, dtype=torch.float32) -> list[Tensor]:
    """``n`` random ``[dim, k]`` orthonormal bases (Haar-distributed: the Q of a Gaussian matrix's QR, signs fixed)."""
    gen = torch.Generator().manual_seed(int(seed))
    out = []
    for _ in range(n):
        q, r = torch.linalg.qr(torch.randn(dim, k, generator=gen, dtype=torch.float64))
        q = q * torch.sign(torch.diagonal(r)).where(torch.diagonal(r) != 0, torch.ones(k, dtype=torch.float64))
        out.append(q.to(device=device, dtype=dtype))
    return out


def principal_angles(a: Tensor, b: Tensor) -> Tensor:
    """Principal angles (radians, ascending) between the spans of two orthonormal bases ``[dim, k]``."""
    s = torch.linalg.svdvals(a.double().T @ b.double()).clamp(-1.0, 1.0)
    return torch.arccos(s).flip(0)


def _split_pairs(data: TaskData, seed: int) -> tuple[TaskData, TaskData, Tensor]:
    """Two disjoint halves of ``data`` (a seeded permutation): training pairs come from the first, held-out pairs from
    the second, so no held-out example was seen in training. Also the second half's indices into ``data``."""
    if len(data) < 4:
        raise TaskError(f"held-out pairs need at least four examples to split; the data has {len(data)}")
    perm = torch.randperm(len(data), generator=torch.Generator().manual_seed(int(seed) + 7919))
    half = len(data) // 2
    return data.select(perm[:half].to(data.device)), data.select(perm[half:].to(data.device)), perm[half:]


def remap(pairs: Pairs | None, index: Tensor | None) -> Pairs | None:
    """Pairs drawn from a subset of the data, re-indexed into the whole (``index``: the subset's rows)."""
    if pairs is None or index is None:
        return pairs
    return Pairs(index[pairs.base], index[pairs.source], pairs.changed, pairs.variable, pairs.target, pairs.seed)


def distributed_alignment_search(
    model: HookedTransformer,
    data: TaskData,
    *,
    causal_model: CausalModel,
    variable: str,
    site: object,
    k: int = 1,
    train: TaskData | None = None,
    pairs: int | Pairs | Tensor = 1000,
    train_pairs: int = 1000,
    source: TaskData | None = None,
    train_source: TaskData | None = None,
    changed: float = 0.5,
    same: Sequence[str] = (),
    steps: int = 300,
    lr: float = 0.01,
    pairs_per_step: int = 128,
    n_random: int = 10,
    seed: int = 0,
    method: str = "auto",
    batch_size: int | None = None,
    device: str | None = None,
) -> CausalAbstraction:
    """Learn a ``k``-dimensional subspace of ``site`` whose interchange makes the network follow ``variable``.

    Training pairs come from ``train`` (``train_pairs`` drawn, or ``train`` paired row by row with
    ``train_source``); held-out pairs from ``data`` (``pairs`` drawn, or with ``source``). Without ``train`` the
    examples of ``data`` are split in two seeded halves, one for each. ``steps`` Adam steps at ``lr`` on
    ``pairs_per_step`` training pairs each. The result's rows, on the held-out pairs: the learned subspace (kind
    ``das``), ``n_random`` random subspaces of the same ``k`` (``random``) and the whole site (``whole``); its
    ``das`` record holds the training IIA, the learned basis ``[dim, k]`` and the loss at the first and last step."""
    data = check_inputs(model, data, device, None if batch_size is None else batch_size)
    the_site = parse_site(site, model)
    if the_site.basis is not None:
        raise ConfigError(f"site {the_site.name} already has a basis; DAS learns one: pass the whole site")
    dim = the_site.dim(model)
    if not isinstance(k, int) or isinstance(k, bool) or not 1 <= k <= dim:
        raise ConfigError(f"k must be an integer in [1, {dim}] (the site's dimension), got {k!r}")
    for name, value in (("steps", steps), ("pairs_per_step", pairs_per_step), ("n_random", n_random + 1)):
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ConfigError(f"{name} must be a positive integer, got {value!r}")
    if not lr > 0:
        raise ConfigError(f"lr must be positive, got {lr!r}")
    var = causal_model.check_variable(variable)
    pos = causal_model.readout if the_site.position is None else the_site.position
    held_index = None
    if train is None and source is None:
        train_data, data, held_index = _split_pairs(data, seed)
        split_note = "training and held-out pairs from two disjoint halves of the data"
    else:
        train_data = data if train is None else check_inputs(model, train, None, batch_size)
        split_note = "training pairs from train=, held-out pairs from data" if train is not None else ""
    base, src, drawn = draw_pairs(
        model, data, causal_model=causal_model, variable=variable, pairs=pairs, source=source, changed=changed,
        seed=seed, same=same, positions=pos,
    )  # fmt: skip
    tbase, tsrc, tdrawn = draw_pairs(
        model, train_data, causal_model=causal_model, variable=variable, pairs=train_pairs, source=train_source,
        changed=changed, seed=seed + 1, same=same, positions=pos,
    )  # fmt: skip
    t0 = time.perf_counter()
    # the training pairs' engine: source vectors and base activations cached once
    readout = resolve_positions(causal_model.readout, tbase, causal_model.positions, "readout")[:, 0]
    bp = resolve_positions(pos, tbase, causal_model.positions)
    sp = resolve_positions(pos, tsrc, causal_model.positions)
    engine = Engine(model, tbase, tsrc, [[Patch(the_site, bp, sp)]], readout, method=method, batch_size=batch_size)
    if var.positional:
        target = causal_model.interchange(tbase, tsrc, variable, bp, sp)
    else:
        target = causal_model.interchange(tbase, tsrc, variable)
    target = target.to(model_device(model))
    gen = torch.Generator().manual_seed(int(seed))
    dev = model_device(model)
    dtype = engine.base_logits.dtype
    rot = torch.nn.Linear(dim, k, bias=False).to(device=dev, dtype=torch.float32)
    with torch.no_grad():
        rot.weight.copy_(torch.randn(k, dim, generator=gen).to(dev))
    # the parametrization completes a non-square weight from the global generator: seed it too, so that a seed
    # gives one learned subspace (without this, each process learned another)
    with torch.random.fork_rng(devices=[dev] if torch.device(dev).type == "cuda" else []):
        torch.manual_seed(int(seed))
        torch.nn.utils.parametrizations.orthogonal(rot)
    opt = torch.optim.Adam(rot.parameters(), lr=lr)
    n_tr = len(tbase)
    per = min(pairs_per_step, n_tr)
    losses = []
    order = torch.randperm(n_tr, generator=gen)
    at = 0
    with frozen(model), torch.enable_grad():
        for _ in range(steps):
            if at + per > n_tr:
                order, at = torch.randperm(n_tr, generator=gen), 0
            rows = order[at : at + per].to(dev)
            at += per
            basis = rot.weight.T.to(dtype)
            logits = engine.logits(0, rows, [basis])
            loss = F.cross_entropy(logits.float(), target[rows])
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses.append(float(loss.detach()))
    learned = rot.weight.T.detach().to(dtype).clone()
    with torch.no_grad():
        train_pred = torch.cat(
            [
                engine.logits(0, torch.arange(i, min(i + 512, n_tr), device=dev), [learned]).argmax(-1)
                for i in range(0, n_tr, 512)
            ]
        )
    train_iia = float((train_pred == target).float().mean())
    seconds = time.perf_counter() - t0
    where = the_site.name
    randoms = random_bases(dim, k, n_random, seed + 104729, dev, dtype)
    rows = [(f"{where} DAS k={k}", "das", variable, [the_site.with_basis(learned)])]
    rows += [
        (f"{where} random k={k} #{i}", "random", variable, [the_site.with_basis(b)]) for i, b in enumerate(randoms)
    ]
    rows += [(f"{where} whole", "whole", variable, [the_site])]
    result = run_alignments(
        model,
        base,
        src,
        causal_model=causal_model,
        aligned=rows,
        pairs=remap(drawn, held_index),
        method=method,
        batch_size=batch_size,
        how=describe_pairs(drawn, changed),
    )
    iia = result.iia
    result.das.append(
        {
            "site": where,
            "variable": variable,
            "k": k,
            "dim": dim,
            "train_iia": train_iia,
            "train_pairs": n_tr,
            "train_changed_share": None if tdrawn is None else tdrawn.changed_share,
            "heldout_iia": float(iia[0]),
            "random_iia": [float(x) for x in iia[1 : 1 + n_random]],
            "whole_iia": float(iia[-1]),
            "steps": steps,
            "lr": lr,
            "pairs_per_step": per,
            "seed": seed,
            "loss_first": losses[0],
            "loss_last": losses[-1],
            "seconds": round(seconds, 3),
            "method": engine.method,
            "basis": learned.cpu(),
            "note": split_note,
        }
    )
    return result
