"""The checkpoint file format's versions and what its checksums cover.

Version 2 covers the metadata that defines the model (model spec, TransformerLens config, task) and the training
provenance with checksums bound to the weights' checksum: editing any of it is refused in one line naming the field,
from Python and from the command line. Every file of version 1 (the tensors' checksum only) still loads, with a
warning, unless its metadata contradicts itself. The shipped checkpoints were re-saved as version 2 with their
weights unchanged."""

import json
import struct
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file

from interp.checkpoint import COVERED, save_checkpoint, tensor_checksum, upgrade_checkpoint
from interp.errors import CheckpointError, CheckpointWarning
from interp.model import ModelSpec, build_model
from interp.tasks import get_task, load_checkpoint, read_metadata, shipped_checkpoints

from .checkpoint_files import write_version_1

FIXTURES = Path(__file__).parent / "fixtures"
# The tensor checksums the shipped checkpoints' version-1 files recorded (before they were re-saved as version 2)
VERSION_1_CHECKSUMS = {
    "integer-addition": "sha256:f1570e955db2a4f895847ef88b3687e54933e54061ce0013a08389fcb5878cef",
    "modular-addition": "sha256:cf140bf5aaf00514dd27ebb378db813ffe7fd0269d917d809667a3cc0b057d44",
    "noisy-majority": "sha256:0254f8454151d5effc9d026456bd7aaa215d1e6086fbbcd3d0ba8922d3d43eb7",
    "repeated-tokens-1layer": "sha256:f12b2108ac4eb7ee0447677e4966a26fbcde877dad84b0eb278079dd54e2ebd0",
    "repeated-tokens": "sha256:1f17bc25c9a799844aedccb9d6b5441c7bf25f3bbec720edb58f2a527f82ddfa",
}
DELETE = object()


def raw_metadata(path) -> dict[str, str]:
    with safe_open(str(path), "pt") as f:
        return dict(f.metadata())


def edit_metadata(src, dst, **changes) -> Path:
    """``src`` copied to ``dst`` with its metadata strings changed (``DELETE`` removes one): only the header is
    rewritten, as a user editing the JSON by hand would."""
    raw = Path(src).read_bytes()
    n = struct.unpack("<Q", raw[:8])[0]
    header = json.loads(raw[8 : 8 + n])
    for k, v in changes.items():
        if v is DELETE:
            header["__metadata__"].pop(k, None)
        else:
            header["__metadata__"][k] = v
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    Path(dst).write_bytes(struct.pack("<Q", len(text)) + text + raw[8 + n :])
    return Path(dst)


def changed(value):
    """Another value of the same kind."""
    if isinstance(value, bool):
        return not value
    if isinstance(value, int):
        return value + 1
    if isinstance(value, float):
        return value + 0.5
    if isinstance(value, str):
        return value + "x"
    if isinstance(value, list):
        return value + [1]
    if isinstance(value, dict):
        return {**value, "edited": 1}
    return 1


def edits(meta: dict) -> list[tuple[str, str, dict]]:
    """(field, what, changed metadata field) for every value of every covered field, two levels deep (the task's
    name and each of its parameters, each accuracy of the training provenance), and a key added to each."""
    out = []
    for name in COVERED:
        value = meta[name]
        if isinstance(value, dict):
            for k, v in value.items():
                out.append((name, f"{name}.{k}", {**value, k: changed(v)}))
                if isinstance(v, dict):
                    out += [(name, f"{name}.{k}.{k2}", {**value, k: {**v, k2: changed(v2)}}) for k2, v2 in v.items()]
        out.append((name, f"{name} (a key added)", changed(value)))
    return out


# -- the shipped checkpoints -----------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", sorted(VERSION_1_CHECKSUMS))
def test_shipped_checkpoints_are_version_2_with_their_weights_unchanged(name):
    path = shipped_checkpoints()[name]
    meta = read_metadata(path)
    assert meta["format_version"] == 2 and set(json.loads(raw_metadata(path)["metadata_checksums"])) == set(COVERED)
    assert meta["checksum"] == VERSION_1_CHECKSUMS[name] == tensor_checksum(load_file(str(path)))


def test_the_version_1_fixture_loads_to_the_shipped_model():
    """A copy of the shipped noisy-majority checkpoint as the version-1 writer wrote it: it loads (with a warning
    naming it) to the same tensors and logits as the version-2 file, with the same recorded accuracies."""
    old = FIXTURES / "noisy-majority-v1.safetensors"
    with pytest.warns(CheckpointWarning, match="noisy-majority-v1.safetensors is a version-1 checkpoint"):
        v1 = load_checkpoint(old, device="cpu")
    v2 = load_checkpoint("noisy-majority", device="cpu")
    assert v1.metadata["format_version"] == 1 and v1.spec == v2.spec and v1.task == v2.task
    assert v1.training == v2.training and v1.training["accuracy"] == v2.training["accuracy"]
    a, b = v1.model.state_dict(), v2.model.state_dict()
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    tokens = v1.task.dataset("test").select(slice(0, 16)).tokens
    with torch.no_grad():
        assert torch.equal(v1.model(tokens), v2.model(tokens))


def test_upgrade_keeps_the_tensors_and_refuses_a_second_time(tmp_path):
    out = upgrade_checkpoint(FIXTURES / "noisy-majority-v1.safetensors", tmp_path / "v2.safetensors")
    old, new = load_file(str(FIXTURES / "noisy-majority-v1.safetensors")), load_file(str(out))
    assert old.keys() == new.keys() and all(torch.equal(old[k], new[k]) and old[k].dtype == new[k].dtype for k in old)
    assert read_metadata(out)["format_version"] == 2
    with pytest.raises(CheckpointError, match="already a version-2 checkpoint"):
        upgrade_checkpoint(out)


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(VERSION_1_CHECKSUMS))
def test_every_edit_of_a_shipped_checkpoints_metadata_is_refused_in_one_line(tmp_path, name):
    """Each value of the model spec, the TransformerLens config, the task (its name and every parameter) and the
    training provenance, changed in the file, is refused when loading, naming the field."""
    path = shipped_checkpoints()[name]
    meta = read_metadata(path)
    cases = edits(meta)
    assert len(cases) > 60  # every field of four dicts
    for field, what, value in cases:
        assert value != meta[field], what
        bad = edit_metadata(path, tmp_path / "edited.safetensors", **{field: json.dumps(value)})
        with pytest.raises(CheckpointError) as e:
            load_checkpoint(bad, device="cpu")
        msg = str(e.value)
        assert f"its metadata {field} does not match the checksum" in msg and "\n" not in msg, what


# -- a variant's checkpoint --------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def variant(tmp_path_factory):
    """A linear:elu model's checkpoint (version 2), and the same model written by the version-1 writer."""
    task = get_task("noisy-majority", train_size=64, val_size=32, test_size=32, test_lengths=[10, 20])
    spec = ModelSpec(**{**task.default_spec(), "d_model": 8, "n_heads": 4, "d_head": 2, "attention": "linear:elu"})
    model = build_model(spec, device="cpu")
    folder = tmp_path_factory.mktemp("variant")
    v2 = save_checkpoint(model, task, folder / "linear.safetensors", training={"seed": 0}, spec=spec)
    v1 = write_version_1(folder / "linear-v1.safetensors", model, spec, task, {"seed": 0})
    return v2, v1


EDITED_SPECS = [{"attention": "window:3"}, {"attention": "softmax"}, {"attention_seed": 1}, {"init_seed": 9}]


@pytest.mark.parametrize("edit", EDITED_SPECS, ids=json.dumps)
def test_an_edited_variant_spec_is_refused(tmp_path, variant, edit):
    """Before: linear:elu edited to window:3, softmax or another attention_seed loaded and evaluated another model
    with exit 0. Now: one line (the command line's `interp eval` / `interp report`: the next test)."""
    spec = read_metadata(variant[0])["model_spec"]
    bad = edit_metadata(variant[0], tmp_path / "bad.safetensors", model_spec=json.dumps({**spec, **edit}))
    with pytest.raises(CheckpointError, match="its metadata model_spec does not match the checksum"):
        load_checkpoint(bad)
    ckpt = load_checkpoint(variant[0])  # the untouched file loads, as saved
    assert ckpt.spec.attention == "linear:elu"


@pytest.mark.parametrize("command", ["eval", "report"])
def test_the_cli_refuses_a_tampered_file_in_one_line(tmp_path, variant, command, capsys):
    from interp.app.cli import main

    spec = read_metadata(variant[0])["model_spec"]
    bad = edit_metadata(
        variant[0], tmp_path / "bad.safetensors", model_spec=json.dumps({**spec, "attention": "softmax"})
    )
    argv = [command, str(bad)] + (["--out", str(tmp_path / "r.html"), "--quiet"] if command == "report" else [])
    assert main(argv) == 1
    err = capsys.readouterr().err
    assert (
        err.startswith("interp: error: ") and err.count("\n") == 1 and "model_spec does not match the checksum" in err
    )
    assert not (tmp_path / "r.html").exists()


def test_metadata_moved_onto_other_weights_is_refused(tmp_path, variant):
    """The metadata checksums are bound to the weights' checksum: a version-2 file's metadata put on another model's
    weights (with their own, correct tensor checksum) is refused."""
    task = get_task("noisy-majority", train_size=64, val_size=32, test_size=32, test_lengths=[10, 20])
    spec = ModelSpec(**read_metadata(variant[0])["model_spec"])
    other = save_checkpoint(
        build_model(ModelSpec(**{**spec.to_dict(), "attention": "softmax", "init_seed": 1})),
        task,
        tmp_path / "softmax.safetensors",
    )
    meta = raw_metadata(variant[0])
    moved = edit_metadata(
        other, tmp_path / "moved.safetensors", **{k: meta[k] for k in (*COVERED, "metadata_checksums")}
    )
    with pytest.raises(CheckpointError, match="metadata checksums do not match the checksum of the weights"):
        load_checkpoint(moved)


@pytest.mark.parametrize(
    "changes, expected",
    [
        ({"checksum": DELETE}, "a version-2 checkpoint without its checksum"),
        ({"metadata_checksums": DELETE}, "a version-2 checkpoint without its metadata_checksums"),
        ({"metadata_checksums": "{not json"}, "without its metadata_checksums"),
        ({"format_version": "1"}, "marked version 1 but carries the metadata checksums of version 2"),
        ({"format_version": "3"}, "format version 3; this toolkit reads versions 1, 2"),
    ],
)
def test_a_version_2_file_without_its_checksums_is_refused(tmp_path, variant, changes, expected):
    bad = edit_metadata(variant[0], tmp_path / "bad.safetensors", **changes)
    with pytest.raises(CheckpointError, match=expected):
        load_checkpoint(bad)


def test_version_1_files_are_refused_where_inconsistent_and_flagged_otherwise(tmp_path, variant):
    """A version-1 file cannot vouch for its metadata: an edit that contradicts its stored TransformerLens config
    (linear:elu -> window:3 turns on TransformerLens' local attention) is refused; one that does not (-> softmax) is
    only flagged by the warning every version-1 file gets."""
    spec = read_metadata(variant[1])["model_spec"]
    window = edit_metadata(
        variant[1], tmp_path / "w.safetensors", model_spec=json.dumps({**spec, "attention": "window:3"})
    )
    with pytest.raises(CheckpointError, match=r"metadata is inconsistent: the model spec builds .*use_local_attn"):
        load_checkpoint(window)
    softmax = edit_metadata(
        variant[1], tmp_path / "s.safetensors", model_spec=json.dumps({**spec, "attention": "softmax"})
    )
    with pytest.warns(CheckpointWarning, match="s.safetensors is a version-1 checkpoint"):
        assert load_checkpoint(softmax).spec.attention == "softmax"
    none = edit_metadata(variant[1], tmp_path / "n.safetensors", model_spec="null")
    with pytest.raises(CheckpointError, match="a version-1 checkpoint always has a model spec"):
        load_checkpoint(none)


def test_the_cli_prints_the_version_1_warning_in_one_line(variant, capsys):
    from interp.app.cli import main

    assert main(["eval", str(variant[1])]) == 0
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if "version-1" in line]
    assert len(lines) == 1 and lines[0].startswith(f"interp: warning: {variant[1]} is a version-1 checkpoint")
