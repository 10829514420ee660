"""One pass over task data that keeps what the head analyses need at each example's answer position.

The head analyses of Fraknói 2024, §5.4 all read the model at the position where the answer is predicted
(the ``=`` token of noisy majority): the per-head outputs ``r^h`` (TransformerLens' ``hook_z``, before
``W_O``), the residual stream entering layer 0 (the direct path), and the answer query's attention row.
:func:`cache_answer` collects them once, chunked and on the model's device, so learned accuracy,
separation accuracy and attention ratios share one forward pass.

Two exact ways to get them (the toolkit's one vocabulary, :func:`interp.query_forward.resolve_method`):

- ``method="hooks"``: ``model.run_with_cache`` (any number of layers), keeping only the answer row;
- ``method="fast"``: for one-layer attention-only models, the answer query's attention row computed
  directly from the model's own modules (:func:`interp.query_forward.query_attention`): ``O(T)`` instead of
  TransformerLens' ``O(T^2)`` per head. Tested equal to ``"hooks"``.

``method="auto"`` takes ``"fast"`` when the model supports it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from jaxtyping import Float, Int
from torch import Tensor

from interp.device import check_device
from interp.errors import InterpError, TaskError
from interp.evaluation import check_batch_size, check_finite_parameters, check_tokens, map_chunks
from interp.query_forward import query_attention, resolve_method
from interp.task import TaskData, check_labels, check_model_task, check_nonempty

if TYPE_CHECKING:
    from transformer_lens import HookedTransformer

    from interp.task import Task


@dataclass
class AnswerCache:
    """Per-example activations at the answer position (all on the model's device).

    ``log_attn[b, l, h, t]`` is the log attention of the answer query to key ``t`` (``-inf`` for keys after
    the query and for padding); ``None`` when attention was not requested."""

    task: str
    z: Float[Tensor, "batch layer head d_head"]
    resid_pre: Float[Tensor, "batch d_model"]
    log_attn: Float[Tensor, "batch layer head pos"] | None
    tokens: Int[Tensor, "batch pos"]
    labels: Int[Tensor, " batch"]
    answer_pos: Int[Tensor, " batch"]
    vocab: object = None  # the task's Vocab, from the data
    data: TaskData | None = None  # the task data it was computed from (hook paths that need the whole sequences)

    def __len__(self) -> int:
        return self.z.shape[0]

    @property
    def device(self) -> torch.device:
        return self.z.device


def check_model_data(model: HookedTransformer, data: object, task: Task | None = None) -> None:
    """Refuse, before any work: something that is not task data, empty data, data of another task than ``task``,
    a model whose vocabulary does not fit the data's task, tokens the model cannot take, labels it cannot predict
    (outside ``[0, d_vocab_out)``: every accuracy would be a silent 0), and a model with a NaN or
    infinite parameter."""
    if not isinstance(data, TaskData):
        raise TaskError(f"expected task data (interp.task.TaskData), got {type(data).__name__}")
    check_nonempty(data)
    if task is not None:
        task.check_data(data)
        check_model_task(model, task)
    elif data.vocab is not None:
        cfg = model.cfg
        if cfg.d_vocab != len(data.vocab) or cfg.d_vocab_out != data.vocab.n_out:
            raise TaskError(
                f"the model (d_vocab {cfg.d_vocab}, d_vocab_out {cfg.d_vocab_out}) does not fit the "
                f"{data.task!r} data (vocabulary of {len(data.vocab)} tokens, {data.vocab.n_out} outputs): "
                "is it a model of another task?"
            )
    check_tokens(model, data.tokens, task.vocab if task is not None else data.vocab)
    check_labels(
        data.labels, model.cfg.d_vocab_out, f"the model's output vocabulary (d_vocab_out {model.cfg.d_vocab_out})"
    )
    check_finite_parameters(model)


def check_inputs(
    model: HookedTransformer,
    data: object,
    *,
    task: Task | None = None,
    device=None,
    batch_size: object = None,
    what: str = "data",
) -> torch.device:
    """The checks of an analysis's public entry, run once per call before any work: ``device`` (None follows the
    model; another device is refused), ``batch_size`` (None or a positive integer) and ``data``: task data
    (:func:`check_model_data`) or an :class:`AnswerCache` (of a model with finite parameters, of ``task`` where
    given, its vocabulary fitting the model). Returns the model's device."""
    dev = check_device(model, device)
    check_batch_size(batch_size)
    if isinstance(data, AnswerCache):
        if len(data) == 0:
            raise TaskError(f"{what} holds no examples; expected at least one")
        if task is not None and data.task != task.name:
            raise TaskError(f"{what} is a cache of task {data.task!r}, not of {task.name!r}")
        if data.vocab is not None and model.cfg.d_vocab_out != data.vocab.n_out:
            raise TaskError(
                f"the model (d_vocab_out {model.cfg.d_vocab_out}) does not fit the {data.task!r} cache "
                f"({data.vocab.n_out} outputs): is it a cache of another task's model?"
            )
        if data.z.shape[1:3] != (model.cfg.n_layers, model.cfg.n_heads):
            raise TaskError(
                f"{what} caches {data.z.shape[1]} layer(s) x {data.z.shape[2]} head(s), but the model has "
                f"{model.cfg.n_layers} x {model.cfg.n_heads}: is it the cache of another model?"
            )
        check_finite_parameters(model)
        return dev
    if not isinstance(data, TaskData):
        raise TaskError(
            f"{what} must be task data (interp.TaskData; interp.task_data builds it from tokens) or an AnswerCache, "
            f"got {type(data).__name__}"
        )
    check_model_data(model, data, task)
    return dev


def cache_answer(
    model: HookedTransformer,
    data: TaskData,
    *,
    attention: bool = True,
    method: str = "auto",
    task: Task | None = None,
    batch_size: int | None = None,
    device: str | None = None,
) -> AnswerCache:
    """Head outputs ``z``, the layer-0 residual input and (optionally) the log attention row at every
    example's answer position, from one chunked pass without gradients (``batch_size``: examples per forward,
    None: as many as the memory budget allows)."""
    if not isinstance(data, TaskData):
        raise TaskError(f"cache_answer takes task data (interp.TaskData), got {type(data).__name__}")
    check_inputs(model, data, task=task, device=device, batch_size=batch_size)
    return _collect(model, data, attention, method, batch_size)


def _collect(
    model: HookedTransformer, data: TaskData, attention: bool, method: str, batch_size: int | None
) -> AnswerCache:
    """:func:`cache_answer` without the checks (its caller ran them)."""
    method = resolve_method(model, method)
    n_layers = model.cfg.n_layers
    one = _query_chunk if method == "fast" else _hooks_chunk

    def fn(chunk: TaskData) -> dict[str, Tensor]:
        with torch.inference_mode():
            return one(model, chunk, attention)

    out = map_chunks(model, data, fn, batch_size=batch_size)
    device = out["z"].device
    data = data.to(device)
    log_attn = None
    if attention:
        # chunks were padded with zeros along positions (dim 1): restore -inf beyond each answer query
        la = out["log_attn"]  # [b, t, layer, head]
        t = la.shape[1]
        future = torch.arange(t, device=device)[None, :] > data.answer_pos[:, None]
        la = la.masked_fill(future[:, :, None, None], float("-inf"))
        log_attn = la.permute(0, 2, 3, 1).contiguous()
        assert log_attn.shape[1] == n_layers
    return AnswerCache(
        task=data.task,
        z=out["z"],
        resid_pre=out["resid_pre"],
        log_attn=log_attn,
        tokens=data.tokens,
        labels=data.labels,
        answer_pos=data.answer_pos,
        vocab=data.vocab,
        data=data,
    )


def _hooks_chunk(model: HookedTransformer, chunk: TaskData, attention: bool) -> dict[str, Tensor]:
    L = model.cfg.n_layers
    names = ["blocks.0.hook_resid_pre"] + [f"blocks.{l}.attn.hook_z" for l in range(L)]
    if attention:
        names += [f"blocks.{l}.attn.hook_attn_scores" for l in range(L)]
    _, cache = model.run_with_cache(chunk.tokens, names_filter=names)
    rows = torch.arange(len(chunk), device=chunk.tokens.device)
    ap = chunk.answer_pos
    out = {
        "z": torch.stack([cache[f"blocks.{l}.attn.hook_z"][rows, ap] for l in range(L)], dim=1),
        "resid_pre": cache["blocks.0.hook_resid_pre"][rows, ap],
    }
    if attention:
        # hook_attn_scores is already causally masked (-inf after the query); log_softmax = log pattern
        scores = torch.stack([cache[f"blocks.{l}.attn.hook_attn_scores"][rows, :, ap] for l in range(L)], dim=1)
        out["log_attn"] = scores.float().log_softmax(-1).permute(0, 3, 1, 2)  # [b, t, layer, head]
    return out


def _query_chunk(model: HookedTransformer, chunk: TaskData, attention: bool) -> dict[str, Tensor]:
    ap = chunk.answer_pos
    x, scores, v = query_attention(model, chunk.tokens, ap[:, None])  # [b,t,d], [b,h,1,t], [b,h,t,e]
    log_attn = scores.float().log_softmax(-1)  # log space keeps tiny attention weights exact for w01/w02
    # the pattern as exp(log_softmax), the numbers every cached path was tested with; a row with no key (a sparse
    # mask's or a relu kernel's: NaN here) attends to nothing, as in TransformerLens
    pattern = log_attn.exp().nan_to_num(nan=0.0)
    z = torch.einsum("bhkt,bhte->bkhe", pattern.to(v.dtype), v)  # [b, 1 (layer), h, e]
    out = {"z": z, "resid_pre": x[torch.arange(len(chunk), device=ap.device), ap]}
    if attention:
        out["log_attn"] = log_attn.permute(0, 3, 2, 1)  # [b, t, layer, head]
    return out


def as_cache(
    model: HookedTransformer,
    data,
    *,
    attention: bool = True,
    method: str = "auto",
    batch_size: int | None = None,
) -> AnswerCache:
    """``data`` itself if it is already an :class:`AnswerCache` (with attention if needed), else its cache. No
    checks: the public entry that calls it ran :func:`check_inputs`."""
    if isinstance(data, AnswerCache):
        if attention and data.log_attn is None:
            raise InterpError("this AnswerCache has no attention rows; build it with cache_answer(..., attention=True)")
        return data
    return _collect(model, data, attention, method, batch_size)
