"""The explorer widget: the ``anywidget`` wiring only. Its traitlets carry the views to the page and its messages
carry the page's events back; each change goes to the session state (:mod:`.state`: checked, then applied), the
views recompute what depends on it (:mod:`.views`), and the widget pushes them. Also :func:`explore`, which builds
it from a checkpoint or a model and its task."""

from __future__ import annotations

import json
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import anywidget
import torch
import traitlets
from jaxtyping import Float
from torch import Tensor

from interp.checkpoint import Checkpoint
from interp.errors import InterpError, TaskError
from interp.heads import head_label
from interp.loading import load_checkpoint
from interp.registry import get_task

from .compute import MAX_POSITIONS
from .snapshot import snapshot_html
from .snippet import snippet
from .state import Changed, Session, as_text
from .views import Views, one_line

if TYPE_CHECKING:
    from IPython.display import HTML
    from transformer_lens import HookedTransformer

    from interp.analyses.circuit_discovery import Circuit
    from interp.analyses.learned_accuracies import LearnedAccuracy
    from interp.analyses.patching import ActivationPatching, PathPatching
    from interp.suite import Suite
    from interp.task import Task, TaskData

    from .results import ExplorerState, Prediction

HERE = Path(__file__).parent  # explorer.js and explorer.css, the page side, ship beside this module
DEFAULT_BATCH = 256  # examples of the accuracy batch (the first ones of the current split)


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
    circuit_view = traitlets.Dict().tag(sync=True)
    export_view = traitlets.Dict().tag(sync=True)
    status = traitlets.Dict().tag(sync=True)

    def __init__(
        self,
        model: HookedTransformer,
        task: Task,
        *,
        suite: Suite | None = None,
        name: str | None = None,
        checkpoint: str | None = None,
        split: str | None = None,
        index: int = 0,
        batch_size: int = DEFAULT_BATCH,
        ablation: str = "zero",
        max_positions: int = MAX_POSITIONS,
        seed: int = 0,
    ):
        from interp.analyses import suite_for

        super().__init__()
        self.model, self.task = model, task
        self._checkpoint = checkpoint  # how to load it again (a registered name or a path), for the snippet
        self._name = name or checkpoint or f"a {task.name} model"
        self._session = Session(
            model,
            task,
            suite_for(task) if suite is None else suite,
            split=split,
            index=index,
            batch_size=batch_size,
            ablation=ablation,
            seed=seed,
        )
        self._views = Views(self._session, max_positions)
        self._sent_patterns: Tensor | None = None
        self._seq = 0
        self.timings: dict[str, float] = {}
        self.last_traceback: str | None = None
        self.info = self._views.info(self._name)
        self.on_msg(self._on_msg)
        self._refresh({"input": True, "batch": True})

    # -- public state ------------------------------------------------------------------------------------------

    @property
    def example(self) -> tuple[str, int] | None:
        """``(split, index)`` of the input shown, or None when it was typed (or drawn by a corruption with it)."""
        s = self._session
        return (s.split, s.index) if s.source == "example" else None

    @example.setter
    def example(self, value):
        self._refresh(self._session.set_example(value))

    @property
    def tokens(self) -> list[str]:
        """The input's tokens (strings). Set it to typed tokens: ``w.tokens = "0 1 1 2"`` or a list of strings (the
        task's suite reads them: :meth:`interp.suite.Suite.typed_example`)."""
        return self.task.vocab.decode(self._session.clean.tokens[0])

    @tokens.setter
    def tokens(self, value):
        self._refresh(self._session.set_tokens(value))

    @property
    def input_data(self) -> TaskData:
        """The input shown, as task data (one example, on the model's device)."""
        return self._session.clean

    @property
    def ablated(self) -> list[str]:
        """The heads switched off (names, in order). Set a list of heads (``['L0H1', 'L0H7']``, pairs also work);
        ``[]`` turns every head back on."""
        return self._session.ablated_names()

    @ablated.setter
    def ablated(self, value):
        self._refresh(self._session.set_ablated(value))

    @property
    def mask(self) -> Float[Tensor, "layer head"]:
        """The head mask of the view, the toolkit's one meaning: 1 = kept, 0 = ablated (``[layer, head]``). Set a mask
        of 0s and 1s of that shape; a list of heads to switch off is :attr:`ablated`."""
        return self._session.keep().cpu()

    @mask.setter
    def mask(self, value):
        self._refresh(self._session.set_mask(value))

    @property
    def ablation(self) -> str:
        """``"zero"`` or ``"mean"``: what a head switched off outputs (0, or its mean output at the answer positions
        of the accuracy batch)."""
        return self._session.ablation

    @ablation.setter
    def ablation(self, value):
        self._refresh(self._session.set_ablation(value))

    @property
    def batch_size(self) -> int:
        """How many examples (the first of the current split) the accuracy is measured on."""
        return self._session.batch_size

    @batch_size.setter
    def batch_size(self, value):
        self._refresh(self._session.set_batch_size(value))

    @property
    def head(self) -> str | None:
        """The head whose panel is open (``'L0H3'``), or None."""
        h = self._session.head
        return None if h is None else head_label(*h)

    @head.setter
    def head(self, value):
        self._refresh(self._session.set_head(value))

    @property
    def corruption(self) -> str | None:
        """The corrupted input of the patching: one of :func:`corruption_kinds` (``"typed"`` via
        :attr:`corrupted_tokens`), or None for no patching."""
        return self._session.corruption

    @corruption.setter
    def corruption(self, value):
        self._refresh(self._session.set_corruption(value, self._session.corrupt_text))

    @property
    def corrupted_tokens(self) -> list[str] | None:
        """The corrupted input's tokens; set typed tokens to patch against them (``corruption`` becomes ``"typed"``)."""
        c = self._session.corrupted
        return None if c is None else self.task.vocab.decode(c.tokens[0])

    @corrupted_tokens.setter
    def corrupted_tokens(self, value):
        self._refresh(self._session.set_corruption("typed", as_text(value)))

    @property
    def sender(self) -> str | None:
        """The sender head of the path patching (``'L0H1'``), or None."""
        h = self._session.sender
        return None if h is None else head_label(*h)

    @sender.setter
    def sender(self, value):
        self._refresh(self._session.set_sender(value))

    @property
    def edges_off(self) -> list[str]:
        """The circuit view's edges switched off (names ``sender->receiver``, e.g. ``'L0H1->L1H0.k'``, in the
        graph's order). Setting it opens the circuit view; ``[]`` turns every edge back on."""
        return self._session.edges_off_names()

    @edges_off.setter
    def edges_off(self, value):
        self._refresh(self._session.set_edges_off(value))

    # -- public numbers ----------------------------------------------------------------------------------------

    @property
    def circuit(self) -> Circuit | None:
        """The circuit view as an :class:`analyses.Circuit`: every edge's EAP score on the input and its corruption,
        ``kept`` the edges left on, ``circuit`` the logit difference with :attr:`edges_off` removed (patched from the
        corrupted run), ``full`` / ``empty`` the model's and the empty circuit's, and its ``faithfulness``. None until
        the view is opened (``w.compute("circuit")`` or setting :attr:`edges_off`) or without a corruption."""
        return self._views.circuit_result

    @property
    def circuit_logits(self) -> Float[Tensor, " vocab_out"] | None:
        """The answer position's logits with :attr:`edges_off` removed (None where :attr:`circuit` is None)."""
        return self._views.circuit_logits

    @property
    def prediction(self) -> Prediction:
        """Top tokens and probabilities at the answer positions with the heads ablated."""
        return self._views.fwd["prediction"]

    @property
    def accuracy(self) -> float:
        """Learned accuracy with the heads in :attr:`ablated` ablated, on the first ``batch_size`` examples of the
        current split: ``interp.analyses.learned_accuracy(model, batch, heads=[kept heads], ablation=...)``."""
        return float(self._views.acc.accuracy[0])

    @property
    def full_accuracy(self) -> float:
        """The same with every head on."""
        return self._views.full_accuracy()

    @property
    def learned_accuracy(self) -> LearnedAccuracy:
        """The :class:`analyses.LearnedAccuracy` behind :attr:`accuracy` (subsets: the kept heads, and the kept heads
        with the open head toggled when a panel is open)."""
        return self._views.acc

    @property
    def patterns(self) -> Float[Tensor, "layer head query key"]:
        """Every head's attention pattern on the input with the heads ablated (all positions, exact)."""
        return self._views.fwd["patterns"]

    @property
    def logits(self) -> Float[Tensor, "pos vocab_out"]:
        """The logits at every position of the input with the heads ablated."""
        return self._views.fwd["logits"]

    @property
    def patching(self) -> ActivationPatching | None:
        """The :class:`analyses.ActivationPatching` of every head's output (clean into corrupted, logit difference),
        or None without a corruption."""
        return self._views.patch

    @property
    def path_patching(self) -> PathPatching | None:
        """The :class:`analyses.PathPatching` from :attr:`sender`, or None."""
        return self._views.path

    @property
    def head_panel(self) -> dict:
        """The open head's numbers (as the panel shows them), or ``{}``."""
        return self._views.head_panel_numbers()

    @property
    def metrics(self) -> dict[str, float]:
        """The task's own metrics (``task.metrics``: e.g. exact match of integer addition, accuracy on every repeat
        position of repeated tokens) with the heads ablated, on the accuracy batch; one hooked forward pass."""
        return self._views.task_metrics()

    def compute(self, what: str) -> None:
        """Compute, for every head, what the panel shows only on request: ``"separation"`` (separation accuracy, the
        separators fitted on the first train examples and scored on the accuracy batch), ``"shapley"`` (Shapley values
        of the learned accuracy on the batch: exact up to 16 heads, else sampled), ``"metrics"`` (the task's own
        metrics with the heads ablated) or ``"circuit"`` (open the circuit view: every edge's EAP score on the input
        and its corruption, :attr:`circuit`; it then follows each new input pair)."""
        t0 = time.perf_counter()
        self._views.compute(what)
        self.timings = {what: (time.perf_counter() - t0) * 1000}
        with self.hold_sync():
            self._push()
            self._status()

    def state(self) -> ExplorerState:
        """The current view as an :class:`interp.Result` (``to_dict()``: plain JSON)."""
        from .results import ExplorerState

        return ExplorerState(self._views.state_dict(self._name))

    def snippet(self) -> str:
        """Python that reproduces the numbers of the current view with the toolkit's own calls."""
        return snippet(self._session, self._views, self._checkpoint)

    def snapshot_html(self) -> str:
        """A static HTML picture of the current view (what a saved notebook shows where no kernel runs)."""
        s, v = self._session, self._views
        return snapshot_html(
            model_name=self._name,
            task_name=self.task.name,
            source=s.source_text(),
            tokens=self.tokens,
            prediction=self.prediction,
            ablated=self.ablated,
            ablation=s.ablation,
            accuracy=v.accuracy_view(),
            patterns=v.fwd["patterns"],
            max_positions=v.max_positions,
            patching=v.patch,
            corruption=s.corruption,
        )

    def snapshot(self) -> HTML:
        """The static snapshot as an IPython HTML object: display it to keep a record of this state in the notebook."""
        from IPython.display import HTML

        return HTML(self.snapshot_html())

    def _repr_mimebundle_(self, **kwargs):
        """The widget's display bundle, with the static snapshot as its ``text/html`` for viewers without a
        kernel."""
        bundle = super()._repr_mimebundle_(**kwargs)
        if bundle is None:
            return None
        data, metadata = bundle
        try:
            data["text/html"] = self.snapshot_html()
        except Exception:
            self.last_traceback = traceback.format_exc()
        return data, metadata

    # -- recomputation -----------------------------------------------------------------------------------------------

    def _refresh(self, changed: Changed) -> None:
        """Recompute what depends on what changed and push it to the page; times each part (:attr:`timings`)."""
        s, v = self._session, self._views
        input, mask, batch = (changed.get(k, False) for k in ("input", "mask", "batch"))
        head, patch = changed.get("head", False), changed.get("patch", False)
        t: dict[str, float] = {}
        start = time.perf_counter()

        def timed(name: str, fn: Callable[[], object]) -> None:
            t0 = time.perf_counter()
            fn()
            t[name] = (time.perf_counter() - t0) * 1000

        if batch:
            timed("batch", s.batch)
        if input or mask or batch:
            timed("forward", v.forward)
        if mask or batch or (head and s.head is not None):
            timed("accuracy", v.accuracy)
        if input or patch:
            timed("patching", v.patching)
        if (input or patch) and s.circuit_on:
            timed("circuit", v.circuit)
        elif changed.get("edges", False):
            timed("circuit", v.circuit if v.cview is None else v.circuit_edges)
        if s.head is not None and (head or mask or batch or input):
            timed("head", v.head_panel)
        elif head:
            v.head_view = {}
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
        self.controls = self._views.controls()

    def _push(self) -> None:
        """Send the page every view (the patterns only when they changed: a new input, or a mask in a deeper
        model)."""
        v = self._views
        if v.fwd:
            self.input_view = v.input_view()
            self.prediction_view = v.prediction_view()
            p = v.fwd["patterns"]
            sent = self._sent_patterns
            if sent is None or sent.shape != p.shape or not torch.equal(sent, p):
                self.patterns_view = v.patterns_view()
                self._sent_patterns = p
        if v.acc is not None:
            self.accuracy_view = v.accuracy_view()
        self.patch_view = v.patch_view()
        self.circuit_view = v.circuit_view()
        if self._session.head is not None and v.head_view:
            self.head_view = {**v.head_view, "off": self._session.head in self._session.ablated}
        self.export_view = {"snippet": self.snippet()}

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
        s = self._session
        kind = msg.get("type")
        if kind == "example":
            self.example = (msg.get("split", s.split), whole_number(msg.get("index"), "index"))
        elif kind == "random":
            self._refresh(s.random_example(msg.get("split", s.split)))
        elif kind == "typed":
            self.tokens = str(msg.get("text", ""))
        elif kind == "toggle":
            h = s.parse_head(msg.get("head"))
            self.ablated = sorted(s.ablated ^ {h})
        elif kind == "only":
            h = s.parse_head(msg.get("head"))
            self.ablated = [x for x in s.all_heads() if x != h]
        elif kind == "ablated":
            self.ablated = msg.get("heads") or []
        elif kind == "ablation":
            self.ablation = msg.get("value")
        elif kind == "batch_size":
            self.batch_size = whole_number(msg.get("value"), "batch size")
        elif kind == "select":
            self.head = msg.get("head") or None
        elif kind == "corruption":
            self._refresh(s.set_corruption(msg.get("kind"), str(msg.get("text", ""))))
        elif kind == "sender":
            self.sender = msg.get("head") or None
        elif kind == "edge":
            name = msg.get("edge")
            names = self.edges_off
            self.edges_off = [e for e in names if e != name] if name in names else [*names, name]
        elif kind == "edges_off":
            self.edges_off = msg.get("edges") or []
        elif kind == "compute":
            self.compute(str(msg.get("what")))
        elif kind == "export_state":
            self.export_view = {**self.export_view, "state": json.dumps(self.state().to_dict(), indent=1)}
            self._status()
        else:
            raise InterpError(f"unknown event {kind!r}")


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
    """The interactive explorer of a model: ``interp.explore("noisy-majority")`` (a registered checkpoint name or a
    checkpoint path, loaded on ``device``), ``interp.explore(checkpoint)`` or ``interp.explore(model, task)`` (any
    ``HookedTransformer`` and its task, or the name of a registered task). Starts on example ``index`` of ``split``
    (default: the test split), the accuracy measured on the first ``batch_size`` examples of the split, heads
    switched off by ``ablation`` (``"zero"`` or ``"mean"``); at most ``max_positions`` positions of each attention
    pattern are drawn; ``seed`` drives the "random example" button. Typed input, the task's own corruptions and the
    probe sequences of the head scores come from the task's suite (``interp.analyses.suite_for(task)``)."""
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
