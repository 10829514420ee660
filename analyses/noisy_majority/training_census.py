"""The per-head census over training: every head of every run at every snapshot (Fraknói 2024, §5.4, followed
through training), so that failing and succeeding runs of one configuration can be told apart by *when* and *how*
their heads change, not only by where they end.

For each run with snapshots (``runs/NAME.snapshots/epoch-00000N.safetensors``, written by ``interp train
--snapshots N`` or ``interp sweep --snapshots N``) and each snapshot, each head's ``w01`` = A(= → 0) / A(= → 1),
``w02`` = A(= → 0) / A(= → 2) (exact from the QK circuit where the model has one layer and no positions, as the
head summary computes them), its separation accuracy (linear SVC on the head's output at '='), its learned
accuracy (the model with every other head zeroed) and its grade (good at separation accuracy >= 0.95, the head
summary's rule), on the **first** ``train_size`` train and ``test_size`` test sentences (default 2000 / 500, as the
end-state census); plus the snapshot's test accuracy on the **whole** test split (what Table 1 counts).

Per run: the outcome (``success``: 100% test accuracy at the kept epoch, the run's row in the sweep, and for a
halving run one head left at the end, as Table 1 counts it), the first snapshot epoch with a good head, the first
with 100% test accuracy, and whether the run had a good head at some snapshot and none at its last one
(``lost_good``). A probe can read the answer from a head the model does not use
(the head summary's warning), so the same is given for a good head the model reads (``first_used_epoch``,
``lost_used``: separation and learned accuracy both >= 0.95). Snapshots are the model at that epoch, not the kept
model, so the last snapshot of a run whose kept epoch is earlier can differ from the end-state census.

Cached per run in ``DIR/census_over_training.jsonl`` (rewritten atomically after each run; a snapshot is recomputed
only when its checksum or the sizes changed), so a killed census resumes and a directory shipped without its
checkpoints still rebuilds the result.
"""

from __future__ import annotations

import math
import os
import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from interp.errors import ConfigError
from interp.files import read_named_rows, write_rows
from interp.results import Result, jsonable

from .census import TEST_SIZE, TRAIN_SIZE, _plain
from .head_summary import BAND, GOOD, W02_IGNORED

CACHE = "census_over_training.jsonl"
HEAD_KEYS = ("head", "w01", "w02", "separation_accuracy", "learned_accuracy", "grade")
# the configuration columns a run's label may name (those that vary between the runs of the census)
LABEL_COLUMNS = (
    "d_model",
    "n_heads",
    "normalization",
    "init",
    "objective",
    "padding",
    "warmup_shape",
    "lr",
    "dropout_at",
    "epochs",
    "strategy",
)
COLOURS = {"success": "#1b9e77", "failure": "#d95f02"}


def snapshot_files(checkpoint) -> list[Path]:
    """A run's snapshots, in epoch order (none where it has no snapshot folder)."""
    from interp.training import snapshot_directory

    folder = snapshot_directory(checkpoint)
    return sorted(folder.glob("epoch-*.safetensors")) if folder.is_dir() else []


def snapshot_entry(ckpt, train_size: int | None = TRAIN_SIZE, test_size: int | None = TEST_SIZE) -> dict[str, Any]:
    """One snapshot's census: its epoch, test accuracy on the whole test split, and each head's ``w01``, ``w02``,
    separation and learned accuracy and grade (:func:`analyses.noisy_majority.census.run_heads`)."""
    from interp.evaluation import evaluate

    from .census import run_heads

    entry = run_heads(ckpt, train_size, test_size)
    test = evaluate(ckpt.model, ckpt.task, ckpt.task.dataset("test"))
    return {
        "epoch": int((ckpt.training or {}).get("epoch", 0)),
        "checksum": ckpt.metadata.get("checksum"),
        "test_accuracy": float(test["accuracy"]),
        "heads": [{k: h[k] for k in HEAD_KEYS} for h in entry["heads"]],
    }


def _read_cache(directory: Path) -> dict[str, dict[str, Any]]:
    return read_named_rows(directory / CACHE)


def _write_cache(directory: Path, entries: list[dict[str, Any]]) -> None:
    write_rows(directory / CACHE, entries, "the census over training")


def has_snapshots(directory) -> bool:
    """Whether a sweep directory has anything for the census over training: the cache, or snapshots beside the
    checkpoint of one of its rows (wherever :func:`interp.sweep_directory.checkpoint_path` finds it)."""
    from interp.sweep_directory import checkpoint_path, read_results

    directory = Path(directory)
    if (directory / CACHE).is_file():
        return True
    return any(snapshot_files(checkpoint_path(directory, r)) for r in read_results(directory) if r.get("checkpoint"))


def census_over_training(
    source,
    *,
    train_size: int | None = TRAIN_SIZE,
    test_size: int | None = TEST_SIZE,
    device: str | None = "cpu",
    progress: bool = True,
) -> TrainingCensus:
    """The census over training of every run with snapshots: ``source`` is a sweep directory (runs from its
    results, cached in ``DIR/census_over_training.jsonl``), one checkpoint file or a sequence of checkpoint paths
    (each with its ``.snapshots/`` folder; nothing cached). Runs without snapshots are left out (counted in
    ``without_snapshots``). Anything else is a ConfigError naming ``source``."""
    from tqdm.auto import tqdm

    from interp.checkpoint import read_metadata
    from interp.tasks import load_checkpoint

    directory, paths = _source(source)
    if directory is not None:
        runs, cached = _directory_runs(directory), _read_cache(directory)
    else:
        runs, cached = [_checkpoint_run(p) for p in paths], {}
    sizes = {"train_size": train_size, "test_size": test_size}
    done, without = [], []
    for run, path in tqdm(runs, desc="census over training", unit="run", disable=not progress):
        files = snapshot_files(path)
        entry = cached.get(run["name"])
        fits = entry is not None and all(entry.get(k) == v for k, v in sizes.items())
        if not files:
            if fits and entry["snapshots"]:  # shipped without checkpoints: the cached entry stands
                done.append({**run, "snapshots": entry["snapshots"]})
            else:
                without.append(run["name"])
            continue
        old = {s["epoch"]: s for s in entry["snapshots"]} if fits else {}
        snaps = []
        for f in files:
            meta = read_metadata(f)
            epoch = int(meta["training"].get("epoch", 0))
            s = old.get(epoch)
            if s is None or s.get("checksum") != meta.get("checksum"):
                s = snapshot_entry(load_checkpoint(f, device=device), train_size, test_size)
            snaps.append(s)
        done.append({**run, "snapshots": snaps})
        if directory is not None:
            cached[run["name"]] = {"name": run["name"], **sizes, "snapshots": snaps}
            _write_cache(directory, list(cached.values()))
    return TrainingCensus([_summarise(r) for r in done], train_size, test_size, without)


def _source(source) -> tuple[Path | None, list[Path]]:
    """(the sweep directory, []) or (None, the checkpoint paths) that ``source`` names; a ConfigError otherwise
    (a path that is neither a directory nor a file, a sequence holding something that is not a path, anything
    else)."""
    expected = "expected a sweep directory, a checkpoint file or a sequence of checkpoint paths"
    if isinstance(source, (str, os.PathLike)):
        path = Path(source)
        if path.is_dir():
            return path, []
        if path.is_file():
            return None, [path]
        raise ConfigError(f"census over training: source {str(source)!r} is neither a directory nor a file; {expected}")
    if isinstance(source, Iterable) and not isinstance(source, (bytes, Mapping)):
        paths = list(source)
        bad = [p for p in paths if not isinstance(p, (str, os.PathLike))]
        if bad:
            raise ConfigError(f"census over training: source holds {bad[0]!r}, not a checkpoint path; {expected}")
        return None, [Path(p) for p in paths]
    raise ConfigError(f"census over training: source {source!r} ({type(source).__name__}) is not a path; {expected}")


def _directory_runs(directory: Path) -> list[tuple[dict[str, Any], Path]]:
    from interp.sweep_directory import checkpoint_path, load_results

    frame = load_results(directory)
    cols = [c for c in LABEL_COLUMNS if c in frame.columns]
    varying = [c for c in cols if frame[c].map(lambda v: repr(_plain(v))).nunique() > 1]  # None (NaN) counts too
    runs = []
    for _, row in frame.iterrows():
        run = {
            "name": row["name"],
            "seed": _plain(row.get("seed")),
            "configuration": ", ".join(f"{c}={_plain(row[c])}" for c in varying) or "all runs",
            **{c: _plain(row.get(c)) for c in ("d_model", "n_heads", "normalization")},
            "test_accuracy": _plain(row.get("test_accuracy")),
            "halving_success": _plain(row.get("halving_success")),
            "kept_epoch": _plain(row.get("kept_epoch")),
        }
        runs.append((run, checkpoint_path(directory, row)))
    return runs


def _checkpoint_run(path: Path) -> tuple[dict[str, Any], Path]:
    from interp.checkpoint import read_metadata

    meta = read_metadata(path)
    training, spec = meta.get("training") or {}, meta.get("model_spec") or {}
    run = {
        "name": path.name.removesuffix(".safetensors"),
        "seed": (training.get("config") or {}).get("seed"),
        "configuration": f"d_model={spec.get('d_model')}, n_heads={spec.get('n_heads')}",
        **{c: spec.get(c) for c in ("d_model", "n_heads", "normalization")},
        "test_accuracy": (training.get("accuracy") or {}).get("test"),
        "halving_success": (training.get("halving") or {}).get("success"),
        "kept_epoch": training.get("kept_epoch"),
    }
    return run, path


def _summarise(run: dict[str, Any]) -> dict[str, Any]:
    """A run's outcome and the epochs that tell its story, from its snapshots. A head is ``good`` by its
    separation accuracy alone (a probe can read the answer from it); ``used`` when it is also what the model reads:
    good, with learned accuracy (every other head zeroed) >= 0.95."""
    snaps = sorted(run["snapshots"], key=lambda s: s["epoch"])
    good = [any(h["grade"] == "good" for h in s["heads"]) for s in snaps]
    used = [any(_used(h) for h in s["heads"]) for s in snaps]
    return {
        **run,
        "snapshots": snaps,
        "outcome": "success" if _succeeded(run) else "failure",
        "first_good_epoch": next((s["epoch"] for s, g in zip(snaps, good) if g), None),
        "good_snapshots": sum(good),
        "good_at_last": bool(good[-1]) if good else False,
        "lost_good": any(good) and not good[-1],
        "first_used_epoch": next((s["epoch"] for s, u in zip(snaps, used) if u), None),
        "lost_used": any(used) and not used[-1],
        "first_perfect_epoch": next((s["epoch"] for s in snaps if s["test_accuracy"] >= 1.0), None),
    }


def _succeeded(run: dict[str, Any]) -> bool:
    """100% test accuracy, and for a halving run one head left at the end: Table 1's rule
    (:func:`analyses.populations.scores`, which scores a halving run that did not end with one head 0)."""
    import pandas as pd

    from interp.analyses.populations import scores

    row = {"test_accuracy": run.get("test_accuracy"), "halving_success": run.get("halving_success")}
    return bool(scores(pd.DataFrame([row])).iloc[0] >= 1.0)


def _used(head: dict[str, Any]) -> bool:
    """A good head the model reads: separation and learned accuracy both >= 0.95."""
    return head["grade"] == "good" and head["learned_accuracy"] is not None and head["learned_accuracy"] >= GOOD


def _median(xs: Sequence[float]) -> float | None:
    xs = [x for x in xs if x is not None and not (isinstance(x, float) and math.isnan(x))]
    return statistics.median(xs) if xs else None


def _defined(w: float | None) -> bool:
    return w is not None and not math.isnan(w)


def _clip(w: float | None) -> float:
    """Log axes cannot show 0, inf or undefined ratios: clipped to [1e-12, 1e12], undefined drawn at 1."""
    if w is None or (isinstance(w, float) and math.isnan(w)):
        return 1.0
    return min(max(w, 1e-12), 1e12)


@dataclass(eq=False)
class TrainingCensus(Result):
    """``runs``: per run its configuration label, seed, test accuracy, halving success and kept epoch (from the
    sweep), ``outcome``, ``first_good_epoch``, ``good_snapshots``, ``good_at_last``, ``lost_good``,
    ``first_used_epoch`` and ``lost_used`` (the same for a good head the model uses: learned accuracy >= 0.95 too),
    ``first_perfect_epoch`` and ``snapshots`` (per snapshot: ``epoch``, ``test_accuracy``, ``heads``: ``w01``,
    ``w02``, separation and learned accuracy, grade)."""

    runs: list[dict[str, Any]]
    train_size: int | None = TRAIN_SIZE
    test_size: int | None = TEST_SIZE
    without_snapshots: list[str] = field(default_factory=list)

    def configurations(self) -> list[str]:
        return list(dict.fromkeys(r["configuration"] for r in self.runs))

    def rows(self) -> list[dict[str, Any]]:
        """One row per run: outcome, the epochs of its story, and its first head's w01/w02 at the last snapshot."""
        out = []
        for r in self.runs:
            last = r["snapshots"][-1]["heads"][0] if r["snapshots"] else {}
            out.append(
                {
                    "configuration": r["configuration"],
                    "seed": r["seed"],
                    "outcome": r["outcome"],
                    "test_accuracy": r["test_accuracy"],
                    "kept_epoch": r["kept_epoch"],
                    "first_good_epoch": r["first_good_epoch"],
                    "first_used_epoch": r["first_used_epoch"],
                    "first_perfect_epoch": r["first_perfect_epoch"],
                    "good_snapshots": r["good_snapshots"],
                    "snapshots": len(r["snapshots"]),
                    "lost_good": r["lost_good"],
                    "lost_used": r["lost_used"],
                    "last_w01": last.get("w01"),
                    "last_w02": last.get("w02"),
                }
            )
        return out

    def summary(self) -> list[dict[str, Any]]:
        """Per configuration and outcome: runs, runs that ever had a good head, runs that had one and lost it,
        the median (min-max) first epoch with a good head, the same for a good head the model uses (learned accuracy
        >= 0.95 too), and the medians of w01 / w02 at the first snapshot and at the last (every head of every
        run)."""
        table = []
        for conf in self.configurations():
            for outcome in ("success", "failure"):
                rs = [r for r in self.runs if r["configuration"] == conf and r["outcome"] == outcome]
                if not rs:
                    continue
                firsts = [r["first_good_epoch"] for r in rs if r["first_good_epoch"] is not None]
                used = [r["first_used_epoch"] for r in rs if r["first_used_epoch"] is not None]

                def heads(i: int, rs=rs):
                    return [h for r in rs if r["snapshots"] for h in r["snapshots"][i]["heads"]]

                table.append(
                    {
                        "configuration": conf,
                        "outcome": outcome,
                        "runs": len(rs),
                        "ever_good": sum(r["first_good_epoch"] is not None for r in rs),
                        "lost_good": sum(r["lost_good"] for r in rs),
                        "first_good_median": _median(firsts),
                        "first_good_min": min(firsts) if firsts else None,
                        "first_good_max": max(firsts) if firsts else None,
                        "ever_used": len(used),
                        "lost_used": sum(r["lost_used"] for r in rs),
                        "first_used_median": _median(used),
                        "first_used_min": min(used) if used else None,
                        "first_used_max": max(used) if used else None,
                        "w01_first": _median([h["w01"] for h in heads(0)]),
                        "w02_first": _median([h["w02"] for h in heads(0)]),
                        "w01_last": _median([h["w01"] for h in heads(-1)]),
                        "w02_last": _median([h["w02"] for h in heads(-1)]),
                    }
                )
        return table

    def ratios_over_epochs(self) -> list[dict[str, Any]]:
        """Per configuration, outcome and snapshot epoch: the median w01, w02 and separation accuracy of every head,
        how many heads weigh 0s and 1s alike (w01 within a factor 2 of 1), ignore 2s (w02 >= 10) or favour 2s over
        0s (w02 < 1/2) (the head summary's words), and how many runs have a good head, a good head the model uses,
        and 100% test accuracy at that epoch (the figure's story in numbers)."""
        out = []
        for conf in self.configurations():
            for outcome in ("success", "failure"):
                rs = [r for r in self.runs if r["configuration"] == conf and r["outcome"] == outcome]
                epochs = sorted({s["epoch"] for r in rs for s in r["snapshots"]})
                for e in epochs:
                    snaps = [s for r in rs for s in r["snapshots"] if s["epoch"] == e]
                    hs = [h for s in snaps for h in s["heads"]]
                    out.append(
                        {
                            "configuration": conf,
                            "outcome": outcome,
                            "epoch": e,
                            "runs": len(snaps),
                            "w01": _median([h["w01"] for h in hs]),
                            "w02": _median([h["w02"] for h in hs]),
                            "separation_accuracy": _median([h["separation_accuracy"] for h in hs]),
                            "heads": len(hs),
                            "w01_alike": sum(_defined(h["w01"]) and 1 / BAND <= h["w01"] <= BAND for h in hs),
                            "w02_ignored": sum(_defined(h["w02"]) and h["w02"] >= W02_IGNORED for h in hs),
                            "favours_2": sum(_defined(h["w02"]) and h["w02"] < 1 / BAND for h in hs),
                            "with_good_head": sum(any(h["grade"] == "good" for h in s["heads"]) for s in snaps),
                            "with_used_head": sum(any(_used(h) for h in s["heads"]) for s in snaps),
                            "at_100": sum(s["test_accuracy"] >= 1.0 for s in snaps),
                        }
                    )
        return out

    def figure(self):
        """Figure 7 over time, per configuration: each head's path in the (w01, w02) plane over the snapshots (a
        dot at its last), and w01, w02 and separation accuracy against the epoch; one line per run and head,
        coloured by the run's outcome."""
        import plotly.graph_objects as go
        from plotly.subplots import make_subplots

        confs = self.configurations() or ["no runs"]
        titles = []
        for c in confs:
            titles += [f"{c}: w01 against w02 over training", "w01 against epoch", "w02 against epoch"]
            titles += ["separation accuracy against epoch"]
        fig = make_subplots(rows=2 * len(confs), cols=2, subplot_titles=titles, vertical_spacing=0.16 / len(confs))
        shown = set()
        for ci, conf in enumerate(confs):
            row = 2 * ci + 1
            for r in (r for r in self.runs if r["configuration"] == conf):
                colour = COLOURS[r["outcome"]]
                n_heads = len(r["snapshots"][0]["heads"]) if r["snapshots"] else 0
                for hi in range(n_heads):
                    epochs = [s["epoch"] for s in r["snapshots"]]
                    hs = [s["heads"][hi] for s in r["snapshots"]]
                    w01, w02 = [_clip(h["w01"]) for h in hs], [_clip(h["w02"]) for h in hs]
                    sep = [h["separation_accuracy"] for h in hs]
                    hover = [
                        f"seed {r['seed']} {h['head']}, epoch {e}<br>w01 = {_fmt(h['w01'])}, w02 = {_fmt(h['w02'])}"
                        f"<br>separation {h['separation_accuracy']:.3f} ({h['grade']}), test accuracy "
                        f"{s['test_accuracy']:.3f}"
                        for e, h, s in zip(epochs, hs, r["snapshots"])
                    ]
                    legend = r["outcome"] not in shown
                    shown.add(r["outcome"])
                    common = dict(
                        line=dict(color=colour, width=1),
                        opacity=0.6,
                        legendgroup=r["outcome"],
                        hovertext=hover,
                        hoverinfo="text",
                    )
                    fig.add_trace(
                        go.Scatter(
                            x=w01,
                            y=w02,
                            mode="lines+markers",
                            marker=dict(size=[3] * (len(w01) - 1) + [9], color=colour),
                            name=f"{r['outcome']} (100% test: {'yes' if r['outcome'] == 'success' else 'no'})",
                            showlegend=legend,
                            **common,
                        ),
                        row=row,
                        col=1,
                    )
                    for (rr, cc), ys in (((row, 2), w01), ((row + 1, 1), w02), ((row + 1, 2), sep)):
                        fig.add_trace(
                            go.Scatter(x=epochs, y=ys, mode="lines", showlegend=False, **common), row=rr, col=cc
                        )
            fig.update_xaxes(type="log", title_text="w01 = A(=→0) / A(=→1)", row=row, col=1)
            fig.update_yaxes(type="log", title_text="w02 = A(=→0) / A(=→2)", row=row, col=1)
            fig.update_yaxes(type="log", title_text="w01", row=row, col=2)
            fig.update_yaxes(type="log", title_text="w02", row=row + 1, col=1)
            fig.update_yaxes(title_text="separation accuracy", range=[0.4, 1.02], row=row + 1, col=2)
            for rr, cc in ((row, 2), (row + 1, 1), (row + 1, 2)):
                fig.update_xaxes(title_text="epoch", row=rr, col=cc)
        fig.update_layout(
            title="Figure 7 over training (Fraknói 2024, §5.4): every head of every run at every snapshot",
            template="plotly_white",
            width=1000,
            height=800 * len(confs),
            legend=dict(title="run outcome"),
        )
        return fig

    def table_html(self) -> str:
        from interp.visualize import render_table

        return render_table(
            self.summary(),
            caption=f"Runs by outcome: ever a good head (separation accuracy >= {GOOD}), had one and lost it, first "
            "epoch with one, median w01 / w02 at the first and the last snapshot",
            float_format=".3g",
        )

    def text(self) -> str:
        lines = [
            f"census over training of {len(self.runs)} runs ({self.train_size} train / {self.test_size} test "
            "sentences per snapshot)"
        ]
        for e in self.summary():
            lines.append(
                f"{e['configuration']} {e['outcome']}: {e['runs']} runs, {e['ever_good']} ever with a good head "
                f"(first at epoch {_fmt(e['first_good_median'])} median, {_fmt(e['first_good_min'])}-"
                f"{_fmt(e['first_good_max'])}), {e['lost_good']} lost it; {e['ever_used']} with a good head the "
                f"model uses (first at {_fmt(e['first_used_median'])} median, {_fmt(e['first_used_min'])}-"
                f"{_fmt(e['first_used_max'])}), {e['lost_used']} lost it; median w01 {_fmt(e['w01_first'])} -> "
                f"{_fmt(e['w01_last'])}, w02 {_fmt(e['w02_first'])} -> {_fmt(e['w02_last'])} (first -> last snapshot)"
            )
        return "\n".join(lines)

    def __repr__(self) -> str:
        return self.text()

    def to_dict(self, series: bool = False) -> dict:
        """Plain JSON. ``series=True`` writes each run's snapshots as columns (``series``: ``epoch``,
        ``test_accuracy`` and per head ``w01``, ``w02``, ``separation_accuracy``, ``learned_accuracy``, one number
        per snapshot; the grade follows from separation accuracy), about half the size, for shipping."""
        runs = [_as_series(r) for r in self.runs] if series else self.runs
        return jsonable(
            {
                "train_size": self.train_size,
                "test_size": self.test_size,
                "good_threshold": GOOD,
                "summary": self.summary(),
                "over_epochs": self.ratios_over_epochs(),
                "runs": runs,
                "without_snapshots": self.without_snapshots,
            }
        )

    @classmethod
    def from_dict(cls, d: dict) -> TrainingCensus:
        """The result again from :meth:`to_dict` (either layout; e.g. a shipped JSON file): its tables and figure
        without the checkpoints (ratios written as null, i.e. infinite or undefined, are drawn clipped)."""
        runs = [_summarise(_from_series(r)) if "series" in r else r for r in d["runs"]]
        return cls(runs, d.get("train_size"), d.get("test_size"), list(d.get("without_snapshots", [])))


SERIES_KEYS = ("w01", "w02", "separation_accuracy", "learned_accuracy")


def _as_series(run: dict[str, Any]) -> dict[str, Any]:
    """A run with its snapshots as columns (see :meth:`TrainingCensus.to_dict`)."""
    snaps = run["snapshots"]
    names = [h["head"] for h in snaps[0]["heads"]] if snaps else []
    series = {
        "epoch": [s["epoch"] for s in snaps],
        "test_accuracy": [s["test_accuracy"] for s in snaps],
        "heads": {n: {k: [s["heads"][i][k] for s in snaps] for k in SERIES_KEYS} for i, n in enumerate(names)},
    }
    return {**{k: v for k, v in run.items() if k != "snapshots"}, "series": series}


def _from_series(run: dict[str, Any]) -> dict[str, Any]:
    from .head_summary import grade

    s = run["series"]
    snaps = []
    for i, (epoch, acc) in enumerate(zip(s["epoch"], s["test_accuracy"])):
        heads = [{"head": n, **{k: cols[k][i] for k in SERIES_KEYS}} for n, cols in s["heads"].items()]
        for h in heads:
            h["grade"] = grade(h["separation_accuracy"])
        snaps.append({"epoch": epoch, "test_accuracy": acc, "heads": heads})
    return {**{k: v for k, v in run.items() if k != "series"}, "snapshots": snaps}


def _fmt(x) -> str:
    return "-" if x is None else f"{x:.3g}"


__all__ = ["TrainingCensus", "census_over_training", "has_snapshots", "snapshot_entry", "snapshot_files"]
