"""Looped transformers (interp.looping): the model equals an explicit unrolled computation of its shared block,
written here with plain tensor algebra; the ties hold through training steps, moves and checkpoints (one stored copy);
the number of iterations changes at evaluation; partial forwards get the injected embedding; every analysis runs on
a looped model."""

from __future__ import annotations

import json

import pytest
import torch
import torch.nn.functional as F

from interp.checkpoint import save_checkpoint
from interp.errors import ConfigError
from interp.looping import embedded_input, injected_input, injects_input, iterations, loop_of, set_loops
from interp.model import ModelSpec, build_model
from interp.tasks import get_task, load_checkpoint

# a block of 2 layers with MLPs and LayerNorm, 3 iterations: the HookedTransformer has 6 blocks
SPEC = dict(d_vocab=15, d_vocab_out=11, n_ctx=24, n_layers=2, loops=3, d_model=16, n_heads=2, d_head=8)
SPEC.update(attn_only=False, d_mlp=32, normalization="LN", positional="standard", attn_bias=True)


def layer_norm(x, w, b):
    x = x - x.mean(-1, keepdim=True)
    return x / (x.pow(2).mean(-1, keepdim=True) + 1e-5).sqrt() * w + b


def layer(p: dict, x: torch.Tensor) -> torch.Tensor:
    """One pre-LN transformer layer from its parameters: causal softmax attention, then a ReLU MLP."""
    h = layer_norm(x, p["ln1.w"], p["ln1.b"])
    q = torch.einsum("bpd,hde->bhpe", h, p["attn.W_Q"]) + p["attn.b_Q"][None, :, None]
    k = torch.einsum("bpd,hde->bhpe", h, p["attn.W_K"]) + p["attn.b_K"][None, :, None]
    v = torch.einsum("bpd,hde->bhpe", h, p["attn.W_V"]) + p["attn.b_V"][None, :, None]
    t = x.shape[1]
    scores = q @ k.transpose(-1, -2) / q.shape[-1] ** 0.5
    scores = scores.masked_fill(~torch.ones(t, t, dtype=torch.bool).tril(), float("-inf"))
    z = scores.softmax(-1) @ v
    x = x + torch.einsum("bhpe,hed->bpd", z, p["attn.W_O"]) + p["attn.b_O"]
    h = layer_norm(x, p["ln2.w"], p["ln2.b"])
    return x + F.relu(h @ p["mlp.W_in"] + p["mlp.b_in"]) @ p["mlp.W_out"] + p["mlp.b_out"]


def unrolled(state: dict, tokens: torch.Tensor, block: int, loops: int, injection: bool) -> torch.Tensor:
    """The looped model's logits written out: ``loops`` times the block of layers ``0 .. block-1`` (each layer's
    parameters read once from the state dict), the embedding added to the input of every iteration after the
    first."""
    e = state["embed.W_E"][tokens] + state["pos_embed.W_pos"][: tokens.shape[1]]
    x = e
    for k in range(loops):
        if k and injection:
            x = x + e
        for j in range(block):
            x = layer({n[len(f"blocks.{j}.") :]: v for n, v in state.items() if n.startswith(f"blocks.{j}.")}, x)
    x = layer_norm(x, state["ln_final.w"], state["ln_final.b"])
    return x @ state["unembed.W_U"] + state["unembed.b_U"]


@pytest.fixture
def looped():
    model = build_model(ModelSpec(**SPEC, init_seed=3), device="cpu")
    model.eval()
    tokens = torch.randint(0, 15, (4, 12), generator=torch.Generator().manual_seed(0))
    return model, tokens


@pytest.mark.parametrize("injection", [True, False])
def test_the_looped_model_is_its_block_unrolled(injection):
    model = build_model(ModelSpec(**{**SPEC, "input_injection": injection}, init_seed=1), device="cpu").eval()
    tokens = torch.randint(0, 15, (3, 10), generator=torch.Generator().manual_seed(1))
    state = model.state_dict()
    assert not any(k.startswith(("blocks.2.", "blocks.5.")) for k in state)  # one copy of the shared block
    with torch.no_grad():
        got = model(tokens)
        want = unrolled(state, tokens, 2, 3, injection)
    torch.testing.assert_close(got, want, atol=2e-5, rtol=1e-5)
    assert model.cfg.n_layers == 6 and injects_input(model) == injection
    # every iteration's hook points fire; an iteration's input is the last one's output plus the embedding
    _, cache = model.run_with_cache(tokens)
    assert {f"blocks.{i}.attn.hook_pattern" for i in range(6)} <= set(cache.keys())
    e = cache["hook_embed"] + cache["hook_pos_embed"]
    for i in (2, 4):
        gap = cache[f"blocks.{i}.hook_resid_pre"] - cache[f"blocks.{i - 1}.hook_resid_post"]
        torch.testing.assert_close(gap, e if injection else torch.zeros_like(e), atol=1e-5, rtol=0)
    torch.testing.assert_close(cache["blocks.2.attn.hook_pattern"][0, 0].sum(-1), torch.ones(10))


def test_parameters_are_shared_and_trained_once(looped):
    model, tokens = looped
    plain = build_model(ModelSpec(**{**SPEC, "loops": 1}), device="cpu")
    assert sum(p.numel() for p in model.parameters()) == sum(p.numel() for p in plain.parameters())
    for i in range(2, 6):
        assert model.blocks[i].attn.W_Q is model.blocks[i % 2].attn.W_Q
        assert model.blocks[i].mlp.W_in is model.blocks[i % 2].mlp.W_in
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    before = model.blocks[4].attn.W_K.detach().clone()
    model.train()
    model(tokens).sum().backward()
    opt.step()
    assert not torch.equal(model.blocks[4].attn.W_K, before)  # the copy moved with its block's weight
    assert model.blocks[4].attn.W_K is model.blocks[0].attn.W_K
    moved = model.to(torch.float64)
    assert moved.blocks[5].ln2.w is moved.blocks[1].ln2.w and moved.blocks[5].ln2.w.dtype == torch.float64


def test_a_looped_checkpoint_stores_one_copy_and_rebuilds_the_ties(tmp_path):
    from safetensors import safe_open

    task = get_task("integer-addition", digits=[1, 3], max_digits=6, train_size=64)
    kw = {**task.default_spec(), "n_layers": 1, "loops": 3, "d_model": 16, "n_heads": 2, "d_head": 8, "d_mlp": 32}
    spec = ModelSpec(**kw)
    m = build_model(spec, device="cpu").eval()
    path = save_checkpoint(m, task, tmp_path / "looped.safetensors", spec=spec)
    with safe_open(str(path), "pt") as f:
        names = set(f.keys())
        cfg = json.loads(f.metadata()["tl_config"])
    assert any(n.startswith("blocks.0.") for n in names) and not any(n.startswith("blocks.1.") for n in names)
    assert cfg["n_layers"] == 3
    back = load_checkpoint(path, device="cpu")
    assert back.spec.loops == 3 and back.model.blocks[2].attn.W_V is back.model.blocks[0].attn.W_V
    data = task.dataset("train").tokens[:5]
    with torch.no_grad():
        assert torch.equal(back.model(data), m(data))
    # a model whose iterations were changed is not what its spec builds: refused, nothing written
    set_loops(m, 4)
    with pytest.raises(Exception, match="n_layers"):
        save_checkpoint(m, task, tmp_path / "four.safetensors", spec=spec)
    assert not (tmp_path / "four.safetensors").exists()


def test_iterations_at_evaluation_time(looped):
    model, tokens = looped
    state = model.state_dict()
    with torch.no_grad():
        three = model(tokens)
        rng = torch.random.get_rng_state()
        with iterations(model, 5):
            assert model.cfg.n_layers == 10 and "blocks.9.hook_resid_post" in model.hook_dict
            torch.testing.assert_close(model(tokens), unrolled(state, tokens, 2, 5, True), atol=2e-5, rtol=1e-5)
            assert model.blocks[9].attn.W_Q is model.blocks[1].attn.W_Q
        assert torch.equal(torch.random.get_rng_state(), rng)  # new blocks did not draw from the caller's stream
        with iterations(model, 1):
            torch.testing.assert_close(model(tokens), unrolled(state, tokens, 2, 1, True), atol=2e-5, rtol=1e-5)
        assert model.cfg.n_layers == 6 and "blocks.9.hook_resid_post" not in model.hook_dict
        assert torch.equal(model(tokens), three)
    for bad in (0, -1):  # of the annotated type (the type checker refuses others in tests)
        with pytest.raises(ConfigError, match="loops"):
            set_loops(model, bad)
    plain = build_model(ModelSpec(**{**SPEC, "loops": 1}), device="cpu")
    assert loop_of(plain) is None
    with pytest.raises(ConfigError, match="not looped"):
        set_loops(plain, 2)


def test_a_forward_started_at_a_block_needs_the_embedding(looped):
    model, tokens = looped
    with torch.no_grad():
        full, cache = model.run_with_cache(tokens)
        with pytest.raises(ConfigError, match="injected_input"):
            model(cache["blocks.2.hook_resid_pre"], start_at_layer=2)
        with injected_input(model, embedded_input(model, tokens)):
            for start in (0, 1, 2, 3, 5):
                got = model(cache[f"blocks.{start}.hook_resid_pre"], start_at_layer=start)
                torch.testing.assert_close(got, full, atol=1e-5, rtol=0)
        # the last iteration needs nothing more: a forward from its first block runs without it
        torch.testing.assert_close(model(cache["blocks.4.hook_resid_pre"], start_at_layer=4), full, atol=1e-5, rtol=0)
        with injected_input(model, embedded_input(model, tokens)[:2]), pytest.raises(ConfigError, match="shape"):
            model(cache["blocks.2.hook_resid_pre"], start_at_layer=2)
    # after a partial forward, a full one captures its own embedding again
    with torch.no_grad():
        assert torch.equal(model(tokens), full)


def test_a_looped_spec_is_checked():
    with pytest.raises(ConfigError, match="loops must be a positive integer"):
        ModelSpec(**{**SPEC, "loops": 0})
    with pytest.raises(ConfigError, match="attention variants"):
        ModelSpec(**{**SPEC, "attention": "linear:elu"})
    assert ModelSpec(**SPEC).blocks == 6 and ModelSpec(**SPEC).tl_config_kwargs(None)["n_layers"] == 6


@pytest.mark.slow
def test_patching_a_looped_model_equals_transformer_lens(monkeypatch):
    """Activation patching starts its stacked runs at the patched block (start_at_layer) and path patching at the
    receiver's: both give the looped model its embedding (interp.looping.injected_input), and equal TransformerLens'
    serial functions and the slow loop, which run every forward from the tokens."""
    from transformer_lens import patching as tl_patching

    from interp.analyses.patching import activation_patching, path_patching
    from interp.analyses.reference import path_patching_loop, variant_metric
    from interp.task import IGNORE, TaskData

    monkeypatch.setattr(tl_patching, "tqdm", lambda x, **kw: x)
    model = build_model(ModelSpec(**{**SPEC, "loops": 2}, init_seed=5), device="cpu").eval()
    gen = torch.Generator().manual_seed(2)
    clean = torch.randint(0, 15, (3, 9), generator=gen)
    corrupted = clean.clone()
    corrupted[:, 2] = (clean[:, 2] + 1) % 15
    pos, b = torch.tensor([8, 7, 8]), 3

    def data(tokens, labels):
        return TaskData("toy", tokens, torch.full_like(tokens, IGNORE), pos, labels, torch.full((b,), 9))

    c, k = data(clean, torch.tensor([1, 2, 3])), data(corrupted, torch.tensor([4, 5, 6]))
    vm = variant_metric("logit_diff", c, k)
    _, cache = model.run_with_cache(clean)
    cases = [
        ("z", "head_pos", tl_patching.get_act_patch_attn_head_out_by_pos, (0, 2, 1)),
        ("resid_pre", "pos", tl_patching.get_act_patch_resid_pre, None),
        ("mlp_out", "pos", tl_patching.get_act_patch_mlp_out, None),
    ]
    for where, per, fn, perm in cases:
        ours = activation_patching(model, c, corrupted=k, metric="logit_diff", where=where, per=per)
        theirs = fn(model, corrupted, cache, vm.of_logits)
        theirs = theirs.permute(*perm) if perm else theirs
        torch.testing.assert_close(ours.values, theirs.float(), atol=1e-4, rtol=1e-4)
    senders = [(0, 0), (1, 1), (2, 0)]
    receivers = [(2, 1), (3, 0)]
    ours = path_patching(model, c, corrupted=k, metric="logit_diff", senders=senders, receivers=receivers)
    slow = path_patching_loop(model, c, corrupted=k, metric=vm.of_logits, senders=senders, receivers=receivers)
    torch.testing.assert_close(ours.values, slow, atol=1e-4, rtol=1e-4, equal_nan=True)


@pytest.mark.slow
def test_the_integer_addition_analyses_run_on_a_looped_model(tmp_path):
    """The task's suite (analyze and report), its analyses and the generic ones on a looped addition model; the
    generic suites of the other tasks run on a looped shape in tests/test_model_shapes.py."""
    import interp.analyses as A
    from interp.analyses import suite_for
    from interp.app.report import build_report
    from interp.checkpoint import Checkpoint

    task = get_task("integer-addition", digits=[2, 3], max_digits=4, train_size=200, test_size=60, cascades_size=40)
    kw = {**task.default_spec(), "n_layers": 1, "loops": 3, "d_model": 16, "n_heads": 2, "d_head": 8, "d_mlp": 32}
    spec = ModelSpec(**kw)
    model = build_model(spec, device="cpu").eval()
    ckpt = Checkpoint(model, task, spec=spec)
    result = suite_for(task).analyze(ckpt)
    assert json.loads(result.to_json()) and result.text()
    assert "Attention patterns" in [s.title for s in build_report(ckpt, progress=False).sections]
    test = task.dataset("test")
    three = get_task("integer-addition", digits=[3, 3], max_digits=4, test_size=30).dataset("test")
    train = task.dataset("train")
    results = [
        A.accuracy_by_case(model, test),
        A.accuracy_by_length(model, task=task, lengths=[1, 4], n=20),
        A.component_ablation(model, three),
        A.subtask_probes(model, test, train=train),
        A.greedy_exact_match(model, test),
        A.activation_patching(model, three, corrupted=three.select(torch.arange(29, -1, -1)), per="head"),
        A.composition_scores(model),
        A.full_ov_circuit(model, heads=["L2H1"]),
        A.attention_spectrum(model, test),
        A.learned_accuracy(model, test, heads=[["L0H0"], ["L1H1", "L2H0"]]),
    ]
    for r in results:
        assert type(r).from_dict(r.to_dict()).to_dict() == r.to_dict() and r.text()
    assert results[2].digit_accuracy.shape[0] == len(results[2].components)  # every iteration's heads ablated
    assert len(results[5].values) == 3  # a layer per iteration
