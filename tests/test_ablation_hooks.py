"""The one head-ablation hook (:func:`interp.ablation.ablation_hooks`) against plain hooks written here."""

from __future__ import annotations

import pytest
import torch
from transformer_lens import HookedTransformer, HookedTransformerConfig

from interp.ablation import ablation_hooks
from interp.errors import HeadError


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    cfg = HookedTransformerConfig(
        n_layers=2, d_model=16, n_ctx=8, d_head=4, n_heads=3, d_vocab=7, act_fn="relu", d_mlp=8
    )
    return HookedTransformer(cfg).eval()


def _plain(model, tokens, off, ref=None):
    """Ablate each (layer, head) in ``off`` by hand: z[:, :, head] = 0 or ref[layer, head]."""

    def hook(z, hook):
        z = z.clone()
        for l, h in off:
            if l == hook.layer():
                z[:, :, h] = 0 if ref is None else ref[l, h]
        return z

    return model.run_with_hooks(tokens, fwd_hooks=[(f"blocks.{l}.attn.hook_z", hook) for l in range(2)])


def test_zero_and_mean_ablation_equal_plain_hooks(model):
    tokens = torch.randint(0, 7, (5, 8))
    keep = torch.ones(2, 3)
    keep[0, 1] = keep[1, 2] = 0
    ref = torch.randn(2, 3, 4)
    torch.testing.assert_close(
        model.run_with_hooks(tokens, fwd_hooks=ablation_hooks(model, keep)), _plain(model, tokens, [(0, 1), (1, 2)])
    )
    torch.testing.assert_close(
        model.run_with_hooks(tokens, fwd_hooks=ablation_hooks(model, keep, ref)),
        _plain(model, tokens, [(0, 1), (1, 2)], ref),
    )
    assert ablation_hooks(model, torch.ones(2, 3)) == []  # nothing ablated: the plain forward


def test_a_mask_per_row_equals_one_run_per_subset(model):
    tokens = torch.randint(0, 7, (4, 8))
    subsets = [[(0, 0)], [(1, 1), (0, 2)], []]
    keep = torch.ones(len(subsets), 2, 3)
    for i, s in enumerate(subsets):
        for l, h in s:
            keep[i, l, h] = 0
    rows = keep.repeat_interleave(len(tokens), 0)  # subset-major, the batch repeated per subset
    out = model.run_with_hooks(tokens.repeat(len(subsets), 1), fwd_hooks=ablation_hooks(model, rows))
    for i, s in enumerate(subsets):
        torch.testing.assert_close(out[i * 4 : (i + 1) * 4], _plain(model, tokens, s))


def test_a_mask_of_another_shape_is_refused(model):
    with pytest.raises(HeadError, match="does not fit this model"):
        ablation_hooks(model, torch.ones(3, 2))
    with pytest.raises(HeadError, match="one mask row per batch row"):
        model.run_with_hooks(torch.zeros(2, 3, dtype=torch.long), fwd_hooks=ablation_hooks(model, torch.zeros(5, 2, 3)))
