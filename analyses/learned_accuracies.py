"""Learned accuracy A_l(H) (Fraknói 2024, Definition 5.1): the model's accuracy with every head outside H ablated.

Heads are ablated through their outputs ``z`` (TransformerLens' ``hook_z``, before ``W_O``): zeroing ``z``
zeroes the head's contribution ``z W_O`` (``b_O`` is not per head and stays). Mean-ablation replaces ``z``
by the head's mean output at the answer positions of a reference set instead.

Many subsets are evaluated as one batched computation with a subset axis (a mask ``[subset, layer, head]``):

- ``method="hooks"`` (any number of layers): the batch is repeated once per subset in a group of subsets
  and a ``hook_z`` hook multiplies each copy by its subset's mask;
- ``method="fast"`` (one-layer attention-only models, exact): heads of one layer do not interact, so
  ``z`` at the answer position is cached once (:func:`analyses.answer_cache.cache_answer`) and the answer
  logits of every subset are recombined as ``unembed(ln_final(resid_pre + b_O + sum_h m_h z_h W_O[h]))``.

Both are tested equal to :func:`learned_accuracy_loop`, one ``run_with_hooks`` per subset.
Accuracy means ``argmax(logits[answer_pos]) == labels``, as the task's own ``accuracy`` metric.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from itertools import combinations
from typing import TYPE_CHECKING

import torch
from jaxtyping import Float
from torch import Tensor

from interp.errors import HeadError, InterpError
from interp.evaluation import DEFAULT_BUDGET, check_finite_logits, check_finite_parameters, map_chunks
from interp.heads import Head, all_heads, head_label, head_mask, parse_head, parse_heads
from interp.query_forward import resolve_method
from interp.results import Result, jsonable
from interp.task import TaskData

from .answer_cache import AnswerCache, as_cache, check_model_data

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


def parse_subsets(subsets: Iterable, n_layers: int, n_heads: int, *, allow_empty: bool = True) -> list[Subset]:
    """Each subset as a tuple of ``(layer, head)``; heads may be given as ``'L0H3'``, ``'0.3'`` or pairs."""
    if isinstance(subsets, (str, tuple)) and not isinstance(subsets, list):
        raise InterpError(f"expected a list of head subsets (e.g. [['L0H1'], ['L0H1', 'L0H2']]), got {subsets!r}")
    out = [tuple(parse_heads(s, n_layers, n_heads, allow_empty=allow_empty)) for s in subsets]
    if not out:
        raise InterpError("no head subsets were given; expected at least one")
    return out


def mean_head_outputs(model: HookedTransformer, data: TaskData | AnswerCache) -> Float[Tensor, "layer head d_head"]:
    """Each head's mean output ``z`` at the answer positions of ``data``: the mean-ablation reference."""
    cache = as_cache(model, data, attention=False)
    return cache.z.mean(0)


@dataclass
class LearnedAccuracy(Result):
    """Accuracy per head subset with the other heads ablated. ``accuracy[s]`` belongs to ``subsets[s]``."""

    subsets: list[Subset]
    accuracy: Float[Tensor, " subset"]
    ablation: str
    n_examples: int

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
                "subsets": [[head_label(*h) for h in s] for s in self.subsets],
                "accuracy": self.accuracy,
            }
        )

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
    subsets: Iterable,
    *,
    ablation: str = "zero",
    reference=None,
    method: str = "auto",
    task: Task | None = None,
    budget: int = DEFAULT_BUDGET,
    cache: AnswerCache | None = None,
) -> LearnedAccuracy:
    """A_l(H) for every H in ``subsets`` (a list of head lists; ``[]`` is the direct path alone).

    ``ablation``: ``"zero"`` or ``"mean"`` (the ablated heads output their mean ``z`` at the answer
    positions of ``reference``, default ``data``). ``method``: ``"fast"``, ``"hooks"`` or ``"auto"``
    (fast when the model allows). ``cache``: an :class:`AnswerCache` of ``data`` to reuse (fast method)."""
    if isinstance(data, AnswerCache):  # an answer cache is enough for the fast method
        cache, method = data, ("fast" if method == "auto" else method)
        if method != "fast":
            raise InterpError("an AnswerCache can only be evaluated with method='fast'; pass the task data for 'hooks'")
        check_finite_parameters(model)
    else:
        check_model_data(model, data, task)
    cfg = model.cfg
    parsed = parse_subsets(subsets, cfg.n_layers, cfg.n_heads)
    logits = subset_answer_logits(
        model, data, parsed, ablation=ablation, reference=reference, method=method, budget=budget, cache=cache
    )
    check_finite_logits(logits, "the answer logits under these ablations")
    labels = data.labels.to(logits.device)
    acc = (logits.argmax(-1) == labels[None]).float().mean(-1)
    return LearnedAccuracy(parsed, acc, ablation, len(data))


def learned_accuracy_of(model: HookedTransformer, data: TaskData | AnswerCache, heads, **kw) -> float:
    """A_l(H) of one subset ``heads`` (e.g. ``['L0H8', 'L0H9']``; ``[]``: the direct path alone)."""
    return float(learned_accuracy(model, data, [heads], **kw).accuracy[0])


def learned_accuracy_of_size(
    model: HookedTransformer, data: TaskData | AnswerCache, size: int, **kw
) -> LearnedAccuracy:
    """A_l(H) for every subset of ``size`` heads (1: singles, 2: pairs, 3: triples)."""
    return learned_accuracy(model, data, head_subsets(model.cfg.n_layers, model.cfg.n_heads, size), **kw)


def subset_answer_logits(
    model: HookedTransformer,
    data: TaskData | AnswerCache,
    subsets: Sequence[Sequence[Head]],
    *,
    ablation: str = "zero",
    reference=None,
    method: str = "auto",
    budget: int = DEFAULT_BUDGET,
    cache: AnswerCache | None = None,
) -> Float[Tensor, "subset batch vocab_out"]:
    """The answer-position logits of every example under every subset's ablation."""
    if ablation not in ABLATIONS:
        raise InterpError(f"unknown ablation {ablation!r}; expected one of {ABLATIONS}")
    method = resolve_method(model, method)
    cfg = model.cfg
    device = next(model.parameters()).device
    masks = head_mask(subsets, cfg.n_layers, cfg.n_heads, device)
    z_ref = None
    if ablation == "mean":
        ref = reference if reference is not None else (cache if cache is not None else data)
        z_ref = mean_head_outputs(model, ref).to(device)
    if method == "fast":
        cache = cache if cache is not None else as_cache(model, data, attention=False)
        if len(cache) != len(data):
            raise InterpError(
                f"the cache holds {len(cache)} examples but the data {len(data)}; pass the cache of this data"
            )
        return cached_subset_logits(model, cache, masks, z_ref)
    return hooked_subset_logits(model, data, masks, z_ref, budget)


def cached_subset_logits(
    model: HookedTransformer,
    cache: AnswerCache,
    masks: Float[Tensor, "subset layer head"],
    z_ref: Float[Tensor, "layer head d_head"] | None = None,
    block_elems: int = 1 << 24,
) -> Float[Tensor, "subset batch vocab_out"]:
    """Exact answer logits per subset for a one-layer attention-only model, from cached ``z``."""
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
            out.append(model.unembed(resid))
    return torch.cat(out)


def _mask_hook(layer: int, rows: Float[Tensor, "rows layer head"], z_ref):
    def hook(z, hook):
        m = rows[:, layer][:, None, :, None].to(z.dtype)
        if z_ref is None:
            return z * m
        return z * m + z_ref[layer][None, None] * (1 - m)

    return hook


def hooked_subset_logits(
    model: HookedTransformer,
    data: TaskData,
    masks: Float[Tensor, "subset layer head"],
    z_ref=None,
    budget: int = DEFAULT_BUDGET,
) -> Float[Tensor, "subset batch vocab_out"]:
    """Answer logits per subset through ``hook_z`` hooks, any number of layers: each forward runs a group of
    subsets at once on a repeated batch (subset-major), with at most ``budget`` attention entries per head."""
    S = masks.shape[0]
    L = model.cfg.n_layers

    def fn(chunk: TaskData) -> dict[str, Tensor]:
        b, t = chunk.tokens.shape
        group = max(1, budget // max(1, b * t * t))
        rows = torch.arange(b, device=chunk.tokens.device)
        outs = []
        with torch.inference_mode():
            for i in range(0, S, group):
                g = masks[i : i + group]
                big = chunk.tokens.repeat(len(g), 1)
                row_mask = g.repeat_interleave(b, 0)
                hooks = [(f"blocks.{l}.attn.hook_z", _mask_hook(l, row_mask, z_ref)) for l in range(L)]
                logits = model.run_with_hooks(big, fwd_hooks=hooks).view(len(g), b, t, -1)
                outs.append(logits[:, rows, chunk.answer_pos])  # [g, b, v]
        return {"logits": torch.cat(outs).transpose(0, 1)}  # [b, S, v]

    # smaller data chunks so that several subsets fit in one forward
    out = map_chunks(model, data, fn, budget=max(1, budget // min(S, 16)))
    return out["logits"].transpose(0, 1)


def learned_accuracy_loop(
    model: HookedTransformer,
    data: TaskData,
    subsets: Iterable,
    *,
    ablation: str = "zero",
    reference=None,
    task: Task | None = None,
) -> LearnedAccuracy:
    """The slow reference: one ``run_with_hooks`` pass over the data per subset (tests and benchmarks)."""
    check_model_data(model, data, task)
    cfg = model.cfg
    parsed = parse_subsets(subsets, cfg.n_layers, cfg.n_heads)
    device = next(model.parameters()).device
    z_ref = None
    if ablation == "mean":
        z_ref = mean_head_outputs(model, reference if reference is not None else data).to(device)
    accs = []
    for subset in parsed:
        mask = head_mask([subset], cfg.n_layers, cfg.n_heads, device)[0]

        def fn(chunk: TaskData, mask: Tensor = mask) -> dict[str, Tensor]:
            hooks = []
            for l in range(cfg.n_layers):

                def hook(z, hook, l=l):
                    m = mask[l][None, None, :, None]
                    return z * m if z_ref is None else z * m + z_ref[l][None, None] * (1 - m)

                hooks.append((f"blocks.{l}.attn.hook_z", hook))
            with torch.inference_mode():
                logits = model.run_with_hooks(chunk.tokens, fwd_hooks=hooks)
            rows = torch.arange(len(chunk), device=logits.device)
            return {"ok": logits[rows, chunk.answer_pos].argmax(-1) == chunk.labels}

        accs.append(map_chunks(model, data, fn)["ok"].float().mean())
    return LearnedAccuracy(parsed, torch.stack(accs), ablation, len(data))
