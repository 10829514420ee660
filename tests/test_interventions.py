"""Attention interventions (analyses.noisy_majority.interventions, Figure 8): the hand-set rows have the asked-for
ratios, the cached path equals the hook on hook_pattern, head outputs equal the closed form from the value vectors, and
with 2s ignored every head separates tie-free data."""

from __future__ import annotations

import json
import math

import pytest
import torch

from interp.analyses.noisy_majority.head_outputs import head_outputs, value_vectors
from interp.analyses.noisy_majority.interventions import (
    attention_intervention_sweep,
    intervened_head_outputs,
    intervention_rows,
)
from interp.errors import InterpError
from interp.tasks.noisy_majority import BOS, ONE, TWO, ZERO, make_sentences

SETTINGS = [(1.0, math.inf), (4.0, math.inf), (1.0, 4.0), (0.25, 1.0)]


@pytest.fixture(scope="module")
def short_data(nm_ckpt):
    return nm_ckpt.task.dataset("train").select(slice(0, 24))


def test_rows_have_the_requested_ratios():
    data = make_sentences([[0, 0, 1, 2, 2, 1, 0], [2, 2], []])
    rows = intervention_rows(data.tokens, data.answer_pos, [(3.0, 5.0), (1.0, math.inf)], [ZERO, ONE, TWO])
    assert torch.allclose(rows.sum(-1), torch.ones(2, 3))
    r = rows[0, 0]
    tok = data.tokens[0]
    assert r[tok == ZERO][0] / r[tok == ONE][0] == pytest.approx(3.0)
    assert r[tok == ZERO][0] / r[tok == TWO][0] == pytest.approx(5.0)
    assert r[0] == 0 and r[int(data.answer_pos[0])] == 0  # [BOS] and '=' get nothing
    assert (rows[1, 0][tok == TWO] == 0).all()
    # no 0s or 1s and 2s ignored: the row falls back to [BOS]
    assert rows[1, 1, 0] == 1.0 and rows[1, 2, 0] == 1.0
    assert data.tokens[1, 0] == BOS


def test_cached_equals_hook_on_pattern(nm_ckpt, short_data):
    """Tolerance 1e-5: the same sum over positions, in another order."""
    cached = intervened_head_outputs(nm_ckpt.model, short_data, settings=SETTINGS, method="fast")
    hooked = intervened_head_outputs(nm_ckpt.model, short_data, settings=SETTINGS, method="hooks")
    assert cached.shape == (4, 24, 16, 2)
    assert torch.allclose(cached, hooked, atol=1e-5)


def test_outputs_equal_closed_form(nm_ckpt, short_data):
    """With w02 = inf: z = (w01 n0 v0 + n1 v1) / (w01 n0 + n1), from the head's value vectors."""
    model = nm_ckpt.model
    data = short_data.select((short_data.fields["n0"] + short_data.fields["n1"]) > 0)
    z = intervened_head_outputs(model, data, settings=[(4.0, math.inf)])[0]
    n0 = data.fields["n0"].double()[:, None]
    n1 = data.fields["n1"].double()[:, None]
    for h in (0, 7, 15):
        v = value_vectors(model, heads=f"L0H{h}").double()
        expected = (4.0 * n0 * v[0] + n1 * v[1]) / (4.0 * n0 + n1)
        assert torch.allclose(z[:, h].double(), expected, atol=1e-5)


def test_sweep_with_twos_ignored_separates(nm_ckpt):
    """Figure 8, left: with 2s ignored every head's output lies on its v0-v1 segment, monotone in the share of
    1s, so the mean separation accuracy over heads is near perfect on tie-free data (>= 0.97 here)."""
    task = nm_ckpt.task
    train = task.dataset("train").select(slice(0, 400))
    test = task.dataset("test").select(slice(0, 150))
    train = train.select(train.fields["n0"] != train.fields["n1"])
    test = test.select(test.fields["n0"] != test.fields["n1"])
    sweep = attention_intervention_sweep(
        nm_ckpt.model, test, train=train, w01_values=(0.5, 1.0, 2.0), w02_values=(1.0, math.inf)
    )
    assert sweep.w01_accuracy.shape == (3, 16) and sweep.w02_accuracy.shape == (2, 16)
    assert (sweep.w01_mean >= 0.97).all()
    assert sweep.w02_mean[1] >= 0.97  # w01 = 1, w02 = inf is the same setting as the middle one on the left
    assert sweep.w02_mean[1].item() == pytest.approx(sweep.w01_mean[1].item(), abs=1e-9)
    d = json.loads(json.dumps(sweep.to_dict()))
    assert d["w01_one"]["w02"] == [1.0, None] and len(d["heads"]) == 16
    fig = sweep.figure()
    assert len(fig.data) == 2 and fig.layout.xaxis.type == "log"


def test_head_outputs_figure(nm_ckpt, short_data):
    res = head_outputs(nm_ckpt.model, short_data, heads="L0H1")
    assert res.outputs.shape == (24, 2) and res.values.shape == (3, 2)
    fig = res.figure()
    assert fig.data[-1].name == "value vectors" and sum(len(t.x) for t in fig.data[:-1]) == 24


def test_bad_input(nm_ckpt, short_data):
    model = nm_ckpt.model
    with pytest.raises(InterpError, match="0 < w01"):
        intervened_head_outputs(model, short_data, settings=[(0.0, 1.0)])
    with pytest.raises(InterpError, match="no intervention settings"):
        intervened_head_outputs(model, short_data, settings=[])
    with pytest.raises(InterpError, match="pair"):
        intervened_head_outputs(model, short_data, settings=[1.0])
    with pytest.raises(InterpError, match="layer"):
        intervened_head_outputs(model, short_data, settings=SETTINGS, layer=1)
