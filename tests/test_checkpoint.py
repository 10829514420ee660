"""Checkpoints: safetensors round trip, shipped names, and every bad-file path gives one clear error."""

import json
import pickle
import struct

import pytest
import torch
from safetensors.torch import save_file

import interp
from interp.checkpoint import load_checkpoint, read_metadata, save_checkpoint
from interp.errors import CheckpointError
from interp.model import ModelSpec, build_model
from tasks import get_task, shipped_checkpoints


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
    save_checkpoint(path, model, small_task, {"seed": 7, "epochs": 3, "accuracy": {"test": 0.5}})
    return model, path


def test_round_trip_gives_bit_identical_outputs(saved, small_task):
    model, path = saved
    ckpt = load_checkpoint(path, device="cpu")
    data = small_task.dataset("test")
    with torch.no_grad():
        assert torch.equal(ckpt.model(data.tokens), model(data.tokens))
    for (k, a), (k2, b) in zip(sorted(model.state_dict().items()), sorted(ckpt.model.state_dict().items())):
        assert k == k2 and torch.equal(a, b)
    assert ckpt.task == small_task and ckpt.model.interp_spec == model.interp_spec
    assert ckpt.training["seed"] == 7
    # frozen parts stay frozen after loading
    assert not ckpt.model.W_pos.requires_grad and not ckpt.model.blocks[0].attn.W_O.requires_grad


def test_metadata_is_json_and_versioned(saved):
    meta = read_metadata(saved[1])
    assert meta["format_version"] == 1
    assert meta["task"]["name"] == "noisy-majority" and meta["task"]["params"]["test_lengths"] == [10, 20]
    assert meta["model_spec"]["n_heads"] == 4


def test_save_is_atomic_and_leaves_no_temp_files(tmp_path, saved, small_task):
    model, _ = saved
    save_checkpoint(tmp_path / "a.safetensors", model, small_task)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.safetensors"]
    with pytest.raises(interp.errors.InterpError, match="does not exist"):
        save_checkpoint(tmp_path / "missing-dir" / "b.safetensors", model, small_task)


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
        with pytest.raises(CheckpointError, match="truncated|not a valid"):
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
    with pytest.raises(CheckpointError, match="not a valid .safetensors"):
        load_checkpoint(js)
    empty = tmp_path / "empty.safetensors"
    empty.write_bytes(b"")
    with pytest.raises(CheckpointError, match="empty"):
        load_checkpoint(empty)
    foreign = tmp_path / "foreign.safetensors"
    save_file({"w": torch.zeros(2)}, str(foreign), metadata={"hello": "world"})
    with pytest.raises(CheckpointError, match="not an interp checkpoint"):
        load_checkpoint(foreign)


def _rewrite(src, dst, tensors=None, **meta_changes):
    from safetensors import safe_open
    from safetensors.torch import load_file

    with safe_open(str(src), "pt") as f:
        meta = dict(f.metadata())
    meta.update(meta_changes)
    save_file(tensors if tensors is not None else load_file(str(src)), str(dst), metadata=meta)


def test_metadata_that_does_not_match_the_weights(tmp_path, saved):
    path = saved[1]
    spec = read_metadata(path)["model_spec"]
    wrong = tmp_path / "wrong.safetensors"
    _rewrite(path, wrong, model_spec=json.dumps({**spec, "n_heads": 8, "d_model": 16}))
    with pytest.raises(CheckpointError, match="do not match the model spec"):
        load_checkpoint(wrong)
    from safetensors.torch import load_file

    tensors = load_file(str(path))
    del tensors["unembed.b_U"]
    missing = tmp_path / "missing.safetensors"
    _rewrite(path, missing, tensors=tensors)
    with pytest.raises(CheckpointError, match="missing \\['unembed.b_U'\\]"):
        load_checkpoint(missing)
    badjson = tmp_path / "badjson.safetensors"
    _rewrite(path, badjson, task="{not json")
    with pytest.raises(CheckpointError, match="malformed metadata"):
        load_checkpoint(badjson)
    version = tmp_path / "v9.safetensors"
    _rewrite(path, version, format_version="9")
    with pytest.raises(CheckpointError, match="format version 9"):
        load_checkpoint(version)
    unknown_task = tmp_path / "task.safetensors"
    _rewrite(path, unknown_task, task=json.dumps({"name": "sorting", "params": {}}))
    with pytest.raises(CheckpointError, match="unknown task 'sorting'"):
        load_checkpoint(unknown_task)


def test_huge_header_length_is_reported_as_corrupt(tmp_path):
    bad = tmp_path / "huge.safetensors"
    bad.write_bytes(struct.pack("<Q", 10**12) + b"{}")
    with pytest.raises(CheckpointError, match="not a valid .safetensors"):
        load_checkpoint(bad)
