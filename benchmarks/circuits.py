"""Circuit discovery on every shipped checkpoint: EAP over every edge against exact per-edge patching (time and
forward passes, in the same run), batched per-edge patching against a loop of one ``run_with_hooks`` per edge, and
ACDC on the shipped two-layer induction model.

    .venv/bin/python benchmarks/circuits.py [--examples 32] [--threads 1] \\
        [--out examples/results/circuits/benchmark.json]

Inputs: each task's own corruption where its suite has one (noisy majority: the fewest swaps that flip the answer;
repeated tokens: the key corruption), else mean ablation over the test split (``interp.app.circuit_inputs``); metric
logit difference. Forward passes count sequence batches of the data (a stacked run of n edges counts n; EAP counts
its clean and reference forwards and one forward + backward). The loop re-implements one edge's patch with TL's
split q/k/v inputs, ``hook_mlp_in`` and the last ``hook_resid_post`` (what tests/test_circuit_discovery.py checks
the batched values against) and is timed on the same edges; values are checked equal (1e-4).
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

import torch

from interp.analyses.circuit_scores import acdc, edge_attribution, edge_patching, prepare
from interp.app.circuit_inputs import circuit_inputs
from interp.device import model_device
from interp.loading import load_checkpoint

SHIPPED = ["noisy-majority", "repeated-tokens", "repeated-tokens-1layer", "integer-addition", "modular-addition"]


def loop_patching(model, ctx) -> torch.Tensor:
    """One ``run_with_hooks`` per edge: the receiver's input plus the sender's reference minus clean output."""
    g = ctx.graph
    delta = ctx.delta.expand(ctx.tokens.shape[0], -1, -1, -1)
    out = torch.empty(g.n_edges)
    L = g.n_layers
    model.cfg.use_split_qkv_input = True
    if not model.cfg.attn_only:
        model.cfg.use_hook_mlp_in = True
    try:
        with torch.inference_mode():
            for e, (r, s) in enumerate(g.edges):
                name = g.receivers[r]
                d = delta[:, :, s]
                if name == "logits":
                    hook, slot = f"blocks.{L - 1}.hook_resid_post", None
                elif name.startswith("MLP"):
                    hook, slot = f"blocks.{int(name[3:])}.hook_mlp_in", None
                else:
                    node, letter = name.split(".")
                    layer, idx = node[1:].replace("KV", "H").split("H")
                    hook, slot = f"blocks.{layer}.hook_{letter}_input", int(idx)

                def add(x, hook, d=d, slot=slot):
                    x = x.clone()
                    if slot is None:
                        x += d
                    else:
                        x[:, :, slot] += d
                    return x

                logits = model.run_with_hooks(ctx.tokens, fwd_hooks=[(hook, add)])
                out[e] = float(ctx.metric.of_logits(logits)) - ctx.full
    finally:
        model.cfg.use_split_qkv_input = False
        model.cfg.use_hook_mlp_in = False
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--examples", type=int, default=32)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--out", default=None)
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    rows = []
    for name in SHIPPED:
        ck = load_checkpoint(name)
        clean, corrupted, what = circuit_inputs(ck.task, args.examples, device=model_device(ck.model))
        ctx = prepare(ck.model, clean, corrupted=corrupted)
        base = ctx.forwards
        t0 = time.perf_counter()
        eap = edge_attribution(ctx, 1)
        t_eap, f_eap = time.perf_counter() - t0, ctx.forwards - base + base
        base = ctx.forwards
        t0 = time.perf_counter()
        exact = edge_patching(ctx)
        t_patch, f_patch = time.perf_counter() - t0, ctx.forwards - base
        t0 = time.perf_counter()
        looped = loop_patching(ck.model, ctx)
        t_loop = time.perf_counter() - t0
        if not torch.allclose(exact, looped, atol=1e-4, rtol=1e-4):
            raise SystemExit(
                f"{name}: batched per-edge patching differs from the loop by {(exact - looped).abs().max()}"
            )
        row = {
            "checkpoint": name,
            "inputs": what,
            "edges": ctx.graph.n_edges,
            "eap_seconds": round(t_eap, 3),
            "eap_forwards": f_eap,
            "patching_seconds": round(t_patch, 3),
            "patching_forwards": f_patch,
            "patching_over_eap_time": round(t_patch / t_eap, 1),
            "patching_over_eap_forwards": round(f_patch / f_eap, 1),
            "loop_seconds": round(t_loop, 3),
            "loop_over_batched": round(t_loop / t_patch, 1),
            "eap_vs_patching_rank_corr": round(_spearman(eap, exact), 3),
        }
        if name == "repeated-tokens":
            t0 = time.perf_counter()
            keep, _ = acdc(ctx, 0.01 * abs(ctx.full))
            row["acdc_seconds"] = round(time.perf_counter() - t0, 3)
            row["acdc_kept"] = int(keep.sum())
        rows.append(row)
        print(json.dumps(row), flush=True)
    env = {"threads": torch.get_num_threads(), "load_average": [round(x, 2) for x in os.getloadavg()],
           "cpus": os.cpu_count(), "torch": torch.__version__, "examples": args.examples}  # fmt: skip
    print(json.dumps(env))
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps({"rows": rows, "environment": env}, indent=1) + "\n")
    return 0


def _spearman(a: torch.Tensor, b: torch.Tensor) -> float:
    ra, rb = a.abs().argsort().argsort().float(), b.abs().argsort().argsort().float()
    return float(torch.corrcoef(torch.stack([ra, rb]))[0, 1])


if __name__ == "__main__":
    raise SystemExit(main())
