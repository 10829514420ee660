"""The spellings of attention variants, parsed: which keys a query may see, how it weighs them, and how its Q/K/V
matrices are shaped. Plain data, no torch (so :mod:`interp.configs` validates the options and ``interp --help``
stays instant); :mod:`interp.attention` builds the masks, scores and constraints from these.

``ModelSpec.attention`` (``--attention``) is a ``+``-joined union of terms, at most one of them a pooling:

- poolings (Conti, *The Math behind transformers*, §2.1.2 and §3.1): ``softmax`` (the default);
  ``linear:elu`` and ``linear:relu``, linear (kernel) attention ``φ(q_i)·φ(k_j) / Σ_{j'≤i} φ(q_i)·φ(k_j')`` with
  ``φ = elu + 1`` or ``relu`` (Katharopoulos et al. 2020, *Transformers are RNNs*); ``additive``,
  ``softmax_j(v·tanh(q_i + k_j))`` (Bahdanau et al. 2015, *Neural Machine Translation by Jointly Learning to Align
  and Translate*; Bahdanau's ``W_a s`` and ``U_a h`` are the head's own ``W_Q`` and ``W_K``, so the one extra
  parameter per head is ``v``, of size ``d_head``);
- sparse masks, in causal form (Beltagy et al. 2020, *Longformer*; Zaheer et al. 2020, *Big Bird*): ``window:W``
  (keys ``i-W+1 .. i``), ``dilated:W,D`` (``W`` keys ``i, i-D, .., i-(W-1)D``), ``global:G`` (positions
  ``0 .. G-1``: seen by every later query, and seeing everything before them), ``random:R`` (``R`` earlier keys
  per query, drawn once from ``ModelSpec.attention_seed``), ``bigbird:W,G,R`` (= ``window:W+global:G+random:R``).
  A union of masks lets a query see the union of their keys; with no mask term every earlier key is seen.

``ModelSpec.qkv`` (``--qkv``) shapes ``W_Q``, ``W_K`` and ``W_V`` of every layer (Conti, §3, third question), seen as
the ``[d_model, n_heads * d_head]`` matrix of all heads together: ``full`` (the default); ``diagonal`` (entry
``(i, j)`` free only where ``i == j mod d_model``: head ``h`` reads residual dimensions ``h*d_head ..``, one weight
each); ``sparse:F`` (a fixed random fraction ``F`` of the entries free, drawn from ``attention_seed``); ``lowrank:R``
(the product ``A B`` of ``[d_model, R]`` and ``[R, n_heads * d_head]`` factors, Wang et al. 2020, *Linformer*,
factorises the same way along the sequence).
"""

from __future__ import annotations

from dataclasses import dataclass

from .errors import ConfigError

POOLINGS = ("softmax", "linear:elu", "linear:relu", "additive")
MASK_KINDS = ("window", "dilated", "global", "random")
QKV_KINDS = ("full", "diagonal", "sparse", "lowrank")
ATTENTION_SPELLINGS = (
    "softmax, linear:elu, linear:relu, additive, window:W, dilated:W,D, global:G, random:R, bigbird:W,G,R, "
    "or a union of one pooling and masks joined by + (e.g. window:8+global:2+random:3)"
)
QKV_SPELLINGS = "full, diagonal, sparse:F (0 < F < 1, the fraction of free entries) or lowrank:R (R >= 1)"


@dataclass(frozen=True)
class Mask:
    """One sparse-mask term: ``kind`` in :data:`MASK_KINDS` and its integer arguments."""

    kind: str
    args: tuple[int, ...]

    def __str__(self) -> str:
        return f"{self.kind}:{','.join(map(str, self.args))}"


@dataclass(frozen=True)
class Attention:
    """A parsed ``attention`` spelling: the pooling and the mask terms (empty: dense causal attention)."""

    pooling: str = "softmax"
    masks: tuple[Mask, ...] = ()

    @property
    def is_default(self) -> bool:
        return self.pooling == "softmax" and not self.masks

    @property
    def tl_window(self) -> int | None:
        """``W`` where the whole mask is one sliding window, which TransformerLens' own local attention expresses
        (``use_local_attn``, ``attn_types``, ``window_size``); None otherwise."""
        if len(self.masks) == 1 and self.masks[0].kind == "window":
            return self.masks[0].args[0]
        return None

    @property
    def hooked_masks(self) -> tuple[Mask, ...]:
        """The masks the model adds at ``hook_attn_scores`` (all of them, unless TransformerLens' window does it)."""
        return () if self.tl_window is not None else self.masks

    def keys_per_query(self) -> int | None:
        """An upper bound on the keys any query sees under the masks (None: dense, up to every earlier key)."""
        if not self.masks:
            return None
        total = 0
        for m in self.masks:
            total += m.args[0]  # window W, dilated W, global G, random R
        return total

    def __str__(self) -> str:
        """The canonical spelling: the pooling (left out where it is softmax and there are masks), then the masks in
        the order window, dilated, global, random (each kind by its arguments), each term once, no spaces, numbers
        without leading zeros: ``linear:elu+window:8+global:2``."""
        head = [self.pooling] if self.pooling != "softmax" or not self.masks else []
        return "+".join(head + [str(m) for m in self.masks])


@dataclass(frozen=True)
class QKV:
    """A parsed ``qkv`` spelling: ``kind`` in :data:`QKV_KINDS`, with the free fraction (sparse) or rank (lowrank)."""

    kind: str = "full"
    fraction: float | None = None
    rank: int | None = None

    def __str__(self) -> str:
        """The canonical spelling (``sparse:0.5``, ``lowrank:2``: the shortest text of the number)."""
        if self.kind == "sparse":
            return f"sparse:{self.fraction!r}"
        if self.kind == "lowrank":
            return f"lowrank:{self.rank}"
        return self.kind


def _ints(text: str, n: int, term: str) -> tuple[int, ...]:
    parts = text.split(",")
    if len(parts) != n or not all(p.strip().isdigit() and int(p) >= 1 for p in parts):
        raise ValueError(term)
    return tuple(int(p) for p in parts)


def _ascii(text: object, what: str, spellings: str) -> str:
    """``text`` where it is a non-empty ASCII string (digits such as ``٤`` or ``４`` read as numbers by Python's
    ``int`` would otherwise be accepted, and another spelling of one variant stored); else one ConfigError."""
    if not isinstance(text, str) or not text.strip():
        raise ConfigError(f"{what} must be one of: {spellings}; got {text!r}")
    if not text.isascii():
        bad = sorted({ch for ch in text if not ch.isascii()})
        raise ConfigError(
            f"{what} {text!r} holds characters that are not ASCII ({', '.join(map(repr, bad))}); expected one of: "
            f"{spellings}"
        )
    return text


MASK_ORDER = {kind: i for i, kind in enumerate(MASK_KINDS)}


def parse_attention(text: str) -> Attention:
    """``text`` as an :class:`Attention`, or one ConfigError naming the valid spellings. Spaces around terms and
    numbers, leading zeros and the order of the masks do not matter, and ``softmax`` may be named beside masks (it is
    the default pooling): ``str()`` of the result is the one canonical spelling (:meth:`Attention.__str__`), which
    :class:`interp.configs.ModelSpec` stores. ``bigbird:W,G,R`` is its three masks. A term given twice is one term;
    two different terms of a kind whose union is one of them (``window``, ``global``) or is not one spelling
    (``random``) are refused."""
    _ascii(text, "attention", ATTENTION_SPELLINGS)
    pooling, masks = None, []
    try:
        for raw in text.split("+"):
            term = raw.strip()
            if term in POOLINGS:
                if pooling is not None:
                    raise ValueError(term)
                pooling = term
                continue
            kind, sep, args = term.partition(":")
            if not sep:
                raise ValueError(term)
            if kind in ("window", "global", "random"):
                masks.append(Mask(kind, _ints(args, 1, term)))
            elif kind == "dilated":
                masks.append(Mask(kind, _ints(args, 2, term)))
            elif kind == "bigbird":
                w, g, r = _ints(args, 3, term)
                masks += [Mask("window", (w,)), Mask("global", (g,)), Mask("random", (r,))]
            else:
                raise ValueError(term)
    except ValueError:
        raise ConfigError(
            f"attention must be one of: {ATTENTION_SPELLINGS} (W, D, G, R positive integers, at most one pooling); "
            f"got {text!r}"
        ) from None
    masks = sorted(set(masks), key=lambda m: (MASK_ORDER[m.kind], m.args))
    for kind in ("window", "global", "random"):
        same = [str(m) for m in masks if m.kind == kind]
        if len(same) > 1:
            raise ConfigError(
                f"attention {text!r} has {len(same)} {kind} terms ({', '.join(same)}); give one: the union of "
                + ("two windows is the wider one" if kind == "window" else "")
                + ("two global prefixes is the longer one" if kind == "global" else "")
                + ("two random draws is not a random:R draw" if kind == "random" else "")
            )
    return Attention(pooling or "softmax", tuple(masks))


def canonical_attention(text: str) -> str:
    """The one canonical spelling of an ``attention`` value (:func:`parse_attention`), e.g. ``' window: 04 '`` and
    ``softmax+window:4`` -> ``window:4``; a ConfigError for what is not a spelling (non-ASCII characters included)."""
    return str(parse_attention(text))


def canonical_qkv(text: str) -> str:
    """The one canonical spelling of a ``qkv`` value (:func:`parse_qkv`), e.g. ``lowrank:02`` -> ``lowrank:2``,
    ``sparse:.50`` -> ``sparse:0.5``."""
    return str(parse_qkv(text))


def parse_qkv(text: str) -> QKV:
    """``text`` as a :class:`QKV`, or one ConfigError naming the valid spellings (``str()`` of the result is its
    canonical spelling)."""
    kind, sep, arg = _ascii(text, "qkv", QKV_SPELLINGS).strip().partition(":")
    kind = kind.strip()
    try:
        if kind in ("full", "diagonal") and not sep:
            return QKV(kind)
        if kind == "sparse" and sep:
            f = float(arg)
            if not 0 < f < 1:
                raise ValueError
            return QKV("sparse", fraction=f)
        if kind == "lowrank" and sep and arg.strip().isdigit() and int(arg) >= 1:
            return QKV("lowrank", rank=int(arg))
    except ValueError:
        pass
    raise ConfigError(f"qkv must be one of: {QKV_SPELLINGS}; got {text!r}")
