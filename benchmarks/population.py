"""Throughput of batched population training (interp.population) against training the same models one at a time
with interp.training.train, measured in the same run on the seed's configuration (d_model 32, 16 heads, d_head 2,
7,500 training sentences, batch 128): model-epochs per second, and the ratio.

    .venv/bin/python benchmarks/population.py [--models 100] [--epochs 1] [--solo 2] [--threads 1]
        [--dropout-at embedding+attention|attention] [--compile]

``--compile`` also times the population trained with ``compile=True`` (torch.compile of the token-count step; its
compilation time is included).

With ``--dropout-at attention`` (dropout on the attention output only) the population trains through the token-count
forward, O(vocab) per sequence instead of O(length); the solo runs use the same placement, so the ratio compares
like with like.

The solo rate is measured on ``--solo`` models (each trained alone for ``--epochs``) and is per model, so the
ratio does not need K solo runs. Training time only: each run's final evaluation and checkpoint write are
included in both (as ``interp train`` does them).
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import torch

from interp.model import ModelSpec
from interp.population import seed_population, train_population
from interp.training import TrainConfig, train
from tasks import get_task


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", type=int, default=100)
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--solo", type=int, default=2, help="models trained alone to measure the solo rate")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dropout-at", default="embedding+attention", choices=["embedding+attention", "attention"])
    parser.add_argument("--compile", action="store_true", help="also time compile=True")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    task = get_task("noisy-majority")
    spec = ModelSpec(**task.default_spec())
    cfg = TrainConfig(epochs=args.epochs, dropout_at=args.dropout_at)
    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.perf_counter()
        for s in range(args.solo):
            train(task, spec.__class__(**{**spec.to_dict(), "init_seed": s}), TrainConfig(epochs=args.epochs, seed=s, dropout_at=args.dropout_at),
                  Path(tmp) / f"solo{s}.safetensors", device=args.device, progress=False)
        solo = (time.perf_counter() - t0) / (args.solo * args.epochs)  # seconds per model-epoch
        specs, cfgs = seed_population(task, spec, cfg, range(args.models))
        rates = {}
        for compiled in (False, True) if args.compile else (False,):
            t0 = time.perf_counter()
            train_population(task, specs, cfgs, [Path(tmp) / f"pop{s}.safetensors" for s in range(args.models)],
                             device=args.device, progress=True, compile=compiled)
            rates[compiled] = (time.perf_counter() - t0) / (args.models * args.epochs)
    print(f"device {args.device}, {torch.get_num_threads()} thread(s); seed config, {args.epochs} epoch(s), "
          f"dropout at {args.dropout_at}")
    print(f"one at a time (interp train, {args.solo} models): {solo:8.3f} s per model-epoch")
    for compiled, batched in rates.items():
        name = f"batched population of {args.models}" + (", compiled" if compiled else "")
        print(f"{name + ':':40s} {batched:8.3f} s per model-epoch; speed-up {solo / batched:.1f}x; 100 models x 900 "
              f"epochs: {batched * 100 * 900 / 60:.0f} min on these threads")
    print(f"100 models x 900 epochs one at a time: {solo * 100 * 900 / 3600:.1f} h")


if __name__ == "__main__":
    main()
