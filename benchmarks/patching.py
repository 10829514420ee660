"""Activation-patching sweeps of the shipped induction model (``repeated-tokens``: 2 layers x 2 heads, 33 tokens):
the batched sweeps of analyses/patching.py against TransformerLens' serial ``patching.get_act_patch_*`` functions
(one forward pass and one ``.item()`` per patched index), on the same inputs and metric, in the same run; results
checked equal.

    .venv/bin/python benchmarks/patching.py [--pairs 1 4 16 64] [--repeats 3] [--threads 1] [--device cpu]

Inputs: ``interp.analyses.repeated_tokens.corrupted_pair(task, n, kind="key")`` (the query token's earlier occurrence
moved), metric: logit difference at the answer, denoising (TransformerLens' convention: corrupted run, clean cache).
Sweeps: every head x position of ``hook_z`` (132 patches), every position of ``resid_pre`` (66), and every head x
query row of the attention pattern (132). Path patching (TransformerLens has no function for it) is timed against a
loop of one ``run_with_hooks`` per (sender, receiver, input) that adds the sender's change of output to that input.
Times are the best of ``--repeats``; TransformerLens' tqdm bar is switched off so that it is not counted against it.

Where the gain comes from (all exact): the patched variants of a layer are stacked along the batch axis; each
stacked run starts at the patched layer from the base run's cached residual stream; a patched ``z`` of an
attention-only layer is added to the cached output of that layer (``z W_O``) instead of running it again; variants
that patch nothing that differs between the runs, or only positions after the answer (causal attention), are the
base run and are not run; only the answer position is unembedded.
"""

from __future__ import annotations

import argparse
import time

import torch
import transformer_lens.patching as tl_patching

from interp.analyses.patching import activation_patching, path_patching
from interp.analyses.reference import path_patching_loop, variant_metric
from interp.analyses.repeated_tokens.corrupt import corrupted_pair
from interp.device import model_device
from interp.tasks import load_checkpoint

SWEEPS = [  # (where, per, TransformerLens function, permutation of ours to theirs)
    ("z", "head_pos", tl_patching.get_act_patch_attn_head_out_by_pos, (0, 2, 1)),
    ("resid_pre", "pos", tl_patching.get_act_patch_resid_pre, None),
    ("pattern", "head_pos", tl_patching.get_act_patch_attn_head_pattern_by_pos, None),
]


def best_of(fn, repeats: int):
    best, out = float("inf"), None
    for _ in range(repeats):
        start = time.perf_counter()
        out = fn()
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        best = min(best, time.perf_counter() - start)
    return out, best


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--checkpoint", default="repeated-tokens")
    p.add_argument("--pairs", type=int, nargs="+", default=[1, 4, 16, 64])
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--device", default="cpu")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    tl_patching.tqdm = lambda it, **kw: it  # no progress bar in the timed loop
    ckpt = load_checkpoint(args.checkpoint, device=args.device)
    model, task = ckpt.model, ckpt.task
    L, H = model.cfg.n_layers, model.cfg.n_heads
    cfg = model.cfg
    print(
        f"{ckpt.path.name}: {cfg.n_layers} layers x {cfg.n_heads} heads, {task.n_ctx} tokens, on "
        f"{model_device(model)} ({torch.get_num_threads()} thread(s)); best of {args.repeats}"
    )
    print(f"{'sweep':<20}{'pairs':>6}{'patches':>9}{'TL serial s':>13}{'batched s':>11}{'ratio':>8}{'max |diff|':>12}")
    total_tl = total_ours = 0.0
    for n in args.pairs:
        clean, corrupted = corrupted_pair(task, n, kind="key", device=args.device)
        metric = variant_metric("logit_diff", clean, corrupted).of_logits
        with torch.inference_mode():
            _, clean_cache = model.run_with_cache(clean.tokens)
        for where, per, fn, perm in SWEEPS:
            ours, t_ours = best_of(
                lambda: activation_patching(
                    model, clean, corrupted=corrupted, metric="logit_diff", where=where, per=per
                ),
                args.repeats,
            )
            with torch.inference_mode():
                theirs, t_tl = best_of(lambda: fn(model, corrupted.tokens, clean_cache, metric), args.repeats)
            theirs = theirs.cpu()
            if perm:
                theirs = theirs.permute(*perm)
            diff = float((ours.values - theirs).abs().max())
            total_tl, total_ours = total_tl + t_tl, total_ours + t_ours
            print(
                f"{where + ' ' + per:<20}{n:>6}{ours.values.numel():>9}{t_tl:>13.3f}{t_ours:>11.3f}"
                f"{t_tl / t_ours:>7.1f}x{diff:>12.2e}"
            )
        ours, t_ours = best_of(
            lambda: path_patching(model, clean, corrupted=corrupted, metric="logit_diff"), args.repeats
        )
        slow, t_slow = best_of(
            lambda: path_patching_loop(
                model,
                clean,
                corrupted=corrupted,
                metric=metric,
                senders=[(0, h) for h in range(H)],
                receivers=[(l, h) for l in range(1, L) for h in range(H)],
            ),
            args.repeats,
        )
        diff = float((ours.values - slow).abs().max())
        print(
            f"{'path q/k/v (loop)':<20}{n:>6}{ours.values.numel():>9}{t_slow:>13.3f}{t_ours:>11.3f}"
            f"{t_slow / t_ours:>7.1f}x{diff:>12.2e}"
        )
    print(
        f"all activation sweeps: TransformerLens {total_tl:.2f} s, batched {total_ours:.2f} s: "
        f"{total_tl / total_ours:.1f}x"
    )


if __name__ == "__main__":
    main()
