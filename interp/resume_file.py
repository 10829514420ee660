"""Resume files: the one reader and writer of both trainers' state files (a solo run's, :mod:`interp.training`, and a
population's, :mod:`interp.population`).

A resume file is one ``.safetensors`` file: the state's tensors (weights, optimiser moments, best and last states,
random generators' states) and JSON metadata entries: ``identity`` (what the run is: its task, model spec(s) and
the training options a resumed run must share; written with sorted keys) and the trainer's own entries (its progress,
its options that may change on resuming, its optimiser's parameter groups). It is written atomically (a kill leaves
the previous file), never pickles, and is read back with one clear error for a damaged file and one naming the
differing keys for another run's file. A ``checksum`` entry covers every tensor and every other metadata entry, so an
edited file (a moment nudged, a record's accuracy changed, a tensor removed or transposed) is refused instead of
resuming to another model; a file written before that entry existed is read without the check.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from torch import Tensor

from .errors import CheckpointError
from .files import atomic_write
from .integrity import tensor_checksum

CHECKSUM = "checksum"  # the metadata entry that covers the file's tensors and its other metadata entries


class Encoded(str):
    """A value already encoded as JSON, anywhere in a metadata entry: :func:`write_resume_file` writes it as it is
    (a run record's history, encoded piece by piece as it grows, :meth:`interp.run_record.RunRecord.to_json`, is
    not encoded again whole at every resume file)."""


def _encode(value: Any) -> str:
    """``json.dumps(value)``, with every :class:`Encoded` inside it (in dicts with string keys and in lists) as it
    is."""
    if isinstance(value, Encoded):
        return value
    if isinstance(value, dict) and all(isinstance(k, str) for k in value):
        return "{" + ", ".join(f"{json.dumps(k)}: {_encode(v)}" for k, v in value.items()) + "}"
    if isinstance(value, list | tuple):
        return "[" + ", ".join(_encode(v) for v in value) + "]"
    return json.dumps(value)


def write_resume_file(path, tensors: dict[str, Tensor], identity: dict[str, Any], what: str, **entries: Any) -> Path:
    """Write ``tensors`` (moved to the CPU) with ``identity`` and each of ``entries`` as JSON metadata to ``path``
    (:class:`Encoded` values as they are), atomically (``what`` names the file in errors, e.g. "the resume file")."""
    from safetensors.torch import save_file

    meta = {"identity": json.dumps(identity, sort_keys=True), **{k: _encode(v) for k, v in entries.items()}}
    if CHECKSUM in meta:
        raise ValueError(f"{CHECKSUM!r} is the resume file's own metadata entry")
    cpu = {k: v.detach().cpu().contiguous() for k, v in tensors.items()}
    meta[CHECKSUM] = json.dumps(resume_checksum(cpu, meta))  # JSON like every entry
    return atomic_write(path, lambda tmp: save_file(cpu, tmp, metadata=meta), what)


def resume_checksum(tensors: dict[str, Tensor], meta: dict[str, str]) -> str:
    """``sha256:<hex>`` over the tensors' checksum (:func:`interp.integrity.tensor_checksum`: names, dtypes, shapes,
    bytes) and every metadata entry but :data:`CHECKSUM`, as written (key and JSON text, in key order)."""
    h = hashlib.sha256(tensor_checksum(tensors).encode())
    for key in sorted(k for k in meta if k != CHECKSUM):
        h.update(f"\0{key}\0{meta[key]}".encode())
    return "sha256:" + h.hexdigest()


def _raw_metadata(path, what: str, required: tuple[str, ...], fix: str) -> dict[str, str]:
    from safetensors import safe_open

    try:
        with safe_open(str(path), "pt") as f:
            raw = f.metadata() or {}
        missing = [k for k in required if k not in raw]
        if missing:
            raise KeyError(", ".join(missing))
        return raw
    except Exception as e:  # safetensors raises its own error types for corrupt headers
        raise CheckpointError(f"{what} {path} is corrupt ({e}); {fix}") from None


def _decoded(path, what: str, raw: dict[str, str], fix: str) -> dict[str, Any]:
    try:
        return {k: json.loads(v) for k, v in raw.items()}
    except ValueError as e:
        raise CheckpointError(f"{what} {path} is corrupt ({e}); {fix}") from None


def read_resume_metadata(
    path, what: str, required: tuple[str, ...] = ("identity",), fix: str = "delete it to start over"
) -> dict[str, Any]:
    """The JSON metadata entries of the resume file at ``path``, decoded; a CheckpointError saying it is corrupt (and
    what to do: ``fix``) where the file or one of the ``required`` entries cannot be read. (The checksum is checked by
    :func:`read_resume_file`, which reads the tensors too.)"""
    return _decoded(path, what, _raw_metadata(path, what, required, fix), fix)


def read_resume_file(
    path, what: str, required: tuple[str, ...] = ("identity",)
) -> tuple[dict[str, Tensor], dict[str, Any]]:
    """The tensors (on the CPU) and the decoded metadata entries of the resume file at ``path``; a CheckpointError
    where it is corrupt or does not match its checksum (edited)."""
    from safetensors.torch import load_file

    fix = "delete it to start over"
    raw = _raw_metadata(path, what, required, fix)
    try:
        tensors = load_file(str(path))
    except Exception as e:
        raise CheckpointError(f"{what} {path} is corrupt ({e}); {fix}") from None
    if CHECKSUM in raw and json.dumps(resume_checksum(tensors, raw)) != raw[CHECKSUM]:
        raise CheckpointError(
            f"{what} {path} does not match its checksum: it was edited or is corrupt (a tensor or a metadata entry "
            f"changed, added or removed); {fix}"
        )
    return tensors, _decoded(path, what, raw, fix)


def check_identity(
    path,
    saved: dict[str, Any],
    identity: dict[str, Any],
    *,
    what: str,
    owner: str,
    fix: str,
    defaults: dict[str, Any] | None = None,
) -> None:
    """Refuse a resume file that belongs to another run: its ``saved`` identity must equal the run's ``identity``
    (compared as JSON); keys of ``defaults`` the file lacks (options added since it was written) count as those
    defaults. The error names the differing keys: ``{what} {path} belongs to {owner} (differs in: ...); {fix}``."""
    saved = {**{k: v for k, v in (defaults or {}).items() if k in identity and k not in saved}, **saved}

    def plain(x):
        return json.loads(json.dumps(x, sort_keys=True))

    diff = sorted(k for k in set(saved) | set(identity) if plain(saved.get(k)) != plain(identity.get(k)))
    if diff:
        raise CheckpointError(f"{what} {path} belongs to {owner} (differs in: {', '.join(diff)}); {fix}")
