"""The integrity checks of checkpoint files: checksums of the weights and of the metadata, and the checks of weights
behind them (finite values, the parameters a model spec fixes, the attention variant's constraints).

Used when loading (:mod:`interp.checkpoint`) and when saving (:func:`interp.rebuild.check_rebuilds` refuses a model
whose weights a loader would refuse).
"""

from __future__ import annotations

import hashlib
import json
from typing import TYPE_CHECKING, Any

import torch

from .errors import CheckpointError

if TYPE_CHECKING:
    from .configs import ModelSpec


def tensor_checksum(tensors: dict[str, torch.Tensor]) -> str:
    """``sha256:<hex>`` over every tensor in name order: its name, dtype, shape and raw bytes."""
    h = hashlib.sha256()
    for name in sorted(tensors):
        t = tensors[name].detach().to("cpu").contiguous()
        h.update(f"{name}|{t.dtype}|{tuple(t.shape)}|".encode())
        h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    return "sha256:" + h.hexdigest()


def metadata_checksum(name: str, value: Any, checksum: str) -> str:
    """``sha256:<hex>`` of metadata field ``name``: its canonical JSON (sorted keys, no spaces) and the tensor
    ``checksum`` of the same file (so metadata moved onto other weights fails too)."""
    text = json.dumps(value, sort_keys=True, separators=(",", ":"))
    return "sha256:" + hashlib.sha256(f"{name}|{text}|{checksum}".encode()).hexdigest()


def verify_tensors(
    path,
    tensors: dict[str, torch.Tensor],
    spec: ModelSpec | None,
    checksum: str | None,
    parameters,
    why: str = "the file is corrupt or was edited",
) -> None:
    """One clear CheckpointError, naming the tensor, for corrupted weights: a checksum that does not match,
    non-finite values in a parameter (buffers such as TransformerLens' ``IGNORE = -inf`` are not weights), or a
    parameter the spec fixes (where there is one) that holds another value (``why`` ends that message)."""
    from .model import frozen_values

    if checksum is not None and tensor_checksum(tensors) != checksum:
        bad = [k for k in parameters if k in tensors and not bool(torch.isfinite(tensors[k]).all())]
        hint = f" (non-finite values in {bad[0]})" if bad else ""
        raise CheckpointError(
            f"{path}: the weights do not match the checksum in the metadata{hint}: the file is corrupt"
        )
    for name in parameters:
        t = tensors.get(name)
        if t is not None and t.is_floating_point() and not bool(torch.isfinite(t).all()):
            raise CheckpointError(f"{path}: tensor {name} holds NaN or infinite values")
    if spec is None:
        return
    for name, value in frozen_values(spec, {k: tuple(v.shape) for k, v in tensors.items()}).items():
        if name in tensors and not torch.equal(tensors[name].float(), value):
            raise CheckpointError(
                f"{path}: tensor {name} is fixed by the model spec ({_what_fixed(name)}) but holds other values: {why}"
            )
    from .attention import verify_tensors as verify_attention

    verify_attention(path, tensors, spec, why)  # Q/K/V zeros and low-rank products


def _what_fixed(name: str) -> str:
    if name.endswith("W_pos"):
        return "zero: no positional embedding"
    if name.endswith("W_O"):
        return "the identity: no output matrix"
    return "zero: no bias"
