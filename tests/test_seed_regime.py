"""The recipe's options for the seed's regime (Fraknói 2024): the training objective, the warmup's shape, padding,
the initialisation, dropout on the attention probabilities, counter-drawn dropout masks, LayerNorm in populations.
Each option changes what it says and nothing else; the forwards behind them are exact (against TransformerLens'
forward with the same masks put in by hooks); and a population trained with each equals its solo runs."""

from __future__ import annotations

import math

import pytest
import torch

from interp.errors import ConfigError
from interp.model import ModelSpec, build_model
from interp.task import IGNORE
from interp.training import TrainConfig
from tests.test_population import _population_equals_solo


# -- the options are recorded, checked and default to the old behaviour ----------------------------------------------
def test_defaults_keep_the_old_recipe_and_bad_values_are_one_line():
    cfg = TrainConfig()
    assert (cfg.objective, cfg.warmup_shape, cfg.padding, cfg.init, cfg.init_scale, cfg.dropout_rng, cfg.optimizer) == (
        "answer",
        "linear",
        "right",
        "tl",
        1.0,
        "torch",
        "adamw",
    )
    for key, bad, named in (
        ("objective", "next-token", "answer, lm"),
        ("warmup_shape", "cosine", "linear, exp"),
        ("padding", "middle", "right, left"),
        ("init", "xavier", "tl, torch, thesis"),
        ("init_scale", 0, "a positive number"),
        ("dropout_rng", "numpy", "torch, counter"),
        ("dropout_at", "pattern", "attention+pattern"),
        ("optimizer", "sgd", "adamw, adam"),
    ):
        with pytest.raises(ConfigError) as e:
            TrainConfig(**{key: bad})
        assert "\n" not in str(e.value) and named in str(e.value) and key in str(e.value)


def test_every_new_option_is_a_flag_a_grid_key_and_a_column():
    from interp.options import options
    from interp.sweep_directory import config_columns_all, grid_options

    opts = options(TrainConfig)
    for key in ("objective", "warmup_shape", "padding", "init", "init_scale", "dropout_rng", "optimizer"):
        assert opts[key].config and key in grid_options() and key in config_columns_all()
    assert opts["objective"].choices == ("answer", "lm")


def test_new_options_left_at_their_defaults_keep_run_names():
    """A run named before these options existed keeps its name (they enter the hash only when changed)."""
    from interp.sweep_directory import config_hash, run_identity

    spec = ModelSpec(d_vocab=9, n_ctx=204, d_model=8, n_heads=4)
    old = run_identity("noisy-majority", {}, spec, TrainConfig(dropout_at="attention"))
    assert "objective" not in json_dumps(old) and config_hash(old) == config_hash(
        run_identity("noisy-majority", {}, spec, TrainConfig(dropout_at="attention", objective="answer"))
    )
    assert config_hash(old) != config_hash(
        run_identity("noisy-majority", {}, spec, TrainConfig(dropout_at="attention", objective="lm"))
    )


def json_dumps(x) -> str:
    import json

    return json.dumps(x, sort_keys=True)


# -- each option changes what it says ----------------------------------------------------------------------------------
def test_lm_targets_are_every_next_token_of_the_sentence(tiny_task):
    from interp.objectives import lm_targets

    data = tiny_task.dataset("train").select(slice(0, 20))
    t = lm_targets(data)
    for i in range(len(data)):
        n = int(data.lengths[i])
        assert t[i, : n - 1].tolist() == data.tokens[i, 1:n].tolist()
        assert (t[i, n - 1 :] == IGNORE).all()
    # the answer objective's two targets are among them
    has = data.targets != IGNORE
    assert torch.equal(t[has], data.targets[has])


def test_warmup_shapes():
    from interp.schedules import warmup_factor

    lin, exp = TrainConfig(), TrainConfig(warmup_shape="exp")
    assert lin.warmup == 2000 and warmup_factor(lin, 0) == 1 / 2000 and warmup_factor(lin, 1999) == 1.0
    # Ma & Yarats' untuned exponential warmup: 1 - exp(-(1 - beta2) t)
    for t in (0, 10, 999, 5000):
        assert warmup_factor(exp, t) == pytest.approx(1 - math.exp(-(1 - 0.999) * (t + 1)), rel=1e-12)
    assert warmup_factor(TrainConfig(warmup_steps=0, warmup_shape="exp"), 0) == 1.0


def test_left_padding_puts_pads_before_the_sentence(tiny_task):
    from interp.objectives import eval_pads, left_pad

    data = tiny_task.dataset("train").select(slice(0, 6))
    tok, tgt, pos = left_pad(data.tokens, data.targets, data.lengths, tiny_task.vocab.pad)
    t = data.tokens.shape[1]
    for i in range(6):
        n = int(data.lengths[i])
        assert tok[i, t - n :].tolist() == data.tokens[i, :n].tolist()
        assert (tok[i, : t - n] == tiny_task.vocab.pad).all() and pos[i, t - n] == 0 and pos[i, 0] == n - t
        assert tgt[i, t - n :].tolist() == data.targets[i, :n].tolist()
    assert eval_pads(torch.tensor([3, 5, 4, 9, 1]), 2).tolist() == [2, 0, 5, 0, 0]


@pytest.mark.parametrize("init", ["torch", "thesis"])
def test_initialisations_draw_what_they_say_and_leave_the_global_rng_alone(init):
    from interp.initialisation import initialise

    spec = ModelSpec(d_vocab=9, n_ctx=64, d_model=32, n_heads=16, d_head=2, d_vocab_out=8, positional="none")
    model = build_model(spec, device="cpu")
    frozen = {n: p.detach().clone() for n, p in model.named_parameters() if not p.requires_grad}
    state = torch.random.get_rng_state()
    initialise(model, spec, init)
    assert torch.equal(state, torch.random.get_rng_state())
    for n, p in model.named_parameters():
        if not p.requires_grad:
            assert torch.equal(p, frozen[n]), n  # zero W_pos, identity W_O stay
    if init == "torch":  # nn.Embedding N(0, 1); nn.Linear uniform in +-1/sqrt(fan_in)
        assert model.W_E.std().item() == pytest.approx(1.0, abs=0.15)
        assert model.W_Q.abs().max().item() <= 1 / math.sqrt(32) and model.W_Q.std().item() == pytest.approx(
            1 / math.sqrt(32) / math.sqrt(3), rel=0.15
        )
        assert 0 < model.b_U.abs().max().item() <= 1 / math.sqrt(32)
    else:  # Fraknói 2024 §2.7
        assert model.W_E.std().item() == pytest.approx(1 / math.sqrt(32), rel=0.2)
        assert model.W_K.std().item() == pytest.approx(math.sqrt(2 / 3 / 32), rel=0.15)
    again = build_model(spec, device="cpu")
    initialise(again, spec, init, scale=2.0)
    assert torch.allclose(again.W_V, 2 * model.W_V)  # the scale multiplies every weight matrix, same draws


def test_pattern_dropout_and_every_mask_act_where_they_say(tiny_task, tiny_spec):
    """The per-position forward with embedding, pattern and output masks equals TransformerLens' forward with the
    same masks applied by hooks (hook_resid_pre, hook_pattern, hook_attn_out), with and without LayerNorm, for the
    answer and the language-model objective, right and left padded."""
    from dataclasses import replace

    from interp.position_forward import Norm, build_layout, model_params, stacked_position_logits

    data = tiny_task.dataset("train").select(slice(0, 24))
    g = torch.Generator().manual_seed(0)
    for norm in (None, "LN"):
        model = build_model(replace(tiny_spec, normalization=norm), device="cpu")
        with torch.no_grad():
            for p in model.parameters():
                if p.requires_grad:
                    p.add_(torch.randn(p.shape, generator=g))
        for objective in ("answer", "lm"):
            for padding in ("right", "left"):
                lay = build_layout(
                    data.tokens[None], data.targets[None], data.lengths[None], objective, padding, tiny_task.vocab.pad
                )
                _, b, t = lay.tokens.shape
                k = lay.query_pos.shape[-1]
                emb = torch.empty(1, b, t, 8).bernoulli_(0.8, generator=g) / 0.8
                pat = torch.empty(1, b, k, 4, t).bernoulli_(0.8, generator=g) / 0.8
                out = torch.empty(1, b, k, 8).bernoulli_(0.8, generator=g) / 0.8
                got = stacked_position_logits(
                    model_params(model),
                    lay.tokens,
                    lay.query_pos,
                    float(model.blocks[0].attn.attn_scale),
                    Norm.of(model),
                    identity_w_o=True,
                    emb_mask=emb,
                    pattern_mask=pat,
                    out_mask=out,
                )[0]
                qp, rows = lay.query_pos[0], torch.arange(b)[:, None]
                full_pat, full_out = torch.ones(b, 4, t, t), torch.ones(b, t, 8)
                for j in range(k):
                    full_pat[rows[:, 0], :, qp[:, j]] = pat[0, :, j]
                    full_out[rows[:, 0], qp[:, j]] = out[0, :, j]
                hooks = [
                    ("blocks.0.hook_resid_pre", lambda x, hook, m=emb[0]: x * m),
                    ("blocks.0.attn.hook_pattern", lambda x, hook, m=full_pat: x * m),
                    ("blocks.0.hook_attn_out", lambda x, hook, m=full_out: x * m),
                ]
                ref = model.run_with_hooks(lay.tokens[0], fwd_hooks=hooks)[rows, qp]
                valid = lay.targets[0] != IGNORE
                torch.testing.assert_close(got[valid], ref[valid], atol=2e-4, rtol=1e-4)


def test_counter_masks_depend_on_place_not_on_batching():
    from interp.dropout_masks import pattern_mask, position_mask, row_keys, run_keys

    keys = run_keys([7, 8], epoch=3, site="embedding")
    sent = torch.tensor([[5, 9, 2], [9, 1, 4]])
    pos = torch.arange(-2, 30).expand(2, 3, -1)
    m = position_mask(row_keys(keys, sent), pos, 16, 0.1)
    # the same (seed, epoch, sentence, position) gives the same mask whatever batch or padding it sits in
    alone = position_mask(row_keys(keys[:1], torch.tensor([[9]])), torch.arange(5, 12)[None, None], 16, 0.1)
    assert torch.equal(alone[0, 0], m[0, 1, 7:14])
    assert not torch.equal(m[0, 1], m[1, 0])  # another seed, the same sentence: other masks
    assert set(m.unique().tolist()) == {0.0, torch.tensor(1 / 0.9).item()}
    big = position_mask(row_keys(keys, torch.arange(4000).view(2, 2000)), torch.arange(64).expand(2, 2000, -1), 32, 0.1)
    assert (big == 0).float().mean().item() == pytest.approx(0.1, abs=2e-3)
    other_epoch = position_mask(row_keys(run_keys([7, 8], 4, "embedding"), sent), pos, 16, 0.1)
    assert not torch.equal(m, other_epoch)
    pm = pattern_mask(row_keys(keys, sent), pos[..., :2], pos, 4, 0.5)
    assert pm.shape == (2, 3, 2, 4, 32) and (pm == 0).float().mean().item() == pytest.approx(0.5, abs=0.03)


def test_prefix_count_forward_equals_the_per_position_one(tiny_task, tiny_spec):
    """The language-model loss of K models through prefix counts (dense groups by the rational form, the rest by a
    softmax over counted tokens) equals the per-position forward's, with counter masks on the attention output, with
    and without LayerNorm and a trained W_O."""
    from dataclasses import replace

    from interp.dropout_masks import run_keys
    from interp.objectives import lm_targets
    from interp.position_forward import Norm, build_layout, draw_masks, mean_losses, stacked_position_logits
    from interp.prefix_counts import pack, prefix_count_losses, prefix_rows

    data = tiny_task.dataset("train")
    rows = prefix_rows(data.tokens, lm_targets(data), 9)
    assert sum(len(b.rows) for b in rows.blocks) == int((lm_targets(data) != IGNORE).sum())
    assert any(b.query >= 0 for b in rows.blocks) and rows.blocks[-1].query == -1
    g = torch.Generator().manual_seed(1)
    for norm, w_o in ((None, "identity"), ("LN", "learned")):
        spec = replace(tiny_spec, normalization=norm, output_matrix=w_o, attn_bias=w_o == "learned")
        models = [build_model(replace(spec, init_seed=s), device="cpu") for s in range(3)]
        for m in models:
            with torch.no_grad():
                for p in m.parameters():
                    if p.requires_grad:
                        p.add_(2 * torch.randn(p.shape, generator=g))
        P = {
            n: torch.stack([dict(m.named_parameters())[n] for m in models]).detach()
            for n, _ in models[0].named_parameters()
        }
        idx = torch.stack([torch.randperm(len(data), generator=g)[:40] for _ in range(3)])
        got = prefix_count_losses(
            P, rows, pack(rows, idx), 2**0.5, Norm(norm), w_o == "identity", run_keys([0, 1, 2], 3, "attention"), 0.1
        )
        lay = build_layout(data.tokens[idx], data.targets[idx], data.lengths[idx], "lm", "right", 8)
        _, _, out = draw_masks(
            lay, frozenset({"attention"}), 0.1, "counter", 8, 4, seeds=[0, 1, 2], epoch=3, sentences=idx
        )
        ref = mean_losses(
            stacked_position_logits(
                P, lay.tokens, lay.query_pos, 2**0.5, Norm(norm), identity_w_o=w_o == "identity", out_mask=out
            ),
            lay.targets,
        )
        torch.testing.assert_close(got, ref, atol=2e-4, rtol=1e-5)
        wide = pack(rows, idx, [int(b.length[idx].sum(-1).max()) + 17 for b in rows.blocks])  # padded slots: weight 0
        torch.testing.assert_close(
            prefix_count_losses(
                P, rows, wide, 2**0.5, Norm(norm), w_o == "identity", run_keys([0, 1, 2], 3, "attention"), 0.1
            ),
            got,
            atol=1e-5,
            rtol=1e-6,
        )


def test_prefix_rows_and_pack_make_every_tensor_on_their_inputs_device(tiny_task):
    """A tensor made without ``device=`` lands on torch's default device, not the data's: with the default set to
    ``meta``, such a tensor meets the CPU data and fails, as a CPU one met CUDA data when a population trained
    through prefix counts on a GPU (``prefix_rows`` shifted the counts by a CPU ``arange``). Every tensor of the
    rows and of the packed blocks is on the data's device."""
    from dataclasses import fields

    from interp.objectives import lm_targets
    from interp.prefix_counts import pack, prefix_rows

    data = tiny_task.dataset("train")
    idx = torch.randperm(len(data), generator=torch.Generator().manual_seed(0))[:40].view(2, 20)
    with torch.device("meta"):
        rows = prefix_rows(data.tokens, lm_targets(data), 9)
        packed = pack(rows, idx)
    made = [rows, *rows.blocks, packed, *packed.blocks]
    tensors = [getattr(x, f.name) for x in made for f in fields(x) if isinstance(getattr(x, f.name), torch.Tensor)]
    assert len(tensors) == 6 + 3 * len(rows.blocks) + 1 + 6 * len(packed.blocks)
    assert {t.device.type for t in tensors} == {"cpu"}


# -- populations equal their solo runs under every option ------------------------------------------------------------
CASES = {
    "lm, counter masks (prefix counts)": (dict(objective="lm", dropout_at="attention", dropout_rng="counter"), {}),
    "lm, torch masks (positions)": (dict(objective="lm", dropout_at="attention"), {}),
    "lm, embedding dropout (positions)": (dict(objective="lm", dropout_rng="counter"), {}),
    "left padding (token counts)": (dict(padding="left", dropout_at="attention"), {}),
    "left padding, counter (token counts)": (dict(padding="left", dropout_at="attention", dropout_rng="counter"), {}),
    "left padding (positions)": (dict(padding="left"), {}),
    "pattern dropout (positions)": (dict(dropout_at="attention+pattern"), {}),
    "all three sites, counter (positions)": (dict(dropout_at="embedding+attention+pattern", dropout_rng="counter"), {}),
    "torch initialisation": (dict(init="torch", dropout_at="attention"), {}),
    "thesis initialisation, scaled": (dict(init="thesis", init_scale=2.0, dropout_at="attention"), {}),
    "exponential warmup": (dict(warmup_shape="exp", dropout_at="attention"), {}),
    "Adam with L2 weight decay": (dict(optimizer="adam", dropout_at="attention"), {}),
    "LayerNorm (token counts)": (dict(dropout_at="attention"), dict(normalization="LN")),
    "LayerNorm, lm (prefix counts)": (
        dict(objective="lm", dropout_at="attention", dropout_rng="counter"),
        dict(normalization="LN"),
    ),
    "LayerNorm (positions)": (dict(), dict(normalization="LN")),
}
FORWARD = {
    "prefix counts": lambda name: "prefix counts" in name,
    "token counts": lambda name: (
        "token counts" in name
        or name
        in ("torch initialisation", "thesis initialisation, scaled", "exponential warmup", "Adam with L2 weight decay")
    ),
}


@pytest.mark.slow
@pytest.mark.parametrize("name", list(CASES))
def test_population_equals_solo_runs_under_each_option(tmp_path, tiny_task, tiny_spec, tiny_cfg, name):
    from dataclasses import replace

    cfg_kw, spec_kw = CASES[name]
    pairs = _population_equals_solo(
        tmp_path, tiny_task, replace(tiny_spec, **spec_kw), tiny_cfg(epochs=3, **cfg_kw), [0, 1, 2]
    )
    expected = next((f for f, test in FORWARD.items() if test(name)), "positions")
    for pop, solo in pairs:
        assert pop["population"]["forward"] == expected
        assert {k: pop["config"][k] for k in cfg_kw} == cfg_kw == {k: solo["config"][k] for k in cfg_kw}


def test_options_change_the_training(tmp_path, tiny_task, tiny_spec, tiny_cfg):
    """Each option trains another model than the default recipe from the same seed (it does something)."""
    from safetensors.torch import load_file

    from interp.training import train

    def weights(**kw):
        out = tmp_path / f"{len(list(tmp_path.iterdir()))}.safetensors"
        train(tiny_task, tiny_spec, tiny_cfg(**{"epochs": 1, "dropout_at": "attention", **kw}), out, progress=False)
        return load_file(out)["blocks.0.attn.W_Q"]

    base = weights()
    for kw in (
        dict(objective="lm"),
        dict(warmup_shape="exp"),
        dict(padding="left"),
        dict(init="torch"),
        dict(init_scale=0.5),
        dict(dropout_at="attention+pattern"),
        dict(dropout_rng="counter"),
        dict(optimizer="adam"),
    ):
        assert not torch.allclose(weights(**kw), base), kw


def test_recipe_options_a_model_cannot_take_are_refused_before_training(tmp_path, tiny_task, tiny_spec, tiny_cfg):
    from dataclasses import replace

    from interp.training import train

    two_layers = replace(tiny_spec, n_layers=2)
    with pytest.raises(ConfigError, match="one-layer attention-only"):
        train(tiny_task, two_layers, tiny_cfg(epochs=1, padding="left"), tmp_path / "x.safetensors", progress=False)


def test_rows_of_checkpoints_older_than_an_option_take_its_default():
    """A checkpoint written before an option existed did what the option's default does: its row says so (not None)."""
    from interp.sweep_directory import flat_row

    meta = {"model_spec": {"d_model": 8, "n_heads": 4}, "training": {"config": {"lr": 1e-3}}}
    row = flat_row({"seed": 0}, meta)
    assert (row["optimizer"], row["objective"], row["lr"], row["d_model"]) == ("adamw", "answer", 1e-3, 8)


def test_the_text_table_names_only_the_task_parameters_that_differ():
    from interp.analyses.populations import format_table, population_table

    def row(seed, test_size, acc):
        params = {"seed": 0, "test_size": test_size, "train_size": 7500}
        return {
            "task": "noisy-majority",
            "task_params": params,
            "seed": seed,
            "d_model": 8,
            "n_heads": 4,
            "metrics": {"test": {"accuracy": acc}},
        }

    rows = [row(0, 1000, 1.0), row(1, 1000, 0.99), row(0, 1500, 1.0)]
    text = format_table(population_table(rows))
    lines = text.splitlines()
    assert "test_size=1000" in lines[1] and "test_size=1500" in lines[2] and "train_size" not in text
    assert "0.50 [" in lines[1] and "1.00 [" in lines[2]


def test_masks_written_into_kept_buffers_equal_new_ones(tiny_task):
    """Torch masks written into buffers kept from step to step (``buffers``: how a population draws them) equal
    masks drawn into new tensors bit for bit, at every site, over steps whose batches grow and shrink in rows and
    width (a buffer left bigger by an earlier step is cut to the step, and nothing stale shows), sorted or not, under
    both objectives and both paddings; the buffer is reused, not reallocated, once it is big enough."""
    from interp.position_forward import build_layout, draw_masks

    data = tiny_task.dataset("train")
    g = torch.Generator().manual_seed(3)
    sites = frozenset({"embedding", "pattern", "attention"})
    for objective, padding in (("answer", "right"), ("lm", "right"), ("answer", "left")):
        buffers, widths = {}, set()
        for step, rows in enumerate((40, 12, 20, 5)):
            idx = torch.stack([torch.randperm(len(data), generator=g)[:rows] for _ in range(3)])
            if step == 0:
                first = idx
            if step == 2:  # rows of step 0: no wider, fewer
                idx = first[:, :rows]
            lengths = data.lengths[idx]
            lay = build_layout(data.tokens[idx], data.targets[idx], lengths, objective, padding, data.vocab.pad)
            order = lengths.argsort(dim=1, stable=True) if step % 2 else None
            widths.add(lay.tokens.shape[-1])
            before = {n: b.data_ptr() for n, b in buffers.items()}
            kw = dict(epoch=step, rows=order, sentences=idx)
            got = draw_masks(
                lay,
                sites,
                0.3,
                "torch",
                8,
                4,
                generators=[torch.Generator().manual_seed(s) for s in range(3)],
                buffers=buffers,
                **kw,
            )
            new = draw_masks(
                lay, sites, 0.3, "torch", 8, 4, generators=[torch.Generator().manual_seed(s) for s in range(3)], **kw
            )
            for a, b in zip(got, new):
                assert torch.equal(a, b), (objective, padding, step)
            assert got[0].data_ptr() == buffers["embedding"].data_ptr()
            assert got[1].data_ptr() == buffers["pattern"].data_ptr()
            if step == 2:  # the buffers of the steps before serve
                assert {n: b.data_ptr() for n, b in buffers.items()} == before
        assert len(widths) > 1


def test_a_step_cut_into_runs_by_length_has_the_losses_of_the_whole_batch(tiny_task, tiny_spec):
    """A right-padded per-position step sorts each model's batch by length and pads each run of sentences to its own
    longest (``position_losses`` given the lengths): each model's loss equals its loss over the whole batch padded
    to the step's longest, with torch masks (drawn in the solo run's order, then sorted) at every site, under both
    objectives, with attention biases and a learned W_O. (Counter masks, drawn per run, are checked by the
    populations-equal-solo cases: they compile the hash, seconds on a first call.)"""
    from dataclasses import replace

    from interp.population_paths import position_losses
    from interp.position_forward import Norm, build_layout

    data = tiny_task.dataset("train")
    g = torch.Generator().manual_seed(2)
    spec = replace(tiny_spec, output_matrix="learned", attn_bias=True)
    models = [build_model(replace(spec, init_seed=s), device="cpu") for s in range(3)]
    for m in models:
        with torch.no_grad():
            for p in m.parameters():
                if p.requires_grad:
                    p.add_(torch.randn(p.shape, generator=g))
    P = {
        n: torch.stack([dict(m.named_parameters())[n] for m in models]).detach()
        for n, _ in models[0].named_parameters()
    }
    idx = torch.stack([torch.randperm(len(data), generator=g)[:40] for _ in range(3)])
    for objective in ("answer", "lm"):
        cfg = TrainConfig(objective=objective, dropout_at="embedding+attention+pattern")
        lay = build_layout(data.tokens[idx], data.targets[idx], data.lengths[idx], objective, "right", None)
        got = [
            position_losses(
                P,
                lay,
                cfg,
                8,
                4,
                2**0.5,
                Norm(),
                False,
                generators=[torch.Generator().manual_seed(s) for s in range(3)],
                seeds=[0, 1, 2],
                epoch=1,
                sentences=idx,
                lengths=lengths,
            )
            for lengths in (None, data.lengths[idx])
        ]
        torch.testing.assert_close(got[1], got[0], atol=1e-5, rtol=1e-5)
