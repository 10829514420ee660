"""The explorer widget: an ``anywidget`` whose state (input, heads off, ablation, accuracy batch, open head panel,
corruption) is set from the page or from Python, recomputes what depends on a change, and sends the page the
views it draws; and :func:`explore`, which builds it from a checkpoint or a model and its task."""

from __future__ import annotations

import json
import random
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import anywidget
import torch
import traitlets
from jaxtyping import Float
from torch import Tensor

from interp.analyses.answer_cache import cache_answer
from interp.analyses.learned_accuracies import LearnedAccuracy, learned_accuracy, mean_head_outputs
from interp.analyses.noisy_majority.corrupt import flip_answer
from interp.analyses.patching import ActivationPatching, PathPatching, activation_patching, path_patching
from interp.analyses.pattern_scores import HeadScores, head_scores
from interp.analyses.repeated_tokens.corrupt import corrupted_pair
from interp.analyses.separation_accuracies import separation_accuracy
from interp.checkpoint import Checkpoint
from interp.device import model_device
from interp.errors import HeadError, InterpError, TaskError
from interp.evaluation import predictions_and_loss
from interp.heads import Head, all_heads, head_label, parse_head
from interp.query_forward import supports_query_forward
from interp.tasks import get_task, load_checkpoint

from .compute import (
    MAX_POSITIONS,
    SHAPLEY_EXACT_MAX,
    TOP_K,
    answer_prediction,
    circuit_view,
    direct_logit_attribution,
    finite_or_none,
    head_circuits,
    keep_mask,
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
from .inputs import PAIR_KINDS, TYPED, check_lined_up, corruption_kinds, resample, typed_example
from .results import MAX_ROWS, ExplorerState, Prediction
from .snapshot import snapshot_html

if TYPE_CHECKING:
    from IPython.display import HTML
    from transformer_lens import HookedTransformer

    from interp.task import Task, TaskData

HERE = Path(__file__).parent  # explorer.js and explorer.css, the page side, ship beside this module
DEFAULT_BATCH = 256  # examples of the accuracy batch (the first ones of the current split)
ABLATIONS = ("zero", "mean")
SEPARATION_TRAIN = 2000  # train examples the separators are fitted on
MAX_ERROR = 300  # characters of the widget's error line at most


def one_line(e: BaseException) -> str:
    """The first line of an error's message, at most ``MAX_ERROR`` characters: what the widget's error line shows."""
    text = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
    return text if len(text) <= MAX_ERROR else text[: MAX_ERROR - 3] + "..."


def whole_number(value: object, what: str) -> int:
    """``value`` from the page as an int, or an InterpError naming ``what`` it was meant to be."""
    try:
        return int(value)
    except (TypeError, ValueError):
        raise InterpError(f"the {what} must be a whole number, got {value!r}") from None


class Explorer(anywidget.AnyWidget):
    """The interactive explorer (see :mod:`interp.app.explorer`). Build it with :func:`explore`."""

    _esm = HERE / "explorer.js"
    _css = HERE / "explorer.css"

    info = traitlets.Dict().tag(sync=True)
    controls = traitlets.Dict().tag(sync=True)
    input_view = traitlets.Dict().tag(sync=True)
    prediction_view = traitlets.Dict().tag(sync=True)
    accuracy_view = traitlets.Dict().tag(sync=True)
    patterns_view = traitlets.Dict().tag(sync=True)
    head_view = traitlets.Dict().tag(sync=True)
    patch_view = traitlets.Dict().tag(sync=True)
    export_view = traitlets.Dict().tag(sync=True)
    status = traitlets.Dict().tag(sync=True)

    def __init__(
        self,
        model: HookedTransformer,
        task: Task,
        *,
        name: str | None = None,
        checkpoint: str | None = None,
        split: str | None = None,
        index: int = 0,
        batch_size: int = DEFAULT_BATCH,
        ablation: str = "zero",
        max_positions: int = MAX_POSITIONS,
        seed: int = 0,
    ):
        super().__init__()
        self.model, self.task = model, task  # that they fit each other is checked by the first analysis (cache_answer)
        self._checkpoint = checkpoint  # how to load it again (a shipped name or a path), for the snippet
        self._name = name or checkpoint or f"a {task.name} model"
        cfg = model.cfg
        self._L, self._H = cfg.n_layers, cfg.n_heads
        self._device = model_device(model)
        if not isinstance(max_positions, int) or max_positions < 2:
            raise InterpError(f"max_positions must be an integer >= 2, got {max_positions!r}")
        self._max_positions = max_positions
        self._rng = random.Random(seed)
        self._datasets: dict[str, TaskData] = {}  # split -> its data, generated on first use
        self._batches: dict[tuple[str, int], dict] = {}  # (split, size) -> the accuracy batch and what is cached on it
        self._circuits: dict[Head, list[dict]] = {}  # head -> its circuits as the page gets them
        self._scores: HeadScores | None = None  # every head's pattern scores, computed once
        self._scores_note: str | None = None  # what the scores were measured on (set once they were asked for)
        self._off: set[Head] = set()
        self._head: Head | None = None
        self._corruption: str | None = None
        self._corrupt_text = ""
        self._corrupted: TaskData | None = None
        self._sender: Head | None = None
        self._patch: ActivationPatching | None = None
        self._path: PathPatching | None = None
        self._patch_error = ""
        self._resampled: int | None = None
        self._metrics: dict[str, float] | None = None
        self._fwd: dict[str, Any] = {}
        self._acc: LearnedAccuracy | None = None
        self._sent_patterns: Tensor | None = None
        self._seq = 0
        self.timings: dict[str, float] = {}
        self.last_traceback: str | None = None
        self._split = split if split is not None else ("test" if "test" in task.splits else task.splits[-1])
        self._check_split(self._split)
        self._index, self._source, self._typed = 0, "example", ""
        self._ablation = self._check_ablation(ablation)
        self._batch_size = self._check_batch_size(batch_size)
        self.info = self._info()
        self.on_msg(self._on_msg)
        self._index = self._check_index(self._split, index)
        self._clean = self._example(self._split, self._index)
        self._refresh(input=True, batch=True)

    # -- public state ------------------------------------------------------------------------------------------

    @property
    def example(self) -> tuple[str, int] | None:
        """``(split, index)`` of the input shown, or None when it was typed (or drawn by a corruption helper)."""
        return (self._split, self._index) if self._source == "example" else None

    @example.setter
    def example(self, value):
        if not (isinstance(value, (tuple, list)) and len(value) == 2):
            raise InterpError(f"example must be (split, index), e.g. ('test', 3); got {value!r}")
        split, index = value
        self._check_split(split)
        index = self._check_index(split, index)
        batch = split != self._split
        self._split, self._index, self._source = split, index, "example"
        if self._is_pair(self._corruption):
            self._source = "pair"
            self._clean, self._corrupted = self._pair(self._corruption)
        else:
            self._clean = self._example(split, index)
        self._refresh(input=True, batch=batch)

    @property
    def tokens(self) -> list[str]:
        """The input's tokens (strings). Set it to typed tokens: ``w.tokens = "0 1 1 2"`` or a list of strings."""
        return self.task.vocab.decode(self._clean.tokens[0])

    @tokens.setter
    def tokens(self, value):
        data = typed_example(self.task, value, self.model.cfg.n_ctx)
        self._typed = value if isinstance(value, str) else " ".join(str(v) for v in value)
        self._clean, self._source = data.to(self._device), "typed"
        if self._is_pair(self._corruption):
            self._corruption = self._corrupted = None
        self._refresh(input=True)

    @property
    def mask(self) -> list[str]:
        """The heads switched off (names, in order). Set a list of heads (``['L0H1', 'L0H7']``, pairs also work)."""
        return [head_label(*h) for h in sorted(self._off)]

    @mask.setter
    def mask(self, value):
        self._off = self._parse_heads(value)
        self._refresh(mask=True)

    @property
    def ablation(self) -> str:
        """``"zero"`` or ``"mean"``: what a head switched off outputs (0, or its mean output at the answer positions
        of the accuracy batch)."""
        return self._ablation

    @ablation.setter
    def ablation(self, value):
        self._ablation = self._check_ablation(value)
        self._refresh(mask=True)

    @property
    def batch_size(self) -> int:
        """How many examples (the first of the current split) the accuracy is measured on."""
        return self._batch_size

    @batch_size.setter
    def batch_size(self, value):
        self._batch_size = self._check_batch_size(value)
        self._refresh(batch=True)

    @property
    def head(self) -> str | None:
        """The head whose panel is open (``'L0H3'``), or None."""
        return None if self._head is None else head_label(*self._head)

    @head.setter
    def head(self, value):
        self._head = None if value is None else self._parse_head(value)
        self._refresh(head=True)

    @property
    def corruption(self) -> str | None:
        """The corrupted input of the patching: one of :func:`corruption_kinds` (``"typed"`` via
        :attr:`corrupted_tokens`), or None for no patching."""
        return self._corruption

    @corruption.setter
    def corruption(self, value):
        self._set_corruption(value, self._corrupt_text)

    @property
    def corrupted_tokens(self) -> list[str] | None:
        """The corrupted input's tokens; set typed tokens to patch against them (``corruption`` becomes ``"typed"``)."""
        return None if self._corrupted is None else self.task.vocab.decode(self._corrupted.tokens[0])

    @corrupted_tokens.setter
    def corrupted_tokens(self, value):
        self._set_corruption("typed", value if isinstance(value, str) else " ".join(str(v) for v in value))

    @property
    def sender(self) -> str | None:
        """The sender head of the path patching (``'L0H1'``), or None."""
        return None if self._sender is None else head_label(*self._sender)

    @sender.setter
    def sender(self, value):
        self._sender = None if value is None else self._parse_sender(value)
        self._refresh(patch=True)

    # -- public numbers ----------------------------------------------------------------------------------------

    @property
    def prediction(self) -> Prediction:
        """Top tokens and probabilities at the answer positions under the current mask."""
        return self._fwd["prediction"]

    @property
    def accuracy(self) -> float:
        """Learned accuracy under the mask (heads off ablated) on the first ``batch_size`` examples of the current
        split: ``interp.analyses.learned_accuracy(model, batch, heads=[kept heads], ablation=...)``."""
        return float(self._acc.accuracy[0])

    @property
    def full_accuracy(self) -> float:
        """The same with every head on."""
        return self._batch()["full"][self._ablation]

    @property
    def learned_accuracy(self) -> LearnedAccuracy:
        """The :class:`analyses.LearnedAccuracy` behind :attr:`accuracy` (subsets: the kept heads, and the mask with
        the open head toggled when a panel is open)."""
        return self._acc

    @property
    def patterns(self) -> Float[Tensor, "layer head query key"]:
        """Every head's attention pattern on the input under the current mask (all positions, exact)."""
        return self._fwd["patterns"]

    @property
    def logits(self) -> Float[Tensor, "pos vocab_out"]:
        """The logits at every position of the input under the current mask."""
        return self._fwd["logits"]

    @property
    def patching(self) -> ActivationPatching | None:
        """The :class:`analyses.ActivationPatching` of every head's output (clean into corrupted, logit difference),
        or None without a corruption."""
        return self._patch

    @property
    def path_patching(self) -> PathPatching | None:
        """The :class:`analyses.PathPatching` from :attr:`sender`, or None."""
        return self._path

    @property
    def head_panel(self) -> dict:
        """The open head's numbers (as the panel shows them), or ``{}``."""
        return {k: v for k, v in self.head_view.items() if k not in ("circuits",)}

    @property
    def metrics(self) -> dict[str, float]:
        """The task's own metrics (``task.metrics``: e.g. exact match of integer addition, accuracy on every repeat
        position of repeated tokens) under the mask, on the accuracy batch; one hooked forward pass."""
        batch = self._batch()["batch"]
        out = predictions_and_loss(self.model, batch, fwd_hooks=mask_hooks(self.model, self._keep(), self._z_ref()))
        return self.task.metrics(out["preds"], out["loss"], batch.to(out["preds"].device))

    def compute(self, what: str) -> None:
        """Compute, for every head, what the panel shows only on request: ``"separation"`` (separation accuracy, the
        separators fitted on the first train examples and scored on the accuracy batch), ``"shapley"`` (Shapley values
        of the learned accuracy on the batch: exact up to 16 heads, else sampled) or ``"metrics"`` (the task's own
        metrics under the mask)."""
        self._compute(what)

    def state(self) -> ExplorerState:
        """The current view as an :class:`interp.Result` (``to_dict()``: plain JSON)."""
        return ExplorerState(self._state_dict())

    def snippet(self) -> str:
        """Python that reproduces the numbers of the current view with the toolkit's own calls."""
        return self._snippet()

    def snapshot_html(self) -> str:
        """A static HTML picture of the current view (what a saved notebook shows where no kernel runs)."""
        return self._snapshot_html()

    def snapshot(self) -> HTML:
        """The static snapshot as an IPython HTML object: display it to keep a record of this state in the notebook."""
        from IPython.display import HTML

        return HTML(self._snapshot_html())

    def _repr_mimebundle_(self, **kwargs):
        """The widget's display bundle, with the static snapshot as its ``text/html`` for viewers without a
        kernel."""
        bundle = super()._repr_mimebundle_(**kwargs)
        if bundle is None:
            return None
        data, metadata = bundle
        try:
            data["text/html"] = self._snapshot_html()
        except Exception:
            self.last_traceback = traceback.format_exc()
        return data, metadata

    # -- validation ----------------------------------------------------------------------------------------------

    def _parse_head(self, spec: object) -> Head:
        """A head of this model from a name (``'L0H3'``) or a pair; a HeadError otherwise."""
        return parse_head(spec, self._L, self._H)

    def _parse_heads(self, specs: object) -> set[Head]:
        """A set of heads from a list of names or pairs (one name or pair alone also works)."""
        if isinstance(specs, str) or (
            isinstance(specs, tuple) and len(specs) == 2 and all(isinstance(x, int) for x in specs)
        ):
            specs = [specs]
        try:
            specs = list(specs)
        except TypeError:
            raise HeadError(f"mask must be a list of heads (e.g. ['L0H1', 'L0H7']), got {specs!r}") from None
        return {self._parse_head(s) for s in specs}

    def _parse_sender(self, spec: object) -> Head:
        """A head whose output a later layer receives (path patching needs a receiver)."""
        h = self._parse_head(spec)
        if self._L < 2:
            raise HeadError(
                "path patching needs a later layer to receive the sender's output; this model has one layer"
            )
        if h[0] >= self._L - 1:
            raise HeadError(f"the sender {head_label(*h)} is in the last layer; pick a head of layers 0..{self._L - 2}")
        return h

    def _check_split(self, split: object) -> None:
        """A TaskError unless ``split`` is one of the task's splits."""
        if split not in self.task.splits:
            raise TaskError(f"unknown split {split!r}; task {self.task.name} has {', '.join(self.task.splits)}")

    def _check_index(self, split: str, index: object) -> int:
        """``index`` if it is an example of ``split``."""
        n = len(self._dataset(split))
        if isinstance(index, bool) or not isinstance(index, int) or not 0 <= index < n:
            raise InterpError(f"index {index!r} is out of range: split {split!r} has examples 0..{n - 1}")
        return index

    def _check_ablation(self, value: object) -> str:
        """``value`` if it is one of ``ABLATIONS``."""
        if value not in ABLATIONS:
            raise InterpError(f"unknown ablation {value!r}; expected one of {ABLATIONS}")
        return value

    def _check_batch_size(self, value: object) -> int:
        """A positive batch size, cut to the current split's size."""
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise InterpError(f"batch_size must be a positive integer, got {value!r}")
        return min(value, len(self._dataset(self._split)))

    def _is_pair(self, kind: str | None) -> bool:
        """Whether ``kind`` is a corruption whose helper draws the clean input too (repeated tokens' pairs)."""
        return kind in PAIR_KINDS.get(self.task.name, ())

    # -- data ----------------------------------------------------------------------------------------------------

    def _dataset(self, split: str) -> TaskData:
        """The whole split, generated by the task on first use and kept."""
        if split not in self._datasets:
            self._datasets[split] = self.task.dataset(split)
        return self._datasets[split]

    def _example(self, split: str, index: int) -> TaskData:
        """One example of a split, on the model's device."""
        return self._dataset(split).select([index]).to(self._device)

    def _pair(self, kind: str) -> tuple[TaskData, TaskData]:
        """A (clean, corrupted) pair from the task's own helper, drawn with ``seed = index``."""
        clean, corrupted = corrupted_pair(self.task, n_seqs=1, kind=kind, seed=self._index)
        return clean.to(self._device), corrupted.to(self._device)

    def _fast(self) -> bool:
        """Whether the toolkit's fast path applies (one-layer attention-only models: cached head outputs)."""
        return supports_query_forward(self.model)

    def _batch(self) -> dict:
        """The accuracy batch of the current split, its answer cache (the mean-ablation reference, and the input of
        the fast path) and its mean head outputs, computed once per (split, size); what is computed on it later
        (accuracies of single heads and of all heads, separation accuracy, Shapley values) is kept there too."""
        key = (self._split, min(self._batch_size, len(self._dataset(self._split))))
        if key not in self._batches:
            batch = self._dataset(self._split).select(slice(0, key[1])).to(self._device)
            cache = cache_answer(self.model, batch, attention=False, task=self.task)
            self._batches[key] = {
                "key": key,
                "batch": batch,
                "cache": cache,
                "z_ref": mean_head_outputs(self.model, cache),
                "singles": {},
                "full": {},
                "separation": None,
                "shapley": {},
            }
        return self._batches[key]

    def _keep(self) -> Float[Tensor, "layer head"]:
        """The current mask: 0 for the heads switched off, 1 elsewhere."""
        return keep_mask(self.model, self._off)

    def _z_ref(self) -> Float[Tensor, "layer head d_head"] | None:
        """The mean-ablation reference (the batch's mean head outputs), or None under zero ablation."""
        return self._batch()["z_ref"] if self._ablation == "mean" else None

    def _all_heads(self) -> list[Head]:
        """Every head, layer by layer."""
        return all_heads(self._L, self._H)

    def _kept(self, off: set[Head] | None = None) -> list[Head]:
        """The heads not in ``off`` (default: the heads switched off)."""
        off = self._off if off is None else off
        return [h for h in self._all_heads() if h not in off]

    # -- recomputation -----------------------------------------------------------------------------------------------

    def _refresh(
        self, *, input: bool = False, mask: bool = False, batch: bool = False, head: bool = False, patch: bool = False
    ) -> None:
        """Recompute what depends on what changed and push it to the page; times each part (:attr:`timings`)."""
        t: dict[str, float] = {}
        start = time.perf_counter()

        def timed(name: str, fn: Callable[[], object]) -> None:
            t0 = time.perf_counter()
            fn()
            t[name] = (time.perf_counter() - t0) * 1000

        if batch:
            timed("batch", self._batch)
        if input or mask or batch:
            timed("forward", self._forward)
        if mask or batch or (head and self._head is not None):
            timed("accuracy", self._accuracy)
        if input or patch:
            timed("patching", self._patching)
        if self._head is not None and (head or mask or batch or input):
            timed("head", self._head_panel)
        elif head:
            self.head_view = {}
        with self.hold_sync():
            self._push()
            t["total"] = (time.perf_counter() - start) * 1000
            self.timings = t
            self._status()

    def _status(self, error: str = "") -> None:
        """Send the page the error line (empty: none), the last timings and the controls' values."""
        self._seq += 1
        self.status = {"seq": self._seq, "error": error, "ms": {k: round(v, 2) for k, v in self.timings.items()}}
        self.controls = {
            "split": self._split,
            "index": self._index,
            "source": self._source,
            "typed": self._typed,
            "mask": self.mask,
            "ablation": self._ablation,
            "batch_size": self._batch_size,
            "head": self.head,
            "corruption": self._corruption,
            "corrupt_text": self._corrupt_text,
            "sender": self.sender,
        }

    def _forward(self) -> None:
        """The input's forward pass under the mask: the prediction, the patterns, the logits, and each head's direct
        contribution to the answer and to the answer against the runner-up among the task's answers."""
        clean = self._clean
        out = masked_forward(self.model, clean.tokens, self._keep(), self._z_ref())
        logits = out["logits"][0]
        pred = answer_prediction(logits, clean.targets[0], int(clean.answer_pos[0]), list(self.task.vocab.tokens))
        ap, label = pred.answer_pos, int(clean.labels[0])
        classes = torch.unique(torch.cat([self._batch()["batch"].labels, clean.labels]))
        bad = runner_up(logits[ap], classes, label)
        scale = None if out["scale"] is None else out["scale"][0]
        dla_good, dla_diff = direct_logit_attribution(self.model, out["z"][0], scale, ap, label, bad)
        self._fwd = {
            "prediction": pred,
            "patterns": out["patterns"][0].cpu(),
            "logits": logits.cpu(),
            "dla": dla_good.cpu(),
            "dla_diff": dla_diff.cpu(),
            "label": label,
            "runner_up": bad,
        }

    def _accuracy_options(self) -> dict[str, Any]:
        """The keyword arguments of every learned accuracy on the batch's answer cache (the fast path's input; the
        hook path runs the batch it was built from): the ablation, its reference (the cache) and the task."""
        b = self._batch()
        return {"ablation": self._ablation, "reference": b["cache"], "task": self.task}

    def _accuracy(self) -> None:
        """Learned accuracy of the kept heads (and, with a panel open, of the mask with that head toggled) in one
        batched call; the all-heads accuracy once per batch and ablation."""
        b = self._batch()
        kw = self._accuracy_options()
        if self._ablation not in b["full"]:
            b["full"][self._ablation] = float(
                learned_accuracy(self.model, b["cache"], heads=[self._all_heads()], **kw).accuracy[0]
            )
        subsets = [self._kept()]
        if self._head is not None:
            subsets.append(self._kept(self._off ^ {self._head}))
        self._metrics = None
        self._acc = learned_accuracy(self.model, b["cache"], heads=subsets, **kw)

    def _single_head_accuracies(self) -> LearnedAccuracy:
        """Every head's learned accuracy alone, once per batch and ablation."""
        b = self._batch()
        if self._ablation not in b["singles"]:
            b["singles"][self._ablation] = learned_accuracy(
                self.model, b["cache"], heads=[[h] for h in self._all_heads()], **self._accuracy_options()
            )
        return b["singles"][self._ablation]

    def _patching(self) -> None:
        """Per-head activation patching (and path patching from the sender) between the input and its corruption, on
        the full model. A corruption that no longer fits a new input leaves a note in the patching panel."""
        self._patch = self._path = None
        self._patch_error = ""
        if self._corruption is None:
            return
        try:
            if not self._is_pair(self._corruption):
                self._corrupted = self._corrupt(self._corruption, self._corrupt_text, self._clean)
            clean, corrupted = self._clean, self._corrupted
            self._patch = activation_patching(
                self.model, clean, corrupted=corrupted, metric="logit_diff", where="z", per="head"
            )
            if self._sender is not None:
                self._path = path_patching(
                    self.model, clean, corrupted=corrupted, metric="logit_diff", senders=[self._sender]
                )
        except InterpError as e:
            self._patch = self._path = None
            self._patch_error = one_line(e)

    def _corrupt(self, kind: str, text: str, clean: TaskData) -> TaskData:
        """The corrupted input of ``kind`` for ``clean`` (the task's helper, a resampled example or typed tokens),
        checked to line up with it."""
        if kind == "flip":
            corrupted = flip_answer(clean, seed=0)
        elif kind == "resample":
            data = self._dataset(self._split)
            self._resampled = resample(data, clean, self._index + 1 if self._source == "example" else 0)
            corrupted = data.select([self._resampled])
        elif kind == "typed":
            corrupted = typed_example(self.task, text, self.model.cfg.n_ctx)
        else:
            raise InterpError(f"unknown corruption {kind!r}; expected one of {corruption_kinds(self.task)}")
        corrupted = corrupted.to(self._device)
        check_lined_up(clean, corrupted)
        return corrupted

    def _set_corruption(self, kind: object, text: str) -> None:
        """Choose the corrupted input (None, ``""`` or ``"none"``: no patching); a bad choice raises before anything
        changes. A helper's pair replaces the input; leaving a pair goes back to the example of the split."""
        kinds = corruption_kinds(self.task)
        leave_pair = self._source == "pair"
        if kind in (None, "", "none"):
            self._corruption = self._corrupted = None
            if leave_pair:
                self._source, self._clean = "example", self._example(self._split, self._index)
            self._refresh(input=leave_pair, patch=True)
            return
        if kind not in kinds:
            raise InterpError(f"unknown corruption {kind!r}; for task {self.task.name} expected one of {kinds}")
        if self._is_pair(kind):
            self._clean, self._corrupted = self._pair(kind)
            self._corruption, self._source = kind, "pair"
            self._refresh(input=True, patch=True)
            return
        clean = self._example(self._split, self._index) if leave_pair else self._clean
        if leave_pair:
            self._source = "example"  # (a resampled corruption then starts after the example)
        text = text if kind == "typed" else self._corrupt_text
        try:
            corrupted = self._corrupt(kind, text, clean)
        finally:
            if leave_pair:
                self._source = "pair"
        self._clean, self._corrupted, self._corruption, self._corrupt_text = clean, corrupted, kind, text
        if leave_pair:
            self._source = "example"
        self._refresh(input=leave_pair, patch=True)

    def _head_panel(self) -> None:
        """The open head's panel: its learned accuracy alone and with it toggled, its direct logit contribution, its
        pattern scores, separation accuracy and Shapley value (those two once computed on request) and its
        circuits."""
        head = self._head
        layer, h = head
        i = layer * self._H + h
        b = self._batch()
        singles = self._single_head_accuracies()
        scores = self._head_scores()
        sep, shap = b["separation"], b["shapley"].get(self._ablation)
        names = self.task.vocab.tokens
        self.head_view = {
            "head": head_label(*head),
            "layer": layer,
            "index": h,
            "off": head in self._off,
            "learned_alone": float(singles.accuracy[i]),
            "toggled_accuracy": float(self._acc.accuracy[1]) if len(self._acc.accuracy) > 1 else None,
            "dla": float(self._fwd["dla"][layer, h]),
            "dla_diff": float(self._fwd["dla_diff"][layer, h]),
            "dla_all": [[round(float(v), 5) for v in row] for row in self._fwd["dla_diff"]],
            "dla_tokens": [names[self._fwd["label"]], names[self._fwd["runner_up"]]],
            "scores": None if scores is None else score_numbers(scores, head),
            "scores_on": self._scores_note,
            "separation": None if sep is None else separation_numbers(sep, i, b["batch"].labels),
            "shapley": None if shap is None else shapley_numbers(shap, head, i),
            "circuits": self._circuit_views(head),
            "n": b["key"][1],
            "split": self._split,
        }

    def _head_scores(self) -> HeadScores | None:
        """Every head's induction / previous-token / duplicate / BOS scores, computed once (None where the context is
        too short for a repeat); :attr:`_scores_note` says what they were measured on."""
        if self._scores is None and self._scores_note is None:
            tokens, self._scores_note = score_probes(self.task, self.model.cfg.n_ctx)
            if tokens is None:
                return None
            self._scores = head_scores(self.model, tokens.to(self._device), n_boot=200)
        return self._scores

    def _circuit_views(self, head: Head) -> list[dict]:
        """The head's circuits as the page gets them, computed once per head."""
        if head not in self._circuits:
            circuits = head_circuits(self.model, head, self.task.vocab)
            self._circuits[head] = [circuit_view(c, direct_only=head[0] > 0) for c in circuits]
        return self._circuits[head]

    def _compute(self, what: str) -> None:
        """The costlier numbers, on request: separation accuracy and Shapley values of every head (cached per batch
        and ablation), or the task's own metrics under the mask."""
        b = self._batch()
        t0 = time.perf_counter()
        if what == "separation":
            if b["separation"] is None:
                b["separation"] = separation_accuracy(
                    self.model, b["cache"], train=self._separation_train(), task=self.task
                )
        elif what == "shapley":
            if self._ablation not in b["shapley"]:
                b["shapley"][self._ablation] = shapley_values(
                    self.model, b["batch"], b["cache"], self._ablation, self._fast()
                )
        elif what == "metrics":
            self._metrics = self.metrics
        else:
            raise InterpError(f"unknown computation {what!r}; expected separation, shapley or metrics")
        self.timings = {what: (time.perf_counter() - t0) * 1000}
        if self._head is not None:
            self._head_panel()
        with self.hold_sync():
            self._push()
            self._status()

    def _separation_train(self) -> TaskData:
        """The examples the separators are fitted on: the first ``SEPARATION_TRAIN`` of the train split (of the
        first split where the task has no train split)."""
        train = self._dataset("train") if "train" in self.task.splits else self._dataset(self.task.splits[0])
        return train.select(slice(0, min(SEPARATION_TRAIN, len(train)))).to(self._device)

    # -- what the page gets ----------------------------------------------------------------------------------------

    def _info(self) -> dict:
        """What the page needs once: the model's shape, the task's splits and corruptions, the heads."""
        cfg, task = self.model.cfg, self.task
        return {
            "name": self._name,
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
            "corruptions": list(corruption_kinds(task)),
            "typed": task.name in TYPED,
            "heads": [head_label(*h) for h in self._all_heads()],
            "fast": self._fast(),
            "shapley_exact": cfg.n_layers * cfg.n_heads <= SHAPLEY_EXACT_MAX,
            "shapley_cost": shapley_cost(self._L * self._H, self._fast()),
        }

    def _input_view(self) -> dict:
        """The input panel: the tokens, the answer position and label, the positions with a target, and where the
        input came from."""
        toks = self.tokens
        targets = self._clean.targets[0].tolist()
        return {
            "tokens": toks,
            "answer_pos": int(self._clean.answer_pos[0]),
            "label": self.task.vocab.tokens[int(self._clean.labels[0])],
            "targets": [int(i) for i, t in enumerate(targets) if t >= 0],
            "source": self._source,
            "split": self._split,
            "index": self._index,
            "size": len(self._dataset(self._split)),
            "typed": self._typed,
            "pair": self._corruption if self._source == "pair" else None,
        }

    def _prediction_view(self) -> dict:
        """The prediction panel: at most ``MAX_ROWS`` rows of the prediction."""
        pred = self._fwd["prediction"]
        return {"rows": pred.rows()[:MAX_ROWS], "n_rows": len(pred.positions), "answer_pos": pred.answer_pos}

    def _patterns_view(self) -> dict:
        """Patterns quantised to uint16 (weight x 65535) for the page, cut to the last ``max_positions`` positions
        and to a total of ``CELL_BUDGET`` entries."""
        p = self._fwd["patterns"]
        L, H, T, _ = p.shape
        w = pattern_window(L, H, T, self._max_positions)
        return {"n_layers": L, "n_heads": H, "T": T, "window": w, "offset": T - w, "data": quantised_patterns(p, w)}

    def _accuracy_view(self) -> dict:
        """The accuracy panel: the learned accuracy under the mask and with all heads on (also as counts of the
        batch), the mask and ablation, and the task's metrics once computed."""
        n = self._batch()["key"][1]
        acc, full = float(self._acc.accuracy[0]), self.full_accuracy
        return {
            "accuracy": acc,
            "correct": round(acc * n),
            "n": n,
            "split": self._split,
            "full": full,
            "full_correct": round(full * n),
            "mask": self.mask,
            "ablation": self._ablation,
            "metrics": None if self._metrics is None else {k: finite_or_none(v) for k, v in self._metrics.items()},
        }

    def _patch_view(self) -> dict:
        """The patching panel: the corrupted input and where it differs, and every head's effect (raw and normalized,
        1 = clean); the path patching from the sender; or the note of a corruption that does not fit."""
        if self._corruption is None or self._patch is None:
            return {"kind": self._corruption, "error": self._patch_error}
        p, names = self._patch, self.task.vocab.tokens
        corr = self._corrupted
        view = {
            "kind": self._corruption,
            "tokens": self.corrupted_tokens,
            "diff": [int(i) for i in (corr.tokens[0] != self._clean.tokens[0]).nonzero().flatten().tolist()],
            "clean_label": names[int(self._clean.labels[0])],
            "corrupted_label": names[int(corr.labels[0])],
            "clean": finite_or_none(p.clean),
            "corrupted": finite_or_none(p.corrupted),
            "values": [[finite_or_none(v) for v in row] for row in p.values.tolist()],
            "normalized": [[finite_or_none(v) for v in row] for row in p.normalized.tolist()],
            "resampled": self._resampled if self._corruption == "resample" else None,
            "error": "",
            "sender": self.sender,
            "path": None,
        }
        if self._path is not None:
            view["path"] = {
                "rows": self._path.rows(),
                "clean": finite_or_none(self._path.clean),
                "corrupted": finite_or_none(self._path.corrupted),
            }
        return view

    def _push(self) -> None:
        """Send the page every view (the patterns only when they changed: a new input, or a mask in a deeper
        model)."""
        if self._fwd:
            self.input_view = self._input_view()
            self.prediction_view = self._prediction_view()
            p = self._fwd["patterns"]
            sent = self._sent_patterns
            if sent is None or sent.shape != p.shape or not torch.equal(sent, p):
                self.patterns_view = self._patterns_view()
                self._sent_patterns = p
        if self._acc is not None:
            self.accuracy_view = self._accuracy_view()
        self.patch_view = self._patch_view()
        if self._head is not None and self.head_view:
            self.head_view = {**self.head_view, "off": self._head in self._off}
        self.export_view = {"snippet": self._snippet()}

    # -- events from the page ------------------------------------------------------------------------------------

    def _on_msg(self, _widget: object, content: object, _buffers: object) -> None:
        """One event from the page; a bad value shows as one line in the widget (never a traceback in the output)."""
        try:
            self._handle(content if isinstance(content, dict) else {})
        except InterpError as e:
            self._status(one_line(e))
        except Exception as e:
            self.last_traceback = traceback.format_exc()
            self._status(f"internal error ({type(e).__name__}: {one_line(e)}); the traceback is in w.last_traceback")

    def _handle(self, msg: dict) -> None:
        """Apply one event of the page (``type`` says which) through the same setters Python uses."""
        kind = msg.get("type")
        if kind == "example":
            self.example = (msg.get("split", self._split), whole_number(msg.get("index"), "index"))
        elif kind == "random":
            split = msg.get("split", self._split)
            self._check_split(split)
            self.example = (split, self._rng.randrange(len(self._dataset(split))))
        elif kind == "typed":
            self.tokens = str(msg.get("text", ""))
        elif kind == "toggle":
            h = self._parse_head(msg.get("head"))
            self.mask = sorted(self._off ^ {h})
        elif kind == "only":
            h = self._parse_head(msg.get("head"))
            self.mask = [x for x in self._all_heads() if x != h]
        elif kind == "mask":
            self.mask = msg.get("heads") or []
        elif kind == "ablation":
            self.ablation = msg.get("value")
        elif kind == "batch_size":
            self.batch_size = whole_number(msg.get("value"), "batch size")
        elif kind == "select":
            self.head = msg.get("head") or None
        elif kind == "corruption":
            self._set_corruption(msg.get("kind"), str(msg.get("text", "")))
        elif kind == "sender":
            self.sender = msg.get("head") or None
        elif kind == "compute":
            self._compute(str(msg.get("what")))
        elif kind == "export_state":
            self.export_view = {**self.export_view, "state": json.dumps(self.state().to_dict(), indent=1)}
            self._status()
        else:
            raise InterpError(f"unknown event {kind!r}")

    # -- export --------------------------------------------------------------------------------------------------

    def _state_dict(self) -> dict:
        """The view as plain JSON types (what :meth:`state` wraps)."""
        acc = self._accuracy_view()
        return {
            "model": self._name,
            "task": self.task.name,
            "task_params": self.task.params(),
            "input": {
                "source": self._source,
                "split": self._split,
                "index": self._index if self._source != "typed" else None,
                "typed": self._typed if self._source == "typed" else None,
                "tokens": self.tokens,
                "answer_pos": int(self._clean.answer_pos[0]),
            },
            "mask": self.mask,
            "ablation": self._ablation,
            "batch_size": self._batch_size,
            "prediction": self.prediction.to_dict(),
            "accuracy": {k: acc[k] for k in ("accuracy", "correct", "n", "split", "full")},
            "head": self.head_panel or None,
            "patching": None
            if self._patch is None
            else {"corruption": self._corruption, "corrupted": self.corrupted_tokens, **self._patch.to_dict()},
            "path_patching": None if self._path is None else self._path.to_dict(),
        }

    def _snippet(self) -> str:
        """The Python calls behind the current numbers: the model and data, the input, the mask and its accuracy
        and prediction, the patching and the open head's circuits."""
        lines = ["import interp, analyses", "", *self._snippet_data(), *self._snippet_input(), *self._snippet_mask()]
        if self._corruption is not None:
            lines += self._snippet_patching()
        if self._head is not None:
            lines += [
                f"qk = analyses.full_qk_circuit(model, heads={self.head!r}, vocab=task.vocab)",
                f"ov = analyses.full_ov_circuit(model, heads={self.head!r}, vocab=task.vocab)",
            ]
        return "\n".join(lines) + "\n"

    def _snippet_data(self) -> list[str]:
        """The snippet's model (loaded again from its checkpoint where there is one), task, split and batch."""
        task = self.task
        if self._checkpoint is not None:
            lines = [f"ckpt = interp.load_checkpoint({self._checkpoint!r})", "model, task = ckpt.model, ckpt.task"]
        else:
            lines = [
                "# model: the HookedTransformer you passed to interp.explore",
                f"task = interp.get_task({task.name!r}, **{task.params()!r})",
            ]
        return [
            *lines,
            f"data = task.dataset({self._split!r})",
            f"batch = data.select(slice(0, {self._batch()['key'][1]}))  # the accuracy batch",
        ]

    def _snippet_input(self) -> list[str]:
        """The snippet's input: the example of the split, the typed tokens, or the task helper's pair."""
        if self._source == "example":
            return [f"example = data.select([{self._index}])  # the input shown"]
        if self._source == "typed":
            return [
                "from interp.app.explorer import typed_example",
                f"example = typed_example(task, {self._typed!r})  # the typed input",
            ]
        return [
            "import analyses.repeated_tokens",
            (
                f"example, corrupted = analyses.repeated_tokens.corrupted_pair(task, n_seqs=1, "
                f"kind={self._corruption!r}, seed={self._index})"
            ),
        ]

    def _snippet_mask(self) -> list[str]:
        """The snippet's learned accuracy under the mask, and the masked forward pass of the input."""
        return [
            "L, H = model.cfg.n_layers, model.cfg.n_heads",
            f"off = {self.mask!r}  # heads switched off",
            "kept = [(l, h) for l in range(L) for h in range(H) if interp.head_label(l, h) not in off]",
            f"acc = analyses.learned_accuracy(model, batch, heads=[kept], ablation={self._ablation!r})",
            (
                f"print(acc.accuracy[0])  # the accuracy shown: {self.accuracy:.6g} "
                f"({self._accuracy_view()['correct']}/{self._batch()['key'][1]})"
            ),
            "from interp.app.explorer import keep_mask, mask_hooks, masked_forward",
            "z_ref = analyses.mean_head_outputs(model, batch)" if self._ablation == "mean" else "z_ref = None",
            "out = masked_forward(model, example.tokens, keep_mask(model, off), z_ref)  # logits and patterns",
            "probs = out['logits'][0, example.answer_pos[0]].softmax(-1)",
            f"print(probs.topk({TOP_K}))  # top tokens at the answer position",
        ]

    def _snippet_patching(self) -> list[str]:
        """The snippet's corrupted input (a helper's pair was drawn with the input), activation patching and path
        patching from the sender."""
        lines = []
        if self._corruption == "flip":
            lines.append("corrupted = analyses.flip_answer(example, seed=0)")
        elif self._corruption == "resample":
            lines.append(f"corrupted = data.select([{self._resampled}])  # same length, another answer")
        elif self._corruption == "typed":
            lines += [
                "from interp.app.explorer import typed_example",
                f"corrupted = typed_example(task, {self._corrupt_text!r})",
            ]
        lines.append(
            "patching = analyses.activation_patching(model, example, corrupted=corrupted, metric='logit_diff', "
            "where='z', per='head')"
        )
        if self._sender is not None:
            lines.append(
                f"paths = analyses.path_patching(model, example, corrupted=corrupted, metric='logit_diff', "
                f"senders=[{self.sender!r}])"
            )
        return lines

    def _source_text(self) -> str:
        """Where the input came from, in words."""
        return {
            "example": f"{self._split} #{self._index}",
            "typed": "typed",
            "pair": f"{self._corruption} pair, seed {self._index}",
        }[self._source]

    def _snapshot_html(self) -> str:
        """The static snapshot of the current view (:func:`snapshot.snapshot_html`)."""
        return snapshot_html(
            model_name=self._name,
            task_name=self.task.name,
            source=self._source_text(),
            tokens=self.tokens,
            prediction=self.prediction,
            mask=self.mask,
            ablation=self._ablation,
            accuracy=self._accuracy_view(),
            patterns=self._fwd["patterns"],
            max_positions=self._max_positions,
            patching=self._patch,
            corruption=self._corruption,
        )


def explore(
    model_or_checkpoint: HookedTransformer | Checkpoint | str | Path,
    task: Task | str | None = None,
    *,
    split: str | None = None,
    index: int = 0,
    batch_size: int = DEFAULT_BATCH,
    ablation: str = "zero",
    device: str | None = None,
    max_positions: int = MAX_POSITIONS,
    seed: int = 0,
) -> Explorer:
    """The interactive explorer of a model: ``interp.explore("noisy-majority")`` (a shipped name or a checkpoint
    path, loaded on ``device``), ``interp.explore(checkpoint)`` or ``interp.explore(model, task)`` (any
    ``HookedTransformer`` and its task, or the task's name). Starts on example ``index`` of ``split`` (default: the
    test split), the accuracy measured on the first ``batch_size`` examples of the split, heads switched off by
    ``ablation`` (``"zero"`` or ``"mean"``); at most ``max_positions`` positions of each attention pattern are
    drawn; ``seed`` drives the "random example" button."""
    checkpoint = None
    if isinstance(model_or_checkpoint, (str, Path)):
        if task is not None:
            raise InterpError("give a checkpoint (name or path) alone, or a model and its task")
        ckpt = load_checkpoint(model_or_checkpoint, device=device)
        checkpoint = str(model_or_checkpoint)
        model, task = ckpt.model, ckpt.task
    elif isinstance(model_or_checkpoint, Checkpoint):
        ckpt = model_or_checkpoint
        model, task = ckpt.model, task or ckpt.task
        checkpoint = None if ckpt.path is None else str(ckpt.path)
    else:
        model = model_or_checkpoint
        if task is None:
            raise TaskError("a model needs its task: interp.explore(model, task) (a task object or name)")
        if not hasattr(model, "cfg") or not hasattr(model, "run_with_hooks"):
            raise InterpError(
                f"expected a HookedTransformer, a Checkpoint or a checkpoint name; got {type(model).__name__}"
            )
    if isinstance(task, str):
        task = get_task(task)
    return Explorer(
        model,
        task,
        name=checkpoint,
        checkpoint=checkpoint,
        split=split,
        index=index,
        batch_size=batch_size,
        ablation=ablation,
        max_positions=max_positions,
        seed=seed,
    )
