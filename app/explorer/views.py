"""What the explorer computes for the page from its session state (:mod:`.state`), every number by the toolkit's
analyses: the input's forward pass under the mask (prediction, patterns, logits, direct logit contributions), the
learned accuracy of the kept heads, the patching against the corrupted input, the open head's panel, the costlier
numbers computed on request, and each panel's view as the page gets it (plain JSON types and bytes); and the whole
view as plain JSON (:meth:`Views.state_dict`)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from interp.analyses.learned_accuracies import LearnedAccuracy, learned_accuracy
from interp.analyses.patching import ActivationPatching, PathPatching, activation_patching, path_patching
from interp.analyses.pattern_scores import HeadScores, head_scores
from interp.analyses.separation_accuracies import separation_accuracy
from interp.errors import InterpError
from interp.evaluation import predictions_and_loss
from interp.heads import Head, head_label

from .circuit import CircuitSession, circuit_page
from .compute import (
    SHAPLEY_EXACT_MAX,
    answer_prediction,
    circuit_view,
    direct_logit_attribution,
    finite_or_none,
    head_circuits,
    mask_hooks,
    masked_forward,
    pattern_window,
    quantised_patterns,
    runner_up,
    score_numbers,
    score_probes,
    separation_numbers,
    shapley_cost,
    shapley_numbers,
    shapley_values,
)
from .results import MAX_ROWS, Prediction

if TYPE_CHECKING:
    from torch import Tensor

    from interp.analyses.circuit_discovery import Circuit
    from interp.task import TaskData

    from .state import Session

SEPARATION_TRAIN = 2000  # train examples the separators are fitted on
MAX_ERROR = 300  # characters of the widget's error line at most


def one_line(e: BaseException) -> str:
    """The first line of an error's message, at most ``MAX_ERROR`` characters: what the widget's error line shows."""
    text = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
    return text if len(text) <= MAX_ERROR else text[: MAX_ERROR - 3] + "..."


class Views:
    """The numbers of the current view, recomputed from a :class:`.state.Session` where it changed, and the views
    the page draws."""

    def __init__(self, session: Session, max_positions: int):
        if not isinstance(max_positions, int) or max_positions < 2:
            raise InterpError(f"max_positions must be an integer >= 2, got {max_positions!r}")
        self.s = session
        self.max_positions = max_positions
        self.circuits: dict[Head, list[dict]] = {}  # head -> its circuits as the page gets them
        self.scores: HeadScores | None = None  # every head's pattern scores, computed once
        self.scores_note: str | None = None  # what the scores were measured on (set once they were asked for)
        self.patch: ActivationPatching | None = None
        self.path: PathPatching | None = None
        self.patch_error = ""
        self.metrics: dict[str, float] | None = None
        self.fwd: dict[str, Any] = {}
        self.acc: LearnedAccuracy | None = None
        self.head_view: dict = {}
        self.cview: CircuitSession | None = None  # the circuit view's input pair: EAP scores, empty circuit
        self.circuit_result: Circuit | None = None  # the circuit left with the edges off
        self.circuit_logits: Tensor | None = None  # the answer position's logits with the edges off
        self.circuit_data: dict = {}
        self.circuit_error = ""

    # -- the numbers -----------------------------------------------------------------------------------------------

    def forward(self) -> None:
        """The input's forward pass under the mask: the prediction, the patterns, the logits, and each head's direct
        contribution to the answer and to the answer against the runner-up among the task's answers."""
        s = self.s
        clean = s.clean
        out = masked_forward(s.model, clean.tokens, s.keep(), s.z_ref())
        logits = out["logits"][0]
        pred = answer_prediction(logits, clean.targets[0], int(clean.answer_pos[0]), list(s.task.vocab.tokens))
        ap, label = pred.answer_pos, int(clean.labels[0])
        classes = torch.unique(torch.cat([s.batch()["batch"].labels, clean.labels]))
        bad = runner_up(logits[ap], classes, label)
        scale = None if out["scale"] is None else out["scale"][0]
        dla_good, dla_diff = direct_logit_attribution(s.model, out["z"][0], scale, ap, label, bad)
        self.fwd = {
            "prediction": pred,
            "patterns": out["patterns"][0].cpu(),
            "logits": logits.cpu(),
            "dla": dla_good.cpu(),
            "dla_diff": dla_diff.cpu(),
            "label": label,
            "runner_up": bad,
        }

    def accuracy_options(self) -> dict[str, Any]:
        """The keyword arguments of every learned accuracy on the batch's answer cache (the fast path's input; the
        hook path runs the batch it was built from): the ablation, its reference (the cache) and the task."""
        b = self.s.batch()
        return {"ablation": self.s.ablation, "reference": b["cache"], "task": self.s.task}

    def accuracy(self) -> None:
        """Learned accuracy of the kept heads (and, with a panel open, of the mask with that head toggled) in one
        batched call; the all-heads accuracy once per batch and ablation."""
        s = self.s
        b = s.batch()
        kw = self.accuracy_options()
        if s.ablation not in b["full"]:
            b["full"][s.ablation] = float(
                learned_accuracy(s.model, b["cache"], heads=[s.all_heads()], **kw).accuracy[0]
            )
        subsets = [s.kept()]
        if s.head is not None:
            subsets.append(s.kept(s.ablated ^ {s.head}))
        self.metrics = None
        self.acc = learned_accuracy(s.model, b["cache"], heads=subsets, **kw)

    def full_accuracy(self) -> float:
        """The learned accuracy with every head on."""
        return self.s.batch()["full"][self.s.ablation]

    def single_head_accuracies(self) -> LearnedAccuracy:
        """Every head's learned accuracy alone, once per batch and ablation."""
        s = self.s
        b = s.batch()
        if s.ablation not in b["singles"]:
            b["singles"][s.ablation] = learned_accuracy(
                s.model, b["cache"], heads=[[h] for h in s.all_heads()], **self.accuracy_options()
            )
        return b["singles"][s.ablation]

    def task_metrics(self) -> dict[str, float]:
        """The task's own metrics under the mask on the accuracy batch: one hooked forward pass."""
        s = self.s
        batch = s.batch()["batch"]
        out = predictions_and_loss(s.model, batch, fwd_hooks=mask_hooks(s.model, s.keep(), s.z_ref()))
        return s.task.metrics(out["preds"], out["loss"], batch.to(out["preds"].device))

    def patching(self) -> None:
        """Per-head activation patching (and path patching from the sender) between the input and its corruption, on
        the full model. A corruption that no longer fits a new input leaves a note in the patching panel."""
        s = self.s
        self.patch = self.path = None
        self.patch_error = ""
        if s.corruption is None:
            return
        try:
            s.recorrupt()
            clean, corrupted = s.clean, s.corrupted
            self.patch = activation_patching(
                s.model, clean, corrupted=corrupted, metric="logit_diff", where="z", per="head"
            )
            if s.sender is not None:
                self.path = path_patching(s.model, clean, corrupted=corrupted, metric="logit_diff", senders=[s.sender])
        except InterpError as e:
            self.patch = self.path = None
            self.patch_error = one_line(e)

    def circuit(self) -> None:
        """The circuit view of the current input pair (once it was asked for): every edge's EAP score, then the run
        with the edges off. Without a corruption (or one that does not fit) the view holds a one-line note."""
        s = self.s
        self.cview = None
        self.circuit_error = ""
        if not s.circuit_on:
            self.circuit_edges()
            return
        if s.corruption is None or s.corrupted is None or self.patch is None:
            self.circuit_error = self.patch_error or (
                "the circuit view scores edges between the input and its corruption: choose a corrupted input"
            )
        else:
            try:
                self.cview = CircuitSession(s.model, s.clean, s.corrupted)
            except InterpError as e:
                self.circuit_error = one_line(e)
        self.circuit_edges()

    def circuit_edges(self) -> None:
        """The run with the edges off (the scores of the pair stay): the prediction, the logit difference and the
        faithfulness of what is left."""
        s = self.s
        if self.cview is None:
            self.circuit_result = self.circuit_logits = None
            self.circuit_data = {}
            return
        c, logits = self.cview.circuit(s.edges_off)
        self.circuit_result, self.circuit_logits = c, logits
        self.circuit_data = circuit_page(self.cview, c, logits, s.edges_off, list(s.task.vocab.tokens))

    def circuit_view(self) -> dict:
        """The circuit panel: whether it is open, the edges off, its one-line note, and what
        :func:`.circuit.circuit_page` gives."""
        s = self.s
        return {"on": s.circuit_on, "error": self.circuit_error, "edges_off": s.edges_off_names(), **self.circuit_data}

    def head_panel(self) -> None:
        """The open head's panel: its learned accuracy alone and with it toggled, its direct logit contribution, its
        pattern scores, separation accuracy and Shapley value (those two once computed on request) and its
        circuits."""
        s = self.s
        head = s.head
        if head is None:
            self.head_view = {}
            return
        layer, h = head
        i = layer * s.n_heads + h
        b = s.batch()
        singles = self.single_head_accuracies()
        scores = self.head_scores()
        sep, shap = b["separation"], b["shapley"].get(s.ablation)
        names = s.task.vocab.tokens
        self.head_view = {
            "head": head_label(*head),
            "layer": layer,
            "index": h,
            "off": head in s.ablated,
            "learned_alone": float(singles.accuracy[i]),
            "toggled_accuracy": float(self.acc.accuracy[1]) if len(self.acc.accuracy) > 1 else None,
            "dla": float(self.fwd["dla"][layer, h]),
            "dla_diff": float(self.fwd["dla_diff"][layer, h]),
            "dla_all": [[round(float(v), 5) for v in row] for row in self.fwd["dla_diff"]],
            "dla_tokens": [names[self.fwd["label"]], names[self.fwd["runner_up"]]],
            "scores": None if scores is None else score_numbers(scores, head),
            "scores_on": self.scores_note,
            "separation": None if sep is None else separation_numbers(sep, i, b["batch"].labels),
            "shapley": None if shap is None else shapley_numbers(shap, head, i),
            "circuits": self.circuit_views(head),
            "n": b["key"][1],
            "split": s.split,
        }

    def head_scores(self) -> HeadScores | None:
        """Every head's induction / previous-token / duplicate / BOS scores, computed once (None where the context is
        too short for a repeat); :attr:`scores_note` says what they were measured on."""
        s = self.s
        if self.scores is None and self.scores_note is None:
            tokens, self.scores_note = score_probes(s.suite, s.task, s.model.cfg.n_ctx)
            if tokens is None:
                return None
            self.scores = head_scores(s.model, tokens.to(s.device), n_boot=200)
        return self.scores

    def circuit_views(self, head: Head) -> list[dict]:
        """The head's circuits as the page gets them, computed once per head."""
        if head not in self.circuits:
            circuits = head_circuits(self.s.model, head, self.s.task.vocab)
            self.circuits[head] = [
                c if isinstance(c, dict) else circuit_view(c, direct_only=head[0] > 0) for c in circuits
            ]
        return self.circuits[head]

    def compute(self, what: str) -> None:
        """The costlier numbers, on request: separation accuracy and Shapley values of every head (cached per batch
        and ablation), or the task's own metrics under the mask."""
        s = self.s
        b = s.batch()
        if what == "separation":
            if b["separation"] is None:
                b["separation"] = separation_accuracy(s.model, b["cache"], train=self.separation_train(), task=s.task)
        elif what == "shapley":
            if s.ablation not in b["shapley"]:
                b["shapley"][s.ablation] = shapley_values(s.model, b["batch"], b["cache"], s.ablation, s.fast())
        elif what == "metrics":
            self.metrics = self.task_metrics()
        elif what == "circuit":
            s.circuit_on = True
            self.circuit()
        else:
            raise InterpError(f"unknown computation {what!r}; expected separation, shapley, metrics or circuit")
        if s.head is not None:
            self.head_panel()

    def separation_train(self) -> TaskData:
        """The examples the separators are fitted on: the first ``SEPARATION_TRAIN`` of the train split (of the
        first split where the task has no train split)."""
        s = self.s
        train = s.dataset("train") if "train" in s.task.splits else s.dataset(s.task.splits[0])
        return train.select(slice(0, min(SEPARATION_TRAIN, len(train)))).to(s.device)

    # -- what the page gets ----------------------------------------------------------------------------------------

    def info(self, name: str) -> dict:
        """What the page needs once: the model's shape, the task's splits and corruptions, the heads."""
        s = self.s
        cfg, task = s.model.cfg, s.task
        return {
            "name": name,
            "task": task.name,
            "n_layers": cfg.n_layers,
            "n_heads": cfg.n_heads,
            "d_model": cfg.d_model,
            "d_head": cfg.d_head,
            "attn_only": bool(cfg.attn_only),
            "normalization": cfg.normalization_type,
            "n_ctx": cfg.n_ctx,
            "d_vocab": cfg.d_vocab,
            "splits": list(task.splits),
            "corruptions": list(s.corruption_kinds()),
            "typed": True,  # every task's suite reads typed input (the generic suite: the answer is the last token)
            "heads": [head_label(*h) for h in s.all_heads()],
            "fast": s.fast(),
            "shapley_exact": cfg.n_layers * cfg.n_heads <= SHAPLEY_EXACT_MAX,
            "shapley_cost": shapley_cost(s.n_layers * s.n_heads, s.fast()),
        }

    def controls(self) -> dict:
        """The controls' values, as the page shows them."""
        s = self.s
        return {
            "split": s.split,
            "index": s.index,
            "source": s.source,
            "typed": s.typed,
            "ablated": s.ablated_names(),
            "ablation": s.ablation,
            "batch_size": s.batch_size,
            "head": None if s.head is None else head_label(*s.head),
            "corruption": s.corruption,
            "corrupt_text": s.corrupt_text,
            "sender": None if s.sender is None else head_label(*s.sender),
        }

    def input_view(self) -> dict:
        """The input panel: the tokens, the answer position and label, the positions with a target, and where the
        input came from."""
        s = self.s
        targets = s.clean.targets[0].tolist()
        return {
            "tokens": s.task.vocab.decode(s.clean.tokens[0]),
            "answer_pos": int(s.clean.answer_pos[0]),
            "label": s.task.vocab.tokens[int(s.clean.labels[0])],
            "targets": [int(i) for i, t in enumerate(targets) if t >= 0],
            "source": s.source,
            "split": s.split,
            "index": s.index,
            "size": len(s.dataset(s.split)),
            "typed": s.typed,
            "pair": s.corruption if s.source == "pair" else None,
        }

    def prediction_view(self) -> dict:
        """The prediction panel: at most ``MAX_ROWS`` rows of the prediction."""
        pred: Prediction = self.fwd["prediction"]
        return {"rows": pred.rows()[:MAX_ROWS], "n_rows": len(pred.positions), "answer_pos": pred.answer_pos}

    def patterns_view(self) -> dict:
        """Patterns quantised to uint16 (weight x 65535) for the page, cut to the last ``max_positions`` positions
        and to a total of ``CELL_BUDGET`` entries."""
        p = self.fwd["patterns"]
        L, H, T, _ = p.shape
        w = pattern_window(L, H, T, self.max_positions)
        return {"n_layers": L, "n_heads": H, "T": T, "window": w, "offset": T - w, "data": quantised_patterns(p, w)}

    def accuracy_view(self) -> dict:
        """The accuracy panel: the learned accuracy under the mask and with all heads on (also as counts of the
        batch), the heads ablated and how, and the task's metrics once computed."""
        s = self.s
        n = s.batch()["key"][1]
        acc, full = float(self.acc.accuracy[0]), self.full_accuracy()
        return {
            "accuracy": acc,
            "correct": round(acc * n),
            "n": n,
            "split": s.split,
            "full": full,
            "full_correct": round(full * n),
            "ablated": s.ablated_names(),
            "ablation": s.ablation,
            "metrics": None if self.metrics is None else {k: finite_or_none(v) for k, v in self.metrics.items()},
        }

    def patch_view(self) -> dict:
        """The patching panel: the corrupted input and where it differs, and every head's effect (raw and normalized,
        1 = clean); the path patching from the sender; or the note of a corruption that does not fit."""
        s = self.s
        if s.corruption is None or self.patch is None:
            return {"kind": s.corruption, "error": self.patch_error}
        p, names = self.patch, s.task.vocab.tokens
        corr = s.corrupted
        view = {
            "kind": s.corruption,
            "tokens": s.task.vocab.decode(corr.tokens[0]),
            "diff": [int(i) for i in (corr.tokens[0] != s.clean.tokens[0]).nonzero().flatten().tolist()],
            "clean_label": names[int(s.clean.labels[0])],
            "corrupted_label": names[int(corr.labels[0])],
            "clean": finite_or_none(p.clean),
            "corrupted": finite_or_none(p.corrupted),
            "values": [[finite_or_none(v) for v in row] for row in p.values.tolist()],
            "normalized": [[finite_or_none(v) for v in row] for row in p.normalized.tolist()],
            "resampled": s.resampled if s.corruption == "resample" else None,
            "error": "",
            "sender": None if s.sender is None else head_label(*s.sender),
            "path": None,
        }
        if self.path is not None:
            view["path"] = {
                "rows": self.path.rows(),
                "clean": finite_or_none(self.path.clean),
                "corrupted": finite_or_none(self.path.corrupted),
            }
        return view

    def head_panel_numbers(self) -> dict:
        """The open head's numbers (as the panel shows them, its circuits left out), or ``{}``."""
        return {k: v for k, v in self.head_view.items() if k not in ("circuits",)}

    def state_dict(self, name: str) -> dict:
        """The whole view as plain JSON types."""
        s = self.s
        acc = self.accuracy_view()
        return {
            "model": name,
            "task": s.task.name,
            "task_params": s.task.params(),
            "input": {
                "source": s.source,
                "split": s.split,
                "index": s.index if s.source != "typed" else None,
                "typed": s.typed if s.source == "typed" else None,
                "tokens": s.task.vocab.decode(s.clean.tokens[0]),
                "answer_pos": int(s.clean.answer_pos[0]),
            },
            "ablated": s.ablated_names(),
            "ablation": s.ablation,
            "batch_size": s.batch_size,
            "prediction": self.fwd["prediction"].to_dict(),
            "accuracy": {k: acc[k] for k in ("accuracy", "correct", "n", "split", "full")},
            "head": self.head_panel_numbers() or None,
            "patching": None
            if self.patch is None
            else {
                "corruption": s.corruption,
                "corrupted": s.task.vocab.decode(s.corrupted.tokens[0]),
                **self.patch.to_dict(),
            },
            "path_patching": None if self.path is None else self.path.to_dict(),
            "circuit": None
            if self.circuit_result is None
            else {
                "edges_off": s.edges_off_names(),
                "logit_diff": finite_or_none(self.circuit_result.circuit),
                "faithfulness": finite_or_none(self.circuit_result.faithfulness),
                "full": finite_or_none(self.circuit_result.full),
                "empty": finite_or_none(self.circuit_result.empty),
            },
        }
