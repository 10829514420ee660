"""Learned accuracy A_l(H) (Fraknói 2024, Definition 5.1): the model's accuracy with every head outside H ablated.

Heads are ablated through their outputs ``z`` (TransformerLens' ``hook_z``, before ``W_O``): zeroing ``z``
zeroes the head's contribution ``z W_O`` (``b_O`` is not per head and stays). Mean-ablation replaces ``z``
by the head's mean output at the answer positions of a reference set instead.

Many subsets are evaluated as one batched computation with a subset axis (a mask ``[subset, layer, head]``):

- ``method="hooks"`` (any number of layers): the batch is repeated once per subset in a group of subsets
  and a ``hook_z`` hook (:func:`interp.ablation.ablation_hooks`, a mask per row) ablates each copy's heads;
- ``method="fast"`` (one-layer attention-only models, exact): heads of one layer do not interact, so
  ``z`` at the answer position is cached once (:func:`analyses.answer_cache.cache_answer`) and the answer
  logits of every subset are recombined as ``unembed(ln_final(resid_pre + b_O + sum_h m_h z_h W_O[h]))``.

Both are tested equal to :func:`interp.analyses.reference.learned_accuracy_loop`, one ``run_with_hooks`` per subset.
Heads are ablated by :func:`interp.ablation.ablation_hooks`, the toolkit's one ``hook_z`` ablation.
Accuracy means ``argmax(logits[answer_pos]) == labels``, as the task's own ``accuracy`` metric.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from itertools import combinations
from typing import TYPE_CHECKING

import torch
from jaxtyping import Float
from torch import Tensor

from interp.ablation import ablation_hooks
from interp.device import model_device
from interp.errors import HeadError, InterpError
from interp.evaluation import DEFAULT_BUDGET, check_finite_logits, map_chunks
from interp.fast_attention import run_with_hooks
from interp.heads import Head, all_heads, head_label, head_mask, parse_head, parse_head_sets
from interp.query_forward import resolve_method, soft_capped, supports_query_forward
from interp.results import Result, floats, head_of, jsonable
from interp.task import TaskData

from .answer_cache import AnswerCache, as_cache, check_inputs

if TYPE_CHECKING:
    from transformer_lens import HookedTransformer

    from interp.task import Task

ABLATIONS = ("zero", "mean")
Subset = tuple[Head, ...]


def head_subsets(n_layers: int, n_heads: int, size: int) -> list[Subset]:
    """All subsets of ``size`` heads (``size=1``: singles, ``2``: pairs, ...), in lexicographic order."""
    if not isinstance(size, int) or size < 0 or size > n_layers * n_heads:
        raise InterpError(f"subset size must be an integer in [0, {n_layers * n_heads}], got {size!r}")
    return list(combinations(all_heads(n_layers, n_heads), size))


def subsets_of(model: HookedTransformer, heads: object, *, allow_empty: bool = True) -> list[Subset]:
    """The head sets ``heads=`` names (:func:`interp.heads.parse_head_sets`; None: each head alone), each a tuple of
    ``(layer, head)`` in the order given."""
    cfg = model.cfg
    sets = parse_head_sets(heads, cfg.n_layers, cfg.n_heads, default="each")
    if not sets:
        raise InterpError("no head subsets were given (a mask with 0 subsets); expected at least one")
    if not allow_empty and any(len(s) == 0 for s in sets):
        raise HeadError("an empty head subset was given where at least one head is needed (a separator needs features)")
    return sets


def mean_head_outputs(
    model: HookedTransformer,
    data: TaskData | AnswerCache,
    *,
    task: Task | None = None,
    batch_size: int | None = None,
    device: str | None = None,
) -> Float[Tensor, "layer head d_head"]:
    """Each head's mean output ``z`` at the answer positions of ``data``: the mean-ablation reference."""
    check_inputs(model, data, task=task, device=device, batch_size=batch_size)
    return _mean_z(model, data, batch_size)


def _mean_z(model: HookedTransformer, data, batch_size: int | None = None) -> Tensor:
    return as_cache(model, data, attention=False, batch_size=batch_size).z.mean(0)


@dataclass(eq=False)
class LearnedAccuracy(Result):
    """Accuracy per head subset with the other heads ablated. ``accuracy[s]`` belongs to ``subsets[s]``.
    ``method``: how the logits were computed (``"fast"`` or ``"hooks"``, what ``method="auto"`` resolved to; None
    where not recorded)."""

    subsets: list[Subset]
    accuracy: Float[Tensor, " subset"]
    ablation: str
    n_examples: int
    method: str | None = None

    @property
    def names(self) -> list[str]:
        return [subset_name(s) for s in self.subsets]

    def __getitem__(self, subset) -> float:
        """The accuracy of one subset: a single head (``'L0H2'`` or ``(0, 2)``) or a list of heads
        (``['L0H1', 'L0H2']``, ``[(0, 1), (0, 2)]``; ``[]`` is the empty subset)."""
        if isinstance(subset, str) or (
            isinstance(subset, tuple)
            and len(subset) == 2
            and all(isinstance(x, int) and not isinstance(x, bool) for x in subset)
        ):
            subset = [subset]
        if not isinstance(subset, (list, tuple)):
            raise HeadError(f"expected a head ('L0H2', (0, 2)) or a list of heads, got {subset!r}")
        key = tuple(sorted(parse_head(h, 10**6, 10**6) for h in subset))
        for s, a in zip(self.subsets, self.accuracy.tolist()):
            if tuple(sorted(s)) == key:
                return a
        raise InterpError(f"subset {subset_name(key)} was not evaluated here")

    def to_dict(self) -> dict:
        return jsonable(
            {
                "ablation": self.ablation,
                "n_examples": self.n_examples,
                "method": self.method,
                "subsets": [[head_label(*h) for h in s] for s in self.subsets],
                "accuracy": self.accuracy,
            }
        )

    @classmethod
    def from_dict(cls, d: dict) -> LearnedAccuracy:
        return cls(
            [tuple(head_of(h) for h in s) for s in d["subsets"]],
            floats(d["accuracy"]),
            d["ablation"],
            d["n_examples"],
            d.get("method"),
        )

    def text(self, top: int = 10) -> str:
        """The ``top`` best subsets with their accuracy."""
        order = torch.argsort(self.accuracy.cpu(), descending=True, stable=True)[:top].tolist()
        lines = [
            f"learned accuracy of {len(self.subsets)} head subset(s), the other heads {self.ablation}-ablated, on "
            f"{self.n_examples} examples" + (f" (best {len(order)})" if len(order) < len(self.subsets) else "")
        ]
        lines += [f"  {self.names[i]:<24} {float(self.accuracy[i]):.4f}" for i in order]
        return "\n".join(lines)

    def figure(self, top: int = 40):
        """Bar chart of the ``top`` best subsets."""
        import plotly.graph_objects as go

        order = torch.argsort(self.accuracy.cpu(), descending=True)[:top].tolist()
        fig = go.Figure(go.Bar(x=[self.names[i] for i in order], y=[float(self.accuracy[i]) for i in order]))
        fig.update_layout(
            title=f"Learned accuracy ({self.ablation}-ablation of the other heads, {self.n_examples} examples)",
            yaxis_title="accuracy",
            yaxis_range=[0, 1],
            template="plotly_white",
        )
        return fig


def subset_name(subset: Subset) -> str:
    return "{" + ",".join(head_label(*h) for h in subset) + "}" if subset else "{}"


def learned_accuracy(
    model: HookedTransformer,
    data: TaskData | AnswerCache,
    *,
    heads: object = None,
    ablation: str = "zero",
    reference: TaskData | AnswerCache | None = None,
    method: str = "auto",
    task: Task | None = None,
    batch_size: int | None = None,
    device: str | None = None,
) -> LearnedAccuracy:
    """A_l(H) for every head set H of ``heads`` (any spelling of :func:`interp.heads.parse_head_sets`: a list of
    head lists, a mask ``[subset, layer, head]``; ``[]`` is the direct path alone; default: each head alone).

    ``data``: task data, or an :class:`AnswerCache` of it (reused by the fast method; the hook method uses the data
    it was computed from). ``ablation``: ``"zero"`` or ``"mean"`` (the ablated heads output their mean ``z`` at the
    answer positions of ``reference``, default ``data``). ``method``: ``"fast"``, ``"hooks"`` or ``"auto"`` (fast
    when the model allows, :func:`interp.query_forward.supports_query_forward`: one layer, attention only, for zero
    and mean ablation alike; the result's ``method`` says which ran). ``batch_size``: sequences per forward of the
    hook method, counting the copies of the batch per subset (None: from the memory budget)."""
    check_inputs(model, data, task=task, device=device, batch_size=batch_size)
    parsed = subsets_of(model, heads)
    used = _resolved_method(model, data, method)
    logits = _subset_logits(model, data, parsed, ablation, reference, used, batch_size)
    check_finite_logits(logits, "the answer logits under these ablations")
    labels = data.labels.to(logits.device)
    acc = (logits.argmax(-1) == labels[None]).float().mean(-1)
    return LearnedAccuracy(parsed, acc, ablation, len(data), used)


def learned_accuracy_of(model: HookedTransformer, data: TaskData | AnswerCache, *, heads: object, **kw) -> float:
    """A_l(H) of one head set ``heads`` (e.g. ``['L0H8', 'L0H9']``; ``[]``: the direct path alone)."""
    res = learned_accuracy(model, data, heads=heads, **kw)
    if len(res.subsets) != 1:
        raise HeadError(f"learned_accuracy_of takes one head set, got {len(res.subsets)}: use learned_accuracy")
    return float(res.accuracy[0])


def learned_accuracy_of_size(
    model: HookedTransformer, data: TaskData | AnswerCache, *, size: int, **kw
) -> LearnedAccuracy:
    """A_l(H) for every subset of ``size`` heads (1: singles, 2: pairs, 3: triples)."""
    return learned_accuracy(model, data, heads=head_subsets(model.cfg.n_layers, model.cfg.n_heads, size), **kw)


def subset_answer_logits(
    model: HookedTransformer,
    data: TaskData | AnswerCache,
    *,
    heads: object = None,
    ablation: str = "zero",
    reference: TaskData | AnswerCache | None = None,
    method: str = "auto",
    task: Task | None = None,
    batch_size: int | None = None,
    device: str | None = None,
) -> Float[Tensor, "subset batch vocab_out"]:
    """The answer-position logits of every example under every head set's ablation (arguments as
    :func:`learned_accuracy`)."""
    check_inputs(model, data, task=task, device=device, batch_size=batch_size)
    return _subset_logits(model, data, subsets_of(model, heads), ablation, reference, method, batch_size)


def _subset_logits(
    model: HookedTransformer,
    data: TaskData | AnswerCache,
    subsets: Sequence[Sequence[Head]],
    ablation: str,
    reference,
    method: str,
    batch_size: int | None,
) -> Float[Tensor, "subset batch vocab_out"]:
    """:func:`subset_answer_logits` of checked inputs."""
    if ablation not in ABLATIONS:
        raise InterpError(f"unknown ablation {ablation!r}; expected one of {ABLATIONS}")
    cache = data if isinstance(data, AnswerCache) else None
    method = _resolved_method(model, data, method)
    if method == "hooks" and cache is not None:
        if cache.data is None:
            raise InterpError("an AnswerCache can only be evaluated with method='fast'; pass the task data for 'hooks'")
        data = cache.data
    cfg = model.cfg
    device = model_device(model)
    masks = head_mask(subsets, cfg.n_layers, cfg.n_heads, device)
    z_ref = None
    if ablation == "mean":
        z_ref = _mean_z(
            model, reference if reference is not None else (cache if cache is not None else data), batch_size
        )
        z_ref = z_ref.to(device)
    if method == "fast":
        cache = cache if cache is not None else as_cache(model, data, attention=False, batch_size=batch_size)
        return cached_subset_logits(model, cache, masks, z_ref)
    return hooked_subset_logits(model, data, masks, z_ref, batch_size)


def _resolved_method(model: HookedTransformer, data, method: str) -> str:
    """``"fast"`` or ``"hooks"``: what ``method`` (``"auto"`` included) runs on ``data``. The ablation does not
    enter: the fast path recombines cached head outputs with a mask, and a mean-ablated head's output is its mean
    ``z`` through ``W_O``, so zero and mean ablation take the same path."""
    if isinstance(data, AnswerCache) and method == "auto":  # a cache serves the fast path; a deep model runs its data
        return "fast" if supports_query_forward(model) or data.data is None else "hooks"
    return resolve_method(model, method)


def cached_subset_logits(
    model: HookedTransformer,
    cache: AnswerCache,
    masks: Float[Tensor, "subset layer head"],
    z_ref: Float[Tensor, "layer head d_head"] | None = None,
    block_elems: int = 1 << 24,
) -> Float[Tensor, "subset batch vocab_out"]:
    """Exact answer logits per subset for a one-layer attention-only model, from cached ``z`` (``block_elems``:
    numbers of the residual stream per block of subsets)."""
    attn = model.blocks[0].attn
    z = cache.z[:, 0]  # [b, h, e]
    with torch.inference_mode():
        r = torch.einsum("bhe,hed->bhd", z, attn.W_O)  # per-head residual contributions
        base = cache.resid_pre + attn.b_O  # [b, d]
        r_ref = None if z_ref is None else torch.einsum("he,hed->hd", z_ref[0], attn.W_O)
        m = masks[:, 0].to(r.dtype)  # [s, h]
        step = max(1, block_elems // max(1, r.shape[0] * r.shape[-1]))
        out = []
        for i in range(0, m.shape[0], step):
            mi = m[i : i + step]
            resid = base[None] + torch.einsum("sh,bhd->sbd", mi, r)
            if r_ref is not None:
                resid = resid + torch.einsum("sh,hd->sd", 1 - mi, r_ref)[:, None]
            if hasattr(model, "ln_final"):
                resid = model.ln_final(resid)
            out.append(soft_capped(model, model.unembed(resid)))
    return torch.cat(out)


def hooked_subset_logits(
    model: HookedTransformer,
    data: TaskData,
    masks: Float[Tensor, "subset layer head"],
    z_ref=None,
    batch_size: int | None = None,
) -> Float[Tensor, "subset batch vocab_out"]:
    """Answer logits per subset through :func:`interp.ablation.ablation_hooks`, any number of layers: each forward
    runs a group of subsets at once on a repeated batch (subset-major), with at most ``batch_size`` sequences
    (counting the copies) or, where that is None, ``DEFAULT_BUDGET`` attention entries per head."""
    S = masks.shape[0]

    def fn(chunk: TaskData) -> dict[str, Tensor]:
        b, t = chunk.tokens.shape
        group = max(1, (batch_size // b) if batch_size is not None else DEFAULT_BUDGET // max(1, b * t * t))
        rows = torch.arange(b, device=chunk.tokens.device)
        outs = []
        with torch.inference_mode():
            for i in range(0, S, group):
                g = masks[i : i + group]
                big = chunk.tokens.repeat(len(g), 1)
                hooks = ablation_hooks(model, g.repeat_interleave(b, 0), z_ref)
                logits = run_with_hooks(model, big, hooks).view(len(g), b, t, -1)  # fast attention where there is
                outs.append(logits[:, rows, chunk.answer_pos])  # [g, b, v]
        return {"logits": torch.cat(outs).transpose(0, 1)}  # [b, S, v]

    # smaller data chunks so that several subsets fit in one forward
    share = min(S, 16)
    if batch_size is not None:
        out = map_chunks(model, data, fn, batch_size=max(1, batch_size // share))
    else:
        out = map_chunks(model, data, fn, budget=max(1, DEFAULT_BUDGET // share))
    return out["logits"].transpose(0, 1)
