"""Interchange-intervention accuracy (IIA) of alignments between a causal model and a network.

An :class:`Alignment` maps one variable of a :class:`CausalModel` to sites of the network (Geiger et al. 2021,
*Causal Abstractions of Neural Networks*). Its IIA on (base, source) pairs is the share of pairs where running the
network on the base input with the sites patched from the source run gives the output the causal model gives when
the variable takes the source's value. IIA 1 on informative pairs is what "the site computes the variable" means
behaviourally; a site that carries nothing scores what the unpatched network scores (``null_iia``).

:func:`interchange_accuracy` evaluates many alignments on the same pairs in one batched computation
(:mod:`.engine`); the pairs are drawn from ``data`` by :func:`.pairs.sample_pairs` (stratified so that a share
``changed`` of them change the output) or given.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from torch import Tensor

from interp.device import check_device, model_device
from interp.errors import ConfigError, TaskError
from interp.evaluation import check_batch_size, check_finite_parameters, check_tokens
from interp.task import TaskData, check_nonempty

from .causal_model import CausalModel
from .engine import Engine, Patch
from .pairs import Pairs, sample_pairs
from .result import CausalAbstraction
from .sites import Site, parse_site, resolve_positions

if TYPE_CHECKING:
    from transformer_lens import HookedTransformer


@dataclass(frozen=True, eq=False)
class Alignment:
    """``variable`` of the causal model mapped to ``sites`` (a :class:`Site`, its text such as ``"L0H3@answer"``, a
    head ``(0, 3)``, or a list of them, patched together); ``label`` names the row (default: the sites' names)."""

    variable: str
    sites: object
    label: str = ""

    def resolved(self, model: HookedTransformer) -> tuple[Site, ...]:
        specs = self.sites
        if isinstance(specs, (str, Site)) or (
            isinstance(specs, tuple) and len(specs) == 2 and all(isinstance(x, int) for x in specs)
        ):
            specs = [specs]
        sites = tuple(parse_site(s, model) for s in specs)
        if not sites:
            raise ConfigError(f"the alignment of {self.variable!r} names no site")
        return sites

    def name(self, model: HookedTransformer) -> str:
        return self.label or "+".join(s.name for s in self.resolved(model))


def alignments(variable: str, sites: Sequence[object]) -> list[Alignment]:
    """One alignment of ``variable`` per site: the rows of a scan over sites."""
    return [Alignment(variable, s) for s in sites]


def _alignment_list(alignment) -> list[Alignment]:
    if isinstance(alignment, Alignment):
        return [alignment]
    if (
        isinstance(alignment, Sequence)
        and not isinstance(alignment, str)
        and all(isinstance(a, Alignment) for a in alignment)
    ):
        if not alignment:
            raise ConfigError("alignment= is empty; give at least one Alignment")
        return list(alignment)
    raise ConfigError(
        f"alignment must be an Alignment or a list of them (interp.analyses.Alignment(variable, sites)), got "
        f"{type(alignment).__name__}"
    )


def check_inputs(model: HookedTransformer, data: TaskData, device, batch_size) -> TaskData:
    """The shared refusals of the hypothesis analyses, before any work; the data on the model's device."""
    from interp.analyses.answer_cache import check_model_data

    check_device(model, device)
    check_batch_size(batch_size)
    check_model_data(model, data)
    check_finite_parameters(model)
    data = data.to(model_device(model))
    check_tokens(model, data.tokens)
    return data


def draw_pairs(
    model: HookedTransformer,
    data: TaskData,
    *,
    causal_model: CausalModel,
    variable: str,
    pairs,
    source: TaskData | None,
    changed: float,
    seed: int,
    same: Sequence[str],
    positions,
) -> tuple[TaskData, TaskData, Pairs | None]:
    """(base, source, the drawn pairs or None): ``source`` given lines up with ``data`` row by row; otherwise
    ``pairs`` is a :class:`Pairs`, an index tensor ``[pair, 2]`` into ``data``, or a number of pairs to draw."""
    if source is not None:
        if not isinstance(source, TaskData):
            raise TaskError(f"source must be task data lined up with data row by row, got {type(source).__name__}")
        check_nonempty(source, "the source data")
        if len(source) != len(data):
            raise TaskError(f"source and data must pair row by row: {len(source)} and {len(data)} examples")
        if source.task != data.task:
            raise TaskError(f"source data is of task {source.task!r} but data of task {data.task!r}")
        source = source.to(model_device(model))
        check_tokens(model, source.tokens)
        return data, source, None
    if isinstance(pairs, Tensor):
        idx = pairs.long().cpu()
        if idx.dim() != 2 or idx.shape[1] != 2:
            raise ConfigError(f"pairs as a tensor must be [pair, 2] indices (base, source), got {tuple(idx.shape)}")
        if int(idx.min()) < 0 or int(idx.max()) >= len(data):
            raise ConfigError(f"pair indices must lie in [0, {len(data) - 1}]")
        pairs = Pairs(idx[:, 0], idx[:, 1], torch.zeros(len(idx), dtype=torch.bool), variable, float("nan"), -1)
    elif not isinstance(pairs, Pairs):
        pairs = sample_pairs(
            data,
            causal_model=causal_model,
            variable=variable,
            n=pairs,
            changed=changed,
            seed=seed,
            same=same,
            positions=positions,
        )
    base, src = pairs.select(data)
    return base, src, pairs


def run_alignments(
    model: HookedTransformer,
    base: TaskData,
    source: TaskData,
    *,
    causal_model: CausalModel,
    aligned: Sequence[tuple[str, str, str, Sequence[Site]]],
    pairs: Pairs | None,
    method: str,
    batch_size: int | None,
    hypothesis: str = "",
    how: str = "",
) -> CausalAbstraction:
    """The :class:`CausalAbstraction` of ``aligned`` rows ``(label, kind, variable, sites)`` on row-aligned base and
    source data."""
    t0 = time.perf_counter()
    readout = resolve_positions(causal_model.readout, base, causal_model.positions, "readout")
    if readout.shape[1] != 1:
        raise ConfigError("the causal model's readout must be one position per example")
    readout = readout[:, 0]
    plans, cfs = [], []
    resolved: dict[object, tuple[Tensor, Tensor]] = {}  # one tensor per position spec: the engine shares their work
    for _label, _kind, variable, sites in aligned:
        plan = []
        for s in sites:
            pos = causal_model.readout if s.position is None else s.position
            key = pos if isinstance(pos, (str, int)) else id(pos)
            if key not in resolved:
                resolved[key] = (
                    resolve_positions(pos, base, causal_model.positions),
                    resolve_positions(pos, source, causal_model.positions),
                )
            bp, sp = resolved[key]
            if bp.shape[1] != sp.shape[1]:
                raise ConfigError(f"site {s.name}: {bp.shape[1]} base positions but {sp.shape[1]} source positions")
            plan.append(Patch(s, bp, sp))
        var = causal_model.check_variable(variable)
        if var.positional:
            if len(plan) != 1 and len({tuple(p.base_pos.flatten().tolist()) for p in plan}) != 1:
                raise ConfigError(f"positional variable {variable!r}: its sites must share their positions")
            cfs.append(causal_model.interchange(base, source, variable, plan[0].base_pos, plan[0].source_pos))
        else:
            cfs.append(causal_model.interchange(base, source, variable))
        plans.append(plan)
    src_readout = resolve_positions(causal_model.readout, source, causal_model.positions, "readout")[:, 0]
    engine = Engine(model, base, source, plans, readout, src_readout, method=method, batch_size=batch_size)
    logits = engine.all_logits()
    pred = logits.argmax(-1)
    cf = torch.stack(cfs).to(pred.device)
    src_pred = engine.source_logits.argmax(-1)
    info = {
        "method": engine.method,
        "readout": causal_model.readout if isinstance(causal_model.readout, (str, int)) else "custom",
        "seconds": round(time.perf_counter() - t0, 3),
        "task": base.task,
    }
    pair_info = {"how": how}
    if pairs is not None:
        pair_info.update(
            {
                "stratified_on": pairs.variable,
                "target_changed": pairs.target,
                "changed_share": pairs.changed_share,
                "seed": pairs.seed,
            }
        )
    return CausalAbstraction(
        hypothesis=hypothesis or causal_model.name or "causal model",
        causal_model=causal_model.describe(),
        labels=[a[0] for a in aligned],
        variables=[a[2] for a in aligned],
        kinds=[a[1] for a in aligned],
        correct=(pred == cf).cpu(),
        counterfactual=cf.cpu(),
        base_output=causal_model.output_of(base).cpu(),
        source_output=causal_model.output_of(source).cpu(),
        base_prediction=engine.base_logits.argmax(-1).cpu(),
        source_prediction=src_pred.cpu(),
        base_index=None if pairs is None else pairs.base.cpu(),
        source_index=None if pairs is None else pairs.source.cpu(),
        pairs=pair_info,
        info=info,
    )


def describe_pairs(pairs: Pairs | None, changed: float) -> str:
    if pairs is None:
        return "given row by row"
    if pairs.seed < 0:
        return "given as indices"
    return (
        f"drawn with seed {pairs.seed}, stratified on {pairs.variable}: {pairs.changed_share:.2f} change the output "
        f"(asked {changed:.2f})"
    )


def interchange_accuracy(
    model: HookedTransformer,
    data: TaskData,
    *,
    causal_model: CausalModel,
    alignment: Alignment | Sequence[Alignment],
    pairs: int | Pairs | Tensor = 1000,
    source: TaskData | None = None,
    changed: float = 0.5,
    same: Sequence[str] = (),
    seed: int = 0,
    method: str = "auto",
    batch_size: int | None = None,
    device: str | None = None,
) -> CausalAbstraction:
    """IIA of each alignment (rows of the result) on the same (base, source) pairs.

    Pairs: ``pairs`` pairs drawn from ``data`` (seeded; a share ``changed`` of them change the causal model's output
    under the first alignment's variable; ``same``: fields a pair's examples share), a :class:`Pairs` or ``[pair, 2]``
    indices into ``data``; or, with ``source=``, ``data[i]`` paired with ``source[i]``. ``method``: ``"auto"`` (the
    last-layer shortcut where it applies, hooked forwards elsewhere), ``"hooks"`` or ``"fast"``; ``batch_size``:
    at most this many sequences per forward (memory, never the numbers)."""
    data = check_inputs(model, data, device, batch_size)
    aligns = _alignment_list(alignment)
    resolved = [(a.name(model), "site", a.variable, a.resolved(model)) for a in aligns]
    first_var = aligns[0].variable
    causal_model.check_variable(first_var)
    first_pos = resolved[0][3][0].position
    first_pos = causal_model.readout if first_pos is None else first_pos
    base, src, drawn = draw_pairs(
        model,
        data,
        causal_model=causal_model,
        variable=first_var,
        pairs=pairs,
        source=source,
        changed=changed,
        seed=seed,
        same=same,
        positions=first_pos,
    )
    return run_alignments(
        model,
        base,
        src,
        causal_model=causal_model,
        aligned=resolved,
        pairs=drawn,
        method=method,
        batch_size=batch_size,
        how=describe_pairs(drawn, changed),
    )
