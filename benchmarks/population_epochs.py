"""A population's epochs timed from inside one run: the CPU seconds of each epoch's training and validation, per
model-epoch, against the FLOP floor of ``benchmarks/population.py``.

Why a second measure: ``population.py`` times a run of E epochs and one of 3E and divides the difference, so
whatever differs between two runs in one process (the run after the warm-up is the slower; a full collection of
Python's garbage collector, ~0.3 s with torch.compile's objects on the heap, lands in one run and not the other)
enters the result, as large as the quantity measured at E = 2 and K = 100. Here each side runs in a fresh process
(a one-epoch warm-up, then one run of ``--epochs``), the CPU time is read at each of the population's own laps
(``interp.population._lap``: ``train``, ``validation``, ...), and the epochs after the first ``--skip`` are kept:
the steady state a long run sees. The sides alternate (ours, before, ours, ...), so a slow spell of a shared
machine falls on both.

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/population_epochs.py --config counts-32 --before ../before
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import population as bench  # this folder's population.py: recipes, floors, checkout import


def _worker(args) -> None:
    """One side: prints one JSON line, the CPU ms per model-epoch of each kept epoch (training + validation)."""
    if args.code:
        bench._use_checkout(args.code)
    import torch

    torch.set_num_threads(1)
    import interp.population as ip

    laps: list[tuple[str, float]] = []
    original = ip._lap

    def lap(clock, key, since):
        now = original(clock, key, since)
        laps.append((key, time.process_time()))
        return now

    ip._lap = lap
    task, spec, cfg, _kind = bench._recipe(args.config)
    K = args.models
    with tempfile.TemporaryDirectory() as tmp:
        for epochs in (1, args.epochs):  # a warm-up (compilation, first-touch allocations), then the timed run
            laps.clear()
            folder = Path(tempfile.mkdtemp(dir=tmp))
            specs, cfgs = ip.seed_population(task, spec, replace(cfg, epochs=epochs), range(K))
            outs = [folder / f"p{s}.safetensors" for s in range(K)]
            ip.train_population(task, specs, cfgs, outs, device="cpu", progress=False, compile=args.compile)
    # each lap's CPU seconds since the one before; an epoch is a train lap and the validation lap after it
    spans = [(key, t - laps[i - 1][1]) for i, (key, t) in enumerate(laps) if i > 0]
    train = [s for key, s in spans if key == "train"]  # the first epoch's train lap has no lap before it: dropped
    val = [s for key, s in spans if key == "validation"][1:]
    epochs = [(t + v) / K * 1e3 for t, v in zip(train, val)][max(0, args.skip - 1) :]
    print(json.dumps({"ms": epochs}))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default="counts-32", choices=list(bench.CONFIGS))
    parser.add_argument("--models", type=bench._positive, default=100)
    parser.add_argument("--epochs", type=bench._positive, default=6, help="epochs of the timed run")
    parser.add_argument("--skip", type=bench._positive, default=2, help="first epochs not kept (at least 1)")
    parser.add_argument("--repeats", type=bench._positive, default=2, help="processes per side")
    parser.add_argument("--before", default=None, help="another checkout of this repository, timed as 'before'")
    parser.add_argument("--no-compile", dest="compile", action="store_false")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--code", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.skip >= args.epochs:
        parser.error(f"argument --skip: must be below --epochs ({args.epochs}); got {args.skip}")
    if args.worker:
        _worker(args)
        return
    peak = bench._peak_flops()
    floor_ms = bench.floor_flops(args.config) / peak * 1e3
    sides = [("ours", None)] + ([("before", str(Path(args.before).resolve()))] if args.before else [])
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    results: dict[str, list[float]] = {name: [] for name, _ in sides}
    for r in range(args.repeats):
        for name, code in sides:
            cmd = [sys.executable, __file__, "--worker", "--config", args.config, "--models", str(args.models)]
            cmd += ["--epochs", str(args.epochs), "--skip", str(args.skip)]
            cmd += ["--code", code] if code else []
            cmd += [] if args.compile else ["--no-compile"]
            res = subprocess.run(cmd, check=False, env=env, capture_output=True, text=True)
            if res.returncode != 0:
                raise SystemExit(f"{name} failed:\n{res.stderr[-3000:]}")
            ms = json.loads(res.stdout.strip().splitlines()[-1])["ms"]
            results[name].append(statistics.median(ms))
            print(f"repeat {r + 1}/{args.repeats} {name:7s}: epochs {[round(x, 3) for x in ms]} ms per model-epoch")
    print(f"\none thread, 1024^3 sgemm: {peak / 1e9:.1f} GFLOP/s; floor {floor_ms:.3f} ms per model-epoch")
    print(f"{args.config}, K = {args.models}: CPU ms per model-epoch (training + validation), median of each process")
    for name, xs in results.items():
        med = statistics.median(xs)
        print(f"{name:7s} {[round(x, 3) for x in xs]}  median {med:.3f}  x floor {med / floor_ms:.1f}")


if __name__ == "__main__":
    main()
