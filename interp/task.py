"""The task protocol: what a model learns (vocabulary, data, answer positions, correctness).

Implementations live in ``tasks/``; ``interp`` only knows this protocol.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

import torch
from jaxtyping import Float, Int
from torch import Tensor

from .errors import InterpError, TaskError, TokenError

if TYPE_CHECKING:
    from transformer_lens import HookedTransformer

IGNORE = -100  # target value meaning "no loss at this position" (torch's default ignore_index)


@dataclass(frozen=True)
class Vocab:
    """Token strings <-> ids. Tokens ``[0, n_out)`` can be predicted; later ones (padding) are input-only."""

    tokens: tuple[str, ...]
    bos: int | None = None
    eos: int | None = None
    pad: int | None = None
    n_out: int | None = None  # size of the model's output vocabulary; defaults to all tokens

    def __post_init__(self):
        if len(set(self.tokens)) != len(self.tokens):
            raise TaskError(f"vocabulary has duplicate tokens: {self.tokens}")
        if self.n_out is None:
            object.__setattr__(self, "n_out", len(self.tokens))

    def __len__(self) -> int:
        return len(self.tokens)

    @property
    def index(self) -> dict[str, int]:
        return {t: i for i, t in enumerate(self.tokens)}

    def encode(self, strs: list[str] | str) -> Int[Tensor, " pos"]:
        """Token strings -> ids. A plain string is split on whitespace (``"[BOS] 0 1 ="``)."""
        if isinstance(strs, str):
            strs = strs.split()
        idx = self.index
        bad = [s for s in strs if s not in idx]
        if bad:
            raise TokenError(f"unknown token(s) {bad}; the vocabulary is {list(self.tokens)}")
        return torch.tensor([idx[s] for s in strs], dtype=torch.long)

    def decode(self, ids) -> list[str]:
        """Ids (tensor or list) -> token strings."""
        ids = ids.tolist() if isinstance(ids, Tensor) else list(ids)
        bad = [i for i in ids if not 0 <= int(i) < len(self.tokens)]
        if bad:
            raise TokenError(f"token id(s) {bad} are outside the vocabulary of size {len(self.tokens)}")
        return [self.tokens[int(i)] for i in ids]

    def check_ids(self, tokens: Tensor, what: str = "tokens") -> None:
        """Raise a TokenError if any id is outside ``[0, len(vocab))``."""
        if tokens.dtype not in (torch.long, torch.int, torch.int16, torch.int8, torch.uint8):
            raise TokenError(f"{what} must be an integer tensor of token ids, got dtype {tokens.dtype}")
        if tokens.numel() and (int(tokens.min()) < 0 or int(tokens.max()) >= len(self.tokens)):
            raise TokenError(
                f"{what} contain ids outside the vocabulary: min {int(tokens.min())}, max {int(tokens.max())}; "
                f"expected ids in [0, {len(self.tokens) - 1}] ({list(self.tokens)})"
            )


@dataclass
class TaskData:
    """A batch of task examples on one device.

    ``targets[b, p]`` is the token the model should predict *at* position ``p`` (i.e. token ``p+1``), or
    ``IGNORE`` where there is no loss. ``answer_pos[b]`` is the position whose prediction is the task's
    answer and ``labels[b]`` that answer. ``lengths[b]`` counts the real (unpadded) tokens. ``fields``
    holds the task's own per-example tensors (counts, categories, ...), e.g. ``data.fields["n0"]``.
    ``vocab`` is the task's vocabulary, so analyses can check that a model and the data fit each other.
    ``aux_targets[b, p]``, where a task gives them, are the targets of an auxiliary loss (``IGNORE`` where there
    is none), weighed by ``TrainConfig.aux_loss`` (e.g. integer addition's carry out of each place).
    """

    task: str
    tokens: Int[Tensor, "batch pos"]
    targets: Int[Tensor, "batch pos"]
    answer_pos: Int[Tensor, " batch"]
    labels: Int[Tensor, " batch"]
    lengths: Int[Tensor, " batch"]
    fields: dict[str, Tensor] = field(default_factory=dict)
    vocab: Vocab | None = None
    aux_targets: Int[Tensor, "batch pos"] | None = None

    def __len__(self) -> int:
        return self.tokens.shape[0]

    @property
    def device(self) -> torch.device:
        return self.tokens.device

    def to(self, device) -> TaskData:
        return TaskData(
            self.task,
            self.tokens.to(device),
            self.targets.to(device),
            self.answer_pos.to(device),
            self.labels.to(device),
            self.lengths.to(device),
            {k: v.to(device) for k, v in self.fields.items()},
            self.vocab,
            None if self.aux_targets is None else self.aux_targets.to(device),
        )

    def select(self, index) -> TaskData:
        """The examples at ``index`` (a slice, bool mask or index tensor), padding trimmed to their longest."""
        if isinstance(index, slice):
            idx = torch.arange(len(self), device=self.device)[index]
        else:
            idx = torch.as_tensor(index, device=self.device)
            if idx.dtype == torch.bool:
                idx = idx.nonzero().squeeze(-1)
        lengths = self.lengths[idx]
        t = int(lengths.max()) if len(idx) else 0
        t = max(t, 1)
        return TaskData(
            self.task,
            self.tokens[idx, :t],
            self.targets[idx, :t],
            self.answer_pos[idx],
            self.labels[idx],
            lengths,
            {k: v[idx] for k, v in self.fields.items()},
            self.vocab,
            None if self.aux_targets is None else self.aux_targets[idx, :t],
        )


@runtime_checkable
class Task(Protocol):
    """What a task provides: everything the trainer, the CLI and the analyses use (nothing else is asked of a
    task, and nothing is looked up with ``hasattr``). See ``tasks/noisy_majority.py`` for an implementation."""

    name: str
    vocab: Vocab
    splits: tuple[str, ...]
    n_ctx: int  # the context a model needs for this task's data (with its current parameters)

    def dataset(self, split: str, seed: int | None = None) -> TaskData:
        """Deterministic examples of a split; the same seed gives the same data."""

    def metrics(
        self, preds: Int[Tensor, "batch pos"], loss: Float[Tensor, "batch pos"], data: TaskData
    ) -> dict[str, float]:
        """Scores from per-position argmax predictions and losses. Must include ``accuracy``."""

    def default_spec(self) -> dict[str, Any]:
        """Keyword arguments for ``interp.model.ModelSpec`` suited to this task."""

    def default_train(self) -> dict[str, Any]:
        """Keyword arguments for ``interp.training.TrainConfig`` suited to this task."""

    def params(self) -> dict[str, Any]:
        """JSON-serialisable parameters that rebuild this task via ``interp.get_task(name, **params)``."""

    def check_data(self, data: TaskData) -> None:
        """Raise a TaskError if ``data`` does not belong to this task."""


def check_model_task(model: HookedTransformer, task: Task) -> None:
    """Refuse a model whose vocabulary sizes do not fit the task's: a model of another task, caught before any
    work (a TaskError naming both)."""
    cfg = model.cfg
    n_in, n_out = len(task.vocab), task.vocab.n_out
    if cfg.d_vocab != n_in or cfg.d_vocab_out != n_out:
        raise TaskError(
            f"the model (d_vocab {cfg.d_vocab}, d_vocab_out {cfg.d_vocab_out}) does not fit task {task.name!r} "
            f"(vocabulary of {n_in} tokens, {n_out} outputs): is it a model of another task?"
        )


def check_labels(labels: Tensor, n_out: int, what: str) -> None:
    """Refuse labels no prediction can equal (outside ``[0, n_out)``, ``what`` naming that range): every accuracy
    on them would be a silent 0. One TokenError naming the first offending label, its example and the range."""
    if labels.numel() == 0:
        return
    bad = ((labels < 0) | (labels >= n_out)).nonzero()
    if len(bad):
        i = int(bad[0, 0])
        raise TokenError(
            f"label {int(labels[i])} (example {i}) is outside {what}: labels must lie in [0, {n_out}) "
            f"({len(bad)} of {labels.numel()} labels do not)"
        )


def task_dataset(task: Task, split: str, seed: int | None = None) -> TaskData:
    """``task.dataset(split, seed)`` for the toolkit's own callers (training, evaluation, the explorer): an error the
    task's code raises there becomes one TaskError naming the task, the split and that error (chained, so its
    traceback stays reachable), not a traceback from inside someone else's code. The toolkit's own errors pass
    through as they are."""
    try:
        return task.dataset(split) if seed is None else task.dataset(split, seed)
    except InterpError:
        raise
    except Exception as e:
        raise TaskError(
            f"task {getattr(task, 'name', type(task).__name__)!r} could not build its {split!r} split: "
            f"{type(e).__name__}: {' '.join(str(e).split())}"
        ) from e


def check_nonempty(data: TaskData, what: str = "the data") -> None:
    """Refuse empty task data with one clear line (instead of an error deep inside torch)."""
    if len(data) == 0:
        raise TaskError(f"{what} holds no examples; expected at least one")


def task_data(
    tokens: Int[Tensor, "batch pos"],
    answer_pos: Int[Tensor, " n_answer_pos"] | int,
    labels: Int[Tensor, " n_labels"],
    *,
    vocab: Vocab | None = None,
    targets: Int[Tensor, "batch pos"] | None = None,
    lengths: Int[Tensor, " batch"] | None = None,
    name: str = "custom",
) -> TaskData:
    """A :class:`TaskData` for a model without a task: token ids, the position whose prediction is the answer (one
    per example, or one int for all) and the answer token there. ``targets`` default to the answer alone (``IGNORE``
    elsewhere) and ``lengths`` to the full width. Every analysis that takes ``data`` then runs on it. (Their
    lengths are checked here, with a TaskError, rather than by the shape annotation.)"""
    tokens = torch.as_tensor(tokens)
    if tokens.dim() != 2 or tokens.dtype not in (torch.long, torch.int, torch.int16, torch.int8, torch.uint8):
        raise TaskError(f"tokens must be an integer tensor [batch, pos], got {tuple(tokens.shape)} {tokens.dtype}")
    tokens = tokens.long()
    b, t = tokens.shape
    answer_pos = torch.as_tensor(answer_pos, device=tokens.device).long()
    if answer_pos.dim() == 0:
        answer_pos = answer_pos.expand(b).clone()
    labels = torch.as_tensor(labels, device=tokens.device).long()
    if answer_pos.shape != (b,) or labels.shape != (b,):
        raise TaskError(
            f"answer_pos {tuple(answer_pos.shape)} and labels {tuple(labels.shape)} must hold one value per example "
            f"({b})"
        )
    if b and (int(answer_pos.min()) < 0 or int(answer_pos.max()) >= t):
        raise TaskError(f"answer positions must lie in [0, {t - 1}], got {answer_pos.tolist()[:8]}")
    if vocab is not None:
        vocab.check_ids(tokens)
        check_labels(labels, vocab.n_out or len(vocab), "the vocabulary's output tokens")
    if targets is None:
        targets = torch.full_like(tokens, IGNORE)
        targets[torch.arange(b, device=tokens.device), answer_pos] = labels
    if lengths is None:
        lengths = torch.full((b,), t, dtype=torch.long, device=tokens.device)
    return TaskData(name, tokens, torch.as_tensor(targets).long(), answer_pos, labels, lengths, {}, vocab)
