"""The self-contained HTML report of a checkpoint (``interp report CHECKPOINT --out report.html``).

:class:`Report` is the page builder the analysis suites write into (``section``, ``text``, ``table``,
``figure``, ``attention``). The finished page inlines plotly.js once and the circuitsvis bundle once, and
a Content-Security-Policy forbids every fetch: it opens offline in any browser.

:func:`write_report` assembles the whole page: the model card, the task suite's sections, and the
attention patterns of all heads on a few examples; it writes the file atomically.
"""

from __future__ import annotations

import html
import json
import numbers
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Sequence

from .errors import InterpError
from .files import AtomicFile, atomic_write_text
from .visualize import escape_text as _escape_text
from .visualize import render_table

# Nothing may be fetched: scripts and styles are inline, images only data:/blob: URLs.
CSP = ("default-src 'none'; script-src 'unsafe-inline' 'unsafe-eval'; style-src 'unsafe-inline'; "
       "img-src data: blob:; font-src data:; worker-src blob:; connect-src 'none'")

CSS = """
body { font-family: system-ui, -apple-system, "Segoe UI", sans-serif; margin: 0 auto; max-width: 1200px;
       padding: 16px 28px 60px; color: #1d2330; line-height: 1.45; }
h1 { margin-bottom: 4px; } h2 { margin-top: 40px; border-bottom: 1px solid #d5dae3; padding-bottom: 4px; }
.subtitle, .caption, .note { color: #5b6475; } .caption { font-size: 0.92em; margin: 2px 0 18px; }
.note { font-style: italic; }
nav ol { columns: 2; } nav a { color: #2952a3; text-decoration: none; }
table.data { border-collapse: collapse; margin: 8px 0 4px; font-size: 0.92em; }
table.data caption { caption-side: bottom; text-align: left; color: #5b6475; padding-top: 4px; }
table.data th, table.data td { border-bottom: 1px solid #e3e7ee; padding: 3px 10px; text-align: left; }
table.data th { background: #f3f5f9; } table.data td.num { text-align: right; font-variant-numeric: tabular-nums; }
.figure { margin: 8px 0; overflow-x: auto; }
.cards { display: flex; flex-wrap: wrap; gap: 8px 40px; align-items: flex-start; }
"""


@dataclass
class _Section:
    title: str
    anchor: str
    parts: list[str]


class Report:
    """An HTML page built from sections of plain text, tables, plotly figures and attention views.

    Analysis suites add content only through :meth:`section`, :meth:`text`, :meth:`table`,
    :meth:`figure` and :meth:`attention`; :meth:`html` renders the page and :meth:`save` writes it."""

    def __init__(self, title: str = "interp report", subtitle: str = ""):
        self.title = title
        self.subtitle = subtitle
        self.sections: list[_Section] = []
        self.n_figures = 0
        self.n_attention = 0
        self.on_section = None  # called with each new section's title (the progress bar shows it)

    # -- the builder methods the suites use ---------------------------------------------------------
    def section(self, title: str, intro: str = "") -> None:
        """Start a new section; ``intro`` is plain text saying what it shows."""
        anchor = f"s{len(self.sections) + 1}"
        if self.on_section is not None:
            self.on_section(str(title))
        self.sections.append(_Section(str(title), anchor, []))
        if intro:
            self._add(f'<p class="intro">{_escape_text(intro)}</p>')

    def text(self, text: str) -> None:
        """A paragraph of plain text (escaped; blank lines separate paragraphs)."""
        for para in str(text).split("\n\n"):
            if para.strip():
                self._add(f"<p>{_escape_text(para)}</p>")

    def table(self, rows: Sequence[Mapping[str, Any]], columns: Sequence[str] | None = None, caption: str = "",
              formats: Mapping[str, str] | None = None) -> None:
        """A table with one row per mapping; ``columns`` picks and orders the columns (default: the keys in
        first-seen order); ``formats`` maps a column to a format spec such as ``".3f"``."""
        self._add(render_table(rows, columns, caption, formats))

    def figure(self, fig, caption: str = "") -> None:
        """A plotly figure (interactive; plotly.js is inlined once for the whole page)."""
        if not hasattr(fig, "to_html") or not hasattr(fig, "to_plotly_json"):
            raise InterpError(f"report.figure expects a plotly Figure, got {type(fig).__name__}")
        self.n_figures += 1
        div = fig.to_html(full_html=False, include_plotlyjs=False, div_id=f"fig-{self.n_figures}",
                          config={"displaylogo": False, "responsive": True})
        self._add(f'<div class="figure">{div}</div>' + _caption(caption))

    def result(self, result, caption: str = "") -> None:
        """An analysis result (:class:`interp.results.Result`): its table and its figure, where it has them."""
        table = result.table_html()
        if table:
            self._add(table)
        fig = result.figure()
        if fig is not None:
            self.figure(fig, caption)
        elif caption:
            self._add(_caption(caption))

    def attention(self, view, caption: str = "") -> None:
        """An interactive circuitsvis attention view (:class:`interp.visualize.AttentionView`)."""
        from .visualize import AttentionView

        if not isinstance(view, AttentionView):
            raise InterpError(f"report.attention expects an interp.visualize.AttentionView, got {type(view).__name__}")
        self.n_attention += 1
        self._add(f'<div class="figure">{view.body_html()}</div>' + _caption(caption))

    # -- output -------------------------------------------------------------------------------------
    def _add(self, markup: str) -> None:
        if not self.sections:
            self.sections.append(_Section("", "s0", []))
        self.sections[-1].parts.append(markup)

    def html(self) -> str:
        """The complete page: one file, every script inline, no external reference."""
        from .visualize import circuitsvis_bundle

        scripts = []
        if self.n_figures:
            from plotly.offline import get_plotlyjs

            scripts.append(f'<script type="text/javascript">{get_plotlyjs()}</script>')
        if self.n_attention:
            scripts.append(f"<script>{circuitsvis_bundle()}</script>")
        titled = [s for s in self.sections if s.title]
        nav = ("<nav><ol>" + "".join(f'<li><a href="#{s.anchor}">{html.escape(s.title)}</a></li>' for s in titled)
               + "</ol></nav>") if len(titled) > 1 else ""
        body = "".join(
            (f'<section id="{s.anchor}"><h2>{html.escape(s.title)}</h2>' if s.title else f'<section id="{s.anchor}">')
            + "".join(s.parts) + "</section>"
            for s in self.sections
        )
        subtitle = f'<p class="subtitle">{_escape_text(self.subtitle)}</p>' if self.subtitle else ""
        return (
            "<!DOCTYPE html>\n<html lang='en'><head><meta charset='utf-8'>"
            f'<meta http-equiv="Content-Security-Policy" content="{CSP}">'
            "<meta name='viewport' content='width=device-width, initial-scale=1'>"
            f"<title>{html.escape(self.title)}</title><style>{CSS}</style>{''.join(scripts)}</head>"
            f"<body><h1>{html.escape(self.title)}</h1>{subtitle}{nav}{body}</body></html>\n"
        )

    def save(self, path) -> Path:
        """Write :meth:`html` to ``path`` atomically (a temp file in the same folder, then a rename)."""
        return atomic_write_text(path, self.html(), "the report")


def _caption(caption: str) -> str:
    return f'<p class="caption">{_escape_text(caption)}</p>' if caption else ""


# -- writing ----------------------------------------------------------------------------------------
def write_report(checkpoint, out, device: str | None = None, progress: bool = True) -> Path:
    """Build the report of ``checkpoint`` (a path, a shipped name, or a loaded :class:`Checkpoint`) and
    write it to ``out`` atomically. Bad paths and checkpoints fail before any work, leaving no file."""
    from .checkpoint import Checkpoint, load_checkpoint

    with AtomicFile(out, "the report") as output:  # an unwritable path fails before any work
        ckpt = checkpoint if isinstance(checkpoint, Checkpoint) else load_checkpoint(checkpoint, device=device)
        report = build_report(ckpt, progress=progress)
        html_text = report.html()
        output.commit(lambda tmp: Path(tmp).write_text(html_text, encoding="utf-8"))
    return output.path


STEPS = ("model card", "analyses", "attention patterns")
EXAMPLE_TOKENS = 28  # length of the examples shown in the attention views


def build_report(ckpt, progress: bool = True) -> Report:
    """The :class:`Report` of a loaded checkpoint: model card, the task suite's sections, attention views."""
    from tqdm import tqdm

    report = Report(title=f"{ckpt.task.name}: {Path(ckpt.path).name if ckpt.path else 'model'}",
                    subtitle=f"interp report of {ckpt.name}, written {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}")
    bar = tqdm(total=len(STEPS), desc="report", unit="step", disable=not progress, file=sys.stderr, leave=False)
    try:
        for step, fn in zip(STEPS, (add_model_card, add_suite_sections, add_attention_views)):
            bar.set_postfix_str(step)
            report.on_section = lambda title, step=step: bar.set_postfix_str(
                step if title.lower() == step else f"{step}: {title}")
            fn(ckpt, report, progress)
            bar.update(1)
    finally:
        report.on_section = None
        bar.close()
    return report


def add_model_card(ckpt, report: Report, progress: bool = False) -> None:
    """Task, model spec, training provenance, and accuracy on every split (evaluated now)."""
    from .evaluate import evaluate_splits

    meta = ckpt.metadata
    task_meta = meta.get("task", {})
    report.section("Model card", "What was trained, on which task, how, and how well it does on every split "
                                 "(evaluated now, on this machine).")
    params = task_meta.get("params", {})
    report.table([{"task": ckpt.task.name, **{k: _short(v) for k, v in params.items()}}], caption="Task and its parameters")
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
    report.table(rows, formats={k: ".4f" for k in rows[0] if k != "split"} if rows else None,
                 caption=f"Metrics per split, evaluated in {secs:.1f} s on {next(ckpt.model.parameters()).device}")
    spec = meta.get("model_spec", {})
    n_params = sum(p.numel() for p in ckpt.model.parameters())
    n_trainable = sum(p.numel() for p in ckpt.model.parameters() if p.requires_grad)
    spec_table = render_table([{"field": k, "value": _short(v)} for k, v in spec.items()]
                              + [{"field": "parameters (trainable)", "value": f"{n_params} ({n_trainable})"}],
                              caption="Model spec (interp.model.ModelSpec -> HookedTransformer)")
    training = meta.get("training", {})
    prov = {k: v for k, v in training.items() if k not in ("history", "metrics", "accuracy", "config")}
    prov.update({f"config.{k}": v for k, v in training.get("config", {}).items()})
    prov_table = (render_table([{"field": k, "value": _short(v)} for k, v in prov.items()],
                               caption="Training provenance, as recorded in the checkpoint")
                  if prov else '<p class="note">This checkpoint records no training provenance.</p>')
    report._add(f'<div class="cards">{spec_table}{prov_table}</div>')
    add_learning_curve(training, report)


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
            fig.add_trace(go.Scatter(x=epochs, y=[h.get(k) for h in history], name=k, mode="lines"),
                          secondary_y="loss" in k)
        fig.update_layout(title="Learning curve", xaxis_title="epoch", template="plotly_white", height=360, width=760)
        fig.update_yaxes(title_text="accuracy", secondary_y=False)
        fig.update_yaxes(title_text="loss", secondary_y=True)
        report.figure(fig, caption="Per-epoch training loss and validation accuracy recorded during training.")


def add_suite_sections(ckpt, report: Report, progress: bool = True) -> None:
    """The task's own analysis sections (``analyses.suites``), or a note when the task has no suite."""
    from .errors import TaskError

    try:
        from analyses import suite_for  # only the report and the CLI wire interp to analyses

        suite = suite_for(ckpt.task)
    except TaskError as e:
        report.section("Analyses", "")
        report.text(f"No analysis sections: {e}.")
        return
    suite.add_report_sections(ckpt, report, progress)


def pick_examples(task, n: int = 3, target_len: int = EXAMPLE_TOKENS, max_len: int = 64):
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
        return chosen, f"every split's sequences are longer than {max_len} tokens; the shortest {held_out_order[0]} ones are shown, cut"
    used = sorted({c[0] for c in chosen}, key=held_out_order.index)
    reason = f"{' and '.join(used)} examples" + (f" ({'; '.join(why)}, longer than the {max_len} tokens a readable view shows)"
                                                  if why else "")
    return chosen, reason


def add_attention_views(ckpt, report: Report, progress: bool = False, n_examples: int = 3, max_len: int = 64) -> None:
    """Attention patterns of every head on a few examples (interactive circuitsvis views)."""
    import torch

    from .visualize import attention_view

    model, task = ckpt.model, ckpt.task
    cfg = model.cfg
    examples, reason = pick_examples(task, n_examples, max_len=max_len)
    report.section("Attention patterns", f"Every head's attention ({cfg.n_layers * cfg.n_heads} heads) on "
                   f"{len(examples)} examples of the task's data, held-out splits first and the ones nearest "
                   f"{EXAMPLE_TOKENS} tokens long: here {reason}. Pick a head to enlarge it; hover a destination token "
                   "to see where it attends.")
    device = next(model.parameters()).device
    for split, i, ex in examples:
        length = int(ex.lengths[0])
        tokens = ex.tokens[0, :length].to(device)
        with torch.inference_mode():
            logits = model(tokens[None])
        pos = int(ex.answer_pos[0])
        pred, label = int(logits[0, pos].argmax()), int(ex.labels[0])
        shown = min(length, max_len)
        note = "" if shown == length else f" Only the first {shown} of {length} tokens are shown (causal attention: exact)."
        verdict = "correct" if pred == label else "wrong"
        report.attention(
            attention_view(model, tokens, vocab=task.vocab, title=f"{split} example {i}", max_len=max_len),
            caption=f"{split} example {i}: {length} tokens; answer at position {pos}: expected "
                    f"{task.vocab.tokens[label]!r}, the model predicts {task.vocab.tokens[pred]!r} ({verdict}).{note}",
        )


def _short(value, limit: int = 120) -> str:
    """A compact one-line rendering of a metadata value."""
    text = value if isinstance(value, str) else json.dumps(value)
    return text if len(text) <= limit else text[: limit - 1] + "…"


# -- the report of a sweep directory --------------------------------------------------------------------------------
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
    from .errors import TaskError
    from .population_figures import accuracy_survival, grid_accuracy, lr_accuracy
    from .sweeps import PLAN, format_table, load_results, population_table, read_plans

    directory = Path(directory)
    frame = load_results(directory)
    if frame.empty:
        raise InterpError(f"{directory} holds no finished runs (no results.jsonl rows)")
    plans = read_plans(directory) if (directory / PLAN).is_file() else []
    plan = plans[-1] if plans else None
    if plan:
        task_name, task_params = plan["task"], plan["task_params"]
    else:  # a sweep written before sweep.json: the task as its first checkpoint records it
        from .checkpoint import read_metadata

        from .sweeps import checkpoint_path

        meta = read_metadata(checkpoint_path(directory, frame.iloc[0]))["task"]
        task_name, task_params = meta["name"], meta.get("params", {})
    report = Report(title=f"sweep {directory.name}",
                    subtitle=f"interp report of the sweep in {directory} ({len(frame)} runs), written "
                             f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}")
    report.section("Sweep", "What was trained: the sweep's plan (sweep.json) and how far it got.")
    if plans:
        report.table([{"task": p["task"], "seeds": f"{min(p['seeds'])}..{max(p['seeds'])} ({len(p['seeds'])})",
                       "grid": _short(p["grid"]), "halving": p["cfg"].get("halving") or "none",
                       "task parameters": _short(p["task_params"])} for p in plans],
                     caption="One row per interp sweep into this directory")
    wall = (frame["wall_seconds"] / frame["population_size"]).sum() if "wall_seconds" in frame else float("nan")
    report.text(f"{len(frame)} finished runs; training wall time {wall:.0f} s (the rows' wall_seconds, each batched "
                "population's time counted once).")
    table = population_table(frame)
    report.section("Table 1", "Seed 000 Table 1 per configuration and halving strategy: runs, the share of runs "
                   "reaching 100% and >= 98% test accuracy, each with its Wilson 95% interval, and the mean test "
                   "accuracy. A halving run that does not end with one head counts 0.")
    report._add(f"<pre>{html.escape(format_table(table))}</pre>")
    report.section("Test accuracy, 1 - CDF", "The share of runs at or above each test accuracy, one curve per "
                   "configuration and strategy (seed 000 Figure 9, left: 1 vs 64 heads; Figure 11: halving strategies).")
    surv = accuracy_survival(frame)
    report.figure(surv.figure(), caption="All runs; at x = 1 the curve is Table 1's share at 100%.")
    report.figure(surv.figure(x_min=0.98), caption="The same, on [0.98, 1] as the seed plots it.")
    if "strategy" in frame and frame["strategy"].nunique() > 1:  # Figure 11: the strategies of one shape together
        for (d, h), members in frame.groupby(["d_model", "n_heads"], sort=False):
            if members["strategy"].nunique() > 1:
                report.figure(accuracy_survival(members).figure(x_min=0.98),
                              caption=f"d_model = {d}, n_heads = {h}: the halving strategies on [0.98, 1] "
                                      "(seed 000 Figure 11).")
    grid = grid_accuracy(frame)
    if len(grid.d_models) * len(grid.n_heads) > 1:
        report.section("Accuracy over d_model and n_heads", "Seed 000 Figure 2: normal runs (no halving) per cell of "
                       "the grid, other options pooled.")
        report.result(grid)
    lrs = lr_accuracy(frame)
    if lrs.varies:
        report.section("Accuracy over learning rates", "Seed 000 Figure 3: each run's test accuracy and the mean, "
                       "per configuration, against its learning rate.")
        report.figure(lrs.figure())
    try:
        from analyses import suite_for  # only the report and the CLI wire interp to analyses
        from tasks import get_task

        suite = suite_for(get_task(task_name, **task_params))
    except TaskError as e:
        report.section("Population analyses", "")
        report.text(f"No task-specific sections: {e}.")
        return report
    add = getattr(suite, "add_sweep_sections", None)
    if add is None:
        report.section("Population analyses", "")
        report.text(f"The {task_name} suite has no population sections.")
    else:
        add(directory, report, progress)
    return report
