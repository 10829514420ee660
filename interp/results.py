"""The one result protocol every analysis follows.

A result is a small dataclass of tensors that subclasses :class:`Result` and provides

- ``to_dict()``: its numbers as plain JSON types (``interp analyze --json``, ``--out results.json`` and the
  suites use it; nothing builds JSON by hand). :func:`jsonable` turns tensors, numpy values, tuples and
  non-finite floats (NaN and infinities become ``None``) into such types;
- ``from_dict(d)`` (a classmethod): the result read back from what ``to_dict()`` wrote, so that a saved ``--json``
  or ``--out`` file is a result again (``from_dict(r.to_dict()).to_dict() == r.to_dict()``);
- ``text()``: the plain-text summary the command line prints;
- ``figure()``: a plotly figure where a picture helps (``None`` otherwise);
- ``table_html()``: an HTML table where rows of numbers help (``None`` otherwise);

and gets from this class a rich display in Jupyter (:meth:`Result._repr_html_`: the table, then the figure, as
HTML that works in any front end; plotly.js is put on the page once per kernel, not once per output) and
``to_json()``.
"""

from __future__ import annotations

import json
import math
import numbers
from typing import Any


def jsonable(x: Any) -> Any:
    """``x`` with tensors, numpy arrays and scalars as lists and numbers, tuples as lists, and NaN / inf as None."""
    if x is None or isinstance(x, (str, bool)):
        return x
    if hasattr(x, "tolist") and not isinstance(x, (list, tuple, dict)):  # torch tensors, numpy arrays and scalars
        return jsonable(x.tolist())
    if isinstance(x, numbers.Integral):
        return int(x)
    if isinstance(x, numbers.Real):
        x = float(x)
        return x if math.isfinite(x) else None
    if isinstance(x, dict):
        return {str(k): jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [jsonable(v) for v in x]
    if hasattr(x, "to_dict"):
        return jsonable(x.to_dict())
    raise TypeError(f"cannot turn a {type(x).__name__} into JSON")


def floats(x, dtype=None):
    """A float tensor of ``x`` (nested lists of numbers as ``to_dict`` wrote them; ``None``, JSON's NaN or infinity,
    read back as NaN): what ``from_dict`` reads a tensor field with. float64 by default, which holds every float32
    value exactly, so that ``from_dict(d).to_dict() == d``."""
    import torch

    def walk(v):
        if isinstance(v, list):
            return [walk(u) for u in v]
        return float("nan") if v is None else float(v)

    return torch.tensor(walk(x), dtype=dtype or torch.float64)


def head_of(label: str) -> tuple[int, int]:
    """``'L0H3' -> (0, 3)``: a head as ``to_dict`` names it, read back."""
    from .heads import parse_head

    return parse_head(label, 10**9, 10**9)


class Result:
    """Base class of analysis results: ``to_dict``, ``from_dict``, ``text``, ``figure``, ``table_html`` and a rich
    Jupyter display."""

    def to_dict(self) -> dict:  # pragma: no cover - every result overrides it
        raise TypeError(f"{type(self).__name__} must define to_dict()")

    @classmethod
    def from_dict(cls, d: dict) -> Result:  # pragma: no cover - every result overrides it
        """The result that ``to_dict()`` wrote ``d`` from."""
        raise TypeError(f"{cls.__name__} must define from_dict()")

    def text(self) -> str:  # pragma: no cover - every result overrides it
        """The plain-text summary the command line prints."""
        raise TypeError(f"{type(self).__name__} must define text()")

    def figure(self):
        """A plotly figure of the result, or None when it has no picture."""
        return None

    def table_html(self) -> str | None:
        """An HTML table of the result, or None when it has no table."""
        return None

    def to_json(self, **kw) -> str:
        """``to_dict()`` as strict JSON (no NaN)."""
        return json.dumps(jsonable(self.to_dict()), allow_nan=False, **kw)

    def __eq__(self, other) -> bool:
        """Two results are equal when they are of one type and write the same JSON (:meth:`to_json`: every number
        exactly, NaN equal to NaN). The results are dataclasses declared with ``eq=False``: the generated field-wise
        comparison would ask a tensor for its truth value and raise."""
        if type(other) is not type(self):
            return NotImplemented
        return self.to_json(sort_keys=True) == other.to_json(sort_keys=True)

    __hash__ = None  # equal results need not be one object: unhashable, as dataclasses with eq are

    def _repr_html_(self) -> str:
        from .visualize import notebook_figure_html

        parts = []
        table = self.table_html()
        if table:
            parts.append(table)
        fig = self.figure()
        if fig is not None:
            parts.append(notebook_figure_html(fig))
        if not parts:
            parts.append(f"<pre>{json.dumps(jsonable(self.to_dict()), indent=1)[:4000]}</pre>")
        return "".join(parts)
