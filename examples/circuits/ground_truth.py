"""Circuit discovery against circuits known by construction: edge ROC AUC, faithfulness and time of every method.

Models: the four tracr programs shipped in ``tests/fixtures/circuits/`` (compiled by
``interp.analyses.circuit_groundtruth.compile_tracr``; true edges read off their weights), the minimal noisy-majority
transformer (Fraknói 2024, §5.3; true edges: the input into the head's query, key and value, the head into the
logits; the input's direct path to the logits carries the constant the bias cancels) and the shipped two-layer
induction model (no full ground truth: whether the previous-token head -> induction head key edge is kept, and its
rank). Ablations: ``patch`` from independently drawn inputs (ACDC's "random ablation") and ``zero``.

    OMP_NUM_THREADS=1 python examples/circuits/ground_truth.py   # writes examples/results/circuits/ground_truth.*
"""

from __future__ import annotations

import csv
import json
import os
import platform
import sys
import time
from pathlib import Path

import torch

from interp.analyses.circuit_discovery import METHODS, discover_circuit, edge_roc_auc
from interp.analyses.circuit_groundtruth import TRACR_PROGRAMS, groundtruth_inputs, load_groundtruth

ROOT = Path(__file__).resolve().parents[2]
OUT = ROOT / "examples" / "results" / "circuits"
FIXTURES = ROOT / "tests" / "fixtures" / "circuits"
N = 64  # inputs per model

# ACDC's published edge ROC AUC on tracr (its experiments/results/auc_tables.tex, via shared/reference/peers.md §16)
PUBLISHED = {
    ("frac_prevs", "acdc", "zero"): 1.0,
    ("frac_prevs", "acdc", "patch"): 0.6,
}


def run(name, model, clean, corrupted, metric, truth, ablation):
    rows = []
    for method in METHODS:
        kw = {"steps": 5} if method == "eap-ig" else {}
        t0 = time.perf_counter()
        c = discover_circuit(model, clean, corrupted=corrupted, ablation=ablation, metric=metric, method=method, **kw)
        seconds = time.perf_counter() - t0
        rows.append(
            {
                "model": name,
                "ablation": ablation,
                "method": method,
                "auc": round(edge_roc_auc(c, truth), 4) if truth else None,
                "faithfulness": round(c.faithfulness, 4),
                "kept": c.size,
                "edges": c.graph.n_edges,
                "true_edges": len(truth),
                "true_kept": sum(c.kept[c.graph.edge_index(e)].item() for e in truth),
                "seconds": round(seconds, 3),
                "published_auc": PUBLISHED.get((name, method, ablation)),
            }
        )
        print(rows[-1], flush=True)
    return rows


def minimal_majority_rows():
    from interp.analyses.noisy_majority.corrupt import corrupted_pair
    from interp.analyses.noisy_majority.handbuilt import minimal_majority_transformer
    from interp.tasks.noisy_majority import NoisyMajority

    task = NoisyMajority()
    model = minimal_majority_transformer(task)
    truth = ["input->L0H0.q", "input->L0H0.k", "input->L0H0.v", "L0H0->logits"]
    clean, corr = corrupted_pair(task, N, n_digits=20)
    rows = run("minimal_majority", model, clean, corr, "logit_diff", truth, "patch")
    rows += run("minimal_majority", model, clean, None, "logit_diff", truth, "zero")
    return rows


def induction_rows():
    import interp
    from interp.analyses.pattern_scores import head_scores
    from interp.analyses.repeated_tokens.corrupt import corrupted_pair
    from interp.analyses.repeated_tokens.probe import probe_tokens

    ck = interp.load_checkpoint("repeated-tokens")
    scores = head_scores(ck.model, probe_tokens(ck.task, 64))
    p = scores.best("prev_token", 0)
    i = scores.best("induction", 1)
    edge = f"L{p[0]}H{p[1]}->L{i[0]}H{i[1]}.k"
    clean, corr = corrupted_pair(ck.task, N, kind="key")
    rows = []
    for method in METHODS:
        kw = {"steps": 5} if method == "eap-ig" else {}
        t0 = time.perf_counter()
        c = discover_circuit(ck.model, clean, corrupted=corr, method=method, **kw)
        rank = [r["edge"] for r in c.top(c.graph.n_edges)].index(edge) + 1
        rows.append(
            {
                "model": "repeated-tokens (shipped)",
                "ablation": "patch",
                "method": method,
                "auc": None,
                "faithfulness": round(c.faithfulness, 4),
                "kept": c.size,
                "edges": c.graph.n_edges,
                "true_edges": 1,
                "true_kept": int(c.kept[c.graph.edge_index(edge)]),
                "seconds": round(time.perf_counter() - t0, 3),
                "published_auc": None,
                "note": f"{edge} (previous-token head -> induction head's key) ranked {rank}",
            }
        )
        print(rows[-1], flush=True)
    return rows


def main() -> int:
    torch.set_num_threads(1)
    rows = []
    for name in TRACR_PROGRAMS:
        model, meta = load_groundtruth(FIXTURES / f"tracr-{name}.safetensors")
        for ablation in ("patch", "zero"):
            clean, corr, metric = groundtruth_inputs(model, meta, N, ablation=ablation)
            rows += run(name, model, clean, corr, metric, meta["true_edges"], ablation)
    rows += minimal_majority_rows()
    rows += induction_rows()
    OUT.mkdir(parents=True, exist_ok=True)
    env = {
        "threads": torch.get_num_threads(),
        "load_average": os.getloadavg(),
        "python": sys.version.split()[0],
        "torch": torch.__version__,
        "machine": platform.machine(),
        "examples": N,
    }
    (OUT / "ground_truth.json").write_text(json.dumps({"rows": rows, "environment": env}, indent=1) + "\n")
    with open(OUT / "ground_truth.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]) + ["note"])
        w.writeheader()
        w.writerows(rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
