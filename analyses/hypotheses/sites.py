"""Model sites: where a high-level variable is looked for in a HookedTransformer.

A :class:`Site` is one activation at one position per example: a set of heads' outputs ``hook_z`` (before ``W_O``,
the heads' values concatenated) or the residual stream (``resid_pre``, ``resid_mid``, ``resid_post``) or a layer's
``attn_out`` / ``mlp_out``; the whole vector or, with ``basis`` (``[dim, k]``, orthonormal columns), the
``k``-dimensional subspace it spans (Geiger et al. 2024's distributed interventions: only the projection on the
subspace is taken from the source run).

Written as text (the command line's ``--site``): ``L0H3`` (head 3 of layer 0), ``L0H1+L0H3`` (two heads together),
``L0H*`` (every head of layer 0 together), ``L0H2-5`` (heads 2 to 5 together), ``resid_pre.1``, ``resid_post.0``,
``attn_out.1``, ``mlp_out.0``, each with an optional ``@POSITION``: ``answer`` (each example's answer position),
``answer-1`` / ``answer+2``, ``last`` (each example's last real token), an integer (an absolute position), or a position
the causal model names. Without one a site sits at the causal model's readout, the position whose prediction is compared
with the output."""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

import torch
from jaxtyping import Float, Int
from torch import Tensor

from interp.errors import ConfigError, HeadError, TaskError
from interp.heads import head_label
from interp.task import TaskData

if TYPE_CHECKING:
    from transformer_lens import HookedTransformer

RESID_HOOKS = ("resid_pre", "resid_mid", "resid_post", "attn_out", "mlp_out")
HOOKS = ("z", *RESID_HOOKS)
_HEADS_RE = re.compile(r"^L(\d+)H(\d+|\*)(?:-(\d+))?$", re.IGNORECASE)
_RESID_RE = re.compile(r"^(resid_pre|resid_mid|resid_post|attn_out|mlp_out)\.(\d+)$")
_REL_RE = re.compile(r"^answer\s*([+-])\s*(\d+)$")


@dataclass(frozen=True, eq=False)
class Site:
    """``hook`` (``"z"`` or one of :data:`RESID_HOOKS`) in ``layer``; ``heads`` for ``"z"`` (their outputs,
    concatenated in this order, are the site's vector); ``position`` (None: the causal model's readout); ``basis``
    ``[dim, k]`` (None: the whole vector)."""

    hook: str
    layer: int
    heads: tuple[int, ...] = ()
    position: int | str | Callable[[TaskData], Tensor] | None = None
    basis: Tensor | None = None

    def __post_init__(self):
        if self.hook not in HOOKS:
            raise ConfigError(f"unknown site hook {self.hook!r}; expected one of {HOOKS}")
        if self.hook == "z" and not self.heads:
            raise ConfigError("a head site (hook 'z') needs at least one head")
        if self.hook != "z" and self.heads:
            raise ConfigError(f"a {self.hook} site has no heads; heads belong to 'z' sites")
        if len(set(self.heads)) != len(self.heads):
            raise HeadError(f"site lists a head twice: {self.heads}")

    @property
    def hook_name(self) -> str:
        """TransformerLens' hook point."""
        return f"blocks.{self.layer}.attn.hook_z" if self.hook == "z" else f"blocks.{self.layer}.hook_{self.hook}"

    def where(self) -> str:
        """The site without its position: ``L0H3``, ``L0H1+L0H3``, ``resid_pre.1``."""
        if self.hook == "z":
            h = self.heads
            if len(h) >= 3 and list(h) == list(range(h[0], h[0] + len(h))):
                return f"{head_label(self.layer, h[0])}-{h[-1]}"  # a run of heads: L0H0-15
            return "+".join(head_label(self.layer, x) for x in h)
        return f"{self.hook}.{self.layer}"

    @property
    def name(self) -> str:
        pos = self.position
        where = self.where()
        if pos is not None:
            where += f"@{pos if isinstance(pos, (int, str)) else getattr(pos, '__name__', 'custom')}"
        if self.basis is not None:
            where += f"[k={self.basis.shape[1]}]"
        return where

    def __repr__(self) -> str:
        return f"Site({self.name})"

    def dim(self, model: HookedTransformer) -> int:
        """The length of the site's vector."""
        return len(self.heads) * model.cfg.d_head if self.hook == "z" else model.cfg.d_model

    def with_basis(self, basis: Float[Tensor, "dim k"] | None) -> Site:
        return replace(self, basis=basis)

    def at(self, position) -> Site:
        return replace(self, position=position)

    def check(self, model: HookedTransformer) -> Site:
        """Refuse a site this model does not have (a layer or head out of range, a basis of the wrong shape or not
        orthonormal); returns the site."""
        cfg = model.cfg
        if not 0 <= self.layer < cfg.n_layers:
            raise HeadError(
                f"site {self.name}: layer {self.layer} is out of range; the model has layers 0..{cfg.n_layers - 1}"
            )
        bad = [h for h in self.heads if not 0 <= h < cfg.n_heads]
        if bad:
            raise HeadError(
                f"site {self.name}: head(s) {bad} out of range; layer {self.layer} has heads 0..{cfg.n_heads - 1}"
            )
        if self.basis is not None:
            b = self.basis
            d = self.dim(model)
            if b.dim() != 2 or b.shape[0] != d or not 1 <= b.shape[1] <= d:
                raise ConfigError(
                    f"site {self.where()}: basis of shape {tuple(b.shape)}; expected [{d}, k] with 1 <= k <= {d}"
                )
            gram = b.detach().double().T @ b.detach().double()
            if not torch.allclose(gram, torch.eye(b.shape[1], dtype=torch.float64, device=b.device), atol=1e-4):
                raise ConfigError(f"site {self.where()}: the basis columns must be orthonormal (B^T B = I)")
        return self


def parse_site(spec: object, model: HookedTransformer, position=None) -> Site:
    """A :class:`Site` from its text (see the module docstring), a head ``(layer, head)``, or a Site (checked
    against ``model``). ``position`` is the default position of a spec that names none."""
    if isinstance(spec, Site):
        return spec.check(model)
    cfg = model.cfg
    if isinstance(spec, tuple) and len(spec) == 2 and all(isinstance(x, int) for x in spec):
        return Site("z", spec[0], (spec[1],), position).check(model)
    if not isinstance(spec, str):
        raise ConfigError(f"cannot read site {spec!r}; expected text such as 'L0H3@answer', a head (0, 3) or a Site")
    text, at, pos_text = spec.strip().partition("@")
    if at and not pos_text.strip():
        raise ConfigError(f"site {spec!r} names no position after '@'; expected e.g. '{text.strip()}@answer'")
    pos = _position_text(pos_text) if at else position
    text = text.strip()
    m = _RESID_RE.match(text)
    if m:
        return Site(m.group(1), int(m.group(2)), (), pos).check(model)
    heads: list[int] = []
    layer = None
    for part in text.split("+"):
        hm = _HEADS_RE.match(part.strip())
        if not hm:
            raise ConfigError(
                f"cannot read site {spec!r}; expected heads ('L0H3', 'L0H1+L0H3', 'L0H*') or a residual site "
                f"({', '.join(h + '.LAYER' for h in RESID_HOOKS)}), optionally '@POSITION'"
            )
        lay = int(hm.group(1))
        if layer is not None and lay != layer:
            raise ConfigError(
                f"site {spec!r}: heads patched together must be of one layer (one hook); got {layer} and {lay}"
            )
        layer = lay
        if hm.group(2) == "*":
            heads += list(range(cfg.n_heads))
        elif hm.group(3) is not None:
            heads += list(range(int(hm.group(2)), int(hm.group(3)) + 1))
        else:
            heads.append(int(hm.group(2)))
    return Site("z", int(layer), tuple(heads), pos).check(model)


def _position_text(text: str) -> int | str:
    text = text.strip()
    try:
        return int(text)
    except ValueError:
        return text


def resolve_positions(
    position, data: TaskData, named: Mapping[str, Callable[[TaskData], Tensor]], what: str = "site"
) -> Int[Tensor, "batch m"]:
    """``[batch, m]`` token positions of ``position`` on ``data``: ``"answer"`` / ``"answer-1"`` / ``"last"`` /
    an int / a name in ``named`` / a function of the data (``[batch]`` or ``[batch, m]``). Positions outside an
    example's real tokens are refused."""
    b, t = data.tokens.shape
    dev = data.device
    if callable(position) and not isinstance(position, str):
        pos = torch.as_tensor(position(data), device=dev)
    elif isinstance(position, bool):
        raise ConfigError(f"{what} position {position!r}; expected an int, a name or a function")
    elif isinstance(position, int):
        pos = torch.full((b,), position, device=dev)
    elif isinstance(position, str):
        m = _REL_RE.match(position)
        if position in named:
            pos = torch.as_tensor(named[position](data), device=dev)
        elif position == "answer":
            pos = data.answer_pos
        elif position == "last":
            pos = data.lengths - 1
        elif m:
            off = int(m.group(2)) * (1 if m.group(1) == "+" else -1)
            pos = data.answer_pos + off
        else:
            raise ConfigError(
                f"unknown {what} position {position!r}; expected 'answer', 'answer-K', 'answer+K', 'last', an integer"
                + (f" or one of the causal model's positions {sorted(named)}" if named else "")
            )
    else:
        raise ConfigError(f"{what} position {position!r}; expected an int, a name or a function of the data")
    pos = pos.long()
    if pos.dim() == 1:
        pos = pos[:, None]
    if pos.dim() != 2 or pos.shape[0] != b:
        raise ConfigError(f"{what} position {position!r} gave shape {tuple(pos.shape)}; expected [batch] or [batch, m]")
    if pos.numel() and (int(pos.min()) < 0 or bool((pos >= data.lengths[:, None]).any()) or int(pos.max()) >= t):
        raise TaskError(
            f"{what} position {position!r} falls outside some examples' tokens (positions {int(pos.min())}.."
            f"{int(pos.max())}; lengths {int(data.lengths.min())}..{int(data.lengths.max())})"
        )
    return pos
