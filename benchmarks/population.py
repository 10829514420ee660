"""Throughput of batched population training (interp.population) against training the same models one at a time
with interp.training.train, measured in the same run on the thesis's configuration (d_model 32, 16 heads, d_head 2,
7,500 training sentences, batch 128, dropout on the attention output only): steady-state seconds per model-epoch,
and the ratio.

    .venv/bin/python benchmarks/population.py [--models 100] [--epochs 20] [--processes 1] [--compile]
        [--dropout-at attention|embedding+attention]

Steady state: every side is timed at ``E`` and at ``3E`` epochs, and the rate is the difference over the ``2E``
extra epochs, so start-up (imports, model building, ``torch.compile``'s compilation, the final evaluation on all
10,000 sentences, checkpoint writes) is left out of both sides alike; the fixed cost is printed too.

``--processes P`` splits the population over P processes of one thread each, trained at the same time (one per
core: ``--processes 2`` on this 2-core machine), and counts wall-clock time; the solo rate is then also P models
trained at the same time, one per process, so the ratio compares the same cores used both ways.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from interp.model import ModelSpec
from interp.population import seed_population, train_population
from interp.training import TrainConfig, train
from tasks import get_task


def _worker(args) -> None:
    """One process's share: train models ``args.first`` .. (batched, or one at a time with --solo-worker)."""
    torch.set_num_threads(1)
    task = get_task("noisy-majority")
    spec = ModelSpec(**task.default_spec())
    cfg = TrainConfig(epochs=args.worker_epochs, dropout_at=args.dropout_at)
    seeds = range(args.first, args.first + args.count)
    with tempfile.TemporaryDirectory() as tmp:
        if args.solo_worker:
            for s in seeds:
                train(
                    task,
                    spec.__class__(**{**spec.to_dict(), "init_seed": s}),
                    TrainConfig(epochs=args.worker_epochs, seed=s, dropout_at=args.dropout_at),
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


def _wall(args, epochs: int, solo: bool) -> float:
    """Wall seconds for ``args.processes`` processes training their share for ``epochs`` epochs at the same time
    (batched: the population split evenly; solo: one model each)."""
    per = -(-args.models // args.processes)
    procs = []
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
        ]
        cmd += ["--solo-worker"] if solo else (["--compile"] if args.compile else [])
        procs.append(subprocess.Popen(cmd, env={"OMP_NUM_THREADS": "1", **_env()}))
    for pr in procs:
        if pr.wait() != 0:
            raise SystemExit("a worker failed")
    return time.perf_counter() - t0


def _env() -> dict[str, str]:
    import os

    root = str(Path(__file__).resolve().parents[1])
    return {**os.environ, "PYTHONPATH": root + (":" + os.environ["PYTHONPATH"] if "PYTHONPATH" in os.environ else "")}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", type=int, default=100)
    parser.add_argument("--epochs", type=int, default=20, help="E: each side is timed at E and 3E epochs")
    parser.add_argument("--processes", type=int, default=1, help="processes (one thread each) trained at once")
    parser.add_argument("--dropout-at", default="attention", choices=["embedding+attention", "attention"])
    parser.add_argument("--compile", action="store_true", help="train the population with compile=True")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--solo-worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--first", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--count", type=int, default=1, help=argparse.SUPPRESS)
    parser.add_argument("--worker-epochs", type=int, default=1, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        return _worker(args)
    E = args.epochs
    result = {}
    for side, solo in (("one at a time (interp train)", True), ("batched population", False)):
        short, long = _wall(args, E, solo), _wall(args, 3 * E, solo)
        models = args.processes if solo else args.models
        rate = (long - short) / (2 * E * models)  # wall seconds per model-epoch, steady state
        result[side] = rate
        print(
            f"{side:30s}: {rate:.4f} s per model-epoch (wall, {args.processes} process(es)); fixed cost "
            f"{short - rate * E * models:.1f} s per run of {models} model(s)"
        )
    solo, batched = result["one at a time (interp train)"], result["batched population"]
    print(
        f"seed config (d 32, 16 heads), dropout at {args.dropout_at}, compile={args.compile}, "
        f"{args.processes} process(es) x 1 thread"
    )
    print(
        f"speed-up {solo / batched:.1f}x; 100 models x 900 epochs: {batched * 100 * 900 / 60:.1f} min batched, "
        f"{solo * 100 * 900 / 3600:.1f} h one at a time (steady state, plus the fixed cost)"
    )
    print(json.dumps({"solo_s_per_model_epoch": solo, "batched_s_per_model_epoch": batched, "ratio": solo / batched}))


if __name__ == "__main__":
    main()
