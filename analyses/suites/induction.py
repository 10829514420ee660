"""Analysis suite of the ``repeated-tokens`` task: head scores, composition, the K-composition causal test,
OV copying and circuit heatmaps (``interp analyze`` / ``interp report``).

Works for 1-layer checkpoints too: composition and the causal test then say there is no later layer.
"""

from __future__ import annotations

import torch

from analyses.circuits import full_ov_circuit, k_composition_circuit, ov_copying, positional_qk_circuit
from analyses.composition import MODES, composition_scores
from analyses.head_scores import ablation_induction_test, attention_view, head_scores, task_repeated_tokens
from interp.heads import head_label

N_SEQS = 64  # repeated-token sequences scored per analysis
SEED = 1234  # their seed (not the task's training data seed)


def _tokens(model, n_seqs: int = N_SEQS):
    return task_repeated_tokens(model, n_seqs=n_seqs, seed=SEED)


def analyze(ckpt, device=None) -> dict:
    """JSON summary: per-head scores, composition scores with baseline and top pairs, the causal test and
    the task metrics on the test split."""
    from interp.evaluate import evaluate

    model, task = ckpt.model, ckpt.task
    if device is not None:
        model.to(device, print_details=False)
    L, H = model.cfg.n_layers, model.cfg.n_heads
    toks = _tokens(model)
    scores = head_scores(model, toks)
    copying = ov_copying(model)
    heads = []
    for row, cop in zip(scores.rows(), copying.rows()):
        heads.append({**row, "copying_score": cop["copying_score"], "ov_top1": cop["top1"]})
    comp = composition_scores(model)
    labels = [head_label(l, h) for l in range(L) for h in range(H)]
    composition = {m: comp.scores(m).reshape(L * H, L * H).cpu().tolist() for m in MODES}
    composition.update(head_labels=labels, baseline_mean=comp.baseline_mean, baseline_std=comp.baseline_std,
                       top_K=comp.top_pairs("K", 5))
    out = {
        "task": task.name, "checkpoint": str(ckpt.path), "n_layers": L, "n_heads": H,
        "probe": {"n_seqs": int(toks.shape[0]), "seq_len": int(toks.shape[1]), "repeat_len": int(toks.shape[1] // 2)},
        "heads": heads, "composition": composition,
        "metrics": evaluate(model, task, task.dataset("test")),
    }
    if L > 1:
        test = ablation_induction_test(model, toks, layer=0)
        out["ablation"] = {"layer": 0, "rows": test.rows()}
    else:
        out["ablation"] = None
    return out


def format_summary(summary: dict) -> str:
    """Per-head table, the top K-composition pairs and the strongest effects of the causal test."""
    n_layers = summary["n_layers"]
    lines = [f"{summary['checkpoint']} ({summary['task']}, {n_layers} layer{'s' * (n_layers != 1)} x "
             f"{summary['n_heads']} heads per layer)"]
    m = summary["metrics"]
    lines.append(f"test: repeat accuracy {m['accuracy']:.3f} (loss {m['loss']:.3f}); first-occurrence accuracy "
                 f"{m['first_accuracy']:.3f} (loss {m['first_loss']:.3f})")
    p = summary["probe"]
    lines.append(f"\nhead scores on {p['n_seqs']} sequences [BOS] R R, len(R) = {p['repeat_len']}:")
    cols = [("induction_score", "induction"), ("prev_token_score", "prev-token"), ("duplicate_score", "duplicate"),
            ("bos_score", "BOS"), ("copying_score", "OV copying")]
    lines.append(f"{'head':<6}" + "".join(f"{name:>12}" for _, name in cols))
    for row in summary["heads"]:
        lines.append(f"{row['head']:<6}" + "".join(f"{row[k]:>12.3f}" for k, _ in cols))
    comp = summary["composition"]
    if comp["top_K"]:
        lines.append(f"\ntop K-composition pairs (random baseline {comp['baseline_mean']:.3f} ± {comp['baseline_std']:.3f}):")
        for r in comp["top_K"]:
            lines.append(f"  {r['from']} -> {r['to']}: {r['score']:.3f} ({r['ratio_to_baseline']:.1f}x baseline, z = {r['z']:.1f})")
    else:
        lines.append("\nno head composition (one layer)")
    if summary.get("ablation"):
        rows = sorted(summary["ablation"]["rows"], key=lambda r: -r["drop"])[:5]
        lines.append("\nK-composition causal test (zero-ablate a layer-0 head; induction score of a later head):")
        for r in rows:
            lines.append(f"  ablate {r['ablated']}: {r['head']} {r['induction_score']:.3f} -> {r['ablated_score']:.3f}")
    return "\n".join(lines)


def add_report_sections(ckpt, report, progress: bool = False) -> None:
    """Head scores, composition, causal test, OV copying, circuits of the key heads and one attention view."""
    model, task = ckpt.model, ckpt.task
    L = model.cfg.n_layers
    toks = _tokens(model)
    scores = head_scores(model, toks)
    report.section("Induction and previous-token heads",
                   f"Attention scores of every head on {toks.shape[0]} sequences [BOS] R R with len(R) = "
                   f"{toks.shape[1] // 2} (R uniform over the task's symbols, repeats inside R allowed). Induction: "
                   "attention to the token after an earlier occurrence of the current token. Previous-token: attention "
                   "to the position before. Duplicate: attention to earlier copies of the current token. BOS: "
                   "attention to position 0. Each is the mean attention mass over the queries that have such a target.")
    report.table(scores.rows(), formats={f"{s}_score": ".3f" for s in ("induction", "prev_token", "duplicate", "bos")})
    report.figure(scores.figure(), caption="The same scores as a heatmap.")

    copying = ov_copying(model)
    report.section("OV circuits: copying",
                   "Copying score of each head's full OV circuit W_E W_OV W_U: sum of the real parts of its eigenvalues "
                   "over the sum of their absolute values (+1: attending to a token raises that token's logit). Top-1 / "
                   "top-5: fraction of tokens whose own logit is the highest / among the five highest in their row.")
    report.table(copying.rows(), formats={"copying_score": ".3f", "top1": ".3f", "top5": ".3f"})

    if L < 2:
        report.section("Composition", "This is a one-layer model: no head reads another head's output, so there is "
                       "no Q-, K- or V-composition and no induction head can form.")
        return
    comp = composition_scores(model)
    report.section("Head composition",
                   f"Q-, K- and V-composition scores (TransformerLens all_composition_scores) between each earlier and "
                   f"each later head. Random matrices of this model's shapes score {comp.baseline_mean:.3f} ± "
                   f"{comp.baseline_std:.3f}; only scores well above that mean composition.")
    for mode in MODES:
        report.figure(comp.figure(mode), caption=f"{mode}-composition.")
    report.table(comp.top_pairs("K", 5), columns=["from", "to", "score", "ratio_to_baseline", "z"],
                 formats={"score": ".3f", "ratio_to_baseline": ".1f", "z": ".1f"}, caption="Top K-composition pairs.")

    test = ablation_induction_test(model, toks, layer=0)
    report.section("K-composition causal test",
                   "Each layer-0 head is zero-ablated in turn (its output removed) and every later head's induction "
                   "score is measured again on the same sequences. A previous-token head that feeds an induction head "
                   "through K-composition collapses that head's score.")
    report.figure(test.figure())
    report.table(sorted(test.rows(), key=lambda r: -r["drop"])[:8], formats={"induction_score": ".3f", "ablated_score": ".3f", "drop": ".3f"},
                 caption="The eight largest drops.")

    prev = scores.best("prev_token", layer=0)
    ind = scores.best("induction", layer=L - 1)
    report.section("Circuits of the key heads",
                   f"{head_label(*prev)} has the highest previous-token score in layer 0 and {head_label(*ind)} the highest "
                   f"induction score in layer {L - 1}. Shown: the positional QK circuit of the previous-token head (query "
                   f"position by key position; a previous-token head peaks just below the diagonal), the full OV circuit "
                   f"of the induction head (a copying head has a bright diagonal), and the K-composition circuit "
                   f"W_E W_QK W_OV^T W_E^T through the pair (a diagonal means: attend where the previous token equals the "
                   f"current token).")
    report.figure(positional_qk_circuit(model, prev).figure())
    report.figure(full_ov_circuit(model, ind).figure())
    report.figure(k_composition_circuit(model, prev, ind).figure())
    view = attention_view(model, toks[0], heads=[prev, ind], title=f"{head_label(*prev)} and {head_label(*ind)} on [BOS] R R")
    report.attention(view, caption="The previous-token head attends one position back; the induction head attends to "
                     "the token after the current token's previous occurrence (an offset diagonal in the second half).")
