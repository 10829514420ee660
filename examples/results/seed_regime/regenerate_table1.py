"""Regenerate Table 1 under Adam with L2 weight decay (``examples/results/seed_regime/table1``: 900 runs of 900 epochs,
d = 32 and d = 8 with normal, SVC, Shapley SVC and masking runs, d = 2 normal) from its shipped plans, on P cores,
and compare the regenerated rows with the shipped ones.

    python examples/results/seed_regime/regenerate_table1.py OUT [--processes 2] [--seeds 0..99] [--cells ...]
    python examples/results/seed_regime/regenerate_table1.py OUT --compare-only [--seeds ...]

The plans are the shipped ``sweep.json``'s (the three ``interp sweep`` commands of docs/seed-regime.md,
"Reproduce": same task, models, recipe, grid, seeds and snapshots), so the runs have the shipped names and
configuration hashes. The seeds are split into P contiguous parts (seeds 0-49 and 50-99 for P = 2, as the shipped
table was trained), each part a process of one thread (``--threads 1 --compile``) that trains every cell's runs of
its seeds as populations into ``OUT/part-P``; with ``--split cells`` each process trains whole cells instead (every
seed of a cell in one population of 100; the cells shared out by their measured cost, :data:`CELL_COST`), so each
step's fixed costs are shared by twice the models; then the parts' checkpoints are hard-linked into ``OUT/runs``, the
plans written to ``OUT/sweep.json`` and the sweeps rerun there, which trains nothing and writes the rows
(``OUT/results.jsonl``). ``--cells`` trains only some cells (``d32-normal,d8-svc,...``; ``d2-normal`` is the
d = 2 cell). The timings (wall seconds of each part, and the population's own breakdown: training steps,
validation, end of epoch with halving and snapshots, resume files, final evaluation) go to ``OUT/timings.json``.

The comparison (:func:`compare`, also ``--compare-only``) takes every shipped row of the seeds asked for and the
regenerated row of the same name: *identical* where every field of the shipped row but the wall time and the
population's bookkeeping (size, index, timings) is equal (fields a newer toolkit adds to its rows are not
compared), *same outcome* where the kept and best epochs, the epochs run, the heads left, the halving steps and
every accuracy are equal (losses may differ in the last digits), and it prints per cell the share at 100% test
accuracy of both. Training is deterministic for a given code and PyTorch build, but
900 epochs amplify float rounding: a change that reorders sums (another compiled kernel, another PyTorch) moves a
few near-miss runs across 100%, so rows other code trained can differ in outcome; the comparison says which.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

SHIPPED = Path(__file__).resolve().parent / "table1"
CELLS = (
    "d8-normal",
    "d8-svc",
    "d8-shapley-svc",
    "d8-mask-all-but-one",
    "d2-normal",
    "d32-normal",
    "d32-svc",
    "d32-shapley-svc",
    "d32-mask-all-but-one",
)
# seconds of each cell's 100 runs (its populations' own, one process of one thread, the sixth timing in
# docs/benchmarks.md, "Table 1 regenerated"): what --split cells balances the processes by
CELL_COST = {
    "d8-normal": 162,
    "d8-svc": 182,
    "d8-shapley-svc": 177,
    "d8-mask-all-but-one": 156,
    "d2-normal": 198,
    "d32-normal": 234,
    "d32-svc": 351,
    "d32-shapley-svc": 694,
    "d32-mask-all-but-one": 258,
}
IGNORED = ("wall_seconds", "population", "checkpoint")  # bookkeeping, not results
OUTCOME = ("best_epoch", "kept_epoch", "epochs_run", "final_active_heads", "accuracy", "strategy", "seed")


_ABSENT = object()  # a field the regenerated row lacks


def cell_of(row: dict[str, Any]) -> str:
    """``d<d_model>-<strategy>`` of a row (``normal`` without halving)."""
    return f"d{row['d_model']}-{row['strategy']}"


def split_cells(cells: list[str], parts: int) -> list[list[str]]:
    """``cells`` in ``parts`` groups of about equal cost (:data:`CELL_COST`): the dearest cell first, each to the
    group with the least cost so far (ties: the first group)."""
    groups: list[list[str]] = [[] for _ in range(parts)]
    cost = [0.0] * parts
    for c in sorted(cells, key=lambda c: (-CELL_COST[c], c)):
        i = cost.index(min(cost))
        groups[i].append(c)
        cost[i] += CELL_COST[c]
    return [g for g in groups if g]


def parse_seeds(text: str) -> list[int]:
    """``0..99`` or ``0,5,7``."""
    if ".." in text:
        a, b = text.split("..")
        return list(range(int(a), int(b) + 1))
    return [int(s) for s in text.split(",") if s]


def shipped_runs(shipped: Path = SHIPPED) -> list[dict[str, Any]]:
    """Every run the shipped plans hold (names, seeds, specs, configs), in plan order."""
    from interp.sweep_directory import plan_runs, read_plans

    return [r for p in read_plans(shipped) for r in plan_runs(p)]


def _part_worker(out: Path, part: int, seeds: list[int], cells: set[str] | None, shipped: Path) -> None:
    """Train this part's seeds of every plan (and cell) into ``out/part-<part>``."""
    import torch

    from interp.app.sweeps import run_sweep
    from interp.model import ModelSpec
    from interp.sweep_directory import read_plans
    from interp.tasks import get_task
    from interp.training import TrainConfig

    torch.set_num_threads(1)
    directory = out / f"part-{part}"
    started = time.perf_counter()
    for p in read_plans(shipped):
        plan_seeds = [s for s in p["seeds"] if s in seeds]
        spec, cfg = ModelSpec(**p["spec"]), TrainConfig(**p["cfg"])
        grid = p["grid"]
        if cells is not None:  # only the grid values whose cell is asked for
            halvings = grid.get("halving", [cfg.halving])
            keep = [h for h in halvings if f"d{spec.d_model}-{h or 'normal'}" in cells]
            if not keep:
                continue
            grid = {**grid, "halving": keep} if "halving" in grid else grid
        if not plan_seeds:
            continue
        run_sweep(
            get_task(p["task"], **p["task_params"]),
            spec,
            cfg,
            plan_seeds,
            grid,
            directory,
            threads=1,
            compile=True,
            progress=False,
            snapshot_every=p.get("snapshot_every"),
        )
    (directory / "part_seconds.json").write_text(json.dumps({"wall": time.perf_counter() - started}))


def _link_tree(src: Path, dst: Path) -> None:
    """Hard-link every file under ``src`` into ``dst`` (same relative paths), replacing nothing that exists."""
    for path in src.rglob("*"):
        target = dst / path.relative_to(src)
        if path.is_dir():
            target.mkdir(parents=True, exist_ok=True)
        elif not target.exists():
            target.parent.mkdir(parents=True, exist_ok=True)
            os.link(path, target)


def merge(out: Path, parts: int, shipped: Path = SHIPPED) -> None:
    """The parts' checkpoints into ``out/runs``, the shipped plans into ``out/sweep.json``, and the rows rebuilt
    from the checkpoints (the sweeps rerun: every checkpoint exists, nothing trains)."""
    from interp.app.sweeps import resume_sweeps
    from interp.sweep_directory import PLAN, RUNS

    (out / RUNS).mkdir(parents=True, exist_ok=True)
    for p in range(parts):
        part = out / f"part-{p}" / RUNS
        if part.is_dir():
            _link_tree(part, out / RUNS)
    shutil.copyfile(shipped / PLAN, out / PLAN)
    planned = {r["name"] for r in shipped_runs(shipped)}
    have = {p.name.removesuffix(".safetensors") for p in (out / RUNS).glob("*.safetensors")}
    if planned - have:  # a partial regeneration (--seeds, --cells): rows for the runs it trained only
        from interp.checkpoint import read_metadata
        from interp.sweep_directory import plan_runs, read_plans, run_row, write_results

        rows = []
        for pl in read_plans(shipped):
            for run in plan_runs(pl):
                path = out / RUNS / f"{run['name']}.safetensors"
                if path.is_file():
                    rows.append(run_row(run, read_metadata(path)["training"], path))
        write_results(out, rows)
        return
    resume_sweeps(out, threads=1, progress=False)


def compare(shipped: Path, out: Path, seeds: list[int] | None = None, quiet: bool = False) -> dict[str, Any]:
    """Compare the regenerated rows in ``out`` with the shipped ones (of ``seeds``; all where None): per cell, how
    many are identical, how many have the same outcome, and the share at 100% test accuracy of each; the names of
    the rows that differ in outcome. Rows the regeneration lacks are counted as missing."""
    from interp.sweep_directory import read_results

    ours = {r["name"]: r for r in read_results(out)}
    cells: dict[str, dict[str, Any]] = {}
    for row in read_results(shipped):
        if seeds is not None and row["seed"] not in seeds:
            continue
        c = cells.setdefault(
            cell_of(row),
            {
                "rows": 0,
                "missing": 0,
                "identical": 0,
                "same_outcome": 0,
                "shipped_at_100": 0,
                "ours_at_100": 0,
                "differ": [],
            },
        )
        c["rows"] += 1
        c["shipped_at_100"] += row["accuracy"]["test"] == 1.0
        other = ours.get(row["name"])
        if other is None:
            c["missing"] += 1
            continue
        c["ours_at_100"] += other["accuracy"]["test"] == 1.0
        # the shipped row's fields: options added to the toolkit since it was written (a newer row's extra keys,
        # e.g. ``loops``) are not results, and a row that lacks one of the shipped fields is not identical
        if all(other.get(k, _ABSENT) == v for k, v in row.items() if k not in IGNORED):
            c["identical"] += 1
        if _outcome(row) == _outcome(other):
            c["same_outcome"] += 1
        else:
            c["differ"].append(row["name"])
    if not quiet:
        print(
            f"{'cell':22s} {'rows':>5s} {'missing':>8s} {'identical':>10s} {'same outcome':>13s} "
            f"{'at 100% shipped':>16s} {'regenerated':>12s}"
        )
        for name, c in sorted(cells.items()):
            print(
                f"{name:22s} {c['rows']:5d} {c['missing']:8d} {c['identical']:10d} {c['same_outcome']:13d} "
                f"{c['shipped_at_100']:16d} {c['ours_at_100']:12d}"
            )
            for n in c["differ"]:
                print(f"    differs in outcome: {n}")
    return cells


def _outcome(row: dict[str, Any]) -> tuple:
    """What Table 1 and its analyses read from a row: epochs, heads, halving steps, every accuracy."""
    halving = row.get("halving_result") or {}
    metrics = row.get("metrics") or {}
    accuracies = {s: {k: v for k, v in m.items() if "accuracy" in k} for s, m in metrics.items()}
    steps = [(h.get("epoch"), h.get("kept")) for h in halving.get("steps", [])] + [halving.get("active")]
    return tuple(json.dumps(row.get(k), sort_keys=True) for k in OUTCOME) + (
        json.dumps(accuracies, sort_keys=True),
        json.dumps(steps),
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--processes", type=int, default=2)
    parser.add_argument("--seeds", default="0..99")
    parser.add_argument("--cells", default=None, help="e.g. d32-normal,d8-svc,d2-normal (default: all nine)")
    parser.add_argument(
        "--split",
        choices=("seeds", "cells"),
        default="seeds",
        help="seeds: each process trains its part of every cell's seeds (populations of 100/P, as the shipped table "
        "was trained); cells: each process trains whole cells, all their seeds in one population each",
    )
    parser.add_argument("--shipped", type=Path, default=SHIPPED)
    parser.add_argument("--compare-only", action="store_true")
    parser.add_argument("--part", type=int, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--part-seeds", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    seeds = parse_seeds(args.seeds)
    cells = set(args.cells.split(",")) if args.cells else None
    if cells is not None and cells - set(CELLS):
        parser.error(f"unknown cell(s) {sorted(cells - set(CELLS))}; the cells are {', '.join(CELLS)}")
    if args.part is not None:
        return _part_worker(args.out, args.part, parse_seeds(args.part_seeds), cells, args.shipped)
    if not args.compare_only:
        if args.out.exists() and any(args.out.iterdir()):
            parser.error(f"{args.out} is not empty: regenerate into a new directory (or --compare-only)")
        args.out.mkdir(parents=True, exist_ok=True)
        if args.split == "cells":  # (part seeds, part cells): every seed, whole cells
            groups = split_cells([c for c in CELLS if cells is None or c in cells], max(1, args.processes))
            parts = [(seeds, g) for g in groups]
        else:
            P = max(1, min(args.processes, len(seeds)))
            parts = [(seeds[i * len(seeds) // P : (i + 1) * len(seeds) // P], cells) for i in range(P)]
        P = len(parts)
        env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
        started = time.perf_counter()
        procs = []
        for i, (part_seeds, part_cells) in enumerate(parts):
            cmd = [
                sys.executable,
                __file__,
                str(args.out),
                "--part",
                str(i),
                "--part-seeds",
                ",".join(map(str, part_seeds)),
                "--shipped",
                str(args.shipped),
            ]
            if part_cells:
                cmd += ["--cells", ",".join(sorted(part_cells))]
            log = open(args.out / f"part-{i}.log", "w")  # noqa: SIM115 (closed when the process ends)
            procs.append((subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT), log))
        for proc, log in procs:
            proc.wait()
            log.close()
            if proc.returncode != 0:
                raise SystemExit(f"a part failed: see {log.name}")
        trained = time.perf_counter() - started
        merge(args.out, P, args.shipped)
        total = time.perf_counter() - started
        timings = _timings(args.out, P, trained, total)
        (args.out / "timings.json").write_text(json.dumps(timings, indent=1) + "\n")
        print(json.dumps(timings, indent=1))
    compare(args.shipped, args.out, seeds)


def _timings(out: Path, parts: int, trained: float, total: float) -> dict[str, Any]:
    """Wall seconds: of the whole regeneration, of each part, and summed over the populations by part of the run
    (from each population's provenance, ``population.seconds``), per cell."""
    from interp.sweep_directory import read_results

    by_cell: dict[str, dict[str, float]] = {}
    seen = set()
    for row in read_results(out):
        pop = row.get("population") or {}
        key = (cell_of(row), json.dumps(pop.get("seconds"), sort_keys=True), pop.get("size"))
        if key in seen:  # one population's seconds, once (every model of it carries them)
            continue
        seen.add(key)
        cell = by_cell.setdefault(cell_of(row), {})
        for k, v in (pop.get("seconds") or {}).items():
            cell[k] = round(cell.get(k, 0.0) + v, 1)
    part_s = {}
    for p in range(parts):
        f = out / f"part-{p}" / "part_seconds.json"
        if f.is_file():
            part_s[f"part-{p}"] = round(json.loads(f.read_text())["wall"], 1)
    return {"wall_total": round(total, 1), "wall_training": round(trained, 1), "parts": part_s, "cells": by_cell}


if __name__ == "__main__":
    main()
