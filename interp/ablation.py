"""Head ablation through ``hook_z``: the one hook of the toolkit that switches heads off.

A head is ablated through its output ``z`` (TransformerLens' ``hook_z``, before ``W_O``): zero ablation replaces it
by 0, mean ablation by a reference output (its mean over a dataset). A head mask is 1 for a head that is kept and 0
for one that is ablated, everywhere in the toolkit (:func:`interp.heads.head_mask` builds it). A mask with a leading
``rows`` axis gives each batch row its own head set, so that many head subsets run in one forward on a batch repeated
once per subset (subset-major).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from jaxtyping import Float
from torch import Tensor

from .errors import HeadError

if TYPE_CHECKING:
    from transformer_lens import HookedTransformer

Hook = tuple[str, Callable]
Reference = Float[Tensor, "layer head d_head"] | Float[Tensor, "layer pos head d_head"] | None


def ablation_hooks(
    model: HookedTransformer,
    keep: Float[Tensor, "layer head"] | Float[Tensor, "rows layer head"],
    reference: Reference = None,
) -> list[Hook]:
    """``hook_z`` hooks that keep the heads where ``keep`` is 1 and replace the others' output ``z`` by
    ``reference`` (zero ablation where it is None; a mean output per head ``[layer, head, d_head]``, or per position
    ``[layer, pos, head, d_head]``, for mean ablation). ``keep`` with a leading ``rows`` axis gives batch row ``r``
    the head set ``keep[r]``. Values between 0 and 1 interpolate. Only layers with an ablated head get a hook, so a
    mask of ones runs the plain forward."""
    n_layers, n_heads = model.cfg.n_layers, model.cfg.n_heads
    if tuple(keep.shape[-2:]) != (n_layers, n_heads):
        raise HeadError(
            f"a head mask of shape {tuple(keep.shape)} does not fit this model ({n_layers} layer(s) x {n_heads} "
            f"head(s)); expected [..., {n_layers}, {n_heads}], 1 = kept and 0 = ablated"
        )
    if reference is not None and (reference.shape[0] != n_layers or reference.shape[-2] != n_heads):
        raise HeadError(
            f"a reference output of shape {tuple(reference.shape)} does not fit this model; expected "
            f"[{n_layers}, {n_heads}, d_head] or [{n_layers}, pos, {n_heads}, d_head]"
        )
    per_row = keep.dim() == 3
    ablated = (keep != 1).flatten(0, -3).any(0) if per_row else keep != 1  # [layer, head]
    hooks = []
    for layer in range(n_layers):
        if not bool(ablated[layer].any()):
            continue
        m = keep[:, layer] if per_row else keep[layer]  # [rows, head] or [head]

        def hook(z: Tensor, hook, m: Tensor = m, layer: int = layer) -> Tensor:
            if per_row and m.shape[0] != z.shape[0]:
                raise HeadError(
                    f"a head mask with {m.shape[0]} rows was applied to a batch of {z.shape[0]}; expected one "
                    "mask row per batch row"
                )
            k = (m[:, None, :, None] if per_row else m[None, None, :, None]).to(z.dtype)
            if reference is None:
                return z * k
            ref = reference[layer].to(z.dtype)
            ref = ref[None, None] if ref.dim() == 2 else ref[None, : z.shape[1]]
            return z * k + ref * (1 - k)

        hooks.append((f"blocks.{layer}.attn.hook_z", hook))
    return hooks
