"""What a training step computes its loss on, and how its batch is laid out (``TrainConfig.objective`` and
``TrainConfig.padding``), for both trainers.

**The objective.** ``answer`` (the default) puts the loss on the task's target positions (``TaskData.targets``: on
noisy majority the answer after ``=`` and the ``[EOS]`` after it). ``lm`` trains the model as the generative
transformer Fraknói 2024 (*Solving Mathematical Problems with Transformers*, §2.5-2.6) describes: next-token
cross-entropy at every position of the sentence, the prompt's digits included, averaged over the batch's tokens
(:func:`lm_targets`). Evaluation is the task's either way (accuracy of the answer).

**Padding.** ``right`` (the default) pads a batch's sentences after their last token, where a causal model never
looks. ``left`` pads them before their first token to the batch's longest, with no padding mask, so every position
attends to the pads too (a pad is one more token to count): what a hand-written pipeline that left-pads and forgets
the mask computes. Validation and test are then padded the same way, in batches of ``batch_size`` consecutive
sentences (:func:`eval_pads`). Positions inside a sentence are counted from its first token (:func:`left_pad`
returns them), so a pad has a negative position.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from jaxtyping import Int
from torch import Tensor

from .errors import ConfigError
from .task import IGNORE, TaskData

if TYPE_CHECKING:
    from .task import Task


def lm_targets(data: TaskData) -> Int[Tensor, "batch pos"]:
    """Next-token targets at every position ``p`` with ``p + 1 < length`` (``IGNORE`` elsewhere): each token of the
    sentence after the first is predicted from the ones before it."""
    t = data.tokens.shape[1]
    targets = torch.full_like(data.tokens, IGNORE)
    if t > 1:
        pos = torch.arange(t - 1, device=data.device)[None]
        keep = pos + 1 < data.lengths[:, None]
        targets[:, :-1] = torch.where(keep, data.tokens[:, 1:], torch.full_like(data.tokens[:, 1:], IGNORE))
    return targets


def check_lm_targets(task: Task, data: TaskData) -> None:
    """Refuse, before training, the ``lm`` objective on a task whose sentences hold tokens the model cannot output
    (ids at or beyond ``task.vocab.n_out``, e.g. integer addition's ``+`` and ``=``, modular addition's ``=``): every
    next token is a target there, and such a target has no logit. One ConfigError naming the tokens."""
    targets = lm_targets(data)
    bad = targets[(targets != IGNORE) & (targets >= task.vocab.n_out)]
    if bad.numel():
        names = ", ".join(repr(task.vocab.tokens[i]) for i in sorted(set(bad.tolist())))
        raise ConfigError(
            f"objective='lm' predicts every next token of a sentence, but {task.name}'s sentences hold tokens the "
            f"model cannot output ({names}: input-only, beyond its {task.vocab.n_out} outputs); train it with "
            "objective='answer'"
        )


def left_pad(
    tokens: Int[Tensor, "batch pos"], targets: Int[Tensor, "batch pos"], lengths: Int[Tensor, " batch"], pad: int
) -> tuple[Int[Tensor, "batch pos"], Int[Tensor, "batch pos"], Int[Tensor, "batch pos"]]:
    """Right-padded ``tokens`` and ``targets`` moved to the right end of the same width (``pad`` tokens and
    ``IGNORE`` targets before them), and each position's place in its sentence (negative on the pads)."""
    b, t = tokens.shape
    shift = (t - lengths)[:, None]  # pads before each sentence
    pos = torch.arange(t, device=tokens.device)[None].expand(b, t)
    src = (pos - shift).clamp(min=0)
    inside = pos >= shift
    out_tok = torch.where(inside, tokens.gather(1, src), torch.full_like(tokens, pad))
    out_tgt = torch.where(inside, targets.gather(1, src), torch.full_like(targets, IGNORE))
    return out_tok, out_tgt, pos - shift


def eval_pads(lengths: Int[Tensor, " n"], batch_size: int) -> Int[Tensor, " n"]:
    """Pads before each sentence when ``n`` sentences are left-padded in batches of ``batch_size`` consecutive ones
    (as validation and test are under ``padding="left"``)."""
    n = len(lengths)
    pads = torch.empty_like(lengths)
    for start in range(0, n, batch_size):
        chunk = lengths[start : start + batch_size]
        pads[start : start + batch_size] = chunk.max() - chunk
    return pads
