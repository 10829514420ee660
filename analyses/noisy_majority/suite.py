"""The noisy-majority suite (Fraknói 2024, §5.4): what ``interp analyze`` prints and ``interp report`` draws.

``analyze`` uses the task's full train split (separators are fitted there) and test split (everything is
scored there). The report sections subsample where the work is repeated per setting (Figure 8) and say so.
"""

from __future__ import annotations

import math
import time

from interp.checkpoint import Checkpoint
from interp.device import model_device
from interp.suite import FunctionSuite

from . import inputs
from .head_outputs import head_outputs
from .head_summary import HeadSummary, checkpoint_summary
from .interventions import attention_intervention_sweep

REPORT_TRAIN, REPORT_TEST = 2000, 500  # Figure 8 in the report: subsample sizes
PATCH_SEQS, PATCH_DIGITS = 16, 40  # the report's activation patching: near-tie pairs of this many digits


def analyze(ckpt: Checkpoint) -> HeadSummary:
    """The head table and the pair tables (``to_dict()`` is ``interp analyze --json``, ``text()`` its table)."""
    summary, *_ = checkpoint_summary(ckpt)
    return summary


def add_report_sections(ckpt: Checkpoint, report, progress: bool = False) -> None:
    """Head table, Figures 4, 5, 7, 6 and 8, and activation patching (the report itself adds every head's
    attention view); Figure 10 first for a model trained with halving heads."""
    from ..halving import add_halving_section

    add_halving_section(ckpt, report)
    model = ckpt.model
    L, H = model.cfg.n_layers, model.cfg.n_heads
    t0 = time.perf_counter()
    s, train, test, _tr, te = checkpoint_summary(ckpt)
    secs = time.perf_counter() - t0
    report.section(
        "Heads: learned and separation accuracy",
        "Fraknói 2024, §5.4. Learned accuracy: the model's test accuracy when every other head is zeroed "
        "(Definition 5.1). Separation accuracy: test accuracy of a linear SVC (C=1000, features centred at "
        "the train mean) fitted on the train split to the head's output at '=' (Definition 5.2), with its ROC "
        "AUC. w01 and w02: how much more the '=' query attends to a 0 than to a 1 or a 2 (geometric mean over "
        "test sequences of the per-token attention ratio). The grade is based on separation accuracy alone: "
        f"good if >= {s.thresholds['good']}, partial if >= {s.thresholds['partial']}, else bad; ratios within a "
        f"factor {s.thresholds['band']:g} of 1 read as 'alike'.",
    )
    report.text(
        f"All heads: test accuracy {s.model_accuracy:.4f}. No heads (direct path only): {s.direct_accuracy:.4f}. "
        f"Chance (commonest answer): {s.chance:.3f}. Computed on {s.n_train} train and {s.n_test} test sequences "
        f"in {secs:.1f} s."
    )
    if s.warning:
        report.text("Warning: " + s.warning + ".")
    limited = [r["head"] for r in s.rows if r["threshold_limited"]]
    if limited:
        report.text(
            f"ROC AUC 1 with accuracy below 1 ({', '.join(limited)}): the head's output ranks every test "
            "sequence correctly, but the SVC's threshold, fitted on the shorter train sequences, misplaces some."
        )
    report.table(
        s.rows,
        columns=["head", "learned_accuracy", "separation_accuracy", "roc_auc", "w01", "w02", "verdict"],
        caption="Per-head summary",
        formats={"learned_accuracy": ".3f", "separation_accuracy": ".3f", "roc_auc": ".3f", "w01": ".3g", "w02": ".3g"},
    )
    _shapley_section(ckpt, report, s, test, te)
    if s.learned_pairs is not None and L * H >= 2:
        report.section(
            "Head pairs",
            "Figure 4: separation accuracy of a linear SVC on the outputs of each pair of heads "
            "(singles on the diagonal; heads sorted by it). Figure 5: learned accuracy of each pair (all other "
            "heads zeroed). Two heads that are bad alone can be good together.",
        )
        report.figure(s.separation_pairs.figure(), caption="Separation accuracy of every pair of heads (Figure 4).")
        report.figure(s.learned_pairs.figure(), caption="Learned accuracy of every pair of heads (Figure 5).")
    else:
        report.section("Head pairs", f"Not drawn: this model has {L * H} head, so there are no pairs.")

    report.section(
        "Attention ratios",
        "Figure 7: w01 against w02 per head (log axes), coloured by separation accuracy. "
        "The thesis finds good heads near w01 = 1 with w02 >> 1: they weigh 0s and 1s alike and ignore 2s.",
    )
    report.figure(s.figure(), caption=s.ratio_note())

    order = sorted(range(len(s.rows)), key=lambda i: s.rows[i]["separation_accuracy"], reverse=True)
    names = [r["head"] for r in s.rows]
    shown = [names[order[0]]] + ([names[order[-1]]] if len(order) > 1 else [])
    which = f"the best head ({shown[0]})" + (f" and the worst ({shown[1]})" if len(shown) > 1 else "")
    report.section(
        "Head outputs",
        f"Figure 6: the outputs at '=' of {which} by separation accuracy, coloured by the "
        "right answer, with their value vectors for 0, 1 and 2 where a token's value does not depend on its "
        "position (layer 0 of a model without positional embedding).",
    )
    if model.cfg.d_head == 2:
        for name in shown:
            out = head_outputs(model, te, heads=name)
            note = "" if out.values is not None else " No value vectors: they depend on position or layer here."
            report.figure(out.figure(max_points=600), caption=f"Head {name}: 600 test sequences.{note}")
    else:
        report.text(f"Not drawn: the scatter needs d_head = 2 and this model has d_head = {model.cfg.d_head}.")

    n_tr, n_te = min(REPORT_TRAIN, len(train)), min(REPORT_TEST, len(test))
    layer_words = f"every head ({H})" if L == 1 else f"every head of layer 0 ({H} of its {L * H} heads)"
    report.section(
        "Attention interventions",
        f"Figure 8: the '=' query's attention of {layer_words} set by hand, then the separation accuracy of "
        "each head's output, averaged over heads. Left: 2s ignored (w02 = inf), w01 varied. Right: w01 = 1, "
        f"w02 varied. Subsampled to keep the report fast: the first {n_tr} train and {n_te} test sequences.",
    )
    sweep = attention_intervention_sweep(model, test.select(slice(0, n_te)), train=train.select(slice(0, n_tr)))
    report.figure(
        sweep.figure(), caption=f"Mean separation accuracy over the {H} heads of layer 0 under hand-set attention."
    )
    report.table(
        [{"w01": w, "mean separation accuracy": a} for w, a in zip(sweep.w01_values, sweep.w01_mean.tolist())],
        caption="w02 = inf",
        formats={"w01": ".3g", "mean separation accuracy": ".3f"},
    )
    report.table(
        [
            {"w02": ("inf" if math.isinf(w) else f"{w:g}"), "mean separation accuracy": a}
            for w, a in zip(sweep.w02_values, sweep.w02_mean.tolist())
        ],
        caption="w01 = 1",
        formats={"mean separation accuracy": ".3f"},
    )
    add_patching_section(ckpt, report)


def add_patching_section(ckpt: Checkpoint, report) -> None:
    """Activation patching on near-tie pairs whose answers differ by one swapped digit: every head's output, every
    head's attention pattern and the residual stream at every position, clean into corrupted."""
    from ..patching import activation_patching
    from .corrupt import corrupted_pair

    model, task = ckpt.model, ckpt.task
    n_digits = min(PATCH_DIGITS, task.n_ctx - 4)  # a task of shorter sentences: as long as they get
    clean, corr = corrupted_pair(task, PATCH_SEQS, n_digits=n_digits, device=model_device(model))

    def run(**kw):
        return activation_patching(model, clean, corrupted=corr, metric="logit_diff", **kw)

    heads, noised = run(where="z", per="head"), run(where="z", per="head", direction="noising")
    every, pattern, resid = run(where="z", per="layer"), run(where="pattern", per="head"), run(where="resid_pre")
    top = heads.top(3)
    weakest = min(noised.top(len(noised.values.flatten())), key=lambda r: r["normalized"])
    report.section(
        "Activation patching",
        f"{PATCH_SEQS} sequences of {n_digits} digits near a tie (|n0 - n1| <= 1) and the same with one 0 "
        "and 1 swapped, which flips the answer. Metric: logit of the clean answer minus the corrupted answer "
        f"at '=': clean {heads.clean:.2f}, corrupted {heads.corrupted:.2f}; 1 = clean, 0 = corrupted. "
        "Each head's output (hook_z at every position) patched from the clean run into the corrupted one "
        "(denoising) restores at most "
        + ", ".join(f"{r['head']} {r['normalized']:.2f}" for r in top)
        + f"; every head of layer 0 at once: {float(every.normalized[0]):.2f} (the single-head "
        f"effects sum to {float(heads.normalized[0].sum()):.2f}). Patched the other "
        f"way (noising), no single head breaks it: the least that survives is {weakest['normalized']:.2f} "
        f"({weakest['head']}). Attention patterns patched head by head restore at most "
        f"{float(pattern.normalized.max()):.2f}: the answer travels in the values of the swapped digit, "
        "not in where the heads attend.",
    )
    report.figure(heads.figure(), caption="Denoising, one head (all positions) at a time.")
    report.figure(
        resid.figure(),
        caption="Residual stream entering each layer, one position at a time (the swapped "
        "digit sits at a different position in each sequence, so each position holds a few of them).",
    )


SHAPLEY_SAMPLES = 200  # permutations beyond 16 heads (shapley_values' method="auto": exact up to 16)


def _shapley_section(ckpt: Checkpoint, report, s: HeadSummary, test, te) -> None:
    """Shapley values of the heads with v = learned accuracy (Fraknói 2024, Definition 5.3), next to the single-head
    numbers of the head table: exact up to 16 heads, else sampled."""
    from interp.query_forward import supports_query_forward

    from ..shapley import shapley_values

    model = ckpt.model
    n = model.cfg.n_layers * model.cfg.n_heads
    data = te if supports_query_forward(model) else test  # the cached outputs serve the fast method
    t0 = time.perf_counter()
    res = shapley_values(model, data, value="learned-accuracy", samples=SHAPLEY_SAMPLES, task=ckpt.task)
    if res.exact:
        how = f"exact, from all {2**n:,} coalitions"
    else:
        how = f"estimated from {SHAPLEY_SAMPLES} random permutations (error bars: one standard error)"
    secs = time.perf_counter() - t0
    report.section(
        "Heads: Shapley values",
        "Fraknói 2024, §5.5, Definition 5.3: a head's Shapley value is its marginal contribution to the learned "
        "accuracy (all other heads zeroed), averaged over the orders in which heads can be added; the values "
        "add up to v(all heads) - v(no heads). Banzhaf: the plain mean of the same contributions. Pairwise "
        "interaction > 0: the two heads are worth more together than apart (synergy); < 0: redundant.",
    )
    sep = {r["head"]: r for r in s.rows}
    good = [r["head"] for r in s.rows if r["separation_accuracy"] >= s.thresholds["good"]]
    top = res.ranking()[: len(good)]
    agree = len(set(top) & set(good))
    words = (
        f"{agree} of the {len(good)} heads graded good by separation accuracy are among the {len(good)} highest "
        "Shapley values"
        if good
        else "no head is graded good by separation accuracy"
    )
    report.text(
        f"Shapley values {how}, on {s.n_test} test sequences in {secs:.1f} s. v(all) = {res.v_all:.4f}, "
        f"v(none) = {res.v_empty:.4f}, sum of the values {float(res.shapley.sum()):.4f}. "
        f"Highest: {', '.join(res.ranking()[:3])}; {words}."
    )
    rows = []
    for i, name in enumerate(res.names):
        row = {"head": name, "shapley": float(res.shapley[i])}
        if res.banzhaf is not None:
            row["banzhaf"] = float(res.banzhaf[i])
        if res.stderr is not None:
            row["stderr"] = float(res.stderr[i])
        row["learned_accuracy"] = sep[name]["learned_accuracy"]
        row["separation_accuracy"] = sep[name]["separation_accuracy"]
        rows.append(row)
    rows.sort(key=lambda r: -r["shapley"])
    cols = [
        c for c in ("head", "shapley", "stderr", "banzhaf", "learned_accuracy", "separation_accuracy") if c in rows[0]
    ]
    report.table(
        rows,
        columns=cols,
        caption="Heads by Shapley value (v = learned accuracy), with their single-head "
        "learned and separation accuracies",
        formats={c: ".4f" for c in cols if c != "head"},
    )
    report.figure(
        res.figure(), caption=f"Shapley and Banzhaf values per head; right: pairwise Shapley interactions ({how})."
    )


def add_sweep_sections(directory, report, progress: bool = False) -> None:
    """The sweep report's noisy-majority part (``interp report DIR``): the per-head census of every run (cached in
    DIR/census.jsonl), runs with k good heads, Figure 7 over the population and Figure 9 (right); and, where runs
    have snapshots, the census over training (cached in DIR/census_over_training.jsonl)."""
    from .census import census

    t0 = time.perf_counter()
    c = census(directory, progress=progress, missing="skip")
    secs = time.perf_counter() - t0
    report.section(
        "Heads across the population",
        "Fraknói 2024, §5.4 over every run: each head's separation accuracy (linear SVC, C=1000, centred, fitted on "
        f"the first {c.train_size} train sequences, scored on the first {c.test_size} test sequences), "
        "learned accuracy and w01/w02, as in each model's head summary; a head is good at separation "
        "accuracy >= 0.95. Cached per run in census.jsonl beside the results.",
    )
    report.text(
        f"{len(c.runs)} runs, {sum(len(r['heads']) for r in c.runs)} heads ({secs:.1f} s, cached runs "
        "included)."
        + (
            f" Left out: {len(c.skipped)} runs whose checkpoints are not in the directory and that "
            "census.jsonl does not hold."
            if c.skipped
            else ""
        )
    )
    if not c.runs:
        return
    report.result(
        c,
        caption="Figure 7 over the population: w01 against w02 of every head (log axes; 0 and inf "
        "clipped), coloured by separation accuracy.",
    )
    report.figure(
        c.separation_survival().figure(),
        caption="1 - CDF of the separation accuracy of individual heads, per number of heads in the model "
        "(Fraknói 2024, Figure 9, right: the thesis compares 1-head and 64-head models).",
    )
    add_training_census_section(directory, report, progress)


def add_training_census_section(directory, report, progress: bool = False) -> None:
    """The census over training (``interp sweep --snapshots N``): every head at every snapshot, by run outcome;
    nothing where no run of the sweep has snapshots."""
    from .training_census import census_over_training, has_snapshots

    if not has_snapshots(directory):
        return
    t0 = time.perf_counter()
    tc = census_over_training(directory, progress=progress)
    secs = time.perf_counter() - t0
    report.section(
        "Heads over training",
        "The same census at every snapshot of every run that has snapshots (interp sweep --snapshots N): each "
        "head's w01, w02 and separation accuracy (on the first "
        f"{tc.train_size} train and {tc.test_size} test sequences) and the snapshot's test accuracy (whole test "
        "split), with each run's outcome (100% test accuracy at its kept epoch, and one head left for a halving "
        "run, or not): when good heads appear, whether a failing run had one and lost it, and where failing heads "
        "attend over time. Cached per run in census_over_training.jsonl.",
    )
    report.text(
        f"{len(tc.runs)} runs with snapshots, {sum(len(r['snapshots']) for r in tc.runs)} snapshots ({secs:.1f} s, "
        "cached snapshots included)."
        + (f" {len(tc.without_snapshots)} runs have no snapshots." if tc.without_snapshots else "")
    )
    if not tc.runs:
        return
    report.result(
        tc,
        caption="Figure 7 over training: each head's path in the (w01, w02) plane (a large dot at the last "
        "snapshot) and w01, w02 and separation accuracy against the epoch, coloured by the run's outcome.",
    )


def _hypotheses(task):
    """The task's hypotheses (``interp hypothesis``), imported when asked for."""
    from .hypotheses import hypotheses

    return hypotheses(task)


SUITE = FunctionSuite(
    "noisy-majority",
    analyze,
    add_report_sections,
    add_sweep_sections,
    typed_fn=inputs.typed_example,
    corruptions_fn=inputs.corruptions,
    hypotheses_fn=_hypotheses,
)
