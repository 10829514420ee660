"""Analysis suite of the ``integer-addition`` task (``interp analyze`` / ``interp report``): accuracy by carry
case and Quirke class on random sums and on the rare-cascade set, accuracy by operand length (including lengths
longer than any in training, as far as the model's context allows), per-component ablation per answer digit and
carry case, and the attention of a carry cascade (``10**n - 1 + 1``)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch

from interp.checkpoint import Checkpoint
from interp.device import model_device
from interp.evaluation import evaluate
from interp.results import Result, jsonable
from interp.suite import FunctionSuite
from interp.tasks.integer_addition import make_sums, seq_len
from interp.visualize import attention_view

from . import inputs
from .ablation import DigitAblation, component_ablation
from .accuracy import CaseAccuracy, LengthAccuracy, accuracy_by_case, accuracy_by_length

if TYPE_CHECKING:
    from interp.task import Task

N_LENGTH = 500  # sums per operand length
N_ABLATION = 500  # sums in the ablation


@dataclass(eq=False)
class AdditionAnalysis(Result):
    """What ``interp analyze`` gives for an addition model."""

    checkpoint: str
    positional: str
    metrics: dict
    test_cases: CaseAccuracy
    cascade_cases: CaseAccuracy
    lengths: LengthAccuracy
    ablation: DigitAblation | None = None
    extra: dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        return jsonable(
            {
                "task": "integer-addition",
                "checkpoint": self.checkpoint,
                "positional": self.positional,
                "metrics": self.metrics,
                "by_case": {"test": self.test_cases.to_dict(), "cascades": self.cascade_cases.to_dict()},
                "by_length": self.lengths.to_dict(),
                "ablation": self.ablation.to_dict() if self.ablation else None,
            }
        )

    @classmethod
    def from_dict(cls, d: dict) -> AdditionAnalysis:
        return cls(
            d["checkpoint"],
            d["positional"],
            d["metrics"],
            CaseAccuracy.from_dict(d["by_case"]["test"]),
            CaseAccuracy.from_dict(d["by_case"]["cascades"]),
            LengthAccuracy.from_dict(d["by_length"]),
            None if d["ablation"] is None else DigitAblation.from_dict(d["ablation"]),
        )

    def figure(self):
        return self.test_cases.figure()

    def text(self) -> str:
        lines = [
            f"{self.checkpoint} (integer-addition, positional {self.positional})",
            "metrics per split: " + "; ".join(f"{s} exact match {m['accuracy']:.4f}" for s, m in self.metrics.items()),
            "\nrandom test sums:",
            self.test_cases.text(),
            "\nrare-cascade sums:",
            self.cascade_cases.text(),
            "\n" + self.lengths.text(),
        ]
        if self.ablation is not None:
            lines += ["\ncomponents whose mean-ablation costs the most:", self.ablation.text()]
        return "\n".join(lines)


def _positional(ckpt) -> str:
    return ckpt.spec.positional if ckpt.spec is not None else ckpt.model.cfg.positional_embedding_type


def _ablation_data(task: Task):
    """Half uniform test sums, half rare-cascade sums, all of the longest test length (so every carry case has
    examples)."""
    parts = []
    for split in ("test", "cascades"):
        data = task.dataset(split)
        n = data.fields["n_digits"]
        parts.append(data.select(n == int(n.max())).select(slice(0, N_ABLATION // 2)))
    a, b = (torch.cat([p.fields[k] for p in parts]) for k in ("a", "b"))
    return make_sums(
        a,
        b,
        torch.cat([p.fields["n_digits"] for p in parts]),
        reverse_answer=task.reverse_answer,
        reverse_operands=task.reverse_operands,
    )


def analyze(ckpt: Checkpoint, ablation: bool = True) -> AdditionAnalysis:
    """Metrics on every split but train, accuracy by case (test and cascades), by length 1 .. the longest that fits
    the model's context, and (``ablation``) the per-component ablation on test sums of the longest test length."""
    model, task = ckpt.model, ckpt.task
    metrics = {s: evaluate(model, task, task.dataset(s)) for s in task.splits if s != "train"}
    longest = max(L for L in range(1, 64) if seq_len(L) <= model.cfg.n_ctx)
    return AdditionAnalysis(
        checkpoint=ckpt.name,
        positional=_positional(ckpt),
        metrics=metrics,
        test_cases=accuracy_by_case(model, task.dataset("test")),
        cascade_cases=accuracy_by_case(model, task.dataset("cascades")),
        lengths=accuracy_by_length(model, task=task, lengths=range(1, longest + 1), n=N_LENGTH),
        ablation=component_ablation(model, _ablation_data(task)) if ablation else None,
    )


def cascade_example(task: Task):
    """The longest carry cascade at the task's test length: ``(10**n - 1) + 1`` (``99999 + 00001`` for n = 5)."""
    n = task.test_range[1]
    return make_sums([10**n - 1], [1], [n], reverse_answer=task.reverse_answer, reverse_operands=task.reverse_operands)


def add_report_sections(ckpt, report, progress: bool = False) -> None:
    """Accuracy by case and by length, the ablation heatmaps and the attention of a carry cascade."""
    res = analyze(ckpt)
    model, task = ckpt.model, ckpt.task
    report.section(
        "Accuracy by carry case",
        "Per answer digit, grouped by what the digit needs: BA (base add, no carry in), UC1 (use the carry made "
        "by the pair below), US9-k (use a carry that rippled through k sum-9 pairs); exact match per Quirke "
        "class S0 (no carry), S1 (carries, no cascade), S(1+k) (longest cascade k); accuracy per place value. "
        "First on uniform random test sums, then on the rare-cascade set.",
    )
    report.result(res.test_cases, caption="Random test sums.")
    report.result(res.cascade_cases, caption="Sums built around a sum-9 cascade.")
    report.section(
        "Length generalisation",
        f"Exact match on {N_LENGTH} random sums per operand length, up to the longest the model's context holds "
        f"(trained on {task.digits[0]}..{task.digits[1]} digits).",
    )
    report.result(res.lengths)
    if res.ablation is not None:
        report.section(
            "Which component computes which digit",
            "Each head (hook_z) and each quarter of each MLP layer's neurons (hook_post) is mean-ablated in turn "
            f"(mean over the sums at each position; {N_ABLATION // 2} random and {N_ABLATION // 2} rare-cascade "
            "sums); the drop in accuracy per answer digit and per carry case.",
        )
        report.figure(res.ablation.figure())
        report.figure(res.ablation.case_figure())
    ex = cascade_example(task).to(model_device(model))
    view = attention_view(model, ex.tokens[0, : int(ex.lengths[0])], vocab=task.vocab, title="a full carry cascade")
    report.attention(
        view,
        caption="Every head on the longest cascade: the carry made by the units pair must reach the "
        "leading answer digit through the sum-9 pairs.",
    )


def _hypotheses(task):
    """The task's hypotheses (``interp hypothesis``), imported when asked for."""
    from .hypotheses import hypotheses

    return hypotheses(task)


SUITE = FunctionSuite(
    "integer-addition",
    analyze,
    add_report_sections,
    typed_fn=inputs.typed_example,
    hypotheses_fn=_hypotheses,
)
