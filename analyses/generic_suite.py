"""The generic suite every task has: what ``interp analyze``, ``interp report`` and the explorer give for a task
whose registration names no suite of its own (a user's task, before any analysis is written for it).

- ``analyze``: the task's metrics on every split, each head's learned accuracy alone (the other heads
  zero-ablated; Fraknói 2024, Definition 5.1) on the held-out split, and the induction / previous-token / duplicate /
  BOS scores of every head (Olsson et al., "In-context Learning and Induction Heads") on repeated random tokens
  where the context holds a repeat;
- ``add_report_sections``: the same as tables and figures (the report adds the model card, the attention spectrum
  and the attention views of every task itself);
- the explorer's hooks: typed input as vocabulary tokens with the answer the last token, no corruptions of its own
  (the explorer's ``resample`` and ``typed`` serve every task), and no probe sequences of its own (the explorer
  then scores heads on :func:`random_repeat_probes`, as ``analyze`` does).

It names no task.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

import torch

from interp.evaluation import evaluate_splits
from interp.heads import all_heads, head_label
from interp.results import Result, jsonable
from interp.suite import FunctionSuite
from interp.visualize import aligned, heatmap, render_table

from .learned_accuracies import learned_accuracy
from .pattern_scores import SCORES, head_scores, repeated_random_tokens

if TYPE_CHECKING:
    from jaxtyping import Int
    from torch import Tensor

    from interp.checkpoint import Checkpoint
    from interp.report_page import Report
    from interp.task import Vocab

N_EXAMPLES = 1000  # examples of the held-out split each head's learned accuracy is measured on
PROBE_SEQS = 32  # repeated-random-token sequences of the head scores
PROBE_REPEAT = 32  # the longest repeated segment R of a probe sequence [BOS] R R
MIN_CONTEXT = 9  # the shortest context whose probes hold a repeat worth scoring ([BOS] and R of 4, twice)


def random_repeat_probes(vocab: Vocab, n_ctx: int) -> tuple[Int[Tensor, "batch pos"] | None, str]:
    """The sequences every task's heads can be scored on (Olsson et al.): ``PROBE_SEQS`` of ``[BOS] R R`` with R
    drawn from the task's output tokens (outside the task's own distribution), as long as a context of ``n_ctx``
    tokens allows; with what they are in words. None where the context is too short for a repeat."""
    if n_ctx < MIN_CONTEXT:
        return None, f"not defined here: a context of {n_ctx} tokens holds no repeat"
    rep = min((n_ctx - 1) // 2, PROBE_REPEAT)
    tokens = repeated_random_tokens(PROBE_SEQS, rep, vocab.n_out, bos=vocab.bos, seed=0)
    return tokens, (
        f"{PROBE_SEQS} sequences [BOS] R R of random output tokens, len(R) = {rep} (outside the task's distribution)"
    )


@dataclass(eq=False)
class TaskSummary(Result):
    """What the generic suite's ``interp analyze`` gives: the task's metrics per split, each head's learned accuracy
    alone (and all heads') on the first ``n_examples`` of ``split``, and every head's pattern scores (``scores``:
    one row per head, None where not defined, ``scores_on`` saying why or on what)."""

    checkpoint: str
    task: str
    n_layers: int
    n_heads: int
    metrics: dict[str, dict[str, float]]
    split: str
    n_examples: int
    ablation: str
    learned_alone: list[float]  # per head, layer by layer
    all_heads: float
    scores: list[dict[str, Any]] | None
    scores_on: str

    @property
    def heads(self) -> list[str]:
        return [head_label(l, h) for l, h in all_heads(self.n_layers, self.n_heads)]

    def rows(self) -> list[dict[str, Any]]:
        """One row per head: its name, its learned accuracy alone and its pattern scores (where defined)."""
        rows = []
        for i, (name, acc) in enumerate(zip(self.heads, self.learned_alone)):
            row = {"head": name, "learned_alone": acc}
            if self.scores is not None:
                row.update({f"{s}_score": self.scores[i][f"{s}_score"] for s in SCORES})
            rows.append(row)
        return rows

    def to_dict(self) -> dict:
        return jsonable({"suite": "generic", **asdict(self)})

    @classmethod
    def from_dict(cls, d: dict) -> TaskSummary:
        return cls(**{k: v for k, v in d.items() if k != "suite"})

    def text(self) -> str:
        L, H = self.n_layers, self.n_heads
        lines = [f"{self.checkpoint} ({self.task}, {L} layer{'s' * (L != 1)} x {H} heads per layer; generic suite)"]
        keys = list(next(iter(self.metrics.values())).keys()) if self.metrics else []
        lines.append(aligned(["split", *keys], [[s, *(f"{m[k]:.4f}" for k in keys)] for s, m in self.metrics.items()]))
        lines.append(
            f"\neach head alone ({self.ablation}-ablation of the others) on the first {self.n_examples} {self.split} "
            f"examples; all heads {self.all_heads:.4f}; {self.scores_phrase()}:"
        )
        cols = ["head", "alone", *(SCORES if self.scores is not None else ())]
        body = [
            [r["head"], f"{r['learned_alone']:.4f}", *(f"{r[f'{s}_score']:.3f}" for s in cols[2:])] for r in self.rows()
        ]
        lines.append(aligned(cols, body))
        return "\n".join(lines)

    def scores_phrase(self, what: str = "head scores") -> str:
        """``what`` and what the scores were measured on, or, where they are not defined, why (a sentence either
        way: ``scores_on`` is a description of the probes or the reason)."""
        return f"{what} on {self.scores_on}" if self.scores is not None else f"{what}: {self.scores_on}"

    def figure(self):
        """Each head's learned accuracy alone, layer by head."""
        z = torch.tensor(self.learned_alone).view(self.n_layers, self.n_heads)
        return heatmap(
            z,
            [f"H{h}" for h in range(self.n_heads)],
            [f"L{l}" for l in range(self.n_layers)],
            title=f"Learned accuracy of each head alone ({self.split}, {self.n_examples} examples)",
            colorscale="Blues",
            zmid=None,
            zmin=0,
            zmax=1,
            text_fmt=".2f" if self.n_heads <= 32 else None,
        )

    def table_html(self) -> str:
        rows = self.rows()
        return render_table(
            rows,
            list(rows[0]) if rows else ["head"],
            formats={k: ".3f" for k in (rows[0] if rows else {}) if k != "head"},
            caption=f"Per head: learned accuracy alone ({self.split}), {self.scores_phrase('pattern scores')}",
        )


def analyze(ckpt: Checkpoint) -> TaskSummary:
    """The task's metrics on every split, each head's learned accuracy alone on the held-out split, and the heads'
    pattern scores on repeated random tokens (where the context holds a repeat)."""
    model, task = ckpt.model, ckpt.task
    cfg = model.cfg
    split = task.splits[-1]
    data = task.dataset(split)
    data = data.select(slice(0, min(N_EXAMPLES, len(data))))
    heads = all_heads(cfg.n_layers, cfg.n_heads)
    acc = learned_accuracy(model, data, heads=[[h] for h in heads] + [heads], task=task).accuracy.tolist()
    probes, scores_on = random_repeat_probes(task.vocab, cfg.n_ctx)
    scores = None if probes is None else head_scores(model, probes).rows()
    return TaskSummary(
        checkpoint=ckpt.name,
        task=task.name,
        n_layers=cfg.n_layers,
        n_heads=cfg.n_heads,
        metrics=evaluate_splits(model, task),
        split=split,
        n_examples=len(data),
        ablation="zero",
        learned_alone=acc[:-1],
        all_heads=acc[-1],
        scores=scores,
        scores_on=scores_on,
    )


def add_report_sections(ckpt: Checkpoint, report: Report, progress: bool = False) -> None:
    """Each head alone (learned accuracy) and the heads' pattern scores, as tables and figures."""
    summary = analyze(ckpt)
    report.section(
        "Heads alone",
        f"This task registered no analysis suite of its own, so the report shows what every task has (the generic "
        f"suite). Learned accuracy of each head alone (Fraknói 2024, Definition 5.1): the task's answer accuracy on "
        f"the first {summary.n_examples} {summary.split} examples with every other head's output zeroed; all heads "
        f"together: {summary.all_heads:.4f}.",
    )
    report.figure(summary.figure())
    report.section(
        "Head scores",
        "Induction, previous-token, duplicate-token and BOS attention of every head (Olsson et al., In-context "
        "Learning and Induction Heads)"
        + (f", measured on {summary.scores_on}." if summary.scores is not None else f": {summary.scores_on}."),
    )
    report.add_html(summary.table_html())


# typed input, corruptions and probes: FunctionSuite's defaults (interp.typed_input.answer_last_example, none, none)
SUITE = FunctionSuite("generic", analyze, add_report_sections)
