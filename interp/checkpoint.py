"""Checkpoints: one ``.safetensors`` file holding the weights and JSON metadata.

Metadata keys (all JSON strings): ``format`` ("interp-checkpoint"), ``format_version``, ``model_spec``
(:class:`interp.model.ModelSpec`), ``task`` (name and parameters), ``training`` (provenance: seed,
epochs, best epoch, accuracies, wall time, device, versions). Loading never unpickles anything.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from .errors import CheckpointError, InterpError
from .files import atomic_write

FORMAT = "interp-checkpoint"
FORMAT_VERSION = 1


@dataclass
class Checkpoint:
    """A loaded checkpoint: the model, its task, and everything the file says about them."""

    model: Any
    task: Any
    path: Path
    metadata: dict[str, Any] = field(default_factory=dict)

    @property
    def training(self) -> dict[str, Any]:
        return self.metadata.get("training", {})


def save_checkpoint(path, model, task, training: dict[str, Any] | None = None) -> Path:
    """Write ``model`` (with its ``interp_spec``) and ``task`` to ``path`` atomically."""
    from safetensors.torch import save_file

    spec = getattr(model, "interp_spec", None)
    if spec is None:
        raise CheckpointError("the model has no interp_spec; build it with interp.model.build_model")
    tensors = {k: v.detach().to("cpu").contiguous() for k, v in model.state_dict().items()}
    metadata = {
        "format": FORMAT,
        "format_version": str(FORMAT_VERSION),
        "model_spec": json.dumps(spec.to_dict()),
        "task": json.dumps({"name": task.name, "params": task.params()}),
        "training": json.dumps(training or {}),
    }
    path = Path(path)
    atomic_write(path, lambda tmp: save_file(tensors, tmp, metadata=metadata), "the checkpoint")
    return path


def resolve(path_or_name) -> Path:
    """A file path, or the name of a shipped checkpoint (``noisy-majority``) -> its path."""
    from tasks import shipped_checkpoints

    p = Path(path_or_name)
    if p.is_file():
        return p
    shipped = shipped_checkpoints()
    if str(path_or_name) in shipped:
        return shipped[str(path_or_name)]
    if p.exists():
        raise CheckpointError(f"checkpoint {p} is not a regular file")
    names = ", ".join(shipped) or "none"
    raise CheckpointError(f"no checkpoint file {str(path_or_name)!r}, and no shipped checkpoint of that name (shipped: {names})")


def _sniff(path: Path) -> None:
    """Give a specific error for files that are clearly not safetensors (pickles, zips, empty)."""
    with open(path, "rb") as f:
        head = f.read(16)
    if not head:
        raise CheckpointError(f"{path} is empty; expected an interp .safetensors checkpoint")
    if head[:1] == b"\x80" or head[:2] == b"PK":
        raise CheckpointError(
            f"{path} looks like a pickle / torch.save file; interp only loads .safetensors checkpoints "
            "and never unpickles"
        )
    if len(head) < 8:
        raise CheckpointError(f"{path} is truncated ({len(head)} bytes); expected a .safetensors checkpoint")
    header_len = int.from_bytes(head[:8], "little")
    size = path.stat().st_size
    if header_len <= 0 or header_len > size - 8:
        raise CheckpointError(
            f"{path} is not a valid .safetensors file (header of {header_len} bytes in a {size}-byte file): "
            "truncated or another format"
        )


def read_metadata(path) -> dict[str, Any]:
    """The parsed metadata of a checkpoint file, validated; no weights are read."""
    from safetensors import safe_open

    path = resolve(path)
    _sniff(path)
    try:
        with safe_open(str(path), "pt") as f:
            raw = f.metadata() or {}
    except Exception as e:  # safetensors raises its own error types for corrupt headers
        raise CheckpointError(f"{path} is not a valid .safetensors file: {e}") from None
    if raw.get("format") != FORMAT:
        raise CheckpointError(f"{path} is a .safetensors file but not an interp checkpoint (no format={FORMAT!r} metadata)")
    version = raw.get("format_version")
    if version != str(FORMAT_VERSION):
        raise CheckpointError(f"{path} has checkpoint format version {version}; this toolkit reads version {FORMAT_VERSION}")
    try:
        meta = {k: json.loads(raw[k]) for k in ("model_spec", "task", "training")}
    except (KeyError, json.JSONDecodeError) as e:
        raise CheckpointError(f"{path} has missing or malformed metadata ({e})") from None
    meta["format_version"] = FORMAT_VERSION
    return meta


def load_checkpoint(path_or_name, device: str | None = None, expect_task: str | None = None) -> Checkpoint:
    """Load a checkpoint by path or shipped name onto ``device`` (default: CUDA if present, else CPU)."""
    from safetensors.torch import load_file

    from tasks import get_task

    from .device import pick_device
    from .model import ModelSpec, build_model

    path = resolve(path_or_name)
    meta = read_metadata(path)
    try:
        spec = ModelSpec.from_dict(meta["model_spec"])
    except InterpError as e:
        raise CheckpointError(f"{path}: bad model spec in metadata: {e}") from None
    task_meta = meta["task"]
    if expect_task is not None and task_meta.get("name") != expect_task:
        raise CheckpointError(f"{path} is a checkpoint of task {task_meta.get('name')!r}, expected {expect_task!r}")
    try:
        task = get_task(task_meta["name"], **task_meta.get("params", {}))
    except InterpError as e:
        raise CheckpointError(f"{path}: {e}") from None
    device = pick_device(device)
    try:
        tensors = load_file(str(path), device="cpu")
    except Exception as e:
        raise CheckpointError(f"{path}: cannot read the weights ({e}); the file is truncated or corrupt") from None
    model = build_model(spec, device="cpu")
    expected = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    got = {k: tuple(v.shape) for k, v in tensors.items()}
    if expected != got:
        missing = sorted(set(expected) - set(got))
        extra = sorted(set(got) - set(expected))
        shapes = sorted(k for k in set(expected) & set(got) if expected[k] != got[k])
        detail = "; ".join(
            s for s in (
                f"missing {missing[:5]}" if missing else "",
                f"unexpected {extra[:5]}" if extra else "",
                ", ".join(f"{k}: file {got[k]} vs spec {expected[k]}" for k in shapes[:5]),
            ) if s
        )
        raise CheckpointError(f"{path}: the weights do not match the model spec in its metadata ({detail})")
    model.load_state_dict(tensors, strict=True)
    if device != "cpu":
        model.to(device, print_details=False)
    model.eval()
    model.interp_task = task
    model.interp_checkpoint = str(path)
    return Checkpoint(model=model, task=task, path=path, metadata=meta)


def load(path_or_name, device: str | None = None):
    """``model, task = interp.load("noisy-majority")``: a HookedTransformer and its task."""
    ckpt = load_checkpoint(path_or_name, device=device)
    return ckpt.model, ckpt.task
