"""Model specs -> ``transformer_lens.HookedTransformer``.

The thesis's special shapes (no positional embedding, no output matrix, no attention biases) are
expressed with the config plus frozen parameters, never a forked model class:

- ``positional="none"``: ``W_pos`` is zeroed and frozen (TransformerLens has no NoPE option);
  ``"rotary"`` and ``"alibi"`` are TransformerLens' own (ALiBi's unused ``W_pos`` zeroed and frozen too);
  ``"random"`` and ``"abacus"`` add a forward hook on ``pos_embed`` (the ``W_pos`` row each token reads;
  :mod:`interp.positions`).
- ``output_matrix="identity"``: ``W_O`` is the fixed block identity (head ``h``'s dimension ``i`` writes
  to residual dimension ``h*d_head + i``); needs ``n_heads * d_head == d_model``. Left unset (``None``), the spec
  takes the identity where the heads fill the residual stream exactly (the thesis's models have no output matrix)
  and a learned ``W_O`` otherwise (the thesis's 64-head model with d = 2): see :attr:`ModelSpec.w_o`.
- ``attn_bias=False``: ``b_Q, b_K, b_V, b_O`` are zero and frozen. The unembedding bias ``b_U`` (the
  seed's ``b_H``) stays trainable unless ``unembed_bias=False``.
- ``loops > 1``: a looped transformer, ``n_layers * loops`` blocks whose iterations share the weights of the first
  ``n_layers`` and read the embedded input again (:mod:`interp.looping`);
- ``attention`` / ``qkv`` other than ``softmax`` / ``full``: the attention variant's masks, pooling scores and Q/K/V
  constraints, installed by :func:`interp.attention.install` (a lone ``window:W`` is TransformerLens' own local
  attention, set in the config).
"""

from __future__ import annotations

import warnings
from typing import TYPE_CHECKING

import torch

from .configs import ModelSpec
from .errors import ConfigError

if TYPE_CHECKING:
    from transformer_lens import HookedTransformer

__all__ = [
    "ModelSpec",
    "apply_frozen",
    "build_model",
    "extend_context",
    "frozen_values",
    "quiet_tl",
    "trainable_parameters",
]


# schemes whose W_pos is zero and frozen: none (no positions at all) and alibi (TransformerLens' ALiBi biases the
# attention scores and never reads W_pos; zeroed, it takes no weight decay and a checkpoint's W_pos says so)
UNUSED_W_POS = ("none", "alibi")


def quiet_tl():
    """Silence TransformerLens' deprecation warnings (HookedTransformer is deprecated in 3.x)."""
    warnings.filterwarnings("ignore", message=".*HookedTransformer is deprecated.*")
    warnings.filterwarnings("ignore", category=DeprecationWarning, module="transformer_lens.*")


def build_model(spec: ModelSpec, device: str | None = None) -> HookedTransformer:
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
    if spec.loops > 1:
        from .looping import install as install_loop

        install_loop(model, spec.n_layers, spec.input_injection)
    apply_frozen(model, spec)
    if spec.positional in ("random", "abacus"):
        from .positions import install

        install(model, spec.positional, spec.digit_tokens or (), spec.max_position_offset)
    if spec.attention != "softmax" or spec.qkv != "full":
        from .attention import install as install_attention

        install_attention(model, spec)
    return model


def frozen_values(spec: ModelSpec, shapes: dict[str, tuple[int, ...]]) -> dict[str, torch.Tensor]:
    """The parameters the spec fixes, by state-dict name -> their required value (zero W_pos, the identity W_O,
    zero attention / unembedding biases)."""
    out = {}
    if spec.positional in UNUSED_W_POS and "pos_embed.W_pos" in shapes:
        out["pos_embed.W_pos"] = torch.zeros(shapes["pos_embed.W_pos"])
    for l in range(spec.n_layers):
        if spec.w_o == "identity":
            out[f"blocks.{l}.attn.W_O"] = torch.eye(spec.d_model).reshape(spec.n_heads, spec.d_head, spec.d_model)
        if not spec.attn_bias:
            for b in ("b_Q", "b_K", "b_V", "b_O"):
                name = f"blocks.{l}.attn.{b}"
                if name in shapes:
                    out[name] = torch.zeros(shapes[name])
    if not spec.unembed_bias and "unembed.b_U" in shapes:
        out["unembed.b_U"] = torch.zeros(shapes["unembed.b_U"])
    return out


def extend_context(model: HookedTransformer, n_ctx: int) -> None:
    """Let a model without positional embedding (``W_pos`` zero), or with ALiBi positions (biases computed for any
    distance; ``W_pos`` unused), take sequences up to ``n_ctx`` tokens: ``W_pos`` is extended with zero rows (in
    place; the output is unchanged; TransformerLens builds its causal mask and ALiBi biases for the length it is
    given)."""
    cfg = model.cfg
    if n_ctx <= cfg.n_ctx:
        return
    w_pos = model.pos_embed.W_pos
    if not extendable(model):
        raise ConfigError(
            f"only a model without positional embedding (W_pos all zero) or with ALiBi positions can take sequences "
            f"longer than its context n_ctx={cfg.n_ctx}; this one has a {cfg.positional_embedding_type!r} "
            "positional embedding"
        )
    extra = torch.zeros(n_ctx - cfg.n_ctx, w_pos.shape[1], device=w_pos.device, dtype=w_pos.dtype)
    model.pos_embed.W_pos = torch.nn.Parameter(torch.cat([w_pos.detach(), extra]), requires_grad=False)
    cfg.n_ctx = n_ctx


def extendable(model: HookedTransformer) -> bool:
    """Whether nothing in ``model`` limits the length of its input to its ``n_ctx`` (no positional embedding, ALiBi
    positions): :func:`extend_context` can lengthen it."""
    cfg = model.cfg
    w_pos = getattr(getattr(model, "pos_embed", None), "W_pos", None)
    if w_pos is None or bool(w_pos.detach().abs().max() > 0):
        return False
    return cfg.positional_embedding_type in ("standard", "alibi")


def apply_frozen(model: HookedTransformer, spec: ModelSpec) -> None:
    """Set and freeze the parameters the spec fixes (W_pos, W_O, biases)."""
    with torch.no_grad():
        if spec.positional in UNUSED_W_POS:
            model.pos_embed.W_pos.zero_()
            model.pos_embed.W_pos.requires_grad_(False)
        for block in model.blocks:
            attn = block.attn
            if spec.w_o == "identity":
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


def trainable_parameters(model: HookedTransformer) -> list[torch.nn.Parameter]:
    return [p for p in model.parameters() if p.requires_grad]
