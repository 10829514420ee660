"""The explorer's numbers, computed by the toolkit in the kernel: the forward pass with heads switched off (logits,
every head's attention pattern, head outputs), the prediction at the answer positions, each head's direct logit
contribution, the patterns as the page draws them, and the head panel's numbers (circuits, induction /
previous-token scores, separation accuracy, Shapley values)."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

import torch
from jaxtyping import Float, Int
from torch import Tensor

from interp.ablation import ablation_hooks
from interp.analyses.circuits import CircuitMatrix, full_ov_circuit, full_qk_circuit, positional_qk_circuit
from interp.analyses.generic_suite import random_repeat_probes
from interp.analyses.pattern_scores import HeadScores
from interp.analyses.separation_accuracies import SeparationAccuracy
from interp.analyses.shapley import EXACT_UP_TO, ShapleyResult
from interp.analyses.shapley import shapley_values as shapley_values_of
from interp.attention import layer_attention
from interp.device import model_device
from interp.heads import Head, head_label, parse_head

from .results import Prediction

if TYPE_CHECKING:
    from transformer_lens import HookedTransformer

    from interp.analyses.answer_cache import AnswerCache
    from interp.suite import Suite
    from interp.task import Task, TaskData, Vocab

MAX_POSITIONS = 256  # attention patterns drawn: at most this many positions (the last ones) per head
CELL_BUDGET = 1 << 21  # attention entries sent to the page at most (all heads): 4 MiB as uint16
TOP_K = 3  # tokens shown per answer position
CIRCUIT_MAX = 128  # circuit rows/columns drawn at most
SCORE_NAMES = ("induction", "prev_token", "duplicate", "bos")  # the pattern scores the head panel shows
SHAPLEY_EXACT_MAX = EXACT_UP_TO  # heads: exact Shapley values (2**16 coalitions); more heads are sampled
SHAPLEY_SAMPLES = 200  # permutations of sampled Shapley values

Hook = tuple[str, Callable[..., Tensor]]


def finite_or_none(x: object) -> float | None:
    """``x`` as a float, or None where it is NaN or infinite (JSON has neither)."""
    x = float(x)
    return x if math.isfinite(x) else None


# -- the forward pass with heads switched off --------------------------------------------------------------------


def keep_mask(model: HookedTransformer, off: Iterable[object]) -> Float[Tensor, "layer head"]:
    """``[layer, head]`` with 0 for the heads in ``off`` (names like ``'L0H3'`` or pairs) and 1 elsewhere."""
    cfg = model.cfg
    keep = torch.ones(cfg.n_layers, cfg.n_heads, device=model_device(model))
    for spec in off:
        layer, head = parse_head(spec, cfg.n_layers, cfg.n_heads)
        keep[layer, head] = 0.0
    return keep


def mask_hooks(
    model: HookedTransformer,
    keep: Float[Tensor, "layer head"],
    z_ref: Float[Tensor, "layer head d_head"] | None = None,
) -> list[Hook]:
    """``hook_z`` hooks that ablate the heads where ``keep`` is 0: their output ``z`` becomes 0 (``z_ref`` None) or
    ``z_ref`` (mean ablation): :func:`interp.ablation.ablation_hooks`, as :func:`analyses.learned_accuracy`'s hook path
    uses it."""
    return ablation_hooks(model, keep, z_ref)


def masked_forward(
    model: HookedTransformer,
    tokens: Int[Tensor, "batch pos"],
    keep: Float[Tensor, "layer head"],
    z_ref: Float[Tensor, "layer head d_head"] | None = None,
) -> dict[str, Tensor | None]:
    """One forward pass with the heads where ``keep`` is 0 ablated: ``logits [batch, pos, vocab_out]``, every head's
    attention ``patterns [batch, layer, head, query, key]``, the head outputs after the ablation ``z [batch, layer,
    pos, head, d_head]`` and the final LayerNorm's ``scale [batch, pos, 1]`` (None without one)."""
    store: dict[str, Any] = {"pattern": {}, "z": {}}

    def keep_pattern(p, hook):
        store["pattern"][hook.layer()] = p

    def keep_z(z, hook):
        store["z"][hook.layer()] = z

    def keep_scale(s, hook):
        store["scale"] = s

    n_layers = model.cfg.n_layers
    hooks = mask_hooks(model, keep, z_ref)
    hooks += [(f"blocks.{layer}.attn.hook_z", keep_z) for layer in range(n_layers)]
    hooks += [(f"blocks.{layer}.attn.hook_pattern", keep_pattern) for layer in range(n_layers)]
    if model.cfg.normalization_type is not None:
        hooks.append(("ln_final.hook_scale", keep_scale))
    with torch.inference_mode():
        logits = model.run_with_hooks(tokens, fwd_hooks=hooks)
    return {
        "logits": logits,
        "patterns": torch.stack([store["pattern"][layer] for layer in range(n_layers)], 1),
        "z": torch.stack([store["z"][layer] for layer in range(n_layers)], 1),
        "scale": store.get("scale"),
    }


def answer_prediction(
    logits: Float[Tensor, "pos vocab_out"], targets: Int[Tensor, " pos"], answer_pos: int, token_names: list[str]
) -> Prediction:
    """The top ``TOP_K`` tokens and their probabilities at every position with a target (at the answer position
    alone where none has one), from one input's logits."""
    positions = [int(p) for p in (targets >= 0).nonzero().flatten().tolist()] or [answer_pos]
    probs = logits[positions].float().softmax(-1)
    top = probs.topk(min(TOP_K, probs.shape[-1]), -1)
    return Prediction(
        positions=positions,
        targets=[int(targets[p]) if int(targets[p]) >= 0 else None for p in positions],
        top_ids=top.indices.cpu(),
        top_probs=top.values.cpu(),
        logits=logits[positions].cpu(),
        answer_pos=answer_pos,
        token_names=token_names,
    )


def runner_up(logits: Float[Tensor, " vocab_out"], classes: Int[Tensor, " class"], label: int) -> int:
    """The highest-scoring of the task's answers ``classes`` other than ``label`` (the other class of a binary task,
    never a token that is not an answer there); ``label`` itself when there is no other."""
    others = torch.full_like(logits, float("-inf"))
    others[classes] = logits[classes]
    others[label] = float("-inf")
    return int(others.argmax()) if bool(torch.isfinite(others).any()) else label


def direct_logit_attribution(
    model: HookedTransformer,
    z: Float[Tensor, "layer pos head d_head"],
    scale: Float[Tensor, "pos 1"] | None,
    pos: int,
    good: int,
    bad: int,
) -> tuple[Tensor, Tensor]:
    """Each head's direct contribution at ``pos`` to the logit of ``good`` and to ``logit[good] - logit[bad]``
    (``[layer, head]`` each): its output ``z W_O`` through the final LayerNorm with the run's own scale held fixed
    (centred, divided by the scale, times its weight) and ``W_U``. Without a final LayerNorm this is exactly the
    head's term of :func:`analyses.logit_decomposition`; with one it is the usual frozen-scale linearisation."""
    with torch.inference_mode():
        c = torch.einsum("lhe,lhed->lhd", z[:, pos], model.W_O)
        norm = model.cfg.normalization_type
        if norm in ("LN", "LNPre"):
            c = c - c.mean(-1, keepdim=True)
        if scale is not None:
            c = c / scale[pos]
        if norm in ("LN", "RMS"):
            c = c * model.ln_final.w
        w_u = model.W_U
        return c @ w_u[:, good], c @ (w_u[:, good] - w_u[:, bad])


# -- the patterns as the page draws them -------------------------------------------------------------------------


def pattern_window(n_layers: int, n_heads: int, n_pos: int, max_positions: int) -> int:
    """How many positions (the last ones) of each head's pattern the page gets: at most ``max_positions``, and
    ``CELL_BUDGET`` entries over all heads."""
    return min(n_pos, max_positions, max(2, int((CELL_BUDGET / (n_layers * n_heads)) ** 0.5)))


def quantised_patterns(p: Float[Tensor, "layer head query key"], window: int) -> bytes:
    """The last ``window`` positions of every pattern as little-endian uint16 (weight x 65535), for the page."""
    off = p.shape[-1] - window
    q = (p[:, :, off:, off:].float().clamp(0, 1) * 65535).round().to(torch.int32)
    return q.numpy().astype("<u2").tobytes()


# -- the head panel ------------------------------------------------------------------------------------------------


def score_probes(suite: Suite, task: Task, n_ctx: int) -> tuple[Int[Tensor, "batch pos"] | None, str]:
    """The sequences the induction / previous-token scores are measured on (Olsson et al.), and what they are in
    words: the task's own probe sequences where its suite has them (:meth:`interp.suite.Suite.probe_tokens`), else
    repeated random output tokens (outside the task's distribution; :func:`analyses.random_repeat_probes`); no
    sequences where a context of ``n_ctx`` tokens holds no repeat."""
    own = suite.probe_tokens(task)
    if own is not None:
        return own, f"{own.shape[0]} of the task's own probe sequences ({own.shape[1]} tokens)"
    return random_repeat_probes(task.vocab, n_ctx)


def head_circuits(model: HookedTransformer, head: Head, vocab: Vocab) -> list[CircuitMatrix | dict]:
    """The head's full QK and OV circuits, and its positional QK circuit where the model has learned positions. A QK
    circuit that is undefined for the head's layer (linear or additive pooling: its scores are no bilinear ``q·k``)
    is ``{"name": ..., "undefined": why}`` in its place, so the panel shows what is defined and says what is not."""
    learned = model.cfg.positional_embedding_type in ("standard", "shortformer")
    positional = learned and bool(model.W_pos.detach().abs().max() > 0)
    pooling = layer_attention(model, head[0]).pooling
    if pooling != "softmax":
        why = (
            f"undefined for layer {head[0]}'s {pooling} pooling: its weights are φ(q)·φ(k), normalised, not exp(q·k)"
            if pooling.startswith("linear")
            else f"undefined for layer {head[0]}'s {pooling} pooling: its scores are v·tanh(q + k), not q·k"
        )
        qk = [{"name": f"full QK circuit of {head_label(*head)}", "undefined": why}]
        if positional:
            qk.append({"name": f"positional QK circuit of {head_label(*head)}", "undefined": why})
        return [qk[0], full_ov_circuit(model, heads=head, vocab=vocab), *qk[1:]]
    circuits = [full_qk_circuit(model, heads=head, vocab=vocab), full_ov_circuit(model, heads=head, vocab=vocab)]
    if positional:
        circuits.append(positional_qk_circuit(model, heads=head))
    return circuits


def circuit_view(circuit: CircuitMatrix, direct_only: bool) -> dict:
    """A circuit for the page: its top-left ``CIRCUIT_MAX`` corner as float32 bytes (NaN above the diagonal of a
    causal one), its labels and titles; ``direct_only`` marks a later-layer head's circuit, which goes through the
    embedding only."""
    full = circuit.dense()
    m = full.float()
    if circuit.causal:
        m = m.masked_fill(torch.ones_like(m, dtype=torch.bool).triu(1), float("nan"))
    m = m[:CIRCUIT_MAX, :CIRCUIT_MAX].contiguous().cpu()
    return {
        "name": circuit.name,
        "rows": circuit.row_labels[: m.shape[0]],
        "cols": circuit.col_labels[: m.shape[1]],
        "row_title": circuit.row_title,
        "col_title": circuit.col_title,
        "shape": list(m.shape),
        "full_shape": list(full.shape),
        "data": m.numpy().tobytes(),
        "direct_only": direct_only,
    }


def score_numbers(scores: HeadScores, head: Head) -> dict[str, float]:
    """The head's pattern scores, by name."""
    layer, h = head
    return {s: float(getattr(scores, s)[layer, h]) for s in SCORE_NAMES}


def separation_numbers(sep: SeparationAccuracy, i: int, labels: Int[Tensor, " batch"]) -> dict:
    """Head ``i``'s separation accuracy (in the heads' order), its ROC AUC and what it was measured on (``labels``:
    the answers of the examples it was scored on)."""
    return {
        "accuracy": float(sep.accuracy[i]),
        "roc_auc": finite_or_none(sep.roc_auc[i]),
        "n_train": sep.n_train,
        "n_test": sep.n_test,
        "n_classes": int(torch.unique(labels).numel()),
        "chance": finite_or_none(sep.chance),
    }


def shapley_numbers(shap: ShapleyResult, head: Head, i: int) -> dict:
    """Head ``head``'s (the ``i``-th in the heads' order) Shapley value, its standard error where sampled, its rank
    among all heads and the values of all heads and of none."""
    return {
        "value": shap[head],
        "exact": shap.exact,
        "stderr": None if shap.stderr is None else float(shap.stderr[i]),
        "rank": shap.ranking().index(head_label(*head)) + 1,
        "v_all": shap.v_all,
        "v_empty": shap.v_empty,
    }


def shapley_values(
    model: HookedTransformer, batch: TaskData, cache: AnswerCache, ablation: str, fast: bool
) -> ShapleyResult:
    """Shapley values of every head for the learned accuracy on ``batch``: exact up to ``SHAPLEY_EXACT_MAX`` heads,
    else sampled from ``SHAPLEY_SAMPLES`` permutations; from the cached head outputs where the fast path applies,
    the batch's mean head outputs as the reference of mean ablation."""
    data = cache if fast else batch
    ref = {"reference": cache} if ablation == "mean" else {}
    return shapley_values_of(
        model, data, value="learned-accuracy", ablation=ablation, method="auto", samples=SHAPLEY_SAMPLES, **ref
    )


def shapley_cost(n_heads: int, fast: bool) -> str:
    """What computing the Shapley values of ``n_heads`` heads takes, in words (the page shows it before the
    click)."""
    if n_heads > SHAPLEY_EXACT_MAX:
        return f"sampled from {SHAPLEY_SAMPLES} permutations of the {n_heads} heads"
    if fast:
        return f"exact over {2**n_heads:,} coalitions, recombined from cached head outputs"
    return f"exact over {2**n_heads:,} coalitions, each a forward pass of the batch (slow for deep models)"
