"""Throughput of batched population training (interp.population) against training the same models one at a time
with interp.training.train, measured in the same run on the thesis's configuration (d_model 32, 16 heads, d_head 2,
7,500 training sentences, batch 128): steady-state seconds per model-epoch, and the ratio.

    .venv/bin/python benchmarks/population.py [--models 100] [--epochs 20] [--processes 1] [--compile]
        [--dropout-at attention|embedding+attention] [--dropout-rng torch|counter] [--repeats 3]

Which batched forward is timed follows from the recipe (``interp.population_paths.forward_of``): dropout on the
attention output only (``--dropout-at attention``) trains through the token-count forward; dropout on the embedding
too (``embedding+attention``, the thesis's placement) through the per-position forward. ``--dropout-rng counter``
draws the masks from the counter (both sides; the solo run then goes through the per-position forward with one
model) instead of each run's torch generator.

Steady state: every side is timed at ``E`` and at ``3E`` epochs, and the rate is the difference over the ``2E``
extra epochs, so start-up (imports, model building, ``torch.compile``'s compilation, the final evaluation on all
10,000 sentences, checkpoint writes) is left out of both sides alike; the fixed cost is printed too. Each repeat
times both sides (solo, then batched) and ``--repeats R`` of them give the median and the range (min-max) of each
rate and of the ratio (each repeat's solo rate over its batched one), so a machine shared with other work shows as a
spread instead of one lucky or unlucky figure. Each rate is given in wall seconds and in the workers' CPU seconds
(user + system), which other work on the machine disturbs less.

``--processes P`` splits the population over P processes of one thread each, trained at the same time (one per
core: ``--processes 2`` on this 2-core machine), and counts wall-clock time; the solo rate is then also P models
trained at the same time, one per process, so the ratio compares the same cores used both ways.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import torch

from interp.model import ModelSpec
from interp.population import seed_population, train_population
from interp.tasks import get_task
from interp.training import TrainConfig, train


def _worker(args) -> None:
    """One process's share: train models ``args.first`` .. (batched, or one at a time with --solo-worker)."""
    torch.set_num_threads(1)
    task = get_task("noisy-majority")
    spec = ModelSpec(**task.default_spec())
    cfg = TrainConfig(epochs=args.worker_epochs, dropout_at=args.dropout_at, dropout_rng=args.dropout_rng)
    seeds = range(args.first, args.first + args.count)
    with tempfile.TemporaryDirectory() as tmp:
        if args.solo_worker:
            for s in seeds:
                train(
                    task,
                    spec.__class__(**{**spec.to_dict(), "init_seed": s}),
                    replace(cfg, seed=s),
                    Path(tmp) / f"s{s}.safetensors",
                    device="cpu",
                    progress=False,
                )
        else:
            specs, cfgs = seed_population(task, spec, cfg, seeds)
            train_population(
                task,
                specs,
                cfgs,
                [Path(tmp) / f"p{s}.safetensors" for s in seeds],
                device="cpu",
                progress=False,
                compile=args.compile,
            )


def _wall(args, epochs: int, solo: bool) -> tuple[float, float]:
    """Wall seconds for ``args.processes`` processes training their share for ``epochs`` epochs at the same time
    (batched: the population split evenly; solo: one model each), and the CPU seconds (user + system) they used:
    on a machine shared with other work the CPU time moves less than the wall time."""
    per = -(-args.models // args.processes)
    procs = []
    cpu0 = _children_cpu()
    t0 = time.perf_counter()
    for p in range(args.processes):
        first, count = p * per, (1 if solo else min(per, args.models - p * per))
        cmd = [
            sys.executable,
            __file__,
            "--worker",
            "--first",
            str(first if not solo else p),
            "--count",
            str(count),
            "--worker-epochs",
            str(epochs),
            "--dropout-at",
            args.dropout_at,
            "--dropout-rng",
            args.dropout_rng,
        ]
        cmd += ["--solo-worker"] if solo else (["--compile"] if args.compile else [])
        procs.append(subprocess.Popen(cmd, env={"OMP_NUM_THREADS": "1", **_env()}))
    for pr in procs:
        if pr.wait() != 0:
            raise SystemExit("a worker failed")
    return time.perf_counter() - t0, _children_cpu() - cpu0


def _children_cpu() -> float:
    import resource

    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def _env() -> dict[str, str]:
    import os

    root = str(Path(__file__).resolve().parents[1])
    return {**os.environ, "PYTHONPATH": root + (":" + os.environ["PYTHONPATH"] if "PYTHONPATH" in os.environ else "")}


def _positive_int(text: str) -> int:
    """An argparse type: a positive integer, or argparse's one-line usage error naming the value."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {value}")
    return value


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", type=_positive_int, default=100)
    parser.add_argument("--epochs", type=_positive_int, default=20, help="E: each side is timed at E and 3E epochs")
    parser.add_argument(
        "--processes", type=_positive_int, default=1, help="processes (one thread each) trained at once"
    )
    parser.add_argument("--dropout-at", default="attention", choices=["embedding+attention", "attention"])
    parser.add_argument("--dropout-rng", default="torch", choices=["torch", "counter"])
    parser.add_argument("--compile", action="store_true", help="train the population with compile=True")
    parser.add_argument(
        "--repeats", type=_positive_int, default=3, help="timings of both sides; median and range printed"
    )
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--solo-worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--first", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--count", type=int, default=1, help=argparse.SUPPRESS)
    parser.add_argument("--worker-epochs", type=int, default=1, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        return _worker(args)
    if args.processes > args.models:
        parser.error(f"--processes {args.processes} is more than --models {args.models}: each process needs a model")
    E = args.epochs
    sides = (("one at a time (interp train)", True), ("batched population", False))
    rates: dict[tuple[str, str], list[float]] = {(side, c): [] for side, _ in sides for c in ("wall", "cpu")}
    ratios: dict[str, list[float]] = {"wall": [], "cpu": []}
    for r in range(args.repeats):
        for side, solo in sides:
            (short, short_cpu), (long, long_cpu) = _wall(args, E, solo), _wall(args, 3 * E, solo)
            models = args.processes if solo else args.models
            rate = (long - short) / (2 * E * models)  # wall seconds per model-epoch, steady state
            rates[side, "wall"].append(rate)
            rates[side, "cpu"].append((long_cpu - short_cpu) / (2 * E * models))
            print(
                f"repeat {r + 1}/{args.repeats} {side:30s}: {rate:.4f} s per model-epoch (wall, {args.processes} "
                f"process(es); CPU {rates[side, 'cpu'][-1]:.4f} s); fixed cost {short - rate * E * models:.1f} s "
                f"per run of {models} model(s)",
                flush=True,
            )
        for c, values in ratios.items():
            values.append(rates[sides[0][0], c][-1] / rates[sides[1][0], c][-1])
    print(
        f"seed config (d 32, 16 heads), {args.models} models, dropout at {args.dropout_at} ({args.dropout_rng} masks), "
        f"compile={args.compile}, {args.processes} process(es) x 1 thread, epochs {E} and {3 * E}, {args.repeats} "
        "repeat(s): median (min-max)"
    )
    for side, _ in sides:
        print(
            f"{side:30s}: {_spread(rates[side, 'wall'], '.4f')} s per model-epoch (wall), "
            f"{_spread(rates[side, 'cpu'], '.4f')} s (CPU)"
        )
    solo, batched = statistics.median(rates[sides[0][0], "wall"]), statistics.median(rates[sides[1][0], "wall"])
    print(
        f"speed-up {_spread(ratios['wall'], '.2f')}x (wall), {_spread(ratios['cpu'], '.2f')}x (CPU); 100 models x 900 "
        f"epochs: {batched * 100 * 900 / 60:.1f} min batched, {solo * 100 * 900 / 3600:.1f} h one at a time (wall "
        "medians; steady state, plus the fixed cost)"
    )
    print(
        json.dumps(
            {
                "solo_s_per_model_epoch": rates[sides[0][0], "wall"],
                "batched_s_per_model_epoch": rates[sides[1][0], "wall"],
                "ratio": ratios["wall"],
                "median_ratio": statistics.median(ratios["wall"]),
                "solo_cpu_s_per_model_epoch": rates[sides[0][0], "cpu"],
                "batched_cpu_s_per_model_epoch": rates[sides[1][0], "cpu"],
                "cpu_ratio": ratios["cpu"],
                "median_cpu_ratio": statistics.median(ratios["cpu"]),
            }
        )
    )


def _spread(xs: list[float], fmt: str) -> str:
    """``median (min-max)`` of ``xs``."""
    return f"{statistics.median(xs):{fmt}} ({min(xs):{fmt}}-{max(xs):{fmt}})"


if __name__ == "__main__":
    main()
