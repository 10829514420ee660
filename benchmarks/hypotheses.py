"""Interchange interventions and distributed alignment search, timed.

    .venv/bin/python benchmarks/hypotheses.py [--pairs 1000] [--loop-pairs 100] [--threads 1] [--device cpu]

1. IIA of ``diff = n0 - n1`` at every head of the shipped 16-head noisy-majority model (each head's output at '=',
   16 alignments) on ``--pairs`` stratified test pairs, batched (``interchange_accuracy``, ``method="auto"``, which
   here takes the last-layer shortcut), against the plain loop of one ``run_with_cache`` of the source and one
   ``run_with_hooks`` per (pair, head) (``interp.analyses.hypotheses.reference.interchange_loop``), in the same run.
   The loop runs on the first ``--loop-pairs`` pairs (16 x 1,000 hooked forwards of 200-token sentences take about
   ten minutes on one loaded core); its time is scaled to ``--pairs`` and the ratio says so. The stacked hooked
   forwards without the shortcut (``method="hooks"``) run on the same ``--loop-pairs`` pairs. Predictions are checked
   equal on those pairs.
2. DAS at one site, in seconds: a 1-dimensional subspace of the 16 heads' outputs together (32 dimensions) of the
   same model (the last-layer shortcut), and of the residual stream between the layers of the shipped
   integer-addition model where digit 2 is predicted (the hooked path: layer 1 runs on every step), 300 steps of 128
   training pairs each, with held-out IIA of the learned, 10 random and the whole site.
"""

from __future__ import annotations

import argparse
import time

import torch

from interp.analyses.hypotheses import alignments, distributed_alignment_search, interchange_accuracy
from interp.analyses.hypotheses.reference import interchange_loop
from interp.analyses.hypotheses.sites import parse_site
from interp.tasks import load_checkpoint


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--pairs", type=int, default=1000)
    p.add_argument("--loop-pairs", type=int, default=100)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--device", default="cpu")
    p.add_argument("--steps", type=int, default=300)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    from interp.analyses.noisy_majority.hypotheses import diff_model

    ck = load_checkpoint("noisy-majority", device=args.device)
    model, task = ck.model, ck.task
    data = task.dataset("test")
    cm = diff_model()
    heads = [f"L0H{h}@answer" for h in range(model.cfg.n_heads)]
    als = alignments("diff", heads)
    t0 = time.perf_counter()
    res = interchange_accuracy(model, data, causal_model=cm, alignment=als, pairs=args.pairs)
    batched = time.perf_counter() - t0
    print(f"batched (auto -> {res.info['method']}): {args.pairs} pairs x {len(als)} heads in {batched:.2f} s")
    n = min(args.loop_pairs, args.pairs)
    idx = torch.stack([res.base_index[:n], res.source_index[:n]], 1)
    t0 = time.perf_counter()
    hooked = interchange_accuracy(model, data, causal_model=cm, alignment=als, pairs=idx, method="hooks")
    hooks = time.perf_counter() - t0
    print(f"batched (hooks, no shortcut): {n} pairs x {len(als)} heads in {hooks:.2f} s")
    base = data.select(res.base_index[:n].to(data.device))
    source = data.select(res.source_index[:n].to(data.device))
    sites = [parse_site(h, model) for h in heads]
    plan = [[(s, base.answer_pos, source.answer_pos)] for s in sites]
    t0 = time.perf_counter()
    loop_pred = interchange_loop(model, base, source, plan, base.answer_pos)
    loop = time.perf_counter() - t0
    same = torch.equal(loop_pred == res.counterfactual[:, :n], res.correct[:, :n])
    same_hooks = torch.equal(hooked.correct, res.correct[:, :n])
    scaled = loop * args.pairs / n
    print(
        f"plain loop: {n} pairs x {len(als)} heads in {loop:.1f} s ({n * len(als)} run_with_hooks); scaled to "
        f"{args.pairs} pairs: {scaled:.0f} s; predictions equal to the batched ones: {same} (hooks: {same_hooks})"
    )
    print(f"ratio loop / batched (auto), {args.pairs} pairs: {scaled / batched:.0f}x")
    print(f"ratio loop / batched (hooks), {n} pairs: {loop / hooks:.1f}x")
    print(f"IIA per head: {[round(float(x), 3) for x in res.iia]}")

    t0 = time.perf_counter()
    das = distributed_alignment_search(
        model, data, causal_model=cm, variable="diff", site="L0H*@answer", k=1, steps=args.steps
    )
    rec = das.das[0]
    print(
        f"DAS {rec['site']} (dim {rec['dim']}, {rec['method']}): training {rec['seconds']:.1f} s, in all "
        f"{time.perf_counter() - t0:.1f} s; held-out IIA learned {rec['heldout_iia']:.3f}, random mean "
        f"{sum(rec['random_iia']) / len(rec['random_iia']):.3f}, whole {rec['whole_iia']:.3f}"
    )
    from interp.analyses.integer_addition.hypotheses import digit_model

    ia = load_checkpoint("integer-addition", device=args.device)
    t0 = time.perf_counter()
    das = distributed_alignment_search(
        ia.model,
        ia.task.dataset("test"),
        causal_model=digit_model(2, 5),
        variable="carry2",
        site="resid_post.0@out2",
        k=1,
        steps=args.steps,
        same=("n_digits",),
    )
    rec = das.das[0]
    print(
        f"DAS {rec['site']} of integer-addition (dim {rec['dim']}, {rec['method']}): training {rec['seconds']:.1f} s, "
        f"in all {time.perf_counter() - t0:.1f} s; held-out IIA learned {rec['heldout_iia']:.3f}, random mean "
        f"{sum(rec['random_iia']) / len(rec['random_iia']):.3f}, whole {rec['whole_iia']:.3f}"
    )


if __name__ == "__main__":
    main()
