"""Batched activation and path patching against TransformerLens' serial ``patching.get_act_patch_*`` functions
(same metric, same inputs), against slow loops of ``run_with_hooks`` where TransformerLens has no function (path
patching, ``per="layer"``), and against facts known in advance (clean into clean changes nothing; every head output
patched recovers the clean run of a one-layer attention-only model; the hand-built induction circuit's key path).

Tolerance: 1e-4 absolute and relative on metrics of order 1-10 (float32; the batched runs differ from the serial
ones only by summation order, and ``z`` patches add the heads' change of output to the cached residual stream
instead of running the layer again).
"""

from __future__ import annotations

import json

import pytest
import torch
from transformer_lens import HookedTransformer, HookedTransformerConfig
from transformer_lens import patching as tl_patching

from interp.analyses.patching import activation_patching, path_patching
from interp.analyses.reference import path_patching_loop, variant_metric
from interp.errors import HeadError, InterpError, TaskError, TokenError
from interp.task import IGNORE, TaskData

ATOL = RTOL = 1e-4
V, T, B = 7, 8, 3


def make_model(n_layers, n_heads, attn_only=True, normalization=None, seed=0, positional="standard"):
    cfg = HookedTransformerConfig(
        n_layers=n_layers,
        d_model=16,
        n_heads=n_heads,
        d_head=4,
        d_mlp=None if attn_only else 32,
        d_vocab=V,
        n_ctx=T,
        attn_only=attn_only,
        normalization_type=normalization,
        positional_embedding_type=positional,
        seed=seed,
        device="cpu",
        act_fn="relu",
    )
    model = HookedTransformer(cfg)
    with torch.no_grad():  # TransformerLens starts biases at 0; give them values so b_O etc. are exercised
        for name, p in model.named_parameters():
            if name.split(".")[-1].startswith("b_"):
                p.normal_(0, 0.1)
    return model.eval()


MODELS = {
    "1L1H": dict(n_layers=1, n_heads=1),
    "1L8H": dict(n_layers=1, n_heads=8),
    "2L3H": dict(n_layers=2, n_heads=3),
    "2L2H-mlp-ln": dict(n_layers=2, n_heads=2, attn_only=False, normalization="LN"),
}


@pytest.fixture(scope="module", params=list(MODELS))
def model(request):
    return make_model(**MODELS[request.param])


def pair(seed=0, b=B):
    """Clean and corrupted task data of random tokens: they differ at a few positions; answers at the last two."""
    gen = torch.Generator().manual_seed(seed)
    clean = torch.randint(0, V, (b, T), generator=gen)
    corrupted = clean.clone()
    corrupted[:, 2] = (clean[:, 2] + 1) % V
    corrupted[0, 4] = (clean[0, 4] + 2) % V
    answer_pos = torch.tensor([T - 1, T - 2, T - 1][:b] + [T - 1] * max(0, b - 3))
    labels, wrong = torch.arange(b) % V, (torch.arange(b) + 3) % V

    def data(tokens, lab):
        targets = torch.full_like(tokens, IGNORE)
        return TaskData("toy", tokens, targets, answer_pos, lab, torch.full((b,), T))

    return data(clean, labels), data(corrupted, wrong)


def callable_metric(logits):
    """A metric on full logits (TransformerLens' patching_metric): reads two positions."""
    return logits[:, -1, 0].mean() - logits[:, 3, 1].mean()


TL = [  # (where, per, TransformerLens function, our axes -> theirs)
    ("z", "head_pos", tl_patching.get_act_patch_attn_head_out_by_pos, (0, 2, 1)),
    ("z", "head", tl_patching.get_act_patch_attn_head_out_all_pos, None),
    ("q", "head_pos", tl_patching.get_act_patch_attn_head_q_by_pos, (0, 2, 1)),
    ("v", "head", tl_patching.get_act_patch_attn_head_v_all_pos, None),
    ("pattern", "head_pos", tl_patching.get_act_patch_attn_head_pattern_by_pos, None),
    ("pattern", "head", tl_patching.get_act_patch_attn_head_pattern_all_pos, None),
    ("resid_pre", "pos", tl_patching.get_act_patch_resid_pre, None),
    ("attn_out", "pos", tl_patching.get_act_patch_attn_out, None),
    ("mlp_out", "pos", tl_patching.get_act_patch_mlp_out, None),
]


def _tl(fn, model, clean, corrupted, metric, direction):
    base, source = (corrupted, clean) if direction == "denoising" else (clean, corrupted)
    _, cache = model.run_with_cache(source.tokens)
    return fn(model, base.tokens, cache, metric)


@pytest.mark.parametrize("where,per,fn,perm", TL, ids=[f"{w}-{p}" for w, p, *_ in TL])
def test_equals_transformer_lens(model, where, per, fn, perm, monkeypatch):
    if where == "mlp_out" and model.cfg.attn_only:  # nothing to compare: refused in one line instead
        clean, corrupted = pair()
        with pytest.raises(InterpError, match="mlp_out"):
            activation_patching(model, clean, corrupted=corrupted, metric="logit_diff", where=where, per=per)
        return
    monkeypatch.setattr(tl_patching, "tqdm", lambda x, **kw: x)
    clean, corrupted = pair()
    vm = variant_metric("logit_diff", clean, corrupted)
    for metric, tl_metric in (("logit_diff", vm.of_logits), (callable_metric, callable_metric)):
        for direction in ("denoising", "noising"):
            ours = activation_patching(
                model, clean, corrupted=corrupted, metric=metric, where=where, per=per, direction=direction
            )
            theirs = _tl(fn, model, clean, corrupted, tl_metric, direction).cpu()
            if perm:
                theirs = theirs.permute(*perm)
            assert ours.values.shape == theirs.shape
            torch.testing.assert_close(ours.values, theirs, atol=ATOL, rtol=RTOL)
            assert ours.corrupted == pytest.approx(float(tl_metric(model(corrupted.tokens).detach())), abs=ATOL)
            assert ours.clean == pytest.approx(float(tl_metric(model(clean.tokens).detach())), abs=ATOL)


@pytest.mark.parametrize("metric", ["loss", "accuracy"])
def test_loss_and_accuracy_metrics_equal_transformer_lens(metric, monkeypatch):
    monkeypatch.setattr(tl_patching, "tqdm", lambda x, **kw: x)
    model = make_model(2, 3, attn_only=False, normalization="LN")
    clean, corrupted = pair()
    vm = variant_metric(metric, clean, corrupted)
    for where, fn, perm in (
        ("z", tl_patching.get_act_patch_attn_head_out_by_pos, (0, 2, 1)),
        ("resid_pre", tl_patching.get_act_patch_resid_pre, None),
    ):
        ours = activation_patching(model, clean, corrupted=corrupted, metric=metric, where=where)
        theirs = _tl(fn, model, clean, corrupted, vm.of_logits, "denoising").cpu()
        torch.testing.assert_close(ours.values, theirs.permute(*perm) if perm else theirs, atol=ATOL, rtol=RTOL)


def test_small_chunks_and_layers_subset():
    model = make_model(2, 3)
    clean, corrupted = pair()
    full = activation_patching(model, clean, corrupted=corrupted, where="z")
    tiny = activation_patching(model, clean, corrupted=corrupted, where="z", batch_size=1, layers=[1])
    torch.testing.assert_close(tiny.values[0], full.values[1], atol=ATOL, rtol=RTOL)
    assert tiny.layers == [1]


@pytest.mark.parametrize("name", list(MODELS))
def test_clean_into_clean_changes_nothing(name):
    model = make_model(**MODELS[name])
    clean, _ = pair()
    for where, per in (("z", "head_pos"), ("pattern", "head"), ("resid_pre", "pos")):
        r = activation_patching(model, clean, corrupted=clean, metric=callable_metric, where=where, per=per)
        expect = float(callable_metric(model(clean.tokens).detach()))
        assert torch.allclose(r.values, torch.full_like(r.values, expect), atol=ATOL)
    if model.cfg.n_layers > 1:
        p = path_patching(model, clean, corrupted=clean, metric=callable_metric)
        assert torch.allclose(p.values, torch.full_like(p.values, expect), atol=ATOL)


@pytest.mark.parametrize("n_heads", [1, 8])
def test_every_head_output_recovers_the_clean_run(n_heads):
    """One layer, attention only: the logits are the direct path plus the heads' outputs. The corruption sits at
    positions 2 and 4 and the answers at the last two, where the direct path is the same in both runs; so patching
    every head's output at every position gives the clean metric exactly (and the corrupted one when noising)."""
    model = make_model(1, n_heads)
    clean, corrupted = pair()
    r = activation_patching(model, clean, corrupted=corrupted, metric="logit_diff", where="z", per="layer")
    assert r.values[0] == pytest.approx(r.clean, abs=ATOL)
    noised = activation_patching(
        model, clean, corrupted=corrupted, metric="logit_diff", where="z", per="layer", direction="noising"
    )
    assert noised.values[0] == pytest.approx(r.corrupted, abs=ATOL)


def test_single_heads_add_up_in_a_linear_model():
    """One layer, attention only, no LayerNorm: the logit difference is linear in the head outputs, so the heads'
    single-head denoising effects (all positions) add up to the effect of patching them all."""
    model = make_model(1, 8)
    clean, corrupted = pair()
    heads = activation_patching(model, clean, corrupted=corrupted, where="z", per="head")
    every = activation_patching(model, clean, corrupted=corrupted, where="z", per="layer")
    assert float((heads.values - heads.corrupted).sum()) == pytest.approx(
        float(every.values[0] - every.corrupted), abs=ATOL
    )


def test_per_layer_equals_a_loop_of_run_with_hooks():
    model = make_model(2, 3, attn_only=False, normalization="LN")
    clean, corrupted = pair()
    _, cache = model.run_with_cache(clean.tokens)
    vm = variant_metric("logit_diff", clean, corrupted)
    for where in ("z", "pattern", "v"):
        r = activation_patching(model, clean, corrupted=corrupted, metric="logit_diff", where=where, per="layer")
        for l in range(2):
            name = f"blocks.{l}.attn.hook_{where}"
            logits = model.run_with_hooks(corrupted.tokens, fwd_hooks=[(name, lambda z, hook: cache[hook.name])])
            assert float(r.values[l]) == pytest.approx(float(vm.of_logits(logits.detach())), abs=ATOL)


@pytest.mark.parametrize(
    "spec",
    [
        dict(n_layers=2, n_heads=1),
        dict(n_layers=2, n_heads=3),
        dict(n_layers=3, n_heads=2, attn_only=False, normalization="LN"),
    ],
    ids=["2L1H", "2L3H", "3L2H-mlp-ln"],
)
@pytest.mark.parametrize("direction", ["denoising", "noising"])
def test_path_patching_equals_a_slow_loop(spec, direction):
    model = make_model(**spec)
    clean, corrupted = pair(seed=1)
    L, H = model.cfg.n_layers, model.cfg.n_heads
    senders = [(l, h) for l in range(L - 1) for h in range(H)]
    receivers = [(l, h) for l in range(1, L) for h in range(H)]
    vm = variant_metric("logit_diff", clean, corrupted)
    ours = path_patching(
        model,
        clean,
        corrupted=corrupted,
        metric="logit_diff",
        senders=senders,
        receivers=receivers,
        direction=direction,
    )
    slow = path_patching_loop(
        model,
        clean,
        corrupted=corrupted,
        metric=vm.of_logits,
        senders=senders,
        receivers=receivers,
        direction=direction,
    )
    torch.testing.assert_close(ours.values, slow, atol=ATOL, rtol=RTOL, equal_nan=True)
    assert not model.cfg.use_split_qkv_input  # restored


def test_handbuilt_induction_key_path():
    """The hand-built circuit (shortformer positions: start_at_layer gets the positional embedding): moving the
    query token's earlier occurrence (the "key" corruption) is undone by patching the previous-token head's output
    into the induction head's key input alone; its query and value inputs do nothing."""
    from interp.analyses.repeated_tokens.corrupt import corrupted_pair
    from interp.analyses.repeated_tokens.handbuilt import induction_circuit_model
    from interp.tasks import get_task

    task = get_task("repeated-tokens", n_symbols=12, seq_len=20, repeat_lengths=(5, 10))
    model = induction_circuit_model(n_symbols=12, n_ctx=task.n_ctx)
    clean, corrupted = corrupted_pair(task, 8, kind="key", seed=0)
    p = path_patching(model, clean, corrupted=corrupted)
    assert p.clean > 5 and p.corrupted < -5
    q, k, v = p.normalized[0, 0].tolist()
    assert k > 0.95 and abs(q) < 0.05 and abs(v) < 0.05
    a = activation_patching(model, clean, corrupted=corrupted, where="z")
    top = a.top(3)
    assert {(r["head"], r["pos"]) for r in top[:2]} >= {("L1H0", task.seq_len - 1)}
    # the whole layer-0 output at every position restores the answer
    full = activation_patching(model, clean, corrupted=corrupted, where="z", per="layer")
    assert float(full.normalized[0]) > 0.95


def test_corruptions_change_the_answer_and_little_else():
    from interp.analyses.repeated_tokens.corrupt import KINDS, corrupted_pair
    from interp.tasks import get_task

    task = get_task("repeated-tokens")
    for kind in KINDS:
        clean, corr = corrupted_pair(task, 16, kind=kind)
        assert (clean.labels != corr.labels).all()
        changed = (clean.tokens != corr.tokens).sum(1)
        assert changed.max() <= 2 and changed.min() >= 1
        assert torch.equal(clean.answer_pos, corr.answer_pos)
    with pytest.raises(TaskError):
        corrupted_pair(task, 4, kind="value")
    with pytest.raises(TaskError):
        corrupted_pair(get_task("noisy-majority"), 4)


def test_noisy_majority_flip(nm_task):
    from interp.analyses.noisy_majority.corrupt import corrupted_pair, flip_answer
    from interp.tasks.noisy_majority import FIVE, FOUR, make_sentences

    clean, corr = corrupted_pair(nm_task, 16, n_digits=20, seed=2)
    assert (clean.labels != corr.labels).all()
    digits = slice(1, 21)
    assert ((clean.tokens[:, digits] != corr.tokens[:, digits]).sum(1) == 1).all()  # near a tie: one digit
    assert torch.equal(clean.fields["n2"], corr.fields["n2"]) and torch.equal(clean.lengths, corr.lengths)
    assert set(clean.labels.tolist()) == {FOUR, FIVE}
    far = make_sentences([[0] * 7 + [1] * 2 + [2] * 3, [1] * 6 + [0], [], [2, 2]][:2] + [[2, 2]])
    flipped = flip_answer(far)
    assert (flipped.labels != far.labels).all()
    assert (far.tokens != flipped.tokens).sum(1).tolist() == [3 + 1, 3 + 1, 1 + 1]  # the fewest swaps, and the answer
    with pytest.raises(TaskError):
        flip_answer(make_sentences([[]]))


def test_results_and_errors():
    model = make_model(2, 2)
    clean, corrupted = pair()
    r = activation_patching(model, clean, corrupted=corrupted, where="z")
    d = json.loads(r.to_json())
    assert d["dims"] == ["layer", "head", "pos"] and len(d["values"]) == 2 and d["top"]
    assert r.figure() is not None and "normalized" in r.table_html() and "L" in r.text()
    for where, per in (("resid_pre", "layer"), ("z", "head"), ("resid_pre", "pos")):
        rr = activation_patching(model, clean, corrupted=corrupted, where=where, per=per)
        assert rr.figure() is not None
    p = path_patching(model, clean, corrupted=corrupted)
    assert json.loads(p.to_json())["rows"] and p.figure() is not None and "->" in p.text()
    with pytest.raises(InterpError):
        activation_patching(model, clean, corrupted=corrupted, where="hook_z")
    with pytest.raises(InterpError):
        activation_patching(model, clean, corrupted=corrupted, where="resid_pre", per="head")
    with pytest.raises(InterpError):
        activation_patching(model, clean, corrupted=corrupted, where="mlp_out")
    with pytest.raises(InterpError):
        activation_patching(model, clean, corrupted=corrupted, direction="sideways")
    with pytest.raises(TaskError):
        activation_patching(model, clean.tokens, corrupted=corrupted.tokens, metric="logit_diff")
    with pytest.raises(TokenError):
        activation_patching(model, clean.tokens, corrupted=corrupted.tokens[:, :-1], metric=callable_metric)
    with pytest.raises(HeadError):
        activation_patching(model, clean, corrupted=corrupted, layers=[2])
    with pytest.raises(HeadError):
        path_patching(make_model(1, 2), clean, corrupted=corrupted)
    with pytest.raises(InterpError):
        path_patching(model, clean, corrupted=corrupted, qkv=("q", "x"))


def test_shipped_induction_model_key_path():
    """What the note reports: on the shipped model the "key" corruption is undone by the previous-token head's
    output at the key position, and by that head's output into the layer-1 heads' keys."""
    from interp.analyses.pattern_scores import head_scores
    from interp.analyses.repeated_tokens import probe_tokens
    from interp.analyses.repeated_tokens.corrupt import corrupted_pair
    from interp.tasks import load_checkpoint

    ck = load_checkpoint("repeated-tokens", device="cpu")
    prev = head_scores(ck.model, probe_tokens(ck.task, 32), n_boot=10).best("prev_token", layer=0)
    clean, corr = corrupted_pair(ck.task, 16, kind="key")
    p = path_patching(ck.model, clean, corrupted=corr)
    i = p.senders.index(prev)
    key = p.normalized[i, :, 1]
    assert key.sum() > 0.8  # the key path from the previous-token head carries the answer
    assert p.normalized[:, :, [0, 2]].abs().max() < 0.1


def test_flip_keeps_the_padded_width(nm_task, nm_ckpt):
    from interp.analyses.noisy_majority.corrupt import flip_answer
    from interp.analyses.repeated_tokens.corrupt import corrupted_pair
    from interp.tasks import get_task

    data = nm_task.dataset("test").select(slice(0, 6))
    flipped = flip_answer(data)
    assert flipped.tokens.shape == data.tokens.shape and (flipped.labels != data.labels).all()
    r = activation_patching(nm_ckpt.model, data, corrupted=flipped, metric="logit_diff", where="z", per="head")
    assert r.clean > 0 > r.corrupted  # the shipped model answers both
    other, _ = corrupted_pair(get_task("repeated-tokens"), 2)
    with pytest.raises(TaskError):
        activation_patching(nm_ckpt.model, other, corrupted=other, metric="logit_diff")  # a model of another task


# -- architectures a user brings: grouped-query attention, parallel blocks -------------------------------------------


def gqa_model(n_layers=2, seed=0):
    """Grouped-query attention: 4 query heads sharing 2 key/value heads (TransformerLens' n_key_value_heads)."""
    cfg = HookedTransformerConfig(
        n_layers=n_layers,
        d_model=16,
        n_heads=4,
        n_key_value_heads=2,
        d_head=4,
        d_vocab=V,
        n_ctx=T,
        attn_only=True,
        seed=seed,
        device="cpu",
        act_fn="relu",
    )
    return HookedTransformer(cfg).eval()


def _patched_metric(model, base, source_cache, hook, kv, positions, metric):
    """One run of ``base`` with ``hook``'s key/value head ``kv`` at ``positions`` (None: all) taken from the source
    run: the plain loop the batched patching is compared with."""

    def patch(act, hook):
        act = act.clone()
        src = source_cache[hook.name]
        if positions is None:
            act[:, :, kv] = src[:, :, kv]
        else:
            act[:, positions, kv] = src[:, positions, kv]
        return act

    with torch.inference_mode():
        return float(metric(model.run_with_hooks(base, fwd_hooks=[(hook, patch)])))


@pytest.mark.parametrize("where", ["k", "v"])
def test_grouped_query_k_v_patching_is_per_key_value_head(where):
    """Under grouped-query attention hook_k / hook_v hold n_key_value_heads heads: patching reports one value per
    key/value head (as TransformerLens' get_act_patch_attn_head_k_all_pos does), equal to a plain loop."""
    model = gqa_model()
    clean, corrupted = pair()
    vm = variant_metric("logit_diff", clean, corrupted)
    with torch.inference_mode():
        _, cache = model.run_with_cache(clean.tokens)
    for per in ("head", "head_pos"):
        res = activation_patching(model, clean, corrupted=corrupted, where=where, per=per)
        n_kv = model.cfg.n_key_value_heads
        assert res.values.shape[:2] == (2, n_kv)
        for l in range(2):
            for kv in range(n_kv):
                for p in [None] if per == "head" else range(T):
                    hook = f"blocks.{l}.attn.hook_{where}"
                    want = _patched_metric(model, corrupted.tokens, cache, hook, kv, p, vm.of_logits)
                    got = res.values[l, kv] if p is None else res.values[l, kv, p]
                    assert float(got) == pytest.approx(want, abs=ATOL, rel=RTOL), (l, kv, p)
    fn = (
        tl_patching.get_act_patch_attn_head_k_all_pos if where == "k" else tl_patching.get_act_patch_attn_head_v_all_pos
    )
    theirs = fn(model, corrupted.tokens, cache, vm.of_logits)
    torch.testing.assert_close(
        activation_patching(model, clean, corrupted=corrupted, where=where, per="head").values,
        theirs.cpu(),
        atol=ATOL,
        rtol=RTOL,
    )
    assert "key/value head" in res.text() and "KV" in res.to_dict()["top"][0]["head"]


def test_grouped_query_path_patching_equals_a_plain_loop():
    """Path patching on a grouped-query model: the query input per query head, the key and value inputs per
    key/value head (shared by its group of query heads), equal to one run_with_hooks per path."""
    model = gqa_model()
    clean, corrupted = pair()
    vm = variant_metric("logit_diff", clean, corrupted)
    senders, receivers = [(0, h) for h in range(4)], [(1, h) for h in range(4)]
    res = path_patching(model, clean, corrupted=corrupted, senders=senders, receivers=receivers)
    with torch.inference_mode():
        _, bc = model.run_with_cache(corrupted.tokens)
        _, sc = model.run_with_cache(clean.tokens)
    model.set_use_split_qkv_input(True)
    try:
        for i, (sl, sh) in enumerate(senders):
            z = f"blocks.{sl}.attn.hook_z"
            delta = (sc[z][:, :, sh] - bc[z][:, :, sh]) @ model.W_O[sl, sh]
            for j, (rl, rh) in enumerate(receivers):
                for k, letter in enumerate("qkv"):
                    at = rh if letter == "q" else rh // 2  # the query head's key/value head

                    def add(x, hook, at=at, delta=delta):
                        x = x.clone()
                        x[:, :, at] += delta
                        return x

                    with torch.inference_mode():
                        logits = model.run_with_hooks(
                            corrupted.tokens, fwd_hooks=[(f"blocks.{rl}.hook_{letter}_input", add)]
                        )
                    assert float(res.values[i, j, k]) == pytest.approx(float(vm.of_logits(logits)), abs=ATOL, rel=RTOL)
    finally:
        model.set_use_split_qkv_input(False)
    rows = res.rows()
    assert {r["receiver"] for r in rows if r["input"] == "k"} == {"L1KV0", "L1KV1"}  # one row per key/value head
    assert {r["receiver"] for r in rows if r["input"] == "q"} == {f"L1H{h}" for h in range(4)}
    assert type(res).from_dict(res.to_dict()).to_dict() == res.to_dict()


def test_resid_mid_of_a_parallel_block_is_refused_before_any_work():
    """A parallel attention + MLP block (parallel_attn_mlp=True) has no resid_mid: one clear line, not a KeyError."""
    cfg = HookedTransformerConfig(
        n_layers=2,
        d_model=16,
        n_heads=2,
        d_head=8,
        d_mlp=32,
        d_vocab=V,
        n_ctx=T,
        act_fn="gelu",
        seed=0,
        parallel_attn_mlp=True,
        device="cpu",
    )
    model = HookedTransformer(cfg).eval()
    clean, corrupted = pair()
    with pytest.raises(InterpError, match="parallel"):
        activation_patching(model, clean, corrupted=corrupted, where="resid_mid")
    assert activation_patching(model, clean, corrupted=corrupted, where="resid_pre").values.shape == (2, T)
