"""Population training against one model trained alone, on one device (a GPU where there is one): wall seconds per
model-epoch, synchronised, in one run.

    python benchmarks/population_device.py [--device cuda] [--runs counts-32:100:eager,counts-32:1:solo,...]
        [--epochs 1] [--json FILE]

Each run is ``CONFIG:K:SIDE``: a configuration of ``benchmarks/population.py`` (the thesis's noisy majority, Table 1's
recipe: ``counts-2``, ``counts-8``, ``counts-32``, ``counts-32-counter``, ``positions``, ``positions-counter``,
``prefix-counts``), K models, and a side: ``eager`` or ``compiled`` (``train_population`` of K seeds, ``compile=``
off or on) or ``solo`` (``interp.training.train`` of seed 0; K is then 1). A run trains 1 epoch (warm-up:
compilation, the device's first allocations and kernels), then E and 3E epochs; the rate is the difference over the
2E extra epochs per model, so model building, compilation, the final evaluation and the checkpoint writes are on
neither side (as ``benchmarks/population.py``, which times one CPU thread in CPU seconds; on a GPU the wall clock,
after ``torch.cuda.synchronize``, is what counts). The printed ratio is the solo rate of the same configuration over
the side's, where both were run.

Written for a GPU session (docs/gpu.md), where a population's step is bound by kernel launches, not arithmetic;
on the CPU it runs too (``--device cpu``), with the torch threads ``--threads`` sets.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from population import CONFIGS, _positive, _recipe  # the sibling script, found by the line above

SIDES = ("eager", "compiled", "solo")
DEFAULT_RUNS = "counts-32:100:eager,counts-32:1:solo,positions:30:eager,positions:1:solo,counts-32:100:compiled"


def _run_spec(text: str) -> tuple[str, int, str]:
    """``CONFIG:K:SIDE`` -> (config, K, side); argparse's usage error names what is wrong."""
    parts = text.split(":")
    if len(parts) != 3:
        raise argparse.ArgumentTypeError(f"expected CONFIG:K:SIDE (e.g. counts-32:100:eager), got {text!r}")
    config, k, side = parts
    if config not in CONFIGS:
        raise argparse.ArgumentTypeError(f"unknown configuration {config!r} in {text!r}; expected one of {CONFIGS}")
    if side not in SIDES:
        raise argparse.ArgumentTypeError(f"unknown side {side!r} in {text!r}; expected one of {SIDES}")
    if not k.isdigit() or int(k) < 1 or (side == "solo" and int(k) != 1):
        raise argparse.ArgumentTypeError(f"K must be a positive integer (1 for solo) in {text!r}, got {k!r}")
    return config, int(k), side


def _runs(text: str) -> list[tuple[str, int, str]]:
    return [_run_spec(t.strip()) for t in text.split(",") if t.strip()]


def _seconds(device: str, task, spec, cfg, K: int, side: str, epochs: int) -> float:
    """Wall seconds of one run of ``epochs`` epochs, the device synchronised at both ends."""
    import torch

    from interp.population import seed_population, train_population
    from interp.training import train

    def sync() -> None:
        if torch.device(device).type == "cuda":
            torch.cuda.synchronize(device)

    c = replace(cfg, epochs=epochs)
    with tempfile.TemporaryDirectory() as tmp:
        sync()
        started = time.perf_counter()
        if side == "solo":
            train(
                task,
                replace(spec, init_seed=0),
                replace(c, seed=0),
                Path(tmp) / "s.safetensors",
                device=device,
                progress=False,
            )
        else:
            specs, cfgs = seed_population(task, spec, c, range(K))
            outs = [Path(tmp) / f"p{s}.safetensors" for s in range(K)]
            train_population(task, specs, cfgs, outs, device=device, progress=False, compile=side == "compiled")
        sync()
        return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default=None, help="cpu, cuda or cuda:N (default: CUDA where there is one)")
    parser.add_argument("--runs", type=_runs, default=DEFAULT_RUNS, help="CONFIG:K:SIDE,...")
    parser.add_argument("--epochs", type=_positive, default=1, help="E: the timed runs are E and 3E epochs")
    parser.add_argument("--threads", type=_positive, default=1, help="torch's CPU threads")
    parser.add_argument("--json", default=None, help="also write every measurement to this file")
    args = parser.parse_args()
    import torch

    from interp.device import pick_device
    from interp.errors import InterpError

    torch.set_num_threads(args.threads)
    try:
        device = str(pick_device(args.device))
    except InterpError as e:
        parser.error(f"argument --device: {e}")
    name = torch.cuda.get_device_name(device) if device.startswith("cuda") else "cpu"
    print(f"device {device} ({name}), torch {torch.__version__}, {args.threads} CPU thread(s), E = {args.epochs}")
    rows, solo = [], {}
    for config, K, side in args.runs:
        task, spec, cfg, _kind = _recipe(config)
        warm = _seconds(device, task, spec, cfg, K, side, 1)
        one = _seconds(device, task, spec, cfg, K, side, args.epochs)
        three = _seconds(device, task, spec, cfg, K, side, 3 * args.epochs)
        rate = (three - one) / (2 * args.epochs * K)
        row = {"config": config, "K": K, "side": side, "device": device, "warmup_s": warm, "s_per_model_epoch": rate}
        if side == "solo":
            solo[config] = rate
        rows.append(row)
        print(f"{config:18s} {side:9s} K={K:<4d} {rate:.5f} s per model-epoch (warm-up {warm:.1f} s)", flush=True)
    for row in rows:
        if row["side"] != "solo" and row["config"] in solo:
            row["solo_over_side"] = solo[row["config"]] / row["s_per_model_epoch"]
            print(f"{row['config']:18s} {row['side']:9s} solo / side {row['solo_over_side']:.1f}x")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1) + "\n")


if __name__ == "__main__":
    main()
