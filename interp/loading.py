"""Open a checkpoint by path or by name: ``interp.load("noisy-majority")``.

A name is the file stem of a ``.safetensors`` file in the checkpoints folder of a registered task
(:class:`interp.registry.TaskPlugin`'s ``checkpoints``; the shipped checkpoints are the shipped tasks'), or an old
name one of them still accepts (its ``aliases``). The file's task is built by the registry
(:func:`interp.registry.get_task`) from the name it records: loading never imports a module named in a file.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from .errors import CheckpointError, InterpError

if TYPE_CHECKING:
    import torch
    from transformer_lens import HookedTransformer

    from .checkpoint import Checkpoint
    from .model import ModelSpec
    from .task import Task


def _folder_files(folder: Path) -> dict[str, Path]:
    files = sorted(p for p in folder.glob("*.safetensors") if not p.name.endswith(".resume.safetensors"))
    return {p.name.removesuffix(".safetensors"): p for p in files}


def checkpoint_names(aliases: bool = False, *, broken: list[str] | None = None) -> dict[str, Path]:
    """Every named checkpoint of the registered tasks -> its file (with ``aliases``: old names too). A name found
    in two tasks' folders as different files is a CheckpointError naming both. A task plugin that cannot be loaded
    is the registry's TaskError, or, given a list ``broken``, left out with its error appended there (so one broken
    package does not hide every other checkpoint)."""
    from .registry import plugins

    out: dict[str, Path] = {}
    old: dict[str, str] = {}
    seen: set[Path] = set()
    for plugin in plugins(broken=broken):
        old.update(plugin.aliases)
        if plugin.checkpoints is None or not plugin.checkpoints.is_dir():
            continue
        folder = plugin.checkpoints.resolve()
        if folder in seen:  # several tasks may share one folder (the shipped ones do)
            continue
        seen.add(folder)
        for name, path in _folder_files(folder).items():
            if name in out and out[name] != path:
                raise CheckpointError(f"two registered checkpoints are named {name!r}: {out[name]} and {path}")
            out[name] = path
    if aliases:
        out.update({a: out[b] for a, b in old.items() if b in out and a not in out})
    return out


def checkpoint_aliases(*, broken: list[str] | None = None) -> dict[str, str]:
    """Old checkpoint names still accepted -> their names today, from every registered task (``broken``: as for
    :func:`checkpoint_names`)."""
    from .registry import plugins

    return {a: b for plugin in plugins(broken=broken) for a, b in plugin.aliases.items()}


def checkpoint_file(path_or_name) -> Path:
    """A checkpoint file's path, or the name of a registered checkpoint (``noisy-majority``, or an old name such as
    ``induction``) -> its file; a CheckpointError naming the registered ones otherwise."""
    p = Path(path_or_name)
    if p.is_file():
        return p
    broken: list[str] = []
    named = checkpoint_names(aliases=True, broken=broken)
    if str(path_or_name) in named:
        return named[str(path_or_name)]
    if p.exists():
        raise CheckpointError(f"checkpoint {p} is not a regular file")
    names = ", ".join(named) or "none"
    unsearched = f"; not searched: {'; '.join(broken)}" if broken else ""
    raise CheckpointError(
        f"no checkpoint file {str(path_or_name)!r}, and no registered checkpoint of that name (registered: "
        f"{names}){unsearched}"
    )


def load_checkpoint(
    path_or_name,
    device: str | torch.device | None = None,
    expect_task: str | None = None,
    task_params: dict[str, Any] | None = None,
) -> Checkpoint:
    """Load a checkpoint by path or registered name onto ``device`` (default: CUDA if present, else CPU), its task
    built by the registry (:func:`interp.checkpoint.read_checkpoint` does the reading and the checks).

    ``task_params`` override the task's saved parameters (e.g. ``{"test_lengths": [201, 400]}`` to test length
    generalisation); a model without positional embedding then takes the longer sequences."""
    from .checkpoint import read_checkpoint
    from .registry import get_task

    return read_checkpoint(
        checkpoint_file(path_or_name), get_task, device=device, expect_task=expect_task, task_params=task_params
    )


def save_checkpoint(
    model: HookedTransformer,
    task: Task,
    path,
    *,
    training: dict[str, Any] | None = None,
    spec: ModelSpec | None = None,
) -> Path:
    """``interp.save_checkpoint``: :func:`interp.checkpoint.save_checkpoint` (the file and its checks) after the check
    that loading makes of the task: a registered task whose name and parameters (``task.params()``) do not rebuild it
    with the registry's ``get_task`` is refused, before anything is written, with a CheckpointError naming the task's
    own error (an unregistered task cannot be rebuilt at load either, which :func:`load_checkpoint` says)."""
    from .checkpoint import save_checkpoint as write_checkpoint
    from .registry import get_task, task_names

    if task.name in task_names():
        try:
            get_task(task.name, **task.params())
        except InterpError as e:
            raise CheckpointError(
                f"cannot save {path}: its task's parameters do not rebuild task {task.name!r} (loading would refuse "
                f"it): {e}"
            ) from None
    return write_checkpoint(model, task, path, training=training, spec=spec)


def load(path_or_name, device: str | torch.device | None = None) -> tuple[HookedTransformer, Task]:
    """``model, task = interp.load("noisy-majority")``: a HookedTransformer and its task."""
    ckpt = load_checkpoint(path_or_name, device=device)
    return ckpt.model, ckpt.task


def read_metadata(path_or_name) -> dict[str, Any]:
    """The parsed, validated metadata of a checkpoint (by path or registered name); no weights are read."""
    from .checkpoint import read_metadata as read

    return read(checkpoint_file(path_or_name))
