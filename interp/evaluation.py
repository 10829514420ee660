"""Evaluating a model on task data: chunked, length-sorted, on the model's device, no grad."""

from __future__ import annotations

import numbers
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from jaxtyping import Float, Int
from torch import Tensor

from .device import model_device
from .errors import ConfigError, InterpError, TokenError
from .model import extendable
from .query_forward import logits_at, supports_query_forward
from .task import IGNORE, Task, TaskData, check_model_task, check_nonempty, task_dataset

if TYPE_CHECKING:
    from transformer_lens import HookedTransformer

DEFAULT_BUDGET = 4_000_000  # batch x pos x pos per chunk: bounds the [batch, head, pos, pos] attention memory


def check_tokens(model: HookedTransformer, tokens: Tensor, vocab=None) -> None:
    """Refuse tokens the model cannot take: ids outside its vocabulary or longer than its context."""
    if not isinstance(tokens, Tensor):
        raise TokenError(f"tokens must be a tensor of token ids [batch, pos], got {type(tokens).__name__}")
    if tokens.dtype.is_floating_point or tokens.dtype.is_complex or tokens.dtype == torch.bool:
        raise TokenError(f"tokens must be integer token ids, got dtype {tokens.dtype}")
    if tokens.ndim != 2:
        raise TokenError(f"tokens must have shape [batch, pos], got {tuple(tokens.shape)}")
    if tokens.shape[0] == 0:
        raise TokenError("no sequences were given (a batch of 0); expected at least one")
    if tokens.shape[1] > model.cfg.n_ctx:
        raise TokenError(
            f"sequences of {tokens.shape[1]} tokens are longer than the model's context n_ctx={model.cfg.n_ctx}"
            + (
                " (a model without positional embedding, or with ALiBi positions, can take them: "
                "interp.model.extend_context(model, n_ctx))"
                if extendable(model)
                else ""
            )
        )
    if vocab is not None:
        vocab.check_ids(tokens)
    elif tokens.numel() and (int(tokens.min()) < 0 or int(tokens.max()) >= model.cfg.d_vocab):
        raise TokenError(
            f"token ids must lie in [0, {model.cfg.d_vocab - 1}], got min {int(tokens.min())} max {int(tokens.max())}"
        )


def check_finite_parameters(model: HookedTransformer) -> None:
    """Refuse a model with a NaN or infinite parameter: its logits are not numbers, so its accuracy (and every
    value built on it) is undefined. One InterpError naming the first such parameter, on every path (evaluation,
    learned accuracy, coalition values), instead of a number that depends on how each path treats NaN."""
    for name, p in model.named_parameters():
        if p.is_floating_point() and not bool(torch.isfinite(p.detach()).all()):
            raise InterpError(
                f"the model's parameter {name} holds NaN or infinite values: its outputs, and any "
                "accuracy or value computed from them, are undefined"
            )


def check_finite_logits(logits: Tensor, what: str = "the model's logits") -> None:
    """Refuse non-finite logits (finite parameters can still overflow): one InterpError saying so."""
    if not bool(torch.isfinite(logits).all()):
        raise InterpError(f"{what} hold NaN or infinite values (overflow?); an accuracy of them is undefined")


def check_batch_size(batch_size: object) -> None:
    """Refuse a ``batch_size`` (the analyses' one memory knob: at most this many sequences per forward, counting the
    copies of a batch repeated per head subset or variant) that is not None or a positive integer."""
    if batch_size is not None and (
        not isinstance(batch_size, numbers.Integral) or isinstance(batch_size, bool) or batch_size < 1
    ):
        raise ConfigError(f"batch_size must be a positive integer or None (automatic), got {batch_size!r}")


def length_chunks(data: TaskData, budget: int = DEFAULT_BUDGET, batch_size: int | None = None) -> Iterator[Tensor]:
    """Index tensors over ``data``, sorted by length, each chunk holding at most ``budget``
    attention entries per head (chunk size x longest length squared), so padding and memory stay small; with
    ``batch_size``, at most that many examples instead."""
    order = torch.argsort(data.lengths.cpu(), stable=True).to(data.device)
    lengths = data.lengths[order].tolist()
    start = 0
    while start < len(order):
        end = start + 1
        if batch_size is not None:
            end = min(len(order), start + batch_size)
        while batch_size is None and end < len(order) and (end - start + 1) * max(lengths[end], 1) ** 2 <= budget:
            end += 1
        yield order[start:end]
        start = end


def map_chunks(
    model: HookedTransformer,
    data: TaskData,
    fn: Callable[[TaskData], dict[str, Tensor]],
    budget: int = DEFAULT_BUDGET,
    *,
    batch_size: int | None = None,
) -> dict[str, Tensor]:
    """Apply ``fn`` to length-sorted chunks of ``data`` (moved to the model's device) and reassemble
    the per-example outputs (dim 0) in the original order. Chunks hold ``budget`` attention entries per head, or
    ``batch_size`` examples where that is given."""
    check_nonempty(data)
    device = model_device(model)
    data = data.to(device)
    check_tokens(model, data.tokens)
    outs: dict[str, list[Tensor]] = {}
    order = []
    for idx in length_chunks(data, budget, batch_size):
        res = fn(data.select(idx))
        for k, v in res.items():
            outs.setdefault(k, []).append(v)
        order.append(idx)
    perm = torch.cat(order)
    inv = torch.empty_like(perm)
    inv[perm] = torch.arange(len(perm), device=perm.device)
    return {k: _cat_padded(v)[inv] for k, v in outs.items()}


def _cat_padded(chunks: list[Tensor]) -> Tensor:
    """Concatenate along dim 0, right-padding dim 1 (positions) with zeros when lengths differ."""
    if chunks[0].ndim < 2:
        return torch.cat(chunks)
    t = max(c.shape[1] for c in chunks)
    return torch.cat([F.pad(c, (0, 0) * (c.ndim - 2) + (0, t - c.shape[1])) for c in chunks])


def predictions_and_loss(
    model: HookedTransformer, data: TaskData, fwd_hooks=(), *, batch_size: int | None = None
) -> dict[str, Tensor]:
    """Per-position argmax ``preds [batch, pos]`` and cross-entropy ``loss [batch, pos]`` (0 where no target);
    ``batch_size`` examples per forward (None: from the memory budget)."""

    from .fast_attention import fast_logits, has_fast_path, run_with_hooks

    fast = has_fast_path(model) and not fwd_hooks  # sparse masks, linear attention: O(n·W) / O(n) forwards

    def one(chunk: TaskData) -> dict[str, Tensor]:
        with torch.inference_mode():
            if fwd_hooks:  # the fast forwards too, where every hook fires there (hook_z does)
                logits = run_with_hooks(model, chunk.tokens, fwd_hooks)
            else:
                logits = fast_logits(model, chunk.tokens) if fast else model(chunk.tokens)
        return {"preds": logits.argmax(-1), "loss": per_position_loss(logits, chunk.targets)}

    return map_chunks(model, data, one, batch_size=batch_size)


def per_position_loss(
    logits: Float[Tensor, "batch pos vocab"], targets: Int[Tensor, "batch pos"]
) -> Float[Tensor, "batch pos"]:
    """Cross-entropy at every position with a target; 0 where ``targets == IGNORE``."""
    return F.cross_entropy(logits.transpose(1, 2).float(), targets, ignore_index=IGNORE, reduction="none")


def evaluate(model: HookedTransformer, task: Task, data: TaskData, *, full_forward: bool = False) -> dict[str, float]:
    """The task's metrics (``accuracy`` first) of ``model`` on ``data``.

    One-layer attention-only models on tasks with a few target positions per sequence use the exact
    query-restricted forward of :mod:`interp.query_forward` (tested equal to ``model(tokens)``, ~50x faster);
    ``full_forward=True`` forces TransformerLens' full forward."""
    task.check_data(data)
    check_model_task(model, task)
    check_nonempty(data)
    check_finite_parameters(model)
    if not full_forward:
        out = sparse_predictions_and_loss(model, data)
        if out is not None:
            return task.metrics(out["preds"], out["loss"], data.to(out["preds"].device))
    out = predictions_and_loss(model, data)
    return task.metrics(out["preds"], out["loss"], data.to(out["preds"].device))


def evaluate_splits(
    model: HookedTransformer, task: Task, splits=None, seed: int | None = None, *, full_forward: bool = False
) -> dict[str, dict[str, float]]:
    """Metrics per split, e.g. ``{"train": {...}, "val": {...}, "test": {...}}``."""
    return {
        s: evaluate(model, task, task_dataset(task, s, seed), full_forward=full_forward)
        for s in (splits or task.splits)
    }


def target_positions(data, *, few: bool = True) -> Tensor | None:
    """``[batch, k]`` positions that carry a target when every row has the same number of them, and (``few``) at
    most a quarter of the padded width (where the query-restricted forward pays); else None. ``few=False`` for a
    batch cut from data already found to qualify: :meth:`TaskData.select` trims a batch to its longest sentence,
    so a batch of a few short sentences can fail the quarter test that its split passes, and a run whose forward
    (and so its dropout draws) changed with it would not be the run its population reproduces."""
    mask = data.targets != IGNORE
    counts = mask.sum(1)
    if not len(data) or int(counts.min()) != int(counts.max()):
        return None
    if few and int(counts.max()) * 4 > data.tokens.shape[1]:
        return None
    return mask.nonzero()[:, 1].view(len(data), -1)


def sparse_predictions_and_loss(model: HookedTransformer, data, batch_size: int = 512) -> dict[str, Tensor] | None:
    """Like :func:`predictions_and_loss` (argmax and loss at target positions; ``preds`` is -1 and ``loss`` 0
    elsewhere) via the exact query-restricted forward, or None where that forward does not apply."""
    if not supports_query_forward(model):
        return None
    device = model_device(model)
    data = data.to(device)
    check_tokens(model, data.tokens)
    if target_positions(data.select(slice(0, 1))) is None:
        return None
    preds = torch.full_like(data.tokens, -1)
    loss = torch.zeros(data.tokens.shape, device=device)
    with torch.inference_mode():
        for start in range(0, len(data), batch_size):
            idx = torch.arange(start, min(start + batch_size, len(data)), device=device)
            chunk = data.select(idx)
            qpos = target_positions(chunk)
            if qpos is None:
                return None
            logits = logits_at(model, chunk.tokens, qpos)
            rows = idx[:, None]
            preds[rows, qpos] = logits.argmax(-1)
            loss[rows, qpos] = F.cross_entropy(
                logits.transpose(1, 2).float(), chunk.targets.gather(1, qpos), reduction="none"
            )
    return {"preds": preds, "loss": loss}
