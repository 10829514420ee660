"""Naming heads (``L0H3``) and turning head sets into masks ``[n_layers, n_heads]``."""

from __future__ import annotations

import re
from typing import Iterable

from .errors import HeadError

Head = tuple[int, int]
_HEAD_RE = re.compile(r"^[Ll](\d+)[Hh](\d+)$")


def head_label(layer: int, head: int) -> str:
    """``(0, 3) -> 'L0H3'``."""
    return f"L{layer}H{head}"


def parse_head(spec: "str | Head", n_layers: int, n_heads: int) -> Head:
    """Parse ``'L0H3'``, ``'0.3'`` or ``(0, 3)`` and check it exists in a model of this shape."""
    if isinstance(spec, str):
        s = spec.strip()
        m = _HEAD_RE.match(s) or re.match(r"^(\d+)\.(\d+)$", s)
        if not m:
            raise HeadError(f"cannot parse head {spec!r}; expected a name like 'L0H3' or '0.3'")
        layer, head = int(m.group(1)), int(m.group(2))
    else:
        try:
            layer, head = (int(x) for x in spec)
        except (TypeError, ValueError):
            raise HeadError(f"cannot parse head {spec!r}; expected (layer, head) or a name like 'L0H3'") from None
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


def heads_to_mask(heads: Iterable[Head], n_layers: int, n_heads: int, device=None):
    """A float mask ``[n_layers, n_heads]`` with 1 for the heads in the set."""
    import torch

    mask = torch.zeros(n_layers, n_heads, device=device)
    for l, h in parse_heads(list(heads), n_layers, n_heads):
        mask[l, h] = 1.0
    return mask
