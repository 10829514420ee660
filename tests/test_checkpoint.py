"""Checkpoints: safetensors round trip, shipped names, and every bad-file path gives one clear error."""

import json
import pickle
import struct

import pytest
import torch
from safetensors.torch import save_file

import interp
from interp.checkpoint import save_checkpoint
from interp.errors import CheckpointError
from interp.model import ModelSpec, build_model
from interp.tasks import get_task, load_checkpoint, read_metadata, shipped_checkpoints


@pytest.fixture(scope="module")
def small_task():
    return get_task("noisy-majority", train_size=64, val_size=32, test_size=32, test_lengths=[10, 20])


@pytest.fixture(scope="module")
def saved(tmp_path_factory, small_task):
    spec = ModelSpec(**{**small_task.default_spec(), "d_model": 8, "n_heads": 4, "d_head": 2, "init_seed": 7})
    model = build_model(spec, device="cpu")
    with torch.no_grad():
        model.unembed.b_U.add_(torch.arange(8.0))  # make sure non-initial values survive
    path = tmp_path_factory.mktemp("ckpt") / "model.safetensors"
    save_checkpoint(model, small_task, path, training={"seed": 7, "epochs": 3, "accuracy": {"test": 0.5}}, spec=spec)
    return model, path, spec


def test_round_trip_gives_bit_identical_outputs(saved, small_task):
    model, path, spec = saved
    ckpt = load_checkpoint(path, device="cpu")
    data = small_task.dataset("test")
    with torch.no_grad():
        assert torch.equal(ckpt.model(data.tokens), model(data.tokens))
    for (k, a), (k2, b) in zip(sorted(model.state_dict().items()), sorted(ckpt.model.state_dict().items())):
        assert k == k2 and torch.equal(a, b)
    assert ckpt.task == small_task and ckpt.spec == spec
    assert ckpt.training["seed"] == 7
    # frozen parts stay frozen after loading
    assert not ckpt.model.W_pos.requires_grad and not ckpt.model.blocks[0].attn.W_O.requires_grad


def test_metadata_is_json_and_versioned(saved):
    meta = read_metadata(saved[1])
    assert meta["format_version"] == 2
    assert meta["task"]["name"] == "noisy-majority" and meta["task"]["params"]["test_lengths"] == [10, 20]
    assert meta["model_spec"]["n_heads"] == 4


def test_save_is_atomic_and_leaves_no_temp_files(tmp_path, saved, small_task):
    model, _, spec = saved
    save_checkpoint(model, small_task, tmp_path / "a.safetensors", spec=spec)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.safetensors"]
    with pytest.raises(interp.errors.InterpError, match="does not exist"):
        save_checkpoint(model, small_task, tmp_path / "missing-dir" / "b.safetensors", spec=spec)


def test_shipped_checkpoint_loads_by_name():
    assert "noisy-majority" in shipped_checkpoints()
    model, task = interp.load("noisy-majority", device="cpu")
    assert task.name == "noisy-majority" and model.cfg.n_heads == 16 and model.cfg.d_model == 32


def test_expected_task_mismatch_is_refused(saved):
    with pytest.raises(CheckpointError, match="checkpoint of task 'noisy-majority', expected 'repeated-tokens'"):
        load_checkpoint(saved[1], expect_task="repeated-tokens")


def test_missing_file(tmp_path):
    with pytest.raises(CheckpointError, match="no checkpoint file"):
        load_checkpoint(tmp_path / "nope.safetensors")


def test_truncated_file(tmp_path, saved):
    data = saved[1].read_bytes()
    for cut in (4, 100, len(data) - 50):
        bad = tmp_path / f"cut{cut}.safetensors"
        bad.write_bytes(data[:cut])
        with pytest.raises(CheckpointError, match=r"truncated|not a valid"):
            load_checkpoint(bad)


def test_pickle_is_refused_without_unpickling(tmp_path, saved):
    p1 = tmp_path / "model.pt"
    torch.save(saved[0].state_dict(), p1)  # zip-based torch.save
    p2 = tmp_path / "model.pkl"
    p2.write_bytes(pickle.dumps({"a": 1}))
    for p in (p1, p2):
        with pytest.raises(CheckpointError, match="never unpickles"):
            load_checkpoint(p)


def test_other_formats_are_refused(tmp_path):
    js = tmp_path / "x.json"
    js.write_text(json.dumps({"hello": "world"}))
    with pytest.raises(CheckpointError, match=r"not a valid \.safetensors"):
        load_checkpoint(js)
    empty = tmp_path / "empty.safetensors"
    empty.write_bytes(b"")
    with pytest.raises(CheckpointError, match="empty"):
        load_checkpoint(empty)
    foreign = tmp_path / "foreign.safetensors"
    save_file({"w": torch.zeros(2)}, str(foreign), metadata={"hello": "world"})
    with pytest.raises(CheckpointError, match="not an interp checkpoint"):
        load_checkpoint(foreign)


def _rewrite(src, dst, tensors=None, resign=False, **meta_changes):
    """``src`` rewritten to ``dst`` with other tensors and metadata; ``resign``: every checksum recomputed (a file
    edited consistently, to reach the checks behind the checksums)."""
    from safetensors import safe_open
    from safetensors.torch import load_file

    from .checkpoint_files import resigned

    with safe_open(str(src), "pt") as f:
        meta = dict(f.metadata())
    meta.update(meta_changes)
    tensors = tensors if tensors is not None else load_file(str(src))
    save_file(tensors, str(dst), metadata=resigned(meta, tensors) if resign else meta)


def test_metadata_that_does_not_match_the_weights(tmp_path, saved):
    path = saved[1]
    spec = read_metadata(path)["model_spec"]
    wrong = tmp_path / "wrong.safetensors"
    _rewrite(path, wrong, model_spec=json.dumps({**spec, "n_heads": 8, "d_model": 16}))
    with pytest.raises(CheckpointError, match="model_spec does not match the checksum"):
        load_checkpoint(wrong)
    _rewrite(path, wrong, resign=True, model_spec=json.dumps({**spec, "n_heads": 8, "d_model": 16}))
    with pytest.raises(CheckpointError, match=r"another TransformerLens config than the stored one \(.*n_heads"):
        load_checkpoint(wrong)
    from interp.rebuild import config_to_json

    other = ModelSpec.from_dict({**spec, "n_heads": 8, "d_model": 16})
    changed = {
        "model_spec": json.dumps(other.to_dict()),
        "tl_config": json.dumps(config_to_json(build_model(other).cfg)),
    }
    _rewrite(path, wrong, resign=True, **changed)  # spec and config edited alike: the weights do not fit
    with pytest.raises(CheckpointError, match="do not match the model spec"):
        load_checkpoint(wrong)
    from safetensors.torch import load_file

    tensors = load_file(str(path))
    del tensors["unembed.b_U"]
    missing = tmp_path / "missing.safetensors"
    _rewrite(path, missing, tensors=tensors, resign=True)
    with pytest.raises(CheckpointError, match=r"missing \['unembed\.b_U'\]"):
        load_checkpoint(missing)
    badjson = tmp_path / "badjson.safetensors"
    _rewrite(path, badjson, task="{not json")  # (not re-signed: the JSON is refused first)
    with pytest.raises(CheckpointError, match="malformed metadata"):
        load_checkpoint(badjson)
    version = tmp_path / "v9.safetensors"
    _rewrite(path, version, format_version="9")
    with pytest.raises(CheckpointError, match="format version 9"):
        load_checkpoint(version)
    unknown_task = tmp_path / "task.safetensors"
    _rewrite(path, unknown_task, resign=True, task=json.dumps({"name": "sorting", "params": {}}))
    with pytest.raises(CheckpointError, match="unknown task 'sorting'"):
        load_checkpoint(unknown_task)


def test_huge_header_length_is_reported_as_corrupt(tmp_path):
    bad = tmp_path / "huge.safetensors"
    bad.write_bytes(struct.pack("<Q", 10**12) + b"{}")
    with pytest.raises(CheckpointError, match=r"not a valid \.safetensors"):
        load_checkpoint(bad)


# -- corrupted weights never load silently -----------------------------------------------------------------------
def _tensor_span(path, name):
    """(start, end) byte offsets of tensor ``name``'s data in a safetensors file."""
    raw = path.read_bytes()
    n = struct.unpack("<Q", raw[:8])[0]
    header = json.loads(raw[8 : 8 + n])
    a, b = header[name]["data_offsets"]
    return 8 + n + a, 8 + n + b


def test_flipped_bytes_in_the_weights_fail_the_checksum(tmp_path, saved, capsys):
    path = saved[1]
    start, end = _tensor_span(path, "pos_embed.W_pos")
    raw = bytearray(path.read_bytes())
    for i in range(start, min(end, start + 100)):
        raw[i] ^= 0xFF
    bad = tmp_path / "flipped.safetensors"
    bad.write_bytes(bytes(raw))
    with pytest.raises(CheckpointError, match="do not match the checksum"):
        load_checkpoint(bad)
    from interp.app.cli import main

    assert main(["eval", str(bad)]) == 1  # was: accuracy 0.0000, loss nan, exit 0
    err = capsys.readouterr().err
    assert err.startswith("interp: error: ") and err.count("\n") == 1 and "checksum" in err


@pytest.mark.parametrize(
    "name, value, expected",
    [
        ("pos_embed.W_pos", 0.5, "pos_embed.W_pos is fixed by the model spec \\(zero: no positional embedding\\)"),
        ("blocks.0.attn.W_O", 0.0, "blocks.0.attn.W_O is fixed by the model spec \\(the identity"),
        ("blocks.0.attn.b_Q", 1.0, "blocks.0.attn.b_Q is fixed by the model spec \\(zero: no bias\\)"),
        ("embed.W_E", float("nan"), "tensor embed.W_E holds NaN or infinite values"),
    ],
)
def test_fixed_and_non_finite_weights_are_named(tmp_path, saved, name, value, expected):
    """Without a checksum (older files, or one rewritten along with the weights) the spec's fixed parameters and
    finiteness are still checked, each failure naming the tensor."""
    from safetensors.torch import load_file

    tensors = load_file(str(saved[1]))
    tensors[name] = torch.full_like(tensors[name], value)
    bad = tmp_path / "bad.safetensors"
    _rewrite(saved[1], bad, tensors=tensors)  # keeps the old checksum: the checksum catches it first
    with pytest.raises(CheckpointError, match="checksum"):
        load_checkpoint(bad)
    _rewrite(saved[1], bad, tensors=tensors, resign=True)  # a consistent, edited file
    with pytest.raises(CheckpointError, match=expected):
        load_checkpoint(bad)


@pytest.mark.parametrize("checksum, tl_config", [(True, True), (True, False), (False, False)])
def test_version_1_files_still_load_with_a_warning(tmp_path, saved, checksum, tl_config):
    """Files of the version-1 writer (with or without the tensor checksum and the spec's tl_config) load to the same
    weights, with a CheckpointWarning naming the file: their metadata is not covered."""
    from interp.errors import CheckpointWarning

    from .checkpoint_files import write_version_1

    model, _, spec = saved
    old = write_version_1(
        tmp_path / "old.safetensors",
        model,
        spec,
        get_task(**_task_meta(saved)),
        {"seed": 7},
        checksum=checksum,
        tl_config=tl_config,
    )
    with pytest.warns(CheckpointWarning, match=f"{old} is a version-1 checkpoint: its metadata .* is not covered"):
        ckpt = load_checkpoint(old, device="cpu")
    assert ckpt.spec == spec and read_metadata(old)["format_version"] == 1
    assert (read_metadata(old)["checksum"] is None) is not checksum
    sd = model.state_dict()
    assert all(torch.equal(v, sd[k]) for k, v in ckpt.model.state_dict().items())


def _task_meta(saved) -> dict:
    meta = read_metadata(saved[1])["task"]
    return {"name": meta["name"], **meta["params"]}


# -- checkpoints open in plain TransformerLens --------------------------------------------------------------------
PLAIN_TL = r"""
import json, sys, warnings
warnings.filterwarnings("ignore")
import torch
from safetensors import safe_open
from safetensors.torch import load_file
from transformer_lens import HookedTransformer, HookedTransformerConfig
path, tokens_path, out = sys.argv[1:4]
with safe_open(path, "pt") as f:
    cfg = json.loads(f.metadata()["tl_config"])
model = HookedTransformer(HookedTransformerConfig(**cfg, device="cpu"))
model.load_state_dict(load_file(path))
tokens = torch.tensor(json.load(open(tokens_path)))
with torch.no_grad():
    torch.save(model(tokens), out)
print("imported:", sorted(m for m in sys.modules if m.split(".")[0] in ("interp", "tasks", "analyses")))
"""


@pytest.mark.slow
@pytest.mark.parametrize("name", ["noisy-majority", "repeated-tokens", "modular-addition"])
def test_shipped_checkpoints_open_in_plain_transformer_lens(name, tmp_path):
    """A subprocess that never imports our packages rebuilds the model from the metadata's tl_config and the
    safetensors weights; its logits equal ours exactly (same weights, same code path)."""
    import os
    import subprocess
    import sys

    ckpt = load_checkpoint(name, device="cpu")
    tokens = ckpt.task.dataset("test").select(slice(0, 8)).tokens
    (tmp_path / "t.json").write_text(json.dumps(tokens.tolist()))
    script = tmp_path / "plain.py"
    script.write_text(PLAIN_TL)
    proc = subprocess.run(
        [sys.executable, str(script), str(ckpt.path), str(tmp_path / "t.json"), str(tmp_path / "l.pt")],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
        env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"},
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "imported: []" in proc.stdout
    with torch.no_grad():
        ours = ckpt.model(tokens)
    assert torch.equal(torch.load(tmp_path / "l.pt"), ours)


def test_device_names_and_torch_devices():
    """A torch.device is taken as its name; a misspelt device or a non-name is one ConfigError naming it (before: a
    torch.device failed with an AttributeError, and 'cuda:-1' or 'cuda:0 ' reached torch's parser on a GPU)."""
    from interp.device import pick_device
    from interp.errors import ConfigError

    assert pick_device(torch.device("cpu")) == "cpu" and pick_device("cpu:0") == "cpu:0"
    assert load_checkpoint("noisy-majority", device=torch.device("cpu")).model.cfg.device in (
        "cpu",
        torch.device("cpu"),
    )
    for bad in ("cuda:-1", "cuda:0 ", "cuda:x", "cpu:1", "cpu:", "CUDA", "gpu"):
        with pytest.raises(ConfigError, match="unknown device"):
            pick_device(bad)
    with pytest.raises(ConfigError, match=r"torch\.device; got int"):
        pick_device(0)


def test_a_model_whose_config_names_another_device_is_refused_when_saving(tmp_path, saved):
    """Parameters moved with torch.nn.Module.to leave model.cfg.device behind, and TransformerLens' own forward then
    mixes devices: the save says so in one line (before: a device error from inside TransformerLens' unembed)."""
    ckpt = load_checkpoint(saved[1], device="cpu")
    ckpt.model.cfg.device = "cuda"  # what a plain Module.to("cpu") of a CUDA model leaves
    with pytest.raises(CheckpointError, match=r"parameters are on cpu but model.cfg.device is 'cuda'"):
        save_checkpoint(ckpt.model, ckpt.task, tmp_path / "m.safetensors")
    assert not (tmp_path / "m.safetensors").exists()
