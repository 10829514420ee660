"""The noisy-majority suite (seed 000 §5.4): what ``interp analyze`` prints and ``interp report`` draws.

``analyze`` uses the task's full train split (separators are fitted there) and test split (everything is
scored there). The report sections subsample where the work is repeated per setting (Figure 8) and say so.
"""

from __future__ import annotations

import math
import time

import torch

from analyses.answer_cache import cache_answer
from analyses.attention_ratios import ratio_figure
from analyses.head_outputs import head_outputs
from analyses.head_summary import HeadSummary, head_summary
from analyses.interventions import attention_intervention_sweep

REPORT_TRAIN, REPORT_TEST = 2000, 500  # Figure 8 in the report: subsample sizes


def _summary(ckpt, train_size: int | None = None, test_size: int | None = None):
    model, task = ckpt.model, ckpt.task
    train, test = task.dataset("train"), task.dataset("test")
    if train_size is not None and train_size < len(train):
        train = train.select(slice(0, train_size))
    if test_size is not None and test_size < len(test):
        test = test.select(slice(0, test_size))
    tr = cache_answer(model, train, attention=False)
    te = cache_answer(model, test, attention=True)
    return head_summary(model, tr, te, test_data=test), train, test, tr, te


def _finite(x):
    """JSON-safe numbers: NaN and infinities become None."""
    if isinstance(x, float) and not math.isfinite(x):
        return None
    if isinstance(x, dict):
        return {k: _finite(v) for k, v in x.items()}
    if isinstance(x, list):
        return [_finite(v) for v in x]
    return x


def analyze(ckpt, device=None) -> dict:
    """The head table and the pair tables as one JSON-serialisable object."""
    if device is not None and str(next(ckpt.model.parameters()).device) != str(device):
        from interp.device import pick_device

        ckpt.model.to(pick_device(device), print_details=False)
    t0 = time.perf_counter()
    s, *_ = _summary(ckpt)
    return _finite({
        "task": ckpt.task.name, "checkpoint": str(ckpt.path), "n_train": s.n_train, "n_test": s.n_test,
        "accuracy": s.model_accuracy, "direct_path_accuracy": s.direct_accuracy, "chance": s.chance,
        "thresholds": s.thresholds, "heads": s.rows,
        "pairs": {"heads": s.learned_pairs.heads, "learned_accuracy": s.learned_pairs.values.tolist(),
                  "separation_accuracy": s.separation_pairs.values.tolist()},
        "seconds": round(time.perf_counter() - t0, 2),
    })


def format_summary(summary: dict) -> str:
    """The head table as text, then the best pairs."""
    rows = [{k: (float("nan") if v is None else v) for k, v in r.items()} for r in summary["heads"]]
    s = HeadSummary(rows, summary["accuracy"], summary["direct_path_accuracy"], summary["chance"],
                    summary["n_train"], summary["n_test"])
    lines = [f"{summary['checkpoint']} ({summary['task']}): accuracy {s.model_accuracy:.4f} with all heads, "
             f"{s.direct_accuracy:.4f} with none (direct path); separators fitted on {s.n_train} train, "
             f"scored on {s.n_test} test sequences (chance {s.chance:.3f})", "", s.table(), ""]
    heads = summary["pairs"]["heads"]
    for key, name in (("learned_accuracy", "learned"), ("separation_accuracy", "separation")):
        m = summary["pairs"][key]
        pairs = sorted(((m[i][j], heads[i], heads[j]) for i in range(len(heads)) for j in range(i + 1, len(heads))
                        if m[i][j] is not None), reverse=True)[:5]
        lines.append(f"best pairs by {name} accuracy: " + ", ".join(f"{a}+{b} {v:.3f}" for v, a, b in pairs))
    return "\n".join(lines)


def add_report_sections(ckpt, report, progress: bool = False) -> None:
    """Head table and Figures 4, 5, 7, 6 and 8 (the report itself adds every head's attention view)."""
    model = ckpt.model
    t0 = time.perf_counter()
    s, train, test, tr, te = _summary(ckpt)
    secs = time.perf_counter() - t0
    report.section("Heads: learned and separation accuracy",
                   "Seed 000 §5.4. Learned accuracy: the model's test accuracy when every other head is zeroed "
                   "(Definition 5.1). Separation accuracy: test accuracy of a linear SVC (C=1000) fitted on the train "
                   "split to the head's output at '=' (Definition 5.2), with its ROC AUC. w01 and w02: how much more "
                   "the '=' query attends to a 0 than to a 1 or a 2 (geometric mean over test sequences of the per-token "
                   "attention ratio). Verdict thresholds: good if separation accuracy >= 0.95, partial if >= 0.70, else bad.")
    report.text(f"All heads: test accuracy {s.model_accuracy:.4f}. No heads (direct path only): {s.direct_accuracy:.4f}. "
                f"Chance (commonest answer): {s.chance:.3f}. Computed on {s.n_train} train and {s.n_test} test sequences "
                f"in {secs:.1f} s.")
    report.table(s.rows, columns=["head", "learned_accuracy", "separation_accuracy", "roc_auc", "w01", "w02", "verdict"],
                 caption="Per-head summary", formats={"learned_accuracy": ".3f", "separation_accuracy": ".3f",
                                                      "roc_auc": ".3f", "w01": ".3g", "w02": ".3g"})
    report.section("Head pairs", "Figure 4: separation accuracy of a linear SVC on the outputs of each pair of heads "
                   "(singles on the diagonal; heads sorted by it). Figure 5: learned accuracy of each pair (all other "
                   "heads zeroed). Two heads that are bad alone can be good together.")
    report.figure(s.separation_pairs.figure(), caption="Separation accuracy of every pair of heads (Figure 4).")
    report.figure(s.learned_pairs.figure(), caption="Learned accuracy of every pair of heads (Figure 5).")

    report.section("Attention ratios", "Figure 7: w01 against w02 per head (log axes), coloured by separation accuracy. "
                   "The seed finds good heads near w01 = 1 with w02 >> 1: they weigh 0s and 1s alike and ignore 2s.")
    names = [r["head"] for r in s.rows]
    report.figure(ratio_figure([r["w01"] for r in s.rows], [r["w02"] for r in s.rows], names,
                               torch.tensor([r["separation_accuracy"] for r in s.rows])),
                  caption="Measured on the test split; in this one-layer model without positional embedding they equal "
                          "the exact values from the QK circuit.")

    order = sorted(range(len(s.rows)), key=lambda i: s.rows[i]["separation_accuracy"], reverse=True)
    best, worst = names[order[0]], names[order[-1]]
    report.section("Head outputs", f"Figure 6: the outputs at '=' of the best head ({best}) and the worst ({worst}) "
                   "by separation accuracy, coloured by the right answer, with their value vectors for 0, 1 and 2.")
    if model.cfg.d_head == 2:
        for name in (best, worst):
            report.figure(head_outputs(model, te, name).figure(max_points=600),
                          caption=f"Head {name}: 600 test sequences.")
    else:
        report.text(f"Not drawn: the scatter needs d_head = 2 and this model has d_head = {model.cfg.d_head}.")

    report.section("Attention interventions",
                   "Figure 8: the '=' query's attention of every head set by hand, then the separation accuracy of each "
                   "head's output, averaged over heads. Left: 2s ignored (w02 = inf), w01 varied. Right: w01 = 1, w02 "
                   f"varied. Subsampled to keep the report fast: the first {REPORT_TRAIN} train and {REPORT_TEST} test "
                   "sequences.")
    sweep = attention_intervention_sweep(model, train.select(slice(0, REPORT_TRAIN)), test.select(slice(0, REPORT_TEST)))
    report.figure(sweep.figure(), caption="Mean separation accuracy over heads under hand-set attention.")
    report.table([{"w01": w, "mean separation accuracy": a} for w, a in zip(sweep.w01_values, sweep.w01_mean.tolist())],
                 caption="w02 = inf", formats={"w01": ".3g", "mean separation accuracy": ".3f"})
    report.table([{"w02": ("inf" if math.isinf(w) else f"{w:g}"), "mean separation accuracy": a}
                  for w, a in zip(sweep.w02_values, sweep.w02_mean.tolist())],
                 caption="w01 = 1", formats={"mean separation accuracy": ".3f"})
