"""A shipped hypothesis: a causal model, the variable to look for, where to look, and how to pair inputs.

Each task's suite offers its hypotheses (``suite_for(task).hypotheses(task)``, a dict by name); ``interp hypothesis
CHECKPOINT NAME`` and :func:`evaluate_hypothesis` run one: the IIA of the variable at each of the hypothesis's sites
(or those given), and, with ``das=k``, distributed alignment search at its DAS site, all on the same held-out pairs.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from interp.errors import ConfigError

from .causal_model import CausalModel
from .das import _split_pairs, distributed_alignment_search, remap
from .interchange import check_inputs, describe_pairs, draw_pairs, run_alignments
from .result import CausalAbstraction
from .sites import parse_site

if TYPE_CHECKING:
    from transformer_lens import HookedTransformer

    from interp.task import TaskData


@dataclass(frozen=True)
class Hypothesis:
    """``variable`` of ``causal_model``, looked for at ``sites`` (text such as ``"L0H3@answer"``; a function
    ``model -> list`` where they depend on the model's shape) and, by DAS, at ``das_site``. ``pairs(data, n, seed) ->
    (base, source)`` builds the pairs where random pairs of the data would not do (they then line up row by row);
    ``same``: fields a drawn pair's examples share."""

    causal_model: CausalModel
    variable: str
    sites: Sequence[str] | Callable[[HookedTransformer], Sequence[str]] = ()
    das_site: str | Callable[[HookedTransformer], str] | None = None
    about: str = ""
    pairs: Callable[[TaskData, int, int], tuple[TaskData, TaskData]] | None = None
    same: tuple[str, ...] = ()

    def sites_for(self, model: HookedTransformer) -> list[str]:
        return list(self.sites(model) if callable(self.sites) else self.sites)

    def das_site_for(self, model: HookedTransformer) -> str | None:
        return self.das_site(model) if callable(self.das_site) else self.das_site


def evaluate_hypothesis(
    model: HookedTransformer,
    data: TaskData,
    *,
    hypothesis: Hypothesis | str,  # a name is refused, saying where the shipped hypotheses are
    sites: Sequence[object] | None = None,
    das: int | None = None,
    train: TaskData | None = None,
    pairs: int = 1000,
    changed: float = 0.5,
    seed: int = 0,
    steps: int = 300,
    method: str = "auto",
    batch_size: int | None = None,
    device: str | None = None,
) -> CausalAbstraction:
    """The hypothesis on ``data``: IIA of its variable at ``sites`` (default: the hypothesis's), and with ``das=k``
    distributed alignment search of a ``k``-dimensional subspace at its DAS site (or, where ``sites`` are given,
    at each of them), trained on pairs of ``train`` (default: the other half of ``data``); all rows on the same
    held-out pairs of ``data``."""
    if not isinstance(hypothesis, Hypothesis):
        raise ConfigError(
            f"hypothesis must be a Hypothesis, got {type(hypothesis).__name__} {hypothesis!r}; a task's shipped ones: "
            "interp.analyses.suite_for(task).hypotheses(task)[name] (e.g. ['diff'])"
        )
    data = check_inputs(model, data, device, batch_size)
    cm, var = hypothesis.causal_model, hypothesis.variable
    given = sites is not None
    site_list = [parse_site(s, model) for s in (sites if given else hypothesis.sites_for(model))]
    das_sites = []
    if das is not None:
        if given:
            das_sites = site_list
        else:
            ds = hypothesis.das_site_for(model)
            if ds is None:
                raise ConfigError("this hypothesis names no DAS site; give one with sites=[...]")
            das_sites = [parse_site(ds, model)]
    if not site_list and not das_sites:
        raise ConfigError("no sites to test: give sites=[...] (e.g. 'L0H3@answer')")
    positions = (site_list or das_sites)[0].position
    positions = cm.readout if positions is None else positions
    tr_data, held_index = train, None
    if das_sites and train is None:  # DAS trains on one half of the examples; every row is scored on the other
        tr_data, data, held_index = _split_pairs(data, seed)
    train_pairs = None
    if hypothesis.pairs is not None:
        base, src = hypothesis.pairs(data, pairs, seed)
        base, src, drawn = draw_pairs(
            model, base, causal_model=cm, variable=var, pairs=None, source=src, changed=changed, seed=seed,
            same=(), positions=positions,
        )  # fmt: skip
        how = f"built by the hypothesis from {len(data)} examples (seed {seed})"
        if das_sites:
            train_pairs = hypothesis.pairs(tr_data, pairs, seed + 1)
    else:
        base, src, drawn = draw_pairs(
            model, data, causal_model=cm, variable=var, pairs=pairs, source=None, changed=changed, seed=seed,
            same=hypothesis.same, positions=positions,
        )  # fmt: skip
        how = describe_pairs(drawn, changed)
    drawn = remap(drawn, held_index)  # indices into the data given
    result = None
    if site_list:
        result = run_alignments(
            model,
            base,
            src,
            causal_model=cm,
            aligned=[(s.name, "site", var, [s]) for s in site_list],
            pairs=drawn,
            method=method,
            batch_size=batch_size,
            hypothesis=cm.name,
            how=how,
        )
    for s in das_sites:
        kw = {}
        if train_pairs is not None:
            kw = dict(train=train_pairs[0], train_source=train_pairs[1])
        else:
            kw = dict(train=tr_data, train_pairs=pairs)
        got = distributed_alignment_search(
            model,
            base,
            causal_model=cm,
            variable=var,
            site=s,
            k=das,
            source=src,
            changed=changed,
            same=hypothesis.same,
            seed=seed,
            steps=steps,
            method=method,
            batch_size=batch_size,
            **kw,
        )
        got.hypothesis = cm.name
        got.pairs = {"how": how}
        if drawn is not None:
            got.base_index, got.source_index = drawn.base.cpu(), drawn.source.cpu()
        result = got if result is None else result.merged(got)
    result.info["about"] = hypothesis.about
    return result
