"""Checkpoint files as the tests need them: the version-1 writer (interp 0.2.0 and before: the checksum covers the
tensors only), kept so the tests can check that every file it wrote still loads, and re-signed edits (every checksum
recomputed: a consistent, edited file, to reach the checks behind the checksums)."""

import json

from safetensors.torch import save_file

from interp.checkpoint import COVERED, metadata_checksum, tensor_checksum


def resigned(metadata: dict[str, str], tensors) -> dict[str, str]:
    """``metadata`` of a version-2 file with its checksums recomputed for ``tensors`` and its (edited) fields."""
    out = dict(metadata)
    out["checksum"] = tensor_checksum(tensors)
    parsed = {k: json.loads(out[k]) for k in COVERED}
    out["metadata_checksums"] = json.dumps({k: metadata_checksum(k, parsed[k], out["checksum"]) for k in COVERED})
    return out


def write_version_1(path, model, spec, task, training=None, *, checksum=True, tl_config=True):
    """``model`` (built from ``spec``) and ``task`` at ``path`` as the version-1 writer wrote them: the model spec, the
    spec's own TransformerLens keyword arguments as ``tl_config`` (optional: the oldest files lack it), the task,
    the training provenance and the tensors' ``checksum`` (optional: the oldest files lack it too)."""
    tensors = {k: v.detach().to("cpu").contiguous() for k, v in model.state_dict().items()}
    metadata = {
        "format": "interp-checkpoint",
        "format_version": "1",
        "model_spec": json.dumps(spec.to_dict()),
        "task": json.dumps({"name": task.name, "params": task.params()}),
        "training": json.dumps(training or {}),
    }
    if tl_config:
        metadata["tl_config"] = json.dumps({k: v for k, v in spec.tl_config_kwargs(None).items() if k != "device"})
    if checksum:
        metadata["checksum"] = tensor_checksum(tensors)
    save_file(tensors, str(path), metadata=metadata)
    return path
