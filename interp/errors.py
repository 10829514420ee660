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
