"""The exact SVCs of every head coalition, C solver against the batched torch solver (``analyses/svc_native.py``,
``analyses/batched_svc.py``), in one process, interleaved, on the features Table 1's halving scores.

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/svc_engines.py [--rounds 3] [--checkpoint noisy-majority]
        [--halving-seed 0] [--no-halving]

Two problems, 16 heads each (65,536 coalitions, one squared-hinge SVC of C = 1000 each, 7,500 train sequences):

- ``shipped``: the shipped model's heads (trained 900 epochs: near-separable, a few dozen violators a coalition),
  scored on its 1,000 test sequences, as ``interp shapley --value separation`` does;
- ``halving``: a d = 32 model of Table 1's recipe (the shipped ``sweep.json``'s d = 32 plan, shapley-svc halving,
  seed ``--halving-seed``) trained until its first halving step (~25 epochs, about a minute) and scored on the
  validation split, as that step does: a hundred or more violators a coalition.

Each round times both engines' ``svc_test_accuracy`` on all coalitions (CPU seconds, one thread, the order
alternating) and counts the coalitions whose test accuracies differ (each engine stops within 1e-9 of the same
minimiser). Prints each round, the medians, their ratio, the microseconds per coalition, and the floor the C solver
is measured against: one pass over every sample's margin at the solution per coalition (the least an exact check
of optimality reads), ``2 N (p - 1)`` flops for a coalition of ``p`` columns, as a rate.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

from batched_svc_step import _features  # the shipped model's coalition features
from population import _positive  # the benchmarks' count argument

TABLE1 = Path(__file__).resolve().parents[1] / "examples" / "results" / "seed_regime" / "table1" / "sweep.json"


class _Scored(Exception):
    """Raised by the stand-in scorer once it has the halving step's features."""


def _halving(seed: int):
    """Train Table 1's d = 32 shapley-svc run of ``seed`` until its first halving step; the features that step's
    Shapley scoring fits (train split) and scores (validation split)."""
    import tempfile

    from interp.analyses.answer_cache import cache_answer
    from interp.analyses.coalitions import separation_features
    from interp.heads import one_set
    from interp.model import ModelSpec
    from interp.tasks import get_task
    from interp.training import TrainConfig, train

    plan = next(p for p in json.loads(TABLE1.read_text())["plans"] if p["spec"]["d_model"] == 32)
    task = get_task(plan["task"], **plan["task_params"])
    cfg = TrainConfig(**{**plan["cfg"], "halving": "shapley-svc", "seed": seed})
    got = {}

    def scorer(model, task, heads, train_data, val_data):
        tr = cache_answer(model, train_data, attention=False)
        te = cache_answer(model, val_data, attention=False)
        players = one_set(heads, model.cfg.n_layers, model.cfg.n_heads)
        got["features"] = separation_features(tr, te, players)
        raise _Scored

    with tempfile.TemporaryDirectory() as out:
        try:
            train(task, ModelSpec(**plan["spec"]), cfg, Path(out) / "run", head_scorer=scorer)
        except _Scored:
            return got["features"]
    raise SystemExit(f"seed {seed} never reached its halving threshold")


def _compare(name: str, features, rounds: int) -> None:
    import torch

    from interp.analyses.batched_svc import engine_status, svc_test_accuracy

    if engine_status() != "c":
        raise SystemExit(f"the C solver is not available here: {engine_status()}")
    x_tr, y_tr, x_te, y_te = features
    N, n, e = x_tr.shape
    index = torch.arange(1 << n)
    print(f"{name}: {n} heads x {e}, {len(index):,} coalitions, {N:,} train / {len(x_te):,} test sequences")
    seconds: dict[str, list[float]] = {"c": [], "torch": []}
    for r in range(rounds):
        acc = {}
        for engine in ("c", "torch") if r % 2 == 0 else ("torch", "c"):
            start = time.process_time()
            acc[engine] = svc_test_accuracy(x_tr, y_tr, x_te, y_te, index, engine=engine)
            seconds[engine].append(time.process_time() - start)
        differ = int((acc["c"] != acc["torch"]).sum())
        print(
            f"  round {r}: C {seconds['c'][-1]:7.2f} s, torch {seconds['torch'][-1]:7.2f} s; test accuracies differ "
            f"on {differ} of {len(index):,} coalitions"
        )
    med = {k: statistics.median(v) for k, v in seconds.items()}
    p = 1 + e * ((index[:, None] >> torch.arange(n)) & 1).sum(-1)
    flops = float((2 * N * (p - 1)).sum())
    print(
        f"  medians: C {med['c']:.2f} s ({1e6 * med['c'] / len(index):.0f} us a coalition), "
        f"torch {med['torch']:.2f} s; torch / C {med['torch'] / med['c']:.2f}x"
    )
    print(
        f"  floor: one margin pass per coalition, {flops / 1e9:.1f} GFLOP; the C solver's whole time is "
        f"{flops / 1e9 / med['c']:.2f} GFLOP/s of it"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=_positive, default=3)
    parser.add_argument("--checkpoint", default="noisy-majority")
    parser.add_argument("--halving-seed", type=int, default=0)
    parser.add_argument("--no-halving", action="store_true", help="skip the halving step's problem (its training)")
    args = parser.parse_args()
    import torch

    torch.set_num_threads(1)
    _compare(f"shipped {args.checkpoint}", _features(args.checkpoint), args.rounds)
    if not args.no_halving:
        start = time.perf_counter()
        features = _halving(args.halving_seed)
        print(
            f"(trained Table 1's d = 32 seed {args.halving_seed} to its first halving step in "
            f"{time.perf_counter() - start:.0f} s)"
        )
        _compare(f"halving, d = 32 seed {args.halving_seed}", features, args.rounds)


if __name__ == "__main__":
    main()
