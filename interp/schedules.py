"""The learning-rate warmup of both trainers: the factor the learning rate is multiplied by at each step.

``linear`` (the default): ``min(1, (t + 1) / L)`` over the first ``L = TrainConfig.warmup`` steps (``2 / (1 -
beta2)`` by default: Ma & Yarats 2021, *On the adequacy of untuned warmup for adaptive optimization*, the "untuned
linear warmup" Fraknói 2024 §5.2 says it used). ``exp``: ``1 - exp(-2 (t + 1) / L)``, at the default length Ma and
Yarats' untuned exponential warmup ``1 - exp(-(1 - beta2) t)`` (their rule of thumb: the exponential warmup with
time constant ``1 / (1 - beta2)`` and the linear one over twice that are equivalent), which the seed's reference
[22] names first. One function, so the solo and the batched trainer cannot differ.
"""

from __future__ import annotations

import math

from .configs import TrainConfig


def warmup_factor(cfg: TrainConfig, step: int) -> float:
    """The learning-rate factor of optimizer step ``step`` (counted from 0) under ``cfg``'s warmup."""
    length = cfg.warmup
    if length <= 0:
        return 1.0
    if cfg.warmup_shape == "exp":
        return 1.0 - math.exp(-2.0 * (step + 1) / length)
    return min(1.0, (step + 1) / length)
