"""Learned accuracy of all 136 single heads and pairs of the shipped noisy-majority model (d=32, 16 heads) on
its 1,000 test sequences: the batched paths of analyses/learned_accuracies.py against the naive loop (one
``run_with_hooks`` pass over the data per subset), measured in the same run, results checked equal.

    .venv/bin/python benchmarks/learned_accuracy.py [--checkpoint noisy-majority] [--device cpu] [--n-test 1000]
                                                    [--generic] [--threads N]

Batched paths timed (each includes its own forward pass over the data):
  cached (TL cache)  -- hook_z at '=' from ``run_with_cache`` once, then all subsets recombined;
  cached (query)     -- the same recombination, with hook_z computed by the exact query-restricted forward;
  generic hooks      -- (with --generic) one forward per group of subsets with a subset axis (any depth).
"""

from __future__ import annotations

import argparse

import torch
from timing import timed  # benchmarks/timing.py (the script's folder is on sys.path)

from interp.analyses.answer_cache import cache_answer
from interp.analyses.learned_accuracies import head_subsets, learned_accuracy
from interp.analyses.reference import learned_accuracy_loop
from interp.device import model_device
from interp.tasks import load_checkpoint


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--checkpoint", default="noisy-majority")
    p.add_argument("--device", default=None)
    p.add_argument("--n-test", type=int, default=1000)
    p.add_argument(
        "--generic", action="store_true", help="also time the generic batched hook path (as slow as the loop on CPU)"
    )
    p.add_argument("--threads", type=int, default=None)
    args = p.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    ckpt = load_checkpoint(args.checkpoint, device=args.device)
    model, task = ckpt.model, ckpt.task
    data = task.dataset("test").select(slice(0, args.n_test))
    cfg = model.cfg
    subsets = head_subsets(cfg.n_layers, cfg.n_heads, 1) + head_subsets(cfg.n_layers, cfg.n_heads, 2)
    dev = model_device(model)
    print(
        f"{ckpt.path}: {cfg.n_layers} layer(s), {cfg.n_heads} heads; {len(subsets)} subsets x {len(data)} test "
        f"sequences on {dev} ({torch.get_num_threads()} threads)"
    )

    def sync():
        if dev.type == "cuda":
            torch.cuda.synchronize()

    def run(fn):
        def go():
            out = fn()
            sync()
            return out

        return timed(go)

    tl, t_tl = run(
        lambda: learned_accuracy(model, cache_answer(model, data, attention=False, method="hooks"), heads=subsets)
    )
    print(f"batched, cached (TL run_with_cache): {t_tl:8.2f} s")
    q, t_q = run(
        lambda: learned_accuracy(model, cache_answer(model, data, attention=False, method="fast"), heads=subsets)
    )
    print(f"batched, cached (query forward)    : {t_q:8.2f} s")
    if args.generic:
        g, t_g = run(lambda: learned_accuracy(model, data, heads=subsets, method="hooks"))
        print(f"batched, generic hooks             : {t_g:8.2f} s")
    naive, t_naive = run(lambda: learned_accuracy_loop(model, data, heads=subsets))
    print(f"naive loop (run_with_hooks/subset) : {t_naive:8.2f} s")
    same = torch.equal(tl.accuracy, naive.accuracy) and torch.equal(q.accuracy, naive.accuracy)
    if args.generic:
        same = same and torch.equal(g.accuracy, naive.accuracy)
    print(f"results identical to the naive loop: {same}")
    print(f"speed-up (TL cache)    : {t_naive / t_tl:8.1f}x")
    print(f"speed-up (query cache) : {t_naive / t_q:8.1f}x")
    if args.generic:
        print(f"speed-up (generic)     : {t_naive / t_g:8.1f}x")
    best = torch.argsort(naive.accuracy, descending=True)[:3].tolist()
    print("best subsets: " + ", ".join(f"{naive.names[i]} {naive.accuracy[i]:.3f}" for i in best))
    if not same:
        raise SystemExit("batched and naive results differ")


if __name__ == "__main__":
    main()
