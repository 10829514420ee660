"""Data generation rules of the noisy-majority task (Fraknói 2024, §5.1-5.2)."""

import pytest
import torch

from interp.errors import TaskError, TokenError
from interp.task import IGNORE
from interp.tasks import get_task
from interp.tasks.noisy_majority import BOS, EOS, EQ, FIVE, FOUR, PAD, VOCAB, make_sentences


def test_vocabulary_matches_the_seed():
    assert VOCAB.tokens[:8] == ("[BOS]", "0", "1", "2", "=", "4", "5", "[EOS]")
    assert VOCAB.n_out == 8 and VOCAB.pad == 8  # padding is input-only, never predicted
    assert VOCAB.decode(VOCAB.encode("[BOS] 0 1 2 = 4 [EOS]")) == ["[BOS]", "0", "1", "2", "=", "4", "[EOS]"]


def test_labels_ties_and_empty_inputs():
    data = make_sentences([[], [2, 2], [0, 1], [0, 1, 1], [1, 0, 0, 2], [1], [0], [2, 1, 2]])
    expected = [FOUR, FOUR, FOUR, FIVE, FOUR, FIVE, FOUR, FIVE]
    assert data.labels.tolist() == expected


def test_sentence_layout_and_targets():
    data = make_sentences([[0, 2, 1, 1], []])
    row = data.tokens[0].tolist()
    assert row == [BOS, 1, 3, 2, 2, EQ, FIVE, EOS]
    assert data.tokens[1].tolist()[:4] == [BOS, EQ, FOUR, EOS] and set(data.tokens[1, 4:].tolist()) == {PAD}
    assert data.answer_pos.tolist() == [5, 1]
    # targets: the answer at '=', [EOS] at the answer, nothing elsewhere
    t = data.targets[0].tolist()
    assert t[5] == FIVE and t[6] == EOS and all(v == IGNORE for i, v in enumerate(t) if i not in (5, 6))
    assert data.lengths.tolist() == [8, 4]


def test_splits_sizes_lengths_and_counts():
    task = get_task("noisy-majority")
    for split, size, (lo, hi) in (("train", 7500, (0, 100)), ("val", 1500, (101, 150)), ("test", 1000, (151, 200))):
        d = task.dataset(split)
        assert len(d) == size
        n = d.fields["n_digits"]
        assert int(n.min()) >= lo and int(n.max()) <= hi
        assert torch.equal(d.fields["n0"] + d.fields["n1"] + d.fields["n2"], n)
        digits = d.tokens[:, 1:]
        for tok, key in ((1, "n0"), (2, "n1"), (3, "n2")):
            assert torch.equal((digits == tok).sum(1), d.fields[key])
        assert torch.equal(d.labels, torch.where(d.fields["n0"] >= d.fields["n1"], FOUR, FIVE))
    # the train split covers the edges of its length range (empty inputs included)
    n = task.dataset("train").fields["n_digits"]
    assert int(n.min()) == 0 and int(n.max()) == 100


def test_generation_is_deterministic_per_seed():
    a, b = get_task("noisy-majority"), get_task("noisy-majority")
    assert torch.equal(a.dataset("train").tokens, b.dataset("train").tokens)
    assert not torch.equal(a.dataset("test").tokens, a.dataset("test", seed=1).tokens)
    assert not torch.equal(get_task("noisy-majority", seed=3).dataset("val").tokens, a.dataset("val").tokens)


def test_configurable_sizes():
    task = get_task("noisy-majority", train_size=10, val_size=3, test_size=4, test_lengths=[5, 6])
    assert len(task.dataset("train")) == 10 and len(task.dataset("test")) == 4
    assert int(task.dataset("test").fields["n_digits"].max()) <= 6
    assert task.params()["test_lengths"] == [5, 6]


@pytest.mark.parametrize(
    "params", [{"train_size": 0}, {"test_lengths": [5, 2]}, {"val_lengths": [1, 2, 3]}, {"seed": -1}, {"bogus": 1}]
)
def test_bad_task_parameters_are_refused(params):
    with pytest.raises(TaskError):
        get_task("noisy-majority", **params)


def test_bad_inputs_are_refused():
    with pytest.raises(TaskError, match="unknown task"):
        get_task("no-such-task")
    with pytest.raises(TaskError, match="unknown split"):
        get_task("noisy-majority").dataset("dev")
    with pytest.raises(TaskError, match="digits must be 0, 1 or 2"):
        make_sentences([[0, 3]])
    with pytest.raises(TokenError, match="unknown token"):
        VOCAB.encode("[BOS] 7 =")
    with pytest.raises(TokenError, match="outside the vocabulary"):
        VOCAB.decode([0, 42])


@pytest.mark.parametrize("split", ["train", "val", "test"])
def test_metrics_equal_the_masked_mean_bit_for_bit(split):
    """The loss is gathered at each sentence's two target positions; the plain definition masks every position
    (``loss[targets != IGNORE]``): the same numbers in the same order, so the same float, on whole splits and on a
    shuffled subset (padding trimmed); the accuracies against a per-sentence loop."""
    task = get_task("noisy-majority", train_size=300, val_size=200, test_size=100)
    data = task.dataset(split)
    g = torch.Generator().manual_seed(3)
    for d in (data, data.select(torch.randperm(len(data), generator=g)[:77])):
        preds = torch.randint(0, VOCAB.n_out, d.tokens.shape, generator=g)
        preds[::3, :] = d.targets[::3, :].clamp(min=0)  # some rows right
        loss = torch.rand(d.tokens.shape, generator=g) * 5
        m = task.metrics(preds, loss, d)
        mask = d.targets != IGNORE
        assert m["loss"] == (loss[mask].sum() / mask.sum()).item()
        rows, n = range(len(d)), len(d)
        right = sum(int(preds[i, d.answer_pos[i]] == d.labels[i]) for i in rows)
        eos = sum(int(preds[i, d.answer_pos[i] + 1] == EOS) for i in rows)
        assert m["accuracy"] == (torch.tensor(float(right)) / n).item()  # a float32 share, as the task's
        assert m["eos_accuracy"] == (torch.tensor(float(eos)) / n).item()
