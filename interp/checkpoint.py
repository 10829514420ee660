"""Checkpoints: one ``.safetensors`` file holding the weights and JSON metadata; any ``HookedTransformer``.

Metadata keys (all JSON strings), format version 2:

- ``format`` (``"interp-checkpoint"``) and ``format_version`` (``"2"``);
- ``tl_config``: TransformerLens' whole ``HookedTransformerConfig`` (every field but ``device`` and ``n_devices``;
  ``dtype`` by name, see :mod:`interp.rebuild`): every architecture TransformerLens builds round-trips to equal
  logits, and the file opens in plain TransformerLens with no code of ours;
- ``model_spec``: the toolkit's :class:`interp.model.ModelSpec` where the model was built from one (attention variants,
  hook-based positions and frozen parameters are rebuilt by :func:`interp.model.build_model` from it), else ``null``;
- ``task`` (name and parameters) and ``training`` (provenance: seed, options, kept epoch, accuracies, history, wall
  time, device, versions);
- ``checksum``: SHA-256 of the tensor data (:func:`tensor_checksum`);
- ``metadata_checksums``: for each of :data:`COVERED` (``model_spec``, ``tl_config``, ``task``, ``training``) the
  SHA-256 of its canonical JSON together with ``checksum`` (:func:`metadata_checksum`). Everything that changes what
  the model computes is covered, so a file whose spec was edited (``linear:elu`` to ``window:3``, another
  ``attention_seed``) is refused, naming the field, and so is metadata moved onto other weights. The training
  provenance is covered too: its accuracies and history are what ``interp table``, the census and the reports print
  without recomputing them, and no tool edits a checkpoint's metadata in place (every writer re-saves through
  :func:`save_checkpoint`).

:func:`save_checkpoint` refuses a model the stored configuration does not describe, before writing
(:func:`interp.rebuild.check_rebuilds`: the model is rebuilt from what the file will hold, and its configuration,
modules, parameters, hooks and logits must be the model's).

Loading never unpickles anything and verifies the file: the metadata checksums, the tensor checksum, the parameters
the spec fixes (zero ``W_pos``, identity ``W_O``, zero biases), the attention variant's constraints and that every
weight is finite. A version-2 file without its checksums is refused. Version-1 files (written before the metadata was
covered: their ``checksum``, where present, covers the tensors only) still load, with a
:class:`interp.errors.CheckpointWarning` naming the file; one whose ``tl_config`` contradicts its ``model_spec`` is
refused. :func:`upgrade_checkpoint` re-saves one as version 2 (the same weights).

This module is the file format only: it knows no task. :func:`read_checkpoint` takes a ``make_task(name, params)``
that builds the task a file names (the registry's ``get_task``, or your own); ``interp.load_checkpoint``
(:mod:`interp.loading`) also resolves the names of registered checkpoints.
"""

from __future__ import annotations

import json
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .errors import CheckpointError, CheckpointWarning, InterpError
from .files import AtomicFile
from .integrity import metadata_checksum, tensor_checksum, verify_tensors
from .model import ModelSpec
from .task import Task

if TYPE_CHECKING:
    import torch
    from transformer_lens import HookedTransformer

FORMAT = "interp-checkpoint"
FORMAT_VERSION = 2
READABLE_VERSIONS = (1, 2)
COVERED = ("model_spec", "tl_config", "task", "training")  # the metadata fields metadata_checksums covers


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


def save_checkpoint(
    model: HookedTransformer,
    task: Task,
    path,
    *,
    training: dict[str, Any] | None = None,
    spec: ModelSpec | None = None,
) -> Path:
    """Write ``model`` and ``task`` to ``path`` atomically, with TransformerLens' whole configuration, the checksum of
    the weights and the checksums of the metadata; return the path.

    Any ``HookedTransformer`` is saved from its own configuration. ``spec`` is the :class:`interp.model.ModelSpec` a
    model of the toolkit was built from (``interp.build_model(spec)``: needed where it installs what the
    configuration cannot say, attention variants and hook-based positions). A model that what the file holds would
    not rebuild exactly is refused before anything is written (a CheckpointError naming the difference: a hook
    attached, a module or parameter the configuration does not create, a config value that is not JSON, a parameter
    the spec fixes that holds another value, other logits), and so is a model whose vocabulary sizes do not fit the
    task's. ``training`` is the provenance recorded with it. (This module knows no task: ``interp.save_checkpoint``,
    :func:`interp.loading.save_checkpoint`, also refuses a task whose parameters do not rebuild it.)"""
    from .task import check_model_task

    try:
        check_model_task(model, task)
    except InterpError as e:
        raise CheckpointError(f"cannot save this model with its task: {e}") from None
    return _write(Path(path), model, spec, {"name": task.name, "params": task.params()}, training or {})


def _write(
    path: Path, model: HookedTransformer, spec: ModelSpec | None, task: dict[str, Any], training: dict[str, Any]
) -> Path:
    """Check that the file rebuilds ``model`` (:func:`interp.rebuild.check_rebuilds`), then write it with the task's
    metadata ``task`` (name and parameters) and ``training``, atomically."""
    from safetensors.torch import save_file

    from .attention import sync
    from .rebuild import check_rebuilds, config_to_json

    with AtomicFile(path, "the checkpoint") as out:  # an unwritable path fails before the checks
        sync(model)  # low-rank Q/K/V: TransformerLens' matrices hold the product of the factors
        config = config_to_json(model.cfg)
        check_rebuilds(model, spec, config)
        tensors = {k: v.detach().to("cpu").contiguous() for k, v in model.state_dict().items()}
        fields = {"model_spec": spec.to_dict() if spec is not None else None, "tl_config": config, "task": task}
        fields["training"] = training
        try:
            encoded = {k: json.dumps(v) for k, v in fields.items()}
        except (TypeError, ValueError) as e:
            raise CheckpointError(f"cannot save this model: its metadata is not JSON ({e})") from None
        checksum = tensor_checksum(tensors)
        decoded = {k: json.loads(v) for k, v in encoded.items()}  # what a reader will parse
        metadata = {
            "format": FORMAT,
            "format_version": str(FORMAT_VERSION),
            **encoded,
            "checksum": checksum,
            "metadata_checksums": json.dumps({k: metadata_checksum(k, decoded[k], checksum) for k in COVERED}),
        }
        return out.commit(lambda tmp: save_file(tensors, tmp, metadata=metadata))


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
    """The parsed metadata of a checkpoint file, verified (version 2: every metadata checksum; version 1: its
    ``tl_config`` agrees with its ``model_spec``); no weights are read. Keys: ``format_version`` (int),
    ``model_spec`` (a dict, or None for a model saved from its TransformerLens config alone), ``tl_config`` (absent
    in the oldest files), ``task``, ``training`` and ``checksum`` (the tensors', or None in the oldest files)."""
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
    if version not in [str(v) for v in READABLE_VERSIONS]:
        raise CheckpointError(
            f"{path} has checkpoint format version {version}; this toolkit reads versions "
            f"{', '.join(map(str, READABLE_VERSIONS))}"
        )
    required = ("model_spec", "task", "training") + (("tl_config",) if version == "2" else ())
    try:
        meta = {k: json.loads(raw[k]) for k in required}
        if "tl_config" in raw:
            meta["tl_config"] = json.loads(raw["tl_config"])
    except (KeyError, json.JSONDecodeError) as e:
        raise CheckpointError(f"{path} has missing or malformed metadata ({e})") from None
    if not isinstance(meta["task"], dict) or not isinstance(meta["task"].get("name"), str):
        raise CheckpointError(f"{path} has malformed metadata (task: expected {{'name': ..., 'params': {{...}}}})")
    meta["format_version"] = int(version)
    meta["checksum"] = raw.get("checksum")
    if version == "2":
        _verify_metadata(path, raw, meta)
    else:
        _check_version_1(path, raw, meta)
    return meta


def _verify_metadata(path: Path, raw: dict[str, str], meta: dict[str, Any]) -> None:
    """Refuse a version-2 file without its checksums, or whose covered metadata does not match them."""
    checksum = raw.get("checksum")
    try:
        sums = json.loads(raw["metadata_checksums"])
    except (KeyError, json.JSONDecodeError):
        sums = None
    if not checksum or not isinstance(sums, dict):
        missing = "checksum" if not checksum else "metadata_checksums"
        raise CheckpointError(
            f"{path} is a version-2 checkpoint without its {missing}: a file of this version always has it, so it "
            "was removed; refused (the weights and the metadata that define the model cannot be verified)"
        )
    edited = [k for k in COVERED if sums.get(k) != metadata_checksum(k, meta[k], checksum)]
    if len(edited) == len(COVERED):
        raise CheckpointError(
            f"{path}: the metadata checksums do not match the checksum of the weights: the file was edited or its "
            "metadata put on other weights; refused"
        )
    if edited:
        raise CheckpointError(
            f"{path}: its metadata {' and '.join(edited)} {'does' if len(edited) == 1 else 'do'} not match the "
            "checksum written with the file: it was edited after it was saved (an edited spec, config or task loads "
            "another model than the one trained); refused"
        )


def _check_version_1(path: Path, raw: dict[str, str], meta: dict[str, Any]) -> None:
    """A version-1 file's metadata cannot be verified; refuse what is inconsistent in it: a version-2 checksum (its
    version was edited), no model spec (every version-1 file has one), or a ``tl_config`` its spec does not build."""
    if "metadata_checksums" in raw:
        raise CheckpointError(
            f"{path} is marked version 1 but carries the metadata checksums of version 2: its version was edited; "
            "refused"
        )
    if not isinstance(meta["model_spec"], dict):
        raise CheckpointError(f"{path}: a version-1 checkpoint always has a model spec, this one has none; refused")
    if "tl_config" not in meta:
        return
    try:
        spec = ModelSpec.from_dict(meta["model_spec"])
    except InterpError as e:
        raise CheckpointError(f"{path}: bad model spec in metadata: {e}") from None
    expected = json.loads(json.dumps({k: v for k, v in spec.tl_config_kwargs(None).items() if k != "device"}))
    stored = meta["tl_config"]
    diff = sorted(k for k in set(expected) | set(stored) if expected.get(k, "<absent>") != stored.get(k, "<absent>"))
    if diff:
        k = diff[0]
        raise CheckpointError(
            f"{path}: its metadata is inconsistent: the model spec builds {k}={expected.get(k, '<absent>')!r} but "
            f"the stored TransformerLens config says {stored.get(k, '<absent>')!r} (differing: {diff[:5]}): one of "
            "them was edited; refused"
        )


MakeTask = Callable[..., Task]  # make_task(name, **params) -> the task a checkpoint names


def read_checkpoint(
    path,
    make_task: MakeTask,
    device: str | torch.device | None = None,
    expect_task: str | None = None,
    task_params: dict[str, Any] | None = None,
) -> Checkpoint:
    """Read and verify the checkpoint file at ``path`` onto ``device`` (default: CUDA if present, else CPU);
    ``make_task(name, **params)`` builds the task it names (``interp.get_task``: the task registry).

    ``task_params`` override the task's saved parameters (e.g. ``{"test_lengths": [201, 400]}`` to test length
    generalisation); a model without positional embedding then takes the longer sequences. A version-1 file loads
    with a :class:`interp.errors.CheckpointWarning` (its metadata is not covered by a checksum)."""
    from safetensors.torch import load_file

    from .device import pick_device
    from .model import extend_context
    from .rebuild import config_to_json, normalised, rebuild

    path = _existing_file(path)
    meta = read_metadata(path)
    try:
        spec = ModelSpec.from_dict(meta["model_spec"]) if meta["model_spec"] is not None else None
    except InterpError as e:
        raise CheckpointError(f"{path}: bad model spec in metadata: {e}") from None
    if meta["format_version"] == 1:
        warnings.warn(
            f"{path} is a version-1 checkpoint: its metadata (model spec, task, training) is not covered by a "
            "checksum, so an edit of it (e.g. the attention variant) cannot be detected; re-save it as version 2 with "
            "interp.checkpoint.upgrade_checkpoint",
            CheckpointWarning,
            stacklevel=2,
        )
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
    try:
        model = rebuild(spec, meta.get("tl_config"), "cpu")
    except InterpError as e:
        raise CheckpointError(f"{path}: {e}") from None
    if meta["format_version"] >= 2:
        stored = normalised(meta["tl_config"])
        built = config_to_json(model.cfg)
        diff = sorted(k for k in stored if built.get(k, "<absent>") != stored[k])
        if diff:
            raise CheckpointError(
                f"{path}: the model its {'spec' if spec is not None else 'config'} builds here has another "
                f"TransformerLens config than the stored one ({diff[:5]}: e.g. {diff[0]}="
                f"{built.get(diff[0], '<absent>')!r}, stored {stored[diff[0]]!r}): the file was edited and re-signed, "
                "or written by another version of TransformerLens or interp"
            )
    what = "the model spec" if spec is not None else "the TransformerLens config"
    _check_shapes(
        path,
        {k: tuple(v.shape) for k, v in model.state_dict().items()},
        {k: tuple(v.shape) for k, v in tensors.items()},
        what,
    )
    verify_tensors(path, tensors, spec, meta.get("checksum"), [n for n, _ in model.named_parameters()])
    model.load_state_dict(tensors, strict=True)
    if device != "cpu":
        model.to(device, print_details=False)
    model.eval()
    if task_params:
        extend_context(model, task.n_ctx)  # longer test sequences: NoPE models only, a clear error otherwise
    return Checkpoint(model=model, task=task, path=path, metadata=meta, spec=spec)


def upgrade_checkpoint(path, out=None) -> Path:
    """Re-save the version-1 checkpoint at ``path`` as version 2 at ``out`` (default: in place, atomically): the same
    weights, model spec, task and training metadata, with TransformerLens' whole config and the metadata checksums.
    The file is verified first, as loading verifies it (its tensor checksum where it has one). Return the path
    written."""
    from safetensors.torch import load_file

    from .rebuild import rebuild

    path = _existing_file(path)
    meta = read_metadata(path)
    if meta["format_version"] != 1:
        raise CheckpointError(f"{path} is already a version-{meta['format_version']} checkpoint")
    try:
        spec = ModelSpec.from_dict(meta["model_spec"])
    except InterpError as e:
        raise CheckpointError(f"{path}: bad model spec in metadata: {e}") from None
    tensors = load_file(str(path), device="cpu")
    model = rebuild(spec, None, "cpu")
    _check_shapes(
        path,
        {k: tuple(v.shape) for k, v in model.state_dict().items()},
        {k: tuple(v.shape) for k, v in tensors.items()},
    )
    verify_tensors(path, tensors, spec, meta.get("checksum"), [n for n, _ in model.named_parameters()])
    model.load_state_dict(tensors, strict=True)
    model.eval()
    return _write(Path(out) if out is not None else path, model, spec, meta["task"], meta["training"])


def _check_shapes(
    path: Path,
    expected: dict[str, tuple[int, ...]],
    got: dict[str, tuple[int, ...]],
    what: str = "the model spec",
) -> None:
    """One CheckpointError naming the missing, unexpected and mis-shaped tensors, where the file's weights do not
    fit the model its spec (or TransformerLens config: ``what``) builds."""
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
            ", ".join(f"{k}: file {got[k]} vs {what} {expected[k]}" for k in shapes[:5]),
        )
        if s
    )
    raise CheckpointError(f"{path}: the weights do not match {what} in its metadata ({detail})")
