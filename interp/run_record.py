"""One run's record, written once for both trainers (:func:`interp.training.train`, one model; and
:func:`interp.population.train_population`, many models as one computation, where each model keeps its own).

It holds the rules a run is judged by, so the two trainers cannot drift apart:

- the validation split (:func:`validation_split`: the task's ``"val"`` split, else its last one);
- which epoch's model is kept (``keep``): ``"best"``, the highest validation accuracy with ties broken by the lower
  validation loss (so an epoch that only ties the majority-class accuracy never beats a later, better-trained one);
  ``"first-best"``, the first epoch at the highest validation accuracy ("the best model selected on validation
  accuracy" read literally); ``"last"``, the final epoch. With halving heads only one-head states compete, and a run
  that never got down to one head keeps its last state;
- when to stop early (``patience`` epochs without a better model, counted from the last halving step too);
- what the checkpoint records about the run (:meth:`RunRecord.provenance`), including the halving score: the test
  accuracy, or 0 for a run that ends with more than one head (Fraknói 2024, *Solving Mathematical Problems with
  Transformers*, MSc thesis, ELTE: "I considered it as a failure and marked it with 0% accuracy").
"""

from __future__ import annotations

import json
import math
import platform
from dataclasses import asdict, dataclass, field
from typing import Any

import torch

from .halving import Halving
from .task import Task


def validation_split(task: Task) -> str:
    """The split the kept model is chosen on: ``"val"`` where the task has one, else its last split."""
    return "val" if "val" in task.splits else task.splits[-1]


@dataclass
class RunRecord:
    """What one run has done so far: its history (one record per epoch), its best epoch by the ``keep`` rule, its
    halving schedule, whether it is still training, and how many epochs and steps it ran."""

    keep: str = "best"
    patience: int | None = None
    halving: Halving | None = None
    history: list[dict[str, Any]] = field(default_factory=list)
    best_accuracy: float = -1.0
    best_loss: float = math.inf
    best_epoch: int = -1
    epochs_run: int = 0
    steps: int = 0
    active: bool = True  # still training (not stopped by patience, not past its last epoch)
    # the JSON of history entries before the last, encoded once (only the last entry changes: note_halving)
    _encoded: list[str] = field(default_factory=list, repr=False, compare=False)

    def end_epoch(self, epoch: int, steps: int, train_loss: float, val: dict[str, float]) -> bool:
        """Record an epoch's training loss and validation metrics; True when its model becomes the kept-so-far
        (the trainer then copies its weights). With halving heads, only one-head states compete."""
        self.epochs_run, self.steps = epoch, steps
        acc, loss = float(val["accuracy"]), float(val["loss"])
        self.history.append({"epoch": epoch, "train_loss": float(train_loss), "val_accuracy": acc, "val_loss": loss})
        if self.halving is not None and not self.halving.done:
            return False
        ties_by_loss = self.keep != "first-best"
        better = acc > self.best_accuracy or (ties_by_loss and acc == self.best_accuracy and loss < self.best_loss)
        if better:
            self.best_accuracy, self.best_loss, self.best_epoch = acc, loss, epoch
        return better

    def note_halving(self, step: dict[str, Any] | None) -> None:
        """A halving step taken after this epoch's validation goes into its history record."""
        if step is not None:
            self.history[-1]["kept_heads"] = step["kept"]

    def should_stop(self, epoch: int) -> bool:
        """Patience: ``patience`` epochs without a better kept model (nor a halving step); never mid-halving."""
        if self.patience is None or (self.halving is not None and not self.halving.done):
            return False
        last_halving = self.halving.last_epoch if self.halving is not None else -1
        return epoch - max(self.best_epoch, last_halving) >= self.patience

    @property
    def kept(self) -> str:
        """The rule that picked the written model: ``keep``, or ``"last"`` where no epoch qualified (a halving run
        that never got down to one head)."""
        return self.keep if self.best_epoch >= 0 else "last"

    @property
    def kept_epoch(self) -> int:
        return self.best_epoch if self.kept != "last" else self.epochs_run

    def provenance(
        self, cfg: Any, metrics: dict[str, dict[str, float]], device: str, wall_seconds: float, **extra: Any
    ) -> dict[str, Any]:
        """What the checkpoint's ``training`` metadata records about the run (``extra`` adds keys, e.g. the
        population a model was trained in)."""
        prov = {
            "seed": cfg.seed,
            "epochs": cfg.epochs,
            "epochs_run": self.epochs_run,
            "steps": self.steps,
            "best_epoch": self.best_epoch,
            "kept": self.kept,
            "kept_epoch": self.kept_epoch,
            "config": asdict(cfg),
            "accuracy": {s: m["accuracy"] for s, m in metrics.items()},
            "metrics": metrics,
            "history": self.history,
            "device": device,
            "wall_seconds_this_run": round(wall_seconds, 1),
            "torch": torch.__version__,
            "cpu_threads": torch.get_num_threads(),
            "python": platform.python_version(),
            "machine": platform.machine(),
            **extra,
        }
        if self.halving is not None:
            test = metrics.get("test", {}).get("accuracy")
            prov["halving"] = {**self.halving.summary(), "score": test if self.halving.done else 0.0}
        return prov

    # -- resume files (JSON) --------------------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        return {
            "keep": self.keep,
            "patience": self.patience,
            "halving": self.halving.to_dict() if self.halving is not None else None,
            "history": self.history,
            "best": [self.best_accuracy, self.best_loss, self.best_epoch],
            "epochs_run": self.epochs_run,
            "steps": self.steps,
            "active": self.active,
        }

    def to_json(self) -> str:
        """``json.dumps(self.to_dict())`` (the same value decoded; the history last), with each history entry but
        the last encoded only the first time: a resume file written every few epochs would otherwise encode the
        whole history again each time, a cost that grows with the epochs (quadratic over a run)."""
        done, history = self._encoded, self.history
        done.extend(json.dumps(h) for h in history[len(done) : len(history) - 1])
        entries = done + [json.dumps(h) for h in history[len(done) :]]  # the last entry, fresh
        head = json.dumps({k: v for k, v in self.to_dict().items() if k != "history"})
        return f'{head[:-1]}, "history": [{", ".join(entries)}]}}'

    @classmethod
    def from_dict(cls, d: dict[str, Any], keep: str, patience: int | None) -> RunRecord:
        """A record saved by :meth:`to_dict`; ``keep`` and ``patience`` are the resumed run's (they may change)."""
        best = d["best"]
        return cls(
            keep,
            patience,
            Halving.from_dict(d["halving"]) if d.get("halving") is not None else None,
            list(d["history"]),
            float(best[0]),
            float(best[1]),
            int(best[2]),
            int(d["epochs_run"]),
            int(d["steps"]),
            bool(d.get("active", True)),
        )
