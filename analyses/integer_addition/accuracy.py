"""Accuracy of an addition model by carry case, by answer digit and by operand length.

Correctness is teacher-forced argmax at each answer position (the model sees the right earlier answer digits);
an example is an exact match when all its answer digits are right, which is also exactly when greedy decoding
writes the right answer.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from torch import Tensor

from interp.device import check_device
from interp.errors import TaskError
from interp.evaluation import check_batch_size, predictions_and_loss
from interp.results import Result, jsonable
from interp.task import TaskData, check_model_task
from interp.tasks.integer_addition import case_name, complexity_name, digit_correct, scratchpad_correct

from ..answer_cache import check_model_data
from . import require_task_data

if TYPE_CHECKING:
    from transformer_lens import HookedTransformer

    from interp.task import Task


def correct_digits(
    model: HookedTransformer, data: TaskData, *, batch_size: int | None = None, device: str | None = None
) -> Tensor:
    """``[batch, max n + 1]`` bool: answer digit ``10**i`` predicted right (False beyond an example's answer)."""
    require_task_data(data)
    check_device(model, device)
    check_batch_size(batch_size)
    check_model_data(model, data)
    return _correct(model, data, batch_size)


def _correct(model: HookedTransformer, data: TaskData, batch_size: int | None = None) -> Tensor:
    preds = predictions_and_loss(model, data, batch_size=batch_size)["preds"]
    return digit_correct(preds, data.to(preds.device)).cpu()


def _rate(ok: Tensor) -> dict:
    n = int(ok.numel())
    return {"accuracy": ok.float().mean().item() if n else None, "n": n}


@dataclass(eq=False)
class CaseAccuracy(Result):
    """Accuracy by carry case: per answer digit grouped by the case that digit needs (BA, UC1, US9-k), exact match
    grouped by the example's Quirke class (S0, S1, S2 ...), and accuracy per answer digit (place value)."""

    by_digit_case: dict  # "BA" / "UC1" / "US9-k" -> {"accuracy", "n"}
    by_complexity: dict  # "S0" ... -> {"accuracy" (exact match), "n"}
    by_digit: dict  # "0" (units) ... -> {"accuracy", "n"}
    exact_match: float
    n: int

    def to_dict(self) -> dict:
        return jsonable(
            {
                "exact_match": self.exact_match,
                "n": self.n,
                "by_digit_case": self.by_digit_case,
                "by_complexity": self.by_complexity,
                "by_digit": self.by_digit,
            }
        )

    @classmethod
    def from_dict(cls, d: dict) -> CaseAccuracy:
        return cls(d["by_digit_case"], d["by_complexity"], d["by_digit"], d["exact_match"], d["n"])

    def figure(self):
        from plotly.subplots import make_subplots

        fig = make_subplots(
            rows=1,
            cols=3,
            subplot_titles=("answer digit by carry case", "exact match by class", "answer digit by place value"),
        )
        for col, d in enumerate((self.by_digit_case, self.by_complexity, self.by_digit), start=1):
            keys = list(d)
            fig.add_bar(
                x=keys,
                y=[d[k]["accuracy"] for k in keys],
                text=[f"n={d[k]['n']}" for k in keys],
                showlegend=False,
                row=1,
                col=col,
            )
        fig.update_yaxes(range=[0, 1.02])
        fig.update_layout(height=360, width=1000, template="plotly_white")
        return fig

    def text(self) -> str:
        lines = [f"exact match {self.exact_match:.4f} on {self.n} sums"]
        for title, d in (
            ("answer digit by carry case", self.by_digit_case),
            ("exact match by Quirke class", self.by_complexity),
            ("answer digit by place value (0 = units)", self.by_digit),
        ):
            lines.append(f"{title}: " + ", ".join(f"{k} {v['accuracy']:.4f} (n={v['n']})" for k, v in d.items()))
        return "\n".join(lines)


def accuracy_by_case(
    model: HookedTransformer,
    data: TaskData,
    *,
    correct: Tensor | None = None,
    batch_size: int | None = None,
    device: str | None = None,
) -> CaseAccuracy:
    """Accuracy of ``model`` on ``data`` by carry case, Quirke class and answer digit (``correct``: precomputed
    :func:`correct_digits`)."""
    require_task_data(data)
    ok = correct_digits(model, data, batch_size=batch_size, device=device) if correct is None else correct.cpu()
    case = data.fields["digit_case"][:, : ok.shape[1]].cpu()
    valid = case >= 0
    exact = (ok | ~valid).all(1)
    by_case = {case_name(c): _rate(ok[case == c]) for c in sorted(set(case[valid].tolist()))}
    comp = data.fields["complexity"].cpu()
    by_comp = {complexity_name(c): _rate(exact[comp == c]) for c in sorted(set(comp.tolist()))}
    by_digit = {str(i): _rate(ok[valid[:, i], i]) for i in range(ok.shape[1]) if bool(valid[:, i].any())}
    return CaseAccuracy(by_case, by_comp, by_digit, exact.float().mean().item(), len(data))


@dataclass(eq=False)
class LengthAccuracy(Result):
    """Exact match and per-digit accuracy by operand length (digits), with which lengths were seen in training."""

    lengths: list
    exact_match: list  # None where the model's context cannot hold the sums
    digit_accuracy: list  # per length: accuracy per answer digit (units first)
    n: int  # sums per length
    trained: tuple  # the training digit range

    def to_dict(self) -> dict:
        return jsonable(
            {
                "n_per_length": self.n,
                "train_digits": list(self.trained),
                "by_length": {
                    str(L): {
                        "exact_match": e,
                        "digit_accuracy": d,
                        "in_training": self.trained[0] <= L <= self.trained[1],
                    }
                    for L, e, d in zip(self.lengths, self.exact_match, self.digit_accuracy)
                },
            }
        )

    @classmethod
    def from_dict(cls, d: dict) -> LengthAccuracy:
        rows = d["by_length"]
        return cls(
            [int(L) for L in rows],
            [r["exact_match"] for r in rows.values()],
            [r["digit_accuracy"] for r in rows.values()],
            d["n_per_length"],
            tuple(d["train_digits"]),
        )

    def figure(self):
        import plotly.graph_objects as go

        fig = go.Figure(go.Scatter(x=self.lengths, y=self.exact_match, mode="lines+markers", name="exact match"))
        fig.add_vrect(
            x0=self.trained[0] - 0.5,
            x1=self.trained[1] + 0.5,
            fillcolor="green",
            opacity=0.08,
            line_width=0,
            annotation_text="training lengths",
        )
        fig.update_layout(
            xaxis_title="operand digits",
            yaxis_title="exact match",
            yaxis_range=[0, 1.02],
            template="plotly_white",
            height=360,
            width=560,
        )
        return fig

    def text(self) -> str:
        cells = [f"{L}:{'n/a' if e is None else format(e, '.4f')}" for L, e in zip(self.lengths, self.exact_match)]
        return (
            f"exact match by operand digits (trained on {self.trained[0]}..{self.trained[1]}; {self.n} sums each): "
            + " ".join(cells)
        )


def accuracy_by_length(
    model: HookedTransformer,
    *,
    task: Task,
    lengths,
    n: int = 1000,
    seed: int = 0,
    batch_size: int | None = None,
    device: str | None = None,
) -> LengthAccuracy:
    """Exact match on ``n`` uniform random sums of each operand length in ``lengths`` (the same test sets for every
    model of the same task parameters and seed; with a scratchpad every written step must be right too, as in the
    task's ``accuracy``); lengths whose sums do not fit the model's context give None."""
    from interp.tasks import get_task

    check_device(model, device)
    check_batch_size(batch_size)
    check_model_task(model, task)
    lengths = [int(L) for L in lengths]
    if not lengths or min(lengths) < 1:
        raise TaskError(f"lengths must be positive digit counts, got {lengths}")
    params = task.params()
    exact, digits = [], []
    for L in lengths:
        if task.sentence_length(L) > model.cfg.n_ctx:
            exact.append(None)
            digits.append(None)
            continue
        t = get_task(
            task.name, **{**params, "test_digits": [L, L], "test_size": n, "max_digits": max(L, params["max_digits"])}
        )
        data = t.dataset("test", seed)
        preds = predictions_and_loss(model, data, batch_size=batch_size)["preds"]
        ok = digit_correct(preds, data.to(preds.device)).cpu()
        steps = scratchpad_correct(preds, data.to(preds.device))  # a scratchpad's steps count too, as in the metrics
        whole = ok.all(1) if steps is None else ok.all(1) & steps.cpu()
        exact.append(whole.float().mean().item())
        digits.append(ok.float().mean(0).tolist())
    return LengthAccuracy(lengths, exact, digits, n, tuple(task.digits))
