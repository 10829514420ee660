"""The batched exact SVCs of every head coalition (``analyses/batched_svc.py``) of this checkout against another
checkout's, in one process, interleaved: an A/B for a change to the solver on a shared machine, where two runs
minutes apart differ by more than the change.

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/batched_svc_step.py --before ../before [--rounds 3]
        [--checkpoint noisy-majority]

``--before`` is another checkout of this repository (e.g. ``git worktree add ../before <commit>``); its
``analyses/batched_svc.py`` is loaded as a second module beside this checkout's. The features are the shipped
model's, as exact Shapley values of separation accuracy use them (``analyses.coalitions``): each head's output at the
answer position, centred at the train mean, 7,500 train and 1,000 test sequences, 16 heads, so 65,536 coalitions,
one LinearSVC problem each. Each round times both sides' ``svc_test_accuracy`` on all of them (CPU seconds, one
thread, the sides' order alternating) and checks that the two give the same test accuracy on every coalition.
Prints each side's seconds per round, the median and the ratio of the medians.
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from population import _positive  # the benchmarks' count argument


def _other_solver(path: Path):
    """``path``, another checkout's ``analyses/batched_svc.py``, as the module ``_batched_svc_before``."""
    spec = importlib.util.spec_from_file_location("_batched_svc_before", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def _features(checkpoint: str):
    """The coalition features of ``checkpoint``'s heads, as ``analyses.coalitions`` builds them for separation."""
    from interp.analyses.answer_cache import cache_answer
    from interp.analyses.coalitions import separation_features
    from interp.tasks import load_checkpoint

    ckpt = load_checkpoint(checkpoint, device="cpu")
    model, task = ckpt.model, ckpt.task
    tr = cache_answer(model, task.dataset("train"), attention=False)
    te = cache_answer(model, task.dataset("test"), attention=False)
    heads = [(layer, h) for layer in range(model.cfg.n_layers) for h in range(model.cfg.n_heads)]
    return separation_features(tr, te, heads)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", type=Path, required=True, help="another checkout of this repository")
    parser.add_argument("--rounds", type=_positive, default=3)
    parser.add_argument("--checkpoint", default="noisy-majority")
    args = parser.parse_args()
    solver = args.before.resolve() / "analyses" / "batched_svc.py"
    if not solver.is_file():
        parser.error(
            f"argument --before: no analyses/batched_svc.py in {args.before} (expected a checkout of this project)"
        )
    import torch

    import interp.analyses.batched_svc as ours

    torch.set_num_threads(1)
    before = _other_solver(solver)
    x_tr, y_tr, x_te, y_te = _features(args.checkpoint)
    n = x_tr.shape[1]
    if n > 20:
        raise SystemExit(f"{args.checkpoint}: {n} heads, 2^{n} coalitions; this benchmark takes at most 20 heads")
    index = torch.arange(1 << n)
    print(
        f"{args.checkpoint}: {n} heads, {len(index):,} coalitions, {len(x_tr):,} train / {len(x_te):,} test; "
        f"one thread; before = {args.before}"
    )
    seconds: dict[str, list[float]] = {"before": [], "ours": []}
    for r in range(args.rounds):
        acc = {}
        for name in ("before", "ours") if r % 2 == 0 else ("ours", "before"):
            module = before if name == "before" else ours
            start = time.process_time()
            acc[name] = module.svc_test_accuracy(x_tr, y_tr, x_te, y_te, index)
            seconds[name].append(time.process_time() - start)
        differ = int((acc["ours"] != acc["before"]).sum())
        print(
            f"round {r}: before {seconds['before'][-1]:7.2f} s, ours {seconds['ours'][-1]:7.2f} s; "
            f"test accuracies differ on {differ} of {len(index):,} coalitions"
        )
    med = {k: statistics.median(v) for k, v in seconds.items()}
    ratio = med["before"] / med["ours"]
    print(f"medians: before {med['before']:.2f} s, ours {med['ours']:.2f} s; before / ours {ratio:.2f}x")


if __name__ == "__main__":
    main()
