"""Do modular-addition seeds learn different algorithms (Zhong et al. 2023, *The Clock and the Pizza*)? Each run of a
sweep directory classified as Clock or Pizza by gradient symmetricity and distance irrelevance
(:mod:`interp.analyses.modular_addition.algorithms`), its Fourier key frequencies counted, its circuit discovered
(:func:`interp.analyses.circuit_population.population_circuits`, exact per-edge patching), and the circuits of the
algorithm classes compared.

The sweep (standard softmax attention; the toolkit has no constant-attention variant, Zhong et al.'s Model A):

    OMP_NUM_THREADS=1 interp sweep modular-addition --set p=23 --set fraction=0.8 --d-model 64 --n-heads 4 \\
        --d-head 16 --d-mlp 256 --epochs 1500 --seeds 0..19 --threads 1 --out runs/modpop-p23
    OMP_NUM_THREADS=1 python examples/circuits/modular_population.py runs/modpop-p23 [--examples 64]

Writes examples/results/circuits/population_modular_addition.json (everything) and .csv (one row per run), and
docs/circuits/population_modular_addition.png (the runs on the two diagnostics).
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import os
import sys
import time
from pathlib import Path

import torch

from interp.analyses.circuit_population import population_circuits
from interp.analyses.modular_addition.algorithms import population_algorithms
from interp.app.circuit_inputs import circuit_inputs
from interp.loading import load_checkpoint
from interp.sweep_directory import checkpoint_path, read_results

sys.path.insert(0, str(Path(__file__).resolve().parent))
from shipped import png

OUT = Path(__file__).resolve().parents[2] / "examples" / "results" / "circuits"
NAME = "population_modular_addition"


def spearman(x: list[float], y: list[float]) -> dict:
    from scipy import stats

    ok = [i for i in range(len(x)) if math.isfinite(x[i]) and math.isfinite(y[i])]
    if len(ok) < 3 or len({x[i] for i in ok}) < 2 or len({y[i] for i in ok}) < 2:
        return {"rho": None, "p": None, "n": len(ok)}
    r = stats.spearmanr([x[i] for i in ok], [y[i] for i in ok])
    return {"rho": float(r.statistic), "p": float(r.pvalue), "n": len(ok)}


def main(argv=None) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("directory")
    p.add_argument("--examples", type=int, default=64)
    p.add_argument("--min-accuracy", type=float, default=0.99, help="runs counted as solving the task (test split)")
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    t0 = time.perf_counter()
    algos = population_algorithms(args.directory, progress=True)
    t_algos = time.perf_counter() - t0
    task = load_checkpoint(checkpoint_path(args.directory, read_results(Path(args.directory))[0]), device="cpu").task
    clean, corrupted, what = circuit_inputs(task, args.examples, device="cpu")
    t0 = time.perf_counter()
    circuits = population_circuits(args.directory, clean, corrupted=corrupted, method="patching", progress=True)
    t_circuits = time.perf_counter() - t0
    assert circuits.names == algos.names  # one sweep directory, read in the same order
    labels = algos.algorithms
    n_keys = [float(len(k)) for k in algos.key_frequencies]
    solved = [a >= args.min_accuracy for a in algos.accuracy]

    comparisons = {}
    for name in ("clock", "pizza"):
        group = [lab == name for lab in labels]
        try:
            comparisons[f"{name} vs the rest"] = circuits.compare_groups(group, (name, "rest"))
        except Exception as e:  # one class only: nothing to compare, said in the output
            comparisons[f"{name} vs the rest"] = {"not compared": str(e)}
    out = {
        "question": "do modular-addition seeds learn different algorithms (Clock or Pizza, Zhong et al. 2023), and do "
        "the algorithm classes use different circuits or different numbers of key frequencies?",
        "directory": str(args.directory),
        "task": task.params(),
        "thresholds": algos.thresholds,
        "counts_all_runs": algos.counts(),
        "counts_solved_runs": algos.counts(args.min_accuracy),
        "solved_runs": sum(solved),
        "min_accuracy": args.min_accuracy,
        "key_frequency_count_vs_distance_irrelevance_spearman": spearman(
            n_keys, [float(v) for v in algos.distance_irrelevance]
        ),
        "key_frequency_count_vs_gradient_symmetricity_spearman": spearman(
            n_keys, [float(v) for v in algos.gradient_symmetricity]
        ),
        "circuit_size_vs_distance_irrelevance_spearman": spearman(
            [float(x) for x in circuits.sizes], [float(v) for v in algos.distance_irrelevance]
        ),
        "circuit_size_vs_gradient_symmetricity_spearman": spearman(
            [float(x) for x in circuits.sizes], [float(v) for v in algos.gradient_symmetricity]
        ),
        "circuit_inputs": what,
        "circuit_rule": "exact per-edge patching, smallest top-k with faithfulness 0.9",
        "circuit_types": circuits.circuit_types(),
        "circuit_comparisons": comparisons,
        "algorithms": algos.to_dict(),
        "circuits": circuits.to_dict(),
        "seconds": {"diagnostics": round(t_algos, 1), "circuits": round(t_circuits, 1)},
        "threads": torch.get_num_threads(),
        "load_average": os.getloadavg(),
    }
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / f"{NAME}.json").write_text(json.dumps(out, indent=1) + "\n")
    types = {tuple(sorted(t["seeds"])): i for i, t in enumerate(out["circuit_types"])}
    with open(OUT / f"{NAME}.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["seed", "test_accuracy", "gradient_symmetricity", "distance_irrelevance", "algorithm",
                    "key_frequencies", "circuit_size", "faithfulness", "circuit_type"])  # fmt: skip
        for i, seed in enumerate(algos.seeds):
            ctype = next(k for seeds, k in types.items() if seed in seeds)
            w.writerow([seed, f"{algos.accuracy[i]:.4f}", f"{float(algos.gradient_symmetricity[i]):.4f}",
                        f"{float(algos.distance_irrelevance[i]):.4f}", labels[i],
                        " ".join(map(str, algos.key_frequencies[i])), circuits.sizes[i],
                        f"{circuits.faithfulness[i]:.4f}", ctype])  # fmt: skip
    png(algos.figure(), OUT.parents[2] / "docs" / "circuits" / f"{NAME}.png", 620, 480)
    print(algos.text())
    print(circuits.text())
    print(json.dumps({k: out[k] for k in out if k.endswith("_spearman")}, indent=1))
    for k, v in comparisons.items():
        print(k, json.dumps({x: y for x, y in v.items() if x != "per_class"}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
