"""Curriculum training: the examples a training step may draw widen on a schedule of steps ("simple to complex").

``TrainConfig.curriculum`` spells the schedule as ``FIELD:LEVEL@STEP,LEVEL@STEP,...``, e.g.
``n_digits:1@0,2@300,3@600``: from step 0 only training examples whose per-example field ``n_digits`` (one of the
task data's ``fields``) is at most 1, from step 300 at most 2, from step 600 at most 3 (Bengio et al. 2009,
*Curriculum Learning*; Ibrahimli 2024 names it among the compositional learning strategies; Garg et al. 2022 and
Fan et al. 2024 widen the input length so). The first step must be 0 and steps and levels must rise.

A curriculum run draws each batch from the examples its step allows, uniformly without replacement inside the
batch, from the run's data-order generator; an epoch keeps the number and sizes of the batches of a run without a
curriculum (so the two see as many examples and take as many steps). The levels of each step's batch are recorded
in the run's history (``batch_levels``: the largest level in each batch), so the schedule a checkpoint followed can
be read back batch by batch.

This module parses without torch (:mod:`interp.configs` checks the spelling); :func:`batches` draws the batches.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from itertools import pairwise
from typing import TYPE_CHECKING

from .errors import ConfigError

if TYPE_CHECKING:
    import torch

SPELLING = "FIELD:LEVEL@STEP,LEVEL@STEP,... (e.g. n_digits:1@0,2@300,3@600: the first step 0, steps and levels rising)"


@dataclass(frozen=True)
class Curriculum:
    """A parsed schedule: the per-example ``field`` and the ``(step, level)`` stages, by rising step."""

    field: str
    stages: tuple[tuple[int, int], ...]

    def level_at(self, step: int) -> int:
        """The largest level allowed at ``step`` (0-based count of training steps done before it)."""
        level = self.stages[0][1]
        for start, lv in self.stages:
            if step >= start:
                level = lv
        return level

    def __str__(self) -> str:
        return f"{self.field}:" + ",".join(f"{lv}@{st}" for st, lv in self.stages)


def parse_curriculum(text: str) -> Curriculum:
    """``"n_digits:1@0,2@300"`` -> :class:`Curriculum`; a ConfigError naming the spelling otherwise."""
    if not isinstance(text, str) or ":" not in text:
        raise ConfigError(f"curriculum must be {SPELLING}, got {text!r}")
    field, _, rest = text.partition(":")
    stages = []
    try:
        for item in rest.split(","):
            level, _, step = item.partition("@")
            stages.append((int(step), int(level)))
    except ValueError:
        raise ConfigError(f"curriculum must be {SPELLING}, got {text!r}") from None
    steps, levels = [s for s, _ in stages], [lv for _, lv in stages]
    ok = (
        field.isidentifier()
        and steps[0] == 0
        and all(b > a for a, b in pairwise(steps))
        and all(b > a for a, b in pairwise(levels))
    )
    if not ok:
        raise ConfigError(f"curriculum must be {SPELLING}, got {text!r}")
    return Curriculum(field, tuple(stages))


def batches(
    curriculum: Curriculum,
    levels: torch.Tensor,
    sizes: Sequence[int],
    first_step: int,
    generator: torch.Generator,
) -> Iterator[torch.Tensor]:
    """One epoch of batches under ``curriculum``: for each size in ``sizes`` (the epoch's batch sizes), the indices of
    that many examples drawn without replacement from those whose ``levels`` (the field's per-example values) are at
    most the level of the batch's step (``first_step``, ``first_step + 1``, ...); every draw from ``generator``. A
    step whose level admits no example raises a ConfigError naming it."""
    import torch

    cpu_levels = levels.cpu()
    for k, size in enumerate(sizes):
        level = curriculum.level_at(first_step + k)
        pool = (cpu_levels <= level).nonzero().squeeze(1)
        if len(pool) == 0:
            raise ConfigError(
                f"curriculum {curriculum}: at step {first_step + k} the level is {level}, and no training example has "
                f"{curriculum.field} <= {level} (the smallest is {int(cpu_levels.min())})"
            )
        pick = torch.randperm(len(pool), generator=generator)[: min(size, len(pool))]
        yield pool[pick].to(levels.device)
