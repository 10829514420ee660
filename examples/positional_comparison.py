"""Ibrahimli 2024, Compositional Generalization in Transformers's comparison, scaled to one CPU thread: exact-match
accuracy by operand length for each positional scheme, same data, model and training budget, several seeds.

Every run trains the same 2-layer model (d_model 64, 4 heads, d_mlp 256, LayerNorm) on sums of 1..3-digit operands
(written units first, answer units first, 10% sum-9-cascade enrichment), for the same number of steps; then every
model is scored on the same test sets of uniform random sums with exactly 1, 2, ..., 6 digits (lengths 4..6 never
seen in training). Each run's row is written to the results file as soon as it ends, so a killed run resumes
where it stopped (finished runs are skipped).

    OMP_NUM_THREADS=1 PYTHONPATH=. nice -n 10 python examples/positional_comparison.py \\
        --out examples/results/positional_comparison.json [--seeds 0 1] [--steps 800] [--schemes standard none ...]

The table printed at the end (and stored in the JSON) gives, per scheme and length, the mean exact match over
seeds, the spread (min..max over seeds) and a 95% Wilson interval over all the test sums pooled over seeds.
"""

from __future__ import annotations

import argparse
import json
import math
import time
from pathlib import Path

import torch

from interp.evaluation import evaluate
from interp.files import atomic_write
from interp.model import ModelSpec
from interp.tasks import get_task, load_checkpoint
from interp.training import TrainConfig, train

SCHEMES = ("standard", "none", "rotary", "random", "abacus")
TRAIN_DIGITS = (1, 3)
MAX_DIGITS = 6


def task_for(test_digits, train_size: int):
    return get_task(
        "integer-addition",
        digits=list(TRAIN_DIGITS),
        test_digits=list(test_digits),
        max_digits=MAX_DIGITS,
        reverse_operands=True,
        reverse_answer=True,
        train_size=train_size,
        val_size=1000,
        test_size=1000,
        cascades_size=200,
    )


def spec_for(task, scheme: str, seed: int) -> ModelSpec:
    kw = task.default_spec()
    kw.update(positional=scheme, init_seed=seed)
    if scheme == "abacus":
        kw["max_position_offset"] = 3  # index + offset reaches the rows of 6-digit numbers (7-digit answers)
    return ModelSpec(**kw)


def wilson(k: int, n: int, z: float = 1.96) -> tuple[float, float]:
    if n == 0:
        return (float("nan"), float("nan"))
    p = k / n
    d = 1 + z * z / n
    c = (p + z * z / (2 * n)) / d
    h = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / d
    return (max(0.0, c - h), min(1.0, c + h))


def run_one(scheme: str, seed: int, steps: int, batch: int, workdir: Path) -> dict:
    epochs = 8
    train_size = math.ceil(steps / epochs) * batch
    task = task_for(TRAIN_DIGITS, train_size)
    spec = spec_for(task, scheme, seed)
    cfg = TrainConfig(**{**task.default_train(), "epochs": epochs, "batch_size": batch, "seed": seed, "keep": "last"})
    out = workdir / f"{scheme}-seed{seed}.safetensors"
    started = time.time()
    prov = train(task, spec, cfg, out, progress=False, restart=True)
    seconds = time.time() - started
    ckpt = load_checkpoint(out, device="cpu")
    by_len = {}
    for n in range(1, MAX_DIGITS + 1):
        t = task_for((n, n), train_size)
        m = evaluate(ckpt.model, t, t.dataset("test"))
        by_len[str(n)] = {
            "exact_match": m["accuracy"],
            "n": 1000,
            "digit_accuracy": [m[f"digit_{i}"] for i in range(n + 1)],
        }
    return {
        "scheme": scheme,
        "seed": seed,
        "steps": prov["steps"],
        "train_seconds": round(seconds, 1),
        "threads": torch.get_num_threads(),
        "val_accuracy": prov["accuracy"]["val"],
        "by_length": by_len,
        "cascades": cascade_accuracy(ckpt.model),
    }


def cascade_accuracy(model) -> dict:
    """Per length: accuracy per carry case (BA, UC1, US9-k) and exact match per Quirke class on 200 rare-cascade
    sums (every sum holds a sum-9 cascade)."""
    from interp.analyses.integer_addition.accuracy import accuracy_by_case

    out = {}
    for n in range(2, MAX_DIGITS + 1):
        t = task_for((n, n), 1)
        res = accuracy_by_case(model, t.dataset("cascades"))
        out[str(n)] = {
            "by_digit_case": res.by_digit_case,
            "by_complexity": res.by_complexity,
            "exact_match": res.exact_match,
        }
    return out


def table(rows: list[dict]) -> list[dict]:
    out = []
    for scheme in dict.fromkeys(r["scheme"] for r in rows):
        rs = [r for r in rows if r["scheme"] == scheme]
        for n in range(1, MAX_DIGITS + 1):
            accs = [r["by_length"][str(n)]["exact_match"] for r in rs]
            k = sum(round(r["by_length"][str(n)]["exact_match"] * r["by_length"][str(n)]["n"]) for r in rs)
            total = sum(r["by_length"][str(n)]["n"] for r in rs)
            lo, hi = wilson(k, total)
            out.append(
                {
                    "scheme": scheme,
                    "digits": n,
                    "in_training": n <= TRAIN_DIGITS[1],
                    "seeds": len(rs),
                    "mean": sum(accs) / len(accs),
                    "min": min(accs),
                    "max": max(accs),
                    "wilson_lo": lo,
                    "wilson_hi": hi,
                }
            )
    return out


def figure(rows: list[dict]):
    """Exact match by operand length, one line per scheme, bars: the 95% Wilson interval (pooled over seeds)."""
    import plotly.graph_objects as go

    fig = go.Figure()
    for scheme in dict.fromkeys(r["scheme"] for r in rows):
        rs = [r for r in rows if r["scheme"] == scheme]
        fig.add_scatter(
            x=[r["digits"] for r in rs],
            y=[r["mean"] for r in rs],
            mode="lines+markers",
            name=scheme,
            error_y=dict(
                type="data",
                symmetric=False,
                array=[r["wilson_hi"] - r["mean"] for r in rs],
                arrayminus=[r["mean"] - r["wilson_lo"] for r in rs],
            ),
        )
    fig.add_vrect(
        x0=TRAIN_DIGITS[0] - 0.5,
        x1=TRAIN_DIGITS[1] + 0.5,
        fillcolor="green",
        opacity=0.08,
        line_width=0,
        annotation_text="training lengths",
    )
    fig.update_layout(
        xaxis_title="operand digits",
        yaxis_title="exact match",
        yaxis_range=[-0.02, 1.02],
        title="Exact match by operand length per positional scheme",
        template="plotly_white",
    )
    return fig


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default="examples/results/positional_comparison.json")
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    p.add_argument("--schemes", nargs="+", default=list(SCHEMES), choices=SCHEMES)
    p.add_argument("--steps", type=int, default=800)
    p.add_argument("--batch-size", type=int, default=128)
    p.add_argument("--workdir", default="runs/positional_comparison")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--table-only", action="store_true", help="no training: rebuild the table (and CSV) from --out")
    p.add_argument("--figure", default="runs/positional_comparison.html", help="the figure as an offline HTML page")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    out = Path(args.out)
    workdir = Path(args.workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    out.parent.mkdir(parents=True, exist_ok=True)
    doc = json.loads(out.read_text()) if out.is_file() else {"runs": []}
    setup = {
        "train_digits": list(TRAIN_DIGITS),
        "test_digits": list(range(1, MAX_DIGITS + 1)),
        "steps": args.steps,
        "batch_size": args.batch_size,
        "test_sums_per_length": 1000,
        "model": "2 layers, d_model 64, 4 heads x 16, d_mlp 256, LayerNorm",
        "format": "operands and answer units first",
        "train": "AdamW lr 1e-3, wd 0.1, betas (0.9, 0.98), warmup 100 steps, 10% cascade enrichment, last model kept",
    }
    doc["setup"] = setup
    for seed in [] if args.table_only else args.seeds:
        for scheme in args.schemes:
            if any(r["scheme"] == scheme and r["seed"] == seed and r["steps"] >= args.steps for r in doc["runs"]):
                continue
            row = run_one(scheme, seed, args.steps, args.batch_size, workdir)
            doc["runs"] = [r for r in doc["runs"] if not (r["scheme"] == scheme and r["seed"] == seed)] + [row]
            doc["table"] = table(doc["runs"])
            atomic_write(out, lambda tmp: Path(tmp).write_text(json.dumps(doc, indent=1) + "\n"), "the results")
            print(
                f"{scheme} seed {seed}: {row['train_seconds']} s; exact match by length "
                + " ".join(f"{n}:{v['exact_match']:.3f}" for n, v in row["by_length"].items()),
                flush=True,
            )
    for r in doc["runs"]:  # runs from before the cascade evaluation existed: add it from their checkpoints
        path = workdir / f"{r['scheme']}-seed{r['seed']}.safetensors"
        if "cascades" not in r and path.is_file():
            r["cascades"] = cascade_accuracy(load_checkpoint(path, device="cpu").model)
    doc["table"] = table(doc["runs"])
    atomic_write(out, lambda tmp: Path(tmp).write_text(json.dumps(doc, indent=1) + "\n"), "the results")
    cols = ["scheme", "digits", "in_training", "seeds", "mean", "min", "max", "wilson_lo", "wilson_hi"]
    csv = (
        "\n".join(
            [",".join(cols)]
            + [",".join(f"{r[c]:.4f}" if isinstance(r[c], float) else str(r[c]) for c in cols) for r in doc["table"]]
        )
        + "\n"
    )
    atomic_write(out.with_suffix(".csv"), lambda tmp: Path(tmp).write_text(csv), "the results table")
    if args.figure:
        Path(args.figure).parent.mkdir(parents=True, exist_ok=True)
        atomic_write(args.figure, lambda tmp: figure(doc["table"]).write_html(tmp, include_plotlyjs=True), "the figure")
    print(f"{'scheme':<10}" + "".join(f"{n:>18}" for n in range(1, MAX_DIGITS + 1)))
    for scheme in dict.fromkeys(r["scheme"] for r in doc["table"]):
        cells = [r for r in doc["table"] if r["scheme"] == scheme]
        print(
            f"{scheme:<10}"
            + "".join(f"{c['mean']:.3f} [{c['wilson_lo']:.2f},{c['wilson_hi']:.2f}]".rjust(18) for c in cells)
        )


if __name__ == "__main__":
    main()
