"""Shapley values of a model's heads: the one entry, :func:`shapley_values` (Fraknói 2024, §5.5, Definition 5.3).

Exact values come from v of all 2^n coalitions (:func:`analyses.coalitions.coalition_values`) and the Moebius
transform (:mod:`analyses.shapley_result`); sampled ones (``method="sampled"``, and by default beyond 16 heads) from
permutations: each permutation adds the heads one by one, and a head's sample is its marginal contribution where it
enters, with a standard error per head, for many heads or a costly v.
:meth:`analyses.coalitions.CoalitionValues.shapley` transforms values already computed.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import torch

from interp.errors import InterpError, removed_names

from .coalitions import coalition_evaluator
from .shapley_result import ShapleyResult, moebius, shapley_of_values, shapley_transform, zeta

if TYPE_CHECKING:
    from transformer_lens import HookedTransformer

    from interp.task import Task

__all__ = ["ShapleyResult", "moebius", "shapley_transform", "shapley_values", "zeta"]
__getattr__ = removed_names(
    "interp.analyses.shapley",
    {
        "shapley_of": "shapley_values(model, data, method='exact', ...)",
        "exact_shapley": "CoalitionValues.shapley(), or shapley_values(model, data, method='exact', ...)",
        "shapley": "CoalitionValues.shapley() (CoalitionValues(heads, values, value) wraps a bare vector)",
        "sampled_shapley": "shapley_values(model, data, method='sampled', samples=, seed=, antithetic=, ...)",
    },
)

METHODS = ("auto", "exact", "sampled")
EXACT_UP_TO = 16  # heads: method="auto" computes exact values up to this many (2**16 coalitions), samples beyond


def shapley_values(
    model: HookedTransformer,
    data,
    *,
    heads: object = None,
    value="learned-accuracy",
    method: str = "auto",
    samples: int = 200,
    seed: int = 0,
    antithetic: bool = True,
    train=None,
    task: Task | None = None,
    ablation: str = "zero",
    reference=None,
    solver: str = "torch",
    C: float = 1000.0,
    batch_size: int | None = None,
    device: str | None = None,
    progress: bool = False,
) -> ShapleyResult:
    """The Shapley value of each head of ``heads`` (one set; default every head) for the coalition value ``value``
    on ``data`` (:func:`analyses.coalitions.coalition_values` describes ``value``, ``train``, ``ablation``,
    ``reference``, ``solver``, ``C`` and ``batch_size``).

    The heads of ``heads`` are the players; every other head of the model stays ablated in every coalition (v(S) is
    the value with all heads outside S ablated, non-players included), so v(all players) is the value of the players
    alone, not the whole model's, and the values add up to v(players) - v(no head). No option keeps the non-players
    switched on: make a head a player to count its context.

    ``method``: ``"exact"`` (v of all 2**n coalitions and the Moebius transform: Shapley and Banzhaf values and
    pairwise interactions; at most 24 heads), ``"sampled"`` (``samples`` random permutations, ``antithetic`` pairs,
    ``seed``: an unbiased estimate with a standard error per head, any number of heads) or ``"auto"`` (exact up to
    16 heads, sampled beyond; the result says which it took and why in ``info["method_note"]`` and its text)."""
    if method not in METHODS:
        raise InterpError(f"unknown method {method!r}; expected one of {METHODS}")
    kw = dict(
        value=value,
        heads=heads,
        ablation=ablation,
        train=train,
        task=task,
        solver=solver,
        reference=reference,
        C=C,
        batch_size=batch_size,
        device=device,
    )
    if method in ("sampled", "auto"):
        _check_samples(samples)
    ev = coalition_evaluator(model, data, **kw)
    n = len(ev.heads)
    note = None
    if method == "auto":
        method = "exact" if n <= EXACT_UP_TO else "sampled"
        note = (
            f"auto: exact over all 2**{n} coalitions ({n} heads <= {EXACT_UP_TO})"
            if method == "exact"
            else f"auto: sampled from {samples} permutations ({n} heads > {EXACT_UP_TO}: exact values take 2**{n} "
            "coalitions)"
        )
    if method == "exact":
        result = shapley_of_values(ev.all(progress))
    else:
        result = _sampled(ev, samples, seed, antithetic, progress)
    if note is not None:
        result.info["method_note"] = note
    return result


def _check_samples(samples: object) -> None:
    if not isinstance(samples, int) or isinstance(samples, bool) or samples < 2:
        raise InterpError(
            f"samples must be an integer >= 2 (a standard error needs at least two permutations), got {samples!r}"
        )


def _sampled(ev, samples: int, seed: int, antithetic: bool, progress: bool) -> ShapleyResult:
    """Shapley values estimated from ``samples`` random permutations of the heads: each permutation adds the heads
    one by one, and a head's sample is v(before + head) - v(before). ``antithetic``: permutations come in reversed
    pairs (a pair's mean is one sample of the standard error), which lowers the variance. The estimate is unbiased;
    the standard error per head is the sample standard deviation over ``sqrt(samples)``. All prefixes are evaluated
    as one batch."""
    n = len(ev.heads)
    g = torch.Generator().manual_seed(seed)
    if antithetic:
        half = torch.stack([torch.randperm(n, generator=g) for _ in range((samples + 1) // 2)])
        perms = torch.stack([half, half.flip(-1)], 1).reshape(-1, n)[:samples]
    else:
        perms = torch.stack([torch.randperm(n, generator=g) for _ in range(samples)])
    rank = torch.argsort(perms, dim=-1)  # rank[s, i]: where player i enters permutation s
    bits = rank[:, None, :] < torch.arange(n + 1)[None, :, None]  # [samples, n + 1 prefixes, n]
    uniq, inverse = torch.unique(bits.reshape(-1, n), dim=0, return_inverse=True)
    v = ev.of_bits(uniq, progress)[inverse].view(samples, n + 1)
    gains = v[:, 1:] - v[:, :-1]  # [samples, n] in permutation order
    contrib = torch.empty_like(gains)
    contrib.scatter_(1, perms, gains)  # [samples, player]
    phi = contrib.mean(0)
    if antithetic and samples >= 4:
        pairs = contrib[: samples // 2 * 2].view(-1, 2, n).mean(1)
        se = pairs.std(0) / math.sqrt(len(pairs))
    else:
        se = contrib.std(0) / math.sqrt(samples)
    v_all, v_empty = float(v[0, -1]), float(v[0, 0])
    return ShapleyResult(
        list(ev.heads),
        phi,
        None,
        None,
        ev.value,
        v_all,
        v_empty,
        exact=False,
        stderr=se,
        samples=samples,
        info={
            "ablation": ev.ablation,
            "n_examples": ev.n_examples,
            "coalitions_evaluated": len(uniq),
            **ev.info,
        },
    )
