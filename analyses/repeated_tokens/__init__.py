"""The repeated-tokens task's own analyses (seed 003): its probe data (:func:`probe_tokens`), clean/corrupted pairs
for patching (:func:`corrupted_pair`), the hand-built induction circuit (``handbuilt``) and the task's
``analyze``/``report`` suite."""

from __future__ import annotations

from .corrupt import corrupted_pair
from .probe import PROBE_SEED, probe_tokens

__all__ = ["PROBE_SEED", "corrupted_pair", "probe_tokens"]
