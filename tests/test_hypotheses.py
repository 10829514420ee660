"""Hypotheses, tested (interp.analyses.hypotheses): causal models, interchange-intervention accuracy and distributed
alignment search, each against an independent computation.

- IIA equals a plain loop of one ``run_with_hooks`` per (base, source) pair written here (each sequence at its own
  length, no padding, no stacking, no shortcut), per pair, and the patched logits agree to 1e-4; on one head, 64
  heads with a learned W_O, two layers with MLPs, and a user's own HookedTransformer (grouped-query attention, rotary
  positions, a parallel block, soft-capped logits) paired with a task.
- DAS finds a planted subspace: a network built so that a binary variable lives along one known direction of a head's
  8-dimensional output, and the seven other directions carry noise that changes the output when patched (a second
  head cancels it on unpatched inputs). Thresholds: held-out IIA of the learned direction >= 0.98, of random
  directions at most 0.60 on average (chance: 0.5 on half-changing pairs), of the whole site at most 0.70, and the
  learned direction within 5 degrees of the planted one (measured: 1.000, 0.482, 0.623 and 2.5 degrees).
- Fraknói 2024's §5.3 minimal transformer computes ``diff = n0 - n1`` in its one head by construction: IIA 1.0 there.
"""

from __future__ import annotations

import itertools
import json
import math

import pytest
import torch

import interp
from interp.analyses.hypotheses import (
    Alignment,
    CausalAbstraction,
    CausalModel,
    Site,
    Variable,
    alignments,
    distributed_alignment_search,
    interchange_accuracy,
    parse_site,
    principal_angles,
    random_bases,
    sample_pairs,
)
from interp.analyses.hypotheses.engine import Engine, Patch
from interp.errors import ConfigError, HeadError, TaskError
from interp.model import ModelSpec, build_model
from interp.tasks import get_task


@pytest.fixture(scope="module")
def small():
    return get_task(
        "noisy-majority",
        train_size=200,
        val_size=20,
        test_size=300,
        train_lengths=[0, 20],
        val_lengths=[21, 25],
        test_lengths=[6, 24],
    )


def majority_model(task) -> CausalModel:
    four, five = task.vocab.index["4"], task.vocab.index["5"]
    return CausalModel(
        {"diff": lambda n0, n1: n0 - n1, "answer": lambda diff: torch.where(diff >= 0, four, five)},
        output="answer",
        name="diff",
    )


# -- the plain loop --------------------------------------------------------------------------------------------------


def loop_logits(model, base, source, sites, readout: str = "answer"):
    """One ``run_with_cache`` of the source and one ``run_with_hooks`` of the base per pair, each at its own length;
    ``sites``: ``(hook_name, heads or None, position, basis or None)`` with position "answer" or an int."""
    out = []
    for i in range(len(base)):
        b = base.tokens[i : i + 1, : int(base.lengths[i])]
        s = source.tokens[i : i + 1, : int(source.lengths[i])]
        _, cache = model.run_with_cache(s)
        hooks = []
        for name, heads, pos, basis in sites:
            bp, sp = _at(pos, base, i), _at(pos, source, i)
            src = cache[name][0, sp]
            src = src[list(heads)].flatten() if heads is not None else src

            def hook(act, hook, bp=bp, src=src, heads=heads, basis=basis):
                act = act.clone()
                cur = act[0, bp, list(heads)].flatten() if heads is not None else act[0, bp]
                new = src if basis is None else cur + basis @ (basis.T @ (src - cur))
                if heads is not None:
                    act[0, bp, list(heads)] = new.view(len(heads), -1)
                else:
                    act[0, bp] = new
                return act

            hooks.append((name, hook))
        logits = model.run_with_hooks(b, fwd_hooks=hooks)
        at = int(base.answer_pos[i]) if readout == "answer" else readout
        out.append(logits[0, at])
    return torch.stack(out)


def _at(pos, data, i: int) -> int:
    """Position ``pos`` (an int, "answer" or "answer-K") of example ``i``, read independently of the library."""
    if isinstance(pos, int):
        return pos
    offset = int(pos[len("answer") :] or 0)
    return int(data.answer_pos[i]) + offset


def _loop_site(site: Site, model):
    return (site.hook_name, site.heads if site.hook == "z" else None, site.position or "answer", site.basis)


def user_model(task):
    """A user's own HookedTransformer: grouped-query attention, rotary positions, a parallel attention and MLP block,
    LayerNorm, soft-capped logits."""
    from transformer_lens import HookedTransformer, HookedTransformerConfig

    cfg = HookedTransformerConfig(
        n_layers=2,
        d_model=16,
        n_heads=4,
        d_head=4,
        n_key_value_heads=2,
        d_mlp=32,
        d_vocab=len(task.vocab),
        d_vocab_out=task.vocab.n_out,
        n_ctx=task.n_ctx,
        act_fn="gelu",
        normalization_type="LN",
        positional_embedding_type="rotary",
        rotary_dim=4,
        parallel_attn_mlp=True,
        output_logits_soft_cap=5.0,
        seed=3,
        device="cpu",
    )
    return HookedTransformer(cfg)


SHAPES = {
    "1 head": dict(n_layers=1, d_model=2, n_heads=1, d_head=2),
    "64 heads, learned W_O": dict(n_layers=1, d_model=8, n_heads=64, d_head=2, output_matrix="learned"),
    "2 layers with MLP": dict(n_layers=2, d_model=8, n_heads=4, d_head=2, attn_only=False),
}


def shaped_model(task, shape):
    if shape == "user's HookedTransformer":
        return user_model(task)
    spec = ModelSpec(**{**task.default_spec(), **SHAPES[shape], "init_seed": 1})
    model = build_model(spec, device="cpu")
    with torch.no_grad():  # larger random weights: predictions that vary with the input
        for p in model.parameters():
            p.mul_(3.0)
    return model


def sites_for(model) -> list[Site]:
    cfg = model.cfg
    last = cfg.n_layers - 1
    basis = random_bases(cfg.d_model, 2, 1, seed=5, device="cpu")[0]
    heads = tuple(range(0, cfg.n_heads, max(1, cfg.n_heads // 3)))
    out = [
        parse_site("L0H0", model),
        parse_site(f"L{last}H{cfg.n_heads - 1}@answer", model),
        Site("z", last, heads, "answer"),
        parse_site("resid_pre.0@answer-1", model),
        parse_site(f"resid_post.{last}", model),
        Site("resid_pre", last, (), "answer", basis),
        parse_site(f"attn_out.{last}@answer", model),
    ]
    if not cfg.attn_only:
        out.append(parse_site(f"mlp_out.{last}@answer", model))
        if not cfg.parallel_attn_mlp:
            out.append(parse_site("resid_mid.0@answer", model))
    return out


def test_iia_equals_a_plain_loop_small(small):
    """The default suite's copy of the check below: one head, six pairs, three sites."""
    model = shaped_model(small, "1 head")
    cm = majority_model(small)
    data = small.dataset("test")
    sites = sites_for(model)[:4:2] + [sites_for(model)[5]]  # a head, a head set, a residual subspace
    pairs = sample_pairs(data, causal_model=cm, variable="diff", n=6, seed=2)
    base, source = pairs.select(data)
    with torch.no_grad():
        ref = torch.stack([loop_logits(model, base, source, [_loop_site(s, model)]) for s in sites])
    res = interchange_accuracy(model, data, causal_model=cm, alignment=alignments("diff", sites), pairs=pairs)
    assert torch.equal(res.correct, ref.argmax(-1) == cm.interchange(base, source, "diff")[None])


@pytest.mark.slow
@pytest.mark.parametrize("shape", [*SHAPES, "user's HookedTransformer"])
def test_iia_equals_a_plain_loop(small, shape):
    model = shaped_model(small, shape)
    cm = majority_model(small)
    data = small.dataset("test")
    sites = sites_for(model)
    pairs = sample_pairs(data, causal_model=cm, variable="diff", n=24, seed=2)
    base, source = pairs.select(data)
    with torch.no_grad():
        ref = torch.stack([loop_logits(model, base, source, [_loop_site(s, model)]) for s in sites])
    for method in ("auto", "hooks"):
        res = interchange_accuracy(
            model, data, causal_model=cm, alignment=alignments("diff", sites), pairs=pairs, method=method
        )
        cf = cm.interchange(base, source, "diff")
        assert torch.equal(res.correct, ref.argmax(-1) == cf[None]), method
        readout = base.answer_pos
        plans = []
        for s in sites:
            from interp.analyses.hypotheses.sites import resolve_positions

            bp = resolve_positions(s.position or "answer", base, {})
            sp = resolve_positions(s.position or "answer", source, {})
            plans.append([Patch(s, bp, sp)])
        eng = Engine(model, base, source, plans, readout, source.answer_pos, method=method)
        torch.testing.assert_close(eng.all_logits(), ref, atol=1e-4, rtol=1e-4)
    # several sites patched together, from one source run
    joint = [sites[0], sites[4]]
    res = interchange_accuracy(model, data, causal_model=cm, alignment=Alignment("diff", joint), pairs=pairs)
    with torch.no_grad():
        ref = loop_logits(model, base, source, [_loop_site(s, model) for s in joint])
    assert torch.equal(res.correct[0], ref.argmax(-1) == cm.interchange(base, source, "diff"))


@pytest.mark.slow
def test_the_last_layer_shortcut_is_used_and_exact(nm_ckpt):
    model = nm_ckpt.model
    task = get_task("noisy-majority", test_size=200, test_lengths=[20, 40])  # shorter than trained: no positions
    data = task.dataset("test")
    cm = majority_model(task)
    al = alignments("diff", ["L0H8", "L0H1+L0H9", "L0H*", "resid_post.0"])
    fast = interchange_accuracy(model, data, causal_model=cm, alignment=al, pairs=100, method="fast")
    hooks = interchange_accuracy(model, data, causal_model=cm, alignment=al, pairs=100, method="hooks")
    assert fast.info["method"] == "fast" and hooks.info["method"] == "hooks"
    assert torch.equal(fast.correct, hooks.correct)
    assert fast["L0H0-15"] == 1.0  # every head together carries the answer
    with pytest.raises(ConfigError, match="method='fast' needs every site in the last layer"):
        interchange_accuracy(
            model, data, causal_model=cm, alignment=Alignment("diff", "resid_pre.0"), pairs=10, method="fast"
        )


def test_minimal_transformer_carries_diff_by_construction():
    task = get_task("noisy-majority", test_size=400)
    model = interp.analyses.minimal_majority_transformer(task)
    cm = majority_model(task)
    data = task.dataset("test")
    res = interchange_accuracy(model, data, causal_model=cm, alignment=Alignment("diff", "L0H0@answer"), pairs=500)
    assert res.base_accuracy == 1.0 and res.n_pairs == 500
    assert res["L0H0@answer"] == 1.0 and float(res.iia_changed[0]) == 1.0
    assert abs(res.pairs["changed_share"] - 0.5) < 1e-9 and float(res.null_iia[0]) == 0.5
    # its one dimension is the subspace: DAS with k = 1 is the whole site
    das = distributed_alignment_search(
        model, data, causal_model=cm, variable="diff", site="L0H0@answer", k=1, pairs=200, train_pairs=200, steps=5
    )
    assert das.das[0]["heldout_iia"] == 1.0 and das.das[0]["whole_iia"] == 1.0


# -- DAS on a planted subspace --------------------------------------------------------------------------------------


def planted_model(d_head: int = 8, c_signal: float = 4.0, c_noise: float = 16.0, seed: int = 0):
    """One attention-only layer over ``[BOS] t``: token ``t`` is a bit ``x`` and noise ``n`` in {-1, 1}^(d_head-1).
    Head 0's value is ``±u + W n`` (``u`` and ``W``'s columns a random orthonormal basis), read by the unembedding
    as ``c_signal u + c_noise W 1``; head 1 copies ``n`` and cancels its share, so unpatched the answer is ``x``,
    while noise patched into head 0 alone moves it."""
    from transformer_lens import HookedTransformer, HookedTransformerConfig

    gen = torch.Generator().manual_seed(seed)
    toks = [(x, ns) for x in (0, 1) for ns in itertools.product((-1, 1), repeat=d_head - 1)]
    V = len(toks) + 1  # the last id is [BOS]
    cfg = HookedTransformerConfig(
        n_layers=1,
        d_model=V + 1,
        n_heads=2,
        d_head=d_head,
        d_vocab=V,
        d_vocab_out=2,
        n_ctx=2,
        attn_only=True,
        normalization_type=None,
        seed=seed,
        device="cpu",
    )
    model = HookedTransformer(cfg)
    q, _ = torch.linalg.qr(torch.randn(d_head, d_head, generator=gen))
    u, w = q[:, 0], q[:, 1:]
    with torch.no_grad():
        for p in model.parameters():
            p.zero_()
        model.embed.W_E[:, 1:].copy_(torch.eye(V))  # residual dimension 0 is the answer's score
        a = model.blocks[0].attn
        for t, (x, ns) in enumerate(toks):
            nv = torch.tensor(ns, dtype=torch.float)
            a.W_V[0, t + 1] = (2 * x - 1) * u + w @ nv
            a.W_V[1, t + 1, : d_head - 1] = nv
        a.W_O[0, :, 0] = c_signal * u + c_noise * w.sum(1)
        a.W_O[1, : d_head - 1, 0] = -c_noise
        model.unembed.W_U[0, 1], model.unembed.W_U[0, 0] = 1.0, -1.0
    gen = torch.Generator().manual_seed(seed + 1)
    t = torch.randint(0, len(toks), (2000,), generator=gen)
    x = torch.tensor([toks[i][0] for i in t.tolist()])
    data = interp.task_data(torch.stack([torch.full_like(t, V - 1), t], 1), answer_pos=1, labels=x)
    data.fields["x"] = x
    return model, data, u[:, None]


@pytest.mark.slow
def test_das_finds_a_planted_subspace():
    model, data, planted = planted_model()
    cm = CausalModel({"bit": lambda x: x, "out": lambda bit: bit}, output="out", name="planted bit")
    res = distributed_alignment_search(model, data, causal_model=cm, variable="bit", site="L0H0@answer", k=1, lr=0.05)
    rec = res.das[0]
    assert res.base_accuracy == 1.0
    assert rec["heldout_iia"] >= 0.98 and rec["train_iia"] >= 0.98
    assert sum(rec["random_iia"]) / len(rec["random_iia"]) <= 0.60
    assert rec["whole_iia"] <= 0.70
    angle = float(principal_angles(rec["basis"], planted)[0]) * 180 / math.pi
    assert angle < 5.0, angle
    assert res.kinds == ["das"] + ["random"] * 10 + ["whole"]
    # the planted direction itself, given as a subspace site: IIA 1
    exact = interchange_accuracy(
        model, data, causal_model=cm, alignment=Alignment("bit", Site("z", 0, (0,), "answer", planted)), pairs=400
    )
    assert exact.iia[0] == 1.0


@pytest.mark.slow
@pytest.mark.parametrize("shape", [*SHAPES, "user's HookedTransformer"])
def test_das_of_the_whole_site_is_the_whole_interchange(small, shape):
    """On every shape: DAS with k equal to the site's dimension rotates the whole site and swaps every coordinate,
    which is patching the whole site, whatever rotation it learns; its held-out predictions, and those of random
    subspaces of the same k, equal the whole site's row (the same pairs) exactly."""
    model = shaped_model(small, shape)
    cm = majority_model(small)
    site = parse_site(f"L{model.cfg.n_layers - 1}H0@answer", model)
    k = site.dim(model)
    res = distributed_alignment_search(
        model, small.dataset("test"), causal_model=cm, variable="diff", site=site, k=k, steps=3, n_random=2, seed=1
    )
    assert res.kinds == ["das", "random", "random", "whole"]
    whole = res.correct[3]
    for row in range(3):
        assert torch.equal(res.correct[row], whole), (shape, res.kinds[row])


# -- causal models, pairs, sites --------------------------------------------------------------------------------------


def test_causal_model_interventions(small):
    cm = majority_model(small)
    data = small.dataset("test").select(slice(0, 50))
    v = cm.values(data)
    assert torch.equal(v["diff"], data.fields["n0"] - data.fields["n1"])
    assert torch.equal(cm.output_of(data), data.labels)
    flipped = cm.output_of(data, {"diff": -v["diff"] - 1})
    assert torch.equal(flipped != data.labels, torch.ones(50, dtype=torch.bool))
    src = small.dataset("test").select(slice(50, 100))
    assert torch.equal(cm.interchange(data, src, "diff"), src.labels)
    assert cm.inputs == ("n0", "n1") and cm.order == ["diff", "answer"]
    with pytest.raises(ConfigError, match="cycle"):
        CausalModel({"a": lambda b: b, "b": lambda a: a}, output="a")
    with pytest.raises(TaskError, match="reads 'n7'"):
        CausalModel({"out": lambda n7: n7}, output="out").values(data)
    with pytest.raises(ConfigError, match="integer token ids"):
        CausalModel({"out": lambda n0: n0 * 0.5}, output="out").values(data)
    with pytest.raises(ConfigError, match="unknown variable"):
        cm.interchange(data, src, "sum")
    # a positional variable is interchanged at given positions only
    prev = CausalModel(
        {
            "prev": Variable(lambda tokens: torch.roll(tokens, 1, 1), positional=True),
            "out": lambda prev, answer_pos: prev[torch.arange(len(prev)), answer_pos],
        },
        output="out",
    )
    pos = data.answer_pos[:, None]
    got = prev.interchange(data, src.select(slice(0, 50)), "prev", pos, src.answer_pos[:, None])
    assert torch.equal(got, src.tokens[torch.arange(50), src.answer_pos - 1])


def test_pairs_are_stratified_and_reproducible(small):
    cm = majority_model(small)
    data = small.dataset("test")
    a = sample_pairs(data, causal_model=cm, variable="diff", n=101, changed=0.3, seed=4)
    b = sample_pairs(data, causal_model=cm, variable="diff", n=101, changed=0.3, seed=4)
    assert torch.equal(a.base, b.base) and torch.equal(a.source, b.source)
    assert len(a) == 101 and int(a.changed.sum()) == 30 and bool((a.base != a.source).all())
    base, src = a.select(data)
    assert torch.equal(cm.interchange(base, src, "diff") != base.labels, a.changed)
    same = sample_pairs(data, causal_model=cm, variable="diff", n=40, seed=1, same=("n_digits",))
    assert torch.equal(data.fields["n_digits"][same.base], data.fields["n_digits"][same.source])


def test_site_syntax(nm_ckpt):
    model = nm_ckpt.model
    assert parse_site("L0H3", model).name == "L0H3" and parse_site("L0H3", model).position is None
    s = parse_site("L0H1+L0H3@answer-1", model)
    assert s.heads == (1, 3) and s.position == "answer-1" and s.dim(model) == 4
    assert parse_site("L0H*@5", model).heads == tuple(range(16)) and parse_site("L0H*", model).where() == "L0H0-15"
    assert parse_site("L0H2-5", model).heads == (2, 3, 4, 5)
    assert parse_site("resid_post.0@last", model).hook_name == "blocks.0.hook_resid_post"
    assert parse_site((0, 4), model).heads == (4,)
    with pytest.raises(HeadError, match="out of range"):
        parse_site("L0H16", model)
    with pytest.raises(HeadError, match="layer 1 is out of range"):
        parse_site("resid_pre.1", model)
    with pytest.raises(ConfigError, match="cannot read site"):
        parse_site("head 3", model)
    with pytest.raises(ConfigError, match="orthonormal"):
        Site("resid_pre", 0, (), None, torch.ones(32, 2)).check(model)


def test_bad_input_is_one_clear_error(nm_ckpt, small):
    model, task = nm_ckpt.model, nm_ckpt.task
    data = task.dataset("test").select(slice(0, 40))
    cm = majority_model(task)
    al = Alignment("diff", "L0H1")
    with pytest.raises(ConfigError, match="the model is on cpu"):
        interchange_accuracy(model, data, causal_model=cm, alignment=al, pairs=10, device="cuda")
    with pytest.raises(ConfigError, match="batch_size"):
        interchange_accuracy(model, data, causal_model=cm, alignment=al, pairs=10, batch_size=0)
    with pytest.raises(ConfigError, match="unknown variable"):
        interchange_accuracy(model, data, causal_model=cm, alignment=Alignment("sum", "L0H1"), pairs=10)
    with pytest.raises(ConfigError, match="no resid_mid"):
        interchange_accuracy(model, data, causal_model=cm, alignment=Alignment("diff", "resid_mid.0"), pairs=10)
    with pytest.raises(TaskError, match="falls outside"):
        interchange_accuracy(model, data, causal_model=cm, alignment=Alignment("diff", "L0H1@500"), pairs=10)
    with pytest.raises(ConfigError, match="k must be"):
        distributed_alignment_search(model, data, causal_model=cm, variable="diff", site="L0H1", k=3)
    other = get_task("repeated-tokens").dataset("test").select(slice(0, 10))
    with pytest.raises(TaskError):
        interchange_accuracy(model, other, causal_model=cm, alignment=al, pairs=10)


@pytest.mark.slow
def test_batch_size_changes_memory_not_numbers(small):
    model = shaped_model(small, "2 layers with MLP")
    cm = majority_model(small)
    data = small.dataset("test")
    al = alignments("diff", ["L0H1", "L1H2", "resid_pre.1", "mlp_out.1@answer"])
    a = interchange_accuracy(model, data, causal_model=cm, alignment=al, pairs=60, method="hooks")
    b = interchange_accuracy(model, data, causal_model=cm, alignment=al, pairs=60, method="hooks", batch_size=7)
    c = interchange_accuracy(model, data, causal_model=cm, alignment=al, pairs=60, batch_size=1)
    assert torch.equal(a.correct, b.correct) and torch.equal(a.correct, c.correct)


@pytest.mark.slow
def test_the_result_protocol(nm_ckpt):
    model, task = nm_ckpt.model, nm_ckpt.task
    data = task.dataset("test").select(slice(0, 300))
    cm = majority_model(task)
    res = distributed_alignment_search(
        model,
        data,
        causal_model=cm,
        variable="diff",
        site="L0H8+L0H9",
        k=1,
        pairs=60,
        train_pairs=60,
        steps=10,
        n_random=2,
    )
    d = json.loads(res.to_json())
    again = CausalAbstraction.from_dict(d)
    assert again.to_dict() == res.to_dict() and d == json.loads(again.to_json())
    assert "DAS L0H8+L0H9" in res.text() and "<table" in res._repr_html_() and res.figure() is not None
    assert len(d["rows"]) == 4 and d["das"][0]["k"] == 1 and len(d["das"][0]["basis"]) == 4
    merged = res.merged(res)
    assert len(merged.labels) == 8


# -- the shipped hypotheses, the suites' hook and the command line -----------------------------------------------------


@pytest.mark.slow
def test_every_shipped_task_offers_hypotheses():
    from interp.analyses import suite_for
    from interp.analyses.generic_suite import SUITE

    names = {
        "noisy-majority": {"diff", "sign"},
        "integer-addition": {"carry1", "carry5", "digit0", "digit5"},
        "repeated-tokens": {"prev", "next"},
        "modular-addition": {"a", "b"},
    }
    for task_name, want in names.items():
        task = get_task(task_name)
        got = suite_for(task).hypotheses(task)
        assert want <= set(got), task_name
    assert SUITE.hypotheses(get_task("noisy-majority")) == {}


@pytest.mark.slow
def test_shipped_hypotheses_on_the_shipped_models():
    from interp.analyses import suite_for
    from interp.analyses.hypotheses import evaluate_hypothesis
    from interp.tasks import load_checkpoint

    ia = load_checkpoint("integer-addition", device="cpu")
    hyp = suite_for(ia.task).hypotheses(ia.task)["carry2"]
    data = ia.task.dataset("test").select(slice(0, 400))
    res = evaluate_hypothesis(ia.model, data, hypothesis=hyp, sites=["L0H3@out2", "L1H0@out2"], pairs=80)
    assert res.base_accuracy == 1.0 and res.info["readout"] == "out2"
    assert res["L0H3@out2"] > res["L1H0@out2"]  # (measured on 1,000 pairs: 0.79 and 0.50, the no-patch score)
    rt = load_checkpoint("repeated-tokens", device="cpu")
    hyp = suite_for(rt.task).hypotheses(rt.task)["prev"]
    test = rt.task.dataset("test")
    base, source = hyp.pairs(test, 40, 0)
    diff = (base.tokens != source.tokens).sum(1)
    assert bool((diff == 2).all())  # two tokens exchanged, before the two patched positions
    keys = base.fields["keys"]
    assert torch.equal(base.tokens[torch.arange(40), keys[:, 0] - 1], source.tokens[torch.arange(40), keys[:, 1] - 1])
    cm = hyp.causal_model
    changed = cm.interchange(base, source, "prev", keys, source.fields["keys"]) != cm.output_of(base)
    assert bool(changed[::2].all()) and not bool(changed[1::2].any())  # even rows: the key and a decoy
    res = evaluate_hypothesis(rt.model, test, hypothesis=hyp, sites=["L0H0@keys", "L0H1@keys"], pairs=40)
    assert res.base_accuracy == 1.0 and res["L0H1@keys"] > res["L0H0@keys"]


@pytest.mark.slow
def test_the_command_line(tmp_path, capsys):
    from interp.app.cli import main

    assert main(["hypothesis", "noisy-majority", "--device", "cpu"]) == 0
    assert "diff (" in capsys.readouterr().out
    assert main(["hypothesis", "noisy-majority", "nope", "--device", "cpu"]) == 1
    err = capsys.readouterr().err
    assert "unknown hypothesis 'nope'" in err and "diff" in err and err.count("\n") == 1
    out = tmp_path / "h.json"
    rc = main(
        ["hypothesis", "noisy-majority", "diff", "--site", "L0H8", "--site", "L0H*@answer", "--pairs", "40", "--json"]
        + ["--out", str(out), "--device", "cpu"]
    )
    assert rc == 0
    d = json.loads(capsys.readouterr().out)
    assert d == json.loads(out.read_text()) and [r["site"] for r in d["rows"]] == ["L0H8", "L0H0-15@answer"]
    assert d["rows"][1]["iia"] == 1.0
    assert main(["hypothesis", "noisy-majority", "diff", "--site", "L9H0", "--device", "cpu"]) == 1
    assert "out of range" in capsys.readouterr().err


def test_the_listing_as_json_and_a_site_with_an_empty_position(capsys):
    """``interp hypothesis CKPT --json`` without a name lists the hypotheses as JSON (it printed text); a site
    written with '@' and nothing after it is refused (it meant the readout position silently)."""
    from interp.app.cli import main

    assert main(["hypothesis", "noisy-majority", "--json", "--device", "cpu"]) == 0
    listing = json.loads(capsys.readouterr().out)
    assert listing["task"] == "noisy-majority" and set(listing["hypotheses"]) == {"diff", "sign"}
    assert main(["hypothesis", "noisy-majority", "diff", "--site", "L0H3@", "--device", "cpu"]) == 1
    err = capsys.readouterr().err
    assert "names no position after '@'" in err and "L0H3@answer" in err and err.count("\n") == 1


def test_the_text_says_when_the_network_disagrees_with_the_causal_model(nm_ckpt):
    """IIA counts a pair the network gets wrong even unpatched as a failure of the alignment: the text says so when
    the network gives the causal model's output on under 90% of bases or sources, and not otherwise."""
    from dataclasses import replace

    from interp.analyses import suite_for
    from interp.analyses.hypotheses import evaluate_hypothesis

    ck = nm_ckpt
    hyp = suite_for(ck.task).hypotheses(ck.task)["diff"]
    res = evaluate_hypothesis(ck.model, ck.task.dataset("test"), hypothesis=hyp, sites=["L0H8"], pairs=20)
    assert res.base_accuracy == 1.0 and "disagrees" not in res.text()
    wrong = replace(res, base_prediction=1 - res.base_prediction)
    assert wrong.base_accuracy == 0.0 and "the network disagrees with the causal model's output" in wrong.text()


def test_the_shipped_population_summary_is_a_recount_of_its_runs():
    """examples/results/hypotheses/population_d8.json (docs/hypotheses.md's population answer): the failing runs, the
    shares and their Wilson intervals, recounted here from the per-run numbers."""
    from pathlib import Path

    from interp.analyses.populations import wilson_interval

    doc = json.loads(
        (Path(__file__).resolve().parents[1] / "examples/results/hypotheses/population_d8.json").read_text()
    )
    runs = doc["runs"]
    assert len(runs) == 100 and len({r["seed"] for r in runs}) == 100
    fail = [r for r in runs if r["test_accuracy"] < 1.0]
    ok = [r for r in runs if r["test_accuracy"] >= 1.0]
    assert doc["summary"]["failing"] == len(fail) == 18 and doc["summary"]["succeeding"] == len(ok) == 82
    for name, key in (
        ("probe_accuracy == 1", "probe_accuracy"),
        ("readout_best_threshold == 1", "readout_best_threshold"),
    ):
        for group, rows in (("failing", fail), ("succeeding", ok)):
            k = sum(r[key] >= 1.0 for r in rows)
            got = doc["summary"]["shares"][name][group]
            assert (got["k"], got["n"]) == (k, len(rows))
            assert (got["low"], got["high"]) == pytest.approx(wilson_interval(k, len(rows)))
    assert sum(r["probe_accuracy"] >= 1.0 for r in fail) == 18  # the docs' answer: every failing run carries the count
    assert sum(r["readout_best_threshold"] >= 1.0 for r in fail) == 10


def test_das_learns_one_subspace_per_seed(nm_ckpt):
    """A seed fixes the learned subspace, whatever the global generator holds (the orthogonal parametrization
    completes its weight from it); a hypothesis given by name is refused, saying where the shipped ones are."""
    import interp
    from interp.analyses import suite_for
    from interp.errors import ConfigError

    model, task = nm_ckpt.model, nm_ckpt.task
    data = task.dataset("test").select(slice(0, 200))
    found = suite_for(task).hypotheses(task)
    bases = []
    for global_seed in (1, 2):
        torch.manual_seed(global_seed)
        res = interp.analyses.hypotheses.evaluate_hypothesis(
            model, data, hypothesis=found["diff"], das=1, pairs=60, steps=3, seed=4
        )
        bases.append(res.das[0]["basis"])
    assert torch.equal(bases[0], bases[1])
    with pytest.raises(ConfigError, match=r"hypotheses\(task\)\[name\]"):
        interp.analyses.hypotheses.evaluate_hypothesis(model, data, hypothesis="diff")
