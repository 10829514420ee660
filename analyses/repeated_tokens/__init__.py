"""The repeated-tokens task's own analyses (seed 003): its probe data (:func:`probe_tokens`), the hand-built
induction circuit (``handbuilt``) and the task's ``analyze``/``report`` suite."""

from __future__ import annotations

from .probe import PROBE_SEED, probe_tokens

__all__ = ["PROBE_SEED", "probe_tokens"]
