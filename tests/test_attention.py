"""Attention variants (interp.variants, interp.attention, interp.fast_attention): spellings, cases with a known
answer, every hand-written forward against TransformerLens' hooked one, checkpoints, plain TransformerLens rebuilds,
populations against solo runs."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
import torch
from safetensors.torch import load_file, save_file

from interp.errors import CheckpointError, ConfigError
from interp.model import ModelSpec, build_model
from interp.variants import canonical_attention, canonical_qkv

POOLINGS = ("softmax", "linear:elu", "linear:relu", "additive")
MASKED = (
    "window:3",
    "dilated:3,2",
    "global:2",
    "random:2",
    "bigbird:2,1,2",
    "additive+window:4",
    "linear:relu+random:1",
)
QKV = ("full", "diagonal", "sparse:0.4", "lowrank:2")


def _spec(**kw) -> ModelSpec:
    return ModelSpec(**{"d_vocab": 9, "n_ctx": 48, "d_model": 8, "n_heads": 4, "d_head": 2, **kw})


def _randomised(model, seed: int = 0, std: float = 1.0):
    """Larger random weights than the initialisation (attention far from uniform); fixed entries stay fixed."""
    from interp.attention import qkv_masks, sync

    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            if p.requires_grad:
                p.copy_(torch.randn(p.shape, generator=g) * std)
        for l, block in enumerate(model.blocks):
            for which, mask in (qkv_masks(model, l) or {}).items():
                getattr(block.attn, f"W_{which}").mul_(mask)
    sync(model)
    return model


def _tokens(b=3, t=40, seed=0):
    return torch.randint(0, 9, (b, t), generator=torch.Generator().manual_seed(seed))


# -- spellings ---------------------------------------------------------------------------------------------------------
def test_spellings_parse_and_bad_ones_name_the_valid_ones():
    from interp.variants import parse_attention, parse_qkv

    a = parse_attention("window:8+global:2+random:3")
    assert a.pooling == "softmax" and [str(m) for m in a.masks] == ["window:8", "global:2", "random:3"]
    assert [str(m) for m in parse_attention("bigbird:8,2,3").masks] == ["window:8", "global:2", "random:3"]
    assert parse_attention("linear:relu+dilated:4,2").pooling == "linear:relu"
    assert parse_attention("window:5").tl_window == 5 and parse_attention("window:5+global:1").tl_window is None
    assert str(parse_qkv("sparse:0.25")) == "sparse:0.25" and parse_qkv("lowrank:3").rank == 3
    for bad in ("windw:3", "window:0", "window", "linear", "softmax+additive", "dilated:3", "bigbird:1,2", ""):
        with pytest.raises(ConfigError, match="window:W, dilated:W,D") as e:
            _spec(attention=bad)
        assert "\n" not in str(e.value)
    for bad in ("sparse", "sparse:1.5", "lowrank:0", "diag", "lowrank:x"):
        with pytest.raises(ConfigError, match="full, diagonal, sparse:F"):
            _spec(qkv=bad)
    with pytest.raises(ConfigError, match="lowrank:R with R < 8"):
        _spec(qkv="lowrank:8")


def test_the_options_are_flags_grid_keys_and_table_columns():
    from interp.configs import ModelSpec as Spec
    from interp.options import options

    opts = options(Spec)
    assert {"attention", "qkv", "attention_seed"} <= set(opts)
    assert opts["attention"].parse("window:8+global:2") == "window:8+global:2"
    assert opts["attention"].flag == "--attention"


# -- cases with a known answer -----------------------------------------------------------------------------------------
def test_window_1_attends_only_to_its_own_position():
    m = _randomised(build_model(_spec(attention="window:1"), device="cpu"))
    _, cache = m.run_with_cache(_tokens(t=12))
    assert torch.equal(cache["pattern", 0], torch.eye(12).expand_as(cache["pattern", 0]))


@pytest.mark.parametrize("pooling", ["linear:elu", "linear:relu"])
def test_linear_attention_with_a_constant_feature_map_is_the_uniform_causal_average(pooling):
    """With W_Q = W_K = 0 and biases b_Q = b_K = 1, every query and key has the same features, so the weights are
    uniform over the keys before each query (elu(1) + 1 = 2 and relu(1) = 1, both constant)."""
    m = build_model(_spec(attention=pooling, attn_bias=True), device="cpu")
    with torch.no_grad():
        for w in ("W_Q", "W_K"):
            getattr(m.blocks[0].attn, w).zero_()
        m.blocks[0].attn.b_Q.fill_(1.0)
        m.blocks[0].attn.b_K.fill_(1.0)
    _, cache = m.run_with_cache(_tokens(t=10))
    uniform = torch.ones(10, 10).tril() / torch.arange(1, 11)[:, None]
    torch.testing.assert_close(cache["pattern", 0], uniform.expand_as(cache["pattern", 0]))
    z = torch.einsum("bhqk,bkhe->bqhe", uniform.expand_as(cache["pattern", 0]), cache["v", 0])
    torch.testing.assert_close(cache["z", 0], z)


def test_a_global_token_is_seen_by_every_later_query_and_random_keys_are_earlier_and_fixed():
    from interp.attention import key_mask

    allowed = key_mask(parse("global:2"), 30)
    assert allowed[:, :2].tril().eq(torch.ones(30, 2).tril().bool()).all() and allowed[2:, :2].all()
    assert not allowed[:, 2:].any()  # nothing else
    m = _randomised(build_model(_spec(attention="global:2+window:2"), device="cpu"))
    _, cache = m.run_with_cache(_tokens(t=30))
    assert (cache["pattern", 0][..., 2:, :2] > 0).all()  # every later query gives both global tokens weight
    holes = ~key_mask(parse("global:2+window:2"), 30)
    assert (cache["pattern", 0][..., holes] == 0).all()
    r = key_mask(parse("random:3"), 50, seed=7, layer=1)
    assert r.sum(1).tolist() == [min(i, 3) for i in range(50)] and not r.diagonal().any()
    assert torch.equal(key_mask(parse("random:3"), 20, seed=7, layer=1), r[:20, :20])  # independent of length
    assert not torch.equal(key_mask(parse("random:3"), 50, seed=8, layer=1), r)
    d = key_mask(parse("dilated:3,4"), 20)
    assert d[19].nonzero().flatten().tolist() == [11, 15, 19]


def parse(text):
    from interp.variants import parse_attention

    return parse_attention(text).masks


def test_the_pattern_at_hook_pattern_is_the_one_used_and_patching_it_propagates():
    for att in ("linear:elu", "additive", "bigbird:2,1,2"):
        m = _randomised(build_model(_spec(attention=att), device="cpu"))
        tokens = _tokens(t=16)
        logits, cache = m.run_with_cache(tokens)
        z = torch.einsum("bhqk,bkhe->bqhe", cache["pattern", 0], cache["v", 0])
        torch.testing.assert_close(cache["z", 0], z)
        torch.testing.assert_close(cache["pattern", 0], cache["attn_scores", 0].softmax(-1).nan_to_num(0.0))
        uniform = torch.ones(16, 16).tril() / torch.arange(1, 17)[:, None]

        def flat(p, hook, uniform=uniform):
            return uniform.expand_as(p)

        patched = m.run_with_hooks(tokens, fwd_hooks=[("blocks.0.attn.hook_pattern", flat)])
        assert not torch.allclose(patched, logits)


# -- every forward against the hooked one ------------------------------------------------------------------------------
@pytest.mark.parametrize("attention", POOLINGS + MASKED)
@pytest.mark.parametrize("qkv", QKV)
def test_the_query_restricted_forward_equals_transformerlens(attention, qkv):
    from interp.query_forward import logits_at, supports_query_forward

    m = _randomised(build_model(_spec(attention=attention, qkv=qkv), device="cpu"))
    assert supports_query_forward(m)
    tokens = _tokens(t=20)
    qpos = torch.tensor([[3, 19], [0, 9], [5, 13]])
    with torch.no_grad():
        full = m(tokens)[torch.arange(3)[:, None], qpos]
        torch.testing.assert_close(logits_at(m, tokens, qpos), full, atol=2e-5, rtol=2e-5)


SHAPES = {
    "1 layer": {},
    "2 layers with MLP and LN": dict(n_layers=2, attn_only=False, normalization="LN", positional="standard"),
    "rotary, low-rank Q/K/V": dict(n_layers=2, positional="rotary", qkv="lowrank:3"),
}


@pytest.mark.parametrize(
    "attention", ["window:4", "dilated:3,2", "bigbird:3,1,2", "linear:elu", "linear:relu", "additive+random:2"]
)
@pytest.mark.parametrize("shape", SHAPES)
def test_fast_paths_equal_the_hooked_path_in_logits_and_gradients(attention, shape):
    from interp.fast_attention import fast_logits, has_fast_path

    m = _randomised(build_model(_spec(attention=attention, **SHAPES[shape]), device="cpu"), std=0.5)
    assert has_fast_path(m)
    tokens = _tokens(t=40)
    params = [p for p in m.parameters() if p.requires_grad]
    hooked = m(tokens)
    fast = fast_logits(m, tokens)
    torch.testing.assert_close(fast, hooked, atol=1e-5, rtol=1e-5)
    g_hooked = torch.autograd.grad(hooked.square().mean(), params)
    g_fast = torch.autograd.grad(fast.square().mean(), params)
    for a, b in zip(g_fast, g_hooked):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-4)
    assert m.blocks[0].attn.__dict__.get("forward") is None  # TransformerLens' forward is back


def test_the_fast_paths_fire_the_hooks_before_and_after_attention_and_refuse_dense_softmax():
    from interp.fast_attention import fast_attention, linear_attention

    m = _randomised(build_model(_spec(attention="window:3"), device="cpu"))
    seen = []
    with fast_attention(m):
        m.run_with_hooks(
            _tokens(t=10),
            fwd_hooks=[
                (lambda n: n.endswith(("hook_q", "hook_z", "hook_pattern")), lambda x, hook: seen.append(hook.name))
            ],
        )
    assert seen == ["blocks.0.attn.hook_q", "blocks.0.attn.hook_z"]
    with pytest.raises(ConfigError, match="no fast attention path"), fast_attention(build_model(_spec(), device="cpu")):
        pass
    q = torch.randn(1, 7, 2, 3)  # linear attention's prefix sums against the quadratic form
    k, v = torch.randn(1, 7, 2, 3), torch.randn(1, 7, 2, 3)
    fq, fk = torch.nn.functional.elu(q) + 1, torch.nn.functional.elu(k) + 1
    w = torch.einsum("bqhe,bkhe->bhqk", fq, fk).tril()
    torch.testing.assert_close(
        linear_attention("linear:elu", q, k, v), torch.einsum("bhqk,bkhe->bqhe", w / w.sum(-1, keepdim=True), v)
    )


def test_a_nested_fast_attention_block_leaves_the_enclosing_one_fast():
    from interp.fast_attention import _FastForward, fast_attention

    m = build_model(_spec(attention="window:3"), device="cpu")
    attn = m.blocks[0].attn
    with fast_attention(m):
        outer = attn.__dict__["forward"]
        with fast_attention(m):
            pass
        assert attn.__dict__.get("forward") is outer and isinstance(outer, _FastForward)
    assert "forward" not in attn.__dict__  # TransformerLens' own forward again


def test_the_trainer_and_evaluation_use_the_fast_paths_for_deeper_models(tiny_task, tiny_cfg, tmp_path):
    from interp.evaluation import predictions_and_loss
    from interp.training import train

    spec = ModelSpec(
        **{**tiny_task.default_spec(), "d_model": 8, "n_heads": 2, "d_head": 4, "n_layers": 2, "attention": "window:4"}
    )
    prov = train(tiny_task, spec, tiny_cfg(epochs=2), tmp_path / "w.safetensors", device="cpu", progress=False)
    assert prov["metrics"]["val"]["accuracy"] >= 0
    from interp.tasks import load_checkpoint

    ck = load_checkpoint(tmp_path / "w.safetensors", device="cpu")
    data = tiny_task.dataset("val").select(slice(0, 20))
    out = predictions_and_loss(ck.model, data)
    with torch.no_grad():
        ref = ck.model(data.tokens).argmax(-1)
    mask = data.targets != -100
    assert torch.equal(out["preds"][mask], ref[mask])


# -- checkpoints and plain TransformerLens -----------------------------------------------------------------------------
def _save_load(tmp_path, spec, task):
    from interp.checkpoint import read_checkpoint, save_checkpoint
    from interp.tasks import get_task

    m = _randomised(build_model(spec, device="cpu"), std=0.3)
    path = save_checkpoint(m, task, tmp_path / "m.safetensors", spec=spec)
    return m, path, read_checkpoint(path, get_task, device="cpu")


@pytest.mark.parametrize(
    "attention,qkv",
    [("additive", "full"), ("bigbird:3,1,2", "lowrank:2"), ("linear:relu", "sparse:0.4"), ("window:3", "diagonal")],
)
def test_checkpoints_round_trip_and_verify_the_variants_parameters(tmp_path, tiny_task, attention, qkv):
    spec = ModelSpec(
        **{
            **tiny_task.default_spec(),
            "d_model": 8,
            "n_heads": 4,
            "d_head": 2,
            "attention": attention,
            "qkv": qkv,
            "attention_seed": 3,
        }
    )
    m, path, ck = _save_load(tmp_path, spec, tiny_task)
    tokens = tiny_task.dataset("val").tokens[:4]
    with torch.no_grad():
        torch.testing.assert_close(ck.model(tokens), m(tokens))
    assert ck.spec.attention == canonical_attention(attention) and ck.spec.qkv == canonical_qkv(qkv)
    tensors = load_file(path)
    from safetensors import safe_open

    with safe_open(str(path), "pt") as f:
        meta = f.metadata()
    bad = dict(tensors)
    if qkv in ("diagonal", "sparse:0.4"):
        mask = m.blocks[0].attn.qkv_mask_K
        i = (mask == 0).nonzero()[0].tolist()
        bad["blocks.0.attn.W_K"] = tensors["blocks.0.attn.W_K"].clone()
        bad["blocks.0.attn.W_K"][tuple(i)] = 0.5
        expect = "fixes zeros"
    elif qkv == "lowrank:2":
        bad["blocks.0.attn.lowrank_V_A"] = tensors["blocks.0.attn.lowrank_V_A"] * 2
        expect = "product of its low-rank factors"
    else:
        bad["blocks.0.attn.additive_v"] = tensors["blocks.0.attn.additive_v"] * float("nan")
        expect = "NaN or infinite"
    from .checkpoint_files import resigned

    # behind the checksums (a consistent, edited file: every checksum recomputed), the weights are still verified
    save_file(bad, str(tmp_path / "bad.safetensors"), metadata=resigned(meta, bad))
    from interp.checkpoint import read_checkpoint
    from interp.tasks import get_task

    with pytest.raises(CheckpointError, match=expect):
        read_checkpoint(tmp_path / "bad.safetensors", get_task, device="cpu")


@pytest.mark.parametrize(
    "attention,qkv,rebuilds",
    [
        ("window:3", "full", True),
        ("softmax", "diagonal", True),
        ("softmax", "sparse:0.4", True),
        ("softmax", "lowrank:2", True),
        ("dilated:3,2", "full", False),
        ("linear:elu", "full", False),
        ("additive", "full", False),
    ],
)
def test_what_plain_transformerlens_rebuilds_from_the_checkpoint(tmp_path, tiny_task, attention, qkv, rebuilds):
    """Plain TransformerLens (its own config and state dict, no code of ours) gives the same logits where its config
    expresses the variant (TransformerLens' local window; Q/K/V constraints live in W_Q/W_K/W_V themselves; low-rank
    factors are extra tensors it skips), and other logits where the variant is our hook or scores."""
    from safetensors import safe_open
    from transformer_lens import HookedTransformer, HookedTransformerConfig

    spec = ModelSpec(
        **{**tiny_task.default_spec(), "d_model": 8, "n_heads": 4, "d_head": 2, "attention": attention, "qkv": qkv}
    )
    m, path, _ = _save_load(tmp_path, spec, tiny_task)
    with safe_open(str(path), "pt") as f:
        cfg = json.loads(f.metadata()["tl_config"])
    plain = HookedTransformer(HookedTransformerConfig(**cfg))
    extra = plain.load_state_dict(load_file(path), strict=False)
    assert not extra.missing_keys
    tokens = tiny_task.dataset("val").tokens[:4]
    with torch.no_grad():
        same = torch.allclose(plain(tokens), m(tokens), atol=1e-5)
    assert same == rebuilds


# -- populations -------------------------------------------------------------------------------------------------------
def test_the_token_count_forward_equals_the_positional_one_for_every_pooling(tiny_task, tiny_spec):
    from interp.evaluation import target_positions
    from interp.population import PARAMS, stacked_count_logits, stacked_logits_at, token_counts
    from interp.query_forward import logits_at

    data = tiny_task.dataset("val").select(slice(0, 40))
    qpos = target_positions(data)
    counted = token_counts(data, 9)
    for pooling in POOLINGS:
        models = [
            _randomised(build_model(replace(tiny_spec, attention=pooling, init_seed=s), device="cpu"), seed=s)
            for s in (0, 1)
        ]
        names = PARAMS + (("blocks.0.attn.additive_v",) if pooling == "additive" else ())
        P = {n: torch.stack([m.state_dict()[n] for m in models]) for n in names}
        scale = float(models[0].blocks[0].attn.attn_scale)
        with torch.no_grad():
            solo = torch.stack([logits_at(m, data.tokens, qpos) for m in models])
            by_counts = stacked_count_logits(
                P,
                counted.query_tok.expand(2, -1, -1),
                counted.log_counts.expand(2, -1, -1, -1),
                counted.present,
                scale,
                pooling=pooling,
            )
            by_pos = stacked_logits_at(P, data.tokens.expand(2, -1, -1), qpos.expand(2, -1, -1), scale, pooling=pooling)
        torch.testing.assert_close(by_counts, solo, atol=1e-5, rtol=1e-5, msg=pooling)
        torch.testing.assert_close(by_pos, solo, atol=1e-5, rtol=1e-5, msg=pooling)


@pytest.mark.parametrize(
    "attention,qkv,dropout_at",
    [
        ("linear:elu", "full", "attention"),
        ("additive", "full", "attention"),
        ("additive", "lowrank:2", "embedding+attention"),
        ("softmax", "diagonal", "attention"),
        ("linear:elu", "sparse:0.5", "attention"),
    ],
)
def test_populations_of_every_pooling_and_qkv_shape_equal_their_solo_runs(
    tmp_path, tiny_task, tiny_spec, tiny_cfg, attention, qkv, dropout_at
):
    from tests.test_population import _population_equals_solo

    pairs = _population_equals_solo(
        tmp_path,
        tiny_task,
        replace(tiny_spec, attention=attention, qkv=qkv),
        tiny_cfg(epochs=3, dropout_at=dropout_at),
        [0, 2],
    )
    expect = "token counts" if dropout_at == "attention" else "positions"
    assert all(pop["population"]["forward"] == expect for pop, _ in pairs)


def test_relu_populations_equal_their_solo_runs_but_for_adams_noise(tmp_path, tiny_task, tiny_spec, tiny_cfg):
    """With relu features a query with one positive feature has a pattern independent of that feature's size: its
    gradient is 0 up to rounding, and Adam turns rounding noise into steps of up to ~lr, differently in the two
    computations. Everything else agrees: the same validation accuracies, losses to 1e-3, weights to steps x lr."""
    from interp.population import seed_population, train_population
    from interp.training import train

    spec, cfg = replace(tiny_spec, attention="linear:relu"), tiny_cfg(epochs=3, dropout_at="attention")
    specs, cfgs = seed_population(tiny_task, spec, cfg, [0, 1])
    outs = [tmp_path / f"p{s}.safetensors" for s in (0, 1)]
    pops = train_population(tiny_task, specs, cfgs, outs, device="cpu", progress=False)
    for s, o, pop in zip((0, 1), outs, pops):
        solo = train(tiny_task, specs[s], cfgs[s], tmp_path / f"s{s}.safetensors", device="cpu", progress=False)
        for hp, hs in zip(pop["history"], solo["history"]):
            assert hp["val_accuracy"] == hs["val_accuracy"]
            assert hp["val_loss"] == pytest.approx(hs["val_loss"], abs=1e-3)
        a, b = load_file(o), load_file(tmp_path / f"s{s}.safetensors")
        steps_times_lr = pop["steps"] * cfg.lr  # Adam's steps are at most about lr each
        for n in a:
            if a[n].is_floating_point() and n != "blocks.0.attn.IGNORE":
                torch.testing.assert_close(a[n], b[n], atol=steps_times_lr, rtol=0, msg=n)


def test_populations_refuse_masks_and_halving_refuses_low_rank_factors(tmp_path, tiny_task, tiny_spec, tiny_cfg):
    from interp.population import check_population, seed_population
    from interp.training import train

    with pytest.raises(ConfigError, match="masks keys by position"):
        check_population(*seed_population(tiny_task, replace(tiny_spec, attention="window:4"), tiny_cfg(), [0, 1]))
    with pytest.raises(ConfigError, match="share the low-rank factors"):
        train(
            tiny_task,
            replace(tiny_spec, qkv="lowrank:2"),
            tiny_cfg(halving="random"),
            tmp_path / "h.safetensors",
            device="cpu",
            progress=False,
        )


def test_parameter_counts_of_each_qkv_shape():
    from interp.attention import parameter_counts, qkv_parameter_count

    counts = {}
    for qkv in QKV:
        spec = _spec(qkv=qkv)
        m = build_model(spec, device="cpu")
        counts[qkv] = parameter_counts(m, spec)
        assert counts[qkv]["free Q/K/V entries per layer"] == qkv_parameter_count(spec)
    assert counts["full"]["free Q/K/V entries per layer"] == 3 * 8 * 8
    assert counts["diagonal"]["free Q/K/V entries per layer"] == 3 * 8
    assert counts["sparse:0.4"]["free Q/K/V entries per layer"] == 3 * round(0.4 * 64)
    assert counts["lowrank:2"]["free Q/K/V entries per layer"] == 3 * 2 * (8 + 8)
    full = counts["full"]["free parameters"]
    for qkv in QKV[1:]:
        dense, free = 3 * 64, counts[qkv]["free Q/K/V entries per layer"]
        assert counts[qkv]["free parameters"] == full - dense + free, qkv


def test_recipe_options_refuse_attention_variants_in_one_line(tmp_path, tiny_task, tiny_spec, tiny_cfg):
    """The seed-regime recipe options (language-model objective, initialisations) are defined for TransformerLens'
    own attention; on a variant they refuse before training instead of training a different model silently."""
    from interp.errors import ConfigError
    from interp.training import train

    for attention, qkv, option in (
        ("linear:elu", "full", {"objective": "lm"}),
        ("softmax", "diagonal", {"objective": "lm"}),
        ("additive", "full", {"init": "torch"}),
        ("softmax", "lowrank:1", {"init_scale": 2.0}),
    ):
        spec = replace(tiny_spec, attention=attention, qkv=qkv)
        with pytest.raises(ConfigError) as err:
            train(tiny_task, spec, tiny_cfg(epochs=1, **option), tmp_path / "m.safetensors", progress=False)
        assert "\n" not in str(err.value) and ("attention" in str(err.value) or "variant" in str(err.value))
        assert not (tmp_path / "m.safetensors").exists()


@pytest.mark.parametrize(
    "options",
    [
        dict(objective="lm", dropout=0.0),  # the prefix-count forward
        dict(objective="lm", dropout_at="embedding+attention"),  # per position
        dict(padding="left"),
        dict(dropout_at="attention+pattern"),
        dict(dropout_at="attention", dropout_rng="counter"),  # the token-count forward, counter masks
    ],
    ids=["lm (prefix counts)", "lm (per position)", "left padding", "pattern dropout", "counter masks"],
)
def test_populations_refuse_attention_variants_as_the_solo_run_does(tmp_path, tiny_task, tiny_spec, tiny_cfg, options):
    """The options that train through the per-position forward (or the prefix counts) score softmax with full
    Q/K/V only. Before, a population refused variants under the prefix-count forward alone and trained them on the
    other paths, which the solo run refuses: checkpoints with no solo run to equal (found by a researcher's trial)."""
    from interp.population import check_population, seed_population
    from interp.training import train

    for attention, qkv in (("linear:relu", "full"), ("additive", "full"), ("softmax", "diagonal")):
        spec = replace(tiny_spec, attention=attention, qkv=qkv)
        specs, cfgs = seed_population(tiny_task, spec, tiny_cfg(**options), [0, 1])
        with pytest.raises(ConfigError, match="through the per-position forward, which covers softmax") as refused:
            check_population(specs, cfgs)
        with pytest.raises(ConfigError) as solo:
            train(tiny_task, specs[0], cfgs[0], tmp_path / "solo.safetensors", device="cpu", progress=False)
        assert str(solo.value) == str(refused.value)


@pytest.mark.parametrize(
    "attention,normalization,dropout_at",
    [("linear:elu", "LN", "attention"), ("additive", "LNPre", "embedding+attention")],
)
def test_populations_of_a_pooling_with_layernorm_equal_their_solo_runs(
    tmp_path, tiny_task, tiny_spec, tiny_cfg, attention, normalization, dropout_at
):
    """LayerNorm (the seed-regime recipe) and a non-softmax pooling together, through the token-count and the
    per-position population forwards."""
    from tests.test_population import _population_equals_solo

    spec = replace(tiny_spec, attention=attention, normalization=normalization)
    pairs = _population_equals_solo(tmp_path, tiny_task, spec, tiny_cfg(epochs=3, dropout_at=dropout_at), [0, 1])
    expect = "token counts" if dropout_at == "attention" else "positions"
    assert all(pop["population"]["forward"] == expect for pop, _ in pairs)
