"""Whole reports, assembled: ``interp report CHECKPOINT`` (the model card, the task suite's sections and the
attention patterns of every head on a few examples) and ``interp report DIR`` (a sweep directory: Table 1, the
accuracy figures and the task suite's population sections), each one self-contained page
(:class:`interp.report_page.Report`) written atomically.
"""

from __future__ import annotations

import html
import json
import numbers
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from interp.analyses import suite_for
from interp.checkpoint import Checkpoint
from interp.device import model_device
from interp.errors import InterpError, TaskError
from interp.files import AtomicFile
from interp.loading import load_checkpoint
from interp.registry import get_task
from interp.report_page import Report
from interp.visualize import render_table

if TYPE_CHECKING:
    from .task import Task


def write_report(checkpoint, out, device: str | None = None, progress: bool = True) -> Path:
    """Build the report of ``checkpoint`` (a path, a shipped name, or a loaded :class:`Checkpoint`) and
    write it to ``out`` atomically. Bad paths and checkpoints fail before any work, leaving no file."""
    with AtomicFile(out, "the report") as output:  # an unwritable path fails before any work
        ckpt = checkpoint if isinstance(checkpoint, Checkpoint) else load_checkpoint(checkpoint, device=device)
        report = build_report(ckpt, progress=progress)
        html_text = report.html()
        output.commit(lambda tmp: Path(tmp).write_text(html_text, encoding="utf-8"))
    return output.path


STEPS = ("model card", "analyses", "attention spectrum", "circuit", "attention patterns")
EXAMPLE_TOKENS = 28  # length of the examples shown in the attention views
CIRCUIT_EXAMPLES = 16  # clean examples (or corrupted pairs) of the report's circuit section: EAP on a small batch


def build_report(ckpt, progress: bool = True) -> Report:
    """The :class:`Report` of a loaded checkpoint: model card, the task suite's sections, attention views."""
    from tqdm import tqdm

    report = Report(
        title=f"{ckpt.task.name}: {Path(ckpt.path).name if ckpt.path else 'model'}",
        subtitle=f"interp report of {ckpt.name}, written {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}",
    )
    bar = tqdm(total=len(STEPS), desc="report", unit="step", disable=not progress, file=sys.stderr, leave=False)
    try:
        for step, fn in zip(
            STEPS, (add_model_card, add_suite_sections, add_attention_spectrum, add_circuit, add_attention_views)
        ):
            bar.set_postfix_str(step)
            report.on_section = lambda title, step=step: bar.set_postfix_str(
                step if title.lower() == step else f"{step}: {title}"
            )
            fn(ckpt, report, progress)
            bar.update(1)
    finally:
        report.on_section = None
        bar.close()
    return report


# the HookedTransformerConfig fields a model card shows for a model without a ModelSpec
ARCHITECTURE = (
    "original_architecture",
    "n_layers",
    "d_model",
    "n_heads",
    "d_head",
    "n_key_value_heads",
    "d_mlp",
    "d_vocab",
    "d_vocab_out",
    "n_ctx",
    "attn_only",
    "parallel_attn_mlp",
    "gated_mlp",
    "act_fn",
    "normalization_type",
    "final_rms",
    "positional_embedding_type",
    "rotary_dim",
    "use_local_attn",
    "window_size",
    "attn_scores_soft_cap",
    "output_logits_soft_cap",
    "dtype",
)


def _config_of(model) -> dict[str, Any]:
    from interp.rebuild import config_to_json

    return config_to_json(model.cfg)


def add_model_card(ckpt, report: Report, progress: bool = False) -> None:
    """Task, model spec, training provenance, and accuracy on every split (evaluated now)."""
    from interp.evaluation import evaluate_splits

    meta = ckpt.metadata
    task_meta = meta.get("task", {})
    report.section(
        "Model card",
        "What was trained, on which task, how, and how well it does on every split (evaluated now, on this machine).",
    )
    params = task_meta.get("params", {})
    report.table(
        [{"task": ckpt.task.name, **{k: _short(v) for k, v in params.items()}}], caption="Task and its parameters"
    )
    t0 = time.perf_counter()
    metrics = evaluate_splits(ckpt.model, ckpt.task)
    secs = time.perf_counter() - t0
    trained = meta.get("training", {}).get("metrics", {})
    rows = []
    for split, m in metrics.items():
        row = {"split": split, **m}
        if "accuracy" in trained.get(split, {}):
            row["accuracy at training time"] = trained[split]["accuracy"]
        rows.append(row)
    report.table(
        rows,
        formats={k: ".4f" for k in rows[0] if k != "split"} if rows else None,
        caption=f"Metrics per split, evaluated in {secs:.1f} s on {next(ckpt.model.parameters()).device}",
    )
    spec = meta.get("model_spec") or (ckpt.spec.to_dict() if ckpt.spec is not None else {})
    caption = "Model spec (interp.model.ModelSpec -> HookedTransformer)"
    if not spec:  # a model saved from its TransformerLens config alone: the fields that say its shape
        spec = {k: v for k, v in (meta.get("tl_config") or _config_of(ckpt.model)).items() if k in ARCHITECTURE}
        caption = "Model (its TransformerLens config: the architecture fields)"
    n_params = sum(p.numel() for p in ckpt.model.parameters())
    n_trainable = sum(p.numel() for p in ckpt.model.parameters() if p.requires_grad)
    spec_table = render_table(
        [{"field": k, "value": _short(v)} for k, v in spec.items()]
        + [{"field": "parameters (trainable)", "value": f"{n_params} ({n_trainable})"}]
        + _attention_counts(ckpt),
        caption=caption,
    )
    training = meta.get("training", {})
    prov = {k: v for k, v in training.items() if k not in ("history", "metrics", "accuracy", "config")}
    prov.update({f"config.{k}": v for k, v in training.get("config", {}).items()})
    prov_table = (
        render_table(
            [{"field": k, "value": _short(v)} for k, v in prov.items()],
            caption="Training provenance, as recorded in the checkpoint",
        )
        if prov
        else '<p class="note">This checkpoint records no training provenance.</p>'
    )
    report.add_html(f'<div class="cards">{spec_table}{prov_table}</div>')
    add_learning_curve(training, report)


def _attention_counts(ckpt) -> list[dict[str, Any]]:
    """Model-card rows for the attention's shape: free parameters (fixed zeros of a diagonal or sparse Q/K/V not
    counted), and the free and dense Q/K/V entries per layer where the checkpoint's spec is known."""
    from interp.attention import parameter_counts

    counts = parameter_counts(ckpt.model, ckpt.spec)
    return [{"field": k, "value": str(v)} for k, v in counts.items() if k != "variant's extra parameters" or v]


def add_learning_curve(training: Mapping[str, Any], report: Report) -> None:
    """The per-epoch numbers recorded during training (loss, validation accuracy), when the file has them."""
    history = [h for h in training.get("history", []) if isinstance(h, Mapping) and "epoch" in h]
    if len(history) >= 2:
        import plotly.graph_objects as go
        from plotly.subplots import make_subplots

        epochs = [h["epoch"] for h in history]
        fig = make_subplots(specs=[[{"secondary_y": True}]])
        keys = [k for k in history[0] if k != "epoch" and isinstance(history[0][k], numbers.Number)]
        for k in keys:
            fig.add_trace(
                go.Scatter(x=epochs, y=[h.get(k) for h in history], name=k, mode="lines"), secondary_y="loss" in k
            )
        fig.update_layout(title="Learning curve", xaxis_title="epoch", template="plotly_white", height=360, width=760)
        fig.update_yaxes(title_text="accuracy", secondary_y=False)
        fig.update_yaxes(title_text="loss", secondary_y=True)
        report.figure(fig, caption="Per-epoch training loss and validation accuracy recorded during training.")


def add_suite_sections(ckpt, report: Report, progress: bool = True) -> None:
    """The task's own analysis sections (its suite's), or a note when the task has no suite."""
    try:
        suite = suite_for(ckpt.task)
    except TaskError as e:
        report.section("Analyses", "")
        report.text(f"No analysis sections: {e}.")
        return
    suite.add_report_sections(ckpt, report, progress)


def add_circuit(ckpt, report: Report, progress: bool = False, n_examples: int = CIRCUIT_EXAMPLES) -> None:
    """Every task's circuit section: EAP over every edge on a small batch (the task's own corruption where it has
    one, else mean ablation), the kept circuit drawn and its faithfulness curve."""
    from interp.analyses.circuit_discovery import discover_circuit
    from interp.device import model_device

    from .circuit_inputs import circuit_inputs

    clean, corrupted, what = circuit_inputs(ckpt.task, n_examples, device=model_device(ckpt.model))
    c = discover_circuit(ckpt.model, clean, corrupted=corrupted, curve_points=10)
    faith = (
        f"faithfulness {c.faithfulness:.3f}"
        if c.faithfulness == c.faithfulness  # NaN: ablating every edge barely moves the metric on these inputs
        else "faithfulness undefined (ablating every edge barely moves the metric on these inputs)"
    )
    report.section(
        "Circuit",
        "Which edges of the computational graph (input, heads, MLPs -> each head's query, key and value input, each "
        "MLP, the logits) does the model use? Edge attribution patching (Syed, Rager and Conmy 2023) scores every "
        f"edge at once on {what}; the kept circuit is the smallest top-k set of edges whose faithfulness (the metric "
        "with only those edges live, the rest ablated, from 0 = every edge ablated to 1 = the full model) reaches "
        f"{c.rule.get('target', 0.9)}: {c.size} of {c.graph.n_edges} edges, {faith} "
        f"(metric {c.metric}: full {c.full:.3g}, empty {c.empty:.3g}). `interp circuit CHECKPOINT --method "
        "patching|acdc|eap-ig` gives the exact and pruned variants.",
    )
    report.result(c)
    report.figure(c.curve_figure(), "faithfulness of the top-k edges by |EAP score| against k")


def add_attention_spectrum(ckpt, report: Report, progress: bool = False, n_inputs: int = 32) -> None:
    """Every task's section on the spectrum of the heads' attention patterns (``attention_spectrum``)."""
    from interp.analyses import attention_spectrum

    task = ckpt.task
    split = task.splits[-1]
    spec = attention_spectrum(ckpt.model, task.dataset(split), task=task, n_inputs=n_inputs)
    needed, near = spec.rank_needed(), spec.rank_needed(0.01)
    report.section(
        "Attention spectrum",
        f"Is attention low-rank (Wang et al. 2020, Linformer; Conti, The Math behind transformers, §2.1.3)? The "
        f"singular values of every head's attention matrix P on the first {spec.n_inputs} {split} inputs (mean "
        f"length {spec.mean_length:.0f} tokens), as the share of P's energy (sum of squared singular values) its "
        f"best rank-k approximation keeps; and the causal test: every head's P replaced at hook_pattern by its best "
        f"rank-k approximation, with the task's accuracy measured ({spec.full_accuracy:.3f} unmodified). "
        + (
            f"Smallest tested rank that keeps the accuracy: {needed}; within 0.01 of it: {near}."
            if needed is not None
            else "No tested rank keeps the unmodified accuracy."
        ),
    )
    report.result(spec)


def pick_examples(task: Task, n: int = 3, target_len: int = EXAMPLE_TOKENS, max_len: int = 64):
    """A few examples for attention views, deterministic: held-out splits first (test, then val, then train), among
    examples of at most ``max_len`` tokens (longer views are unreadable), nearest ``target_len`` tokens, one per
    label first. Returns ``([(split, index, TaskData of one example)], why)``, ``why`` saying which split was used and
    why (computed from the data: e.g. that the held-out sequences are all longer than ``max_len``)."""
    import torch

    held_out_order = list(reversed(task.splits))
    chosen, labels, why = [], set(), []
    for split in held_out_order:
        data = task.dataset(split)
        lengths = data.lengths.cpu()
        fits = (lengths <= max_len).nonzero().flatten()
        if not len(fits):
            why.append(f"the {split} sequences are {int(lengths.min())}-{int(lengths.max())} tokens long")
            continue
        order = fits[torch.argsort((lengths[fits] - target_len).abs(), stable=True)].tolist()
        for pass_ in (0, 1):  # first one example per label, then fill up
            for i in order:
                if len(chosen) == n:
                    break
                label = int(data.labels[i])
                if any(c[0] == split and c[1] == i for c in chosen) or (pass_ == 0 and label in labels):
                    continue
                chosen.append((split, i, data.select(torch.tensor([i], device=data.device))))
                labels.add(label)
        if len(chosen) == n:
            break
    if not chosen:  # nothing fits: the shortest test examples, shown truncated
        data = task.dataset(held_out_order[0])
        for i in torch.argsort(data.lengths.cpu(), stable=True)[:n].tolist():
            chosen.append((held_out_order[0], i, data.select(torch.tensor([i], device=data.device))))
        return (
            chosen,
            f"every split's sequences are longer than {max_len} tokens; the shortest {held_out_order[0]} ones are "
            "shown, cut",
        )
    used = sorted({c[0] for c in chosen}, key=held_out_order.index)
    reason = f"{' and '.join(used)} examples" + (
        f" ({'; '.join(why)}, longer than the {max_len} tokens a readable view shows)" if why else ""
    )
    return chosen, reason


def add_attention_views(ckpt, report: Report, progress: bool = False, n_examples: int = 3, max_len: int = 64) -> None:
    """Attention patterns of every head on a few examples (interactive circuitsvis views)."""
    import torch

    from interp.visualize import attention_view

    model, task = ckpt.model, ckpt.task
    cfg = model.cfg
    examples, reason = pick_examples(task, n_examples, max_len=max_len)
    report.section(
        "Attention patterns",
        f"Every head's attention ({cfg.n_layers * cfg.n_heads} heads) on "
        f"{len(examples)} examples of the task's data, held-out splits first and the ones nearest "
        f"{EXAMPLE_TOKENS} tokens long: here {reason}. Pick a head to enlarge it; hover a destination token "
        "to see where it attends.",
    )
    device = model_device(model)
    add_mask_figure(model, report, min(max_len, EXAMPLE_TOKENS))
    for split, i, ex in examples:
        length = int(ex.lengths[0])
        tokens = ex.tokens[0, :length].to(device)
        with torch.inference_mode():
            logits = model(tokens[None])
        pos = int(ex.answer_pos[0])
        pred, label = int(logits[0, pos].argmax()), int(ex.labels[0])
        shown = min(length, max_len)
        note = (
            ""
            if shown == length
            else f" Only the first {shown} of {length} tokens are shown (causal attention: exact)."
        )
        verdict = "correct" if pred == label else "wrong"
        report.attention(
            attention_view(model, tokens, vocab=task.vocab, title=f"{split} example {i}", max_len=max_len),
            caption=f"{split} example {i}: {length} tokens; answer at position {pos}: expected "
            f"{task.vocab.tokens[label]!r}, the model predicts {task.vocab.tokens[pred]!r} ({verdict}).{note}",
        )


def add_mask_figure(model, report: Report, n: int) -> None:
    """For a model with a sparse attention mask: which keys each query may see in each layer (the holes of its
    patterns below are grey), and a note."""
    import torch

    from interp.attention import layer_attention
    from interp.visualize import heatmap

    layers = [layer_attention(model, l) for l in range(model.cfg.n_layers)]
    if not any(a.masks for a in layers):
        return
    later = ~torch.ones(n, n, dtype=torch.bool).tril()
    for a in layers:
        names = "+".join(map(str, a.masks)) or "dense"
        allowed = a.allowed(n).float() - later.float()  # 1 seen, 0 hidden, -1 after the query
        report.figure(
            heatmap(
                allowed,
                [str(i) for i in range(n)],
                [str(i) for i in range(n)],
                title=f"layer {a.layer}: keys each query may see ({names}, {a.pooling})",
                colorscale=[[0.0, "#ffffff"], [0.5, "#8a8f98"], [1.0, "#1f77b4"]],
                zmid=None,
                zmin=-1,
                zmax=1,
                x_title="key position",
                y_title="query position",
            ),
            caption="Blue: keys the sparse mask lets the query see; grey: earlier keys it hides (the holes, grey "
            "in the attention views below); white: later keys (causal).",
        )


def _short(value, limit: int = 120) -> str:
    """A compact one-line rendering of a metadata value."""
    text = value if isinstance(value, str) else json.dumps(value)
    return text if len(text) <= limit else text[: limit - 1] + "…"


# -- the report of a sweep directory --------------------------------------------------------------------------------
RECIPE_WORDS = {  # what a recorded option means, in the report's words
    ("optimizer", "adam"): "torch.optim.Adam: the weight decay is L2, added to the gradient",
    ("optimizer", "adamw"): "torch.optim.AdamW: decoupled weight decay",
    ("objective", "lm"): "next-token loss at every position",
    ("dropout_at", "attention"): "dropout on the attention output only",
}
COMPARED = ("strategy", "attention", "qkv")  # configuration keys whose cells the report compares, where they vary


def _plan_options(plan: dict) -> dict:
    """The model and training options a ``sweep.json`` plan set away from their defaults (grid keys, seeds and
    bookkeeping left out), as ``{name: value}``."""
    from interp.configs import ModelSpec, TrainConfig
    from interp.options import options

    out = {}
    for cls, values in ((ModelSpec, plan.get("spec", {})), (TrainConfig, plan.get("cfg", {}))):
        for name, opt in options(cls).items():
            if name in plan.get("grid", {}) or name == "halving" or not opt.config or name not in values:
                continue
            value = values[name]
            if value != opt.default:
                out[name] = value
    return out


def _differences_sections(report: Report, frame) -> None:
    """For each of :data:`COMPARED` that varies in the sweep (the halving strategy, the attention variant, the Q/K/V
    shape): each cell against the cell that differs from it only there (``interp table --compare-by KEY``), the
    difference of the shares at 100% test accuracy with Newcombe's 95% interval."""
    from interp.analyses.populations import config_differences, format_differences

    for key in COMPARED:
        if key not in frame or frame[key].map(str).nunique() < 2:
            continue
        differences = config_differences(frame, key=key, threshold=1.0)
        if not differences:
            continue
        baseline = differences[0]["baseline"]
        report.section(
            f"{key} against {baseline}",
            f"Each cell against the {baseline} cell of the same configuration (interp table --compare-by {key}"
            + (", or --compare" if key == "strategy" else "")
            + "): the shares of runs at 100% test accuracy, the difference with its Newcombe 95% interval (Newcombe "
            "1998, hybrid score interval from the two Wilson intervals), and whether it excludes 0. A halving run that "
            "does not end with one head counts 0.",
        )
        report.add_html(f"<pre>{html.escape(format_differences(differences, baseline))}</pre>")


def write_sweep_report(directory, out, progress: bool = True) -> Path:
    """``interp report DIR`` for a sweep directory: Table 1, the accuracy figures and the task suite's population
    sections, as one offline page written atomically to ``out``."""
    with AtomicFile(out, "the report") as output:
        report = build_sweep_report(directory, progress=progress)
        html_text = report.html()
        output.commit(lambda tmp: Path(tmp).write_text(html_text, encoding="utf-8"))
    return output.path


def build_sweep_report(directory, progress: bool = True) -> Report:
    """The :class:`Report` of a sweep: what ran, Table 1 (shares at 100% and >= 98% with Wilson 95% intervals),
    1 - CDF of test accuracy per configuration, Figure 2 when the sweep varies d_model or n_heads, Figure 3 when it
    varies the learning rate, then the task suite's ``add_sweep_sections`` (when its suite has one)."""
    from interp.analyses.population_figures import accuracy_survival, grid_accuracy, lr_accuracy
    from interp.analyses.populations import format_table, population_table
    from interp.sweep_directory import PLAN, checkpoint_path, load_results, read_plans

    directory = Path(directory)
    frame = load_results(directory)
    if frame.empty:
        raise InterpError(f"{directory} holds no finished runs (no results.jsonl rows)")
    plans = read_plans(directory) if (directory / PLAN).is_file() else []
    plan = plans[-1] if plans else None
    if plan:
        task_name, task_params = plan["task"], plan["task_params"]
    else:  # a sweep written before sweep.json: the task as its first checkpoint records it
        from interp.checkpoint import read_metadata

        meta = read_metadata(checkpoint_path(directory, frame.iloc[0]))["task"]
        task_name, task_params = meta["name"], meta.get("params", {})
    report = Report(
        title=f"sweep {directory.name}",
        subtitle=f"interp report of the sweep in {directory} ({len(frame)} runs), written "
        f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}",
    )
    report.section("Sweep", "What was trained: the sweep's plan (sweep.json) and how far it got.")
    if plans:
        options = [_plan_options(p) for p in plans]
        report.table(
            [
                {
                    "task": p["task"],
                    "seeds": f"{min(p['seeds'])}..{max(p['seeds'])} ({len(p['seeds'])})",
                    "grid": _short(p["grid"]),
                    "halving": p["cfg"].get("halving") or "none",
                    "options": _short(" ".join(f"{k}={v}" for k, v in opts.items()) or "defaults", 240),
                    "task parameters": _short(p["task_params"]),
                }
                for p, opts in zip(plans, options)
            ],
            caption="One row per interp sweep into this directory; options: every model and training option the "
            "sweep set away from its default (the grid's keys apart)",
        )
        shared = {k: v for k, v in options[0].items() if all(o.get(k) == v for o in options[1:])}
        if shared:
            report.text(
                "Every run was trained with "
                + ", ".join(
                    f"{k}={v}" + (f" ({RECIPE_WORDS[(k, v)]})" if (k, v) in RECIPE_WORDS else "")
                    for k, v in shared.items()
                )
                + "; every other option at its default."
            )
    wall = (frame["wall_seconds"] / frame["population_size"]).sum() if "wall_seconds" in frame else float("nan")
    report.text(
        f"{len(frame)} finished runs; training wall time {wall:.0f} s (the rows' wall_seconds, each batched "
        "population's time counted once)."
    )
    table = population_table(frame)
    report.section(
        "Table 1",
        "Table 1 of Fraknói 2024 per configuration and halving strategy: runs, the share of runs "
        "reaching 100% and >= 98% test accuracy, each with its Wilson 95% interval, and the mean test "
        "accuracy. A halving run that does not end with one head counts 0.",
    )
    report.add_html(f"<pre>{html.escape(format_table(table))}</pre>")
    report.section(
        "Test accuracy, 1 - CDF",
        "The share of runs at or above each test accuracy, one curve per "
        "configuration and strategy (Fraknói 2024, Figure 9, left: 1 vs 64 heads; Figure 11: halving strategies).",
    )
    surv = accuracy_survival(frame)
    report.figure(surv.figure(), caption="All runs; at x = 1 the curve is Table 1's share at 100%.")
    report.figure(surv.figure(x_min=0.98), caption="The same, on [0.98, 1] as the thesis plots it.")
    if "strategy" in frame and frame["strategy"].nunique() > 1:  # Figure 11: the strategies of one shape together
        for (d, h), members in frame.groupby(["d_model", "n_heads"], sort=False):
            if members["strategy"].nunique() > 1:
                report.figure(
                    accuracy_survival(members).figure(x_min=0.98),
                    caption=f"d_model = {d}, n_heads = {h}: the halving strategies on [0.98, 1] "
                    "(Fraknói 2024, Figure 11).",
                )
    grid = grid_accuracy(frame)
    if len(grid.d_models) * len(grid.n_heads) > 1:
        report.section(
            "Accuracy over d_model and n_heads",
            "Fraknói 2024, Figure 2: normal runs (no halving) per cell of the grid, other options pooled.",
        )
        report.result(grid)
    _differences_sections(report, frame)
    lrs = lr_accuracy(frame)
    if lrs.varies:
        report.section(
            "Accuracy over learning rates",
            "Fraknói 2024, Figure 3: each run's test accuracy and the mean, "
            "per configuration, against its learning rate.",
        )
        report.figure(lrs.figure())
    try:
        suite = suite_for(get_task(task_name, **task_params))
    except TaskError as e:
        report.section("Population analyses", "")
        report.text(f"No task-specific sections: {e}.")
        return report
    suite.add_sweep_sections(directory, report, progress)
    return report
