"""Do succeeding and failing noisy-majority runs use different circuits? The circuits of the 100 seeds of Table 1's
d = 8, a = 4 cell under the Adam-with-L2 recipe (docs/seed-regime.md), trained into a sweep directory.

    OMP_NUM_THREADS=1 python examples/circuits/population.py runs/t1-d8-normal [--examples 64]

Writes examples/results/circuits/population_noisy_majority.json and docs/circuits/population_noisy_majority.png:
each run's exact per-edge patching scores, its circuit (smallest top-k with faithfulness 0.9), the circuit types
(head-permutation-invariant edge profiles), and the comparison of runs at 100% test accuracy against the others
(permutation test, bootstrap intervals).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import torch

from interp.analyses.circuit_population import population_circuits
from interp.analyses.noisy_majority.corrupt import corrupted_pair
from interp.tasks.noisy_majority import NoisyMajority

sys.path.insert(0, str(Path(__file__).resolve().parent))
from shipped import png

OUT = Path(__file__).resolve().parents[2] / "examples" / "results" / "circuits"


def main(argv=None) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("directory")
    p.add_argument("--examples", type=int, default=64)
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    task = NoisyMajority()
    clean, corrupted = corrupted_pair(task, args.examples, n_digits=40)
    t0 = time.perf_counter()
    pop = population_circuits(args.directory, clean, corrupted=corrupted, method="patching", progress=True)
    seconds = time.perf_counter() - t0
    cmp = pop.compare(1.0)
    out = {
        "question": "do noisy-majority runs that reach 100% test accuracy use different circuits from those that "
        "do not?",
        "inputs": f"{args.examples} near-tie sequences of 40 digits and their answer-flipped corruptions "
        "(interp.analyses.noisy_majority.corrupt.corrupted_pair); exact per-edge patching; circuit = smallest top-k "
        "with faithfulness 0.9",
        "comparison": cmp,
        "circuit_types": pop.circuit_types(),
        "population": pop.to_dict(),
        "seconds": round(seconds, 1),
        "threads": torch.get_num_threads(),
        "load_average": os.getloadavg(),
    }
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "population_noisy_majority.json").write_text(json.dumps(out, indent=1) + "\n")
    png(pop.figure(), OUT.parents[2] / "docs" / "circuits" / "population_noisy_majority.png", 1100, 700)
    print(pop.text())
    print(json.dumps({k: v for k, v in cmp.items() if k != "per_class"}, indent=1))
    for row in cmp["per_class"]:
        print(row)
    return 0


if __name__ == "__main__":
    sys.exit(main())
