"""The per-head census of a sweep (Fraknói 2024, §5.4 over a population): separation accuracy, learned accuracy, ROC AUC
and ``w01``/``w02`` of every head of every run, how many runs have k good heads, Figure 7 over all of them, and the
1 - CDF of per-head separation accuracy by number of heads (Figure 9, right: 1-head against many-head models).

Each run's heads come from :func:`head_summary` with ``pairs=False`` (the per-model head table, graded by the
same rule: good at separation accuracy >= 0.95), on the **first** ``train_size`` train and ``test_size`` test
sequences of the run's own task (default 2000 and 500, the sizes the report's Figure 8 uses; pass ``None`` for the
full splits, as ``interp analyze`` uses: measured on the shipped d = 32, 16-head model on one thread, 0.3 s per run
subsampled against 0.85 s on the full 7500 train / 1000 test sequences). For one-layer models without
positional embedding ``w01``/``w02`` are the exact values from the QK circuit.

The results are cached per run in ``DIR/census.jsonl`` (rewritten atomically after each run): a rerun computes only
the runs not in it, computed with other sizes, or whose checkpoint changed since (its weights' checksum), so a killed
census resumes where it stopped.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from interp.errors import ConfigError
from interp.files import read_named_rows, write_rows
from interp.results import Result, jsonable
from interp.sweep_directory import checkpoint_path

from .head_summary import GOOD

CENSUS = "census.jsonl"
TRAIN_SIZE, TEST_SIZE = 2000, 500
RUN_COLUMNS = ("d_model", "n_heads", "strategy", "seed", "test_accuracy")


def run_heads(ckpt, train_size: int | None = TRAIN_SIZE, test_size: int | None = TEST_SIZE) -> dict[str, Any]:
    """One run's census entry: the model's accuracy on the subsample and its head rows (head, learned and
    separation accuracy, ROC AUC, w01, w02, grade, ``active``: not masked by halving)."""
    from .head_summary import checkpoint_summary

    summary, *_ = checkpoint_summary(ckpt, train_size, test_size, pairs=False)
    halving = (ckpt.training or {}).get("halving")
    active = set(halving["active"]) if halving else None
    keep = ("head", "learned_accuracy", "separation_accuracy", "roc_auc", "w01", "w02", "grade")
    heads = [{**{k: r[k] for k in keep}, "active": active is None or r["head"] in active} for r in summary.rows]
    return {
        "model_accuracy": summary.model_accuracy,
        "n_train": summary.n_train,
        "n_test": summary.n_test,
        "exact_ratios": summary.exact_ratios,
        "heads": heads,
    }


def read_census(directory) -> dict[str, dict[str, Any]]:
    """The cached census entries of a sweep directory (``census.jsonl``), by run name."""
    return read_named_rows(Path(directory) / CENSUS)


def _write_census(directory: Path, entries: list[dict[str, Any]]) -> None:
    write_rows(directory / CENSUS, entries, "the sweep's head census")


def census(
    directory,
    *,
    train_size: int | None = TRAIN_SIZE,
    test_size: int | None = TEST_SIZE,
    device: str | None = "cpu",
    progress: bool = True,
    missing: str = "error",
) -> Census:
    """The census of every finished run of the sweep in ``directory`` (see the module doc), computing only the runs
    not yet cached in ``directory/census.jsonl`` with these sizes. A run whose checkpoint is gone (e.g. a results
    table shipped without its checkpoints) uses its cached entry; without one, ``missing="error"`` raises and
    ``"skip"`` leaves the run out (listed in ``Census.skipped``)."""
    from tqdm.auto import tqdm

    from interp.sweep_directory import load_results
    from interp.tasks import load_checkpoint, read_metadata

    if missing not in ("error", "skip"):
        raise ConfigError(f"missing must be 'error' or 'skip', got {missing!r}")
    directory = Path(directory)
    frame = load_results(directory)
    cached = read_census(directory)
    sizes = {"train_size": train_size, "test_size": test_size}
    todo, skipped = [], []
    for _, row in frame.iterrows():
        path = checkpoint_path(directory, row)
        entry = cached.get(row["name"])
        fits = entry is not None and all(entry.get(k) == v for k, v in sizes.items())
        if not path.is_file():
            if fits:
                continue
            if missing == "skip":
                skipped.append(row["name"])
                continue
            raise ConfigError(f"the census needs run {row['name']}'s checkpoint, and {path} is missing")
        if not fits or entry.get("checksum") != read_metadata(path).get("checksum"):  # other sizes, or retrained
            todo.append((row["name"], path))
    for name, path in tqdm(todo, desc="head census", unit="run", disable=not progress or not todo):
        ckpt = load_checkpoint(path, device=device)
        cached[name] = {
            "name": name,
            **sizes,
            "checksum": ckpt.metadata.get("checksum"),
            **run_heads(ckpt, train_size, test_size),
        }
        _write_census(directory, list(cached.values()))
    runs = [
        {**{k: _plain(row.get(k)) for k in ("name", *RUN_COLUMNS)}, **cached[row["name"]]}
        for _, row in frame.iterrows()
        if row["name"] not in skipped
    ]
    return Census(runs, train_size, test_size, skipped)


def _plain(x):
    if hasattr(x, "item"):
        x = x.item()
    return None if isinstance(x, float) and math.isnan(x) else x


@dataclass(eq=False)
class Census(Result):
    """``runs``: per run its configuration, test accuracy and census entry (``heads``: one row per head)."""

    runs: list[dict[str, Any]]
    train_size: int | None = TRAIN_SIZE
    test_size: int | None = TEST_SIZE
    skipped: list[str] = field(default_factory=list)  # runs left out: no checkpoint and no cached entry

    def heads(self) -> list[dict[str, Any]]:
        """One row per head of every run, with the run's configuration."""
        return [{**{k: r[k] for k in ("name", *RUN_COLUMNS)}, **h} for r in self.runs for h in r["heads"]]

    def good_heads(self) -> list[dict[str, Any]]:
        """Per configuration (d_model, n_heads, strategy): runs, and the number of runs with k good heads
        (``good_k``; separation accuracy >= 0.95, the head summary's grade), k = 0 .. n_heads."""
        table: dict[tuple, dict[str, Any]] = {}
        for r in self.runs:
            key = (r["d_model"], r["n_heads"], r["strategy"])
            entry = table.setdefault(
                key,
                {
                    "d_model": key[0],
                    "n_heads": key[1],
                    "strategy": key[2],
                    "runs": 0,
                    **{f"good_{k}": 0 for k in range(len(r["heads"]) + 1)},
                },
            )
            k = sum(h["grade"] == "good" for h in r["heads"])
            entry["runs"] += 1
            entry[f"good_{k}"] = entry.get(f"good_{k}", 0) + 1
        return list(table.values())

    def separation_survival(self):
        """Figure 9 (right) of Fraknói 2024: 1 - CDF of per-head separation accuracy, one curve per number of heads."""
        from interp.analyses.population_figures import Survival

        groups: dict[str, list[float]] = {}
        for r in sorted(self.runs, key=lambda r: r["n_heads"]):
            label = f"{r['n_heads']}-head models"
            groups.setdefault(label, []).extend(h["separation_accuracy"] for h in r["heads"])
        return Survival(
            groups,
            title="1 - CDF of per-head separation accuracy (Fraknói 2024, Figure 9, right)",
            xlabel="separation accuracy of a head",
            unit="heads",
        )

    def figure(self):
        """Figure 7 over the population: w01 against w02 of every head of every run, coloured by separation."""
        import torch

        from .attention_ratios import ratio_figure

        hs = self.heads()
        fig = ratio_figure(
            [h["w01"] for h in hs],
            [h["w02"] for h in hs],
            [f"{h['name']} {h['head']}" for h in hs],
            torch.tensor([h["separation_accuracy"] for h in hs]),
            title=f"Figure 7 over the population: every head of {len(self.runs)} runs",
        )
        return fig.update_traces(mode="markers")  # run names crowd each other: they are in the hover text

    def table_html(self) -> str:
        from interp.visualize import render_table

        return render_table(
            self.good_heads(), caption=f"Runs with k good heads (separation accuracy >= {GOOD}), per configuration"
        )

    def text(self) -> str:
        lines = [f"head census of {len(self.runs)} runs ({self.train_size} train / {self.test_size} test sequences)"]
        for e in self.good_heads():
            counts = ", ".join(f"{k[5:]}: {v}" for k, v in e.items() if k.startswith("good_") and v)
            lines.append(
                f"d_model={e['d_model']} n_heads={e['n_heads']} {e['strategy']}: {e['runs']} runs; "
                f"runs with k good heads: {counts}"
            )
        return "\n".join(lines)

    def to_dict(self) -> dict:
        return jsonable(
            {
                "train_size": self.train_size,
                "test_size": self.test_size,
                "good_threshold": GOOD,
                "good_heads": self.good_heads(),
                "runs": self.runs,
                "skipped": self.skipped,
            }
        )

    @classmethod
    def from_dict(cls, d: dict) -> Census:
        """The census ``to_dict`` wrote (undefined or infinite head numbers, written as null, read back as NaN)."""
        from .head_summary import NUMERIC

        def head(h: dict) -> dict:
            return {k: float("nan") if k in NUMERIC and v is None else v for k, v in h.items()}

        runs = [{**r, "heads": [head(h) for h in r["heads"]]} for r in d["runs"]]
        return cls(runs, d["train_size"], d["test_size"], list(d["skipped"]))


__all__ = ["Census", "census", "read_census", "run_heads"]
