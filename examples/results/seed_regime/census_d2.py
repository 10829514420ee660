"""End-state head census of the d = 2, a = 1 runs of the hypothesis sweep (our recipe, LN, LNPre), split by success:
what the one head attends to (w01, w02), its separation and learned accuracy, its grade.

    python examples/results/seed_regime/census_d2.py SWEEP_DIR census_d2.json   # a sweep with its checkpoints
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

import torch

from interp.analyses.noisy_majority.census import run_heads
from interp.tasks import load_checkpoint

KEYS = ("w01", "w02", "separation_accuracy", "learned_accuracy", "grade")


def _recipe_only(r: dict) -> bool:
    """The d = 2 rows that differ from our recipe in their normalization only (rows older than an option have no
    column for it: they ran its default)."""
    ours = {"init": "tl", "padding": "right", "warmup_shape": "linear", "lr": 1e-3, "optimizer": "adamw"}
    return (
        r["d_model"] == 2 and r["task_params"]["test_size"] == 1000 and all(r.get(k, v) == v for k, v in ours.items())
    )


def main(directory: str, out: str) -> None:
    torch.set_num_threads(1)
    rows = [json.loads(line) for line in Path(directory, "results.jsonl").read_text().splitlines() if line.strip()]
    entries = []
    for r in filter(_recipe_only, rows):
        head = run_heads(load_checkpoint(Path(directory, r["checkpoint"])))["heads"][0]
        entries.append({"normalization": r["normalization"], "seed": r["seed"], "test": r["accuracy"]["test"]})
        entries[-1].update({k: head[k] for k in KEYS})
    Path(out).write_text(json.dumps(entries, indent=1))
    for norm in (None, "LN", "LNPre"):
        for ok in (True, False):
            group = [e for e in entries if e["normalization"] == norm and (e["test"] >= 1.0) == ok]
            if group:
                med = {k: statistics.median(e[k] for e in group) for k in KEYS[:4]}
                grades = {g: sum(e["grade"] == g for e in group) for g in sorted({e["grade"] for e in group})}
                print(f"{norm!s:6s} {'success' if ok else 'fail':8s} {len(group):3d} runs, median", med, grades)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
