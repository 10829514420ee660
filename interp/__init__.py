"""interp: a mechanistic-interpretability toolkit on TransformerLens for small algorithmic-task models.

``model, task = interp.load("noisy-majority")`` loads a shipped checkpoint (or any checkpoint path).
Heavy libraries (torch, TransformerLens) are imported only when first needed.
"""

from __future__ import annotations

__version__ = "0.1.0"
__all__ = ["load", "load_checkpoint", "save_checkpoint", "pick_device", "ModelSpec", "build_model"]


def __getattr__(name):
    if name in ("load", "load_checkpoint", "save_checkpoint"):
        from . import checkpoint

        return getattr(checkpoint, name)
    if name == "pick_device":
        from .device import pick_device

        return pick_device
    if name in ("ModelSpec", "build_model"):
        from . import model

        return getattr(model, name)
    raise AttributeError(f"module 'interp' has no attribute {name!r}")
