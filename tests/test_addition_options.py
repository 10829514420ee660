"""Integer addition's options, each against an independent computation: random spaces and the scratchpad decode to
the same sums (parsed back by a plain loop over Python ints), the auxiliary carry targets and loss, the curriculum's
schedule batch by batch (in the sampler and in a trained checkpoint's history), ALiBi positions (scores against the
bias written out), greedy decoding (a plain loop of one sentence at a time) and the sub-task probes (labels by a plain
loop, accuracy by a probe fitted here)."""

from __future__ import annotations

import random

import pytest
import torch
import torch.nn.functional as F

from interp.curriculum import batches, parse_curriculum
from interp.errors import ConfigError, TaskError
from interp.evaluation import evaluate
from interp.model import ModelSpec, build_model, extend_context
from interp.task import IGNORE
from interp.tasks import get_task, load_checkpoint
from interp.tasks.integer_addition import BLANK, EOS, EQ, PLUS, VOCAB, digits_of, make_sums, read_sums
from interp.training import TrainConfig, aux_batch_loss, train

SMALL = dict(train_size=400, val_size=50, test_size=60, cascades_size=40, max_digits=6)


def value(digits, units_first=True):
    digits = list(digits) if units_first else list(digits)[::-1]
    return sum(int(d) * 10**i for i, d in enumerate(digits))


def test_random_spaces_decode_to_the_same_sums():
    plain = get_task("integer-addition", digits=[1, 5], **SMALL)
    spaced = get_task("integer-addition", digits=[1, 5], random_spaces=0.4, **SMALL)
    assert len(spaced.vocab) == len(VOCAB) + 1 and spaced.vocab.tokens[BLANK] == "_" and spaced.vocab.n_out == 11
    assert plain.vocab == VOCAB  # without the option the vocabulary (and the shipped checkpoint) is as it was
    for split in ("train", "val", "test"):
        a, b = plain.dataset(split), spaced.dataset(split)
        sums = read_sums(b.tokens, reverse_operands=False, reverse_answer=True)
        assert sums == read_sums(a.tokens, reverse_operands=False, reverse_answer=True)
        for i, (x, y, written, _) in enumerate(sums):  # the parsed sums are the task's, and right
            assert x == value(a.fields["a"][i]) and y == value(a.fields["b"][i]) and written == x + y
        blanks = (b.tokens == BLANK).sum(1)
        assert torch.equal(blanks, b.fields["blanks"]) and torch.equal(b.lengths, a.lengths + blanks)
        if split == "test":
            assert int(blanks.sum()) == 0  # the test sums are written without blanks
        else:  # about 40% of the 2n + 1 gaps hold one
            share = float(blanks.sum()) / float((2 * a.fields["n_digits"] + 1).sum())
            assert 0.3 < share < 0.5
            assert int(b.lengths.max()) <= spaced.n_ctx
        # the targets are the same tokens, moved past the blanks; nothing is predicted at a blank or to be a blank
        assert torch.equal(a.targets[a.targets != IGNORE], b.targets[b.targets != IGNORE])
        assert not bool((b.targets == BLANK).any())
        rows, cols = (b.targets != IGNORE).nonzero(as_tuple=True)
        assert torch.equal(b.tokens[rows, cols + 1], b.targets[rows, cols])  # a target is the next token
        # the answer positions still point at the answer: perfect predictions score 1
        preds = torch.where(b.targets == IGNORE, -1, b.targets)
        assert spaced.metrics(preds, torch.zeros(b.tokens.shape), b)["accuracy"] == 1.0
    with pytest.raises(TaskError, match="random_spaces"):
        get_task("integer-addition", random_spaces=1.5)


def test_the_scratchpad_decodes_to_the_same_sums():
    rng = random.Random(0)
    sums = [(rng.randrange(10**n), rng.randrange(10**n), n) for n in (1, 2, 3, 6) for _ in range(40)]
    sums += [(99999, 1, 5), (45, 55, 2), (9, 1, 1), (999, 999, 3)]
    a, b, n = digits_of([s[0] for s in sums], [s[1] for s in sums], [s[2] for s in sums])
    for rev_ops in (False, True):
        d = make_sums(a, b, n, reverse_operands=rev_ops, scratchpad=True)
        parsed = read_sums(d.tokens, reverse_operands=rev_ops, reverse_answer=True)
        for (x, y, _), (px, py, written, steps) in zip(sums, parsed):
            assert (px, py, written, steps) == (x, y, x + y, x + y)
        # the steps, written out: digit-wise sums, then the carries out of each place, units first
        for row, (x, y, m) in zip(d.tokens, sums):
            toks = row.tolist()
            eq = toks.index(EQ)
            carry, sums_out, carries_out = 0, [], []
            for i in range(m):
                s = (x // 10**i) % 10 + (y // 10**i) % 10
                sums_out.append(s % 10)
                carry = int(s + carry >= 10)
                carries_out.append(carry)
            assert toks[eq + 1 : eq + 1 + 2 * m + 2] == [*sums_out, PLUS, *carries_out, EQ]
    task = get_task("integer-addition", digits=[1, 3], scratchpad=True, **SMALL)
    assert task.vocab.n_out == EQ + 1 and task.vocab.tokens == VOCAB.tokens  # '+' and '=' are written: outputs
    data = task.dataset("train")
    assert int(data.lengths.max()) <= task.n_ctx
    assert torch.equal(data.lengths, task.sentence_length(1) + 5 * (data.fields["n_digits"] - 1))
    preds = torch.where(data.targets == IGNORE, -1, data.targets)
    m = task.metrics(preds, torch.zeros(data.tokens.shape), data)
    assert m["accuracy"] == m["scratchpad_accuracy"] == 1.0
    first = data.fields["scratch_start"] - 1  # the prediction of the first step
    wrong = preds.clone()
    wrong[torch.arange(len(data)), first] = (data.tokens[torch.arange(len(data)), first + 1] + 1) % 10
    m = task.metrics(wrong, torch.zeros(data.tokens.shape), data)
    assert m["accuracy"] == m["scratchpad_accuracy"] == 0.0 and m["digit_0"] == 1.0  # the answer digits are right


def test_aux_targets_are_the_carries_at_the_second_operand(tmp_path):
    d = make_sums([358, 4, 99], [179, 7, 1], [3, 3, 2], reverse_operands=True)
    # 358 + 179: carries out of places 0, 1, 2 are 1, 1, 0; written at b's digits (positions 5, 6, 7)
    assert d.aux_targets[0].tolist()[5:8] == [1, 1, 0] and (d.aux_targets[0, :5] == IGNORE).all()
    assert d.aux_targets[1].tolist()[5:8] == [1, 0, 0]
    assert d.aux_targets[2].tolist()[4:6] == [1, 1] and (d.aux_targets[2, 6:] == IGNORE).all()
    assert make_sums([358], [179], [3]).aux_targets is None  # most-significant digit first: no such position
    task = get_task("integer-addition", digits=[1, 3], reverse_operands=True, **SMALL)
    spec = ModelSpec(**{**task.default_spec(), "d_model": 16, "n_heads": 2, "d_head": 8, "d_mlp": 32})
    model = build_model(spec, device="cpu")
    batch = task.dataset("train").select(slice(0, 32))
    logits = model(batch.tokens)
    flat = logits.reshape(-1, logits.shape[-1])
    main = F.cross_entropy(flat, batch.targets.reshape(-1), ignore_index=IGNORE)
    aux = F.cross_entropy(flat, batch.aux_targets.reshape(-1), ignore_index=IGNORE)
    torch.testing.assert_close(aux_batch_loss(model, batch, [], 0.5), main + 0.5 * aux)
    plain = get_task("integer-addition", digits=[1, 3], **SMALL)
    with pytest.raises(ConfigError, match="no auxiliary targets"):
        train(plain, spec, TrainConfig(epochs=1, aux_loss=0.5), tmp_path / "x.safetensors", progress=False)


def test_the_curriculum_schedule_batch_by_batch(tmp_path):
    c = parse_curriculum("n_digits:1@0,2@3,3@7")
    assert [c.level_at(s) for s in range(9)] == [1, 1, 1, 2, 2, 2, 2, 3, 3] and str(c) == "n_digits:1@0,2@3,3@7"
    for bad in ("n_digits", "n_digits:1@5", "n_digits:2@0,1@4", "n_digits:1@0,2@0", "x:a@0", "1x:1@0"):
        with pytest.raises(ConfigError, match="curriculum"):
            parse_curriculum(bad)
    with pytest.raises(ConfigError, match="curriculum"):
        TrainConfig(curriculum="n_digits:1@3")
    levels = torch.tensor([1, 2, 3] * 20)
    gen = torch.Generator().manual_seed(0)
    drawn = list(batches(c, levels, [8] * 9, 0, gen))
    for step, idx in enumerate(drawn):
        assert len(set(idx.tolist())) == 8 and int(levels[idx].max()) <= c.level_at(step)
    # trained: the history records each batch's largest level, which is the schedule's level at its step
    task = get_task("integer-addition", digits=[1, 3], **SMALL)
    spec = ModelSpec(**{**task.default_spec(), "n_layers": 1, "d_model": 16, "n_heads": 2, "d_head": 8, "d_mlp": 32})
    cfg = TrainConfig(epochs=2, batch_size=100, dropout=0.0, curriculum="n_digits:1@0,2@3,3@6", keep="last")
    train(task, spec, cfg, tmp_path / "c.safetensors", progress=False)
    ckpt = load_checkpoint(tmp_path / "c.safetensors", device="cpu")
    seen = [lv for h in ckpt.training["history"] for lv in h["batch_levels"]]
    assert seen == [1, 1, 1, 2, 2, 2, 3, 3]  # 400 sums in batches of 100: 4 steps per epoch
    assert ckpt.training["config"]["curriculum"] == "n_digits:1@0,2@3,3@6"
    with pytest.raises(ConfigError, match="no per-example integer field 'width'"):
        train(task, spec, TrainConfig(epochs=1, curriculum="width:1@0"), tmp_path / "w.safetensors", progress=False)


def test_alibi_scores_are_the_bias_written_out(tmp_path):
    task = get_task("integer-addition", digits=[1, 3], **SMALL)
    spec = ModelSpec(**{**task.default_spec(), "positional": "alibi", "d_model": 16, "n_heads": 4, "d_head": 4})
    model = build_model(spec, device="cpu").eval()
    assert not model.pos_embed.W_pos.requires_grad and not bool(model.pos_embed.W_pos.any())
    tokens = task.dataset("test").tokens[:3]
    _, cache = model.run_with_cache(tokens)
    q, k = cache["blocks.0.attn.hook_q"], cache["blocks.0.attn.hook_k"]
    t = tokens.shape[1]
    slopes = torch.tensor([2 ** (-8 * (h + 1) / 4) for h in range(4)])  # Press et al.'s slopes for 4 heads
    dist = (torch.arange(t)[None, :] - torch.arange(t)[:, None]).clamp(max=0).float()  # key - query, <= 0
    want = torch.einsum("bqhd,bkhd->bhqk", q, k) / 2 + slopes[None, :, None, None] * dist
    want = want.masked_fill(~torch.ones(t, t, dtype=torch.bool).tril(), float("-inf")).softmax(-1)
    torch.testing.assert_close(cache["blocks.0.attn.hook_pattern"], want, atol=1e-5, rtol=1e-5)
    # no position limits it: the context extends, and a checkpoint tested on longer sums takes them
    path = tmp_path / "alibi.safetensors"
    from interp.checkpoint import save_checkpoint

    save_checkpoint(model, task, path, spec=spec)
    long = load_checkpoint(path, device="cpu", task_params={"test_digits": [9, 9], "max_digits": 9})
    assert long.model.cfg.n_ctx == long.task.n_ctx and evaluate(long.model, long.task, long.task.dataset("test"))
    with torch.no_grad():
        before = model(tokens)
        extend_context(model, 80)
        assert torch.equal(model(tokens), before)


def test_greedy_decoding_against_one_sentence_at_a_time(tmp_path):
    from interp.analyses.integer_addition import decoding

    task = get_task("integer-addition", digits=[1, 2], scratchpad=True, reverse_operands=True, **SMALL)
    spec = ModelSpec(**{**task.default_spec(), "n_layers": 1, "d_model": 16, "n_heads": 2, "d_head": 8, "d_mlp": 32})
    train(task, spec, TrainConfig(epochs=3, batch_size=32, lr=3e-3, dropout=0.0), tmp_path / "s.safetensors",
          progress=False)  # fmt: skip
    model = load_checkpoint(tmp_path / "s.safetensors", device="cpu").model
    data = task.dataset("test").select(slice(0, 12))
    got = decoding.greedy_tokens(model, data, batch_size=5)
    right = []
    for i in range(len(data)):  # one sentence at a time, one token at a time
        row = data.tokens[i, : int(data.lengths[i])].clone()
        for p in (data.targets[i] != IGNORE).nonzero().squeeze(1).tolist():
            with torch.no_grad():
                row[p + 1] = model(row[None, : p + 1])[0, -1].argmax()
        assert torch.equal(got[i, : len(row)], row)
        n, start = int(data.fields["n_digits"][i]), int(data.fields["answer_start"][i])
        right.append(row[start : start + n + 1].tolist() == data.fields["answer"][i, : n + 1].tolist())
    res = decoding.greedy_exact_match(model, data)
    assert res.exact_match == pytest.approx(sum(right) / len(right)) and res.n == len(data)
    assert sum(v["n"] for v in res.by_length.values()) == len(data) and res.steps_right is not None
    # without a scratchpad, greedy decoding's exact match is teacher-forced exact match
    plain = get_task("integer-addition", digits=[1, 2], **SMALL)
    p_spec = ModelSpec(**{**plain.default_spec(), "n_layers": 1, "d_model": 16, "n_heads": 2, "d_head": 8})
    train(plain, p_spec, TrainConfig(epochs=3, batch_size=32, lr=3e-3, dropout=0.0), tmp_path / "p.safetensors",
          progress=False)  # fmt: skip
    pm = load_checkpoint(tmp_path / "p.safetensors", device="cpu").model
    test = plain.dataset("test")
    assert decoding.greedy_exact_match(pm, test).exact_match == pytest.approx(evaluate(pm, plain, test)["accuracy"])


def test_sentence_lengths_and_the_context():
    for kw in ({}, {"scratchpad": True}, {"random_spaces": 0.5}, {"scratchpad": True, "random_spaces": 1.0}):
        task = get_task("integer-addition", digits=[2, 4], **{**SMALL, "max_digits": 4}, **kw)
        for split in ("train", "test"):
            d = task.dataset(split)
            blanks = kw.get("random_spaces", 0) > 0 and split == "train"
            most = torch.tensor([task.sentence_length(int(n), blanks=blanks) for n in d.fields["n_digits"]])
            assert bool((d.lengths <= most).all())
            if kw.get("random_spaces") == 1.0 and split == "train":
                assert torch.equal(d.lengths, most)  # every gap holds a blank
        assert task.n_ctx >= int(task.dataset("train").lengths.max())
        assert d.tokens[torch.arange(len(d)), d.lengths - 1].eq(EOS).all()


def test_populations_refuse_what_they_do_not_train():
    from interp.population import check_population

    task = get_task("noisy-majority")
    base = ModelSpec(**task.default_spec())
    with pytest.raises(ConfigError, match="loops=2"):
        check_population([ModelSpec(**{**task.default_spec(), "loops": 2})], [TrainConfig()])
    for cfg in (TrainConfig(curriculum="n0:1@0"), TrainConfig(aux_loss=1.0)):
        with pytest.raises(ConfigError, match="curriculum or an auxiliary loss"):
            check_population([base], [cfg])
