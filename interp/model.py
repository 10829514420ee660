"""Model specs -> ``transformer_lens.HookedTransformer``.

The seed's special shapes (no positional embedding, no output matrix, no attention biases) are
expressed with the config plus frozen parameters, never a forked model class:

- ``positional="none"``: ``W_pos`` is zeroed and frozen (TransformerLens has no NoPE option);
  ``"rotary"`` is TransformerLens' own; ``"random"`` and ``"abacus"`` add a forward hook on ``pos_embed`` (the
  ``W_pos`` row each token reads; :mod:`interp.positions`).
- ``output_matrix="identity"``: ``W_O`` is the fixed block identity (head ``h``'s dimension ``i`` writes
  to residual dimension ``h*d_head + i``); needs ``n_heads * d_head == d_model``.
- ``attn_bias=False``: ``b_Q, b_K, b_V, b_O`` are zero and frozen. The unembedding bias ``b_U`` (the
  seed's ``b_H``) stays trainable unless ``unembed_bias=False``.
"""

from __future__ import annotations

import warnings
from dataclasses import asdict, dataclass, fields
from typing import Any

import torch

from .errors import ConfigError

POSITIONAL = ("none", "standard", "shortformer", "rotary", "random", "abacus")  # see interp.positions
OUTPUT_MATRIX = ("identity", "learned")
NORMALIZATION = (None, "LN", "LNPre", "RMS", "RMSPre")


@dataclass(frozen=True)
class ModelSpec:
    """Everything needed to rebuild a model's architecture (weights come from training or a file)."""

    d_vocab: int
    n_ctx: int
    n_layers: int = 1
    d_model: int = 32
    n_heads: int = 16
    d_head: int = 2
    d_vocab_out: int | None = None
    attn_only: bool = True
    d_mlp: int | None = None
    positional: str = "none"
    output_matrix: str = "identity"
    attn_bias: bool = False
    unembed_bias: bool = True
    normalization: str | None = None
    act_fn: str = "relu"
    init_seed: int = 0
    digit_tokens: tuple[int, ...] | None = None  # positional="abacus": the token ids that form numbers
    max_position_offset: int = 0  # positional="abacus": training offsets are drawn from 0 .. this

    def __post_init__(self):
        for name in ("d_vocab", "n_ctx", "n_layers", "d_model", "n_heads", "d_head"):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise ConfigError(f"{name} must be a positive integer, got {v!r}")
        if self.d_vocab_out is not None and (not isinstance(self.d_vocab_out, int) or self.d_vocab_out < 1):
            raise ConfigError(f"d_vocab_out must be a positive integer or None, got {self.d_vocab_out!r}")
        if self.positional not in POSITIONAL:
            raise ConfigError(f"positional must be one of {POSITIONAL}, got {self.positional!r}")
        if self.output_matrix not in OUTPUT_MATRIX:
            raise ConfigError(f"output_matrix must be one of {OUTPUT_MATRIX}, got {self.output_matrix!r}")
        if self.digit_tokens is not None:
            object.__setattr__(self, "digit_tokens", tuple(int(t) for t in self.digit_tokens))
        if self.positional == "abacus" and not self.digit_tokens:
            raise ConfigError("positional='abacus' needs digit_tokens (the token ids whose runs are numbers)")
        if not isinstance(self.max_position_offset, int) or not 0 <= self.max_position_offset < self.n_ctx:
            raise ConfigError(f"max_position_offset must be an integer in [0, n_ctx), got {self.max_position_offset!r}")
        if self.normalization not in NORMALIZATION:
            raise ConfigError(f"normalization must be one of {NORMALIZATION}, got {self.normalization!r}")
        if self.output_matrix == "identity" and self.n_heads * self.d_head != self.d_model:
            raise ConfigError(
                f"output_matrix='identity' needs n_heads * d_head == d_model, got {self.n_heads} * {self.d_head} "
                f"!= {self.d_model}; use output_matrix='learned'"
            )

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        if d["digit_tokens"] is not None:
            d["digit_tokens"] = list(d["digit_tokens"])
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "ModelSpec":
        known = {f.name for f in fields(cls)}
        unknown = set(d) - known
        if unknown:
            raise ConfigError(f"unknown model spec field(s) {sorted(unknown)}; known fields: {sorted(known)}")
        return cls(**d)

    def tl_config_kwargs(self, device: str | None) -> dict[str, Any]:
        """The HookedTransformerConfig keyword arguments for this spec (TransformerLens' own field names; JSON
        types only apart from ``device``): ``HookedTransformer(HookedTransformerConfig(**kw))`` builds it."""
        return dict(
            n_layers=self.n_layers, d_model=self.d_model, n_heads=self.n_heads, d_head=self.d_head,
            d_vocab=self.d_vocab, d_vocab_out=self.d_vocab_out or self.d_vocab, n_ctx=self.n_ctx,
            attn_only=self.attn_only, d_mlp=None if self.attn_only else (self.d_mlp or 4 * self.d_model),
            act_fn=self.act_fn, normalization_type=self.normalization,
            positional_embedding_type=self.positional if self.positional in ("shortformer", "rotary") else "standard",
            seed=self.init_seed, device=device,
            **({"rotary_dim": self.d_head} if self.positional == "rotary" else {}),
        )


def quiet_tl():
    """Silence TransformerLens' deprecation warnings (HookedTransformer is deprecated in 3.x)."""
    warnings.filterwarnings("ignore", message=".*HookedTransformer is deprecated.*")
    warnings.filterwarnings("ignore", category=DeprecationWarning, module="transformer_lens.*")


def build_model(spec: ModelSpec, device: str | None = None):
    """A freshly initialised HookedTransformer for ``spec`` on ``device`` with the frozen parts set."""
    from .device import pick_device

    device = pick_device(device)
    quiet_tl()
    from transformer_lens import HookedTransformer, HookedTransformerConfig

    # HookedTransformerConfig(seed=...) reseeds the global RNGs; keep the caller's RNG stream intact.
    rng_state = torch.random.get_rng_state()
    try:
        cfg = HookedTransformerConfig(**spec.tl_config_kwargs(device))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            model = HookedTransformer(cfg, move_to_device=True)
    finally:
        torch.random.set_rng_state(rng_state)
    apply_frozen(model, spec)
    if spec.positional in ("random", "abacus"):
        from .positions import install

        install(model, spec.positional, spec.digit_tokens or (), spec.max_position_offset)
    return model


def frozen_values(spec: ModelSpec, shapes: dict[str, tuple[int, ...]]) -> dict[str, torch.Tensor]:
    """The parameters the spec fixes, by state-dict name -> their required value (zero W_pos, the identity W_O,
    zero attention / unembedding biases)."""
    out = {}
    if spec.positional == "none" and "pos_embed.W_pos" in shapes:
        out["pos_embed.W_pos"] = torch.zeros(shapes["pos_embed.W_pos"])
    for l in range(spec.n_layers):
        if spec.output_matrix == "identity":
            out[f"blocks.{l}.attn.W_O"] = torch.eye(spec.d_model).reshape(spec.n_heads, spec.d_head, spec.d_model)
        if not spec.attn_bias:
            for b in ("b_Q", "b_K", "b_V", "b_O"):
                name = f"blocks.{l}.attn.{b}"
                if name in shapes:
                    out[name] = torch.zeros(shapes[name])
    if not spec.unembed_bias and "unembed.b_U" in shapes:
        out["unembed.b_U"] = torch.zeros(shapes["unembed.b_U"])
    return out


def extend_context(model, n_ctx: int) -> None:
    """Let a model without positional embedding (``W_pos`` zero) take sequences up to ``n_ctx`` tokens: nothing in
    it depends on position, so ``W_pos`` is extended with zero rows (in place; the output is unchanged)."""
    cfg = model.cfg
    if n_ctx <= cfg.n_ctx:
        return
    w_pos = model.pos_embed.W_pos
    if cfg.positional_embedding_type != "standard" or bool(w_pos.detach().abs().max() > 0):
        raise ConfigError(f"only a model without positional embedding (W_pos all zero) can take sequences longer than "
                          f"its context n_ctx={cfg.n_ctx}; this one has a {cfg.positional_embedding_type!r} positional embedding")
    extra = torch.zeros(n_ctx - cfg.n_ctx, w_pos.shape[1], device=w_pos.device, dtype=w_pos.dtype)
    model.pos_embed.W_pos = torch.nn.Parameter(torch.cat([w_pos.detach(), extra]), requires_grad=False)
    cfg.n_ctx = n_ctx


def apply_frozen(model, spec: ModelSpec) -> None:
    """Set and freeze the parameters the spec fixes (W_pos, W_O, biases)."""
    with torch.no_grad():
        if spec.positional == "none":
            model.pos_embed.W_pos.zero_()
            model.pos_embed.W_pos.requires_grad_(False)
        for block in model.blocks:
            attn = block.attn
            if spec.output_matrix == "identity":
                eye = torch.eye(spec.d_model, device=attn.W_O.device, dtype=attn.W_O.dtype)
                attn.W_O.copy_(eye.reshape(spec.n_heads, spec.d_head, spec.d_model))
                attn.W_O.requires_grad_(False)
            if not spec.attn_bias:
                for p in (attn.b_Q, attn.b_K, attn.b_V, attn.b_O):
                    p.zero_()
                    p.requires_grad_(False)
        if not spec.unembed_bias:
            model.unembed.b_U.zero_()
            model.unembed.b_U.requires_grad_(False)


def trainable_parameters(model) -> list[torch.nn.Parameter]:
    return [p for p in model.parameters() if p.requires_grad]
