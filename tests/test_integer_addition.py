"""The integer-addition task (carry cases, enrichment, metrics), the positional schemes (positions on small
examples, checkpoint round trips) and the task's analyses, each against an independent computation."""

from __future__ import annotations

import random

import pytest
import torch

from interp.checkpoint import Checkpoint, save_checkpoint
from interp.errors import ConfigError, TaskError, TokenError
from interp.evaluation import evaluate
from interp.model import ModelSpec, build_model
from interp.positions import position_hook, position_ids, run_index
from interp.query_forward import supports_query_forward
from interp.task import IGNORE
from interp.tasks import get_task, load_checkpoint
from interp.tasks.integer_addition import BOS, EOS, EQ, PAD, PLUS, VOCAB, carry_structure, digits_of, make_sums

# ---------------------------------------------------------------------------------------------------------------
# the task


def plain_cases(a: int, b: int, n: int):
    """Answer digits (units first), per-digit case and Quirke class by a slow loop over Python ints."""
    ad = [(a // 10**i) % 10 for i in range(n)] + [0]
    bd = [(b // 10**i) % 10 for i in range(n)] + [0]
    cases, carry, depth = [], 0, 0
    for i in range(n + 1):
        s = ad[i] + bd[i]
        cases.append(depth if carry else 0)
        if s >= 10:
            depth = 1
        elif s + carry >= 10:  # a sum-9 pair passing a carry on
            depth += 1
        else:
            depth = 0
        carry = 1 if s + carry >= 10 else 0
    answer = [((a + b) // 10**i) % 10 for i in range(n + 1)]
    has_carry = any(ad[i] + bd[i] >= 10 for i in range(n))
    return answer, cases, (max(*cases, 1) if has_carry else 0)


def test_hand_picked_99999_plus_00001():
    d = make_sums([99999], [1], [5])
    assert VOCAB.decode(d.tokens[0]) == [
        "[BOS]",
        "9",
        "9",
        "9",
        "9",
        "9",
        "+",
        "0",
        "0",
        "0",
        "0",
        "1",
        "=",
        "0",
        "0",
        "0",
        "0",
        "0",
        "1",
        "[EOS]",
    ]
    assert d.fields["answer"][0].tolist() == [0, 0, 0, 0, 0, 1]
    assert d.fields["pair_kind"][0].tolist() == [2, 1, 1, 1, 1]  # MC1 then four sum-9 pairs
    assert d.fields["digit_case"][0].tolist() == [0, 1, 2, 3, 4, 5]  # BA, UC1, US9-1 .. US9-4
    assert d.fields["complexity"][0].item() == 5  # Quirke's S5
    # the model predicts the answer digits and [EOS] from '=' on
    assert int(d.answer_pos[0]) == 12 and int(d.labels[0]) == 0
    assert d.targets[0].tolist() == [IGNORE] * 12 + [0, 0, 0, 0, 0, 1, EOS, IGNORE]


def test_hand_picked_45_plus_55_both_orders():
    d = make_sums([45], [55], [2])
    assert d.fields["answer"][0].tolist() == [0, 0, 1]
    assert d.fields["pair_kind"][0].tolist() == [2, 1]
    assert d.fields["digit_case"][0].tolist() == [0, 1, 2]  # units BA, tens UC1, hundreds US9-1
    assert d.fields["complexity"][0].item() == 2
    assert d.tokens[0].tolist() == [BOS, 4, 5, PLUS, 5, 5, EQ, 0, 0, 1, EOS]
    msf = make_sums([45], [55], [2], reverse_answer=False, reverse_operands=True)
    assert msf.tokens[0].tolist() == [BOS, 5, 4, PLUS, 5, 5, EQ, 1, 0, 0, EOS]
    plain = make_sums([12], [34], [2])
    assert plain.fields["digit_case"][0].tolist() == [0, 0, 0] and plain.fields["complexity"][0].item() == 0


def test_carry_structure_matches_plain_loop():
    rng = random.Random(0)
    sums = [(rng.randrange(10**n), rng.randrange(10**n), n) for n in (1, 2, 3, 5, 7) for _ in range(60)]
    sums += [(99999, 1, 5), (45, 55, 2), (9, 1, 1), (5, 4, 1), (999, 999, 3), (4950, 5050, 4)]
    a, b, n = digits_of([s[0] for s in sums], [s[1] for s in sums], [s[2] for s in sums])
    answer, _kind, case, comp = carry_structure(a, b, n)
    for i, (x, y, m) in enumerate(sums):
        want_answer, want_case, want_comp = plain_cases(x, y, m)
        assert answer[i, : m + 1].tolist() == want_answer
        assert case[i, : m + 1].tolist() == want_case
        assert (case[i, m + 1 :] == -1).all()
        assert comp[i].item() == want_comp, (x, y)


def test_dataset_every_case_occurs_and_enrichment():
    task = get_task("integer-addition", train_size=4000, val_size=100, test_size=100, cascades_size=300)
    train = task.dataset("train")
    assert set(train.fields["complexity"].tolist()) == {0, 1, 2, 3, 4, 5}
    assert set(train.fields["digit_case"].flatten().tolist()) == {0, 1, 2, 3, 4, 5}
    assert set(train.fields["pair_kind"].flatten().tolist()) == {0, 1, 2}
    casc = task.dataset("cascades")
    assert (casc.fields["complexity"] >= 2).all()  # every rare-case sum holds a cascade
    assert set(casc.fields["complexity"].tolist()) == {2, 3, 4, 5}
    # the answers are right
    for i in range(50):
        a = sum(int(v) * 10**j for j, v in enumerate(train.fields["a"][i]))
        b = sum(int(v) * 10**j for j, v in enumerate(train.fields["b"][i]))
        c = sum(int(v) * 10**j for j, v in enumerate(train.fields["answer"][i]))
        assert a + b == c
    # deterministic
    assert torch.equal(task.dataset("train").tokens, train.tokens)
    assert not torch.equal(task.dataset("train", seed=1).tokens, train.tokens)


def test_uniform_sums_follow_r13():
    """peers.md R13: P(carry per digit pair) = 0.45, P(sum 9) = 0.10, S0 fraction 0.55**5 = 0.0503 (no enrichment).
    Tolerance: 4 binomial standard deviations."""
    task = get_task("integer-addition", test_size=20000)
    d = task.dataset("test")
    kind = d.fields["pair_kind"]
    n_pairs = kind.numel()
    for code, p in ((2, 0.45), (1, 0.10)):
        got = (kind == code).float().mean().item()
        assert abs(got - p) < 4 * (p * (1 - p) / n_pairs) ** 0.5
    s0 = (d.fields["complexity"] == 0).float().mean().item()
    assert abs(s0 - 0.55**5) < 4 * (0.0503 * 0.9497 / 20000) ** 0.5


def test_variable_lengths_and_padding():
    task = get_task("integer-addition", digits=[1, 3], train_size=500)
    d = task.dataset("train")
    n = d.fields["n_digits"]
    assert set(n.tolist()) == {1, 2, 3}
    assert torch.equal(d.lengths, 3 * n + 5)
    rows = torch.arange(len(d))
    assert (d.tokens[rows, d.answer_pos] == EQ).all()
    assert (d.tokens[rows, d.lengths - 1] == EOS).all()
    assert (d.tokens[n == 1][:, 8:] == PAD).all()
    assert ((d.targets != IGNORE).sum(1) == n + 2).all()  # n + 1 answer digits and [EOS]


def test_metrics_exact_match_and_per_digit():
    task = get_task("integer-addition")
    d = make_sums([99999, 45, 12345], [1, 55, 11111], [5, 5, 5])
    perfect = torch.where(d.targets == IGNORE, -1, d.targets)
    m = task.metrics(perfect, torch.zeros(d.tokens.shape), d)
    assert m["accuracy"] == 1.0 and m["digit_5"] == 1.0 and m["eos_accuracy"] == 1.0
    wrong = perfect.clone()
    wrong[0, 12 + 5] = 7  # the leading digit (10**5) of the first sum: answer written units first
    m = task.metrics(wrong, torch.zeros(d.tokens.shape), d)
    assert m["accuracy"] == pytest.approx(2 / 3) and m["digit_5"] == pytest.approx(2 / 3) and m["digit_0"] == 1.0


def test_task_errors():
    with pytest.raises(TaskError, match="digits"):
        get_task("integer-addition", digits=[0, 3])
    with pytest.raises(TaskError, match="max_digits"):
        get_task("integer-addition", digits=5, max_digits=3)
    with pytest.raises(TaskError, match="enrich"):
        get_task("integer-addition", enrich=2)
    with pytest.raises(TaskError, match="too small"):
        make_sums([100], [1], [2])
    task = get_task("integer-addition")
    assert get_task("integer-addition", **task.params()) == task


# ---------------------------------------------------------------------------------------------------------------
# positional schemes


def test_abacus_positions_on_a_small_example():
    d = make_sums([45], [55], [2], reverse_operands=True)  # [BOS] 5 4 + 5 5 = 0 0 1 [EOS]
    tok = d.tokens
    assert run_index(tok, range(10)).tolist() == [[0, 1, 2, 0, 1, 2, 0, 1, 2, 3, 0]]
    pos = position_ids(tok, "abacus", 20, digit_tokens=range(10))
    assert pos.tolist() == [[0, 1, 2, 0, 1, 2, 0, 1, 2, 3, 0]]  # units of a, b and the answer share row 1
    torch.manual_seed(0)
    pos = position_ids(tok.repeat(64, 1), "abacus", 20, training=True, digit_tokens=range(10), max_offset=5)
    offsets = pos[:, 1] - 1
    assert set(offsets.tolist()) == set(range(6))
    idx = run_index(tok, range(10)).repeat(64, 1)
    assert torch.equal(pos, torch.where(idx > 0, idx + offsets[:, None], 0))
    with pytest.raises(TokenError, match="Abacus position"):
        position_ids(tok, "abacus", 3, digit_tokens=range(10))


def test_random_and_standard_positions():
    tok = torch.zeros(200, 7, dtype=torch.long)
    assert position_ids(tok, "random", 20).tolist() == [list(range(7))] * 200  # eval: rows 0..T-1
    torch.manual_seed(0)
    pos = position_ids(tok, "random", 20, training=True)
    assert (pos[:, 1:] > pos[:, :-1]).all() and int(pos.min()) >= 0 and int(pos.max()) < 20
    assert int(pos.max()) > 7  # rows beyond the sequence length are used
    assert position_ids(tok, "standard", 20).tolist() == [list(range(7))] * 200


def _spec(task, positional, **kw):
    return ModelSpec(
        **{
            **task.default_spec(),
            "d_model": 16,
            "n_heads": 2,
            "d_head": 8,
            "d_mlp": 32,
            "positional": positional,
            "max_position_offset": 2,
            **kw,
        }
    )


def test_hooked_positions_equal_plain_transformerlens():
    """The abacus model's forward equals a plain TransformerLens model with the same weights whose hook_pos_embed is
    replaced by W_pos[abacus rows] computed by hand."""
    task = get_task("integer-addition", digits=2, reverse_operands=True)
    spec = _spec(task, "abacus")
    model = build_model(spec, "cpu").eval()
    plain = build_model(_spec(task, "standard"), "cpu").eval()
    plain.load_state_dict(model.state_dict())
    d = make_sums([45, 99], [55, 1], [2, 2], reverse_operands=True)
    rows = torch.tensor([[0, 1, 2, 0, 1, 2, 0, 1, 2, 3, 0]] * 2)
    hook = ("hook_pos_embed", lambda x, hook: plain.W_pos[rows])
    want = plain.run_with_hooks(d.tokens, fwd_hooks=[hook])
    assert torch.allclose(model(d.tokens), want, atol=1e-6)
    assert not torch.allclose(plain(d.tokens), want, atol=1e-3)
    assert position_hook(model).scheme == "abacus" and position_hook(plain) is None


def test_rotary_and_none_configs():
    task = get_task("integer-addition", digits=2)
    rot = build_model(_spec(task, "rotary"), "cpu")
    assert rot.cfg.positional_embedding_type == "rotary" and rot.cfg.rotary_dim == 8
    assert not hasattr(rot, "pos_embed")
    nope = build_model(_spec(task, "none"), "cpu")
    assert not bool(nope.W_pos.abs().max() > 0)
    one = build_model(_spec(task, "abacus", n_layers=1, attn_only=True), "cpu")
    assert not supports_query_forward(one)  # the query-restricted fast path ignores the hooked positions
    with pytest.raises(ConfigError, match="digit_tokens"):
        _spec(task, "abacus", digit_tokens=None)


def _perturbed(spec, seed: int, scale: float):
    """A model of ``spec`` with noise of ``scale`` added to its trainable weights (so outputs are not near-uniform),
    in eval mode."""
    torch.manual_seed(seed)
    model = build_model(spec, "cpu")
    with torch.no_grad():
        for p in model.parameters():
            if p.requires_grad:
                p.add_(scale * torch.randn_like(p))
    return model.eval()


@pytest.mark.parametrize("positional", ["standard", "none", "rotary", "random", "abacus"])
def test_checkpoint_round_trip_per_scheme(tmp_path, positional):
    task = get_task("integer-addition", digits=2, reverse_operands=True, val_size=50, test_size=50, cascades_size=20)
    spec = _spec(task, positional)
    model = _perturbed(spec, seed=0, scale=0.1)
    path = save_checkpoint(model, task, tmp_path / f"{positional}.safetensors", training={"seed": 0}, spec=spec)
    ckpt = load_checkpoint(path, device="cpu")
    assert ckpt.spec == spec and ckpt.spec.positional == positional
    assert ckpt.task == task
    d = task.dataset("test")
    assert torch.equal(ckpt.model(d.tokens), model(d.tokens))
    hook = position_hook(ckpt.model)
    assert (hook.scheme if hook else None) == (positional if positional in ("random", "abacus") else None)


def test_training_mode_positions_differ_only_for_random_schemes():
    task = get_task("integer-addition", digits=2, reverse_operands=True)
    d = make_sums([45], [55], [2], reverse_operands=True)
    for positional, differs in (("standard", False), ("random", True), ("abacus", True)):
        model = build_model(_spec(task, positional), "cpu")
        model.eval()
        ev = model(d.tokens)
        model.train()
        torch.manual_seed(3)
        outs = [model(d.tokens) for _ in range(4)]
        assert any(not torch.allclose(o, ev) for o in outs) == differs, positional


# ---------------------------------------------------------------------------------------------------------------
# analyses


@pytest.fixture(scope="module")
def small_model():
    task = get_task("integer-addition", digits=[1, 3], max_digits=4, test_size=300, cascades_size=100, val_size=100)
    spec = _spec(task, "standard")
    return task, spec, _perturbed(spec, seed=1, scale=0.3)


def _loop_correct(model, data):
    """Per-example, per-digit correctness by a plain loop: one forward per sum, positions found by hand."""
    out = []
    for i in range(len(data)):
        L = int(data.lengths[i])
        toks = data.tokens[i : i + 1, :L]
        pred = model(toks)[0].argmax(-1)
        n = int(data.fields["n_digits"][i])
        eq = 2 * n + 2
        out.append([int(pred[eq + j]) == int(data.fields["answer"][i, j]) for j in range(n + 1)])  # units first
    return out


def test_accuracy_by_case_and_length_against_loop(small_model):
    from interp.analyses.integer_addition.accuracy import accuracy_by_case, accuracy_by_length, correct_digits

    task, _, model = small_model
    d = task.dataset("cascades")
    loop = _loop_correct(model, d)
    ok = correct_digits(model, d)
    for i, row in enumerate(loop):
        assert ok[i, : len(row)].tolist() == row
    res = accuracy_by_case(model, d)
    cases = d.fields["digit_case"]
    for name, code in (("BA", 0), ("UC1", 1), ("US9-1", 2)):
        vals = [row[j] for i, row in enumerate(loop) for j in range(len(row)) if int(cases[i, j]) == code]
        assert res.by_digit_case[name]["n"] == len(vals)
        assert res.by_digit_case[name]["accuracy"] == pytest.approx(sum(vals) / len(vals), abs=1e-6)
    assert res.exact_match == pytest.approx(sum(all(r) for r in loop) / len(loop), abs=1e-6)
    assert res.exact_match == pytest.approx(evaluate(model, task, d)["accuracy"], abs=1e-6)
    lengths = accuracy_by_length(model, task=task, lengths=[1, 2, 4, 6], n=40)
    assert lengths.exact_match[3] is None  # 6-digit sums do not fit the context of a max_digits=4 model
    t2 = get_task("integer-addition", **{**task.params(), "test_digits": [2, 2], "test_size": 40})
    loop2 = _loop_correct(model, t2.dataset("test"))
    assert lengths.exact_match[1] == pytest.approx(sum(all(r) for r in loop2) / 40, abs=1e-6)
    res.to_json(), lengths.to_json(), res.figure(), lengths.figure()


def test_component_ablation_against_attn_result_hooks(small_model):
    """Mean-ablating a head's z equals replacing its hook_result (z W_O, per head) by its mean: checked for every
    head with TransformerLens' use_attn_result path, and an MLP group by a plain hook."""
    from interp.analyses.integer_addition.ablation import component_ablation
    from interp.tasks.integer_addition import digit_correct

    task, _, model = small_model
    d = task.dataset("test")
    d = d.select(d.fields["n_digits"] == 3)
    res = component_ablation(model, d, neuron_groups=2)
    cfg = model.cfg
    assert len(res.components) == cfg.n_layers * cfg.n_heads + cfg.n_layers * 2
    model.set_use_attn_result(True)
    try:
        for i, (l, h) in enumerate((l, h) for l in range(cfg.n_layers) for h in range(cfg.n_heads)):
            name = f"blocks.{l}.attn.hook_result"
            _, cache = model.run_with_cache(d.tokens, names_filter=name)
            mean = cache[name].mean(0)

            def hook(r, hook, h=h, mean=mean):
                r = r.clone()
                r[:, :, h] = mean[None, :, h]
                return r

            preds = model.run_with_hooks(d.tokens, fwd_hooks=[(name, hook)]).argmax(-1)
            ok = digit_correct(preds, d).float()
            assert res.digit_accuracy[i].tolist() == pytest.approx(ok.mean(0).tolist(), abs=1e-6), res.components[i]
    finally:
        model.set_use_attn_result(False)
    res.to_json(), res.figure(), res.case_figure()
    with pytest.raises(TaskError, match="one operand length"):
        component_ablation(model, task.dataset("test"))


def test_suite_on_a_small_checkpoint(small_model, tmp_path):
    from interp.analyses import suite_for
    from interp.report_page import Report

    task, spec, model = small_model
    suite = suite_for(task)
    ckpt = Checkpoint(model, task, spec=spec)
    res = suite.analyze(ckpt)
    doc = res.to_dict()
    assert set(doc["by_case"]) == {"test", "cascades"} and set(doc["by_length"]["by_length"]) == {"1", "2", "3", "4"}
    assert "exact match" in res.text()
    report = Report()
    suite.add_report_sections(ckpt, report)
    assert "carry cascade" in report.html()


@pytest.mark.parametrize("positional", ["random", "abacus"])
def test_training_with_hooked_positions_is_reproducible(tmp_path, positional):
    """The trainer runs the position hook in training mode (random rows / offsets from the seeded RNG): the same
    seed gives the same weights, and the written checkpoint loads back with its hook."""
    from interp.training import TrainConfig, train

    task = get_task(
        "integer-addition",
        digits=[1, 2],
        reverse_operands=True,
        train_size=64,
        val_size=16,
        test_size=16,
        cascades_size=8,
    )
    spec = _spec(task, positional)
    cfg = TrainConfig(epochs=2, batch_size=32, seed=0, dropout=0.0)
    paths = [
        train(task, spec, cfg, tmp_path / f"{i}.safetensors", progress=False) and tmp_path / f"{i}.safetensors"
        for i in range(2)
    ]
    a, b = (load_checkpoint(p, device="cpu") for p in paths)
    assert all(torch.equal(x, y) for x, y in zip(a.model.state_dict().values(), b.model.state_dict().values()))
    assert position_hook(a.model).scheme == positional


def test_comparison_table_and_wilson_interval():
    """The comparison script's table: means / spreads over seeds and the pooled Wilson interval (closed form checked
    at k = 0, where the upper end is z^2 / (n + z^2), and against the normal approximation for large n)."""
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "examples" / "positional_comparison.py"
    spec = importlib.util.spec_from_file_location("positional_comparison", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    lo, hi = mod.wilson(0, 1000)
    assert lo == 0.0 and hi == pytest.approx(1.96**2 / (1000 + 1.96**2), rel=1e-9)
    lo, hi = mod.wilson(50_000, 100_000)
    assert (hi - lo) / 2 == pytest.approx(1.96 * 0.5 / 100_000**0.5, rel=1e-3)
    runs = [
        {"scheme": "abacus", "seed": s, "by_length": {str(n): {"exact_match": acc, "n": 1000} for n in range(1, 7)}}
        for s, acc in ((0, 0.5), (1, 0.7))
    ]
    rows = mod.table(runs)
    assert len(rows) == 6 and rows[3]["digits"] == 4 and not rows[3]["in_training"]
    assert rows[0]["mean"] == pytest.approx(0.6) and (rows[0]["min"], rows[0]["max"]) == (0.5, 0.7)
    assert (rows[0]["wilson_lo"], rows[0]["wilson_hi"]) == pytest.approx(mod.wilson(1200, 2000))
