"""Integer addition's open questions (Ibrahimli 2024, *Compositional Generalization in Transformers*, chapter 4),
answered over seeds on one CPU thread per process: length generalisation per positional scheme, looped against not
looped, with and without random spaces and a scratchpad; a curriculum and an auxiliary carry loss; and (with
``--analyse``) the compositionality gap of every trained model, the looped models at other numbers of iterations
and the scratchpad models' greedily decoded answers.

Every model trains on sums of 1..3-digit operands (units first, answer units first, 10% cascade enrichment) for the
same 1,000 steps of batch 128 (AdamW lr 1e-3, weight decay 0.1, betas (0.9, 0.98), no dropout, the last model
kept) and is scored on the same 6,000 uniform random test sums of 1..6-digit operands (about 1,000 per length;
``test_accuracy_len<n>`` in the rows). The runs go through the sweep machinery (:func:`interp.app.sweeps.run_sweep`)
into two sweep directories, so ``interp table DIR --metric accuracy_len4`` rebuilds each table from the rows:

- ``lengths`` (``--part lengths``): every positional scheme (none, standard, rotary, random, abacus, alibi; or
  those given with ``--schemes``) as the plain 2-layer model (d_model 32, 4 heads x 8, d_mlp 128, LayerNorm: the
  positional comparison's model at half the width) and as a looped model of one such layer applied twice with input
  injection (``loops=2``: the same compute per step, half the parameters);
- ``ablations`` (``--part ablations``): on standard and Abacus positions (or ``--schemes``), the curriculum
  ``n_digits:1@0,2@200,3@400`` and the auxiliary carry loss (``aux_loss=0.5``), plain; the plain 1-layer model (the
  looped model's parameters, half its compute); random spaces (``random_spaces=0.3``) and the scratchpad, each plain
  and looped (``--ablations`` picks some of these arms).

Runs go seed by seed (every arm of seed 0, then of seed 1, ...), so a budget cut short leaves balanced seeds; each run
is skipped once its row exists and a killed run continues from its resume file, so the script resumes where it
stopped. Each sweep call's CPU and wall time is appended to ``timings.jsonl`` in its directory. The shipped results
(docs/addition.md) are a part of this design, cut short by the shared CPU: the commands there say which.

    OMP_NUM_THREADS=1 nice -n 5 python examples/addition_experiments.py --part lengths --out runs/addition &
    OMP_NUM_THREADS=1 nice -n 5 python examples/addition_experiments.py --part ablations --out runs/addition &
    OMP_NUM_THREADS=1 python examples/addition_experiments.py --analyse --out runs/addition \\
        --results examples/results/addition
"""

from __future__ import annotations

import argparse
import json
import shutil
import time
from dataclasses import replace
from pathlib import Path

import torch

from interp.app.sweeps import run_sweep
from interp.configs import ModelSpec, TrainConfig
from interp.tasks import get_task

SCHEMES = ("none", "standard", "rotary", "random", "abacus", "alibi")
TASK = dict(
    digits=[1, 3],
    test_digits=[1, 6],
    max_digits=6,
    reverse_operands=True,
    reverse_answer=True,
    train_size=16000,  # 125 steps of 128 per epoch
    val_size=500,
    test_size=6000,
    cascades_size=300,
)
TRAIN = dict(epochs=8, batch_size=128, lr=1e-3, weight_decay=0.1, beta2=0.98, dropout=0.0, keep="last", save_every=2)
ABACUS_OFFSET = 3  # McLeish et al.'s random offset: 3-digit training numbers reach the rows of 6-digit ones
WIDTH = dict(d_model=32, n_heads=4, d_head=8, d_mlp=128)  # small: one run is about a minute of one CPU core
ARCHITECTURES = {
    "plain2": dict(n_layers=2, **WIDTH),
    "looped": dict(n_layers=1, loops=2, **WIDTH),  # same compute per step as plain2, half its parameters
    "plain1": dict(n_layers=1, **WIDTH),  # the looped model's parameters, half its compute
}
# ablation -> (task parameters, training options, architectures)
ABLATIONS = {
    "curriculum": ({}, dict(curriculum="n_digits:1@0,2@200,3@400"), ("plain2",)),
    "aux": ({}, dict(aux_loss=0.5), ("plain2",)),
    "spaces": (dict(random_spaces=0.3), {}, ("plain2", "looped")),
    "scratchpad": (dict(scratchpad=True), {}, ("plain2", "looped")),
}
ABLATION_SCHEMES = ("standard", "abacus")


def sweep(out: Path, seed: int, schemes, arch: str, task_kw: dict, train_kw: dict, threads: int) -> None:
    """One sweep call: ``schemes`` as the grid (Abacus, which needs its offset, as a plan of its own), one seed."""
    task = get_task("integer-addition", **{**TASK, **task_kw})
    cfg = TrainConfig(**{**task.default_train(), **TRAIN, **train_kw})
    base = ModelSpec(**{**task.default_spec(), **ARCHITECTURES[arch]})
    groups = [[s for s in schemes if s != "abacus"], [s for s in schemes if s == "abacus"]]
    for group in (g for g in groups if g):
        spec = replace(base, max_position_offset=ABACUS_OFFSET) if group == ["abacus"] else base
        cpu, wall = time.process_time(), time.time()
        rows = run_sweep(task, spec, cfg, [seed], {"positional": group}, out, progress=False, threads=threads)
        entry = {
            "seed": seed,
            "arch": arch,
            "schemes": group,
            "task": task_kw,
            "train": train_kw,
            "runs": len(rows),
            "cpu_seconds": round(time.process_time() - cpu, 1),
            "wall_seconds": round(time.time() - wall, 1),
        }
        with open(out / "timings.jsonl", "a") as f:
            f.write(json.dumps(entry) + "\n")
        print(json.dumps(entry), flush=True)


def train_part(
    part: str, out: Path, seeds, threads: int, schemes=None, archs=("plain2", "looped"), ablations=None
) -> None:
    """Train one part seed by seed (``schemes``: the positional schemes, by default every one for the lengths and
    standard and Abacus for the ablations; ``archs``: the lengths part's architectures); the ablations part also
    trains the parameter-matched 1-layer control (``ablations``: only these of :data:`ABLATIONS` and ``"control"``,
    the 1-layer control; by default all of them)."""
    out.mkdir(parents=True, exist_ok=True)
    selected = set(ablations) if ablations else {*ABLATIONS, "control"}
    if schemes is None:
        schemes = SCHEMES if part == "lengths" else ABLATION_SCHEMES
    for seed in seeds:
        if part == "lengths":
            for group in ([s for s in schemes if s != "abacus"], [s for s in schemes if s == "abacus"]):
                for arch in archs if group else ():
                    sweep(out / "lengths", seed, group, arch, {}, {}, threads)
        else:
            for name, (task_kw, train_kw, arms) in ABLATIONS.items():
                for arch in arms if name in selected else ():
                    sweep(out / "ablations", seed, schemes, arch, task_kw, train_kw, threads)
                if name == "aux" and "control" in selected:  # after the training options, before the formats
                    sweep(out / "ablations", seed, schemes, "plain1", {}, {}, threads)


def ship(out: Path, results: Path) -> None:
    """Copy each sweep's rows, plan and timings (not the checkpoints) into ``results``."""
    for part in ("lengths", "ablations"):
        src = out / part
        if not src.is_dir():
            continue
        dst = results / part
        dst.mkdir(parents=True, exist_ok=True)
        for name in ("results.jsonl", "results.csv", "sweep.json", "timings.jsonl"):
            if (src / name).is_file():
                shutil.copyfile(src / name, dst / name)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--part", choices=("lengths", "ablations"), help="train this part's runs")
    p.add_argument("--out", default="runs/addition", help="where the sweep directories (with checkpoints) go")
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--schemes", nargs="+", choices=SCHEMES, help="positional schemes (default: see train_part)")
    p.add_argument(
        "--archs",
        nargs="+",
        choices=("plain2", "looped"),
        default=["plain2", "looped"],
        help="the lengths part's architectures (default: both)",
    )
    p.add_argument(
        "--ablations",
        nargs="+",
        choices=(*ABLATIONS, "control"),
        help="the ablations part's arms (control: the 1-layer plain model; default: all)",
    )
    p.add_argument("--analyse", action="store_true", help="the analyses of the trained models (see --results)")
    p.add_argument("--results", default="examples/results/addition", help="where the shipped results go")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    out = Path(args.out)
    if args.part:
        train_part(args.part, out, args.seeds, args.threads, args.schemes, args.archs, args.ablations)
    if args.analyse:
        from addition_analyses import analyse  # examples/addition_analyses.py, beside this script

        analyse(out, Path(args.results))
    if args.part or args.analyse:
        ship(out, Path(args.results))


if __name__ == "__main__":
    main()
