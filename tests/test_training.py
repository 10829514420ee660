"""Training: a tiny run learns, resume equals uninterrupted, bad options and resume files are refused."""

import pytest
import torch
from safetensors.torch import load_file

from interp.errors import CheckpointError, ConfigError, InterpError
from interp.model import ModelSpec
from interp.tasks import get_task, load_checkpoint
from interp.training import TrainConfig, dropout_hooks, resume_path, train


def test_a_tiny_run_learns_and_generalises_to_longer_inputs(tmp_path, tiny_task, tiny_spec, tiny_cfg):
    out = tmp_path / "tiny.safetensors"
    prov = train(tiny_task, tiny_spec, tiny_cfg(), out, device="cpu", progress=False)
    # train lengths 0-20, test lengths 31-40 (never seen); chance is ~0.5
    assert prov["accuracy"]["val"] >= 0.95 and prov["accuracy"]["test"] >= 0.95
    assert prov["history"][0]["val_accuracy"] < prov["accuracy"]["val"]
    ckpt = load_checkpoint(out, device="cpu")
    assert ckpt.training["best_epoch"] == prov["best_epoch"] and ckpt.training["seed"] == 0
    # the stored accuracies are those of the stored weights
    from interp.evaluation import evaluate

    assert evaluate(ckpt.model, tiny_task, tiny_task.dataset("test"))["accuracy"] == prov["accuracy"]["test"]
    assert not resume_path(out).exists()


def test_training_is_deterministic_for_a_seed(tmp_path, tiny_task, tiny_spec, tiny_cfg):
    assert not torch.are_deterministic_algorithms_enabled()  # training switches it on, then restores it
    a = train(tiny_task, tiny_spec, tiny_cfg(epochs=2), tmp_path / "a.safetensors", device="cpu", progress=False)
    b = train(tiny_task, tiny_spec, tiny_cfg(epochs=2), tmp_path / "b.safetensors", device="cpu", progress=False)
    wa, wb = load_file(str(tmp_path / "a.safetensors")), load_file(str(tmp_path / "b.safetensors"))
    assert all(torch.equal(wa[k], wb[k]) for k in wa) and a["history"] == b["history"]
    assert not torch.are_deterministic_algorithms_enabled()
    c = train(
        tiny_task, tiny_spec, tiny_cfg(epochs=2, seed=1), tmp_path / "c.safetensors", device="cpu", progress=False
    )
    assert c["history"] != a["history"]


@pytest.mark.slow
def test_multithreaded_training_of_the_seed_model_is_deterministic(tmp_path, tiny_cfg):
    """The 16-head model on its real data with two threads: without deterministic algorithms on, the
    backward's scatter-adds made two such runs differ after a few hundred steps."""
    task = get_task("noisy-majority", train_size=2048, val_size=64, test_size=64)
    spec = ModelSpec(**task.default_spec())
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        for name in ("a", "b"):
            train(
                task,
                spec,
                tiny_cfg(epochs=6, batch_size=128, lr=1e-3),
                tmp_path / f"{name}.safetensors",
                device="cpu",
                progress=False,
            )
    finally:
        torch.set_num_threads(threads)
    wa, wb = load_file(str(tmp_path / "a.safetensors")), load_file(str(tmp_path / "b.safetensors"))
    assert [k for k in wa if not torch.equal(wa[k], wb[k])] == []


class Interrupted(Exception):
    pass


def test_resume_after_a_kill_equals_an_uninterrupted_run(tmp_path, tiny_task, tiny_spec, tiny_cfg):
    cfg = tiny_cfg(epochs=6, save_every=2)
    full = train(tiny_task, tiny_spec, cfg, tmp_path / "full.safetensors", device="cpu", progress=False)

    out = tmp_path / "killed.safetensors"

    def kill_after_epoch_3(epoch, record):  # the resume file of epoch 2 exists; epoch 3's work is lost
        if epoch == 3:
            raise Interrupted

    with pytest.raises(Interrupted):
        train(tiny_task, tiny_spec, cfg, out, device="cpu", progress=False, on_epoch_end=kill_after_epoch_3)
    assert resume_path(out).exists() and not out.exists()
    resumed = train(tiny_task, tiny_spec, cfg, out, device="cpu", progress=False, resume=True)

    w_full, w_resumed = load_file(str(tmp_path / "full.safetensors")), load_file(str(out))
    assert w_full.keys() == w_resumed.keys() and all(torch.equal(w_full[k], w_resumed[k]) for k in w_full)
    assert resumed["history"] == full["history"] and resumed["best_epoch"] == full["best_epoch"]
    assert resumed["accuracy"] == full["accuracy"]
    assert not resume_path(out).exists()


def test_resume_refuses_missing_or_foreign_state(tmp_path, tiny_task, tiny_spec, tiny_cfg):
    with pytest.raises(CheckpointError, match="no resume file"):
        train(
            tiny_task, tiny_spec, tiny_cfg(), tmp_path / "none.safetensors", device="cpu", progress=False, resume=True
        )

    out = tmp_path / "run.safetensors"

    def stop(epoch, record):
        raise Interrupted

    with pytest.raises(Interrupted):
        train(tiny_task, tiny_spec, tiny_cfg(save_every=1), out, device="cpu", progress=False, on_epoch_end=stop)
    with pytest.raises(CheckpointError, match="different run \\(differs in: lr\\)"):
        train(tiny_task, tiny_spec, tiny_cfg(lr=5e-3), out, device="cpu", progress=False, resume=True)
    resume_path(out).write_bytes(b"garbage")
    with pytest.raises(CheckpointError, match="corrupt"):
        train(tiny_task, tiny_spec, tiny_cfg(), out, device="cpu", progress=False, resume=True)


@pytest.mark.parametrize("kw", [{"epochs": 0}, {"lr": -1.0}, {"dropout": 1.0}, {"batch_size": 0}, {"beta2": 1.0}])
def test_bad_training_options(kw, tiny_cfg):
    with pytest.raises(ConfigError, match="invalid training option"):
        tiny_cfg(**kw)


def test_missing_output_directory_is_refused_before_training(tmp_path, tiny_task, tiny_spec, tiny_cfg):
    with pytest.raises(InterpError, match="does not exist"):
        train(tiny_task, tiny_spec, tiny_cfg(), tmp_path / "no" / "x.safetensors", device="cpu", progress=False)


def test_default_warmup_is_ma_and_yarats_untuned():
    assert TrainConfig().warmup == 2000  # 2 / (1 - 0.999)
    assert TrainConfig(beta2=0.98).warmup == 100


def test_dropout_hooks_sit_after_embedding_and_attention(tiny_task, tiny_spec):
    from interp.model import build_model

    model = build_model(tiny_spec, device="cpu")
    names = [n for n, _ in dropout_hooks(model, 0.1)]
    assert names == ["blocks.0.hook_resid_pre", "blocks.0.hook_attn_out"]
    assert dropout_hooks(model, 0.0) == []
    x = torch.ones(1000)
    dropped = dropout_hooks(model, 0.5)[0][1](x, hook=None)
    assert 300 < int((dropped == 0).sum()) < 700 and set(dropped.unique().tolist()) <= {0.0, 2.0}


@pytest.mark.parametrize(
    "shape, inert",
    [
        (dict(), True),
        (dict(d_model=2, n_heads=1, d_head=2, output_matrix="identity"), True),
        (dict(n_heads=64, output_matrix="learned"), True),
        (dict(attention="linear:elu"), False),  # b_K changes a linear score: a true gradient
        (dict(positional="rotary"), False),  # rotated with the key: not one constant per query
        (dict(n_layers=2), False),  # not batched by populations: TransformerLens' own gradient
    ],
    ids=["4 heads", "1 head", "64 heads, trained W_O", "linear attention", "rotary", "2 layers"],
)
def test_the_key_bias_gradient_is_zeroed_exactly_where_populations_batch_softmax(
    tmp_path, tiny_task, tiny_spec, tiny_cfg, shape, inert
):
    """``inert_parameters``: b_K's gradient is set to its exact value, zero, in one-layer softmax models only; a
    solo run there keeps b_K where weight decay alone moves it (0 without decay), elsewhere trains it."""
    from dataclasses import replace

    from interp.model import build_model
    from interp.training import inert_parameters

    spec = replace(tiny_spec, attn_bias=True, **shape)
    assert inert_parameters(build_model(spec, device="cpu")) == (("blocks.0.attn.b_K",) if inert else ())
    out = tmp_path / "m.safetensors"
    train(tiny_task, spec, tiny_cfg(epochs=1, weight_decay=0.0), out, device="cpu", progress=False)
    b_K = load_file(out)["blocks.0.attn.b_K"]  # TransformerLens starts every bias at zero
    assert (torch.count_nonzero(b_K) == 0) == inert
