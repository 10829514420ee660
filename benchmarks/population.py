"""Population training (interp.population) against its FLOP floor, against training the same models one at a time
(interp.training.train), against PyTorch's own model ensembling (torch.func.stack_module_state and vmap over
functional_call of the same K HookedTransformers, with torch.optim over the stacked parameters), and against another
checkout of this code (``--before DIR``, e.g. a worktree of the commit before a change), all in one run.

    .venv/bin/python benchmarks/population.py [--models 100] [--position-models 30] [--repeats 3]
        [--configs counts-2,counts-8,counts-32,counts-32-counter,positions,positions-counter,prefix-counts]
        [--before DIR]
        [--sides ours,solo,vmap-query,vmap-tl] [--no-compile]

The configurations (the thesis's noisy majority, 7,500 training sentences, batch 128, 59 steps per epoch; Adam with
L2 weight decay, Table 1's recipe):

- ``counts-D``: d_model D (2, 8, 32) with D/2 heads of d_head 2 (1 head at d = 2), dropout on the attention output
  (torch masks): the token-count forward (``interp.population_paths.forward_of``), K = ``--models`` models;
  ``counts-32-counter`` the same with counter masks (no per-model mask draws: what the path costs without the
  torch masks' floor);
- ``positions`` / ``positions-counter``: d = 32, 16 heads, dropout on the embedding and the attention output (the
  thesis's placement), torch or counter masks: the per-position forward, K = ``--position-models``;
- ``prefix-counts``: d = 8, 4 heads, the language-model objective, counter masks: the prefix-count forward, K =
  ``--position-models``.

Sides, each timed in its own worker process of one thread (``OMP_NUM_THREADS=1``, ``torch.set_num_threads(1)``):

- ``ours`` (and ``before``): ``train_population`` for 1 epoch and then E epochs (warm-up: ``torch.compile``'s
  compilation, first-touch allocations, and the run after the warm-up, which runs slower than later ones), then
  for E, 3E and again E epochs in the same process; the rate is the difference of the 3E run and the mean of the E
  runs (a drift over the three cancels) over the 2E extra epochs per model, so model building, compilation, the
  final evaluation and the checkpoint writes are on neither side. Before the timed runs the heap is frozen
  (``gc.freeze``): a full collection of Python's garbage collector otherwise walks torch.compile's objects (~0.3 s)
  and lands in one run and not another, as large as what is measured at E = 2 and K = 100;
- ``solo``: ``interp.training.train`` of one model the same way;
- ``vmap-query``: ``vmap`` over ``functional_call`` of our query-restricted forward (``interp.query_forward.logits_at``,
  what ``interp train`` runs per model) on the K models' own batches, ``torch.optim.Adam(foreach=True)`` over the
  stacked parameters: the same arithmetic as the population's per-position path, batched by vmap instead of by
  hand;
- ``vmap-tl``: the same over TransformerLens' own forward (``HookedTransformer.__call__``: every position's
  logits, what a user who has only the model would batch), on ``--tl-models`` models (its ``[model, batch, head,
  pos, pos]`` scores do not fit for K = 100).

The vmap sides have no dropout (TransformerLens' model has no dropout modules) and no per-epoch validation: they
time ``--steps`` training steps after one warm-up step, scaled to 59 steps per epoch; the others time whole epochs
(their validation included). Each configuration's FLOP floor is counted from the shapes (multiply-adds of the
least arithmetic its forward needs, at the sentences' own lengths, times 3 for the backward, times 2 FLOP per
multiply-add; the script's ``floor_flops`` says what is counted) and divided by the rate one core reaches on a
1024 x 1024 x 1024 single-precision product, measured in the same run. Torch-masked configurations also print
their masks' floor: the draws each model takes from its own generator per epoch (``torch_mask_draws``, the same as
its solo run's) times one draw's CPU time (the cheaper of ``bernoulli_`` and its C replay,
``interp.generator_replay``, both measured in the same run), which no batching removes while each model has to
equal its solo run. Each rate is printed as the median and the
range (min-max) over ``--repeats`` repeats, in wall seconds and in the worker's CPU seconds (user + system), which
other work on a shared machine disturbs less; the ratios are of CPU seconds.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = (
    "counts-2",
    "counts-8",
    "counts-32",
    "counts-32-counter",
    "positions",
    "positions-counter",
    "prefix-counts",
)
SIDES = ("ours", "solo", "vmap-query", "vmap-tl")
STEPS_PER_EPOCH = 59  # ceil(7,500 / 128)


def _use_checkout(code: str) -> None:
    """Import ``interp`` (and ``interp.tasks`` / ``analyses`` / ``app``, as pyproject's package-dir maps them) from
    the checkout ``code`` instead of the installed one."""
    import importlib.abc
    import importlib.util

    folders = {"interp": "interp", "interp.tasks": "tasks", "interp.analyses": "analyses", "interp.app": "app"}

    class Finder(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            if name not in folders:
                return None
            folder = Path(code) / folders[name]
            return importlib.util.spec_from_file_location(
                name, folder / "__init__.py", submodule_search_locations=[str(folder)]
            )

    sys.meta_path.insert(0, Finder())


def _recipe(config: str):
    """(spec, train config, K kind) of a configuration."""
    from interp.model import ModelSpec
    from interp.tasks import get_task
    from interp.training import TrainConfig

    task = get_task("noisy-majority")
    base = task.default_spec()
    if config.startswith("counts-"):
        d = int(config.split("-")[1])
        spec = ModelSpec(**{**base, "d_model": d, "n_heads": max(1, d // 2), "d_head": 2})
        rng = "counter" if config.endswith("counter") else "torch"
        cfg = TrainConfig(dropout_at="attention", dropout_rng=rng, optimizer="adam")
        return task, spec, cfg, "models"
    if config.startswith("positions"):
        spec = ModelSpec(**{**base, "d_model": 32, "n_heads": 16, "d_head": 2})
        rng = "counter" if config.endswith("counter") else "torch"
        cfg = TrainConfig(dropout_at="embedding+attention", dropout_rng=rng, optimizer="adam")
        return task, spec, cfg, "position_models"
    if config == "prefix-counts":
        spec = ModelSpec(**{**base, "d_model": 8, "n_heads": 4, "d_head": 2})
        cfg = TrainConfig(dropout_at="attention", dropout_rng="counter", objective="lm", optimizer="adam")
        return task, spec, cfg, "position_models"
    raise SystemExit(f"unknown configuration {config!r}; expected one of {CONFIGS}")


def _cpu() -> float:
    t = os.times()
    return t.user + t.system


def _worker(args) -> None:
    """One side of one configuration: prints one JSON line with the seconds per model-epoch (wall and CPU)."""
    if args.code:
        _use_checkout(args.code)
    import torch

    torch.set_num_threads(1)
    task, spec, cfg, _kind = _recipe(args.config)
    K = args.count
    if args.side in ("ours", "before", "solo"):
        from interp.population import seed_population, train_population
        from interp.training import train

        def run(epochs: int, tmp: Path) -> tuple[float, float]:
            c = replace(cfg, epochs=epochs)
            tmp = Path(tempfile.mkdtemp(dir=tmp))  # a fresh folder: a solo run does not replace a checkpoint
            w0, c0 = time.perf_counter(), _cpu()
            if args.side == "solo":
                train(
                    task,
                    replace(spec, init_seed=0),
                    replace(c, seed=0),
                    tmp / "s.safetensors",
                    device="cpu",
                    progress=False,
                )
            else:
                specs, cfgs = seed_population(task, spec, c, range(K))
                outs = [tmp / f"p{s}.safetensors" for s in range(K)]
                train_population(task, specs, cfgs, outs, device="cpu", progress=False, compile=args.compile)
            return time.perf_counter() - w0, _cpu() - c0

        E = args.epochs
        with tempfile.TemporaryDirectory() as tmp:
            run(1, Path(tmp))  # warm-up: compilation, first-touch allocations
            run(E, Path(tmp))  # and the run after it, which is slower than later ones
            gc.collect()
            gc.freeze()  # what is on the heap now (torch.compile's objects) no longer in every full collection
            (w1, c1), (w3, c3), (w1b, c1b) = run(E, Path(tmp)), run(3 * E, Path(tmp)), run(E, Path(tmp))
        models = 1 if args.side == "solo" else K
        w1, c1 = (w1 + w1b) / 2, (c1 + c1b) / 2  # the E-epoch runs before and after: a drift cancels
        print(json.dumps({"wall": (w3 - w1) / (2 * E * models), "cpu": (c3 - c1) / (2 * E * models)}))
        return
    print(json.dumps(_vmap_rate(args, task, spec, cfg, K)))


def _vmap_rate(args, task, spec, cfg, K: int) -> dict[str, float]:
    """Seconds per model-epoch of PyTorch's model ensembling of the same K models on their own batches."""
    import copy

    import torch
    import torch.nn.functional as F
    from torch.func import functional_call, stack_module_state, vmap

    from interp.evaluation import target_positions
    from interp.model import build_model
    from interp.objectives import lm_targets
    from interp.query_forward import logits_at
    from interp.task import IGNORE

    models = [build_model(replace(spec, init_seed=s), device="cpu") for s in range(K)]
    data = task.dataset("train")
    lm = cfg.objective == "lm"
    qpos_all = None if lm else target_positions(data)
    targets_all = lm_targets(data) if lm else data.targets.gather(1, qpos_all)

    class Query(torch.nn.Module):  # our query-restricted forward, as a module functional_call can swap into
        def __init__(self, m):
            super().__init__()
            self.m = m

        def forward(self, tokens, qpos):
            return logits_at(self.m, tokens, qpos)

    if args.side == "vmap-query" and not lm:
        wrapped = [Query(m) for m in models]
    else:
        wrapped = models
    params, buffers = stack_module_state(wrapped)
    base = copy.deepcopy(wrapped[0])
    opt = torch.optim.Adam(
        params.values(), lr=cfg.lr, betas=(cfg.beta1, cfg.beta2), weight_decay=cfg.weight_decay, foreach=True
    )

    def loss_of(p, b, tokens, qpos, targets):
        if args.side == "vmap-query" and not lm:
            logits = functional_call(base, (p, b), (tokens, qpos))
        else:
            logits = functional_call(base, (p, b), (tokens,))
            if not lm:
                logits = logits.gather(1, qpos[..., None].expand(-1, -1, logits.shape[-1]))
        return F.cross_entropy(logits.flatten(0, -2), targets.flatten(), ignore_index=IGNORE)

    step_loss = vmap(loss_of, in_dims=(0, 0, 0, 0, 0))
    gens = [torch.Generator().manual_seed(s) for s in range(K)]
    perms = torch.stack([torch.randperm(len(data), generator=g) for g in gens])

    def step(i: int) -> None:
        idx = perms[:, i * cfg.batch_size : (i + 1) * cfg.batch_size]
        width = int(data.lengths[idx].max())
        tokens = data.tokens[idx][..., :width]
        qpos = qpos_all[idx] if qpos_all is not None else tokens  # (unused under lm)
        targets = targets_all[idx][..., :width] if lm else targets_all[idx]
        opt.zero_grad()
        step_loss(params, buffers, tokens, qpos, targets).sum().backward()
        opt.step()

    step(0)
    w0, c0 = time.perf_counter(), _cpu()
    for i in range(1, 1 + args.steps):
        step(i)
    scale = STEPS_PER_EPOCH / (args.steps * K)
    return {"wall": (time.perf_counter() - w0) * scale, "cpu": (_cpu() - c0) * scale}


def floor_flops(config: str) -> float:
    """Multiply-adds x 2 x 3 (forward, backward) per model-epoch of the least arithmetic each forward needs, at the
    training sentences' own lengths (7,500 sentences of 4-104 tokens, 409,431 positions; 2 targets each):

    - token counts: per target, each head weighs the present tokens' values by count and table entry (H x V x
      d_head multiply-adds for the weighted values, H x V for the denominator, V = 7 present tokens) and the
      unembedding (d_model x 8); W_O is the identity here (n_heads x d_head = d_model).
    - per position: per position of every sentence, each of the 2 queries' scores and attention-weighted inputs
      (2 x heads x d_model each, with the query folded into W_K); per target the query, W_V and the unembedding.
    - prefix counts: per position (every position is a target), as the token counts' target.
    """
    from interp.tasks import get_task

    data = get_task("noisy-majority").dataset("train")
    n, positions = len(data), int(data.lengths.sum())
    V, out = 7, 8
    d = {"counts-2": 2, "counts-8": 8, "prefix-counts": 8}.get(config, 32)
    H, e = max(1, d // 2), 2
    per_target = H * V * e + H * V + d * out
    if config.startswith("counts-"):
        macs = 2 * n * per_target
    elif config == "prefix-counts":
        macs = positions * per_target
    else:
        macs = positions * 2 * (2 * H * d) + 2 * n * (d * H * e * 2 + d * out)
    return 2 * 3 * macs


def torch_mask_draws(config: str) -> int:
    """Dropout draws per model-epoch that a torch-masked configuration takes from its model's generator, as its solo
    run draws them (the population draws the same numbers, to equal it; 0 for counter masks): the attention output
    ``[batch, 2, d_model]`` per step, and for ``positions`` also the embedding ``[batch, the batch's longest
    sentence, d_model]`` (counted in seed 0's data order)."""
    import torch

    task, spec, cfg, _ = _recipe(config)
    if cfg.dropout_rng != "torch" or not cfg.dropout:
        return 0
    data = task.dataset("train")
    n, d = len(data), spec.d_model
    draws = n * 2 * d  # the attention output at the 2 targets
    if "embedding" in cfg.dropout_sites:
        perm = torch.randperm(n, generator=torch.Generator().manual_seed(0))
        for start in range(0, n, cfg.batch_size):
            idx = perm[start : start + cfg.batch_size]
            draws += len(idx) * int(data.lengths[idx].max()) * d
    return draws


def _draw_seconds() -> dict[str, float]:
    """CPU seconds per dropout draw of one thread, each way a model's masks can equal its solo run's: torch's
    ``bernoulli_(0.9, generator=g)`` into a ``[128, 2, 32]`` tensor (one step's attention-output mask of one d = 32
    model; best of 5 runs of 200 calls), and the C replay of the same draws for 100 generators at once
    (``interp.generator_replay.DropoutGenerators.masks``, one step of a population of 100; best of 5 runs of 20
    calls; absent where the replay is not used here), which is checked equal to ``bernoulli_``'s draws first."""
    import torch

    from interp.generator_replay import DropoutGenerators, replay_status

    torch.set_num_threads(1)
    g, x = torch.Generator().manual_seed(0), torch.empty(128, 2, 32)
    rates = {"bernoulli_": float("inf")}
    for _ in range(5):
        t = time.process_time()
        for _ in range(200):
            x.bernoulli_(0.9, generator=g)
        rates["bernoulli_"] = min(rates["bernoulli_"], (time.process_time() - t) / (200 * x.numel()))
    if replay_status() == "replay":
        gens = [torch.Generator().manual_seed(i) for i in range(100)]
        bank = DropoutGenerators([torch.Generator().manual_seed(i) for i in range(100)])
        want = torch.stack([torch.empty(128, 2, 32).bernoulli_(0.9, generator=h).div_(0.9) for h in gens])
        if not torch.equal(bank.masks((128, 2, 32), 0.1), want):
            raise SystemExit("the C replay's masks differ from bernoulli_'s")
        rates["replay"] = float("inf")
        for _ in range(5):
            t = time.process_time()
            for _ in range(20):
                bank.masks((128, 2, 32), 0.1)
            rates["replay"] = min(rates["replay"], (time.process_time() - t) / (20 * 100 * x.numel()))
    return rates


def _peak_flops() -> float:
    """FLOP/s of one thread on a 1024^3 single-precision product (best of 5, in CPU seconds: other work on a shared
    machine takes turns on the core, which wall time would count)."""
    import torch

    torch.set_num_threads(1)
    a, b = torch.randn(1024, 1024), torch.randn(1024, 1024)
    a @ b
    best = float("inf")
    for _ in range(5):
        t = time.process_time()
        a @ b
        best = min(best, time.process_time() - t)
    return 2 * 1024**3 / best


def _run_side(args, config: str, side: str) -> dict[str, float]:
    kind = _recipe(config)[3]
    count = getattr(args, kind)
    if side == "vmap-tl":
        count = min(count, args.tl_models)
    cmd = [
        sys.executable,
        __file__,
        "--worker",
        "--config",
        config,
        "--side",
        side,
        "--count",
        str(count),
        "--epochs",
        str(args.epochs),
        "--steps",
        str(args.steps),
    ]
    if side == "before":
        cmd += ["--code", args.before]
    if args.compile and side in ("ours", "before"):
        cmd += ["--compile"]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    res = subprocess.run(cmd, check=False, env=env, capture_output=True, text=True)
    if res.returncode != 0:
        raise SystemExit(f"{config} {side} failed:\n{res.stderr[-3000:]}")
    return json.loads(res.stdout.strip().splitlines()[-1])


def _spread(xs: list[float], fmt: str = ".4f") -> str:
    return f"{statistics.median(xs):{fmt}} ({min(xs):{fmt}}-{max(xs):{fmt}})"


def _positive(text: str) -> int:
    """argparse type: a positive integer (a count of models, epochs, steps or repeats), else a usage error."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {value}")
    return value


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", type=_positive, default=100, help="K of the token-count configurations")
    parser.add_argument("--position-models", type=_positive, default=30, help="K of the per-position and prefix ones")
    parser.add_argument("--tl-models", type=_positive, default=4, help="K of the vmap over TransformerLens' forward")
    parser.add_argument(
        "--epochs", type=_positive, default=1, help="E: each population side is timed at E and 3E epochs"
    )
    parser.add_argument("--steps", type=_positive, default=3, help="timed steps of the vmap sides")
    parser.add_argument("--repeats", type=_positive, default=3)
    parser.add_argument("--configs", default=",".join(CONFIGS))
    parser.add_argument("--sides", default=",".join(SIDES))
    parser.add_argument("--before", default=None, help="another checkout of this repository, timed as 'before'")
    parser.add_argument("--no-compile", dest="compile", action="store_false", help="populations without compile")
    parser.add_argument("--json", default=None, help="also write every measurement to this file")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--config", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--side", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--count", type=int, default=1, help=argparse.SUPPRESS)
    parser.add_argument("--code", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--compile", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        return _worker(args)
    configs = [c for c in args.configs.split(",") if c]
    sides = [s for s in args.sides.split(",") if s]
    for c in configs:
        _recipe(c)
    for s in sides:
        if s not in SIDES:
            parser.error(f"unknown side {s!r}; expected some of {SIDES}")
    if args.before:
        if not (Path(args.before) / "interp" / "population.py").is_file():
            parser.error(f"--before {args.before}: not a checkout of this repository (no interp/population.py)")
        sides = ["ours", "before"] + [s for s in sides if s != "ours"]
    peak, draws_s = _peak_flops(), _draw_seconds()
    draw = min(draws_s.values())  # the masks' floor: the cheapest draw that equals the solo run's
    print(
        f"one thread, 1024^3 sgemm: {peak / 1e9:.1f} GFLOP/s (the floors' rate); one dropout draw: "
        + ", ".join(f"{k} {v * 1e9:.2f} ns" for k, v in draws_s.items())
        + f"; load average {os.getloadavg()}"
    )
    results: dict[str, dict[str, dict[str, list[float]]]] = {}
    for r in range(args.repeats):
        for c in configs:
            for s in sides:
                if s.startswith("vmap") and c.endswith("-counter"):
                    continue  # the vmap sides have no dropout: a counter configuration would repeat its torch one
                rate = _run_side(args, c, s)
                for k, v in rate.items():
                    results.setdefault(c, {}).setdefault(s, {}).setdefault(k, []).append(v)
                print(
                    f"repeat {r + 1}/{args.repeats} {c:18s} {s:10s}: {rate['wall']:.5f} s per model-epoch (wall), "
                    f"{rate['cpu']:.5f} (CPU)",
                    flush=True,
                )
    print(
        f"\nseconds per model-epoch, median (min-max) of {args.repeats}; ratios of CPU medians; K = {args.models} "
        f"(token counts), {args.position_models} (positions, prefix counts), {args.tl_models} (vmap-tl)"
    )
    print(
        f"{'configuration':18s} {'side':10s} {'wall':>26s} {'CPU':>26s} {'x floor':>9s} {'solo /':>8s} {'before /':>9s}"
    )
    for c, by_side in results.items():
        floor = floor_flops(c) / peak
        solo = statistics.median(by_side["solo"]["cpu"]) if "solo" in by_side else None
        before = statistics.median(by_side["before"]["cpu"]) if "before" in by_side else None
        print(f"{c:18s} {'floor':10s} {'':>26s} {floor:26.5f} ({floor_flops(c) / 1e6:.0f} MFLOP)")
        draws = torch_mask_draws(c)
        if draws:  # what no batching removes while each model equals its solo run
            print(f"{c:18s} {'masks':10s} {'':>26s} {draws * draw:26.5f} ({draws / 1e6:.2f} M generator draws)")
        for s, rates in by_side.items():
            cpu = statistics.median(rates["cpu"])
            print(
                f"{c:18s} {s:10s} {_spread(rates['wall'], '.5f'):>26s} {_spread(rates['cpu'], '.5f'):>26s} "
                f"{cpu / floor:9.1f} {(solo / cpu if solo else float('nan')):8.2f} "
                f"{(before / cpu if before else float('nan')):9.2f}"
            )
    if args.json:
        Path(args.json).write_text(
            json.dumps({"peak_flops": peak, "draw_seconds": draws_s, "results": results}, indent=1)
        )


if __name__ == "__main__":
    main()
