"""Naming heads (``L0H3``) and turning head sets into masks: the one mask builder of the toolkit.

A head is ``(layer, head)`` with two integers, or a name ``'L0H3'`` / ``'0.3'``. A set of heads is a mask
``[n_layers, n_heads]`` (1 = kept); many sets are a mask with a subset axis ``[subset, n_layers, n_heads]``.
:func:`parse_head_sets` reads every spelling an analysis's ``heads=`` takes (:func:`head_sets`: as a mask).
"""

from __future__ import annotations

import numbers
import re
from collections.abc import Iterable, Sequence

from .errors import HeadError

Head = tuple[int, int]
_HEAD_RE = re.compile(r"^[Ll](\d+)[Hh](\d+)$")


def head_label(layer: int, head: int) -> str:
    """``(0, 3) -> 'L0H3'``."""
    return f"L{layer}H{head}"


def parse_head(spec: object, n_layers: int, n_heads: int) -> Head:
    """Parse ``'L0H3'``, ``'0.3'`` or ``(0, 3)`` and check it exists in a model of this shape (anything else is a
    HeadError saying what is expected: ``spec`` is user input, so its annotation does not narrow it)."""
    if isinstance(spec, str):
        s = spec.strip()
        m = _HEAD_RE.match(s) or re.match(r"^(\d+)\.(\d+)$", s)
        if not m:
            raise HeadError(f"cannot parse head {spec!r}; expected a name like 'L0H3' or '0.3'")
        layer, head = int(m.group(1)), int(m.group(2))
    else:
        try:
            parts = tuple(spec)
        except TypeError:
            parts = ()
        if len(parts) != 2 or not all(_is_int(x) for x in parts):
            raise HeadError(
                f"cannot parse head {spec!r}; expected (layer, head) with two integers or a name like 'L0H3'"
            )
        layer, head = (int(x) for x in parts)
    if not (0 <= layer < n_layers and 0 <= head < n_heads):
        raise HeadError(
            f"head {head_label(layer, head)} is out of range; this model has layers 0..{n_layers - 1} "
            f"and heads 0..{n_heads - 1} per layer"
        )
    return layer, head


def parse_heads(specs: Iterable, n_layers: int, n_heads: int, *, allow_empty: bool = True) -> list[Head]:
    """Parse a collection of heads; duplicates are an error, order is kept."""
    if isinstance(specs, str):
        specs = [specs]
    heads = [parse_head(s, n_layers, n_heads) for s in specs]
    if len(set(heads)) != len(heads):
        raise HeadError(f"head subset {[head_label(*h) for h in heads]} lists a head twice")
    if not heads and not allow_empty:
        raise HeadError("an empty head subset was given where at least one head is needed")
    return heads


def all_heads(n_layers: int, n_heads: int) -> list[Head]:
    return [(l, h) for l in range(n_layers) for h in range(n_heads)]


def head_mask(subsets: Sequence[Iterable], n_layers: int, n_heads: int, device=None):
    """``[subset, n_layers, n_heads]`` float mask, 1 for the heads in each subset (heads parsed and checked)."""
    import torch

    mask = torch.zeros(len(subsets), n_layers, n_heads)
    for i, subset in enumerate(subsets):
        for l, h in parse_heads(list(subset) if not isinstance(subset, str) else [subset], n_layers, n_heads):
            mask[i, l, h] = 1.0
    return mask.to(device) if device is not None else mask


def is_head(spec: object) -> bool:
    """Whether ``spec`` spells one head (``'L0H3'``, ``'0.3'``, ``(0, 3)``), not a set of heads."""
    if isinstance(spec, str):
        return bool(_HEAD_RE.match(spec.strip()) or re.match(r"^\d+\.\d+$", spec.strip()))
    try:
        parts = tuple(spec)
    except TypeError:
        return False
    return len(parts) == 2 and all(_is_int(x) for x in parts)


def _is_int(x: object) -> bool:
    """An integer where a layer or head index is meant: a Python or NumPy integer (not a bool) or a 0-d integer
    tensor (``torch.tensor(3)``, e.g. an element of a tensor of indices)."""
    if isinstance(x, numbers.Integral):
        return not isinstance(x, bool)
    import torch

    return (
        isinstance(x, torch.Tensor)
        and x.dim() == 0
        and not (x.dtype.is_floating_point or x.dtype.is_complex or x.dtype == torch.bool)
    )


def _nested_mask(heads: object):
    """``heads`` as a float tensor where it is a nested list or tuple of numbers two or three levels deep (a mask
    written in plain Python, ``[[1, 0, 1], [1, 1, 1]]``), else None."""
    import torch

    def plain(x: object, depth: int):
        if isinstance(x, (list, tuple)):
            if depth >= 3 or not x:
                raise ValueError
            return [plain(y, depth + 1) for y in x]
        if depth < 2:
            raise ValueError
        if isinstance(x, torch.Tensor) and x.dim() == 0 and not x.dtype.is_complex:
            return float(x)
        if isinstance(x, numbers.Real):
            return float(x)
        raise ValueError

    if not isinstance(heads, (list, tuple)):
        return None
    try:
        return torch.tensor(plain(heads, 0))
    except (ValueError, TypeError):  # not numbers, or ragged
        return None


def _pairs(x: object) -> list:
    """The innermost sequences of a nested list (the rows of a mask, or the heads of a list of heads)."""
    if isinstance(x, (list, tuple)) and x and isinstance(x[0], (list, tuple)):
        return [p for y in x for p in _pairs(y)]
    return [x]


def parse_head_sets(heads: object, n_layers: int, n_heads: int, *, default: str = "all") -> list[tuple[Head, ...]]:
    """Every spelling of an analysis's ``heads=`` as a list of head sets, each a tuple of ``(layer, head)`` in the
    order given (the one parser of the toolkit; :func:`head_sets` is its mask):

    - ``None``: ``default`` decides: ``"all"`` (one set of every head) or ``"each"`` (each head alone, one set per
      head);
    - one head (``"L0H3"``, ``"0.3"``, ``(0, 3)``) or a list of heads (``["L0H1", (1, 0)]``): one set;
    - a list of sets (``[["L0H1"], ["L0H1", "L0H2"], []]``): one set each (a list whose elements all parse as
      heads is one set, so ``[(0, 1), (0, 2)]`` is one set of two heads; ``[]`` is one empty set);
    - a mask ``[n_layers, n_heads]`` (one set) or ``[subset, n_layers, n_heads]`` (0 or 1 values; 1 = in the set),
      its heads in layer order: a tensor, or nested Python lists (or tuples) of numbers (``[[1, 0, 1], [1, 1, 1]]``).
      Where such a list also reads as (layer, head) pairs (integers on a model with two heads per layer) and the two
      readings name other heads, it is refused as ambiguous, unless its pairs are tuples (then they are heads).

    An integer index may be a 0-d integer tensor (``(torch.tensor(0), torch.tensor(1))``).

    Heads are checked against the model's shape and a set may not name a head twice; anything else is a HeadError
    saying what is expected."""
    import torch

    if default not in ("all", "each"):
        raise HeadError(f"default must be 'all' or 'each', got {default!r}")
    if heads is None:
        every = all_heads(n_layers, n_heads)
        return [(h,) for h in every] if default == "each" else [tuple(every)]
    if isinstance(heads, torch.Tensor):
        mask = heads.detach().float()
        if mask.dim() == 2:
            mask = mask[None]
        if mask.dim() != 3 or tuple(mask.shape[1:]) != (n_layers, n_heads):
            raise HeadError(
                f"a head mask of shape {tuple(heads.shape)} does not fit this model; expected [{n_layers}, "
                f"{n_heads}] (one set) or [subset, {n_layers}, {n_heads}], 1 = in the set"
            )
        if not bool(((mask == 0) | (mask == 1)).all()):
            raise HeadError("a head mask holds values other than 0 and 1 (1 = in the set, 0 = not)")
        return [tuple((int(l), int(h)) for l, h in m.nonzero().tolist()) for m in mask.cpu()]
    if is_head(heads):
        return [(parse_head(heads, n_layers, n_heads),)]
    mask = _nested_mask(heads)
    if mask is None:
        return _listed_sets(heads, n_layers, n_heads)
    try:
        listed = _listed_sets(heads, n_layers, n_heads)
    except HeadError:  # not heads: a mask, checked as a tensor's (its shape, 0 and 1)
        return parse_head_sets(mask, n_layers, n_heads)
    fits = tuple(mask.shape[-2:]) == (n_layers, n_heads) and bool(((mask == 0) | (mask == 1)).all())
    differ = fits and [set(s) for s in parse_head_sets(mask, n_layers, n_heads)] != [set(s) for s in listed]
    if differ and not all(isinstance(p, tuple) for p in _pairs(heads)):
        raise HeadError(
            f"heads={heads!r} reads both as (layer, head) pairs and as a head mask [{n_layers}, {n_heads}], "
            "naming other heads; write the heads as tuples ((0, 1)) or names ('L0H1'), or the mask as a tensor "
            "(torch.tensor(...))"
        )
    return listed


def _listed_sets(heads: object, n_layers: int, n_heads: int) -> list[tuple[Head, ...]]:
    """:func:`parse_head_sets` of a list of heads or a list of head sets."""
    try:
        items = list(heads)  # type: ignore[call-overload]
    except TypeError:
        raise HeadError(
            f"cannot read heads={heads!r}; expected a head ('L0H3' or (0, 3)), a list of heads, a list of head "
            "sets, or a mask [n_layers, n_heads]"
        ) from None
    if all(is_head(x) for x in items):
        return [tuple(parse_heads(items, n_layers, n_heads))]
    bad = [x for x in items if isinstance(x, str) or not _iterable(x)]
    if bad:
        raise HeadError(
            f"cannot read {bad[0]!r} in heads=...; expected a head ('L0H3' or (0, 3)) in a list of heads, or a "
            "list of head sets"
        )
    return [tuple(parse_heads(list(x), n_layers, n_heads)) for x in items]


def head_sets(heads: object, n_layers: int, n_heads: int, *, default: str = "all", device=None):
    """Every spelling of an analysis's ``heads=`` (see :func:`parse_head_sets`) as a float mask ``[subset, n_layers,
    n_heads]``, 1 = in the set (kept)."""
    import torch

    if isinstance(heads, torch.Tensor):
        parse_head_sets(heads, n_layers, n_heads)  # checks the shape and the values
        mask = heads.detach().float()
        mask = mask[None] if mask.dim() == 2 else mask
        return mask.to(device) if device is not None else mask
    return head_mask(parse_head_sets(heads, n_layers, n_heads, default=default), n_layers, n_heads, device=device)


def one_set(
    heads: object, n_layers: int, n_heads: int, *, name: str = "heads", allow_empty: bool = False
) -> list[Head]:
    """The one head set ``heads=`` names (a head, a list of heads, or a mask ``[n_layers, n_heads]``), in the order
    given; a HeadError where it names several sets (or, unless ``allow_empty``, no head)."""
    sets = parse_head_sets(heads, n_layers, n_heads)
    if len(sets) != 1:
        raise HeadError(f"{name}= takes one set of heads (a head or a list of heads), got {len(sets)} sets")
    if not sets[0] and not allow_empty:
        raise HeadError(f"{name}= names no head; expected at least one")
    return list(sets[0])


def one_head(heads: object, n_layers: int, n_heads: int, what: str = "this analysis") -> Head:
    """The one head ``heads=`` names (a head, or a set of one); a HeadError where it names another number."""
    sets = parse_head_sets(heads, n_layers, n_heads)
    if len(sets) != 1 or len(sets[0]) != 1:
        raise HeadError(f"{what} takes one head (e.g. heads='L0H3'), got heads={heads!r}")
    return sets[0][0]


def _iterable(x: object) -> bool:
    try:
        iter(x)  # type: ignore[call-overload]
    except TypeError:
        return False
    return True
