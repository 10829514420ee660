"""Hypotheses, tested: causal models, interchange interventions and distributed alignment search.

A researcher writes down the algorithm they believe a network runs (a :class:`CausalModel` of named variables over
the task's fields), maps a variable to a site of the network (an :class:`Alignment`: heads' outputs or the residual
stream at a position, whole or a subspace), and asks whether the network behaves as the variable does under
interchange interventions (:func:`interchange_accuracy`; Geiger et al. 2021, *Causal Abstractions of Neural
Networks*), or lets gradient descent find the subspace that does (:func:`distributed_alignment_search`; Geiger et
al. 2024, *Finding Alignments Between Interpretable Causal Variables and Distributed Neural Representations*). Each
task's suite ships its hypotheses (:class:`Hypothesis`, run by :func:`evaluate_hypothesis` and ``interp
hypothesis``). Every result is a :class:`CausalAbstraction`. See docs/hypotheses.md.

Modules: ``causal_model`` (variables and interventions), ``sites`` (where, and the site syntax), ``pairs`` (drawing
informative pairs), ``engine`` (the batched interventions), ``interchange`` (IIA), ``das``, ``hypothesis`` (shipped
hypotheses and their runner), ``result``.
"""

from __future__ import annotations

from .causal_model import CausalModel, Variable
from .das import distributed_alignment_search, principal_angles, random_bases
from .hypothesis import Hypothesis, evaluate_hypothesis
from .interchange import Alignment, alignments, interchange_accuracy
from .pairs import Pairs, sample_pairs
from .result import CausalAbstraction
from .sites import Site, parse_site

__all__ = [
    "Alignment",
    "CausalAbstraction",
    "CausalModel",
    "Hypothesis",
    "Pairs",
    "Site",
    "Variable",
    "alignments",
    "distributed_alignment_search",
    "evaluate_hypothesis",
    "interchange_accuracy",
    "parse_site",
    "principal_angles",
    "random_bases",
    "sample_pairs",
]
