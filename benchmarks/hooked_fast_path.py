"""Learned accuracies of a two-layer ``linear:elu+window:8`` noisy-majority model (the hook method, zero ablation:
what a report's Shapley section runs) through the fast attention forward under hooks
(:func:`interp.fast_attention.run_with_hooks`, "after") against TransformerLens' ``O(n²)`` hooked forward ("before",
the fast path turned off for hooked runs), in one process so load on the machine hits both alike; the accuracies are
checked equal.

    OMP_NUM_THREADS=1 python benchmarks/hooked_fast_path.py [--examples 50] [--subsets 8] [--repeats 1]
"""

import argparse
import random
import time

import torch

import interp.fast_attention as fa
from interp.analyses import learned_accuracy
from interp.model import ModelSpec, build_model
from interp.tasks import get_task


def main(n: int = 50, n_subsets: int = 8, repeats: int = 1) -> None:
    torch.set_num_threads(1)
    task = get_task("noisy-majority", test_size=n)
    spec = ModelSpec(**{**task.default_spec(), "n_layers": 2, "attention": "linear:elu+window:8"})
    model = build_model(spec, device="cpu")
    data = task.dataset("test")
    longest = data.tokens.shape[1]
    print(f"d_model {spec.d_model}, {spec.n_heads} heads x 2 layers, {len(data)} examples, length up to {longest}")
    heads = [f"L{l}H{h}" for l in range(2) for h in range(spec.n_heads)]
    rng = random.Random(0)
    subsets = [rng.sample(heads, rng.randint(0, len(heads))) for _ in range(n_subsets)]
    on = fa.fires_on_fast_path
    seconds: dict[str, list[float]] = {"before": [], "after": []}
    accuracy = {}
    try:
        for _ in range(repeats):
            for mode in ("before", "after"):
                fa.fires_on_fast_path = on if mode == "after" else (lambda hooks: False)
                t = time.perf_counter()
                accuracy[mode] = learned_accuracy(model, data, heads=subsets, task=task, method="hooks").accuracy
                seconds[mode].append(time.perf_counter() - t)
    finally:
        fa.fires_on_fast_path = on
    assert torch.equal(accuracy["before"], accuracy["after"]), "the two paths disagree"
    print({k: [round(s, 2) for s in v] for k, v in seconds.items()})
    print(f"before / after (best of {repeats}): {min(seconds['before']) / min(seconds['after']):.1f}x")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--examples", type=int, default=50, help="test sequences (default 50)")
    parser.add_argument("--subsets", type=int, default=8, help="random head subsets (default 8)")
    parser.add_argument("--repeats", type=int, default=1, help="timings of each path; the best is compared")
    args = parser.parse_args()
    main(args.examples, args.subsets, args.repeats)
