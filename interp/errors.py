"""Errors the toolkit raises for bad input.

Every message names what was wrong and what was expected. The CLI prints them as one line.
"""


class InterpError(Exception):
    """Base class: a user-facing error with a clear, one-line message."""


class TaskError(InterpError):
    """Unknown task, bad task parameters, or data that does not belong to the task."""


class TokenError(InterpError):
    """Tokens outside the vocabulary, or sequences longer than the model's context."""


class CheckpointError(InterpError):
    """A missing, corrupt, foreign or inconsistent checkpoint file."""


class HeadError(InterpError):
    """A head or head subset that does not exist in the model."""


class ConfigError(InterpError):
    """Invalid model or training configuration values."""


class CheckpointWarning(UserWarning):
    """A checkpoint that loads but whose file cannot vouch for all of itself (a version-1 file, whose checksum covers
    the weights only)."""


class RemovedNameError(InterpError, ImportError):
    """A public name removed in 0.2.0, asked for: the message names what replaces it. An ImportError, so that
    ``from module import name`` raises it with that message (Python turns an AttributeError there into its own "cannot
    import name"); ``module.name`` raises it too."""


def removed_names(module: str, moved: dict[str, str]):
    """A module-level ``__getattr__`` for ``module`` whose names in ``moved`` (name -> what replaces it, in words)
    raise :class:`RemovedNameError`, and any other unknown name the usual AttributeError."""

    def __getattr__(name: str):
        if name in moved:
            raise RemovedNameError(
                f"{module}.{name} was removed in 0.2.0: {moved[name]} (CHANGELOG.md lists every removed name)",
                name=module,
            )
        raise AttributeError(f"module {module!r} has no attribute {name!r}")

    return __getattr__
