"""Across a population: does each run of a noisy-majority sweep carry the count difference, and do failing runs
carry it and misread it, or not carry it?

    python examples/results/hypotheses/population.py SWEEP_DIR OUT.json [KEY=VALUE ...] [--pairs=N] [--steps=S]

For each selected run (KEY=VALUE selects rows of SWEEP_DIR/results.jsonl, as ``interp table`` reads them), on its
test split:

- interchange interventions of ``diff = n0 - n1`` (the shipped hypothesis ``diff``): the IIA of each head's output at
  '=' alone, of every head together, and of a learned 1-dimensional subspace of every head together (DAS, trained on
  one half of the test sentences, scored on ``--pairs`` pairs of the other half), beside 10 random directions;
- the **boundary set**: 2,000 fresh sentences of 151-200 digits with n0 - n1 = 0 (answer '4', 1,000) or -1 ('5',
  1,000), the decisions the failing runs get wrong. On it: the model's accuracy; the ROC AUC of its own logit
  difference logit('4') - logit('5') between the two classes (1.0: every tie scores above every one-more-1 sentence,
  so one shift of the threshold would make every answer right: the count is carried and misread); the accuracy of
  the best threshold on that logit difference; the same AUC along the DAS direction; and a linear probe of the
  heads' outputs together (LinearSVC, C = 1000, centred, fitted on half of the boundary set and scored on the other:
  does any direction of the heads' outputs tell the two apart?).

Writes every run's numbers and the summary (failing vs succeeding runs, Wilson 95% intervals of shares and Newcombe
intervals of their differences, ``interp.analyses.populations``) to OUT.json, and prints the summary.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import torch

from interp.analyses.hypotheses import Alignment, distributed_alignment_search, interchange_accuracy
from interp.analyses.hypotheses.engine import query_activations
from interp.analyses.noisy_majority.hypotheses import diff_model
from interp.analyses.populations import newcombe_interval, wilson_interval
from interp.query_forward import logits_at
from interp.sweep_directory import checkpoint_path, select_rows, where_of
from interp.tasks import load_checkpoint
from interp.tasks.noisy_majority import FIVE, FOUR, make_sentences


def boundary_set(n: int = 2000, lengths=(151, 200), seed: int = 0):
    """``n`` sentences, half with n0 - n1 = 0 and half with -1, lengths uniform in ``lengths``, digits shuffled."""
    gen = torch.Generator().manual_seed(seed)
    seqs = []
    for i in range(n):
        want = 0 if i % 2 == 0 else -1
        while True:
            length = int(torch.randint(lengths[0], lengths[1] + 1, (1,), generator=gen))
            n2 = int(torch.randint(length // 4, length // 2 + 1, (1,), generator=gen))
            m = length - n2
            if (m % 2 == 0) == (want == 0):
                break
        n0 = m // 2 if want == 0 else (m - 1) // 2
        digits = torch.tensor([0] * n0 + [1] * (m - n0) + [2] * n2)
        seqs.append(digits[torch.randperm(length, generator=gen)])
    return make_sentences(seqs)


def auc(pos: torch.Tensor, neg: torch.Tensor) -> float:
    """P(score of a random positive > a random negative) + half the ties: the ROC AUC."""
    from sklearn.metrics import roc_auc_score

    y = torch.cat([torch.ones(len(pos)), torch.zeros(len(neg))]).numpy()
    return float(roc_auc_score(y, torch.cat([pos, neg]).double().numpy()))


def best_threshold_accuracy(score: torch.Tensor, label: torch.Tensor) -> float:
    """The accuracy of the best single threshold on ``score`` (label 1 above it), either orientation."""
    order = torch.argsort(score)
    y = label[order].float()
    n = len(y)
    above_pos = y.flip(0).cumsum(0).flip(0)  # positives at or above each cut
    below_neg = torch.cat([torch.zeros(1), (1 - y).cumsum(0)[:-1]])
    acc = (above_pos + below_neg) / n
    return float(torch.maximum(acc.max(), 1 - acc.min()))


def probe_accuracy(z: torch.Tensor, label: torch.Tensor, seed: int = 0) -> float:
    from sklearn.svm import LinearSVC

    gen = torch.Generator().manual_seed(seed)
    perm = torch.randperm(len(z), generator=gen)
    tr, te = perm[: len(z) // 2], perm[len(z) // 2 :]
    mu = z[tr].mean(0)
    svc = LinearSVC(C=1000, max_iter=200_000).fit((z[tr] - mu).double().numpy(), label[tr].numpy())
    return float((torch.tensor(svc.predict((z[te] - mu).double().numpy())) == label[te]).float().mean())


def run_one(path: Path, pairs: int, steps: int, boundary) -> dict:
    ck = load_checkpoint(path, device="cpu")
    model, task = ck.model, ck.task
    data = task.dataset("test")
    cm = diff_model()
    n_heads = model.cfg.n_heads
    sites = [f"L0H{h}@answer" for h in range(n_heads)] + ["L0H*@answer"]
    iia = interchange_accuracy(
        model, data, causal_model=cm, alignment=[Alignment("diff", s) for s in sites], pairs=pairs
    )
    das = distributed_alignment_search(
        model, data, causal_model=cm, variable="diff", site="L0H*@answer", k=1, pairs=pairs, steps=steps
    )
    rec = das.das[0]
    with torch.no_grad():
        at = boundary.answer_pos[:, None]
        z = query_activations(model, boundary.tokens, at, "z")[:, 0].flatten(1)  # [n, heads * d_head]
        logits = logits_at(model, boundary.tokens, at)[:, 0]
    margin = logits[:, FOUR] - logits[:, FIVE]
    tie = boundary.labels == FOUR
    pred = logits.argmax(-1)
    coord = z @ rec["basis"].float()[:, 0]
    coord = coord if auc(coord[tie], coord[~tie]) >= 0.5 else -coord
    return {
        "test_accuracy": None,
        "iia_heads": [float(x) for x in iia.iia[:n_heads]],
        "iia_heads_changed": [float(x) for x in iia.iia_changed[:n_heads]],
        "iia_all_heads": float(iia.iia[-1]),
        "das_heldout": rec["heldout_iia"],
        "das_train": rec["train_iia"],
        "das_random_mean": sum(rec["random_iia"]) / len(rec["random_iia"]),
        "das_whole": rec["whole_iia"],
        "das_changed": float(das.iia_changed[0]),
        "base_accuracy_pairs": das.base_accuracy,
        "boundary_accuracy": float((pred == boundary.labels).float().mean()),
        "boundary_accuracy_tie": float((pred[tie] == FOUR).float().mean()),
        "boundary_accuracy_minus1": float((pred[~tie] == FIVE).float().mean()),
        "readout_auc": auc(margin[tie], margin[~tie]),
        "readout_best_threshold": best_threshold_accuracy(margin, tie.long()),
        "das_coordinate_auc": auc(coord[tie], coord[~tie]),
        "probe_accuracy": probe_accuracy(z, tie.long()),
        "margin_tie_min": float(margin[tie].min()),
        "margin_minus1_max": float(margin[~tie].max()),
    }


def share(rows, key, pred) -> dict:
    k = sum(1 for r in rows if pred(r[key]))
    lo, hi = wilson_interval(k, len(rows))
    return {"k": k, "n": len(rows), "share": k / len(rows) if rows else None, "low": lo, "high": hi}


def summary(rows: list[dict]) -> dict:
    fail = [r for r in rows if r["test_accuracy"] < 1.0]
    ok = [r for r in rows if r["test_accuracy"] >= 1.0]
    tests = {
        "das_heldout >= 0.99": ("das_heldout", lambda v: v >= 0.99),
        "readout_auc == 1 (ordered: carried)": ("readout_auc", lambda v: v >= 1.0),
        "readout_best_threshold == 1": ("readout_best_threshold", lambda v: v >= 1.0),
        "probe_accuracy == 1": ("probe_accuracy", lambda v: v >= 1.0),
        "boundary_accuracy == 1": ("boundary_accuracy", lambda v: v >= 1.0),
        "max single-head IIA on changed pairs >= 0.9": ("iia_heads_changed", lambda v: max(v) >= 0.9),
    }
    out = {"failing": len(fail), "succeeding": len(ok), "shares": {}}
    for name, (key, pred) in tests.items():
        f, s = share(fail, key, pred), share(ok, key, pred)
        d = newcombe_interval(f["k"], f["n"], s["k"], s["n"])
        out["shares"][name] = {"failing": f, "succeeding": s, "difference": [d[0], d[1]]}
    for key in ("readout_auc", "das_coordinate_auc", "probe_accuracy", "boundary_accuracy", "das_heldout"):
        for name, group in (("failing", fail), ("succeeding", ok)):
            vals = sorted(r[key] for r in group)
            if vals:
                out.setdefault("medians", {}).setdefault(key, {})[name] = [vals[0], vals[len(vals) // 2], vals[-1]]
    return out


def main(argv: list[str]) -> None:
    torch.set_num_threads(1)
    opts = {a.split("=", 1)[0][2:]: a.split("=", 1)[1] for a in argv if a.startswith("--")}
    argv = [a for a in argv if not a.startswith("--")]
    directory, out = Path(argv[0]), Path(argv[1])
    pairs, steps = int(opts.get("pairs", 1000)), int(opts.get("steps", 300))
    rows_in = select_rows(directory, where_of(argv[2:]))
    boundary = boundary_set()
    done = {}
    if out.exists():  # resume: runs already measured are kept
        done = {r["name"]: r for r in json.loads(out.read_text())["runs"]}
    rows = []
    t0 = time.perf_counter()
    for i, r in enumerate(rows_in):
        if r["name"] in done:
            rows.append(done[r["name"]])
            continue
        got = run_one(checkpoint_path(directory, r), pairs, steps, boundary)
        got.update({"name": r["name"], "seed": r["seed"], "test_accuracy": r["accuracy"]["test"]})
        rows.append(got)
        print(
            f"{i + 1}/{len(rows_in)} seed {r['seed']} test {got['test_accuracy']:.3f}: DAS {got['das_heldout']:.3f} "
            f"boundary {got['boundary_accuracy']:.3f} readout AUC {got['readout_auc']:.4f} probe "
            f"{got['probe_accuracy']:.3f} ({time.perf_counter() - t0:.0f} s)",
            flush=True,
        )
        tmp = out.with_suffix(".tmp")
        tmp.write_text(json.dumps({"runs": rows}, indent=1))
        tmp.replace(out)
    result = {
        "sweep": str(directory),
        "selection": argv[2:],
        "pairs": pairs,
        "steps": steps,
        "runs": rows,
        "summary": summary(rows),
    }
    tmp = out.with_suffix(".tmp")
    tmp.write_text(json.dumps(result, indent=1))
    tmp.replace(out)
    print(json.dumps(result["summary"], indent=1))


if __name__ == "__main__":
    main(sys.argv[1:])
