"""Checkpoints: one ``.safetensors`` file holding the weights and JSON metadata.

Metadata keys (all JSON strings): ``format`` ("interp-checkpoint"), ``format_version``, ``model_spec``
(:class:`interp.model.ModelSpec`), ``tl_config`` (the same model in TransformerLens' own
``HookedTransformerConfig`` field names, so the file opens with no code of ours), ``task`` (name and
parameters), ``training`` (provenance: seed, epochs, best epoch, accuracies, wall time, device, versions) and
``checksum`` (SHA-256 of the tensor data, see :func:`tensor_checksum`). Loading never unpickles anything and
verifies the file: the checksum (files written before it existed have none and still load), the parameters the
spec fixes (zero ``W_pos``, identity ``W_O``, zero biases) and that every weight is finite.

This module is the file format only: it knows no task. :func:`read_checkpoint` takes a ``make_task(name, params)``
that builds the task a file names (the registry's ``get_task``, or your own); ``interp.tasks.load_checkpoint`` also
resolves the names of the checkpoints that ship with the project.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from .errors import CheckpointError, InterpError
from .files import atomic_write
from .model import ModelSpec
from .task import Task

if TYPE_CHECKING:
    from transformer_lens import HookedTransformer

FORMAT = "interp-checkpoint"
FORMAT_VERSION = 1


@dataclass
class Checkpoint:
    """A model paired with its task, and what is known about them (a loaded file, or your own model:
    ``Checkpoint(model, task)`` lets every suite and report take a HookedTransformer trained anywhere)."""

    model: HookedTransformer
    task: Task
    path: Path | None = None
    metadata: dict[str, Any] = field(default_factory=dict)
    spec: ModelSpec | None = None  # the spec the model was built from, when known

    @property
    def training(self) -> dict[str, Any]:
        return self.metadata.get("training", {})

    @property
    def name(self) -> str:
        return str(self.path) if self.path is not None else f"a {self.task.name} model"


def tensor_checksum(tensors: dict[str, torch.Tensor]) -> str:
    """``sha256:<hex>`` over every tensor in name order: its name, dtype, shape and raw bytes."""
    h = hashlib.sha256()
    for name in sorted(tensors):
        t = tensors[name].detach().to("cpu").contiguous()
        h.update(f"{name}|{t.dtype}|{tuple(t.shape)}|".encode())
        h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    return "sha256:" + h.hexdigest()


def save_checkpoint(
    path, model: HookedTransformer, spec: ModelSpec, task: Task, training: dict[str, Any] | None = None
) -> Path:
    """Write ``model`` (built from ``spec``) and ``task`` to ``path`` atomically, with the checksum of its weights
    and its TransformerLens config."""
    from safetensors.torch import save_file

    from .attention import sync

    sync(model)  # low-rank Q/K/V: TransformerLens' matrices hold the product of the factors
    tensors = {k: v.detach().to("cpu").contiguous() for k, v in model.state_dict().items()}
    tl_config = {k: v for k, v in spec.tl_config_kwargs(None).items() if k != "device"}
    metadata = {
        "format": FORMAT,
        "format_version": str(FORMAT_VERSION),
        "model_spec": json.dumps(spec.to_dict()),
        "tl_config": json.dumps(tl_config),
        "task": json.dumps({"name": task.name, "params": task.params()}),
        "training": json.dumps(training or {}),
        "checksum": tensor_checksum(tensors),
    }
    path = Path(path)
    atomic_write(path, lambda tmp: save_file(tensors, tmp, metadata=metadata), "the checkpoint")
    return path


def _existing_file(path) -> Path:
    """``path`` as a Path, or a CheckpointError saying what is there instead of a file."""
    p = Path(path)
    if p.is_file():
        return p
    if p.exists():
        raise CheckpointError(f"checkpoint {p} is not a regular file")
    raise CheckpointError(f"no checkpoint file {str(path)!r}")


def _sniff(path: Path) -> None:
    """Give a specific error for files that are clearly not safetensors (pickles, zips, empty)."""
    with open(path, "rb") as f:
        head = f.read(16)
    if not head:
        raise CheckpointError(f"{path} is empty; expected an interp .safetensors checkpoint")
    size = path.stat().st_size
    header_len = int.from_bytes(head[:8], "little") if len(head) >= 8 else 0
    looks_safetensors = 0 < header_len <= size - 8 and head[8:9] == b"{"
    # a pickle starts with 0x80 (protocol 2+) and a torch.save zip with "PK"; a safetensors header length's low
    # byte can be 0x80 too, so only a file that is not a plausible safetensors file is called a pickle
    if not looks_safetensors and (head[:1] == b"\x80" or head[:2] == b"PK"):
        raise CheckpointError(
            f"{path} looks like a pickle / torch.save file; interp only loads .safetensors checkpoints "
            "and never unpickles"
        )
    if len(head) < 8:
        raise CheckpointError(f"{path} is truncated ({len(head)} bytes); expected a .safetensors checkpoint")
    if header_len <= 0 or header_len > size - 8:
        raise CheckpointError(
            f"{path} is not a valid .safetensors file (header of {header_len} bytes in a {size}-byte file): "
            "truncated or another format"
        )


def read_metadata(path) -> dict[str, Any]:
    """The parsed metadata of a checkpoint file, validated; no weights are read."""
    from safetensors import safe_open

    path = _existing_file(path)
    _sniff(path)
    try:
        with safe_open(str(path), "pt") as f:
            raw = f.metadata() or {}
    except Exception as e:  # safetensors raises its own error types for corrupt headers
        raise CheckpointError(f"{path} is not a valid .safetensors file: {e}") from None
    if raw.get("format") != FORMAT:
        raise CheckpointError(
            f"{path} is a .safetensors file but not an interp checkpoint (no format={FORMAT!r} metadata)"
        )
    version = raw.get("format_version")
    if version != str(FORMAT_VERSION):
        raise CheckpointError(
            f"{path} has checkpoint format version {version}; this toolkit reads version {FORMAT_VERSION}"
        )
    try:
        meta = {k: json.loads(raw[k]) for k in ("model_spec", "task", "training")}
    except (KeyError, json.JSONDecodeError) as e:
        raise CheckpointError(f"{path} has missing or malformed metadata ({e})") from None
    meta["format_version"] = FORMAT_VERSION
    meta["checksum"] = raw.get("checksum")
    if "tl_config" in raw:
        try:
            meta["tl_config"] = json.loads(raw["tl_config"])
        except json.JSONDecodeError as e:
            raise CheckpointError(f"{path} has malformed metadata ({e})") from None
    return meta


def verify_tensors(path, tensors: dict[str, torch.Tensor], spec: ModelSpec, checksum: str | None, parameters) -> None:
    """One clear CheckpointError, naming the tensor, for corrupted weights: a checksum that does not match,
    non-finite values in a parameter (buffers such as TransformerLens' ``IGNORE = -inf`` are not weights), or a
    parameter the spec fixes that holds another value."""
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
    for name, value in frozen_values(spec, {k: tuple(v.shape) for k, v in tensors.items()}).items():
        if name in tensors and not torch.equal(tensors[name].float(), value):
            raise CheckpointError(
                f"{path}: tensor {name} is fixed by the model spec ({_what_fixed(name)}) but holds "
                "other values: the file is corrupt or was edited"
            )
    from .attention import verify_tensors as verify_attention

    verify_attention(path, tensors, spec)  # Q/K/V zeros and low-rank products


def _what_fixed(name: str) -> str:
    if name.endswith("W_pos"):
        return "zero: no positional embedding"
    if name.endswith("W_O"):
        return "the identity: no output matrix"
    return "zero: no bias"


MakeTask = Callable[..., Task]  # make_task(name, **params) -> the task a checkpoint names


def read_checkpoint(
    path,
    make_task: MakeTask,
    device: str | None = None,
    expect_task: str | None = None,
    task_params: dict[str, Any] | None = None,
) -> Checkpoint:
    """Read and verify the checkpoint file at ``path`` onto ``device`` (default: CUDA if present, else CPU);
    ``make_task(name, **params)`` builds the task it names (``interp.tasks.get_task``).

    ``task_params`` override the task's saved parameters (e.g. ``{"test_lengths": [201, 400]}`` to test length
    generalisation); a model without positional embedding then takes the longer sequences."""
    from safetensors.torch import load_file

    from .device import pick_device
    from .model import build_model, extend_context

    path = _existing_file(path)
    meta = read_metadata(path)
    try:
        spec = ModelSpec.from_dict(meta["model_spec"])
    except InterpError as e:
        raise CheckpointError(f"{path}: bad model spec in metadata: {e}") from None
    task_meta = meta["task"]
    if expect_task is not None and task_meta.get("name") != expect_task:
        raise CheckpointError(f"{path} is a checkpoint of task {task_meta.get('name')!r}, expected {expect_task!r}")
    try:
        task = make_task(task_meta["name"], **{**task_meta.get("params", {}), **(task_params or {})})
    except InterpError as e:
        raise CheckpointError(f"{path}: {e}") from None
    device = pick_device(device)
    try:
        tensors = load_file(str(path), device="cpu")
    except Exception as e:
        raise CheckpointError(f"{path}: cannot read the weights ({e}); the file is truncated or corrupt") from None
    model = build_model(spec, device="cpu")
    _check_shapes(
        path,
        {k: tuple(v.shape) for k, v in model.state_dict().items()},
        {k: tuple(v.shape) for k, v in tensors.items()},
    )
    verify_tensors(path, tensors, spec, meta.get("checksum"), [n for n, _ in model.named_parameters()])
    model.load_state_dict(tensors, strict=True)
    if device != "cpu":
        model.to(device, print_details=False)
    model.eval()
    if task_params:
        extend_context(model, task.n_ctx)  # longer test sequences: NoPE models only, a clear error otherwise
    return Checkpoint(model=model, task=task, path=path, metadata=meta, spec=spec)


def _check_shapes(path: Path, expected: dict[str, tuple[int, ...]], got: dict[str, tuple[int, ...]]) -> None:
    """One CheckpointError naming the missing, unexpected and mis-shaped tensors, where the file's weights do not
    fit the model its spec builds."""
    if expected == got:
        return
    missing = sorted(set(expected) - set(got))
    extra = sorted(set(got) - set(expected))
    shapes = sorted(k for k in set(expected) & set(got) if expected[k] != got[k])
    detail = "; ".join(
        s
        for s in (
            f"missing {missing[:5]}" if missing else "",
            f"unexpected {extra[:5]}" if extra else "",
            ", ".join(f"{k}: file {got[k]} vs spec {expected[k]}" for k in shapes[:5]),
        )
        if s
    )
    raise CheckpointError(f"{path}: the weights do not match the model spec in its metadata ({detail})")
