"""The one place that chooses a device: CUDA when present, otherwise CPU."""

from __future__ import annotations

from typing import TYPE_CHECKING

from .errors import ConfigError

if TYPE_CHECKING:
    import torch
    from transformer_lens import HookedTransformer


def pick_device(requested: str | None = None) -> str:
    """Return the device to use: ``requested`` if given and available, else cuda, else cpu."""
    import torch

    if requested in (None, "", "auto"):
        return "cuda" if torch.cuda.is_available() else "cpu"
    kind = requested.split(":")[0]
    if kind == "cpu":
        return requested
    if kind == "cuda":
        if not torch.cuda.is_available():
            raise ConfigError(f"device {requested!r} was requested but CUDA is not available here; use 'cpu' or 'auto'")
        return requested
    if kind == "mps":
        if not (hasattr(torch.backends, "mps") and torch.backends.mps.is_available()):
            raise ConfigError(f"device {requested!r} was requested but MPS is not available here; use 'cpu' or 'auto'")
        return requested
    raise ConfigError(f"unknown device {requested!r}; expected 'auto', 'cpu', 'cuda', 'cuda:N' or 'mps'")


def model_device(model: HookedTransformer) -> torch.device:
    """The device the model's parameters live on."""
    return next(model.parameters()).device
