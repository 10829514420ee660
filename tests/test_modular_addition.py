"""Modular addition: data, the Fourier basis, key frequencies, restricted/excluded loss, neurons, exhaustive ablation,
a short training run that memorises (with snapshots and progress measures), the suite and the CLI; a slow test that
grokks."""

from __future__ import annotations

import json
import math

import pytest
import torch

from interp.analyses.modular_addition.exhaustive import ablated_accuracies, ablated_accuracy, attention_split
from interp.analyses.modular_addition.fourier import (
    embedding_norms,
    find_key_frequencies,
    fourier_basis,
    frequency_energy,
    key_frequencies_of,
    logit_frequency_energy,
    neuron_frequencies,
    neuron_logit_map,
)
from interp.analyses.modular_addition.progress import (
    excluded_logits,
    find_phases,
    key_directions,
    progress_measures,
    restricted_logits,
    sum_squared_weights,
)
from interp.errors import InterpError, TaskError
from interp.model import ModelSpec, build_model
from interp.task import IGNORE
from interp.tasks import get_task


def small_spec(task, **kw):
    return ModelSpec(**{**task.default_spec(), "d_model": 32, "n_heads": 2, "d_head": 16, "d_mlp": 64, **kw})


# -- data -------------------------------------------------------------------------------------------------------
def test_default_split_sizes_and_every_pair_once():
    task = get_task("modular-addition")
    train, test = task.dataset("train"), task.dataset("test")
    assert (len(train), len(test)) == (3830, 8939)  # the paper's split at p = 113, fraction 0.3
    pairs = torch.cat([train.fields["a"] * 113 + train.fields["b"], test.fields["a"] * 113 + test.fields["b"]])
    assert torch.equal(pairs.sort().values, torch.arange(113**2))
    for d in (train, test):
        assert torch.equal(d.labels, (d.fields["a"] + d.fields["b"]) % 113)
        assert torch.equal(d.tokens[:, 2], torch.full((len(d),), 113))
        assert torch.equal(d.targets[:, 2], d.labels) and bool((d.targets[:, :2] == IGNORE).all())


def test_split_is_deterministic_and_seeded():
    a, b = get_task("modular-addition", p=13), get_task("modular-addition", p=13)
    assert torch.equal(a.dataset("train").tokens, b.dataset("train").tokens)
    c = get_task("modular-addition", p=13, seed=1)
    assert not torch.equal(a.dataset("train").tokens, c.dataset("train").tokens)
    assert torch.equal(a.dataset("train", seed=1).tokens, c.dataset("train").tokens)
    alld = a.dataset("all")
    assert torch.equal(alld.fields["a"] * 13 + alld.fields["b"], torch.arange(169))


@pytest.mark.parametrize(
    "params", [dict(p=1), dict(fraction=0), dict(fraction=1.0), dict(fraction=0.001, p=5), dict(seed=-1)]
)
def test_bad_parameters(params):
    with pytest.raises(TaskError):
        get_task("modular-addition", **params)


def test_unknown_split():
    with pytest.raises(TaskError, match="unknown split"):
        get_task("modular-addition", p=7).dataset("val")


# -- Fourier basis -----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("p", [113, 10, 7])
def test_fourier_basis_is_orthonormal(p):
    basis, names = fourier_basis(p)
    assert basis.shape == (p, p) and len(names) == p
    torch.testing.assert_close(basis @ basis.T, torch.eye(p, dtype=torch.float64), atol=1e-12, rtol=0)


@pytest.mark.parametrize("p", [113, 10])
def test_frequency_energy_matches_numpy_fft(p):
    """Energy per frequency from the basis equals the FFT's: |X_0|^2 / p, 2 |X_k|^2 / p, and |X_{p/2}|^2 / p."""
    import numpy as np

    x = torch.randn(p, 3, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    basis, _ = fourier_basis(p)
    energy = frequency_energy(basis @ x, p)
    X = np.abs(np.fft.rfft(x.numpy(), axis=0)) ** 2 / p
    expected = X.sum(1) * 2
    expected[0] /= 2
    if p % 2 == 0:
        expected[-1] /= 2
    np.testing.assert_allclose(energy.numpy(), expected, rtol=1e-10, atol=1e-10)


# -- key frequencies ---------------------------------------------------------------------------------------------
def synthetic_embedding(p, freqs, d=64, noise=0.01, seed=0):
    g = torch.Generator().manual_seed(seed)
    a = torch.arange(p, dtype=torch.float64)
    w = torch.zeros(p, d, dtype=torch.float64)
    for k in freqs:
        for f in (torch.cos, torch.sin):
            w += f(2 * math.pi * k * a / p)[:, None] * torch.randn(1, d, dtype=torch.float64, generator=g)
    return w + noise * torch.randn(p, d, dtype=torch.float64, generator=g)


@pytest.mark.parametrize("freqs", [[14, 35, 41, 42, 52], [3], [7, 20, 50]])
def test_key_frequencies_found_on_synthetic_embeddings(freqs):
    p = 113
    basis, _ = fourier_basis(p)
    energy = frequency_energy(basis @ synthetic_embedding(p, freqs), p)
    assert find_key_frequencies(energy) == sorted(freqs)


def test_no_key_frequencies_in_noise():
    p = 113
    basis, _ = fourier_basis(p)
    w = torch.randn(p, 128, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    assert find_key_frequencies(frequency_energy(basis @ w, p)) == []


def test_embedding_norms_of_a_model_with_a_planted_embedding():
    task = get_task("modular-addition", p=31)
    model = build_model(small_spec(task), device="cpu")
    with torch.no_grad():
        model.W_E[:31] = synthetic_embedding(31, [4, 9], d=32).float()
    assert key_frequencies_of(model, task=task, source="embedding") == [4, 9]
    res = embedding_norms(model, task=task, key_frequencies=[4, 9])
    assert res.fraction_in_keys() > 0.99
    assert json.loads(res.to_json())["key_frequencies"] == [4, 9] and res.figure() is not None


# -- restricted and excluded loss --------------------------------------------------------------------------------
def cos_logits(p, freqs, scale=3.0):
    a = torch.arange(p, dtype=torch.float64)
    s = (a[:, None] + a[None, :]).flatten()
    return sum(scale * torch.cos(2 * math.pi * k * (s[:, None] - a[None, :]) / p) for k in freqs)


def test_restricted_and_excluded_logits_on_known_logits():
    """Logits built only from cos(w_k (a + b - c)) at the key frequencies: restricting changes nothing and
    excluding leaves zero logits (loss log p); restricting to other frequencies leaves only the constant."""
    p, keys = 23, [2, 5]
    logits = cos_logits(p, keys)
    torch.testing.assert_close(restricted_logits(logits, p, keys), logits, atol=1e-9, rtol=0)
    torch.testing.assert_close(excluded_logits(logits, p, keys), torch.zeros_like(logits), atol=1e-9, rtol=0)
    torch.testing.assert_close(
        restricted_logits(logits, p, [7]), logits.mean(0, keepdim=True).expand_as(logits), atol=1e-9, rtol=0
    )
    d = key_directions(p, keys)
    torch.testing.assert_close(d @ d.T, torch.eye(4, dtype=torch.float64), atol=1e-12, rtol=0)
    with pytest.raises(InterpError, match="outside"):
        key_directions(p, [12])


def linear_model(task, freq):
    """A hand-built model whose logit of c is cos(w (a - c)) + cos(w (b - c)) up to scale: attention averages a, b and
    '=' (zero queries and keys), the MLP is off, and '=' embeds to zero. Nothing depends on a + b, so restricting
    the logits to any frequency of a + b leaves only their mean (every answer equally likely, loss log p), and
    excluding them changes nothing."""
    p = task.p
    model = build_model(small_spec(task, n_heads=1, d_head=2, d_mlp=4), device="cpu")
    x = 2 * math.pi * freq * torch.arange(p) / p
    with torch.no_grad():
        for prm in model.parameters():
            prm.zero_()
        model.embed.W_E[:p, 0], model.embed.W_E[:p, 1] = torch.cos(x), torch.sin(x)
        model.blocks[0].attn.W_V[0, :2, :2] = torch.eye(2)
        model.blocks[0].attn.W_O[0, :2, :2] = torch.eye(2) * 3
        model.unembed.W_U[0], model.unembed.W_U[1] = torch.cos(x), torch.sin(x)
    return model


def test_restricted_and_excluded_loss_on_a_hand_built_model():
    task = get_task("modular-addition", p=17, fraction=0.5)
    model = linear_model(task, 3)
    with torch.inference_mode():
        logits = model(task.dataset("all").tokens)[:, -1].double()
    a = torch.arange(17, dtype=torch.float64)
    w = 2 * math.pi * 3 / 17
    expected = torch.cos(w * (a[:, None, None] - a[None, None, :])) + torch.cos(
        w * (a[None, :, None] - a[None, None, :])
    )
    torch.testing.assert_close(logits, expected.reshape(289, 17), atol=1e-5, rtol=0)  # the model is what we say
    m = progress_measures(model, task=task, key_frequencies=[3])
    assert m["restricted_loss"] == pytest.approx(math.log(17), abs=1e-6)  # float32 logits: their mean is ~1e-8 off 0
    train = task.split_index("train")
    full = torch.nn.functional.cross_entropy(logits[train], task.dataset("all").labels[train]).item()
    assert m["excluded_loss"] == pytest.approx(full, abs=1e-6)
    assert m["sum_squared_weights"] == pytest.approx(sum_squared_weights(model))
    energy = logit_frequency_energy(model, task=task)  # nothing of a + b in these logits
    assert float(energy[1:].max()) < 1e-8 * float(energy[0]) + 1e-6 and key_frequencies_of(model, task=task) == []
    with pytest.raises(InterpError, match="source"):
        key_frequencies_of(model, task=task, source="nope")
    assert sum_squared_weights(model) == pytest.approx(
        float(sum(p.detach().double().pow(2).sum() for p in model.parameters() if p.requires_grad))
    )


# -- neurons, W_L, attention, ablation ---------------------------------------------------------------------------
def test_neuron_frequencies_match_a_plain_loop():
    task = get_task("modular-addition", p=11)
    model = build_model(small_spec(task, d_mlp=6), device="cpu")
    res = neuron_frequencies(model, task=task, key_frequencies=[1])
    p = 11
    with torch.inference_mode():
        _, cache = model.run_with_cache(task.dataset("all").tokens)
    acts = cache["blocks.0.mlp.hook_post"][:, -1].double().reshape(p, p, -1)
    basis, names = fourier_basis(p)
    freq = [0 if n == "const" else int(n.split()[1]) for n in names]
    for n in range(6):
        c = basis @ acts[:, :, n] @ basis.T
        total = (c**2).sum() - c[0, 0] ** 2
        if total < 1e-20:  # a dead neuron: no variance to explain
            assert float(res.fraction[n]) == 0.0
            continue
        fr = []
        for k in range(1, p // 2 + 1):
            e = sum(
                c[i, j] ** 2 for i in range(p) for j in range(p) if {freq[i], freq[j]} <= {0, k} and (i, j) != (0, 0)
            )
            fr.append(float(e / total))
        assert int(res.dominant[n]) == 1 + max(range(len(fr)), key=fr.__getitem__)
        assert float(res.fraction[n]) == pytest.approx(max(fr), abs=1e-9)
    assert json.loads(res.to_json())["p"] == 11


def test_neuron_logit_map_is_w_out_w_u_in_the_basis():
    task = get_task("modular-addition", p=11)
    model = build_model(small_spec(task), device="cpu")
    res = neuron_logit_map(model, task=task, key_frequencies=[2])
    basis, _ = fourier_basis(11)
    torch.testing.assert_close(res.coeffs @ basis, (model.W_out[0] @ model.W_U).double(), atol=1e-5, rtol=0)
    assert res.figure() is not None


@pytest.mark.parametrize("n_heads", [1, 4])
def test_attention_split_and_ablation_match_library_paths(n_heads):
    from interp.analyses.learned_accuracies import learned_accuracy
    from interp.evaluation import evaluate

    task = get_task("modular-addition", p=13)
    model = build_model(small_spec(task, n_heads=n_heads, d_head=32 // n_heads), device="cpu")
    att = attention_split(model, task=task)
    with torch.inference_mode():
        _, cache = model.run_with_cache(task.dataset("all").tokens)
    pat = cache["blocks.0.attn.hook_pattern"][:, :, -1]
    torch.testing.assert_close(att.to_a, pat[:, :, 0].double().mean(0), atol=1e-6, rtol=0)
    torch.testing.assert_close(
        att.to_a + att.to_b + att.to_eq, torch.ones(n_heads, dtype=torch.float64), atol=1e-6, rtol=0
    )
    alld = task.dataset("all")
    assert ablated_accuracy(model, task=task) == pytest.approx(evaluate(model, task, alld)["accuracy"], abs=1e-7)
    # removing head h == keeping the others (learned accuracy, zero-ablation, hooks)
    accs = ablated_accuracies(model, task=task, ablations=[([(0, h)], ()) for h in range(n_heads)])
    la = learned_accuracy(
        model,
        alld,
        heads=[[(0, o) for o in range(n_heads) if o != h] for h in range(n_heads)],
        ablation="zero",
        method="hooks",
        task=task,
    )
    torch.testing.assert_close(accs, la.accuracy.cpu().float(), atol=1e-7, rtol=0)
    # neurons: zeroing W_in's columns and b_in of those neurons gives the same model
    neurons = [0, 3, 5]
    acc = ablated_accuracy(model, task=task, neurons=neurons)
    with torch.no_grad():
        model.blocks[0].mlp.W_in[:, neurons] = 0
        model.blocks[0].mlp.b_in[neurons] = 0
    assert acc == pytest.approx(evaluate(model, task, alld)["accuracy"], abs=1e-7)
    with pytest.raises(InterpError, match="neurons"):
        ablated_accuracy(model, task=task, neurons=[999])


# -- training, snapshots, progress, suite, CLI -------------------------------------------------------------------
@pytest.fixture(scope="module")
def memorised(tmp_path_factory):
    """A short full-batch run on p = 13 that memorises its training pairs, with snapshots and progress measures."""
    from interp.analyses.modular_addition.progress import write_progress
    from interp.training import TrainConfig, train

    torch.set_num_threads(1)
    task = get_task("modular-addition", p=13, fraction=0.5)
    out = tmp_path_factory.mktemp("ma") / "ma.safetensors"
    cfg = TrainConfig(**{**task.default_train(), "epochs": 150, "lr": 1e-2, "weight_decay": 0.1})
    prov = train(task, small_spec(task), cfg, out, progress=False, device="cpu", snapshot_every=50)
    info = write_progress(out, out.with_name("ma.snapshots"), device="cpu")
    return task, out, prov, info


@pytest.mark.slow
def test_short_run_memorises_with_snapshots_and_progress(memorised):
    from interp.tasks import load_checkpoint

    task, out, prov, info = memorised
    assert prov["accuracy"]["train"] == 1.0
    assert sorted(p.name for p in out.with_name("ma.snapshots").iterdir()) == [
        "epoch-000050.safetensors",
        "epoch-000100.safetensors",
        "epoch-000150.safetensors",
    ]
    hist = load_checkpoint(out, device="cpu").metadata["training"]["history"]
    assert len(hist) == 150 and "test_accuracy" in hist[49] and "train_accuracy" not in hist[50]
    assert hist[149]["train_accuracy"] == 1.0 and "sum_squared_weights" in hist[149]
    assert info["snapshots"] == 3
    assert prov["config"]["loss_dtype"] == "float64" and prov["config"]["batch_size"] == len(task.dataset("train"))


def test_phases_from_a_history():
    hist = [
        {
            "epoch": e,
            "train_accuracy": min(1.0, e / 100),
            "test_accuracy": 0.0 if e < 300 else min(1.0, (e - 300) / 100),
            "test_loss": 5 + e / 100 if e <= 120 else max(0.01, 6.2 - (e - 120) / 50),
        }
        for e in range(0, 600, 10)
    ]
    ph = find_phases(hist, [5])
    assert (ph.memorised, ph.circuit_formation, ph.cleanup, ph.grokked) == (100, 120, 350, 400)
    assert ph.figure() is not None and ph.to_dict()["memorisation"] == [0, 120]
    with pytest.raises(InterpError):
        find_phases([])


def test_suite_and_cli_on_a_trained_checkpoint(memorised, capsys, tmp_path):
    from interp.analyses import suite_for
    from interp.app.cli import main
    from interp.tasks import load_checkpoint

    task, out, _, _ = memorised
    res = suite_for(task).analyze(load_checkpoint(out, device="cpu"))
    d = json.loads(res.to_json())
    assert d["task"] == "modular-addition" and d["metrics"]["train"]["accuracy"] == 1.0 and "key_frequencies" in d
    assert "phases" in d and res.text().startswith(str(out))
    assert main(["eval", str(out), "--json", "--threads", "1"]) == 0
    ev = json.loads(capsys.readouterr().out)
    assert ev["accuracy"]["train"] == 1.0 and set(ev["accuracy"]) == {"train", "test"}
    assert main(["report", str(out), "--out", str(tmp_path / "r.html"), "--quiet", "--threads", "1"]) == 0
    html = (tmp_path / "r.html").read_text()
    assert "Grokking: progress measures and phases" in html and "Key frequencies" in html


def test_cli_train_with_snapshots(tmp_path, capsys):
    from interp.app.cli import main
    from interp.tasks import load_checkpoint

    out = tmp_path / "m.safetensors"
    assert (
        main(
            [
                "train",
                "modular-addition",
                "--set",
                "p=7",
                "--set",
                "fraction=0.5",
                "--epochs",
                "4",
                "--d-model",
                "16",
                "--n-heads",
                "2",
                "--d-head",
                "8",
                "--snapshots",
                "2",
                "--out",
                str(out),
                "--quiet",
                "--threads",
                "1",
            ]
        )
        == 0
    )
    hist = load_checkpoint(out, device="cpu").metadata["training"]["history"]
    assert "restricted_loss" in hist[1] or "train_accuracy" in hist[1]
    assert sorted(p.name for p in (tmp_path / "m.snapshots").iterdir()) == [
        "epoch-000002.safetensors",
        "epoch-000004.safetensors",
    ]


@pytest.mark.slow
def test_grokks_at_a_large_fraction(tmp_path):
    """p = 59, 70% of the pairs for training, the grokking recipe: test accuracy >= 0.99 within 1000 epochs (it first
    reached 0.99 near epoch 675; about 8 minutes on one thread)."""
    from interp.training import TrainConfig, train

    torch.set_num_threads(1)
    task = get_task("modular-addition", p=59, fraction=0.7)
    cfg = TrainConfig(**{**task.default_train(), "epochs": 1000})
    prov = train(task, ModelSpec(**task.default_spec()), cfg, tmp_path / "g.safetensors", progress=False, device="cpu")
    assert prov["accuracy"]["test"] >= 0.99
    from interp.tasks import load_checkpoint

    ck = load_checkpoint(tmp_path / "g.safetensors", device="cpu")
    assert embedding_norms(ck.model, task=task).key_frequencies


def test_history_extras_and_bad_snapshot_option(tmp_path):
    from interp.errors import ConfigError
    from interp.training import TrainConfig, train

    task = get_task("modular-addition", p=7, fraction=0.5)
    cfg = TrainConfig(**{**task.default_train(), "epochs": 3})
    seen = []

    def extras(model, epoch):
        seen.append((model.training, torch.is_grad_enabled()))
        return {"epoch_squared": epoch**2}

    prov = train(
        task, small_spec(task), cfg, tmp_path / "h.safetensors", progress=False, device="cpu", history_extras=extras
    )
    assert [h["epoch_squared"] for h in prov["history"]] == [1, 4, 9] and seen == [(False, False)] * 3
    with pytest.raises(ConfigError, match="snapshot_every"):
        train(task, small_spec(task), cfg, tmp_path / "x.safetensors", progress=False, device="cpu", snapshot_every=0)


def test_shipped_checkpoint_is_grokked(capsys):
    from interp.app.cli import main
    from interp.tasks import load_checkpoint, shipped_checkpoints

    if "modular-addition" not in shipped_checkpoints():
        pytest.skip("no shipped modular-addition checkpoint")
    assert main(["eval", "modular-addition", "--json", "--device", "cpu"]) == 0
    ev = json.loads(capsys.readouterr().out)
    assert ev["accuracy"]["test"] >= 0.99 and ev["accuracy"]["train"] >= 0.99
    ck = load_checkpoint("modular-addition", device="cpu")
    keys = embedding_norms(ck.model, task=ck.task).key_frequencies
    training = ck.metadata["training"]
    assert keys and training["progress_key_frequencies"] == keys
    assert any("restricted_loss" in h for h in training["history"])


@pytest.mark.slow
def test_shipped_checkpoint_analyze_cli(capsys):
    from interp.app.cli import main
    from interp.tasks import shipped_checkpoints

    if "modular-addition" not in shipped_checkpoints():
        pytest.skip("no shipped modular-addition checkpoint")
    assert main(["analyze", "modular-addition", "--json", "--device", "cpu"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["key_frequencies"] and d["phases"]["grokked_epoch"] is not None


def test_resume_file_without_loss_dtype_still_resumes(tmp_path):
    """A resume file written before ``loss_dtype`` existed is continued as a float32-loss run."""
    from safetensors import safe_open
    from safetensors.torch import load_file, save_file

    from interp.training import TrainConfig, resume_path, train

    task = get_task("modular-addition", p=7, fraction=0.5)
    cfg = TrainConfig(**{**task.default_train(), "epochs": 3, "save_every": 1, "loss_dtype": "float32"})
    out = tmp_path / "r.safetensors"

    def stop(epoch, record):
        if epoch == 2:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        train(task, small_spec(task), cfg, out, progress=False, device="cpu", on_epoch_end=stop)
    rpath = resume_path(out)
    with safe_open(str(rpath), "pt") as f:
        meta = dict(f.metadata())
    ident = json.loads(meta["identity"])
    for newer in ("loss_dtype", "dropout_at", "halving", "halving_threshold"):  # options added in this stop
        del ident[newer]
    meta["identity"] = json.dumps(ident, sort_keys=True)
    del meta["checksum"]  # such a file predates the resume file's checksum too (an edited file with one is refused)
    save_file(load_file(str(rpath)), str(rpath), metadata=meta)
    prov = train(task, small_spec(task), cfg, out, progress=False, device="cpu", resume=True)
    assert prov["epochs_run"] == 3
