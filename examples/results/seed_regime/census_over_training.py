"""The census over training of the d = 2, a = 1 runs (our recipe and ``--normalization LN``): every snapshot's head
(w01, w02, separation and learned accuracy, grade) and test accuracy, with each run's outcome, first good epoch and
whether it lost a good head (``interp.analyses.noisy_majority.training_census``).

    interp sweep noisy-majority --seeds 0..39 --d-model 2 --n-heads 1 --dropout-at attention --epochs 300 \\
        --snapshots 10 --threads 1 --out SWEEP_DIR          # and the same with --normalization LN
    python examples/results/seed_regime/census_over_training.py SWEEP_DIR census_over_training_d2.json
    python examples/results/seed_regime/census_over_training.py SWEEP_DIR OUT.json strategy=normal d_model=8
        # only the runs whose configuration matches every KEY=VALUE (as the results table reads it)

The JSON is ``TrainingCensus.to_dict(series=True)`` (each run's snapshots as columns) with numbers rounded to 4
significant digits, to keep it small; ``TrainingCensus.from_dict(json.load(...))`` gives back its tables and its
figure without the checkpoints.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import torch

from interp.analyses.noisy_majority.training_census import census_over_training
from interp.sweep_directory import checkpoint_path, select_rows, where_of


def rounded(x):
    """``x`` with every float at 4 significant digits (checksums dropped: they name files not shipped)."""
    if isinstance(x, float):
        return float(f"{x:.4g}")
    if isinstance(x, list):
        return [rounded(v) for v in x]
    if isinstance(x, dict):
        return {k: rounded(v) for k, v in x.items() if k != "checksum"}
    return x


def main(directory: str, out: str, *where_args: str) -> None:
    """The census of every run of ``directory`` with snapshots (cached in it), or, with KEY=VALUE pairs, of the runs
    whose configuration matches them (e.g. ``strategy=normal``; not cached)."""
    torch.set_num_threads(1)
    t0 = time.perf_counter()
    if where_args:
        chosen = select_rows(directory, where_of(where_args))
        tc = census_over_training([checkpoint_path(directory, r) for r in chosen])
    else:
        tc = census_over_training(directory)
    secs = time.perf_counter() - t0
    Path(out).write_text(json.dumps(rounded(tc.to_dict(series=True)), separators=(",", ":")) + "\n")
    print(tc.text())
    print(f"{sum(len(r['snapshots']) for r in tc.runs)} snapshots in {secs:.0f} s (cached ones included)")
    for row in tc.ratios_over_epochs():
        if row["epoch"] in (10, 20, 30, 50, 100, 200, 300, 450, 600, 900):
            print(row)


if __name__ == "__main__":
    from interp.errors import ConfigError

    try:
        main(*sys.argv[1:])
    except ConfigError as e:  # a misspelt selection or a directory without results: one line, no traceback
        sys.exit(f"error: {e}")
