"""Progress measures of grokking (Nanda et al. 2023 §5): restricted and excluded loss, the sum of squared weights,
and the three phases of training (memorisation, circuit formation, cleanup) read off the curves.

- *Restricted loss*: the logits at ``=`` over all ``p**2`` pairs keep only their components along
  ``cos(w_k (a + b))`` and ``sin(w_k (a + b))`` for the key frequencies ``k`` (plus each logit's mean over the
  pairs); the loss of those logits on every pair. Falls as the Fourier circuit forms.
- *Excluded loss*: the same components *removed* from the logits; the loss on the training pairs. Rises as the
  model comes to rely on the key frequencies instead of memorised lookups.
- *Sum of squared weights*: ``sum ||theta||^2`` over the trained parameters; weight decay shrinks it in cleanup.

The measures of one model come from :func:`progress_measures`; over a run from the history recorded in the
checkpoint, or recomputed from a run's snapshots with the final model's key frequencies
(:func:`progress_from_snapshots`, which ``interp train ... --snapshots N`` runs at the end and writes into the
checkpoint's history).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import torch.nn.functional as F
from jaxtyping import Float
from torch import Tensor

from interp.device import check_device
from interp.errors import InterpError
from interp.results import Result, jsonable

from .fourier import answer_logits, embedding_norms, key_directions, key_frequencies_of

if TYPE_CHECKING:
    from transformer_lens import HookedTransformer

    from interp.task import Task


def key_projection(logits: Float[Tensor, "pair c"], p: int, freqs: list[int]) -> Float[Tensor, "pair c"]:
    """The part of ``logits`` (as functions of the pair, one per output ``c``) along the key directions."""
    d = key_directions(p, freqs, logits.device)
    return d.T @ (d @ logits.double())


def restricted_logits(logits: Float[Tensor, "pair c"], p: int, freqs: list[int]) -> Float[Tensor, "pair c"]:
    """Only the key frequencies kept: each logit's mean over the pairs plus its key-direction part."""
    return logits.double().mean(0, keepdim=True) + key_projection(logits, p, freqs)


def excluded_logits(logits: Float[Tensor, "pair c"], p: int, freqs: list[int]) -> Float[Tensor, "pair c"]:
    """The key frequencies removed."""
    return logits.double() - key_projection(logits, p, freqs)


def _loss(logits, labels) -> float:
    return F.cross_entropy(logits.double(), labels.to(logits.device)).item()


def _accuracy(logits, labels) -> float:
    return (logits.argmax(-1) == labels.to(logits.device)).double().mean().item()


def sum_squared_weights(model: HookedTransformer, *, device: str | None = None) -> float:
    """Sum of squared trained parameters (frozen ones, such as zeroed biases, left out)."""
    check_device(model, device)
    return float(sum(p.detach().double().pow(2).sum() for p in model.parameters() if p.requires_grad))


def progress_measures(
    model: HookedTransformer, *, task: Task, key_frequencies: list[int] | None = None, device: str | None = None
) -> dict[str, float]:
    """Train / test loss and accuracy, restricted and excluded loss, sum of squared weights and the share of the
    embedding's norm in the key frequencies (default: the model's own, from :func:`embedding_norms`)."""
    p = task.p
    norms = embedding_norms(model, task=task, key_frequencies=key_frequencies, device=device)
    keys = norms.key_frequencies
    logits = answer_logits(model, task)
    labels = task.dataset("all").labels.to(logits.device)
    train, test = task.split_index("train").to(logits.device), task.split_index("test").to(logits.device)
    out = {
        "train_loss_all": _loss(logits[train], labels[train]),
        "train_accuracy": _accuracy(logits[train], labels[train]),
        "test_loss": _loss(logits[test], labels[test]),
        "test_accuracy": _accuracy(logits[test], labels[test]),
    }
    if keys:
        out["restricted_loss"] = _loss(restricted_logits(logits, p, keys), labels)
        exc = excluded_logits(logits, p, keys)[train]
        out["excluded_loss"] = _loss(exc, labels[train])
    out["sum_squared_weights"] = sum_squared_weights(model)
    total = float(norms.energy[1:].sum())
    out["embedding_key_fraction"] = float(norms.energy[keys].sum()) / total if keys and total else 0.0
    return out


def progress_from_snapshots(
    snapshot_dir, *, task: Task, key_frequencies: list[int], device: str | None = None
) -> list[dict]:
    """:func:`progress_measures` of every snapshot ``epoch-*.safetensors`` in ``snapshot_dir`` (sorted by epoch), with
    fixed ``key_frequencies`` (the final model's): one record per snapshot with its ``epoch``."""
    from interp.tasks import load_checkpoint

    files = sorted(Path(snapshot_dir).glob("epoch-*.safetensors"))
    if not files:
        raise InterpError(f"no snapshots epoch-*.safetensors in {snapshot_dir}")
    rows = []
    for f in files:
        ck = load_checkpoint(f, device=device)
        rows.append(
            {
                "epoch": int(f.stem.split("-")[1]),
                **progress_measures(ck.model, task=task, key_frequencies=key_frequencies),
            }
        )
    return rows


MEASURE_KEYS = (
    "restricted_loss",
    "excluded_loss",
    "sum_squared_weights",
    "train_accuracy",
    "test_accuracy",
    "test_loss",
    "train_loss_all",
    "embedding_key_fraction",
)


def merge_progress(history: list[dict], rows: list[dict]) -> list[dict]:
    """The history with each row's measures added to the record of the same epoch."""
    by_epoch = {r["epoch"]: r for r in rows}
    return [{**h, **{k: v for k, v in by_epoch.get(h.get("epoch"), {}).items() if k != "epoch"}} for h in history]


def write_progress(checkpoint_path, snapshot_dir, device: str | None = None) -> dict:
    """Recompute the progress measures from a run's snapshots with the final model's key frequencies and write them
    into the checkpoint's history (the file is rewritten atomically; the weights are unchanged)."""
    from interp.loading import save_checkpoint
    from interp.tasks import load_checkpoint

    ck = load_checkpoint(checkpoint_path, device=device)
    keys = key_frequencies_of(ck.model, task=ck.task)
    rows = progress_from_snapshots(snapshot_dir, task=ck.task, key_frequencies=keys, device=device)
    training = dict(ck.metadata.get("training", {}))
    training["history"] = merge_progress(training.get("history", []), rows)
    training["progress_key_frequencies"] = keys
    training["progress_every"] = rows[1]["epoch"] - rows[0]["epoch"] if len(rows) > 1 else None
    save_checkpoint(ck.model, ck.task, ck.path, training=training, spec=ck.spec)
    return {"key_frequencies": keys, "snapshots": len(rows)}


@dataclass(eq=False)
class Phases(Result):
    """The three phases of grokking found on the curves of a run, and the curves themselves.

    Rules (stated so the boundaries can be checked): memorisation runs from epoch 0 to the peak of the test loss
    (train loss falls while test loss rises: the training pairs are being memorised); circuit formation from there to
    the first epoch with test accuracy >= 0.5 (the test loss falls as the key-frequency circuit forms); cleanup from
    there to the first epoch with test accuracy >= 0.99 (``grokked``), while weight decay removes the memorised parts.
    ``memorised`` is the first epoch with train accuracy >= 0.99. ``None`` where a curve never gets there. At large
    training fractions the phases overlap (the circuit forms while the model is still memorising); at fraction 0.3
    they are far apart (Nanda et al.: about 1.4k, 9.4k and 13k epochs)."""

    epochs: list[int]
    curves: dict  # name -> list of values (None where not measured)
    circuit_formation: int | None
    cleanup: int | None
    grokked: int | None
    key_frequencies: list[int] = field(default_factory=list)
    memorised: int | None = None

    def to_dict(self) -> dict:
        return jsonable(
            {
                "memorisation": [0, self.circuit_formation],
                "circuit_formation": [self.circuit_formation, self.cleanup],
                "cleanup": [self.cleanup, self.grokked],
                "grokked_epoch": self.grokked,
                "memorised_epoch": self.memorised,
                "key_frequencies": self.key_frequencies,
                "n_records": len(self.epochs),
                "epochs": self.epochs,
                "curves": self.curves,
            }
        )

    @classmethod
    def from_dict(cls, d: dict) -> Phases:
        return cls(
            list(d["epochs"]),
            {k: list(v) for k, v in d["curves"].items()},
            d["circuit_formation"][0],
            d["cleanup"][0],
            d["grokked_epoch"],
            list(d["key_frequencies"]),
            d["memorised_epoch"],
        )

    def text(self) -> str:
        """The phase boundaries, in epochs."""
        return (
            f"grokking phases over {len(self.epochs)} records: memorisation 0-{self.circuit_formation}, circuit "
            f"formation {self.circuit_formation}-{self.cleanup}, cleanup {self.cleanup}-{self.grokked} (test accuracy "
            f">= 0.99 at epoch {self.grokked}; train accuracy >= 0.99 at epoch {self.memorised})"
        )

    def figure(self):
        import plotly.graph_objects as go
        from plotly.subplots import make_subplots

        fig = make_subplots(specs=[[{"secondary_y": True}]])
        styles = {
            "train_loss": "#1f77b4",
            "test_loss": "#d62728",
            "val_loss": "#d62728",
            "restricted_loss": "#2ca02c",
            "excluded_loss": "#9467bd",
        }
        for name, color in styles.items():
            ys = self.curves.get(name)
            if ys is None or all(v is None for v in ys):
                continue
            if name == "val_loss" and self.curves.get("test_loss") is not None:
                continue
            pts = [(e, v) for e, v in zip(self.epochs, ys) if v is not None and v > 0]
            fig.add_trace(
                go.Scatter(
                    x=[e for e, _ in pts],
                    y=[v for _, v in pts],
                    name=name.replace("val_loss", "test_loss"),
                    mode="lines",
                    line=dict(color=color),
                ),
                secondary_y=False,
            )
        ssw = self.curves.get("sum_squared_weights")
        if ssw is not None:
            pts = [(e, v) for e, v in zip(self.epochs, ssw) if v is not None]
            fig.add_trace(
                go.Scatter(
                    x=[e for e, _ in pts],
                    y=[v for _, v in pts],
                    name="sum of squared weights",
                    mode="lines",
                    line=dict(color="#7f7f7f", dash="dot"),
                ),
                secondary_y=True,
            )
        last = self.epochs[-1] if self.epochs else 1
        bounds = [0, self.circuit_formation, self.cleanup, self.grokked]
        names = ["memorisation", "circuit formation", "cleanup"]
        colors = ["rgba(31,119,180,0.08)", "rgba(44,160,44,0.10)", "rgba(214,39,40,0.08)"]
        for i, name in enumerate(names):
            lo, hi = bounds[i], bounds[i + 1]
            if lo is None:
                break
            fig.add_vrect(
                x0=max(lo, 1),
                x1=hi if hi is not None else last,
                fillcolor=colors[i],
                line_width=0,
                annotation_text=name,
                annotation_position="top left",
            )
        fig.update_yaxes(type="log", title_text="loss (log)", secondary_y=False)
        fig.update_yaxes(title_text="sum of squared weights", secondary_y=True)
        fig.update_layout(
            title="Grokking: losses, progress measures and the three phases"
            + (f" (key frequencies {', '.join(map(str, self.key_frequencies))})" if self.key_frequencies else ""),
            xaxis_title="epoch",
            template="plotly_white",
            height=460,
            width=900,
        )
        return fig


def _first(epochs, values, ok) -> int | None:
    for e, v in zip(epochs, values):
        if v is not None and ok(v):
            return int(e)
    return None


def find_phases(history: list[dict], key_frequencies: list[int] | None = None) -> Phases:
    """:class:`Phases` from a training history (records with ``epoch`` and some of the measures)."""
    history = [h for h in history if isinstance(h, dict) and "epoch" in h]
    if not history:
        raise InterpError("the checkpoint has no training history: phases need the per-epoch curves")
    epochs = [int(h["epoch"]) for h in history]
    names = sorted({k for h in history for k in h if k != "epoch"})
    curves = {k: [h.get(k) for h in history] for k in names}
    train_acc = curves.get("train_accuracy")
    # the trainer's per-epoch validation curves are this task's test split (it has no val split): finer than snapshots
    test_acc = curves.get("val_accuracy") or curves.get("test_accuracy")
    memorised = _first(epochs, train_acc, lambda v: v >= 0.99) if train_acc else None
    test_loss = curves.get("val_loss") or curves.get("test_loss")
    cleanup = _first(epochs, test_acc, lambda v: v >= 0.5) if test_acc else None
    grokked = _first(epochs, test_acc, lambda v: v >= 0.99) if test_acc else None
    start_cf = None
    if test_loss:  # the test-loss peak before the test accuracy takes off
        pts = [(v, e) for e, v in zip(epochs, test_loss) if v is not None and (cleanup is None or e <= cleanup)]
        start_cf = max(pts)[1] if pts else None
    return Phases(epochs, curves, start_cf, cleanup, grokked, list(key_frequencies or []), memorised)
