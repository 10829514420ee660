"""Table 1 statistics over a population of runs (a sweep's rows, :func:`interp.sweep_directory.load_results`).

Per configuration and halving strategy: the share of runs that reach 100% (and 98%) test accuracy, with Wilson
95% intervals, and the mean, as Table 1 of Fraknói 2024 (*Solving Mathematical Problems with Transformers*, MSc
thesis, ELTE) reports them; a halving run that does not end with one head scores 0, as there.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from typing import Any

from interp.sweep_directory import config_columns_all, plain, results_frame
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


def scores(frame, split: str = "test"):
    """Each run's ``split`` accuracy, 0 for a halving run that did not end with one head (Fraknói 2024, §5.5)."""
    acc = frame[f"{split}_accuracy"].astype(float)
    if "halving_success" in frame:
        acc = acc.where(frame["halving_success"].map(lambda v: v is not False), 0.0)
    return acc


def config_columns(frame, always: Sequence[str] = ("d_model", "n_heads", "strategy")) -> tuple[list[str], list[str]]:
    """(every configuration column present: the grouping; the ones shown: ``always`` and those that vary)."""
    keys = [c for c in config_columns_all() if c in frame.columns]
    shown = [c for c in keys if c in always or frame[c].map(lambda v: json.dumps(plain(v))).nunique() > 1]
    return keys, shown


def groups(frame, keys: Sequence[str]) -> list[tuple[dict[str, Any], Any]]:
    """``[(configuration, sub-frame)]`` in first-seen order (None and NaN group together)."""
    seen: dict[str, list] = {}
    for i, row in frame.iterrows():
        key = json.dumps([plain(row[k]) for k in keys], default=str)
        seen.setdefault(key, []).append(i)
    return [({k: plain(frame.loc[idx[0], k]) for k in keys}, frame.loc[idx]) for idx in seen.values()]


def population_table(rows, *, split: str = "test", thresholds: Sequence[float] = (1.0, 0.98)) -> list[dict[str, Any]]:
    """Table 1 of Fraknói 2024, per configuration and halving strategy: ``runs``; for each threshold t the share of runs
    whose ``split`` accuracy reaches t (``share_test_at_1``, ``share_test_at_0.98``; a failed halving run scores 0)
    with its 95% Wilson interval (``..._low``, ``..._high``); and the mean accuracy. ``rows``: results.jsonl rows or
    a :func:`load_results` frame. The configuration columns shown are d_model, n_heads, strategy and any other that
    varies in the sweep (runs are grouped by all of them)."""
    import pandas as pd

    frame = rows if isinstance(rows, pd.DataFrame) else results_frame(rows)
    if frame.empty:
        return []
    keys, shown = config_columns(frame)
    score = scores(frame, split)
    table = []
    for config, members in groups(frame, keys):
        acc = score.loc[members.index]
        entry = {k: config[k] for k in shown}
        entry["runs"] = len(acc)
        for t in thresholds:
            hits = int((acc >= t).sum())
            lo, hi = wilson_interval(hits, len(acc))
            entry.update(
                {
                    f"share_{split}_at_{t:g}": hits / len(acc),
                    f"share_{split}_at_{t:g}_low": lo,
                    f"share_{split}_at_{t:g}_high": hi,
                }
            )
        entry[f"mean_{split}_accuracy"] = float(acc.mean())
        table.append(entry)
    return table


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
