"""The token-count training step of this checkout against another checkout's, in one process, interleaved: an
A/B for a change to the step's forward on a shared machine, where two runs minutes apart differ by more than
the change. Not the last word: a change it measured 1.13x faster at d = 8 (the query embedding gathered, the
tables' products as one multiply-and-sum) made whole training runs 5-12% slower (the populations' own ``train``
seconds, in separate processes alternating), and was reverted; confirm a step change on whole runs too.

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/population_step.py --before ../before [--models 50]
        [--configs counts-8,counts-32] [--rounds 8] [--steps 10]

``--before`` is another checkout of this repository (e.g. ``git worktree add ../before <commit>``). Its
``interp/population.py`` is loaded as a second module beside this checkout's: the compiled token-count losses
(``_count_losses`` and what it calls there) come from each checkout, everything around the step (the population,
its mask draws, the flat Adam) from this one, so only the forward and its backward differ. (A change outside
``interp/population.py``, or one that renames what that file imports, is not measured this way.)

For each configuration of ``benchmarks/population.py`` (noisy majority, K = ``--models``, batch 128, compiled, one
thread), both sides build the same population and run 5 warm-up steps; then ``--rounds`` rounds of ``--steps``
steps each, the sides' order alternating, timed in CPU seconds. Prints each side's CPU ms per step (median, min and
every round) and the ratio of the medians, and checks that both sides' losses after the same steps agree to float32
rounding (atol 1e-4: the two forwards sum in different orders).
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from population import _positive, _recipe  # the benchmark's configurations


def _other_population(checkout: Path):
    """``interp/population.py`` of ``checkout`` as the module ``interp._population_before`` (its relative imports
    resolve to this checkout's ``interp``)."""
    path = checkout / "interp" / "population.py"
    if not path.is_file():
        raise SystemExit(f"--before {checkout}: no interp/population.py there (expected a checkout of this repository)")
    spec = importlib.util.spec_from_file_location("interp._population_before", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", type=Path, required=True, help="another checkout of this repository")
    parser.add_argument("--models", type=_positive, default=50)
    parser.add_argument("--configs", default="counts-8,counts-32")
    parser.add_argument("--rounds", type=_positive, default=8)
    parser.add_argument("--steps", type=_positive, default=10)
    args = parser.parse_args()
    import torch

    import interp.population as ours
    from interp.compiled import compiled_step

    torch.set_num_threads(1)
    before = _other_population(args.before.resolve())
    for config in args.configs.split(","):
        if not config.startswith("counts-"):
            raise SystemExit(f"{config!r}: this benchmark times the token-count step (counts-2, counts-8, counts-32)")
        task, spec, cfg, _kind = _recipe(config)
        train = task.dataset("train")
        counted = ours.token_counts(train, len(task.vocab))
        sides = {}
        for name, module in (("before", before), ("ours", ours)):
            specs, cfgs = ours.seed_population(task, spec, cfg, range(args.models))
            pop = ours._Population(task, specs, cfgs, "cpu", None, compile=True)
            pop.train_qpos = ours.target_positions(train)
            pop.train_targets = train.targets.gather(1, pop.train_qpos)
            losses_fn = compiled_step(module._count_losses, dynamic=False, device="cpu")
            perms = torch.stack([torch.randperm(len(train), generator=g) for g in pop.data_gens])
            sides[name] = {"pop": pop, "fn": losses_fn, "perms": perms, "step": 0, "ms": [], "losses": None}

        def run(side: dict, n: int) -> None:
            started = time.process_time()
            for _ in range(n):
                i = side["step"] % (len(train) // cfg.batch_size)
                side["step"] += 1
                idx = side["perms"][:, i * cfg.batch_size : (i + 1) * cfg.batch_size]
                losses = side["pop"].count_batch(counted, train, idx, side["fn"])
                side["pop"].update(losses)
                side["losses"] = losses.detach()
            side["ms"].append((time.process_time() - started) / n * 1e3)

        for side in sides.values():
            run(side, 5)  # warm-up: compilation
            side["ms"].clear()
        for r in range(args.rounds):
            for name in ("before", "ours") if r % 2 == 0 else ("ours", "before"):
                run(sides[name], args.steps)
        torch.testing.assert_close(sides["ours"]["losses"], sides["before"]["losses"], atol=1e-4, rtol=0)
        medians = {name: statistics.median(side["ms"]) for name, side in sides.items()}
        for name, side in sides.items():
            print(
                f"{config:10s} K = {args.models:3d} {name:6s}: CPU ms per step median {medians[name]:.2f}, "
                f"min {min(side['ms']):.2f}; rounds {[round(x, 2) for x in side['ms']]}"
            )
        print(f"{config:10s} before / ours (medians): {medians['before'] / medians['ours']:.2f}x")


if __name__ == "__main__":
    main()
