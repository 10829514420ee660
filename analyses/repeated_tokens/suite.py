"""Analysis suite of the ``repeated-tokens`` task: head scores, composition, the K-composition causal test,
OV copying and circuit heatmaps (``interp analyze`` / ``interp report``).

Works for 1-layer checkpoints too: composition and the causal test then say there is no later layer.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from interp.checkpoint import Checkpoint
from interp.device import model_device
from interp.errors import ConfigError
from interp.evaluation import evaluate
from interp.heads import head_label
from interp.results import Result, jsonable
from interp.suite import FunctionSuite
from interp.visualize import attention_view

from ..circuits import OVCopying, full_ov_circuit, k_composition_circuit, ov_copying, positional_qk_circuit
from ..composition import MODES, CompositionScores, composition_scores
from ..patching import activation_patching, path_patching
from ..pattern_scores import PATHS, AblationTest, HeadScores, ablation_induction_test, head_scores
from . import inputs
from .corrupt import corrupted_pair
from .probe import probe_tokens

if TYPE_CHECKING:
    from transformer_lens import HookedTransformer

    from interp.task import Task

N_SEQS = 64  # repeated-token sequences scored per analysis
N_PATCH = 16  # clean/corrupted pairs of the report's patching section


@dataclass(eq=False)
class InductionAnalysis(Result):
    """What ``interp analyze`` gives for a repeated-tokens model: head scores (with intervals), OV copying,
    composition scores, the causal tests (one per path: all, query, key, value) and the task metrics."""

    checkpoint: str
    n_layers: int
    n_heads: int
    scores: HeadScores
    copying: OVCopying
    composition: CompositionScores
    causal: dict = field(default_factory=dict)  # path -> AblationTest (empty for one-layer models)
    metrics: dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        heads = [
            {**row, "copying_score": cop["copying_score"], "ov_top1": cop["top1"]}
            for row, cop in zip(self.scores.rows(), self.copying.rows())
        ]
        return jsonable(
            {
                "task": "repeated-tokens",
                "checkpoint": self.checkpoint,
                "n_layers": self.n_layers,
                "n_heads": self.n_heads,
                "probe": {
                    "n_seqs": self.scores.n_seqs,
                    "seq_len": self.scores.seq_len,
                    "repeat_len": self.scores.seq_len // 2,
                },
                "heads": heads,
                "copying": self.copying.to_dict(),
                "composition": self.composition.to_dict(),
                "ablation": {path: t.to_dict() for path, t in self.causal.items()} or None,
                "metrics": self.metrics,
            }
        )

    @classmethod
    def from_dict(cls, d: dict) -> InductionAnalysis:
        probe = d["probe"]
        return cls(
            d["checkpoint"],
            d["n_layers"],
            d["n_heads"],
            HeadScores.from_dict({"n_seqs": probe["n_seqs"], "seq_len": probe["seq_len"], "heads": d["heads"]}),
            OVCopying.from_dict(d["copying"]),
            CompositionScores.from_dict(d["composition"]),
            {path: AblationTest.from_dict(t) for path, t in (d["ablation"] or {}).items()},
            d["metrics"],
        )

    def figure(self):
        return self.scores.figure()

    def table_html(self) -> str:
        return self.scores.table_html()

    def text(self) -> str:
        """Per-head table, the top K-composition pairs and the strongest effects of the causal tests."""
        L = self.n_layers
        m = self.metrics
        lines = [
            f"{self.checkpoint} (repeated-tokens, {L} layer{'s' * (L != 1)} x {self.n_heads} heads per layer)",
            f"test: repeat accuracy {m['accuracy']:.3f} (loss {m['loss']:.3f}); first-occurrence accuracy "
            f"{m['first_accuracy']:.3f} (loss {m['first_loss']:.3f})",
        ]
        lines.append(
            f"\nhead scores on {self.scores.n_seqs} sequences [BOS] R R, len(R) = {self.scores.seq_len // 2} "
            "(induction with its 95% bootstrap interval):"
        )
        cols = [
            ("induction_score", "induction"),
            ("prev_token_score", "prev-token"),
            ("duplicate_score", "duplicate"),
            ("bos_score", "BOS"),
        ]
        lines.append(
            f"{'head':<6}" + "".join(f"{name:>12}" for _, name in cols) + f"{'OV copying':>12}  induction 95% CI"
        )
        for row, cop in zip(self.scores.rows(), self.copying.rows()):
            lo, hi = row["induction_ci"]
            lines.append(
                f"{row['head']:<6}"
                + "".join(f"{row[k]:>12.3f}" for k, _ in cols)
                + f"{cop['copying_score']:>12.3f}  [{lo:.3f}, {hi:.3f}]"
            )
        top = self.composition.top_pairs("K", 5) if L > 1 else []
        if top:
            lines.append(
                f"\ntop K-composition pairs (random baseline {self.composition.baseline_mean:.3f} ± "
                f"{self.composition.baseline_std:.3f}):"
            )
            for r in top:
                lines.append(
                    f"  {r['from']} -> {r['to']}: {r['score']:.3f} "
                    f"({r['ratio_to_baseline']:.1f}x baseline, z = {r['z']:.1f})"
                )
        else:
            lines.append("\nno head composition (one layer)")
        for test in self.causal.values():
            rows = sorted(test.rows(), key=lambda r: -r["drop"])[:4]
            lines.append(f"\ncausal test, sender head {test.removed}; induction score of a later head:")
            for r in rows:
                lines.append(f"  {r['ablated']}: {r['head']} {r['induction_score']:.3f} -> {r['ablated_score']:.3f}")
        return "\n".join(lines)


def analyze(ckpt: Checkpoint) -> InductionAnalysis:
    """Head scores, OV copying, composition, the causal tests on every path, and the test-split metrics."""
    model, task = ckpt.model, ckpt.task
    toks = probe_tokens(task, N_SEQS, device=model_device(model))
    causal = {}
    if model.cfg.n_layers > 1:
        causal = {path: ablation_induction_test(model, toks, layers=[0], path=path) for path in PATHS}
    return InductionAnalysis(
        checkpoint=ckpt.name,
        n_layers=model.cfg.n_layers,
        n_heads=model.cfg.n_heads,
        scores=head_scores(model, toks),
        copying=ov_copying(model),
        composition=composition_scores(model),
        causal=causal,
        metrics=evaluate(model, task, task.dataset("test")),
    )


def add_report_sections(ckpt, report, progress: bool = False) -> None:
    """Head scores, composition, causal test, OV copying, circuits of the key heads and one attention view."""
    model, task = ckpt.model, ckpt.task
    L = model.cfg.n_layers
    toks = probe_tokens(task, N_SEQS, device=model_device(model))
    scores = head_scores(model, toks)
    report.section(
        "Induction and previous-token heads",
        f"Attention scores of every head on {toks.shape[0]} sequences [BOS] R R with len(R) = "
        f"{toks.shape[1] // 2} (R uniform over the task's symbols, repeats inside R allowed). Induction: "
        "attention to the token after an earlier occurrence of the current token. Previous-token: attention "
        "to the position before. Duplicate: attention to earlier copies of the current token. BOS: "
        "attention to position 0. Each is the mean attention mass over the queries that have such a target.",
    )
    report.add_html(scores.table_html())
    report.figure(scores.figure(), caption="The same scores as a heatmap.")

    copying = ov_copying(model)
    report.section(
        "OV circuits: copying",
        "Copying score of each head's full OV circuit W_E W_OV W_U: sum of the real parts of its eigenvalues "
        "over the sum of their absolute values (+1: attending to a token raises that token's logit). Top-1 / "
        "top-5: fraction of tokens whose own logit is the highest / among the five highest in their row.",
    )
    report.table(copying.rows(), formats={"copying_score": ".3f", "top1": ".3f", "top5": ".3f"})

    add_patching_sections(model, task, report, prev=scores.best("prev_token", layer=0))
    if L < 2:
        report.section(
            "Composition",
            "This is a one-layer model: no head reads another head's output, so there is "
            "no Q-, K- or V-composition and no induction head can form.",
        )
        return
    comp = composition_scores(model)
    report.section(
        "Head composition",
        f"Q-, K- and V-composition scores (TransformerLens all_composition_scores) between each earlier and "
        f"each later head. Random matrices of this model's shapes score {comp.baseline_mean:.3f} ± "
        f"{comp.baseline_std:.3f}; only scores well above that mean composition.",
    )
    for mode in MODES:
        report.figure(comp.mode_figure(mode), caption=f"{mode}-composition.")
    report.table(
        comp.top_pairs("K", 5),
        columns=["from", "to", "score", "ratio_to_baseline", "z"],
        formats={"score": ".3f", "ratio_to_baseline": ".1f", "z": ".1f"},
        caption="Top K-composition pairs.",
    )

    report.section(
        "K-composition causal test",
        "Each layer-0 head's output is removed in turn and every later head's induction score is measured "
        "again on the same sequences: first from everything (zero-ablation: its effect on later queries, keys "
        "and values together), then only from the later heads' key input (K-composition proper), query input "
        "and value input. A previous-token head that feeds an induction head through K-composition collapses "
        "that head's score when removed from the key input.",
    )
    for path in PATHS:
        test = ablation_induction_test(model, toks, layers=[0], path=path)
        report.figure(test.figure())
        report.table(
            sorted(test.rows(), key=lambda r: -r["drop"])[:4],
            formats={"induction_score": ".3f", "ablated_score": ".3f", "drop": ".3f"},
            caption=f"Sender head {test.removed}: the largest drops.",
        )

    prev = scores.best("prev_token", layer=0)
    ind = scores.best("induction", layer=L - 1)
    report.section(
        "Circuits of the key heads",
        f"{head_label(*prev)} has the highest previous-token score in layer 0 and {head_label(*ind)} the highest "
        f"induction score in layer {L - 1}. Shown: the positional QK circuit of the previous-token head (query "
        f"position by key position; a previous-token head peaks just below the diagonal), the full OV circuit "
        f"of the induction head (a copying head has a bright diagonal), and the K-composition circuit "
        f"W_E W_QK W_OV^T W_E^T through the pair (a diagonal means: attend where the previous token equals the "
        f"current token).",
    )
    try:
        report.figure(
            positional_qk_circuit(model, heads=prev).figure(),
            caption="Entries above the diagonal (key after query) are never used (causal mask) and are left blank.",
        )
    except ConfigError as e:  # no learned positions, or a pooling whose scores are not q·k
        report.text(f"No positional QK circuit: {e}.")
    report.figure(full_ov_circuit(model, heads=ind, vocab=task.vocab).figure())
    try:
        report.figure(k_composition_circuit(model, senders=prev, receivers=ind, vocab=task.vocab).figure())
    except ConfigError as e:
        report.text(f"No K-composition circuit: {e}.")
    view = attention_view(
        model,
        toks[0],
        heads=[prev, ind],
        vocab=task.vocab,
        title=f"{head_label(*prev)} and {head_label(*ind)} on [BOS] R R",
    )
    report.attention(
        view,
        caption="The previous-token head attends one position back; the induction head attends to "
        "the token after the current token's previous occurrence (an offset diagonal in the second half).",
    )


def _where(r: dict) -> str:
    return " ".join(str(r[k]) if k == "head" else f"{k} {r[k]}" for k in ("head", "pos") if k in r)


def add_patching_sections(model: HookedTransformer, task: Task, report, prev=None) -> None:
    """Activation patching (every head x position of ``hook_z``, every position of ``resid_pre``) and, for models
    with a later layer, path patching from the layer-0 heads into each later head's query, key and value
    (``prev``: the previous-token head, named in the caption)."""
    clean, corr = corrupted_pair(task, N_PATCH, kind="key", device=model_device(model))
    n = task.seq_len // 2
    q = int(clean.answer_pos[0])
    z = activation_patching(model, clean, corrupted=corr, metric="logit_diff", where="z")
    resid = activation_patching(model, clean, corrupted=corr, metric="logit_diff", where="resid_pre")
    report.section(
        "Activation patching",
        f"{N_PATCH} pairs of sequences [BOS] R R (len(R) = {n}, no repeats inside R). In the corrupted one the "
        f"query token at position {q} (its earlier occurrence at {q - n}, followed by the answer at "
        f"{q - n + 1}) trades places in the first copy with an earlier token, so the token after its "
        "occurrence, the answer an induction circuit gives, changes; only the previous-token information at "
        "two key positions moved. Metric: logit of the clean answer minus the corrupted answer at position "
        f"{q}: clean {z.clean:.2f}, corrupted {z.corrupted:.2f}. Each head's output (hook_z) at each position, "
        "and the residual stream entering each layer at each position, is patched from the clean run into "
        "the corrupted one (denoising), all patches stacked along the batch axis; 1 = the clean metric, "
        "0 = the corrupted one.",
    )
    if abs(z.clean - z.corrupted) < 1.0:
        report.text(
            f"The corruption barely moves this model's answer (logit difference {z.clean:.2f} clean, "
            f"{z.corrupted:.2f} corrupted): it does not find the token after the query's earlier occurrence "
            "(no induction), so there is nothing for patching to restore; the heatmaps are left out."
        )
        return
    top = z.top(4)
    report.figure(
        z.figure(), caption="Largest effects: " + ", ".join(f"{_where(r)} {r['normalized']:.2f}" for r in top) + "."
    )
    rtop = resid.top(3)
    report.figure(
        resid.figure(),
        caption="Residual stream: "
        + ", ".join(f"layer {r['layer']} position {r['pos']} {r['normalized']:.2f}" for r in rtop)
        + ".",
    )
    if model.cfg.n_layers < 2:
        return
    paths = path_patching(model, clean, corrupted=corr, metric="logit_diff")
    ranked = sorted(paths.rows(), key=lambda r: -abs(r["normalized"]))
    best = [r for r in ranked if abs(r["normalized"]) >= 0.1] or ranked[:1]
    other = {r["input"]: r for r in reversed(ranked)}  # the largest of each input
    report.section(
        "Path patching",
        "Each layer-0 head's clean output (z W_O) patched into one later head's query, key or value input "
        "only (TransformerLens' split Q/K/V inputs), everything else from the corrupted run: the causal "
        "form of Q-, K- and V-composition. The paths that carry the answer: "
        + ", ".join(f"{r['sender']} -> {r['receiver']} {r['input']} {r['normalized']:.2f}" for r in best)
        + (f" ({head_label(*prev)} is the previous-token head by its attention score)" if prev else "")
        + f". Largest query path {abs(other['q']['normalized']):.2f}, largest value path "
        f"{abs(other['v']['normalized']):.2f}, largest key path {abs(other['k']['normalized']):.2f} (absolute).",
    )
    report.result(paths)


def _hypotheses(task):
    """The task's hypotheses (``interp hypothesis``), imported when asked for."""
    from .hypotheses import hypotheses

    return hypotheses(task)


SUITE = FunctionSuite(
    "repeated-tokens",
    analyze,
    add_report_sections,
    typed_fn=inputs.typed_example,
    corruptions_fn=inputs.corruptions,
    probes_fn=inputs.probes,
    hypotheses_fn=_hypotheses,
)
