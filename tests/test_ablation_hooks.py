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


def test_head_sets_reads_every_spelling():
    from interp.heads import head_sets

    one = torch.zeros(1, 2, 3)
    one[0, 0, 1] = one[0, 1, 0] = 1
    for spelling in (["L0H1", "L1H0"], [(0, 1), (1, 0)], ["0.1", (1, 0)], one[0], one):
        torch.testing.assert_close(head_sets(spelling, 2, 3), one)
    assert head_sets("L1H2", 2, 3)[0, 1, 2] == 1 and head_sets("L1H2", 2, 3).sum() == 1
    many = head_sets([["L0H1"], [], ["L0H0", "L1H2"]], 2, 3)
    assert many.shape == (3, 2, 3) and many.sum((1, 2)).tolist() == [1, 0, 2]
    assert head_sets(None, 2, 3).sum() == 6 and head_sets(None, 2, 3, default="each").shape == (6, 2, 3)
    for bad, match in [("L2H0", "out of range"), (["L0H1", "L0H1"], "twice"), (5, "cannot read"), (["x"], "cannot")]:
        with pytest.raises(HeadError, match=match):
            head_sets(bad, 2, 3)
    with pytest.raises(HeadError, match="does not fit"):
        head_sets(torch.ones(3, 2), 2, 3)


def test_check_device_follows_the_model_and_refuses_another(model):
    from interp.device import check_device
    from interp.errors import ConfigError

    assert check_device(model, None) == torch.device("cpu") == check_device(model, "cpu")
    with pytest.raises(ConfigError, match="the model is on cpu"):
        check_device(model, "cuda")
    with pytest.raises(ConfigError, match="unknown device"):
        check_device(model, "tpu:x")


def test_task_data_for_a_model_without_a_task(model):
    from interp.errors import TaskError
    from interp.evaluation import evaluate
    from interp.task import IGNORE, task_data

    tokens = torch.randint(0, 7, (4, 8))
    data = task_data(tokens, 7, tokens[:, 3])
    assert data.answer_pos.tolist() == [7] * 4 and (data.targets[:, :7] == IGNORE).all()
    assert (data.targets[:, 7] == tokens[:, 3]).all() and data.lengths.tolist() == [8] * 4
    logits = model(tokens)
    assert data.labels.shape == (4,) and logits.shape[:2] == (4, 8)
    with pytest.raises(TaskError, match="answer positions"):
        task_data(tokens, 8, tokens[:, 0])
    with pytest.raises(TaskError, match="one value per example"):
        task_data(tokens, 1, tokens[:2, 0])
    del evaluate
