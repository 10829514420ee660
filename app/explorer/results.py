"""What the explorer hands back as results (:class:`interp.results.Result`: ``to_dict()``, a table in Jupyter): the
prediction at the answer positions under the mask, and the whole view."""

from __future__ import annotations

import html
from collections.abc import Sequence
from dataclasses import dataclass, field

from jaxtyping import Float, Int
from torch import Tensor

from interp.results import Result

MAX_ROWS = 64  # answer positions listed at most


@dataclass(eq=False)
class Prediction(Result):
    """The model's output at the input's answer positions under the current mask: per position its target, the top
    tokens and their probabilities, and whether the argmax is the target. ``answer`` is the row of the task's answer
    position (``TaskData.answer_pos``)."""

    positions: list[int]
    targets: list[int | None]
    top_ids: Int[Tensor, "row k"]
    top_probs: Float[Tensor, "row k"]
    logits: Float[Tensor, "row vocab_out"]
    answer_pos: int
    token_names: list[str] = field(repr=False, default_factory=list)

    @property
    def correct(self) -> list[bool | None]:
        """Per row, whether the top token is the target (None where the position has no target)."""
        return [None if t is None else int(self.top_ids[i, 0]) == t for i, t in enumerate(self.targets)]

    @property
    def answer(self) -> dict:
        """The row of the answer position."""
        return self.rows()[self.positions.index(self.answer_pos)]

    def rows(self) -> list[dict]:
        """One plain dict per position: ``pos``, ``answer``, ``target`` and ``top`` (token strings), ``correct``."""
        correct = self.correct
        return [
            {
                "pos": p,
                "answer": p == self.answer_pos,
                "target": None if t is None else self.token_names[t],
                "top": [[self.token_names[int(k)], float(v)] for k, v in zip(self.top_ids[i], self.top_probs[i])],
                "correct": correct[i],
            }
            for i, (p, t) in enumerate(zip(self.positions, self.targets))
        ]

    def to_dict(self) -> dict:
        return {"answer_pos": self.answer_pos, "rows": self.rows()}

    @classmethod
    def from_dict(cls, d: dict) -> Prediction:
        """The prediction ``to_dict`` wrote: its rows (tokens by name, numbered in order of appearance; no logits)."""
        import torch

        rows = d["rows"]
        names = list(
            dict.fromkeys(
                [r["target"] for r in rows if r["target"] is not None] + [t for r in rows for t, _ in r["top"]]
            )
        )
        ids = {n: i for i, n in enumerate(names)}
        return cls(
            positions=[r["pos"] for r in rows],
            targets=[None if r["target"] is None else ids[r["target"]] for r in rows],
            top_ids=torch.tensor([[ids[t] for t, _ in r["top"]] for r in rows], dtype=torch.long),
            top_probs=torch.tensor([[p for _, p in r["top"]] for r in rows], dtype=torch.float32),
            logits=torch.zeros(len(rows), 0),
            answer_pos=d["answer_pos"],
            token_names=names,
        )

    def text(self) -> str:
        """One line per answer position: target, top tokens and whether the top one is right."""
        lines = []
        for r in self.rows():
            top = ", ".join(f"{t} {p:.3f}" for t, p in r["top"])
            mark = "" if r["correct"] is None else (" right" if r["correct"] else " wrong")
            lines.append(f"{'*' if r['answer'] else ' '} pos {r['pos']}: target {r['target']}, top {top}{mark}")
        return "\n".join(lines)

    def table_html(self) -> str:
        return prediction_table(self.rows())

    def __repr__(self) -> str:
        a = self.answer
        top = ", ".join(f"{t} {p:.3f}" for t, p in a["top"])
        return f"Prediction(answer at {a['pos']}: target {a['target']}, top {top}, correct {a['correct']})"


class ExplorerState(Result):
    """The explorer's view as a result: ``to_dict()`` holds the input, the heads ablated, the prediction, the
    accuracy, the open head panel and the patching, all as plain JSON types; ``table_html()`` a summary."""

    def __init__(self, data: dict):
        self.data = data

    def to_dict(self) -> dict:
        return self.data

    @classmethod
    def from_dict(cls, d: dict) -> ExplorerState:
        return cls(d)

    def text(self) -> str:
        """The model, input, heads off, ablation and accuracy, then the prediction."""
        d = self.data
        acc = d["accuracy"]
        lines = [
            f"model {d['model']}; input {' '.join(d['input']['tokens'])}",
            f"heads off: {', '.join(d['ablated']) or 'none'} ({d['ablation']} ablation); "
            f"accuracy {acc['accuracy']:.4f} ({acc['correct']}/{acc['n']} {acc['split']})",
        ]
        lines += [
            f"  pos {r['pos']}: target {r['target']}, top " + ", ".join(f"{t} {p:.3f}" for t, p in r["top"])
            for r in d["prediction"]["rows"]
        ]
        return "\n".join(lines)

    def table_html(self) -> str:
        d = self.data
        acc = d["accuracy"]
        rows = "".join(
            f"<tr><th style='text-align:left'>{html.escape(k)}</th><td>{html.escape(str(v))}</td></tr>"
            for k, v in (
                ("model", d["model"]),
                ("input", " ".join(d["input"]["tokens"])),
                ("heads off", ", ".join(d["ablated"]) or "none"),
                ("ablation", d["ablation"]),
                ("accuracy", f"{acc['accuracy']:.4f} ({acc['correct']}/{acc['n']} {acc['split']})"),
            )
        )
        return f"<table>{rows}</table>" + prediction_table(d["prediction"]["rows"])


def prediction_table(rows: Sequence[dict]) -> str:
    """The prediction rows (:meth:`Prediction.rows`) as an HTML table, the answer position's row in bold, at most
    ``MAX_ROWS`` of them."""
    head = "<tr><th>pos</th><th>target</th><th>top tokens (probability)</th><th>correct</th></tr>"
    body = []
    for r in rows[:MAX_ROWS]:
        top = ", ".join(f"{html.escape(t)} {p:.3f}" for t, p in r["top"])
        ok = "" if r["correct"] is None else ("yes" if r["correct"] else "no")
        style = " style='font-weight:bold'" if r["answer"] else ""
        body.append(
            f"<tr{style}><td>{r['pos']}</td><td>{html.escape(str(r['target']))}</td><td>{top}</td><td>{ok}</td></tr>"
        )
    more = f"<tr><td colspan='4'>... {len(rows) - MAX_ROWS} more</td></tr>" if len(rows) > MAX_ROWS else ""
    return f"<table class='interp-explorer-prediction'>{head}{''.join(body)}{more}</table>"
