"""The version-1 checkpoint writer (interp 0.2.0 and before: the checksum covers the tensors only), kept so the tests
can check that every file it wrote still loads."""

import json

from safetensors.torch import save_file

from interp.checkpoint import tensor_checksum


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
