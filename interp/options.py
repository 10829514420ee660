"""The options of the config dataclasses (:class:`interp.model.ModelSpec`, :class:`interp.training.TrainConfig`), as
the command line and sweep grids offer them.

Each option is described once, on its dataclass field (``field(..., metadata=option("help"))``): the ``interp
train`` / ``interp sweep`` flags, the keys a sweep grid accepts and the configuration columns of a sweep's table
are all read from there, so a new field marked as an option is on the command line, in grids and in tables with no
list to update by hand. Values are checked by the dataclass itself (its ``__post_init__``), in one place.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import types
import typing
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .errors import ConfigError


def option(
    help: str,
    *,
    choices: tuple | None = None,
    resumable: bool = False,
    config: bool = True,
    none: str = "none",
    canonical: Callable[[Any], Any] | None = None,
) -> dict[str, Any]:
    """Field metadata marking a dataclass field as a user option: ``help`` for ``--help``; ``choices`` where the
    values are a fixed set; ``resumable=True`` where the value may change when an interrupted run is resumed (more
    epochs, another patience); ``config=False`` for bookkeeping that is not part of a run's configuration (sweep
    grids do not vary it, tables do not show it); ``none``: how None is spelled on the command line, where the
    field takes it (e.g. ``auto`` for a default that a rule fills in); ``canonical``: the function that turns a
    value into its one canonical spelling (or raises a ConfigError), where one value has several spellings (the
    attention variants), so that two spellings of one value are one configuration."""
    return {
        "option": {
            "help": help,
            "choices": choices,
            "resumable": resumable,
            "config": config,
            "none": none,
            "canonical": canonical,
        }
    }


@dataclass(frozen=True)
class Option:
    """One option: its field name, flag (``--d-model``), value type, default, help and choices."""

    name: str
    type: type
    optional: bool  # None is a valid value
    default: Any
    help: str
    choices: tuple | None
    resumable: bool
    config: bool
    none: str = "none"  # None's spelling on the command line
    canonical: Callable[[Any], Any] | None = None  # a value -> its canonical spelling

    @property
    def flag(self) -> str:
        return "--" + self.name.replace("_", "-")

    def parse(self, text: str) -> Any:
        """A value given as text (a grid value or ``--set``-style text): JSON where it parses, else the string;
        ``none``/``null`` for None where None is allowed. Type errors are a ConfigError naming the option."""
        if self.optional and text.lower() in (self.none, "none", "null"):
            return None
        if self.type is str:
            return self.canonical(text) if self.canonical is not None else text
        try:
            value = json.loads(text)
        except json.JSONDecodeError:
            raise ConfigError(f"{self.name}: expected {self.type.__name__}, got {text!r}") from None
        return self.coerce(value)

    def coerce(self, value: Any) -> Any:
        """``value`` as this option's type (an int is a valid float), or a ConfigError naming the option."""
        if value is None and self.optional:
            return None
        if self.type is float and isinstance(value, int) and not isinstance(value, bool):
            return float(value)
        if isinstance(value, self.type) and not (self.type is int and isinstance(value, bool)):
            return value
        raise ConfigError(
            f"{self.name}: expected {self.type.__name__}{' or None' if self.optional else ''}, got {value!r}"
        )


def options(cls) -> dict[str, Option]:
    """The options of a config dataclass, by field name, in field order (read once per class: reading the type
    hints is slow, and a results table asks for them once per row)."""
    return dict(_options(cls))


@functools.cache
def _options(cls) -> tuple[tuple[str, Option], ...]:
    hints = typing.get_type_hints(cls)
    out = {}
    for f in dataclasses.fields(cls):
        meta = f.metadata.get("option")
        if meta is None:
            continue
        hint = hints[f.name]
        args = typing.get_args(hint)
        optional = isinstance(hint, types.UnionType) and type(None) in args
        base = next(a for a in args if a is not type(None)) if optional else hint
        default = f.default if f.default is not dataclasses.MISSING else None
        out[f.name] = Option(
            f.name,
            base,
            optional,
            default,
            meta["help"],
            meta["choices"],
            meta["resumable"],
            meta["config"],
            meta.get("none", "none"),
            meta.get("canonical"),
        )
    return tuple(out.items())


def changed(obj) -> dict[str, Any]:
    """The fields of a config dataclass instance that differ from the field's default (JSON types): what
    identifies a configuration stably, since a field added later with a default that keeps the old behaviour does
    not change it."""
    out = {}
    for f in dataclasses.fields(obj):
        value = getattr(obj, f.name)
        default = f.default if f.default is not dataclasses.MISSING else dataclasses.MISSING
        if value != default:
            out[f.name] = list(value) if isinstance(value, tuple) else value
    return out
