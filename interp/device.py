"""The one place that chooses a device: CUDA when present, otherwise CPU."""

from __future__ import annotations

from typing import TYPE_CHECKING

from .errors import ConfigError

if TYPE_CHECKING:
    import torch
    from transformer_lens import HookedTransformer


def pick_device(requested: str | torch.device | None = None) -> str:
    """Return the device to use: ``requested`` if given and available, else cuda, else cpu. A device that is not
    there (``cuda:N`` beyond this machine's devices, CUDA or MPS without either) or is misspelt is a ConfigError
    naming it and what is expected, before anything is built on it."""
    import torch

    if isinstance(requested, torch.device):
        requested = str(requested)
    if requested is not None and not isinstance(requested, str):
        raise ConfigError(
            f"device must be a name such as 'cpu', 'cuda' or 'cuda:0', or a torch.device; "
            f"got {type(requested).__name__}"
        )
    if requested in (None, "", "auto"):
        return "cuda" if torch.cuda.is_available() else "cpu"
    kind, colon, index = requested.partition(":")
    if requested in ("cpu", "cpu:0"):
        return requested
    if kind == "cuda":
        if colon and not (index.isascii() and index.isdigit()):
            raise ConfigError(f"unknown device {requested!r}; expected 'cuda' or 'cuda:N' with N a device number")
        if not torch.cuda.is_available():
            raise ConfigError(f"device {requested!r} was requested but CUDA is not available here; use 'cpu' or 'auto'")
        if colon:
            n = torch.cuda.device_count()
            if int(index) >= n:
                have = "cuda:0" if n == 1 else f"cuda:0 to cuda:{n - 1}"
                raise ConfigError(f"device {requested!r} was requested but this machine has {n} CUDA device(s): {have}")
        return requested
    if kind == "mps" and not colon:
        if not (hasattr(torch.backends, "mps") and torch.backends.mps.is_available()):
            raise ConfigError(f"device {requested!r} was requested but MPS is not available here; use 'cpu' or 'auto'")
        return requested
    raise ConfigError(f"unknown device {requested!r}; expected 'auto', 'cpu', 'cuda', 'cuda:N' or 'mps'")


def model_device(model: HookedTransformer) -> torch.device:
    """The device the model's parameters live on."""
    return next(model.parameters()).device


def check_device(model: HookedTransformer, device: str | torch.device | None) -> torch.device:
    """The device an analysis of ``model`` runs on: the model's own (``device=None``); a ``device`` that differs
    from it is a ConfigError naming both (an analysis never moves a user's model)."""
    import torch

    here = model_device(model)
    if device is None or device == "auto":
        return here
    try:
        want = torch.device(device)
    except (RuntimeError, TypeError):
        raise ConfigError(
            f"unknown device {device!r}; expected None (the model's), 'cpu', 'cuda' or 'cuda:N'"
        ) from None
    same = want.type == here.type and (want.index is None or want.index == (here.index or 0))
    if not same:
        raise ConfigError(
            f"the model is on {here}, but device={str(device)!r} was asked for; pass device=None (the model's "
            f"device) or move the model first with model.to({str(device)!r})"
        )
    return here
