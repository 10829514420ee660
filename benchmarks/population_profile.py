"""Where a population's epoch goes: cProfile of ``train_population`` for one configuration of
benchmarks/population.py (default ``counts-32``, K = 100, compiled), one thread.

    .venv/bin/python benchmarks/population_profile.py [--config counts-32] [--models 100] [--epochs 1] [--no-compile]

Runs 1 epoch (warm-up: compilation), then E epochs under cProfile (wall clock) and prints the population's own
seconds by part (the provenance's ``population.seconds``: ``train``, ``validation``, ``final_evaluation``, ...) and
the functions by own time and by cumulative time. The profiled run includes model building, the final evaluation
and the checkpoint writes (one each per run, against E epochs); cProfile's cost per Python call is in it too.
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from population import _positive, _recipe  # the benchmark's configurations


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default="counts-32")
    parser.add_argument("--models", type=_positive, default=100)
    parser.add_argument("--epochs", type=_positive, default=1)
    parser.add_argument("--no-compile", dest="compile", action="store_false")
    parser.add_argument("--rows", type=_positive, default=40, help="functions printed per table")
    args = parser.parse_args()
    task, spec, cfg, _kind = _recipe(args.config)
    import torch

    from interp.population import seed_population, train_population

    torch.set_num_threads(1)
    K = args.models

    def run(epochs: int, tmp: Path) -> tuple[float, dict[str, float]]:
        specs, cfgs = seed_population(task, spec, replace(cfg, epochs=epochs), range(K))
        folder = Path(tempfile.mkdtemp(dir=tmp))
        cpu = time.process_time()
        prov = train_population(
            task,
            specs,
            cfgs,
            [folder / f"p{s}.safetensors" for s in range(K)],
            device="cpu",
            progress=False,
            compile=args.compile,
        )
        return time.process_time() - cpu, prov[0]["population"]["seconds"]

    with tempfile.TemporaryDirectory() as tmp:
        print("warm-up (1 epoch): CPU s, wall s by part:", *run(1, Path(tmp)), flush=True)
        prof = cProfile.Profile()
        prof.enable()
        cpu, seconds = run(args.epochs, Path(tmp))
        prof.disable()
    print(f"{args.config}, K = {K}, {args.epochs} epoch(s) profiled: {cpu:.2f} CPU s; wall s by part: {seconds}")
    stats = pstats.Stats(prof)
    stats.sort_stats("tottime").print_stats(args.rows)
    stats.sort_stats("cumtime").print_stats(args.rows)


if __name__ == "__main__":
    main()
