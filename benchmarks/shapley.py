"""Exact Shapley values of all 16 heads of the shipped noisy-majority model (d=32, 16 heads): every one of the
2^16 = 65,536 coalition values, batched, against the naive way measured in the same run.

    .venv/bin/python benchmarks/shapley.py [--checkpoint noisy-majority] [--threads 2] [--naive 8]
                                           [--naive-svc 100] [--no-separation]

v = learned accuracy (1,000 test sequences): batched = ``shapley(coalition_values(...))`` (answer cache, then one small
matmul over all coalitions); naive = one ``run_with_hooks`` pass over the test data per coalition
(``learned_accuracy_loop``), timed on ``--naive`` random coalitions and extrapolated to
65,536.

v = separation accuracy (LinearSVC C=1000 on the heads' outputs, 7,500 train / 1,000 test sequences): batched =
``coalition_values(..., value="separation", solver="torch")`` (analyses.batched_svc); naive = one scikit-learn
``LinearSVC`` fit per coalition (``solver="sklearn"``), timed on ``--naive-svc`` random coalitions and
extrapolated. Both include their own forward passes. The values on the sampled coalitions are compared.
"""

from __future__ import annotations

import argparse

import torch
from timing import timed  # benchmarks/timing.py (the script's folder is on sys.path)

from interp.analyses.coalitions import coalition_evaluator, coalition_values
from interp.analyses.reference import learned_accuracy_loop
from interp.analyses.shapley import shapley_values
from interp.tasks import load_checkpoint


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--checkpoint", default="noisy-majority")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--naive", type=int, default=8, help="coalitions timed with the naive loop (learned accuracy)")
    p.add_argument("--naive-svc", type=int, default=100, help="coalitions timed with one LinearSVC each")
    p.add_argument("--no-separation", action="store_true", help="skip the separation value (the slow half)")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    ckpt = load_checkpoint(args.checkpoint, device="cpu")
    model, task = ckpt.model, ckpt.task
    test, train = task.dataset("test"), task.dataset("train")
    n = model.cfg.n_layers * model.cfg.n_heads
    total = 1 << n
    print(
        f"{ckpt.path}: {n} heads, {total:,} coalitions; {len(train)} train / {len(test)} test sequences; "
        f"{torch.get_num_threads()} torch threads"
    )
    gen = torch.Generator().manual_seed(0)

    # learned accuracy
    res, t_fast = timed(lambda: shapley_values(model, test, value="learned-accuracy", method="exact", task=task))
    print(
        f"learned accuracy, exact Shapley (all {total:,} coalitions): {t_fast:8.2f} s; "
        f"efficiency gap {res.efficiency_gap:.1e}"
    )
    idx = torch.randint(0, total, (args.naive,), generator=gen)
    heads = res.heads
    subsets = [[h for i, h in enumerate(heads) if int(m) >> i & 1] for m in idx]
    naive, t_naive = timed(lambda: learned_accuracy_loop(model, test, heads=subsets, task=task))
    cv = coalition_evaluator(model, test, value="learned-accuracy", task=task)(idx)
    same = float((naive.accuracy.double() - cv).abs().max())
    est = t_naive / len(idx) * total
    print(
        f"  naive run_with_hooks per coalition: {t_naive:8.2f} s for {len(idx)} coalitions -> {est:8.1f} s for "
        f"{total:,} (extrapolated); max difference on them {same:.1e}"
    )
    print(f"  speed-up: {est / t_fast:8.1f}x")

    if not args.no_separation:
        sep, t_sep = timed(lambda: coalition_values(model, test, value="separation", train=train, task=task))
        res_s = sep.shapley()
        print(
            f"separation accuracy, exact Shapley (all {total:,} SVC fits, batched torch): {t_sep:8.2f} s; "
            f"efficiency gap {res_s.efficiency_gap:.1e}"
        )
        idx = torch.randint(0, total, (args.naive_svc,), generator=gen)
        ref, t_sk = timed(
            lambda: coalition_evaluator(model, test, value="separation", train=train, task=task, solver="sklearn")(idx)
        )
        diff = (ref - sep.values[idx]).abs() * len(test)
        est = t_sk / len(idx) * total
        print(
            f"  naive LinearSVC per coalition: {t_sk:8.2f} s for {len(idx)} coalitions -> {est:8.1f} s for "
            f"{total:,} (extrapolated); same test accuracy within one sequence on "
            f"{float((diff <= 1 + 1e-9).float().mean()):.1%} of them (max {float(diff.max()):.0f} sequences)"
        )
        print(f"  speed-up: {est / t_sep:8.1f}x")
        print("heads by Shapley (learned accuracy | separation):")
        for i, name in enumerate(res.names):
            print(f"  {name:<6} {float(res.shapley[i]):8.4f} | {float(res_s.shapley[i]):8.4f}")


if __name__ == "__main__":
    main()
