"""Slow, plain reference implementations: the oracles the tests and benchmarks compare the batched analyses with.

Each runs one ``run_with_hooks`` per head subset, per (sender, receiver, input), ..., written as plainly as possible
and independently of the batched code paths (its own hooks, not :func:`interp.ablation.ablation_hooks`), so that a
test of an analysis against its oracle checks the batching, the caching and the shortcuts, not the same code twice.
They are not part of ``interp.analyses.__all__``: use the analyses themselves for work.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from jaxtyping import Float
from torch import Tensor

from interp.device import model_device
from interp.evaluation import map_chunks
from interp.heads import head_mask

from .answer_cache import check_model_data
from .learned_accuracies import LearnedAccuracy, mean_head_outputs, subsets_of
from .patching import QKV, variant_metric

if TYPE_CHECKING:
    from collections.abc import Callable

    from transformer_lens import HookedTransformer

    from interp.task import Task, TaskData

__all__ = ["learned_accuracy_loop", "path_patching_loop", "variant_metric"]


def learned_accuracy_loop(
    model: HookedTransformer,
    data: TaskData,
    *,
    heads: object = None,
    ablation: str = "zero",
    reference: TaskData | None = None,
    task: Task | None = None,
) -> LearnedAccuracy:
    """Learned accuracy (:func:`interp.analyses.learned_accuracy`) the slow way: one ``run_with_hooks`` pass over
    the data per head set, with a ``hook_z`` hook written here that multiplies each head's output by 1 (kept) or 0
    (ablated), or replaces it by its mean output (``ablation="mean"``)."""
    check_model_data(model, data, task)
    cfg = model.cfg
    parsed = subsets_of(model, heads)
    device = model_device(model)
    z_ref = None
    if ablation == "mean":
        z_ref = mean_head_outputs(model, reference if reference is not None else data).to(device)
    accs = []
    for subset in parsed:
        mask = head_mask([subset], cfg.n_layers, cfg.n_heads, device)[0]

        def fn(chunk: TaskData, mask: Tensor = mask) -> dict[str, Tensor]:
            hooks = []
            for l in range(cfg.n_layers):

                def hook(z, hook, l=l):
                    m = mask[l][None, None, :, None]
                    return z * m if z_ref is None else z * m + z_ref[l][None, None] * (1 - m)

                hooks.append((f"blocks.{l}.attn.hook_z", hook))
            with torch.inference_mode():
                logits = model.run_with_hooks(chunk.tokens, fwd_hooks=hooks)
            rows = torch.arange(len(chunk), device=logits.device)
            return {"ok": logits[rows, chunk.answer_pos].argmax(-1) == chunk.labels}

        accs.append(map_chunks(model, data, fn)["ok"].float().mean())
    return LearnedAccuracy(parsed, torch.stack(accs), ablation, len(data))


def path_patching_loop(
    model: HookedTransformer,
    data: TaskData,
    *,
    corrupted: TaskData,
    metric: Callable,
    senders,
    receivers,
    direction: str = "denoising",
) -> Float[Tensor, "sender receiver qkv"]:
    """Path patching (:func:`interp.analyses.path_patching`) the slow way: one ``run_with_hooks`` per (sender,
    receiver, input), adding the sender head's change of output (``hook_z`` through its ``W_O``) to that one
    receiver's query, key or value input only (``data``: the clean run). ``metric`` maps logits to a number;
    ``senders``/``receivers`` are ``(layer, head)`` pairs. Under grouped-query attention a receiver's key and value
    input is that of its key/value head (shared by its group of query heads)."""
    clean = data
    base, source = (corrupted, clean) if direction == "denoising" else (clean, corrupted)
    out = torch.full((len(senders), len(receivers), 3), float("nan"))
    n_kv = getattr(model.cfg, "n_key_value_heads", None) or model.cfg.n_heads
    group = model.cfg.n_heads // n_kv
    with torch.inference_mode():
        _, bc = model.run_with_cache(base.tokens)
        _, sc = model.run_with_cache(source.tokens)
    model.set_use_split_qkv_input(True)
    try:
        with torch.inference_mode():
            for i, (sl, sh) in enumerate(senders):
                z = f"blocks.{sl}.attn.hook_z"
                delta = (sc[z][:, :, sh] - bc[z][:, :, sh]) @ model.W_O[sl, sh]
                for j, (rl, rh) in enumerate(receivers):
                    if rl <= sl:
                        continue
                    for k, letter in enumerate(QKV):
                        at = rh if letter == "q" else rh // group

                        def add(x, hook, at=at, delta=delta):
                            x = x.clone()
                            x[:, :, at] += delta
                            return x

                        logits = model.run_with_hooks(
                            base.tokens, fwd_hooks=[(f"blocks.{rl}.hook_{letter}_input", add)]
                        )
                        out[i, j, k] = float(metric(logits))
    finally:
        model.set_use_split_qkv_input(False)
    return out
