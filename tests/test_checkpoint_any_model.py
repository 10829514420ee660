"""interp.save_checkpoint saves any HookedTransformer: every architecture TransformerLens builds round-trips to
bit-equal logits on the CPU, the toolkit's own ModelSpec models keep their spec, and a model the file would not
rebuild is refused when saving (nothing is written), never discovered when loading."""

import json

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file
from transformer_lens import HookedTransformer, HookedTransformerConfig

from interp.checkpoint import save_checkpoint
from interp.errors import CheckpointError
from interp.model import ModelSpec, build_model
from interp.rebuild import config_to_json
from interp.tasks import get_task, load_checkpoint, read_metadata


@pytest.fixture(scope="module")
def task():
    return get_task("noisy-majority", train_size=64, val_size=32, test_size=32, test_lengths=[10, 20])


def user_model(task, **kw) -> HookedTransformer:
    """A HookedTransformer a user might bring, with every parameter moved off its initial value (biases included),
    so that a weight the file lost or a part the config does not rebuild shows in the logits."""
    cfg = dict(
        n_layers=2, d_model=16, n_heads=4, d_head=4, d_mlp=24, d_vocab=len(task.vocab), d_vocab_out=task.vocab.n_out,
        n_ctx=24, act_fn="relu", seed=3, device="cpu",
    )  # fmt: skip
    model = HookedTransformer(HookedTransformerConfig(**{**cfg, **kw}))
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.3 * torch.randn(p.shape, generator=gen, dtype=p.dtype))
    return model


def user_model_of(cfg, **kw) -> HookedTransformer:
    """A model like the one of config ``cfg``, with ``kw`` changed."""
    from interp.rebuild import config_to_json

    return HookedTransformer(HookedTransformerConfig(**{**config_to_json(cfg), "device": "cpu", **kw}))


def tokens_for(model, n: int = 5) -> torch.Tensor:
    gen = torch.Generator().manual_seed(2)
    return torch.randint(0, model.cfg.d_vocab, (n, model.cfg.n_ctx), generator=gen)


def round_trip(model, task, path, spec=None):
    save_checkpoint(model, task, path, training={"note": "round trip"}, spec=spec)
    ckpt = load_checkpoint(path, device="cpu")
    t = tokens_for(model)
    with torch.no_grad():
        ours, theirs = model(t), ckpt.model(t)
    assert torch.equal(ours, theirs), f"largest difference {(ours - theirs).abs().max():.3g}"
    sd = model.state_dict()
    assert {k: (v.dtype, v.shape) for k, v in ckpt.model.state_dict().items()} == {
        k: (v.dtype, v.shape) for k, v in sd.items()
    }
    assert all(torch.equal(v, sd[k]) for k, v in ckpt.model.state_dict().items())
    assert config_to_json(ckpt.model.cfg) == config_to_json(model.cfg)
    if spec is None:  # plain TransformerLens rebuilds it from the file alone
        with safe_open(str(path), "pt") as f:
            cfg = json.loads(f.metadata()["tl_config"])
        if "dtype" in cfg:  # stored by name where it is not float32
            cfg["dtype"] = getattr(torch, cfg["dtype"])
        cfg["tokenizer_name"] = None  # (a named tokenizer would be fetched)
        plain = HookedTransformer(HookedTransformerConfig(**cfg, device="cpu"))
        plain.load_state_dict(load_file(str(path)))
        with torch.no_grad():
            assert torch.equal(plain(t), ours)
    return ckpt


# (every case has d_vocab_out != d_vocab: the task's 8 outputs of its 9 tokens)
ARCHITECTURES = {
    "grouped-query attention": dict(n_key_value_heads=2),
    "gated MLP": dict(gated_mlp=True, act_fn="silu"),
    "parallel attention and MLP": dict(parallel_attn_mlp=True),
    "rotary": dict(positional_embedding_type="rotary", rotary_dim=2, rotary_base=500, rotary_adjacent_pairs=True),
    "shortformer": dict(positional_embedding_type="shortformer"),
    "alibi": dict(positional_embedding_type="alibi"),
    "soft caps": dict(output_logits_soft_cap=2.0, attn_scores_soft_cap=1.5),
    "LN": dict(normalization_type="LN"),
    "LNPre": dict(normalization_type="LNPre"),
    "RMS, final RMS": dict(normalization_type="RMS", final_rms=True),
    "RMSPre": dict(normalization_type="RMSPre"),
    "no normalisation": dict(normalization_type=None),
    "attention only": dict(attn_only=True, normalization_type=None),
    "no attention scale": dict(use_attn_scale=False),
    "attention scale 1.7": dict(attn_scale=1.7),
    "gelu_new": dict(act_fn="gelu_new"),
    "solu_ln": dict(act_fn="solu_ln"),
    "no BOS by default": dict(default_prepend_bos=False),
    "local attention": dict(use_local_attn=True, window_size=3, attn_types=["local", "global"]),
    "float64": dict(dtype=torch.float64),
    "all at once": dict(
        n_key_value_heads=2,
        gated_mlp=True,
        act_fn="gelu",
        parallel_attn_mlp=True,
        positional_embedding_type="rotary",
        rotary_dim=2,
        output_logits_soft_cap=3.0,
        attn_scores_soft_cap=2.0,
        normalization_type="RMS",
    ),
}


@pytest.mark.parametrize("name", list(ARCHITECTURES))
def test_every_transformer_lens_architecture_round_trips_to_equal_logits(tmp_path, task, name):
    """Saved without a spec, from TransformerLens' config alone: a plain HookedTransformer comes back with the same
    config, the same tensors and bit-equal logits. Before: a parallel block reloaded as a sequential one (logits off
    by up to 3.2, silently); grouped-query and gated-MLP models saved but could not be read back."""
    model = user_model(task, **ARCHITECTURES[name])
    ckpt = round_trip(model, task, tmp_path / "m.safetensors")
    assert ckpt.spec is None and read_metadata(ckpt.path)["model_spec"] is None
    assert type(ckpt.model) is HookedTransformer and ckpt.task == task


def test_a_model_with_attention_biases_is_refused_under_a_spec_that_fixes_them(tmp_path, task):
    """Before, a model with trained attention biases saved under the task's default spec (attn_bias=False) was later
    called "corrupt or edited" when loading. Now it is refused when saving, naming the bias; without spec= its own
    config describes it and it round-trips."""
    spec = ModelSpec(**{**task.default_spec(), "d_model": 8, "n_heads": 4, "d_head": 2, "attn_bias": True})
    model = build_model(spec, device="cpu")
    with torch.no_grad():
        model.blocks[0].attn.b_Q.add_(0.5)
    default = ModelSpec(**{**spec.to_dict(), "attn_bias": False})
    path = tmp_path / "biased.safetensors"
    with pytest.raises(CheckpointError, match=r"cannot save this model: tensor blocks\.0\.attn\.b_Q is fixed by the"):
        save_checkpoint(model, task, path, spec=default)
    assert list(tmp_path.iterdir()) == []  # nothing written, no temp file left
    round_trip(model, task, path)  # its own config describes it
    assert round_trip(model, task, tmp_path / "spec.safetensors", spec=spec).spec == spec


SPECS = {
    "default": {},
    "linear:elu": dict(attention="linear:elu"),
    "linear:relu": dict(attention="linear:relu"),
    "additive": dict(attention="additive"),
    "window:3": dict(attention="window:3"),
    "window:4+random:2": dict(attention="window:4+random:2", attention_seed=5),
    "lowrank:2": dict(qkv="lowrank:2"),
    "diagonal": dict(qkv="diagonal"),
    "sparse:0.5": dict(qkv="sparse:0.5", attention_seed=3),
    "standard positions, biases, LN, 2 layers with MLP": dict(
        positional="standard", attn_bias=True, normalization="LN", n_layers=2, attn_only=False
    ),
    "rotary": dict(positional="rotary"),
    "shortformer": dict(positional="shortformer"),
    "random positions": dict(positional="random"),
    "learned W_O": dict(output_matrix="learned"),
}


@pytest.mark.parametrize("name", list(SPECS))
def test_modelspec_models_round_trip_with_their_spec(tmp_path, task, name):
    """The toolkit's own models (attention variants, hook-based positions, frozen parts) are saved with their spec,
    rebuilt by build_model from it, and give bit-equal logits."""
    spec = ModelSpec(**{**task.default_spec(), "d_model": 8, "n_heads": 4, "d_head": 2, "init_seed": 4, **SPECS[name]})
    model = build_model(spec, device="cpu")
    gen = torch.Generator().manual_seed(5)
    with torch.no_grad():  # trained-looking weights, keeping what the spec fixes
        for p in model.parameters():
            if p.requires_grad:
                p.add_(0.3 * torch.randn(p.shape, generator=gen))
    from interp.attention import qkv_masks, sync

    masks = qkv_masks(model, 0)
    with torch.no_grad():
        for which, m in (masks or {}).items():
            getattr(model.blocks[0].attn, f"W_{which}").mul_(m)
    sync(model)
    ckpt = round_trip(model, task, tmp_path / "m.safetensors", spec=spec)
    assert ckpt.spec == spec and read_metadata(ckpt.path)["model_spec"] == spec.to_dict()


def test_abacus_positions_round_trip(tmp_path):
    task = get_task("integer-addition", train_size=32, val_size=16, test_size=16, cascades_size=8)
    spec = ModelSpec(**{**task.default_spec(), "positional": "abacus", "d_model": 16, "n_heads": 2, "d_head": 8})
    model = build_model(spec, device="cpu")
    ckpt = round_trip(model, task, tmp_path / "abacus.safetensors", spec=spec)
    assert ckpt.spec.positional == "abacus"


def test_a_variant_model_saved_without_its_spec_is_refused(tmp_path, task):
    """An attention variant lives outside TransformerLens' config (a replaced score method, a masking hook, extra
    parameters): without spec= the file could not rebuild it, so saving is refused, saying to pass the spec."""
    for attention, why in (
        ("linear:elu", "calculate_attention_scores.*set on the instance"),
        ("window:4+random:2", "forward_hooks hook"),
        ("additive", "extra \\['blocks.0.attn.additive_v'\\]"),
    ):
        spec = ModelSpec(**{**task.default_spec(), "d_model": 8, "n_heads": 4, "d_head": 2, "attention": attention})
        with pytest.raises(CheckpointError, match=why) as e:
            save_checkpoint(build_model(spec, device="cpu"), task, tmp_path / "v.safetensors")
        assert "\n" not in str(e.value)
    assert list(tmp_path.iterdir()) == []


def _with_hook(model):
    model.add_hook("blocks.0.attn.hook_z", lambda z, hook: z * 0)
    return model


def _with_perma_hook(model):
    model.add_perma_hook("blocks.1.hook_resid_pre", lambda x, hook: x)
    return model


def _with_torch_hook(model):
    model.blocks[0].mlp.register_forward_hook(lambda module, args, out: out * 2)
    return model


def _with_parameter(model):
    model.blocks[0].attn.register_parameter("extra", torch.nn.Parameter(torch.zeros(3)))
    return model


def _with_module(model):
    model.blocks[0].mlp = torch.nn.Sequential()
    return model


def _with_method(model):
    attn = model.blocks[0].attn
    attn.calculate_attention_scores = lambda q, k: type(attn).calculate_attention_scores(attn, q, k) * 2
    return model


def _with_callable_config(model):
    model.cfg.init_mode = torch.nn.init.normal_
    return model


def _with_attribute_outside_config(model):
    model.blocks[0].attn.attn_scale = 0.5  # read by the forward, not described by the config
    return model


def _with_nan(model):
    with torch.no_grad():
        model.unembed.W_U[0, 0] = float("nan")
    return model


def _of_another_task(model):
    return user_model_of(model.cfg, d_vocab_out=model.cfg.d_vocab)


REFUSED = {
    "a TransformerLens hook": (_with_hook, r"blocks\.0\.attn\.hook_z has forward_hooks hook\(s\) attached"),
    "a permanent hook": (_with_perma_hook, r"blocks\.1\.hook_resid_pre has forward_hooks hook"),
    "a PyTorch hook": (_with_torch_hook, r"blocks\.0\.mlp has forward_hooks hook"),
    "an extra parameter": (_with_parameter, r"extra \['blocks\.0\.attn\.extra'\]"),
    "a replaced module": (_with_module, r"blocks\.0\.mlp is a Sequential, not a MLP"),
    "a replaced method": (_with_method, r"blocks\.0\.attn has \['calculate_attention_scores'\] set on the instance"),
    "a function in the config": (_with_callable_config, r"config field 'init_mode' holds function"),
    "an attribute the config does not describe": (_with_attribute_outside_config, r"gives other logits"),
    "a NaN weight": (_with_nan, r"tensor unembed\.W_U holds NaN"),
    "a model of another task": (_of_another_task, r"with its task: the model \(d_vocab 9, d_vocab_out 9\) does not"),
}


@pytest.mark.parametrize("name", list(REFUSED))
def test_what_the_file_would_not_rebuild_is_refused_when_saving(tmp_path, task, name):
    """Each refusal is one line naming what differs; nothing is written."""
    change, expected = REFUSED[name]
    model = change(user_model(task))
    with pytest.raises(CheckpointError, match=expected) as e:
        save_checkpoint(model, task, tmp_path / "m.safetensors")
    assert str(e.value).startswith("cannot save this model") and "\n" not in str(e.value)
    assert list(tmp_path.iterdir()) == []


def test_saving_changes_neither_the_model_nor_the_random_generators(tmp_path, task):
    """Saving keeps the model's training flags and what torch's and numpy's generators draw next (building a
    HookedTransformer reseeds them, and Python's; Python's is not checked here: the test run's runtime type checker
    draws from it itself)."""
    import numpy as np

    def seed():
        torch.manual_seed(11)
        np.random.seed(11)

    def draw():
        return torch.rand(3), float(np.random.rand())

    seed()
    expected = draw()
    model = user_model(task)
    model.train()
    seed()
    save_checkpoint(model, task, tmp_path / "m.safetensors")
    got = draw()
    assert torch.equal(got[0], expected[0]) and got[1:] == expected[1:]
    assert all(m.training for m in model.modules())


def test_the_report_of_a_model_saved_without_a_spec_shows_its_config(tmp_path, task):
    from interp.app.report import write_report

    model = user_model(task, n_layers=1, attn_only=True, normalization_type=None, n_key_value_heads=2, n_ctx=task.n_ctx)
    save_checkpoint(model, task, tmp_path / "gqa.safetensors")
    page = write_report(tmp_path / "gqa.safetensors", tmp_path / "gqa.html", device="cpu", progress=False)
    text = page.read_text()
    assert "TransformerLens config: the architecture fields" in text and "n_key_value_heads" in text


def test_a_model_with_a_tokenizer_is_saved_without_it(tmp_path, task):
    """The tokenizer maps strings to tokens, not tokens to logits: it is not saved (nothing is downloaded when
    loading); its name stays in the config."""
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel
    from transformers import PreTrainedTokenizerFast

    words = Tokenizer(WordLevel({t: i for i, t in enumerate(task.vocab.tokens)}, unk_token=task.vocab.tokens[0]))
    model = user_model(task)
    model.tokenizer = PreTrainedTokenizerFast(tokenizer_object=words)  # (set_tokenizer would fetch a BOS variant)
    model.cfg.tokenizer_name = "my-words"
    ckpt = round_trip(model, task, tmp_path / "t.safetensors")
    assert ckpt.model.tokenizer is None and ckpt.model.cfg.tokenizer_name == "my-words"
