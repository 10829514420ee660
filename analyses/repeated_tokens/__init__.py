"""The repeated-tokens task's own analyses (Elhage et al. 2021 and Li, *A Mathematical Framework for Transformer
Circuits*): its probe data (:func:`probe_tokens`), clean/corrupted pairs for patching (:func:`corrupted_pair`), the
hand-built induction circuit (``handbuilt``) and the task's
``analyze``/``report`` suite."""

from __future__ import annotations

from .corrupt import corrupted_pair
from .probe import PROBE_SEED, probe_tokens

__all__ = ["PROBE_SEED", "corrupted_pair", "probe_tokens"]
