"""Table 1 statistics over a population of runs (a sweep's rows, :func:`interp.sweep_directory.load_results`).

Per configuration and halving strategy: the share of runs that reach 100% (and 98%) test accuracy, with Wilson
95% intervals, and the mean, as Table 1 of Fraknói 2024 (*Solving Mathematical Problems with Transformers*, MSc
thesis, ELTE) reports them; a halving run that does not end with one head scores 0, as there.

Whether a halving strategy differs from the normal runs of the same configuration (the thesis's question: does
halving make small models learn the task more often?) is :func:`strategy_differences`: the difference of the two
shares with Newcombe's hybrid score interval (Newcombe, *Interval estimation for the difference between
independent proportions: comparison of eleven methods*, Statistics in Medicine 1998, method 10), built from the
two Wilson intervals, so it behaves at 0 and 100% as they do.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from typing import Any

from interp.errors import ConfigError, InterpError
from interp.sweep_directory import config_columns_all, plain, results_frame
from interp.thresholds import reaches
from interp.visualize import aligned


def wilson_interval(successes: int, n: int, z: float = 1.959963984540054) -> tuple[float, float]:
    """The Wilson score interval of a proportion (95% by default): sensible at 0 and n successes, unlike the
    normal approximation."""
    if n == 0:
        return (math.nan, math.nan)
    p = successes / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return (0.0 if successes == 0 else max(0.0, centre - half), 1.0 if successes == n else min(1.0, centre + half))


def newcombe_interval(
    successes_a: int, n_a: int, successes_b: int, n_b: int, z: float = 1.959963984540054
) -> tuple[float, float]:
    """The 95% interval of the difference of two independent proportions ``a - b`` (Newcombe 1998, method 10: the
    hybrid score interval from the two Wilson intervals). An interval that excludes 0 is a difference the runs
    show; one that contains it is not."""
    if n_a == 0 or n_b == 0:
        return (math.nan, math.nan)
    pa, pb = successes_a / n_a, successes_b / n_b
    (la, ua), (lb, ub) = wilson_interval(successes_a, n_a, z), wilson_interval(successes_b, n_b, z)
    d = pa - pb
    return (d - math.sqrt((pa - la) ** 2 + (ub - pb) ** 2), d + math.sqrt((ua - pa) ** 2 + (pb - lb) ** 2))


def scores(frame, split: str = "test", metric: str = "accuracy"):
    """Each run's ``split`` ``metric`` (a column ``<split>_<metric>``), 0 for a halving run that did not end with one
    head (Fraknói 2024, §5.5)."""
    acc = frame[f"{split}_{metric}"].astype(float)
    if "halving_success" in frame:
        acc = acc.where(frame["halving_success"].map(lambda v: v is not False), 0.0)
    return acc


def split_examples(frame, split: str = "test"):
    """Each run's number of ``split`` examples: the row's own ``<split>_examples`` (rows record it since thresholds
    are counted), else the size of the split of the task the row names, rebuilt through the task registry (once per
    task and parameters); None where neither is known."""
    import pandas as pd

    from interp.registry import get_task

    column = f"{split}_examples"
    n = len(frame)
    own = frame[column].tolist() if column in frame else [None] * n
    tasks = frame["task"].tolist() if "task" in frame else [None] * n
    params = frame["task_params"].tolist() if "task_params" in frame else [None] * n
    sizes: dict[str, int | None] = {}

    def size(value, task, task_params) -> int | None:
        value = plain(value)
        if value is not None:
            return int(value)
        task = plain(task)
        if task is None:
            return None
        text = task_params if isinstance(task_params, str) else json.dumps(task_params or {}, sort_keys=True)
        key = f"{task}|{text}"
        if key not in sizes:
            try:
                sizes[key] = len(get_task(task, **json.loads(text)).dataset(split))
            except InterpError:  # a task no longer registered, or a split it does not have
                sizes[key] = None
        return sizes[key]

    return pd.Series([size(*v) for v in zip(own, tasks, params)], index=frame.index, dtype=object)


def reached(frame, split: str = "test", threshold: float = 1.0, metric: str = "accuracy", count: str | None = None):
    """Whether each run's ``split`` ``metric`` reaches ``threshold``, decided on counts of correct examples
    (:func:`interp.thresholds.reaches`: 977 right of 1,000 reaches 0.977); a halving run that did not end with one
    head does not (it scores 0). The examples behind the accuracy are the split's (:func:`split_examples`); those
    behind another metric are the column ``<split>_<count>`` where ``count`` names it, else unknown (the values
    are then compared in float32, the precision they were computed in)."""
    import pandas as pd

    score = scores(frame, split, metric).tolist()
    if metric == "accuracy":
        examples = split_examples(frame, split).tolist()
    elif count is not None:
        examples = [plain(v) for v in frame[f"{split}_{count}"].tolist()]
    else:
        examples = [None] * len(score)
    return pd.Series([reaches(a, threshold, n) for a, n in zip(score, examples)], index=frame.index, dtype=bool)


def config_columns(frame, always: Sequence[str] = ("d_model", "n_heads", "strategy")) -> tuple[list[str], list[str]]:
    """(every configuration column present: the grouping; the ones shown: ``always`` and those that vary)."""
    keys = [c for c in config_columns_all() if c in frame.columns]
    shown = [c for c in keys if c in always or frame[c].map(lambda v: json.dumps(plain(v))).nunique() > 1]
    return keys, shown


def groups(frame, keys: Sequence[str]) -> list[tuple[dict[str, Any], Any]]:
    """``[(configuration, sub-frame)]`` in first-seen order (None and NaN group together)."""
    seen: dict[str, list] = {}
    columns = [frame[k].tolist() for k in keys]
    for i, values in zip(frame.index, zip(*columns) if columns else [()] * len(frame)):
        key = json.dumps([plain(v) for v in values], default=str)
        seen.setdefault(key, []).append(i)
    return [({k: plain(frame.loc[idx[0], k]) for k in keys}, frame.loc[idx]) for idx in seen.values()]


def population_table(
    rows,
    *,
    split: str = "test",
    thresholds: Sequence[float] = (1.0, 0.98),
    metric: str = "accuracy",
    count: str | None = None,
) -> list[dict[str, Any]]:
    """Table 1 of Fraknói 2024, per configuration and halving strategy: ``runs``; for each threshold t the share of runs
    whose ``split`` accuracy reaches t (``share_test_at_1``, ``share_test_at_0.98``; a failed halving run scores 0)
    with its 95% Wilson interval (``..._low``, ``..._high``); and the mean accuracy. ``rows``: results.jsonl rows or
    a :func:`load_results` frame. The configuration columns shown are d_model, n_heads, strategy and any other that
    varies in the sweep (runs are grouped by all of them).

    ``metric`` scores another of the task's metrics (the column ``<split>_<metric>``, e.g. integer addition's
    ``accuracy_len4``; the keys then name it: ``share_test_accuracy_len4_at_1``, ``mean_test_accuracy_len4``).
    ``count``, the metric holding the number of examples each run's value is a share of (e.g. ``n_len4``), adds the
    value pooled over the runs' examples (``pooled_<split>_<metric>``: correct examples over all examples) with its
    Wilson interval; that interval counts the examples as independent, so it leaves out the variation between
    runs, which the shares of runs and the mean show."""
    import pandas as pd

    frame = rows if isinstance(rows, pd.DataFrame) else results_frame(rows)
    if frame.empty:
        return []
    keys, shown = config_columns(frame)
    score = scores(frame, split, metric)
    name = split if metric == "accuracy" else f"{split}_{metric}"
    hit = {t: reached(frame, split, t, metric, count) for t in thresholds}
    table = []
    for config, members in groups(frame, keys):
        acc = score.loc[members.index]
        entry = {k: config[k] for k in shown}
        entry["runs"] = len(acc)
        for t in thresholds:
            hits = int(hit[t].loc[members.index].sum())
            lo, hi = wilson_interval(hits, len(acc))
            entry.update(
                {
                    f"share_{name}_at_{t:g}": hits / len(acc),
                    f"share_{name}_at_{t:g}_low": lo,
                    f"share_{name}_at_{t:g}_high": hi,
                }
            )
        entry[f"mean_{split}_{metric}"] = float(acc.mean())
        if count is not None:
            n = frame.loc[members.index, f"{split}_{count}"].astype(float)
            total = round(float(n.sum()))
            right = round(float((acc * n).sum()))
            lo, hi = wilson_interval(right, total)
            entry.update(
                {
                    f"pooled_{split}_{metric}": right / total if total else math.nan,
                    f"pooled_{split}_{metric}_low": lo,
                    f"pooled_{split}_{metric}_high": hi,
                    f"{split}_{count}": total,
                }
            )
        table.append(entry)
    return table


def strategy_differences(
    rows, *, split: str = "test", threshold: float = 1.0, baseline: str = "normal"
) -> list[dict[str, Any]]:
    """Each halving strategy against the ``baseline`` runs (the normal runs) of the same configuration:
    :func:`config_differences` with ``key="strategy"`` (``interp table --compare``)."""
    return config_differences(rows, key="strategy", split=split, threshold=threshold, baseline=baseline)


def config_differences(
    rows, *, key: str = "strategy", split: str = "test", threshold: float = 1.0, baseline: Any = None
) -> list[dict[str, Any]]:
    """Each cell of the table against the cell that differs from it only in ``key`` (a configuration column: the
    halving ``strategy``, ``attention``, ``qkv``, ``d_model``, ...) and has ``key == baseline``: both shares of runs
    whose ``split`` accuracy reaches ``threshold`` (counted as in the table; a failed halving run scores 0), the
    difference ``cell - baseline`` and its 95% interval (:func:`newcombe_interval`), and ``differs``: whether the
    interval excludes 0. ``baseline`` defaults to ``normal`` for the strategy, else to the option's default where
    the table has runs of it (``softmax``, ``full``, ...), else to the first value in the table. The two cells are
    treated as independent samples, as the thesis's comparison of its Table 1 cells does; runs of a sweep that share a
    seed start alike (initialisation, data order), a pairing this interval does not use."""
    import pandas as pd

    from interp.sweep_directory import grid_options

    frame = rows if isinstance(rows, pd.DataFrame) else results_frame(rows)
    if frame.empty:
        return []
    keys, shown = config_columns(frame)
    if key not in keys:
        raise ConfigError(
            f"cannot compare by {key!r}: not a configuration column of the table; expected one of {', '.join(keys)}"
        )
    values = [plain(v) for v in frame[key]]
    if baseline is None:
        default = "normal" if key == "strategy" else getattr(grid_options().get(key), "default", None)
        baseline = default if default in values else values[0]
    hit = reached(frame, split, threshold)
    cells: dict[str, dict[str, tuple]] = {}
    for config, members in groups(frame, keys):
        rest = json.dumps([config[k] for k in keys if k != key], default=str)
        value = json.dumps(config[key], default=str)
        cells.setdefault(rest, {})[value] = (config, int(hit.loc[members.index].sum()), len(members))
    base = json.dumps(baseline, default=str)
    shown = [k for k in shown if k != key] + [key]
    out = []
    for by_value in cells.values():
        if base not in by_value:
            continue
        _, hits_b, n_b = by_value[base]
        for value, (config, hits, n) in by_value.items():
            if value == base:
                continue
            lo, hi = newcombe_interval(hits, n, hits_b, n_b)
            entry = {k: config[k] for k in shown}
            entry.update(
                {
                    "baseline": baseline,
                    "runs": n,
                    "baseline_runs": n_b,
                    "share": hits / n,
                    "baseline_share": hits_b / n_b,
                    "difference": hits / n - hits_b / n_b,
                    "difference_low": lo,
                    "difference_high": hi,
                    "differs": bool(lo > 0 or hi < 0),
                }
            )
            out.append(entry)
    return out


def format_differences(differences: Sequence[dict[str, Any]], baseline: Any = "normal") -> str:
    """:func:`config_differences` as aligned text, e.g. ``+0.10 [-0.03, +0.22]`` (``baseline``: the value the cells
    are compared with, where no difference says it)."""
    if differences:
        baseline = differences[0].get("baseline", baseline)
    if not differences:
        return f"(no cell with a {baseline} cell of the same configuration to compare with)"
    skip = {"baseline", "runs", "baseline_runs", "share", "baseline_share", "difference", "difference_low"}
    skip |= {"difference_high"}
    columns = [k for k in differences[0] if k not in skip and k != "differs"]
    params = _varying_task_params(differences)
    cells = [
        [
            *(params(d[k]) if k == "task_params" else str(d[k]) for k in columns),
            f"{d['share']:.2f} ({d['runs']})",
            f"{d['baseline_share']:.2f} ({d['baseline_runs']})",
            f"{d['difference']:+.3f} [{d['difference_low']:+.3f}, {d['difference_high']:+.3f}]",
            "yes" if d["differs"] else "no",
        ]
        for d in differences
    ]
    return aligned([*columns, "share (runs)", f"{baseline} (runs)", f"minus {baseline}, 95%", "differs"], cells)


def format_table(table: Sequence[dict[str, Any]]) -> str:
    """The table as aligned text: each share with its interval, e.g. ``0.34 [0.25, 0.44]``."""
    if not table:
        return "(no runs)"
    cells, columns = [], []
    for k in table[0]:
        if k.endswith(("_low", "_high")):
            continue
        columns.append(k)
    params = _varying_task_params(table)
    for r in table:
        row = []
        for k in columns:
            v = r[k]
            if k == "task_params":
                row.append(params(v))
            elif k.startswith("share_"):
                row.append(f"{v:.2f} [{r[k + '_low']:.2f}, {r[k + '_high']:.2f}]")
            elif k.startswith("pooled_"):
                row.append(f"{v:.3f} [{r[k + '_low']:.3f}, {r[k + '_high']:.3f}]")
            elif isinstance(v, float):
                row.append(f"{v:.4f}" if k.startswith("mean_") else f"{v:g}")
            else:
                row.append(str(v))
        cells.append(row)
    heads = [k.replace("share_", "").replace("_at_", " >= ") if k.startswith("share_") else k for k in columns]
    return aligned(heads, cells)


def _varying_task_params(table: Sequence[dict[str, Any]]):
    """``cell(task_params JSON) -> text`` naming only the task parameters that differ between the table's rows (all
    of them would be a few hundred characters per row), e.g. ``test_size=1500``."""
    if not table or "task_params" not in table[0]:
        return str
    dicts = [json.loads(r["task_params"]) if isinstance(r["task_params"], str) else r["task_params"] for r in table]
    keys = sorted({k for d in dicts for k in d})
    varying = [k for k in keys if len({json.dumps(d.get(k), sort_keys=True) for d in dicts}) > 1]

    def cell(v) -> str:
        d = json.loads(v) if isinstance(v, str) else v
        return " ".join(f"{k}={json.dumps(d.get(k))}" for k in varying) or "-"

    return cell
