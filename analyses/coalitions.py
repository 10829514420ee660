"""Coalition values v(S) of head subsets S, for every subset of a few heads at once (the input of Shapley values).

The players are ``heads`` (default: every head of the model); heads outside ``heads`` are ablated in every
coalition, as in the thesis's learned accuracy (000 §5.4, Definition 5.1: "every head outside H ablated"). A
coalition is a bitmask over ``heads``: bit ``i`` set means ``heads[i]`` is kept. :class:`CoalitionValues` holds
v for all ``2**n`` bitmasks, index = bitmask.

Values (higher is better for all but ``answer-loss``, a loss: :data:`HIGHER_IS_BETTER`):

- ``"learned-accuracy"``: the model's answer accuracy with the heads outside S ablated (Definition 5.1);
- ``"answer-loss"``: the mean cross-entropy of the answer token alone, same ablation (not the ``loss`` of
  :func:`interp.evaluation.evaluate`, which averages every target position of the task, e.g. the answer and
  [EOS]: about twice this on noisy majority, where [EOS] is nearly free);
- ``"logit-diff"``: the mean of ``logit[label] - mean(logit[c] for the other answer classes c)``, the classes
  being the labels that occur in the data; linear in the logits, so for a model without a final LayerNorm
  and zero ablation its Shapley value of a head is that head's direct logit attribution;
- ``"separation"``: test accuracy of a linear SVC fitted on the train split to the concatenated head outputs
  ``z`` (``hook_z``) of S at the answer position (Definition 5.2, as
  :func:`analyses.separation_accuracies.separation_accuracy` with centred features, C=1000). v(empty set) is the SVC
  with its intercept alone (the commonest train label).
  ``solver="torch"``: :mod:`analyses.batched_svc`'s exact solver (one coalition at a time in C,
  :mod:`analyses.svc_native`, where a C compiler builds it; else many coalitions per batched Newton solve in
  torch; ``info["engine"]`` says which); ``"sklearn"``: one scikit-learn ``LinearSVC`` per coalition, the
  reference;
- a callable ``f(masks)`` taking a float mask ``[coalition, n_layers, n_heads]`` (1 = kept, built by
  :func:`interp.heads.head_mask`) and returning one number per coalition.

The three logit values are computed with a coalition axis, never one forward per coalition: a one-layer
attention-only model (``method="fast"``) recombines the cached per-head outputs at the answer position (and,
without a final LayerNorm, the per-head logit contributions: one small matmul for all 65,536 coalitions of 16
heads); deeper models use the hook path of :func:`analyses.learned_accuracies.hooked_subset_logits`, a group of
coalitions per forward.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch
from jaxtyping import Bool, Float, Int
from torch import Tensor

from interp.device import check_device
from interp.errors import HeadError, InterpError
from interp.evaluation import check_batch_size, check_finite_logits
from interp.heads import Head, all_heads, head_label, one_set, parse_head
from interp.query_forward import has_soft_cap, resolve_method, soft_capped, supports_query_forward
from interp.results import Result, floats, head_of, jsonable
from interp.task import TaskData

from .answer_cache import AnswerCache, as_cache, check_inputs
from .learned_accuracies import ABLATIONS, _mean_z, cached_subset_logits, hooked_subset_logits
from .shapley_result import HIGHER_IS_BETTER, bits_of, shapley_of_values

if TYPE_CHECKING:
    from transformer_lens import HookedTransformer

    from interp.task import Task

VALUES = ("learned-accuracy", "answer-loss", "logit-diff", "separation")
RENAMED = {"loss": "answer-loss"}  # old value names, refused with the new one
SOLVERS = ("torch", "sklearn")
MAX_PLAYERS = 24  # 2**24 coalition values are 128 MiB in float64; beyond that, sample (shapley_values, "sampled")
ESTIMATE_ABOVE = 4096  # coalitions: beyond this, all() with progress says how long it will take first
MAX_BITMASK = 62  # coalitions as int64 bitmasks (exact values, the batched SVC); sampling takes any number
CALLABLE_CHUNK = 4096  # coalitions per call of a value callable


@dataclass(eq=False)
class CoalitionValues(Result):
    """v(S) for every subset S of ``heads``: ``values[mask]``, bit ``i`` of ``mask`` = ``heads[i]`` in S."""

    heads: list[Head]
    values: Float[Tensor, " coalition"]
    value: str = "v"
    ablation: str | None = None
    n_examples: int = 0
    seconds: float = float("nan")
    info: dict = field(default_factory=dict)

    @property
    def n(self) -> int:
        return len(self.heads)

    @property
    def names(self) -> list[str]:
        return [head_label(*h) for h in self.heads]

    def index_of(self, subset) -> int:
        """The bitmask of a subset of ``heads`` (names like ``'L0H3'`` or pairs)."""
        if isinstance(subset, str) or (
            isinstance(subset, tuple)
            and len(subset) == 2
            and all(isinstance(x, int) and not isinstance(x, bool) for x in subset)
        ):
            subset = [subset]
        where = {h: i for i, h in enumerate(self.heads)}
        mask = 0
        for s in subset:
            h = parse_head(s, 10**6, 10**6)
            if h not in where:
                raise HeadError(f"head {head_label(*h)} is not a player here; the players are {self.names}")
            mask |= 1 << where[h]
        return mask

    def __getitem__(self, subset) -> float:
        """v of a subset: ``cv[['L0H1', 'L0H2']]``, ``cv['L0H1']``, ``cv[[]]`` (the empty coalition)."""
        return float(self.values[self.index_of(subset)])

    @property
    def v_all(self) -> float:
        return float(self.values[-1])

    @property
    def v_empty(self) -> float:
        return float(self.values[0])

    def to_dict(self) -> dict:
        return jsonable(
            {
                "value": self.value,
                "ablation": self.ablation,
                "n_examples": self.n_examples,
                "heads": self.names,
                "values": self.values,
                "seconds": self.seconds,
                **self.info,
            }
        )

    @classmethod
    def from_dict(cls, d: dict) -> CoalitionValues:
        known = ("value", "ablation", "n_examples", "heads", "values", "seconds")
        return cls(
            [head_of(h) for h in d["heads"]],
            floats(d["values"]),
            d["value"],
            d["ablation"],
            d["n_examples"],
            float("nan") if d.get("seconds") is None else d["seconds"],
            {k: v for k, v in d.items() if k not in known},
        )

    def text(self) -> str:
        """v of no head, of all heads, and the best coalition of each size."""
        size = bits_of(torch.arange(len(self.values)), self.n).sum(-1)
        better = HIGHER_IS_BETTER.get(self.value, True)
        lines = [
            f"{self.value} of all {len(self.values):,} coalitions of {self.n} heads ({', '.join(self.names)}); "
            f"others {self.ablation or 'not'}-ablated, {self.n_examples} examples: v(none) = {self.v_empty:.4f}, "
            f"v(all) = {self.v_all:.4f}"
        ]
        v = self.values.double().cpu()
        for k in range(1, self.n):
            idx = torch.nonzero(size == k).flatten()
            best = int(idx[(v[idx].argmax() if better else v[idx].argmin())])
            heads = [self.names[i] for i in range(self.n) if best >> i & 1]
            lines.append(f"  best of size {k}: {{{','.join(heads)}}} {float(v[best]):.4f}")
        return "\n".join(lines)

    def shapley(self):
        """Exact Shapley and Banzhaf values and pairwise interactions of the heads from these values
        (:class:`analyses.shapley_result.ShapleyResult`; the Moebius transform, no model run)."""
        return shapley_of_values(self)

    def figure(self):
        """v(S) against the coalition size |S| (every coalition one dot), with the mean per size."""
        import plotly.graph_objects as go

        size = bits_of(torch.arange(len(self.values)), self.n).sum(-1)
        v = self.values.double().cpu()
        k = torch.arange(self.n + 1)
        mean = torch.stack([v[size == i].mean() for i in k])
        fig = go.Figure(
            [
                go.Scatter(
                    x=(size + 0.3 * (torch.rand(len(v)) - 0.5)).tolist(),
                    y=v.tolist(),
                    mode="markers",
                    marker=dict(size=3, opacity=0.3),
                    name="coalitions",
                ),
                go.Scatter(x=k.tolist(), y=mean.tolist(), mode="lines+markers", name="mean per size"),
            ]
        )
        fig.update_layout(
            title=f"{self.value} of every coalition of {self.n} heads",
            xaxis_title="heads kept |S|",
            yaxis_title=self.value,
            template="plotly_white",
        )
        return fig


def _answer_classes(labels: Tensor) -> Tensor:
    classes = torch.unique(labels)
    if len(classes) < 2:
        raise InterpError(f"the data's answers are all {classes.tolist()}; a logit difference needs two answer classes")
    return classes


def _reduce(
    logits: Float[Tensor, "coalition batch vocab_out"], labels: Tensor, value: str, classes: Tensor | None
) -> Float[Tensor, " coalition"]:
    check_finite_logits(logits, "the answer logits under these ablations")
    if value == "learned-accuracy":
        return (logits.argmax(-1) == labels[None]).double().mean(-1)
    if value == "answer-loss":
        lp = logits.double().log_softmax(-1)
        return -lp.gather(-1, labels[None, :, None].expand(len(lp), -1, 1))[..., 0].mean(-1)
    # logit-diff
    right = logits.gather(-1, labels[None, :, None].expand(len(logits), -1, 1))[..., 0].double()
    others = logits[..., classes].double().sum(-1) - right
    return (right - others / (len(classes) - 1)).mean(-1)


class CoalitionValue:
    """v as a function of coalition bitmasks over ``heads``, with its expensive preparation (caches, features) done
    once: ``evaluator(index)`` gives v of every bitmask in ``index`` (n <= 62), ``evaluator.of_bits(bits)`` of every
    row of a 0/1 matrix ``[coalition, n]`` (any n). Built by :func:`coalition_evaluator`."""

    def __init__(
        self,
        fn: Callable[[Tensor], Tensor],
        heads: list[Head],
        value: str,
        ablation: str | None,
        n_examples: int,
        info: dict,
    ):
        self.fn, self.heads, self.value, self.ablation, self.n_examples, self.info = (
            fn,
            heads,
            value,
            ablation,
            n_examples,
            info,
        )

    def __call__(self, index: Int[Tensor, " coalition"], progress: bool = False) -> Float[Tensor, " coalition"]:
        index = torch.as_tensor(index, dtype=torch.long).cpu()
        n = len(self.heads)
        if n > MAX_BITMASK:
            raise InterpError(f"{n} heads do not fit in int64 bitmasks; pass coalitions as a 0/1 matrix to of_bits()")
        if len(index) and (int(index.min()) < 0 or int(index.max()) >= 1 << n):
            raise InterpError(f"coalition bitmasks must be in [0, 2**{n}), got {index.min()}..{index.max()}")
        return self.of_bits(bits_of(index, n), progress)

    def of_bits(
        self, bits: Int[Tensor, "coalition player"] | Bool[Tensor, "coalition player"], progress: bool = False
    ) -> Float[Tensor, " coalition"]:
        """v of each row of a 0/1 matrix (``bits[c, i] = 1``: ``heads[i]`` in coalition c)."""
        bits = torch.as_tensor(bits).long().cpu()
        if bits.dim() != 2 or bits.shape[1] != len(self.heads):
            raise InterpError(f"expected a [coalition, {len(self.heads)}] 0/1 matrix, got shape {tuple(bits.shape)}")
        return self.fn(bits, progress).double().cpu()

    def all(self, progress: bool = False) -> CoalitionValues:
        """v of all ``2**n`` coalitions. With ``progress``, a bar, and first (beyond 4,096 coalitions) an estimate of
        the whole time, measured on 64 random coalitions and written to stderr, so a long run says so up front."""
        n = len(self.heads)
        _check_exact(n)
        if progress and (1 << n) > ESTIMATE_ABOVE:
            self.estimate(1 << n)
        t0 = time.perf_counter()
        values = self(torch.arange(1 << n), progress)
        return CoalitionValues(
            list(self.heads),
            values,
            self.value,
            self.ablation,
            self.n_examples,
            time.perf_counter() - t0,
            dict(self.info),
        )

    def estimate(self, total: int, probe: int = 64) -> float:
        """Seconds for ``total`` coalitions, extrapolated from ``probe`` random ones (written to stderr)."""
        import sys

        g = torch.Generator().manual_seed(0)
        index = torch.randint(0, 1 << len(self.heads), (probe,), generator=g)
        t0 = time.perf_counter()
        self(index)
        seconds = (time.perf_counter() - t0) / probe * total
        sys.stderr.write(
            f"{self.value} of all {total:,} coalitions of {len(self.heads)} heads: about "
            f"{_duration(seconds)} on this machine (measured on {probe} random coalitions)\n"
        )
        sys.stderr.flush()
        return seconds


def _duration(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} minutes"
    return f"{seconds / 3600:.1f} hours"


def _players(model: HookedTransformer, heads) -> list[Head]:
    cfg = model.cfg
    return all_heads(cfg.n_layers, cfg.n_heads) if heads is None else one_set(heads, cfg.n_layers, cfg.n_heads)


def _check_exact(n: int) -> None:
    if n > MAX_PLAYERS:
        raise InterpError(
            f"{n} heads give 2**{n} coalitions; exact values take at most {MAX_PLAYERS} "
            "heads (pass heads=[...], or sample: shapley_values(..., method='sampled'))"
        )


def _masks(
    bits: Tensor, players: list[Head], n_layers: int, n_heads: int, device
) -> Float[Tensor, "coalition layer head"]:
    """Float head masks ``[coalition, layer, head]`` of bitmasks over ``players`` (others 0): the same masks
    :func:`interp.heads.head_mask` builds from head lists, built from the bits directly for 2**n coalitions."""
    b = bits.to(device).float()
    flat = torch.zeros(len(b), n_layers * n_heads, device=device)
    cols = torch.tensor([l * n_heads + h for l, h in players], device=device)
    flat[:, cols] = b
    return flat.view(len(b), n_layers, n_heads)


def coalition_evaluator(
    model: HookedTransformer,
    data: TaskData | AnswerCache,
    *,
    value="learned-accuracy",
    heads=None,
    ablation: str = "zero",
    train=None,
    task: Task | None = None,
    solver: str = "torch",
    method: str = "auto",
    reference=None,
    C: float = 1000.0,
    batch_size: int | None = None,
    device: str | None = None,
) -> CoalitionValue:
    """The preparation of :func:`coalition_values` (same arguments), for evaluating chosen coalitions only
    (permutation sampling, :func:`analyses.shapley.shapley_values` with ``method="sampled"``)."""
    cfg = model.cfg
    players = _players(model, heads)
    if callable(value):
        device = check_device(model, device)
        check_batch_size(batch_size)
        chunk = CALLABLE_CHUNK
        name = getattr(value, "__name__", "callable")

        def fn(bits, progress):
            out = []
            for i in range(0, len(bits), chunk):
                masks = _masks(bits[i : i + chunk], players, cfg.n_layers, cfg.n_heads, device)
                v = torch.as_tensor(value(masks), dtype=torch.float64).reshape(-1)
                if len(v) != len(masks):
                    raise InterpError(
                        f"the value callable returned {len(v)} numbers for {len(masks)} coalitions; "
                        "expected one per coalition (input: float masks [coalition, layer, head])"
                    )
                out.append(v.cpu())
            return torch.cat(out) if out else torch.zeros(0, dtype=torch.float64)

        n = len(data) if hasattr(data, "__len__") else 0
        return CoalitionValue(fn, players, name, None, n, {})
    if value in RENAMED:
        raise InterpError(
            f"value {value!r} is now {RENAMED[value]!r} (the cross-entropy at the answer position only; "
            "evaluate()'s 'loss' averages every target position of the task)"
        )
    if value not in VALUES:
        raise InterpError(f"unknown value {value!r}; expected one of {VALUES} or a callable on head masks")
    if value == "separation":
        return _separation_evaluator(
            model, data, players, train=train, task=task, solver=solver, C=C, batch_size=batch_size, device=device
        )
    if ablation not in ABLATIONS:
        raise InterpError(f"unknown ablation {ablation!r}; expected one of {ABLATIONS}")
    device = check_inputs(model, data, task=task, device=device, batch_size=batch_size)
    cache = data if isinstance(data, AnswerCache) else None
    if cache is not None and method == "auto":  # a cache serves the fast path; a deep model runs the cache's data
        method = "fast" if supports_query_forward(model) or cache.data is None else "hooks"
    method = resolve_method(model, method)
    if method == "hooks" and cache is not None:
        if cache.data is None:
            raise InterpError("an AnswerCache can only be evaluated with method='fast'; pass the task data for 'hooks'")
        data = cache.data
    labels = data.labels.to(device)
    classes = _answer_classes(labels) if value == "logit-diff" else None
    z_ref = None
    if ablation == "mean":
        z_ref = _mean_z(model, reference if reference is not None else data, batch_size).to(device)
    if method == "fast":
        cache = cache if cache is not None else as_cache(model, data, attention=False, batch_size=batch_size)
    if method == "fast" and not hasattr(model, "ln_final") and value != "answer-loss" and not has_soft_cap(model):
        return _linear_evaluator(model, cache, z_ref, players, value, classes, ablation)
    if method == "fast":
        logits_of = _fast_logits(model, cache, z_ref)
    else:

        def logits_of(masks):
            return hooked_subset_logits(model, data, masks, z_ref, batch_size)

    b = len(labels)
    step = max(1, min(CALLABLE_CHUNK, (1 << 24) // max(1, b * cfg.d_vocab_out)))

    def fn(bits, progress):
        out = []
        it = range(0, len(bits), step)
        if progress:
            from tqdm.auto import tqdm

            it = tqdm(it, desc=f"{value} of {len(bits)} coalitions", unit="chunk")
        for i in it:
            masks = _masks(bits[i : i + step], players, cfg.n_layers, cfg.n_heads, device)
            with torch.inference_mode():
                out.append(_reduce(logits_of(masks), labels, value, classes).cpu())
        return torch.cat(out) if out else torch.zeros(0, dtype=torch.float64)

    return CoalitionValue(fn, players, value, ablation, b, {"method": method})


def _fast_logits(model: HookedTransformer, cache: AnswerCache, z_ref):
    """``masks -> answer logits`` from cached per-head outputs (one-layer attention-only model). Without a final
    LayerNorm the logits before the soft cap (where the model has one) are affine in the mask, so per-head logit
    contributions are precomputed once."""
    if hasattr(model, "ln_final"):
        return lambda masks: cached_subset_logits(model, cache, masks, z_ref)
    attn = model.blocks[0].attn
    with torch.inference_mode():
        r = torch.einsum("bhe,hed->bhd", cache.z[:, 0], attn.W_O)
        contrib = torch.einsum("bhd,dv->bhv", r, model.W_U)  # [b, h, v]
        base = model.unembed(cache.resid_pre + attn.b_O)  # [b, v]
        ref = None if z_ref is None else torch.einsum("he,hed,dv->hv", z_ref[0], attn.W_O, model.W_U)
    b, h, v = contrib.shape
    flat = contrib.permute(1, 0, 2).reshape(h, b * v)

    def logits(masks):
        m = masks[:, 0].to(flat.dtype)
        out = (m @ flat).view(len(m), b, v) + base[None]
        if ref is not None:
            out = out + ((1 - m) @ ref)[:, None]
        return soft_capped(model, out)

    return logits


def _linear_evaluator(
    model: HookedTransformer, cache: AnswerCache, z_ref, players, value, classes, ablation
) -> CoalitionValue:
    """One-layer attention-only model without a final LayerNorm or logit soft cap: the answer logits are affine in the
    head mask,
    ``logits(S) = base + sum_{h in S} c_h``. The logit difference is then affine too (v(S) = a_0 + sum a_h), and
    learned accuracy only needs, per example, the differences ``logit[c] - logit[label]`` for the output columns
    ``c`` that can beat the label for some mask (bounded by summing the positive parts of the per-head
    differences): usually just the other answer classes, so all 2**16 coalitions are one small matmul."""
    cfg = model.cfg
    _L, H = cfg.n_layers, cfg.n_heads
    attn = model.blocks[0].attn
    labels = cache.labels
    with torch.inference_mode():
        r = torch.einsum("bhe,hed->bhd", cache.z[:, 0], attn.W_O)
        contrib = torch.einsum("bhd,dv->bhv", r, model.W_U).double()  # [b, h, v]
        base = model.unembed(cache.resid_pre + attn.b_O).double()  # [b, v]
        if z_ref is not None:  # an ablated head outputs its mean: base gains every head's mean, c_h loses it
            ref = torch.einsum("he,hed,dv->hv", z_ref[0], attn.W_O, model.W_U).double()
            base = base + ref.sum(0)
            contrib = contrib - ref[None]
        check_finite_logits(base, "the answer logits without heads")
        check_finite_logits(contrib, "the heads' logit contributions")
        heads_idx = torch.tensor([h for _, h in players], device=contrib.device)
        others = torch.ones(H, dtype=torch.bool, device=contrib.device)
        others[heads_idx] = False  # heads outside the players: ablated in every coalition, already in base
        c = contrib[:, heads_idx]  # [b, n, v]
        rows = torch.arange(len(labels), device=labels.device)
        if value == "logit-diff":
            k = len(classes)
            u = torch.zeros_like(base)  # per example: +1 on the label, -1/(k-1) on the other classes
            u[:, classes] = -1.0 / (k - 1)
            u[rows, labels] = 1.0

            def ld(t):
                return (t * (u if t.dim() == 2 else u[:, None])).sum(-1)

            a0 = ld(base).mean()
            a = ld(c).mean(0)  # [n]

            def fn(bits, progress):
                b = bits.double()
                return (a0.cpu() + b @ a.cpu()).cpu()

            return CoalitionValue(fn, players, value, ablation, len(labels), {"method": "fast"})
        # learned accuracy: differences to the label's logit
        d0 = base - base[rows, labels][:, None]  # [b, v]
        d = c - c[rows, :, labels][:, :, None]  # [b, n, v]
        ub = d0 + d.clamp_min(0).sum(1)
        tiny = 1e-6 * (base.abs().amax() + c.abs().sum(1).amax())
        col = torch.arange(base.shape[-1], device=base.device)
        is_label = col[None] == labels[:, None]
        cols = torch.nonzero(((ub >= -tiny) & ~is_label).any(0)).flatten()
        d0k, dk = d0[:, cols], d[:, :, cols]  # [b, K], [b, n, K]
        # correct iff sum_{h in S} d[b, h, c] < -d0[b, c] for every column c (argmax takes the first maximum, so a
        # column after the label may tie with it: <= there, i.e. < the next float up); the label's own column: never
        flat = dk.permute(1, 0, 2).reshape(len(players), -1).float()  # [n, b*K] (float32, as the model)
        thr = (-d0k).float()
        after = cols[None] > labels[:, None]
        thr = torch.where(after, torch.nextafter(thr, torch.full_like(thr, float("inf"))), thr)
        thr = thr.masked_fill(cols[None] == labels[:, None], float("inf")).reshape(-1)
    b, K = d0k.shape
    step = max(1, (1 << 22) // max(1, b * max(K, 1)))

    def fn(bits, progress):
        out = []
        for i in range(0, len(bits), step):
            m = bits[i : i + step].to(flat.device).float()
            if K == 0:
                out.append(torch.ones(len(m), dtype=torch.float64))
                continue
            ok = (m @ flat) < thr
            if K > 1:
                ok = ok.view(len(m), b, K).all(-1)
            out.append(ok.float().sum(-1).cpu().double() / b)
        return torch.cat(out) if out else torch.zeros(0, dtype=torch.float64)

    return CoalitionValue(fn, players, value, ablation, b, {"method": "fast", "columns": len(cols)})


def coalition_values(
    model: HookedTransformer,
    data: TaskData | AnswerCache,
    *,
    value="learned-accuracy",
    heads=None,
    ablation: str = "zero",
    train=None,
    task: Task | None = None,
    solver: str = "torch",
    method: str = "auto",
    reference=None,
    C: float = 1000.0,
    batch_size: int | None = None,
    device: str | None = None,
    progress: bool = False,
) -> CoalitionValues:
    """v(S) for all ``2**n`` subsets S of ``heads`` (default all heads; at most 24), index = bitmask over ``heads``.

    ``data``: the split scored (task data, or an :class:`AnswerCache` for the fast method). ``value``: see the
    module doc. ``ablation``: ``"zero"`` or ``"mean"`` (mean ``z`` at the answer positions of ``reference``,
    default ``data``) for the heads outside S. ``train``: the split the separators are fitted on
    (``value="separation"``; default ``task.dataset("train")``). ``solver``: ``"torch"`` (batched) or
    ``"sklearn"`` (one LinearSVC per coalition) for the separation value. ``method``: ``auto``/``fast``/``hooks``.
    ``batch_size``: sequences per forward of the hook method, counting the copies of the batch per coalition (None:
    from the memory budget)."""
    ev = coalition_evaluator(
        model,
        data,
        value=value,
        heads=heads,
        ablation=ablation,
        train=train,
        task=task,
        solver=solver,
        method=method,
        reference=reference,
        C=C,
        batch_size=batch_size,
        device=device,
    )
    return ev.all(progress)


# ------------------------------------------------------------------------------------------------ separation


def _separation_evaluator(
    model: HookedTransformer, test, players, *, train, task: Task, solver, C, batch_size, device
) -> CoalitionValue:
    if solver not in SOLVERS:
        raise InterpError(f"unknown solver {solver!r}; expected one of {SOLVERS}")
    if train is None:
        if task is None:
            raise InterpError(
                "value='separation' needs the train split the separators are fitted on: pass train=... "
                "(task data or an AnswerCache) or task=..."
            )
        train = task.dataset("train")
    check_inputs(model, train, task=task, device=device, batch_size=batch_size, what="train")
    check_inputs(model, test, task=task, what="data")
    tr = as_cache(model, train, attention=False, batch_size=batch_size)
    te = as_cache(model, test, attention=False, batch_size=batch_size)
    if tr.task != te.task:
        raise InterpError(f"train data is of task {tr.task!r} but test data of task {te.task!r}")
    x_tr, y_tr, x_te, y_te = separation_features(tr, te, players)
    if not (torch.isfinite(x_tr).all() and torch.isfinite(x_te).all()):
        raise InterpError("the head outputs hold NaN or infinite values; a separator needs finite features")
    if len(torch.unique(y_tr)) < 2:
        raise InterpError(
            f"the train labels contain one class only ({torch.unique(y_tr).tolist()}); a separator needs two"
        )
    info = {"solver": solver, "C": float(C), "n_train": len(tr), "n_test": len(te), "center": True}
    if solver == "torch":  # which exact solver runs: the C one where it is built and passed its self-check
        from .batched_svc import engine_status

        info["engine"] = "c" if engine_status() == "c" else "torch"
    if solver == "sklearn":

        def fn(bits, progress):
            return _sklearn_values(x_tr, y_tr, x_te, y_te, bits, C, progress)
    else:
        from .batched_svc import svc_test_accuracy

        def fn(bits, progress):
            if bits.shape[1] > MAX_BITMASK:
                raise InterpError(
                    f"the batched SVC takes at most {MAX_BITMASK} heads; pass heads=[...] or solver='sklearn'"
                )
            index = (bits << torch.arange(bits.shape[1])).sum(-1)
            return svc_test_accuracy(x_tr, y_tr, x_te, y_te, index, C=C, progress=progress)

    return CoalitionValue(fn, players, "separation", None, len(te), info)


def separation_features(tr, te, players) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """The separators' data from two answer caches: each player's (layer, head) output at the answer position,
    ``[sample, player, d_head]`` in float64 on the CPU, centred at the train mean (as
    analyses.separation_accuracies does by default), and the labels: ``(x_tr, y_tr, x_te, y_te)``."""
    x_tr = torch.stack([tr.z[:, l, h] for l, h in players], 1).double().cpu()
    x_te = torch.stack([te.z[:, l, h] for l, h in players], 1).double().cpu()
    mean = x_tr.mean(0, keepdim=True)
    return x_tr - mean, tr.labels.cpu(), x_te - mean, te.labels.cpu()


def columns(mask: int, n: int, e: int) -> list[int]:
    """Feature columns of a coalition in the ``[sample, player * d_head]`` layout."""
    return [i * e + j for i in range(n) if mask >> i & 1 for j in range(e)]


def _sklearn_values(x_tr, y_tr, x_te, y_te, bits, C, progress) -> Tensor:
    """The reference: one scikit-learn LinearSVC per coalition (features already centred)."""
    from .separation_accuracies import fit_separator

    N, n, e = x_tr.shape
    a_tr, a_te = x_tr.reshape(N, n * e).numpy(), x_te.reshape(len(x_te), n * e).numpy()
    y_tr, y_te = y_tr.numpy(), y_te.numpy()
    it = [sum(1 << i for i in range(n) if row[i]) for row in bits.tolist()]
    if progress:
        from tqdm.auto import tqdm

        it = tqdm(it, desc="LinearSVC per coalition", unit="fit")
    out = []
    for mask in it:
        cols = columns(mask, n, e)
        if cols:
            f_tr, f_te = a_tr[:, cols], a_te[:, cols]
        else:  # the empty coalition: a zero feature, so the SVC is its intercept alone
            f_tr, f_te = a_tr[:, :1] * 0, a_te[:, :1] * 0
        out.append(fit_separator(f_tr, y_tr, f_te, y_te, C=C, center=False)["accuracy"])
    return torch.tensor(out, dtype=torch.float64)
