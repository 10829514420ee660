"""The repeated-tokens task: data layout, determinism, first-occurrence vs repeat metrics, bad input."""

from __future__ import annotations

import pytest
import torch

from interp.errors import TaskError
from interp.task import IGNORE, Task
from interp.tasks import get_task
from interp.tasks.repeated_tokens import RepeatedTokens


@pytest.fixture(scope="module")
def task():
    return get_task("repeated-tokens", train_size=200, val_size=50, test_size=50)


def test_protocol_and_params_round_trip(task):
    assert isinstance(task, Task)
    again = get_task(task.name, **task.params())
    assert again == task
    spec = task.default_spec()
    assert (
        spec["d_vocab"] == len(task.vocab) == task.n_symbols + 1
        and spec["d_vocab_out"] == task.vocab.n_out == task.n_symbols
    )
    assert spec["n_ctx"] == task.seq_len + 1
    train = task.default_train()
    assert {"epochs", "batch_size", "lr", "weight_decay", "dropout"} <= set(train)


def test_sequences_are_bos_then_r_repeated(task):
    data = task.dataset("val")
    assert data.tokens.shape == (50, task.seq_len + 1)
    assert (data.tokens[:, 0] == task.bos).all() and (data.tokens[:, 1:] < task.n_symbols).all()
    lo, hi = task.repeat_lengths
    n = data.fields["repeat_len"]
    assert int(n.min()) >= lo and int(n.max()) <= hi
    for b in range(len(data)):
        body = data.tokens[b, 1:].tolist()
        k = int(n[b])
        assert all(body[j] == body[j % k] for j in range(len(body)))  # R repeated cyclically
    # every next-token position has a target; the last position has none
    assert torch.equal(data.targets[:, :-1], data.tokens[:, 1:]) and (data.targets[:, -1] == IGNORE).all()
    assert torch.equal(data.labels, data.tokens[:, -1]) and (data.answer_pos == task.seq_len - 1).all()


def test_deterministic_and_splits_differ(task):
    a, b = task.dataset("train"), task.dataset("train")
    assert torch.equal(a.tokens, b.tokens)
    assert not torch.equal(task.dataset("train", seed=1).tokens, a.tokens)
    assert not torch.equal(task.dataset("val").tokens, task.dataset("test").tokens)


def test_repeat_mask_marks_predictable_positions(task):
    data = task.make_sequences(torch.tensor([[3, 1, 4, 1, 5]]), 5)
    mask = task.repeat_mask(data)[0]
    # positions 0..5 predict R[0..4] and the first token of the 2nd copy: unpredictable; 6.. are repeats
    assert mask[:6].sum() == 0 and mask[6:-1].all() and not mask[-1]


def test_metrics_separate_first_and_repeat(task):
    data = task.dataset("val")
    rep = task.repeat_mask(data)
    first = (data.targets != IGNORE) & ~rep
    perfect = torch.where(data.targets == IGNORE, 0, data.targets)
    loss = torch.where(rep, 0.25, 3.0) * (data.targets != IGNORE)
    m = task.metrics(perfect, loss, data)
    assert m["accuracy"] == 1.0 and m["first_accuracy"] == 1.0 and m["answer_accuracy"] == 1.0
    assert m["loss"] == pytest.approx(0.25) and m["first_loss"] == pytest.approx(3.0)
    assert m["all_loss"] == pytest.approx(
        (0.25 * rep.sum() + 3.0 * first.sum()).item() / (rep.sum() + first.sum()).item()
    )
    # an oracle for the repeats only: right exactly where the token is predictable in context
    oracle = torch.where(rep, data.targets, (data.targets + 1) % task.n_symbols)
    m = task.metrics(oracle, loss, data)
    assert m["accuracy"] == 1.0 and m["first_accuracy"] == 0.0


def test_bad_input(task):
    with pytest.raises(TaskError, match="two copies"):
        RepeatedTokens(seq_len=20, repeat_lengths=(4, 11))
    with pytest.raises(TaskError, match="repeat_lengths"):
        RepeatedTokens(repeat_lengths=(0, 4))
    with pytest.raises(TaskError, match="n_symbols"):
        RepeatedTokens(n_symbols=1)
    with pytest.raises(TaskError, match="unknown split"):
        task.dataset("dev")
    with pytest.raises(TaskError, match="symbols must lie"):
        task.make_sequences(torch.tensor([[task.n_symbols]]), 1)
    with pytest.raises(TaskError, match="len\\(R\\)"):
        task.make_sequences(torch.zeros(1, 20, dtype=torch.long), 20)
    with pytest.raises(TaskError, match="noisy-majority"):
        task.check_data(get_task("noisy-majority", train_size=2, val_size=2, test_size=2).dataset("val"))
