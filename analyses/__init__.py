"""What we compute about trained models.

Every analysis speaks one dialect (docs/analyses.md, "The dialect"): ``fn(model, data, *, heads=..., layers=...,
batch_size=..., device=...)`` (``model`` a TransformerLens ``HookedTransformer``, ``data`` a ``TaskData`` or token
ids; everything after ``data`` keyword-only), or ``fn(model, *, ...)`` for analyses of the weights alone. Generic
analyses live at the top and never name a task. Each task's own analyses and its ``analyze``/``report`` suite live in
``analyses/<task_module>/`` (``noisy_majority``, ``repeated_tokens``, ``modular_addition``, ``integer_addition``).
Every result is an :class:`interp.results.Result`: ``to_dict()``, ``from_dict()``, ``text()``, ``figure()``, a rich
display in Jupyter. The slow plain-loop oracles the tests compare with are in :mod:`interp.analyses.reference`, not
here.

``import analyses`` is cheap: names are imported on first use. ``interp.analyses.__all__`` lists every analysis function
and result type.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

from interp.errors import removed_names

if TYPE_CHECKING:
    from interp.suite import Suite
    from interp.task import Task

_NAMES = {
    # generic
    "interp.analyses.answer_cache": ["AnswerCache", "cache_answer"],
    "interp.analyses.learned_accuracies": [
        "LearnedAccuracy",
        "learned_accuracy",
        "learned_accuracy_of",
        "learned_accuracy_of_size",
        "head_subsets",
        "mean_head_outputs",
        "subset_answer_logits",
    ],
    "interp.analyses.separation_accuracies": [
        "SeparationAccuracy",
        "separation_accuracy",
        "fit_separator",
        "make_separator",
        "head_features",
    ],
    "interp.analyses.circuits": [
        "CircuitMatrix",
        "OVCopying",
        "LogitDecomposition",
        "full_qk_circuit",
        "full_ov_circuit",
        "positional_qk_circuit",
        "k_composition_circuit",
        "ov_copying",
        "bigram_table",
        "logit_decomposition",
    ],
    "interp.analyses.circuit_discovery": ["Circuit", "discover_circuit", "edge_roc_auc", "top_k_masks"],
    "interp.analyses.circuit_graph": ["ComputationalGraph", "computational_graph"],
    "interp.analyses.circuit_population": ["PopulationCircuits", "population_circuits"],
    "interp.analyses.circuit_groundtruth": ["weight_edges", "load_groundtruth"],
    "interp.analyses.coalitions": ["CoalitionValues", "coalition_values", "coalition_evaluator"],
    # analyses.shapley holds the one entry, analyses.shapley_result the math and the result
    "interp.analyses.shapley": ["shapley_values"],
    "interp.analyses.shapley_result": ["ShapleyResult", "shapley_transform", "moebius"],
    "interp.analyses.batched_svc": ["svc_test_accuracy", "svc_weights"],
    "interp.analyses.composition": ["CompositionScores", "composition_scores", "random_baseline"],
    "interp.analyses.spectrum": ["AttentionSpectrum", "attention_spectrum"],
    "interp.analyses.halving": [
        "HalvingHistory",
        "halving_history",
        "shapley_scores",
        "single_head_scores",
        "train_halving",
    ],
    "interp.analyses.pattern_scores": [
        "HeadScores",
        "AblationTest",
        "head_scores",
        "ablation_induction_test",
        "repeated_random_tokens",
    ],
    "interp.analyses.generic_suite": ["TaskSummary", "random_repeat_probes"],
    "interp.analyses.populations": ["population_table", "format_table", "wilson_interval"],
    "interp.analyses.population_figures": [
        "Survival",
        "GridAccuracy",
        "LearningRateAccuracy",
        "accuracy_survival",
        "grid_accuracy",
        "lr_accuracy",
    ],
    # hypotheses: causal models, interchange interventions, distributed alignment search
    "interp.analyses.hypotheses": [
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
    ],
    "interp.analyses.patching": [
        "ActivationPatching",
        "PathPatching",
        "activation_patching",
        "path_patching",
    ],
    # noisy majority (Fraknói 2024, §5)
    "interp.analyses.noisy_majority.attention_ratios": [
        "AttentionRatios",
        "attention_ratios",
        "measured_attention_ratios",
        "exact_attention_ratios",
    ],
    "interp.analyses.noisy_majority.head_outputs": ["HeadOutputs", "head_outputs", "value_vectors"],
    "interp.analyses.noisy_majority.interventions": [
        "InterventionSweep",
        "attention_intervention_sweep",
        "intervened_head_outputs",
    ],
    "interp.analyses.noisy_majority.head_summary": ["HeadSummary", "PairMatrix", "head_summary"],
    "interp.analyses.noisy_majority.handbuilt": ["minimal_majority_transformer", "attention_preference_model"],
    "interp.analyses.noisy_majority.corrupt": ["flip_answer"],
    "interp.analyses.noisy_majority.census": ["Census", "census"],
    "interp.analyses.noisy_majority.training_census": ["TrainingCensus", "census_over_training"],
    # repeated tokens (Elhage et al. 2021 and Li, *A Mathematical Framework for Transformer Circuits*)
    "interp.analyses.repeated_tokens.probe": ["probe_tokens"],
    "interp.analyses.repeated_tokens.handbuilt": ["induction_circuit_model"],
    "interp.analyses.repeated_tokens.suite": ["InductionAnalysis"],
    # modular addition (Fraknói 2024, §4, Nanda et al. 2023)
    "interp.analyses.modular_addition.fourier": [
        "FrequencyNorms",
        "NeuronFrequencies",
        "NeuronLogitMap",
        "fourier_basis",
        "find_key_frequencies",
        "key_frequencies_of",
        "logit_frequency_energy",
        "embedding_norms",
        "neuron_frequencies",
        "neuron_logit_map",
    ],
    "interp.analyses.modular_addition.progress": [
        "Phases",
        "progress_measures",
        "restricted_logits",
        "excluded_logits",
        "progress_from_snapshots",
        "find_phases",
        "sum_squared_weights",
    ],
    "interp.analyses.modular_addition.exhaustive": [
        "AttentionSplit",
        "AblationTable",
        "attention_split",
        "ablated_accuracy",
        "ablated_accuracies",
        "ablation_table",
    ],
    "interp.analyses.modular_addition.suite": ["ModularAdditionAnalysis"],
    # integer addition (Ibrahimli 2024, Compositional Generalization in Transformers, Fraknói 2024, §4)
    "interp.analyses.integer_addition.accuracy": [
        "CaseAccuracy",
        "LengthAccuracy",
        "accuracy_by_case",
        "accuracy_by_length",
        "correct_digits",
    ],
    "interp.analyses.integer_addition.ablation": ["DigitAblation", "component_ablation"],
    "interp.analyses.integer_addition.decoding": ["GreedyDecoding", "greedy_exact_match", "greedy_tokens"],
    "interp.analyses.integer_addition.subtasks": ["SubtaskProbes", "subtask_probes"],
    "interp.analyses.integer_addition.suite": ["AdditionAnalysis"],
}
_WHERE = {name: module for module, names in _NAMES.items() for name in names}
__all__ = [*sorted(_WHERE), "suite_for"]  # noqa: PLE0604 (names computed from the table above)


_REMOVED = {
    "shapley_of": "shapley_values(model, data, method='exact', ...)",
    "exact_shapley": "CoalitionValues.shapley() (CoalitionValues(heads, values, value) wraps a bare vector), or "
    "shapley_values(model, data, method='exact', ...)",
    "sampled_shapley": "shapley_values(model, data, method='sampled', samples=, seed=, antithetic=, ...)",
    **dict.fromkeys(
        ("learned_accuracy_loop", "path_patching_loop", "variant_metric"),
        "moved to interp.analyses.reference (the tests' oracles)",
    ),
}
_removed = removed_names("interp.analyses", _REMOVED)


def __getattr__(name):
    if name in _WHERE:
        return getattr(importlib.import_module(_WHERE[name]), name)
    return _removed(name)


def __dir__():
    return __all__


def suite_for(task: Task | str) -> Suite:
    """The analysis suite of a task: the one its registration names (:func:`interp.registry.suite_of`), or the
    generic suite every task has (:data:`interp.analyses.generic_suite.SUITE`: evaluation, per-head learned accuracy,
    head scores where defined, the explorer's generic inputs) where it names none or the task is not registered. An
    unregistered name is the registry's one-line TaskError."""
    from interp.registry import suite_of

    suite = suite_of(task)
    if suite is None:
        from .generic_suite import SUITE

        return SUITE
    return suite
