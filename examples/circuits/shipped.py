"""The circuits of the five shipped checkpoints (docs/circuits.md): EAP and exact per-edge patching on each task's
own corruption (mean ablation where the task has none), the kept circuit (smallest top-k with faithfulness 0.9), its
figure and faithfulness curve; for noisy majority also each head's learned accuracy alone and its Shapley value
(learned-accuracy value, sampled permutations) beside the heads the circuit keeps; for integer addition the edges
into the MLPs and logits (the carry paths).

    OMP_NUM_THREADS=1 python examples/circuits/shipped.py [--examples 32] [--only CHECKPOINT ...]

``--only`` recomputes the named checkpoints and keeps the other rows of shipped.json as they are.

Writes examples/results/circuits/shipped/<checkpoint>-<method>.json (each Circuit, loadable with Circuit.load),
shipped.json (the summary docs/circuits.md quotes) and, where Chromium is installed, the figures as PNG under
docs/circuits/ (drawn from the plotly figures by a headless screenshot).
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

import torch

from interp.analyses.circuit_discovery import discover_circuit
from interp.app.circuit_inputs import circuit_inputs
from interp.device import model_device
from interp.loading import load_checkpoint

OUT = Path(__file__).resolve().parents[2] / "examples" / "results" / "circuits"
FIGURES = OUT.parents[2] / "docs" / "circuits"
SHIPPED = ["noisy-majority", "repeated-tokens", "repeated-tokens-1layer", "integer-addition", "modular-addition"]


def png(fig, path: Path, width: int = 1000, height: int = 640) -> None:
    """Save a plotly figure as PNG with a headless Chromium screenshot (no kaleido needed); skipped, saying so,
    without Chromium."""
    import shutil
    import subprocess
    import tempfile

    browser = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")
    if browser is None:
        print(f"no Chromium: {path.name} not drawn")
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as d:
        html = Path(d) / "figure.html"
        fig.update_layout(width=width, height=height)
        fig.write_html(html, include_plotlyjs=True, full_html=True, config={"displayModeBar": False})
        shot = Path(d) / "figure.png"
        flags = ["--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", "--virtual-time-budget=5000"]
        cmd = [browser, *flags, f"--screenshot={shot}", f"--window-size={width},{height}", html.as_uri()]
        subprocess.run(cmd, capture_output=True, timeout=120, check=False)
        if shot.exists():
            shutil.copyfile(shot, path)


def heads_of(edges: list[str]) -> list[str]:
    out = []
    for e in edges:
        for node in e.replace(".q", "").replace(".k", "").replace(".v", "").split("->"):
            if node.startswith("L") and node not in out:
                out.append(node)
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--examples", type=int, default=32)
    p.add_argument("--only", nargs="+", choices=SHIPPED, help="recompute these rows only, keep the others")
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    (OUT / "shipped").mkdir(parents=True, exist_ok=True)
    summary = json.loads((OUT / "shipped.json").read_text()) if args.only else {}
    for name in args.only or SHIPPED:
        ck = load_checkpoint(name)
        clean, corrupted, what = circuit_inputs(ck.task, args.examples, device=model_device(ck.model))
        row = {"inputs": what}
        for method in ("eap", "patching"):
            t0 = time.perf_counter()
            c = discover_circuit(ck.model, clean, corrupted=corrupted, method=method)
            row[method] = {
                "seconds": round(time.perf_counter() - t0, 2),
                "size": c.size,
                "edges": c.graph.n_edges,
                "faithfulness": round(c.faithfulness, 4),
                "full": round(c.full, 4),
                "empty": round(c.empty, 4),
                "kept": c.edges,
                "heads": heads_of(c.edges),
                "top": c.top(12),
            }
            c.save(OUT / "shipped" / f"{name}-{method}.json")
            if method == "patching":
                png(c.figure(), FIGURES / f"{name}.png")
                png(c.curve_figure(), FIGURES / f"{name}-curve.png")
            print(name, method, json.dumps({k: v for k, v in row[method].items() if k != "top"}), flush=True)
        if name == "noisy-majority":
            row["heads"] = noisy_majority_heads(ck)
        summary[name] = row
    environment = {"threads": torch.get_num_threads(), "load_average": os.getloadavg(), "examples": args.examples}
    if args.only:
        summary.setdefault("recomputed", {}).update(dict.fromkeys(args.only, environment))
    else:
        summary["environment"] = environment
    (OUT / "shipped.json").write_text(json.dumps(summary, indent=1) + "\n")
    return 0


def noisy_majority_heads(ck) -> dict:
    """Each head's learned accuracy alone and its Shapley value (learned accuracy, 200 sampled permutations) on
    the test split, to set beside the heads the circuit keeps."""
    from interp.analyses.learned_accuracies import learned_accuracy
    from interp.analyses.shapley import shapley_values

    test = ck.task.dataset("test").select(slice(0, 256))
    la = learned_accuracy(ck.model, test, task=ck.task)
    sh = shapley_values(ck.model, test, task=ck.task, method="sampled", samples=200, seed=0)
    d = sh.to_dict()
    return {
        "learned_accuracy_alone": la.to_dict(),
        "shapley": {k: d[k] for k in d if k in ("heads", "values", "shapley", "std_errors")},
    }


if __name__ == "__main__":
    raise SystemExit(main())
