"""Click-to-update time of the explorer (``interp.explore``) on every shipped checkpoint: from a head's switch
clicked in the page (the event as the page sends it) to the new prediction, accuracy and patterns computed and
serialised for the page, in the kernel, on one CPU thread. Against the naive way of getting the same numbers after
each click (one ``run_with_hooks`` pass over the accuracy batch per mask, as ``learned_accuracy_loop`` does,
the mean-ablation reference recomputed, and one cached forward of the example), measured in the same run; the
numbers are checked equal.

    .venv/bin/python benchmarks/explorer.py [--checkpoints noisy-majority ...] [--clicks 32] [--batch 256]
                                            [--threads 1] [--ablation zero]

The page's own share (the round trip through Jupyter's websocket and the redraw) is measured by the browser test,
tests/test_explorer_browser.py, which prints the click-to-update times it sees in Chromium.
"""

from __future__ import annotations

import argparse
import statistics

import torch
from timing import timed  # benchmarks/timing.py (the script's folder is on sys.path)

import interp
from interp import analyses
from interp.analyses.reference import learned_accuracy_loop
from interp.tasks import shipped_checkpoints


def naive_click(model, example, batch, off, ablation):
    """The numbers of one click without the explorer: the learned accuracy by one hooked pass over the batch, the
    mean-ablation reference recomputed, and the example's logits and patterns from a cached forward."""
    cfg = model.cfg
    kept = [(l, h) for l in range(cfg.n_layers) for h in range(cfg.n_heads) if interp.head_label(l, h) not in off]
    acc = learned_accuracy_loop(model, batch, heads=[kept], ablation=ablation).accuracy[0]
    z_ref = analyses.mean_head_outputs(model, batch) if ablation == "mean" else None
    mask = interp.head_mask([kept], cfg.n_layers, cfg.n_heads)[0]

    def hook(z, hook):
        m = mask[hook.layer()][None, None, :, None]
        return z * m if z_ref is None else z * m + z_ref[hook.layer()][None, None] * (1 - m)

    with torch.inference_mode():
        model.add_hook(lambda name: name.endswith("attn.hook_z"), hook)
        try:
            logits, _ = model.run_with_cache(example.tokens, names_filter=lambda n: n.endswith("hook_pattern"))
        finally:
            model.reset_hooks()
    return float(acc), logits


def bench(name: str, args) -> str:
    """One checkpoint's row: the explorer's clicks and the naive way's, interleaved (the CPU is shared)."""
    ckpt = interp.load_checkpoint(name, device="cpu")
    model, task = ckpt.model, ckpt.task
    w = interp.explore(ckpt, batch_size=args.batch, ablation=args.ablation)
    heads = w.info["heads"]
    order = [heads[i % len(heads)] for i in range(args.clicks // 2) for _ in range(2)]  # each head off, then on

    def click(h):
        w._on_msg(w, {"type": "toggle", "head": h}, [])
        assert w.status["error"] == "", w.status["error"]

    def naive():
        return naive_click(model, example, batch, set(w.ablated), args.ablation)

    example = task.dataset("test").select([0])
    batch = task.dataset("test").select(slice(0, w.batch_size))
    for h in order[:4]:  # warm-up
        click(h)
        naive()
    times, parts, naive_times = [], [], []
    for h in order:
        _, t = timed(lambda h=h: click(h))
        times.append(t * 1000)
        parts.append(dict(w.timings))
        (acc, logits), t = timed(naive)
        naive_times.append(t * 1000)
        assert acc == w.accuracy, (name, acc, w.accuracy)
        torch.testing.assert_close(logits[0], w.logits, rtol=1e-5, atol=1e-5)
    w.head = heads[-1]  # with a head's panel open a click also recomputes the panel and the toggled accuracy
    panel = []
    for h in order[: max(4, args.clicks // 4)]:
        _, t = timed(lambda h=h: click(h))
        panel.append(t * 1000)
    med = statistics.median(times)
    q = statistics.quantiles(times, n=10)[-1] if len(times) >= 10 else max(times)
    share = {k: statistics.median(x.get(k, 0.0) for x in parts) for k in ("forward", "accuracy")}
    of = f"forward {share['forward']:.1f}, accuracy {share['accuracy']:.1f}"
    cfg = model.cfg
    return (
        f"{name:<24}{cfg.n_layers:>3} x {cfg.n_heads:<3}{len(w.tokens):>6}{med:>9.1f}{q:>8.1f}{max(times):>8.1f}  "
        f"{of:<28}{statistics.median(panel):>11.1f}{statistics.median(naive_times):>9.1f}"
        f"{statistics.median(naive_times) / med:>6.1f}x"
    )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--checkpoints", nargs="*", default=sorted(shipped_checkpoints()))
    p.add_argument(
        "--clicks", type=int, default=32, help="clicks timed per checkpoint (a head off, then on again, ...)"
    )
    p.add_argument("--batch", type=int, default=256, help="the accuracy batch (the explorer's default is 256)")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--ablation", default="zero", choices=["zero", "mean"])
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    print(
        f"explorer click-to-update in the kernel, {torch.get_num_threads()} thread(s), {args.ablation} ablation, "
        f"accuracy on the first {args.batch} test examples, {args.clicks} clicks per checkpoint (ms; naive: the "
        "same numbers without the explorer, ratio = naive / median)"
    )
    head = (
        f"{'checkpoint':<24}{'L x H':>7}{'tokens':>8}{'median':>9}{'p90':>8}{'max':>8}  {'of which':<28}"
        f"{'panel open':>11}{'naive':>9}{'ratio':>7}"
    )
    print(head)
    print("-" * len(head))
    for name in args.checkpoints:
        print(bench(name, args), flush=True)


if __name__ == "__main__":
    main()
