"""The explorer's session state, on the Python side: the model and its task (and the task's suite, which supplies
typed input, the task's own corruptions and its probe sequences), the input shown (an example of a split, typed
tokens, or a clean input drawn with its corruption), the heads ablated and how, the accuracy batch, the open head
panel, and the patching's corrupted input and sender head.

Every change goes through a ``set_*`` method that checks the new value first: a bad value raises one of the
toolkit's errors (one line) and changes nothing. Each returns what it changed (``input``, ``mask``, ``batch``,
``head``, ``patch``), which is what the views recompute (:mod:`.views`).
"""

from __future__ import annotations

import random
from typing import TYPE_CHECKING, Any

from jaxtyping import Float
from torch import Tensor

from interp.analyses.answer_cache import cache_answer
from interp.analyses.learned_accuracies import mean_head_outputs
from interp.device import model_device
from interp.errors import HeadError, InterpError, TaskError
from interp.heads import Head, all_heads, head_label, parse_head
from interp.query_forward import supports_query_forward
from interp.task import task_dataset

from .circuit import graph_of, parse_edges
from .compute import keep_mask
from .inputs import EVERY_TASK, check_lined_up, resample, typed_example

if TYPE_CHECKING:
    from transformer_lens import HookedTransformer

    from interp.analyses.circuit_graph import ComputationalGraph
    from interp.suite import Corruption, Suite
    from interp.task import Task, TaskData

ABLATIONS = ("zero", "mean")
Changed = dict[str, bool]  # what a change touches: input, mask, batch, head, patch, edges


def as_text(value: object) -> str:
    """Typed tokens as one string (a list of token strings joined by spaces)."""
    return value if isinstance(value, str) else " ".join(str(v) for v in value)


class Session:
    """The explorer's state and its validation (see the module's docstring)."""

    def __init__(
        self,
        model: HookedTransformer,
        task: Task,
        suite: Suite,
        *,
        split: str | None,
        index: int,
        batch_size: int,
        ablation: str,
        seed: int,
    ):
        self.model, self.task, self.suite = model, task, suite  # that they fit is checked by the first batch's cache
        cfg = model.cfg
        self.n_layers, self.n_heads = cfg.n_layers, cfg.n_heads
        self.device = model_device(model)
        self.rng = random.Random(seed)
        self.corruption_table: dict[str, Corruption] = suite.corruptions(task)  # the task's own, by name
        self.datasets: dict[str, TaskData] = {}  # split -> its data, generated on first use
        self.batches: dict[tuple[str, int], dict] = {}  # (split, size) -> the accuracy batch and what is cached on it
        self.ablated: set[Head] = set()
        self.head: Head | None = None
        self.corruption: str | None = None
        self.corrupt_text = ""
        self.corrupted: TaskData | None = None
        self.resampled: int | None = None
        self.sender: Head | None = None
        self.circuit_on = False  # whether the circuit view was asked for (it then follows every new input pair)
        self.edges_off: list[int] = []  # the circuit view's edges switched off (indices of the model's graph)
        self._graph: ComputationalGraph | None = None
        self.split = split if split is not None else ("test" if "test" in task.splits else task.splits[-1])
        self.check_split(self.split)
        self.index, self.source, self.typed = 0, "example", ""
        self.ablation = self.check_ablation(ablation)
        self.batch_size = self.check_batch_size(batch_size)
        self.index = self.check_index(self.split, index)
        self.clean = self.example(self.split, self.index)

    # -- validation ----------------------------------------------------------------------------------------------

    def parse_head(self, spec: object) -> Head:
        """A head of this model from a name (``'L0H3'``) or a pair; a HeadError otherwise."""
        return parse_head(spec, self.n_layers, self.n_heads)

    def parse_heads(self, specs: object) -> set[Head]:
        """A set of heads from a list of names or pairs (one name or pair alone also works)."""
        if isinstance(specs, str) or (
            isinstance(specs, tuple) and len(specs) == 2 and all(isinstance(x, int) for x in specs)
        ):
            specs = [specs]
        try:
            specs = list(specs)
        except TypeError:
            raise HeadError(f"ablated must be a list of heads (e.g. ['L0H1', 'L0H7']), got {specs!r}") from None
        return {self.parse_head(s) for s in specs}

    def parse_keep_mask(self, value: object) -> set[Head]:
        """The heads ablated by a ``[layer, head]`` mask (1 = kept, 0 = ablated); a HeadError for another shape or
        values other than 0 and 1."""
        import torch

        try:
            m = torch.as_tensor(value, dtype=torch.float32)
        except (TypeError, ValueError):
            raise HeadError(
                f"mask must be a [{self.n_layers}, {self.n_heads}] tensor of 1 (kept) and 0 (ablated); for a list of "
                f"heads to switch off use ablated=; got {type(value).__name__}"
            ) from None
        if tuple(m.shape) != (self.n_layers, self.n_heads) or not bool(((m == 0) | (m == 1)).all()):
            raise HeadError(
                f"mask must be a [{self.n_layers}, {self.n_heads}] tensor of 1 (kept) and 0 (ablated), got shape "
                f"{tuple(m.shape)}; for a list of heads to switch off use ablated="
            )
        return {(int(l), int(h)) for l, h in (m == 0).nonzero().tolist()}

    def parse_sender(self, spec: object) -> Head:
        """A head whose output a later layer receives (path patching needs a receiver)."""
        h = self.parse_head(spec)
        if self.n_layers < 2:
            raise HeadError(
                "path patching needs a later layer to receive the sender's output; this model has one layer"
            )
        if h[0] >= self.n_layers - 1:
            raise HeadError(
                f"the sender {head_label(*h)} is in the last layer; pick a head of layers 0..{self.n_layers - 2}"
            )
        return h

    def check_split(self, split: object) -> None:
        """A TaskError unless ``split`` is one of the task's splits."""
        if split not in self.task.splits:
            raise TaskError(f"unknown split {split!r}; task {self.task.name} has {', '.join(self.task.splits)}")

    def check_index(self, split: str, index: object) -> int:
        """``index`` if it is an example of ``split``."""
        n = len(self.dataset(split))
        if isinstance(index, bool) or not isinstance(index, int) or not 0 <= index < n:
            raise InterpError(f"index {index!r} is out of range: split {split!r} has examples 0..{n - 1}")
        return index

    def check_ablation(self, value: object) -> str:
        """``value`` if it is one of ``ABLATIONS``."""
        if value not in ABLATIONS:
            raise InterpError(f"unknown ablation {value!r}; expected one of {ABLATIONS}")
        return value

    def check_batch_size(self, value: object) -> int:
        """A positive batch size, cut to the current split's size."""
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise InterpError(f"batch_size must be a positive integer, got {value!r}")
        return min(value, len(self.dataset(self.split)))

    def corruption_kinds(self) -> tuple[str, ...]:
        """The corrupted inputs offered for this task: its own, then ``resample`` and ``typed``
        (:func:`.inputs.corruption_kinds`)."""
        return (*self.corruption_table, *EVERY_TASK)

    def is_pair(self, kind: str | None) -> bool:
        """Whether ``kind`` is a corruption that draws the clean input too (it replaces the input shown)."""
        return kind is not None and kind in self.corruption_table and self.corruption_table[kind].pair

    # -- data ----------------------------------------------------------------------------------------------------

    def dataset(self, split: str) -> TaskData:
        """The whole split, generated by the task on first use and kept."""
        if split not in self.datasets:
            self.datasets[split] = task_dataset(self.task, split)
        return self.datasets[split]

    def example(self, split: str, index: int) -> TaskData:
        """One example of a split, on the model's device."""
        return self.dataset(split).select([index]).to(self.device)

    def pair(self, kind: str) -> tuple[TaskData, TaskData]:
        """A (clean, corrupted) pair from the task's own corruption ``kind``, drawn with ``seed = index``."""
        clean, corrupted = self.corruption_table[kind].make(self.task, self.index)
        return clean.to(self.device), corrupted.to(self.device)

    def fast(self) -> bool:
        """Whether the toolkit's fast path applies (one-layer attention-only models: cached head outputs)."""
        return supports_query_forward(self.model)

    def batch(self) -> dict[str, Any]:
        """The accuracy batch of the current split, its answer cache (the mean-ablation reference, and the input of
        the fast path) and its mean head outputs, computed once per (split, size); what is computed on it later
        (accuracies of single heads and of all heads, separation accuracy, Shapley values) is kept there too."""
        key = (self.split, min(self.batch_size, len(self.dataset(self.split))))
        if key not in self.batches:
            batch = self.dataset(self.split).select(slice(0, key[1])).to(self.device)
            cache = cache_answer(self.model, batch, attention=False, task=self.task)
            self.batches[key] = {
                "key": key,
                "batch": batch,
                "cache": cache,
                "z_ref": mean_head_outputs(self.model, cache),
                "singles": {},
                "full": {},
                "separation": None,
                "shapley": {},
            }
        return self.batches[key]

    def keep(self) -> Float[Tensor, "layer head"]:
        """The current mask: 1 for the heads kept, 0 for the heads ablated."""
        return keep_mask(self.model, self.ablated)

    def z_ref(self) -> Float[Tensor, "layer head d_head"] | None:
        """The mean-ablation reference (the batch's mean head outputs), or None under zero ablation."""
        return self.batch()["z_ref"] if self.ablation == "mean" else None

    def all_heads(self) -> list[Head]:
        """Every head, layer by layer."""
        return all_heads(self.n_layers, self.n_heads)

    def kept(self, ablated: set[Head] | None = None) -> list[Head]:
        """The heads not in ``ablated`` (default: the heads ablated now)."""
        ablated = self.ablated if ablated is None else ablated
        return [h for h in self.all_heads() if h not in ablated]

    def ablated_names(self) -> list[str]:
        """The heads ablated, as names in order."""
        return [head_label(*h) for h in sorted(self.ablated)]

    # -- the corrupted input -------------------------------------------------------------------------------------

    def corrupt(self, kind: str, text: str, clean: TaskData) -> TaskData:
        """The corrupted input of ``kind`` for ``clean`` (the task's own corruption, a resampled example or typed
        tokens), checked to line up with it."""
        table = self.corruption_table
        if kind == "resample":
            data = self.dataset(self.split)
            self.resampled = resample(data, clean, self.index + 1 if self.source == "example" else 0)
            corrupted = data.select([self.resampled])
        elif kind == "typed":
            corrupted = typed_example(self.task, text, self.model.cfg.n_ctx, suite=self.suite)
        elif kind in table and not table[kind].pair:
            corrupted = table[kind].make(clean, 0)
        else:
            raise InterpError(f"unknown corruption {kind!r}; expected one of {self.corruption_kinds()}")
        corrupted = corrupted.to(self.device)
        check_lined_up(clean, corrupted)
        return corrupted

    def recorrupt(self) -> None:
        """The corrupted input again for a new clean input (a pair's stays as drawn)."""
        if self.corruption is not None and not self.is_pair(self.corruption):
            self.corrupted = self.corrupt(self.corruption, self.corrupt_text, self.clean)

    # -- changes -------------------------------------------------------------------------------------------------

    def set_example(self, value: object) -> Changed:
        """Show example ``(split, index)`` (with a pair corruption: the pair drawn with that index)."""
        if not (isinstance(value, (tuple, list)) and len(value) == 2):
            raise InterpError(f"example must be (split, index), e.g. ('test', 3); got {value!r}")
        split, index = value
        self.check_split(split)
        index = self.check_index(split, index)
        batch = split != self.split
        self.split, self.index, self.source = split, index, "example"
        if self.is_pair(self.corruption):
            self.source = "pair"
            self.clean, self.corrupted = self.pair(self.corruption)
        else:
            self.clean = self.example(split, index)
        return {"input": True, "batch": batch}

    def random_example(self, split: object) -> Changed:
        """Show a random example of ``split`` (drawn from the session's seed)."""
        self.check_split(split)
        return self.set_example((split, self.rng.randrange(len(self.dataset(split)))))

    def set_tokens(self, value: object) -> Changed:
        """Show typed tokens (the task's suite builds the example; a pair corruption is dropped)."""
        data = typed_example(self.task, value, self.model.cfg.n_ctx, suite=self.suite)
        self.typed = as_text(value)
        self.clean, self.source = data.to(self.device), "typed"
        if self.is_pair(self.corruption):
            self.corruption = self.corrupted = None
        return {"input": True}

    def set_ablated(self, value: object) -> Changed:
        self.ablated = self.parse_heads(value)
        return {"mask": True}

    def set_mask(self, value: object) -> Changed:
        self.ablated = self.parse_keep_mask(value)
        return {"mask": True}

    def set_ablation(self, value: object) -> Changed:
        self.ablation = self.check_ablation(value)
        return {"mask": True}

    def set_batch_size(self, value: object) -> Changed:
        self.batch_size = self.check_batch_size(value)
        return {"batch": True}

    def set_head(self, value: object) -> Changed:
        self.head = None if value is None else self.parse_head(value)
        return {"head": True}

    def set_sender(self, value: object) -> Changed:
        self.sender = None if value is None else self.parse_sender(value)
        return {"patch": True}

    def graph(self) -> ComputationalGraph:
        """The model's computational graph (:func:`analyses.computational_graph`), built once."""
        if self._graph is None:
            self._graph = graph_of(self.model)
        return self._graph

    def set_edges_off(self, value: object) -> Changed:
        """Switch off the circuit view's edges named in ``value`` (``[]``: every edge on); opens the circuit view."""
        self.edges_off = parse_edges(self.graph(), value)
        self.circuit_on = True
        return {"edges": True}

    def edges_off_names(self) -> list[str]:
        """The edges switched off, as names in the graph's order."""
        names = self.graph().edge_names if self.edges_off else []
        return [names[e] for e in self.edges_off]

    def set_corruption(self, kind: object, text: str) -> Changed:
        """Choose the corrupted input (None, ``""`` or ``"none"``: no patching); a bad choice raises before anything
        changes. A pair replaces the input; leaving a pair goes back to the example of the split."""
        kinds = self.corruption_kinds()
        leave_pair = self.source == "pair"
        if kind in (None, "", "none"):
            self.corruption = self.corrupted = None
            if leave_pair:
                self.source, self.clean = "example", self.example(self.split, self.index)
            return {"input": leave_pair, "patch": True}
        if kind not in kinds:
            raise InterpError(f"unknown corruption {kind!r}; for task {self.task.name} expected one of {kinds}")
        if self.is_pair(kind):
            self.clean, self.corrupted = self.pair(kind)
            self.corruption, self.source = kind, "pair"
            return {"input": True, "patch": True}
        clean = self.example(self.split, self.index) if leave_pair else self.clean
        if leave_pair:
            self.source = "example"  # (a resampled corruption then starts after the example)
        text = text if kind == "typed" else self.corrupt_text
        try:
            corrupted = self.corrupt(kind, text, clean)
        finally:
            if leave_pair:
                self.source = "pair"
        self.clean, self.corrupted, self.corruption, self.corrupt_text = clean, corrupted, kind, text
        if leave_pair:
            self.source = "example"
        return {"input": leave_pair, "patch": True}

    def source_text(self) -> str:
        """Where the input came from, in words."""
        return {
            "example": f"{self.split} #{self.index}",
            "typed": "typed",
            "pair": f"{self.corruption} pair, seed {self.index}",
        }[self.source]
